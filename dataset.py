"""
Datasets on disk: the one owner of meta.json (write_meta, read_meta) and of nanoGPT's meta.pkl (staged_meta_pkl,
read_meta_pkl), the checks that a dataset's token files are whole, get_batch, which draws a batch of windows
from them, and Prefetcher, which reads batches ahead on background threads. Used by train.py, bench.py, checkpoint.py and data/prepare.py (so every prepare
script).

A dataset folder holds meta.json (written by data/prepare.py and the data/*/prepare.py scripts) and its
token files; nanoGPT's layout (train.bin and val.bin as uint16, maybe meta.pkl) is read too.
"""
import contextlib
import errno
import hashlib
import json
import mmap
import numbers
import os
import pickle
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait as futures_wait

import numpy as np

from common import UserError, atomic_write, fsync_file, plural, read_json, signals_deferred

META_KEYS = ("tokenizer", "vocab_size", "dtype", "splits")  # what every meta.json has; readers may need more


def write_meta(out_dir: str, meta: dict, meta_pkl: bool = False):
    """Finish a prepare: rename its token files from their .tmp names into place, write meta.json, then delete
    the token files of the earlier dataset that the new one does not reuse: those its meta.json listed, and
    nanoGPT's {split}.bin (a user's train_backup.bin or train_2024.bin stays), and an earlier meta.pkl, unless
    meta_pkl: the caller staged a new one as meta.pkl.tmp, put in place with the token files. Called only
    when the whole job has succeeded, so a failed prepare leaves the earlier dataset as it was. The files reach
    the disk first, which can take minutes for gigabytes, while the earlier dataset is still whole; then the
    renames and meta.json take milliseconds, and a Ctrl-C or SIGTERM in them waits for their end, so that no
    old file is left beside new ones of the same size, which nothing could tell apart."""
    problem = meta_problem(meta)
    if problem:
        raise ValueError(f"meta.json {problem}")
    keep = {name for split in meta["splits"].values() for name in split["files"]}
    try:
        earlier = read_meta(out_dir) or {"splits": {}}
    except (UserError, OSError):  # torn, or another tool's: its files are not known to be a dataset's
        earlier = {"splits": {}}
    listed = {name for split in earlier["splits"].values() for name in split["files"]} | \
        {f"{split}.bin" for split in meta["splits"]}
    stale = sorted(name for name in listed - keep if token_file_split(name) in meta["splits"])  # never ../ or ckpt.pt
    staged = [os.path.join(out_dir, name) for name in (*sorted(keep), *(["meta.pkl"] if meta_pkl else []))
              if os.path.exists(os.path.join(out_dir, name + ".tmp"))]
    for path in staged:
        fsync_file(path + ".tmp")
    with signals_deferred():
        for path in staged:
            os.replace(path + ".tmp", path)
        with atomic_write(os.path.join(out_dir, "meta.json")) as f:  # its folder's sync makes the renames durable too
            json.dump(meta, f, indent=1)
        if not meta_pkl and os.path.exists(os.path.join(out_dir, "meta.pkl")):  # nanoGPT's vocabulary of the tokens
            os.remove(os.path.join(out_dir, "meta.pkl"))  # just replaced: stale
        for name in stale:
            if os.path.isfile(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))


@contextlib.contextmanager
def staged_meta_pkl(out_dir: str, obj: dict | None):
    """nanoGPT's meta.pkl (obj) pickled to out_dir/meta.pkl.tmp (a full disk shows here, before anything is
    replaced), for write_meta to flush to the disk with the token files and put in place; the .tmp file is gone
    after the block if it is still there. obj None: nothing."""
    path = os.path.join(out_dir, "meta.pkl.tmp")
    try:
        if obj is not None:
            with open(path, "wb") as f:
                pickle.dump(obj, f)
        yield
    finally:
        if obj is not None and os.path.exists(path):
            os.remove(path)


def run_files_in(folder: str) -> list[str]:
    """The files that make folder a training run's (ckpt.pt, run.json) rather than a dataset's."""
    return [name for name in ("ckpt.pt", "run.json") if os.path.isfile(os.path.join(folder, name))]


def dataset_files_in(folder: str) -> list[str]:
    """The files that make folder a dataset's (meta.json, and the token files a prepare writes: train.bin,
    val_000.bin, ...; nanoGPT's layout has no meta.json), sorted; [] when there is no such folder."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(name for name in names if name == "meta.json" or token_file_split(name) in ("train", "val"))


def token_file_split(name: str) -> str | None:
    """The split whose token file a prepare would name `name` ({split}.bin, or {split}_000.bin, ... when sharded);
    None for another name. train_backup.bin is no train file: its split would be train_backup."""
    match = re.fullmatch(r"(.+?)(_\d{3,})?\.bin", name)
    return match.group(1) if match else None


def read_meta(data_dir: str) -> dict | None:
    """meta.json of a dataset folder, checked; None when the folder has none (nanoGPT's layout)."""
    path = os.path.join(data_dir, "meta.json")
    meta = read_json(path, "prepare the dataset again")
    if meta is None:
        return None
    problem = meta_problem(meta)
    if problem:
        raise UserError(f"{path} {problem}: prepare the dataset again")
    return meta


def meta_problem(meta) -> str | None:
    """What is wrong with a meta.json's contents, or None: the keys every reader needs, a token dtype that
    get_batch reads, and for each split a list of file names with a token count each."""
    missing = [k for k in META_KEYS if k not in meta] if isinstance(meta, dict) else list(META_KEYS)
    if missing:
        return f"lacks {missing}"
    if meta["tokenizer"] not in ("gpt2", "char"):
        return f"gives tokenizer {meta['tokenizer']!r}, not gpt2 or char"
    if meta["dtype"] not in ("uint16", "uint32"):
        return f"gives dtype {meta['dtype']!r}, not uint16 or uint32"
    if not (isinstance(meta["vocab_size"], int) and meta["vocab_size"] > 0):
        return f"gives vocab_size {meta['vocab_size']!r}, not a positive integer"
    for split in ("train", "val"):
        entry = meta["splits"].get(split) if isinstance(meta["splits"], dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("files"), list) and isinstance(entry.get("file_tokens"), list)
                and len(entry["files"]) == len(entry["file_tokens"]) > 0
                and all(isinstance(f, str) for f in entry["files"])
                and all(isinstance(n, int) for n in entry["file_tokens"])):
            return f"has no {split} split with a list of file names and their token counts"
    if not isinstance(meta.get("max_token_id", 0), int):
        return f"gives max_token_id {meta['max_token_id']!r}, not an integer"
    if meta["tokenizer"] == "char" and "chars" not in meta:
        return "gives no chars (the character table of a char dataset)"
    if "chars" in meta and not (isinstance(meta["chars"], str) and len(meta["chars"]) <= meta["vocab_size"]):
        return "gives chars that are not a string within vocab_size"
    return None


def read_meta_pkl(data_dir: str) -> dict | None:
    """nanoGPT's meta.pkl (vocab_size, itos, stoi) of a character dataset, or None."""
    path = os.path.join(data_dir, "meta.pkl")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            meta = pickle.load(f)
    except Exception as e:  # a torn or foreign pickle raises any of several types
        raise UserError(f"{path} is torn or not a pickle ({e.__class__.__name__}): prepare the dataset again") from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if not (isinstance(itos, dict) and isinstance(meta.get("vocab_size"), int)
            and all(isinstance(k, numbers.Integral) and not isinstance(k, bool) and isinstance(c, str) and len(c) == 1
                    for k, c in itos.items())  # sorting mixed keys would raise
            and sorted(itos) == list(range(len(itos)))):
        raise UserError(f"{path} lacks vocab_size or an itos table of ids 0..n-1 to characters: prepare the dataset "
                        "again")
    return meta


def declared_vocab(data_dir: str) -> tuple[int | None, dict]:
    """(vocab_size, vocabulary) that a dataset folder declares: from meta.json, else from nanoGPT's meta.pkl (a
    character dataset); None for what is unknown (a nanoGPT folder without meta.pkl). vocabulary: see vocabulary_of."""
    meta = read_meta(data_dir)
    pkl = read_meta_pkl(data_dir) if meta is None else None
    return (meta or pkl or {}).get("vocab_size"), vocabulary_of(meta, pkl)


def vocabulary_of(meta: dict | None, pkl: dict | None) -> dict:
    """{'tokenizer', 'chars'} of a dataset from its meta.json and meta.pkl, already read (either may be None)."""
    if meta is not None:
        return {"tokenizer": meta["tokenizer"], "chars": meta.get("chars")}
    if pkl is not None:
        return {"tokenizer": "char", "chars": "".join(pkl["itos"][i] for i in range(len(pkl["itos"])))}
    return {"tokenizer": None, "chars": None}


FINGERPRINT_BYTES = 4096  # a token file's fingerprint is of its first and last 4 KiB: 8 KiB read, whatever its size


def fingerprint(path: str) -> str:
    """A short hash of a token file's ends: a dataset prepared again from another text of the same token counts
    (its lines reordered, say) has other ones."""
    with open(path, "rb") as f:
        head = f.read(FINGERPRINT_BYTES)
        f.seek(max(0, os.path.getsize(path) - FINGERPRINT_BYTES))
        return hashlib.sha256(head + f.read()).hexdigest()[:16]


def token_files(data: dict) -> dict:
    """{split: [[file name, tokens, fingerprint], ...]} of a loaded dataset (load_dataset): what a checkpoint keeps
    of the data its run read, so that a resume can tell when the data changed under the run."""
    return {split: [[os.path.basename(path), n, fingerprint(path)] for path, n in files]
            for split, files in data["splits"].items()}


def data_change(saved: dict | None, now: dict) -> dict:
    """{split: how its files changed, in words} between the token files a run read (token_files, as its checkpoint
    keeps them; None for checkpoints from before they were kept, and no fingerprints before those were) and the
    dataset's now; empty when none did."""
    def files(split_files):
        return f"{plural(len(split_files), 'file')} of {sum(f[1] for f in split_files):,} tokens"
    change = {}
    for split in ("train", "val") if saved is not None else ():
        then, now_files = saved.get(split) or [], now[split]
        if [f[:2] for f in then] != [f[:2] for f in now_files]:
            change[split] = f"{files(then)} then, {files(now_files)} now"
        elif any(len(a) > 2 and a != b for a, b in zip(then, now_files)):
            change[split] = f"the same {files(then)}, with other tokens in them now"
    return change


def model_vocab_size(vocab_size: int | None, vocabulary: dict) -> int:
    """The vocabulary of a model trained on a dataset that declares vocab_size (None: unknown) and vocabulary (see
    vocabulary_of). A character dataset's exactly, as nanoGPT has it. A tokenizer's rounded up to a multiple of 64,
    so GPT-2's 50257 becomes 50304, as nanoGPT pads it: a GPU runs the output layer's matmul faster on such sides.
    The extra rows are never a target, so training gives them no probability, and generate is told not to sample
    them. Unknown: GPT-2's, padded."""
    if vocabulary.get("chars") is not None:
        return vocab_size
    return -(-(vocab_size or 50257) // 64) * 64


def find_dataset(dataset: str) -> str:
    """The folder of a dataset: a path as given, else data/<dataset> beside this file."""
    if os.path.isdir(dataset):
        return dataset
    if os.path.isfile(dataset):  # a token file or a text, where the folder is meant
        folder = os.path.dirname(dataset) or "."
        fix = (f"give its folder, --dataset={folder}" if dataset.endswith(".bin") else
               f"prepare it first (python data/prepare.py --input {dataset} --out_dir data/NAME), then give that folder")
        raise UserError(f"dataset '{dataset}' is a file, not a dataset folder: {fix}")
    data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", dataset)
    if not os.path.isdir(data_dir):
        # (a folder data/NAME with a prepare.py of its own is there, and is met below, unprepared)
        how = f"python data/prepare.py --input YOUR_TEXT --out_dir {dataset if os.sep in dataset else 'data/' + dataset}"
        where = dataset if os.path.isabs(dataset) else f"{dataset} or {data_dir}"  # an absolute path joins to itself
        raise UserError(f"dataset '{dataset}' not found: no folder {where}; prepare it first ({how})")
    return data_dir


OPEN_FILES: dict[str, object] = {}  # token file path -> the file, open since this process first read it


def open_token_file(path: str, fresh: bool = False):
    """The token file at path as this process last opened it afresh (count_tokens does, as load_dataset takes
    stock), kept open: a prepare that replaces the dataset while a run reads it (a new file under the old name)
    leaves the run on the data it counted and started with, rather than reading windows of the old counts in the
    new files (an IndexError, or other ids)."""
    if fresh or path not in OPEN_FILES:
        try:
            OPEN_FILES[path] = open(path, "rb")  # the file it replaces is closed as this one takes its place
        except OSError as e:
            if e.errno != errno.EMFILE:
                raise
            raise UserError(f"cannot keep {path} open beside the {len(OPEN_FILES)} token files open already (the "
                            "open-file limit, ulimit -n): raise it, or prepare the dataset with a larger "
                            "--shard_tokens") from None
    return OPEN_FILES[path]


FILES_BESIDE = 64  # open files a run needs beside its token files: the read-ahead threads' maps, logs, libraries


def make_room_for_files(n_files: int):
    """Raise this process's open-file limit (as far as its hard limit allows) so that n_files token files can stay
    open beside what else it opens: 1024 by default on many systems, which a dataset of many shards passes."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n_files + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
    if hard != resource.RLIM_INFINITY and hard < n_files + FILES_BESIDE:  # said now, not mid-run as a traceback
        raise UserError(f"the dataset's {n_files} token files stay open, beside about {FILES_BESIDE} more files of "
                        f"the run, but the open-file limit (ulimit -n) allows {hard}: raise it, or prepare the "
                        "dataset with a larger --shard_tokens")


def count_tokens(path: str, dtype) -> int:
    """Number of tokens in a token file, or a UserError when it is missing, empty or torn."""
    if not os.path.isfile(path):
        raise UserError(f"token file {path} is missing: prepare the dataset again")
    n_bytes, itemsize = os.fstat(open_token_file(path, fresh=True).fileno()).st_size, np.dtype(dtype).itemsize
    if n_bytes == 0:
        raise UserError(f"token file {path} is empty: prepare the dataset again")
    if n_bytes % itemsize:
        raise UserError(f"{path} is {n_bytes} bytes, not a whole number of {itemsize}-byte tokens: prepare it again")
    return n_bytes // itemsize


def max_token_id(paths: list[str], dtype, chunk: int = 1 << 26) -> int:
    """The largest token id in the files, read in chunks (for datasets without meta.json to say it)."""
    largest = 0
    for path in paths:
        data = token_map(path, dtype)  # read in order: the kernel's read-ahead serves it
        for i in range(0, len(data), chunk):
            largest = max(largest, int(data[i:i + chunk].max()))
    return largest


def wide_tokens(path: str, sample: int = 1 << 20) -> bool:
    """Whether a token file of GPT-2 ids read as nanoGPT's uint16 looks like uint32 tokens (as forks with larger
    vocabularies write): every second uint16 of its first `sample`, the high half of a uint32 id below 65536, is
    0. GPT-2 text has no such pattern (id 0 is '!'); a file under WIDE_CHECK_MIN uint16s is too short to tell."""
    data = token_map(path, np.uint16)[:sample]
    return len(data) >= WIDE_CHECK_MIN and len(data) % 2 == 0 and not data[1::2].any() and data[0::2].any()


WIDE_CHECK_MIN = 2048


def ram_bytes() -> int | None:
    """This machine's physical memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def larger_than_cache(n_bytes: int, ram: int | None) -> bool:
    """Whether token files of n_bytes are too big to stay in the page cache of a machine with ram bytes: more than
    half of it. Such files are read with random_access (see token_map)."""
    return ram is not None and n_bytes > ram // 2


def load_dataset(dataset: str, block_size: int | None) -> dict:
    """A dataset's token files, checked (and against block_size, unless None: check_block_size): {'dir', 'dtype',
    'vocab_size' (None if unknown), 'max_token_id', 'vocabulary' ({'tokenizer', 'chars'}, None where unknown),
    'splits': {'train': [(path, n_tokens), ...], 'val': [...]}, 'random_access': whether to read them so (see
    larger_than_cache)}. meta.json (written by data/prepare.py) gives the dtype, vocabulary and shard files;
    without it, nanoGPT's layout: train.bin and val.bin as uint16, with the vocabulary from meta.pkl if there is one."""
    data_dir = find_dataset(dataset)
    meta, pkl = read_meta(data_dir), None
    if meta is not None:
        dtype, vocab_size, max_id = np.dtype(meta["dtype"]), meta["vocab_size"], meta.get("max_token_id")
        files = {split: [os.path.join(data_dir, name) for name in meta["splits"][split]["files"]] for split in ("train", "val")}
        expected = {split: meta["splits"][split]["file_tokens"] for split in ("train", "val")}
    else:
        dtype, vocab_size, max_id, expected = np.dtype(np.uint16), None, None, None
        files = {split: [os.path.join(data_dir, f"{split}.bin")] for split in ("train", "val")}
        if not os.path.isfile(files["train"][0]):
            run = run_files_in(data_dir)
            if run:
                raise UserError(f"dataset '{dataset}' is a training run's folder ({', '.join(run)}), not a dataset: "
                                "give the dataset folder the run trained on (its config.json names it)")
            script = os.path.join(data_dir, "prepare.py")
            how = (f"python {os.path.relpath(script)}" if os.path.isfile(script) else
                   f"python data/prepare.py --input YOUR_TEXT --out_dir {data_dir}")
            raise UserError(f"dataset '{dataset}' has no train.bin or meta.json in {data_dir}: prepare it first ({how})")
        pkl = read_meta_pkl(data_dir)
        vocab_size = pkl["vocab_size"] if pkl else None
    splits = {}
    make_room_for_files(sum(len(paths) for paths in files.values()))
    for split, paths in files.items():
        counts = [count_tokens(path, dtype) for path in paths]
        if expected is not None and counts != expected[split]:
            raise UserError(f"{split} files in {data_dir} hold {counts} tokens but meta.json says {expected[split]}: "
                            "prepare the dataset again")
        splits[split] = list(zip(paths, counts))  # never empty: meta_problem requires a file per split
    if meta is None and pkl is None:  # nanoGPT's GPT-2 layout, read as uint16: a fork's uint32 file would train on a
        # 0 between every two tokens (with meta.pkl, id 0 is a character, '\n' in nanoGPT's: a text of one-character
        # lines would look the same)
        wide = next((path for path in files["train"] + files["val"] if wide_tokens(path)), None)
        if wide:
            raise UserError(f"{wide} looks like uint32 tokens (every second uint16 is 0), but without meta.json a "
                            "dataset is read as nanoGPT's uint16: prepare it with data/prepare.py, whose meta.json "
                            "names the dtype")
    if max_id is None:
        max_id = max_token_id(files["train"] + files["val"], dtype)
    n_bytes = sum(n for split in splits.values() for _, n in split) * dtype.itemsize
    data = {"dir": data_dir, "dtype": dtype, "vocab_size": vocab_size, "max_token_id": max_id,
            "vocabulary": vocabulary_of(meta, pkl), "splits": splits,
            "random_access": larger_than_cache(n_bytes, ram_bytes())}
    if block_size is not None:
        check_block_size(data, block_size)
    return data


def check_block_size(data: dict, block_size: int):
    """Each split of a loaded dataset must have a file longer than block_size, to draw a window plus its target."""
    for split, files in data["splits"].items():
        longest = max(n for _, n in files)
        if longest <= block_size:  # a window never spans two files
            sharded = len(files) > 1
            raise UserError(f"block_size {block_size} is not shorter than the {split} split of {data['dir']} "
                            f"({longest} tokens in its longest {'shard' if sharded else 'file'}): lower block_size or "
                            + ("prepare it again with a larger --shard_tokens" if sharded else "add data"))


# first element of evaluation batch keys, which SeedSequence reads as the words [0, 1, split, k]: no training key
# (seed, 0, step, micro-step) reads so, whatever the seed (below 2**32 its second word is 0; from there it is longer)
EVAL_STREAM = 2**32


def eval_key(split: str, k: int) -> tuple[int, int, int]:
    """The get_batch key of evaluation batch k of a split: the same windows at every evaluation and in every
    run whatever its seed, so val losses of runs on the same data (and batch_size, block_size) compare."""
    return (EVAL_STREAM, ("train", "val").index(split), k)


def seed_from(key: tuple[int, ...]) -> int:
    """A 64-bit seed that depends on every int in key, well mixed (numpy's SeedSequence)."""
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0])


def token_map(path: str, dtype, random_access: bool = False) -> np.ndarray:
    """A token file (the one counted: open_token_file) as a read-only array, mapped afresh (a long-lived map grows
    in RAM). Each page fault on it makes Linux read ahead around the page, up to the device's read_ahead_kb (8 MB
    on some disks): a file that fits in the page cache is soon read whole that way, but in a dataset larger than
    RAM every window would read megabytes to use kilobytes. random_access turns that off for this map (madvise
    MADV_RANDOM, where there is one)."""
    view = mmap.mmap(open_token_file(path).fileno(), 0, access=mmap.ACCESS_READ)  # mapped while the array holds it
    if random_access and hasattr(mmap, "MADV_RANDOM"):
        view.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(view, dtype=dtype)


def read_batch(shards: list[tuple[str, int]], dtype, batch_size: int, block_size: int, key: tuple[int, ...],
               pin: bool = False, random_access: bool = False, limit: int | None = None) -> tuple:
    """batch_size random windows of a split, in host memory (pinned if pin; random_access: see token_map): inputs
    x and targets y = x shifted by one, both (B, T) int64. shards lists the split's token files as (path,
    n_tokens); a window lies within one file, and every possible window is equally likely. The offsets come from
    a generator seeded by `key` alone, e.g. (seed, 0, iter, micro_step), so a batch does not depend on how many
    processes share the work, on what ran before it, or on which thread reads it. limit: a UserError for a token
    id at or past it (the model's vocab_size), which meta.json's max_token_id promised away but a file changed
    since can hold; on a GPU the embedding would fail with a device-side assert, not a line naming the file."""
    import torch  # here only: the prepare scripts and their worker processes use this module without torch
    starts = np.array([max(0, n - block_size) for _, n in shards])  # window starts per file
    ends = np.cumsum(starts)
    generator = torch.Generator().manual_seed(seed_from(key))
    ix = torch.randint(int(ends[-1]), (batch_size,), generator=generator).numpy()
    file_of = np.searchsorted(ends, ix, side="right")
    offsets = ix - (ends[file_of] - starts[file_of])
    rows = np.empty((batch_size, block_size + 1), dtype=np.int64)
    for f in np.unique(file_of):  # one gather per file, none per row
        data = token_map(shards[f][0], dtype, random_access)
        hit = file_of == f
        rows[hit] = window = data[offsets[hit, None] + np.arange(block_size + 1)]
        if limit is not None and window.max() >= limit:
            raise UserError(f"{shards[f][0]} holds token id {int(window.max())}, out of range for the model's "
                            f"vocab_size {limit}: the file changed since its meta.json was written; prepare the "
                            "dataset again")
    rows = torch.from_numpy(rows)
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    return (x.pin_memory(), y.pin_memory()) if pin else (x, y)


def to_device(batch: tuple, device: str) -> tuple:
    """A batch from read_batch on the device; from pinned memory to a GPU the copy runs while the GPU works."""
    return tuple(t.to(device, non_blocking=t.is_pinned()) for t in batch)


def get_batch(shards: list[tuple[str, int]], dtype, batch_size: int, block_size: int, key: tuple[int, ...],
              device: str, random_access: bool = False, limit: int | None = None) -> tuple:
    """read_batch's batch, read now in this thread, on the device."""
    import torch
    pin = torch.device(device).type == "cuda"
    return to_device(read_batch(shards, dtype, batch_size, block_size, key, pin, random_access, limit), device)


class Prefetcher:
    """An iterator over read(key) for each key of keys in turn, up to `depth` read ahead by as many background
    threads, so that reading, page faults on a token file not in the page cache included, happens while the
    device and the main thread work. Each item is the next batch on the device, in the order of keys; an error
    of a read is raised there. depth 0 reads each batch when it is asked for, in the caller's thread. read gives
    host tensors, pinned for a GPU (see read_batch)."""

    def __init__(self, read, keys, depth: int, device: str):
        self.read, self.keys, self.device, self.pending, self.pool = read, iter(keys), device, deque(), None
        if depth > 0:
            # no torch.set_num_threads(1) in these threads: it sets the default of every thread that has not yet
            # computed, the main one included, which would then train on one core (and a resume, whose main thread
            # computed while loading, on all: not the same sums). Their copies are too small to go parallel anyway.
            self.pool = ThreadPoolExecutor(depth, thread_name_prefix="prefetch")
            for _ in range(depth):
                self.read_ahead()

    def read_ahead(self):
        key = next(self.keys, None)
        if key is not None:
            self.pending.append(self.pool.submit(self.read, key))

    def __iter__(self):
        return self

    def __next__(self) -> tuple:
        if self.pool is None:
            return to_device(self.read(next(self.keys)), self.device)
        if not self.pending:
            raise StopIteration
        batch = self.pending.popleft().result()
        self.read_ahead()
        return to_device(batch, self.device)

    def wait(self):
        """Wait until the batches asked for ahead are read (an error is kept for its turn). A timer stopped
        after this counts one read per batch taken, as in a long run: without it, the `depth` batches read before
        the timer started would be free and the last `depth` reads would finish after it stopped."""
        futures_wait(self.pending)

    def close(self):
        """Stop reading ahead; reads already running finish on their own."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
