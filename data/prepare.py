"""
Tokenizes your own corpus into the token files that train.py reads:

    python data/prepare.py --input 'books/*.txt' --out_dir data/books
    python data/prepare.py --input dump.jsonl --text_field text --out_dir data/dump --shard_tokens 100_000_000
    python data/prepare.py --input notes/ --tokenizer char --out_dir data/notes_char

--input takes files, folders (searched recursively) and globs (`**` spans folders) of .txt (one document per
file; files over 1 MB are cut into documents of 1 to 2 MB, at the first blank line past 1 MB, else at a line
break), .jsonl (one JSON object per line, text in --text_field) and .parquet (needs pyarrow). Documents end
with <|endoftext|>. The other files a folder or glob holds (a README, compressed .jsonl.gz: decompress those)
are named in a note and skipped; hidden folders below a folder (.git) are not searched. Each document goes to
val with probability --val_fraction, decided by a hash of its text, so the split does not depend on file
order. When every document lands in one split, or val takes more than half the tokens and twice val_fraction
(one or a few documents, such as a single .txt file of a few MB), the last val_fraction of the tokens are held
out as val instead.

Writes {split}.bin, or {split}_000.bin, {split}_001.bin, ... with --shard_tokens, as uint16 when the
vocabulary fits and uint32 when not, and meta.json (tokenizer, vocab_size, dtype, token counts, files). A
second prepare into the folder meanwhile is refused (an flock on the folder), since their files would mix, and
so is one into a folder that holds a dataset already, unless --overwrite.
Files are read as they are tokenized, through worker processes, so memory stays bounded whatever the
corpus or file size.
"""
import codecs
import collections
import contextlib
import glob
import hashlib
import json
import multiprocessing
import multiprocessing.pool
import multiprocessing.resource_tracker
import os
import signal
import sys
import time
from typing import Iterable, Iterator

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # for the project's modules (common, dataset, tokenizer) when run as a script
from common import NO_LOCKS, ArgumentParser, UserError, plural, signals_deferred, start_script  # noqa: E402
from dataset import dataset_files_in, read_meta, run_files_in, staged_meta_pkl, token_file_split, write_meta  # noqa: E402
from tokenizer import EOT, encoding_from_bytes, gpt2_encoding, rank_file_bytes  # noqa: E402

EXTENSIONS = (".txt", ".jsonl", ".parquet")
TXT_PIECE_CHARS = 1 << 20  # cut .txt files into documents of about this many characters
BATCH_CHARS = 4 << 20  # characters handed to a worker at a time
PROGRESS_LOG_S = 10  # seconds between progress lines when stderr is a log file, not a terminal


class PrepareError(UserError):
    """Bad input to prepare; the CLI prints it on one line."""


def list_files(inputs: list[str]) -> list[str]:
    """Every corpus file named by inputs (files, folders, globs; a folder a glob matches is searched too), sorted
    within each input, each file once however many inputs name it (its documents would count twice). The other
    files that folders and globs hold are skipped, and named in a note; a file named as it is must be one."""
    files, skipped, seen = [], [], set()
    for item in inputs:
        if os.path.isfile(item):  # as it is, even where its name has glob characters: notes [draft].txt
            if not corpus_kind(item):
                raise PrepareError(f"{item} is not .txt, .jsonl or .parquet" + compressed_hint([item]))
            found, others, matches = [item], [], []
        else:  # a folder, or a glob (** spans folders) of files and folders
            matches = [item] if os.path.isdir(item) else glob.glob(item, recursive=True)
            found = sorted({f for p in matches
                            for f in (walk_files(p) if os.path.isdir(p) else [p] if os.path.isfile(p) else [])})
            others = [f for f in found if not corpus_kind(f)]
            found = [f for f in found if corpus_kind(f)]
        if not found:
            raise PrepareError(f"--input {item} matches no {'/'.join(EXTENSIONS)} file"
                               + (" (hidden folders such as .git are not searched)"
                                  if any(os.path.isdir(p) for p in matches) else "")
                               + compressed_hint(others))
        skipped += others
        for f in found:
            if os.path.realpath(f) not in seen:
                seen.add(os.path.realpath(f))
                files.append(f)
    skipped = sorted({os.path.realpath(f): f for f in skipped}.values())  # each once, as files are
    if skipped:
        print(f"note: skipped {plural(len(skipped), 'file')} that {'is' if len(skipped) == 1 else 'are'} not .txt, "
              f".jsonl or .parquet ({', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''})"
              + compressed_hint(skipped), file=sys.stderr)
    return files


def corpus_kind(path: str) -> str | None:
    """The file's kind, one of EXTENSIONS, by its name whatever its case (C.TXT is .txt); None for any other."""
    return next((ext for ext in EXTENSIONS if path.lower().endswith(ext)), None)


def compressed_hint(paths: list[str]) -> str:
    """What to do with the compressed files among paths, which prepare does not read: decompress them."""
    packed = [p for p in paths if p.lower().endswith((".gz", ".tgz", ".zst", ".zstd", ".bz2", ".xz", ".lz4", ".zip"))]
    return f"; {os.path.basename(packed[0])} is compressed: decompress such files first" if packed else ""


def walk_files(folder: str) -> Iterator[str]:
    """Every file under folder, through linked folders too (as a glob's ** goes), each folder once: a link back up
    the tree would otherwise be walked forever. Hidden folders below it (.git, .cache) are left out."""
    seen = set()
    for d, subdirs, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(d)
        if real in seen:
            subdirs[:] = []
            continue
        seen.add(real)
        subdirs[:] = [s for s in subdirs if not s.startswith(".")]
        yield from (os.path.join(d, f) for f in names)


def split_paragraphs(chunks: Iterable[str], max_chars: int = TXT_PIECE_CHARS) -> Iterator[str]:
    """The text that chunks make up, in pieces of max_chars to 2 * max_chars: cut just after the first blank line
    past max_chars, or where none comes before twice that, just after the last line break before it (else right
    there), so that memory stays bounded (about 2 * max_chars and one chunk) however long the text."""
    buffer = ""
    for chunk in chunks:
        buffer += chunk
        while len(buffer) > max_chars:
            cut = buffer.find("\n\n", max_chars, 2 * max_chars)
            if cut != -1:
                cut += 2
            elif len(buffer) >= 2 * max_chars:
                cut = buffer.rfind("\n", 0, 2 * max_chars) + 1 or 2 * max_chars
            else:
                break  # a blank line may still come in the next chunk
            yield buffer[:cut]
            buffer = buffer[cut:]
    yield buffer


def read_chunks(path: str, chunk_bytes: int = TXT_PIECE_CHARS) -> Iterator[str]:
    """A text file's contents, chunk by chunk, line ends as \n; a PrepareError when it is not UTF-8 text (a
    binary file, another encoding)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    done, held = 0, ""  # bytes read before this chunk; a last "\r" whose "\n" may start the next chunk
    with open(path, "rb") as f:
        if f.read(len(codecs.BOM_UTF8)) == codecs.BOM_UTF8:  # a byte-order mark, as some editors write: no text
            done = len(codecs.BOM_UTF8)
        else:
            f.seek(0)
        while True:
            raw = f.read(chunk_bytes)
            pending = len(decoder.getstate()[0])  # bytes of a character cut off at the end of the last chunk
            try:
                text = held + decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise PrepareError(f"{path} is not UTF-8 text (byte {done - pending + e.start} is "
                                   f"0x{e.object[e.start]:02x}): convert it to UTF-8, or leave it out of --input") from None
            if "\x00" in text:
                raise PrepareError(f"{path} holds NUL bytes, so it is binary, not text: leave it out of --input")
            done += len(raw)
            held = "\r" if raw and text.endswith("\r") else ""
            yield text[:len(text) - len(held)].replace("\r\n", "\n")
            if not raw:
                return


def read_text(path: str) -> str:
    """A text file's contents (see read_chunks)."""
    return "".join(read_chunks(path))


def iter_documents(files: list[str], text_field: str = "text", notes: bool = True) -> Iterator[str]:
    """The non-blank documents of each file in turn (see the module docstring for what a document is), read as
    they are needed: memory does not grow with the size of a file."""
    for path in files:
        if corpus_kind(path) == ".txt":
            yield from (doc for doc in split_paragraphs(read_chunks(path)) if doc.strip())
        elif corpus_kind(path) == ".jsonl":
            nulls, texts = 0, 0
            with open(path, encoding="utf-8-sig", errors="strict") as f:  # a byte-order mark is no text
                try:
                    for line_number, line in enumerate(f, 1):
                        if not line.strip():
                            continue
                        text = jsonl_text(line, text_field, f"{path} line {line_number}")
                        if text is None:
                            nulls += 1
                            continue
                        texts += 1
                        if text.strip():
                            yield text
                except UnicodeDecodeError:
                    raise PrepareError(f"{path} is not UTF-8 text: convert it to UTF-8") from None
            if nulls and notes:  # skipped, as parquet's nulls are; every one null is more likely the wrong field
                print(f"note: {path}: skipped {plural(nulls, 'line')} whose '{text_field}' is null"
                      + (" (every line: check --text_field)" if not texts else ""), file=sys.stderr)
        else:
            try:
                import pyarrow
                import pyarrow.parquet as pq
            except ImportError:
                raise PrepareError("reading .parquet needs pyarrow: pip install pyarrow") from None
            try:  # a shard cut short by a failed download is the likely case
                parquet = pq.ParquetFile(path)
                if text_field not in parquet.schema_arrow.names:
                    raise PrepareError(f"{path} has no column '{text_field}' (columns: {parquet.schema_arrow.names}); "
                                       "set --text_field")
                for batch in parquet.iter_batches(columns=[text_field], batch_size=1024):
                    for text in batch.column(0).to_pylist():
                        if not isinstance(text, (str, type(None))):
                            raise PrepareError(f"{path}: column '{text_field}' holds {type(text).__name__}, not "
                                               "strings")
                        if text and text.strip():
                            yield text
            except (pyarrow.ArrowException, OSError) as e:
                raise PrepareError(f"{path} is not a readable parquet file ({str(e).splitlines()[0][:200]}): download "
                                   "it again, or leave it out of --input") from None


def jsonl_text(line: str, text_field: str, where: str) -> str | None:
    """The text of one jsonl line (None for a null); a PrepareError naming `where` when the line is not a JSON object
    with a string text_field, or the string holds a lone surrogate ("\\ud800"), which is no text."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as e:  # bad JSON, a number past Python's digit limit, nesting past its depth
        raise PrepareError(f"{where}: not valid JSON ({str(e).split(':')[0] or type(e).__name__}): fix or drop that "
                           "line") from None
    if not isinstance(record, dict):
        raise PrepareError(f"{where}: a JSON {json_type(record)}, not an object: each line must be one JSON object, "
                           f"its text in a '{text_field}' field")
    if text_field not in record:
        fields = ", ".join(repr(k) for k in list(record)[:8]) + (", ..." if len(record) > 8 else "")
        raise PrepareError(f"{where}: no '{text_field}' field (it has {fields if record else 'none'}): set "
                           "--text_field to the text's")
    text = record[text_field]
    if text is None:  # no text, as a parquet null: skipped
        return None
    if not isinstance(text, str):
        raise PrepareError(f"{where}: '{text_field}' is a JSON {json_type(text)}, not a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PrepareError(f"{where}: '{text_field}' holds a lone surrogate escape such as \\ud800, which is no "
                           "character: fix or drop that line") from None
    return text


def json_type(value) -> str:
    """value's type by JSON's names (array, number), as a user who wrote the file knows them."""
    names = {list: "array", dict: "object", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


def goes_to_val(text: str, val_fraction: float, seed: int) -> bool:
    """Whether a document belongs to val: a hash of (seed, text), so the same text always lands the same way."""
    digest = hashlib.blake2b(text.encode("utf-8", errors="replace"), digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "little") / 2**64 < val_fraction


class CharCodec:
    """Characters to ids by a fixed alphabet; <|endoftext|> is the id after the last character."""

    def __init__(self, chars: str):
        self.chars = chars
        self.codepoints = np.array([ord(c) for c in chars], dtype=np.uint32)  # sorted, since chars is
        self.eot = len(chars)

    def encode(self, text: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.searchsorted(self.codepoints, points)
        if len(points) and (ids.max() >= len(self.chars) or not np.array_equal(self.codepoints[ids], points)):
            raise PrepareError("a character is missing from the alphabet")
        return ids


_worker = {}  # per worker process: the tokenizer and the split settings


def _init_worker(tokenizer: str, chars: str | None, ranks: bytes | None, val_fraction: float, seed: int):
    # a terminal's Ctrl-C reaches the workers too: the parent stops them. Both signals came blocked from the parent
    # (running_pool), and SIGTERM is how a Pool ends its workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    _worker.update(val_fraction=val_fraction, seed=seed)
    _worker["codec"] = CharCodec(chars) if tokenizer == "char" else encoding_from_bytes(ranks, "the parent's ranks")


def _encode_batch(docs: list[str]) -> list[tuple[bool, np.ndarray]]:
    """(is_val, token ids ending in EOT) for each document; runs in a worker."""
    codec = _worker["codec"]
    if isinstance(codec, CharCodec):
        encoded = [np.append(codec.encode(d), codec.eot) for d in docs]
    else:
        encoded = [np.array(ids + [EOT], dtype=np.uint32) for ids in codec.encode_ordinary_batch(docs, num_threads=1)]
    return [(goes_to_val(d, _worker["val_fraction"], _worker["seed"]), ids) for d, ids in zip(docs, encoded)]


def batches(documents: Iterable[str | None], max_chars: int = BATCH_CHARS) -> Iterator[list[str]]:
    """The documents in batches of about max_chars, without the blank ones and a dataset's null texts (None),
    which would end in a second <|endoftext|> with nothing between."""
    batch, size = [], 0
    for doc in documents:
        if doc is None or not doc.strip():
            continue
        batch.append(doc)
        size += len(doc)
        if size >= max_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class TokenWriter:
    """Appends token ids to {split}.bin, or to shards {split}_000.bin, ... of shard_tokens tokens each.
    Files are written under .tmp names; dataset.write_meta renames them into place once the whole job has
    succeeded, so a failed or stopped prepare leaves the dataset that was there as it was."""

    def __init__(self, out_dir: str, split: str, dtype, shard_tokens: int = 0):
        self.out_dir, self.split, self.dtype, self.shard_tokens = out_dir, split, np.dtype(dtype), shard_tokens
        self.files, self.counts, self.handle, self.documents = [], [], None, 0

    def name(self, index: int) -> str:
        return f"{self.split}_{index:03d}.bin" if self.shard_tokens else f"{self.split}.bin"

    def _open_next(self):
        if self.handle:
            self.handle.close()
        name = self.name(len(self.files))
        self.files.append(name)
        self.counts.append(0)
        self.handle = open(os.path.join(self.out_dir, name + ".tmp"), "wb")

    def write(self, ids: np.ndarray):
        self.documents += 1
        ids = ids.astype(self.dtype, copy=False)
        while len(ids):
            if self.handle is None or (self.shard_tokens and self.counts[-1] >= self.shard_tokens):
                self._open_next()
            room = self.shard_tokens - self.counts[-1] if self.shard_tokens else len(ids)
            part, ids = ids[:room], ids[room:]
            self.handle.write(part.tobytes())
            self.counts[-1] += len(part)

    def finish(self) -> dict:
        """Close the last file; returns this split's entry for meta.json."""
        if self.handle:
            self.handle.close()
        return {"files": self.files, "tokens": sum(self.counts), "file_tokens": self.counts, "documents": self.documents}

    def discard(self):
        """Remove the .tmp files of a job that failed."""
        if self.handle:
            self.handle.close()
        for name in self.files:
            if os.path.exists(os.path.join(self.out_dir, name + ".tmp")):
                os.remove(os.path.join(self.out_dir, name + ".tmp"))


def split_by_position(writers: dict, val_fraction: float) -> dict:
    """New writers for a corpus whose whole documents split far from val_fraction (one or a few documents, such
    as a single .txt file, cut into documents of 1 to 2 MB): the train documents' tokens, then the val
    documents', each in their order, with the last val_fraction held out as val, as nanoGPT's prepare scripts cut
    a text (where all went to one split, the same token stream in the same order). The finished writers' files are
    moved, cut or appended to, never read whole."""
    olds = [writers["train"], writers["val"]]
    train, val = (TokenWriter(olds[0].out_dir, split, olds[0].dtype, olds[0].shard_tokens) for split in ("train", "val"))
    try:
        move_tail(olds, train, val, val_fraction)
        writers.update(train=train, val=val)  # here, so that a stop right after discards the new writers' files
    except BaseException:  # the files not yet moved are the old writers', which the caller discards
        train.discard()
        val.discard()
        raise
    return {"train": train, "val": val}


def move_tail(olds: list[TokenWriter], train: TokenWriter, val: TokenWriter, val_fraction: float):
    """split_by_position's moves: the old writers' files become train's, in order, then their last val_fraction
    of tokens val's."""
    first, *rest = [old for old in olds if old.files]
    for index, (name, count) in enumerate(zip(first.files, first.counts)):  # the first's files become train's
        train.files.append(train.name(index))  # listed first: a stop between the two leaves no file unlisted
        train.counts.append(count)
        os.replace(os.path.join(first.out_dir, name + ".tmp"), os.path.join(train.out_dir, train.name(index) + ".tmp"))
    if rest:  # the others' tokens go on their end, a chunk at a time, filling the last shard first
        train.handle = open(os.path.join(train.out_dir, train.files[-1] + ".tmp"), "ab")
        for old in rest:
            for name, count in zip(old.files, old.counts):
                path = os.path.join(old.out_dir, name + ".tmp")
                for start in range(0, count, 1 << 24):
                    train.write(np.fromfile(path, dtype=old.dtype, count=1 << 24, offset=start * old.dtype.itemsize))
                os.remove(path)
        train.handle.close()
        train.handle = None
    train.documents = sum(old.documents for old in olds)
    need, tail = max(1, round(sum(train.counts) * val_fraction)), []
    need = min(need, sum(train.counts) - 1)
    while need:  # the last `need` tokens, from the last file backwards
        path = os.path.join(train.out_dir, train.files[-1] + ".tmp")
        take = min(need, train.counts[-1])
        keep = train.counts[-1] - take
        tail.insert(0, np.fromfile(path, dtype=train.dtype, offset=keep * train.dtype.itemsize))
        if keep:
            os.truncate(path, keep * train.dtype.itemsize)
            train.counts[-1] = keep
        else:
            os.remove(path)
            train.files.pop()
            train.counts.pop()
        need -= take
    val.write(np.concatenate(tail))


def make_out_dir(out_dir: str) -> bool:
    """Create a dataset folder (True) or find it there (False); a PrepareError when out_dir names a file."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PrepareError(f"--out_dir {out_dir} is a file, not a folder: choose another --out_dir")
    try:
        os.makedirs(out_dir)
        return True
    except FileExistsError:
        return False


HELD: dict[str, tuple[str, bool]] = {}  # real path -> (out_dir, whether this prepare made it), while held


@contextlib.contextmanager
def holding(out_dir: str):
    """make_out_dir, then hold the folder for the block, with an flock on the folder itself (no file left in it,
    released by the kernel however the process ends): two prepares writing one folder at once would put one's
    token files beside the other's meta.json, so the second is refused. A hold inside another of the same folder
    (a script's own files around write_dataset's) is part of it. A block that fails leaves no folder it made (one
    that another prepare made, or fills, is not this one's to remove: it is decided under the lock)."""
    import fcntl
    key = os.path.realpath(out_dir)
    if key in HELD:
        yield
        return
    fd = None
    try:
        with signals_deferred():  # a stop between making the folder and holding it would leave it behind
            made = make_out_dir(out_dir)
            fd = os.open(out_dir, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PrepareError(f"--out_dir {out_dir} is being written by another prepare: wait for it to end, or "
                                   "choose another --out_dir") from None
            except OSError as e:  # a filesystem without locks (some NFS or FUSE mounts): write unguarded, as before
                if e.errno not in NO_LOCKS:  # as common.FolderLock
                    raise
            HELD[key] = (out_dir, made)
        yield
    except BaseException:
        if HELD.get(key, (None, False))[1]:
            with contextlib.suppress(OSError):  # only while it is empty: a failed prepare leaves nothing in it
                os.rmdir(out_dir)
        raise
    finally:
        HELD.pop(key, None)
        if fd is not None:
            os.close(fd)


def abandon_held() -> None:
    """For a prepare stopped by a signal, which exits at once: remove the .tmp files of the folders it holds and
    a folder it made."""
    for out_dir, made in HELD.values():
        for name in os.listdir(out_dir):
            base = name[:-len(".tmp")]
            ours = token_file_split(base) in ("train", "val") or base in ("meta.json", "meta.pkl")
            if name.endswith(".tmp") and ours:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(out_dir, name))
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)


def held_dataset(out_dir: str) -> str | None:
    """What dataset out_dir holds already, in a few words (None: none), so that a prepare does not replace it
    unasked: a run trained on it resumes only on the same tokens. A dataset is a meta.json or the token files a
    prepare writes (train.bin, val_000.bin, ...; nanoGPT's layout has no meta.json), which a prepare replaces;
    other files are not one."""
    names = dataset_files_in(out_dir)  # none when there is no folder yet (or a file there, which make_out_dir names)
    bins = [name for name in names if name != "meta.json"]
    if "meta.json" in names:
        try:
            meta = read_meta(out_dir)
        except (UserError, OSError):  # torn, or another tool's: replaced too
            return "a meta.json that is not a dataset's" + (f", token files {', '.join(bins[:3])}" if bins else "")
        return (f"a dataset ({meta['tokenizer']}, {sum(meta['splits']['train']['file_tokens']):,} train tokens, "
                f"vocab_size {meta['vocab_size']}" + (f", from {meta['source']}" if meta.get("source") else "") + ")")
    return f"a dataset (token files {', '.join(bins[:3])}{', ...' if len(bins) > 3 else ''})" if bins else None


def refuse_to_replace(out_dir: str):
    """A PrepareError when out_dir holds a dataset (held_dataset)."""
    held = held_dataset(out_dir)
    if held:
        raise PrepareError(f"--out_dir {out_dir} already holds {held}: choose another --out_dir, or add "
                           "--overwrite to replace it (a run trained on it resumes only on the same tokens)")


def write_dataset(out_dir: str, parts: dict[str, np.ndarray], meta: dict, meta_pkl: dict | None = None,
                  overwrite: bool = True) -> dict:
    """Write whole splits ({split: token ids}) and meta.json (meta with the splits' entries added), and nanoGPT's
    meta.pkl when given, all or nothing: on any failure the .tmp files go and the dataset that was there stays.
    overwrite=False refuses a folder that holds a dataset (held_dataset). Returns the entries."""
    with holding(out_dir):
        if not overwrite:
            refuse_to_replace(out_dir)
        with staged_meta_pkl(out_dir, meta_pkl):
            writers = {split: TokenWriter(out_dir, split, ids.dtype) for split, ids in parts.items()}
            try:
                for split, ids in parts.items():
                    writers[split].write(ids)
                splits = {split: writer.finish() for split, writer in writers.items()}
                write_meta(out_dir, {**meta, "splits": splits}, meta_pkl=meta_pkl is not None)
            except BaseException:
                for writer in writers.values():
                    writer.discard()
                raise
    return splits


class Stopped(BaseException):
    """SIGTERM, raised where the prepare is, as Ctrl-C's KeyboardInterrupt is: what it has begun is undone on the
    way out (a pip download's process killed, temporary files removed)."""


def run_cli(job, out_dir: str):
    """Run a prepare script's job and return what it returns; a UserError (PrepareError, a rank file that is not
    GPT-2's) or a failed write (a full disk) ends the script with one error line, and a Ctrl-C or SIGTERM with
    one line saying what is left (exit 128+N). While worker processes run, the stop does not unwind: a Pool's
    shutdown can hang on a task half written to workers that are gone (SIGTERM to the process group). The
    handler then removes the .tmp files and a folder this prepare made, kills the workers and exits at once.
    While a finished dataset is put in place, the signal waits (dataset.write_meta)."""
    existed = os.path.lexists(out_dir)
    run_files = run_files_in(out_dir)
    if run_files:
        sys.exit(f"error: --out_dir {out_dir} holds a training run ({', '.join(run_files)}): a dataset goes in a "
                 "folder of its own; choose another --out_dir")

    def stopped(signum) -> str:
        gone = not existed and not os.path.lexists(out_dir)
        return f"stopped by {signal.Signals(signum).name}: " + (
            f"{out_dir}, which was not there before, is not there now" if gone else f"{out_dir} holds the dataset "
            "that was there, or the new one whole if the stop came as it was put in place; no .tmp file is left")

    def stop(signum, _):
        if not POOLS:  # no workers: unwinding undoes what was begun
            raise Stopped(signum)
        end_now(lambda: stopped(signum), 128 + signum)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    global EXITS_AT_ONCE
    EXITS_AT_ONCE = True  # a worker's death too (wait_for): this process is the prepare's alone
    # that exit leaves the Pool's semaphores to multiprocessing's resource tracker, which removes them and would
    # warn of them under the line above: told here, before it starts (it takes this process's -W options), not to
    sys.warnoptions.append("ignore:resource_tracker:UserWarning")
    try:
        return job()
    except (KeyboardInterrupt, Stopped) as e:
        signum = e.args[0] if isinstance(e, Stopped) else signal.SIGINT
        say(stopped(signum))
        sys.exit(128 + signum)
    except UserError as e:
        sys.exit(f"error: {e}")
    except OSError as e:  # the earlier dataset is still in place: new files are put there only at the end
        where, out = os.path.abspath(str(e.filename or "")), os.path.abspath(out_dir)
        output = where == out or where.startswith(out + os.sep) or out.startswith(where + os.sep)  # or a parent
        if e.filename is not None and not output:  # an input (a broken link, a file it may not read)
            sys.exit(f"error: cannot read {e.filename} ({e.strerror or e}): fix it or leave it out of --input; the "
                     f"dataset in {out_dir} is unchanged")
        sys.exit(f"error: cannot write the dataset to {out_dir} ({e.strerror or e}); the dataset that was there "
                 "is unchanged")


def say(line: str):
    """Print a last line to stderr, over a progress line left open on a terminal."""
    with contextlib.suppress(Exception):  # a reader gone (a Ctrl-C that also ended `| tee`) stops nothing here
        sys.stdout.flush()
        print(("\r\033[K" if sys.stderr.isatty() else "") + line, file=sys.stderr, flush=True)


EXITS_AT_ONCE = False  # set by run_cli, whose process is the prepare's own: see end_now


def end_now(line, code: int):
    """Exit at once with exit code code, workers and all: remove the .tmp files and a folder this prepare made
    (abandon_held), print line() (called after that), end the workers, then this process. Unwinding instead would
    run the Pool's shutdown, which can hang for ever on a task or a lock that a dead worker left half done."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second stop (to any thread): not a second ending
        signal.signal(sig, signal.SIG_IGN)
    try:
        with contextlib.suppress(Exception):  # a folder gone meanwhile
            abandon_held()
        say(line())
    finally:  # the workers last, then at once
        for pool in POOLS:
            stop_replacing_workers(pool)
        for child in multiprocessing.active_children():
            child.kill()
        os._exit(code)


def worker_ended(worker: multiprocessing.Process):
    """A worker ended while the prepare ran (killed by the out-of-memory killer, say): the Pool would start another,
    but the batch it held would never come back. Under run_cli, end_now with one error line; called in-process, a
    PrepareError (the Pool's shutdown may then still hang on a lock the dead worker held)."""
    code = worker.exitcode
    if code == -signal.SIGTERM:  # a stop sent to each process (systemd's, Slurm's): this one's comes in a moment
        time.sleep(1)
    try:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    except ValueError:  # a signal without a name (a real-time one)
        how = f"killed by signal {-code}"
    how += ", as the system's out-of-memory killer kills" if code == -signal.SIGKILL else ""
    said = f"a worker process of this prepare ended ({how})"
    if EXITS_AT_ONCE:
        def line():
            where = "; ".join(f"{out_dir} was not there before and is not there now" if made and not
                              os.path.lexists(out_dir) else f"{out_dir} holds the dataset that was there"
                              for out_dir, made in HELD.values())
            return f"error: {said}; {where}: run it again, with fewer --workers if memory ran short"
        end_now(line, 1)
    for pool in POOLS:
        stop_replacing_workers(pool)
    raise PrepareError(f"{said}: run it again, with fewer workers if memory ran short")


def stop_replacing_workers(pool):
    """End the thread by which a Pool starts a worker in place of one that died, as Pool.terminate does first (its
    later steps can hang here, on a task half written to workers that are gone). Otherwise the workers the stop
    killed were replaced at once, and this process's exit could come while a new one was being started: that one
    then printed a traceback (EOFError) from reading its start-up data. Pool has no public call for this alone."""
    pool._worker_handler._state = multiprocessing.pool.TERMINATE
    pool._change_notifier.put(None)  # wakes it to see that
    # a start under way ends first, so that the worker it starts is listed (and killed): seconds under load, as the
    # new worker imports this script before it reads the rest of its start-up data; one cut short printed a traceback
    pool._worker_handler.join(timeout=30)


POOLS = []  # one entry per Pool running in this process (run_cli's handler: a stop then exits without unwinding)


@contextlib.contextmanager
def running_pool(workers: int, init_args: tuple):
    """A Pool of spawned workers (see _init_worker) for the block. It starts with SIGINT and SIGTERM blocked in
    this thread, pending for run_cli's handler until the workers are listed: a stop in the middle would leave
    one half started (its initial arguments half written). The Pool's threads keep that block for good, so that a
    stop reaches the main thread, not one of them: the main thread could otherwise wait for ever on a result from a
    worker the same stop killed."""
    # the resource tracker, started by a Pool's first lock, unblocks both signals in the thread that starts it, so
    # it starts before the block (a no-op once it runs)
    multiprocessing.resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker, init_args)
        POOLS.append(pool)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        with pool:
            yield pool
    finally:
        POOLS.remove(pool)


def wait_for(result: multiprocessing.pool.AsyncResult, workers: list[multiprocessing.Process]):
    """A Pool task's result, waited for a second at a time: a stop that another thread took (one of numpy's, which
    do not block signals) is then handled in the main thread, where Python runs handlers, within the second, not
    after a result that a worker killed by the same stop will never send. One of workers that has ended ends the
    prepare (worker_ended)."""
    while True:
        for worker in workers:
            if worker.exitcode is not None:
                worker_ended(worker)
        if result.ready():
            return result.get()
        result.wait(1)


def prepare_corpus(documents: Iterable[str], out_dir: str, tokenizer: str = "gpt2", chars: str | None = None,
                   val_fraction: float = 0.01, seed: int = 0, workers: int = 0, shard_tokens: int = 0,
                   rank_file: str | None = None, progress: bool = True, source: str = "",
                   overwrite: bool = True) -> dict:
    """Tokenize documents into out_dir with worker processes (0: one per core) and write meta.json.
    tokenizer is 'gpt2' or 'char' (then chars is the sorted alphabet); overwrite=False refuses a folder that holds
    a dataset (held_dataset). Returns the meta dict."""
    if tokenizer not in ("gpt2", "char"):
        raise PrepareError(f"tokenizer '{tokenizer}' is not gpt2 or char")
    if tokenizer == "char" and not chars:
        raise PrepareError("the char tokenizer needs an alphabet, and the corpus has no non-blank document to take "
                           "it from: check --input")
    if not 0 < val_fraction < 1:
        raise PrepareError(f"--val_fraction {val_fraction} is not in (0, 1): train.py needs a val split")
    if len(str(seed)) > 64:  # the split's hash takes it as a key of at most 64 bytes
        raise PrepareError(f"--seed {seed} has {len(str(seed))} characters: give one of at most 64")
    for flag, value, zero in (("shard_tokens", shard_tokens, "one file per split"),
                              ("workers", workers, "one per core")):
        if value < 0:
            raise PrepareError(f"--{flag} {value} must be >= 0 (0: {zero})")
    # the rank file is found once, here, and its bytes handed to the workers: where it cannot be cached (a
    # read-only home), each worker would otherwise download it again
    ranks = rank_file_bytes(gpt2_encoding(rank_file)) if tokenizer == "gpt2" else None
    vocab_size = len(chars) + 1 if tokenizer == "char" else EOT + 1
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    with holding(out_dir):
        if not overwrite:
            refuse_to_replace(out_dir)
        writers = {split: TokenWriter(out_dir, split, dtype, shard_tokens) for split in ("train", "val")}
        workers = workers or os.cpu_count() or 1
        max_id, n_chars, t0, shown = -1, 0, time.time(), 0.0
        # on a terminal the progress line is rewritten in place every half second; in a log file (no "\r" there) a
        # line is added every PROGRESS_LOG_S
        live = sys.stderr.isatty()
        pace, lead, end = (0.5, "\r", "") if live else (PROGRESS_LOG_S, "", "\n")
        try:
            others = multiprocessing.active_children()  # a caller's (none from the CLI)
            with running_pool(workers, (tokenizer, chars, ranks, val_fraction, seed)) as pool:
                started = [child for child in multiprocessing.active_children() if child not in others]  # the Pool's
                pending = collections.deque()  # a few batches in flight: enough to keep workers busy, memory bounded

                def drain_one():
                    nonlocal max_id
                    for is_val, ids in wait_for(pending.popleft(), started):
                        writers["val" if is_val else "train"].write(ids)
                        if len(ids):
                            max_id = max(max_id, int(ids.max()))

                for batch in batches(documents):
                    n_chars += sum(len(d) for d in batch)
                    pending.append(pool.apply_async(_encode_batch, (batch,)))
                    if len(pending) >= 2 * workers:
                        drain_one()
                    if progress and time.time() - (shown or t0) > pace:
                        shown = time.time()
                        tokens = sum(sum(w.counts) for w in writers.values())  # of the batches written so far
                        print(f"{lead}{n_chars / 1e6:,.1f}M characters read, {tokens:,} tokens written ("
                              f"{tokens / (shown - t0):,.0f} tokens/s)", end=end, file=sys.stderr, flush=True)
                while pending:
                    drain_one()
            splits = {split: w.finish() for split, w in writers.items()}
            documents = sum(s["documents"] for s in splits.values())
            total = sum(s["tokens"] for s in splits.values())
            if total < 2:
                raise PrepareError(f"the corpus gave {total} tokens ({documents} non-blank documents): check --input")
            val_share = splits["val"]["tokens"] / total
            if 0 in (splits["train"]["tokens"], splits["val"]["tokens"]) or val_share > max(0.5, 2 * val_fraction):
                # a few large documents: whole ones cannot come near val_fraction, and may leave train almost none
                how = (f"every document ({documents}) went to one split, so val is instead the last "
                       if val_share in (0, 1) else f"the {documents} documents put {val_share:.0%} of the tokens in "
                       "val, so val is instead (of the train documents' tokens, then the val documents') the last ")
                writers = split_by_position(writers, val_fraction)
                splits = {split: w.finish() for split, w in writers.items()}
                print(("\n" if shown and live else "")
                      + f"note: {how}{splits['val']['tokens']:,} tokens (val_fraction {val_fraction})", file=sys.stderr)
            meta = {"tokenizer": tokenizer, "vocab_size": vocab_size, "dtype": np.dtype(dtype).name,
                    "eot_token": vocab_size - 1, "max_token_id": max_id, "splits": splits, "source": source}
            if tokenizer == "char":
                meta["chars"] = chars
            write_meta(out_dir, meta)  # puts the new token files in place, then meta.json
        except BaseException:
            for writer in writers.values():
                writer.discard()
            if shown and live:
                print(file=sys.stderr)  # end the progress line, so an error starts a line of its own
            raise
    if progress:
        elapsed = time.time() - t0
        total = sum(s["tokens"] for s in splits.values())
        print(f"{lead if shown else ''}{total:,} tokens from {n_chars:,} characters in {elapsed:.1f} s "
              f"({total / elapsed:,.0f} tokens/s); "
              f"train {splits['train']['tokens']:,}, val {splits['val']['tokens']:,} -> {out_dir}", file=sys.stderr)
    return meta


def alphabet(documents: Iterable[str]) -> str:
    """The sorted set of characters in documents (the char tokenizer's first pass)."""
    seen = set()
    for doc in documents:
        seen.update(doc)
    return "".join(sorted(seen))


if __name__ == "__main__":
    start_script()
    parser = ArgumentParser(__doc__)
    parser.add_argument("--input", nargs="+", required=True, help="files, folders or globs of .txt/.jsonl/.parquet")
    parser.add_argument("--out_dir", required=True, help="dataset folder to write (give it as --dataset to train.py)")
    parser.add_argument("--tokenizer", default="gpt2", choices=["gpt2", "char"],
                        help="GPT-2's BPE, or one token per character (default: gpt2)")
    parser.add_argument("--text_field", default="text", help="the text's field in .jsonl and .parquet records "
                                                             "(default: text)")
    parser.add_argument("--val_fraction", type=float, default=0.01, help="share of documents held out for val "
                                                                         "(default: 0.01)")
    parser.add_argument("--seed", type=int, default=0, help="changes which documents go to val (default: 0)")
    parser.add_argument("--shard_tokens", type=int, default=0, help="tokens per shard file; 0 writes one file per split")
    parser.add_argument("--workers", type=int, default=0, help="tokenizer processes; 0 means one per core")
    parser.add_argument("--gpt2_tiktoken", default=None, help="path to GPT-2's gpt2.tiktoken rank file, for offline use")
    parser.add_argument("--overwrite", action="store_true", help="replace the dataset that --out_dir holds")
    args = parser.parse_args()

    def job():
        if not args.overwrite:  # here, before the corpus is read, and again once the folder is held
            refuse_to_replace(args.out_dir)
        if args.tokenizer == "gpt2" and args.gpt2_tiktoken and not os.path.isfile(args.gpt2_tiktoken):
            raise PrepareError(f"--gpt2_tiktoken {args.gpt2_tiktoken} is not a file")
        files = list_files(args.input)
        chars = alphabet(iter_documents(files, args.text_field, notes=False)) if args.tokenizer == "char" else None
        prepare_corpus(iter_documents(files, args.text_field), args.out_dir, args.tokenizer, chars, args.val_fraction,
                       args.seed, args.workers, args.shard_tokens, args.gpt2_tiktoken, source=" ".join(args.input),
                       overwrite=args.overwrite)
    run_cli(job, args.out_dir)
