"""The trainer's functions (train.py, dataset.py), called directly: importing them starts nothing."""
import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
from common import UserError, check_compile_mode, cpu_contention
from dataset import Prefetcher, count_tokens, get_batch, larger_than_cache, load_dataset, read_batch
from train import estimate_loss, get_lr, schedule_problem


def write_tokens(path, n, dtype=np.uint16, start=0):
    np.arange(start, start + n, dtype=np.int64).astype(dtype).tofile(path)
    return str(path)


def test_a_busy_cpu_is_warned_of_only_when_torch_computes_in_several_threads():
    assert cpu_contention(0.5, 2, 2) is None and cpu_contention(1.9, 2, 2) is None  # room for both threads
    assert cpu_contention(8.0, 2, 1) is None  # one thread waits on no other
    assert cpu_contention(2.0, 2, 2) == ("this machine's load average is 2.0 on 2 cores, and torch computes "
                                         "in 2 threads that wait on each other at every op: on a busy CPU, "
                                         "OMP_NUM_THREADS=1 can be many times faster")


def test_get_lr_warmup_peak_decay_and_floor():
    args = dict(learning_rate=1e-3, warmup_iters=10, lr_decay_iters=110, min_lr=1e-4)
    assert get_lr(0, **args) == pytest.approx(1e-3 / 11)
    assert get_lr(9, **args) == pytest.approx(1e-3 * 10 / 11)
    assert get_lr(10, **args) == pytest.approx(1e-3)  # peak at the end of warmup
    assert get_lr(60, **args) == pytest.approx((1e-3 + 1e-4) / 2)  # halfway down the cosine
    assert get_lr(110, **args) == pytest.approx(1e-4)
    assert get_lr(10_000, **args) == 1e-4
    lrs = [get_lr(it, **args) for it in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


@pytest.mark.parametrize("schedule", ["wsd", "wsd-sqrt"])
def test_wsd_warms_up_holds_then_cools_down_over_its_fraction(schedule):
    args = dict(learning_rate=1e-3, warmup_iters=10, lr_decay_iters=110, min_lr=1e-4, schedule=schedule,
                cooldown_frac=0.2)  # cooldown: the last 22 of 110 steps, from step 88
    assert get_lr(0, **args) == pytest.approx(1e-3 / 11) and get_lr(9, **args) == pytest.approx(1e-3 * 10 / 11)
    assert get_lr(10, **args) == get_lr(60, **args) == get_lr(88, **args) == 1e-3  # stable, up to the cooldown's start
    halfway = {"wsd": 0.5, "wsd-sqrt": 1 - 0.5 ** 0.5}[schedule]
    assert get_lr(99, **args) == pytest.approx(1e-4 + halfway * 9e-4)
    assert get_lr(110, **args) == get_lr(10_000, **args) == 1e-4
    lrs = [get_lr(it, **args) for it in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:])) and lrs[-2] > 1e-4


def test_wsd_cooldown_never_starts_inside_the_warmup():
    args = dict(learning_rate=1e-3, warmup_iters=50, lr_decay_iters=60, min_lr=0.0, schedule="wsd", cooldown_frac=0.5)
    assert get_lr(49, **args) == pytest.approx(1e-3 * 50 / 51) and get_lr(50, **args) == 1e-3
    assert get_lr(55, **args) == pytest.approx(0.5e-3)


def test_a_warmup_as_long_as_the_run_or_the_decay_is_named():
    assert schedule_problem(100, 5000, 5000, "cosine") is None and schedule_problem(0, 10, 10, "cosine") is None
    assert schedule_problem(0, 0, 10, "cosine") == ("lr_decay_iters 0 ends the decay at once: every step trains at "
                                                    "min_lr, never near learning_rate; set lr_decay_iters to max_iters (or "
                                                    "lr_schedule='constant' for learning_rate throughout)")
    assert schedule_problem(0, 1, 10, "wsd").startswith("lr_decay_iters 1 ends the decay at once: every step trains "
                                                        "at min_lr but the first")
    assert schedule_problem(0, 0, 10, "constant") is None and schedule_problem(0, 2, 10, "cosine") is None
    assert schedule_problem(0, 1, 1, "cosine") is None  # its one step is at learning_rate
    assert schedule_problem(2000, 200, 200, "cosine").startswith(  # a quick run that kept GPT-2's warmup
        "warmup_iters 2000 is not below max_iters 200: the learning rate never reaches learning_rate")
    assert schedule_problem(100, 100, 1000, "wsd").startswith(
        "warmup_iters 100 leaves no step between the warmup and lr_decay_iters 100: the learning rate falls from its "
        "peak to min_lr in one step")
    # one step at learning_rate, the next at min_lr: the same fall
    assert [get_lr(i, 1.0, 100, 101, 0.1) for i in (100, 101)] == [1.0, 0.1]
    assert schedule_problem(100, 101, 1000, "cosine").startswith("warmup_iters 100 leaves no step between")
    assert 0.1 < get_lr(101, 1.0, 100, 102, 0.1) < 1.0 and schedule_problem(100, 102, 1000, "cosine") is None
    assert schedule_problem(100, 50, 1000, "constant") is None  # a constant schedule never decays


def test_a_wsd_cooldown_with_no_step_between_the_rates_is_named():
    """round(0.2 * 7) is 1: the cooldown's one step runs at learning_rate and the run never trains below it."""
    assert [get_lr(i, 1.0, 0, 7, 0.1, "wsd", 0.2) for i in range(7)] == [1.0] * 7
    assert schedule_problem(0, 7, 7, "wsd", 0.2) == ("the cooldown, from cooldown_frac 0.2 to lr_decay_iters 7, is 1 "
                                                     "step(s): no step trains between learning_rate and min_lr; raise "
                                                     "cooldown_frac or raise lr_decay_iters")
    # a warmup that ends where the cooldown would have begun: cooldown_frac is not what to change
    for schedule in ("wsd", "cosine"):  # its fall, at step 100, would come after the run
        assert schedule_problem(99, 100, 100, schedule, 1.0) == ("warmup_iters 99 ends at the run's last step, which "
                                                                 "trains at learning_rate: no step decays; lower "
                                                                 "warmup_iters")
        assert schedule_problem(99, 100, 101, schedule, 1.0).startswith(  # a run that takes the fall
            "warmup_iters 99 leaves no step between the warmup and lr_decay_iters 100")
    # a one-step cooldown after the run's end is no cooldown of this run: the decay it does not reach is named
    assert schedule_problem(0, 100, 10, "wsd", 0.01).startswith("lr_decay_iters 100 is past max_iters 10")
    assert schedule_problem(0, 7, 7, "wsd-sqrt", 0.3) is None  # 2 steps: one of them below learning_rate
    assert get_lr(6, 1.0, 0, 7, 0.1, "wsd", 0.3) == pytest.approx(0.55)
    assert schedule_problem(0, 7, 7, "cosine", 0.2) is None


def test_a_run_that_stops_before_half_its_decay_is_named():
    """A 5000-step decay (config/train_shakespeare_char.py's) run for 60 steps: the rate stays at learning_rate."""
    assert schedule_problem(10, 5000, 60, "cosine") == (
        "lr_decay_iters 5000 is past max_iters 60: the run stops with its learning rate 100% of the way from min_lr "
        "up to learning_rate; set lr_decay_iters to max_iters to decay within the run (or leave it, for a run to be "
        "resumed on)")
    # wsd whose cooldown would start at 4000: none of it in the run
    assert schedule_problem(0, 5000, 4000, "wsd").startswith("lr_decay_iters 5000 is past max_iters 4000")
    assert schedule_problem(0, 60, 40, "cosine") is None and schedule_problem(0, 5000, 60, "constant") is None


def test_constant_schedule_warms_up_then_holds():
    args = dict(learning_rate=1e-3, warmup_iters=10, lr_decay_iters=110, min_lr=1e-4, schedule="constant")
    assert get_lr(0, **args) == pytest.approx(1e-3 / 11)
    assert get_lr(10, **args) == get_lr(110, **args) == get_lr(10_000, **args) == 1e-3


def test_get_batch_targets_are_inputs_shifted_by_one(tmp_path):
    path = write_tokens(tmp_path / "train.bin", 1000)
    x, y = get_batch([(path, 1000)], np.uint16, 8, 32, (1, 0, 0, 0), "cpu")
    assert x.shape == y.shape == (8, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y - x, torch.ones_like(x))  # the file counts up, so each target is its input + 1


def test_get_batch_depends_on_its_key_alone(tmp_path):
    shards = [(write_tokens(tmp_path / "train.bin", 100_000), 100_000)]
    a = get_batch(shards, np.uint16, 4, 16, (1337, 0, 5, 2), "cpu")
    torch.manual_seed(123)  # the global RNG plays no part
    b = get_batch(shards, np.uint16, 4, 16, (1337, 0, 5, 2), "cpu")
    c = get_batch(shards, np.uint16, 4, 16, (1337, 0, 5, 3), "cpu")
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_get_batch_reads_uint32_ids_beyond_uint16(tmp_path):
    path = write_tokens(tmp_path / "train.bin", 1000, dtype=np.uint32, start=100_000)
    x, y = get_batch([(path, 1000)], np.uint32, 4, 8, (0,), "cpu")
    assert x.min() >= 100_000 and torch.equal(y - x, torch.ones_like(x))


def test_get_batch_windows_stay_inside_one_shard_and_cover_all_shards(tmp_path):
    # shard i holds ids i*10_000 ...; a window crossing shards would break the +1 pattern
    shards = [(write_tokens(tmp_path / f"train_{i:03d}.bin", n, start=i * 10_000), n) for i, n in enumerate([50, 300, 20])]
    x, y = get_batch(shards, np.uint16, 512, 16, (7,), "cpu")
    assert torch.equal(y - x, torch.ones_like(x))
    used = set((x[:, 0] // 10_000).tolist())
    assert used == {0, 1, 2}
    # windows are uniform over window starts: 34, 284 and 4 of them
    share = (x[:, 0] // 10_000 == 1).float().mean().item()
    assert 0.8 < share < 0.97


def test_random_access_reads_the_same_windows_with_far_fewer_bytes_from_storage(tmp_path):
    from bench import disk_reads, evict  # bench.py's --cold_data and --mode=get_batch measure the same way
    n = 32_000_000  # 64 MB
    path = write_tokens(tmp_path / "train.bin", n)
    shards = [(path, n)]
    read = {}
    for random_access in (False, True):
        evict([path])  # out of the page cache: the next reads go to storage
        before = disk_reads()
        batches = [read_batch(shards, np.uint16, 12, 1024, (0, i), random_access=random_access) for i in range(5)]
        read[random_access] = disk_reads() - before
        assert all(((y - x) % 65536 == 1).all() for x, y in batches)  # the file counts up, wrapping at 2**16
    if read[False] == 0:
        pytest.skip("nothing was read from storage here (a tmpfs?): eviction cannot be seen")
    assert read[True] < read[False] / 4, read  # 12 windows of 2 KB are 5 or 6 pages each, whatever the read-ahead


def test_only_datasets_larger_than_half_the_ram_are_read_without_read_ahead(tmp_path):
    assert not larger_than_cache(8 << 30, 16 << 30) and larger_than_cache((8 << 30) + 1, 16 << 30)
    assert not larger_than_cache(1 << 40, None)  # unknown RAM: the kernel's default
    write_dataset(tmp_path / "data", [5000], 1000)
    assert load_dataset(str(tmp_path / "data"), 32)["random_access"] is False


def test_prefetcher_gives_the_batches_of_its_keys_in_order_whatever_its_depth(tmp_path):
    shards = [(write_tokens(tmp_path / "train.bin", 100_000), 100_000)]
    keys = [(0, 0, it, m) for it in range(5) for m in range(3)]
    expected = [get_batch(shards, np.uint16, 4, 16, key, "cpu") for key in keys]
    for depth in (0, 1, 4, 20):
        batches = Prefetcher(lambda key: read_batch(shards, np.uint16, 4, 16, key), keys, depth, "cpu")
        got = list(batches)
        batches.close()
        assert len(got) == len(keys), depth
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected)), depth


def test_prefetcher_reads_depth_batches_ahead_and_no_more():
    asked, lock = [], threading.Lock()

    def read(key):
        with lock:
            asked.append(key)
        return torch.full((2,), key), torch.full((2,), key + 1)

    def wait_for(n):
        deadline = time.monotonic() + 10
        while len(asked) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # room for a read too many
        return sorted(asked)

    batches = Prefetcher(read, range(100), 3, "cpu")
    assert wait_for(3) == [0, 1, 2]  # before anything is asked for
    assert next(batches)[0].tolist() == [0, 0]
    assert wait_for(4) == [0, 1, 2, 3]
    batches.close()


def test_wait_returns_once_every_batch_asked_for_ahead_is_read():
    """bench.py's timer stops after wait(), so a timed window counts the reads its steps asked for."""
    def read(key):
        time.sleep(0.3)
        return torch.full((2,), key), torch.full((2,), key + 1)

    batches = Prefetcher(read, range(10), 3, "cpu")
    assert next(batches)[0].tolist() == [0, 0]  # and batch 3 is asked for now: it takes 0.3 s
    batches.wait()
    assert len(batches.pending) == 3 and all(f.done() for f in batches.pending)
    assert [next(batches)[0].tolist() for _ in range(3)] == [[1, 1], [2, 2], [3, 3]]
    batches.close()


def test_a_failed_read_ahead_is_raised_when_its_batch_is_due(tmp_path):
    def read(key):
        if key == 2:
            raise OSError(f"token file gone at batch {key}")
        return torch.full((2,), key), torch.full((2,), key + 1)

    batches = Prefetcher(read, range(10), 4, "cpu")
    assert [next(batches)[0].tolist() for _ in range(2)] == [[0, 0], [1, 1]]
    with pytest.raises(OSError, match="gone at batch 2"):
        next(batches)
    batches.close()


def write_dataset(folder, train_counts, val_count, dtype="uint16", vocab_size=1000, max_id=None):
    folder.mkdir(parents=True, exist_ok=True)
    files = [f"train_{i:03d}.bin" for i in range(len(train_counts))]
    for name, n in zip(files, train_counts):
        write_tokens(folder / name, n, dtype=np.dtype(dtype))
    write_tokens(folder / "val.bin", val_count, dtype=np.dtype(dtype))
    meta = {"tokenizer": "gpt2", "vocab_size": vocab_size, "dtype": dtype,
            "max_token_id": max_id if max_id is not None else max(train_counts + [val_count]) - 1,
            "splits": {"train": {"files": files, "file_tokens": train_counts},
                       "val": {"files": ["val.bin"], "file_tokens": [val_count]}}}
    (folder / "meta.json").write_text(json.dumps(meta))
    return str(folder)


def test_load_dataset_reads_shards_dtype_and_vocab_from_meta(tmp_path):
    data = load_dataset(write_dataset(tmp_path / "d", [100, 200], 80, dtype="uint32"), 64)
    assert data["dtype"] == np.uint32 and data["vocab_size"] == 1000 and data["max_token_id"] == 199
    assert [n for _, n in data["splits"]["train"]] == [100, 200]


def test_load_dataset_errors(tmp_path):
    with pytest.raises(UserError, match=r"block_size 80 is not shorter than the val split .* \(80 tokens in its "
                                         r"longest file\): lower block_size or add data$"):
        load_dataset(write_dataset(tmp_path / "short", [100], 80), 80)
    with pytest.raises(UserError, match=r"\(120 tokens in its longest shard\): lower block_size or prepare it again "
                                         r"with a larger --shard_tokens$"):  # the split has 220, but no window spans two
        load_dataset(write_dataset(tmp_path / "shards", [100, 120], 200), 128)
    torn = write_dataset(tmp_path / "torn", [100], 80)
    with open(f"{torn}/val.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(UserError, match="not a whole number of 2-byte tokens"):
        load_dataset(torn, 16)
    empty = write_dataset(tmp_path / "empty", [100], 80)
    open(f"{empty}/val.bin", "wb").close()
    with pytest.raises(UserError, match="val.bin is empty"):
        load_dataset(empty, 16)
    changed = write_dataset(tmp_path / "changed", [100], 80)
    write_tokens(f"{changed}/train_000.bin", 90)
    with pytest.raises(UserError, match=r"hold \[90\] tokens but meta.json says \[100\]"):
        load_dataset(changed, 16)
    with pytest.raises(UserError, match="dataset 'nowhere' not found"):
        load_dataset("nowhere", 16)


def test_a_dataset_prepared_again_under_a_running_reader_leaves_it_on_the_data_it_loaded(tmp_path):
    data = load_dataset(write_dataset(tmp_path / "d", [1000], 100), 16)
    before = read_batch(data["splits"]["train"], data["dtype"], 8, 16, (0, 1))
    new = tmp_path / "d" / "train_000.bin.tmp"  # as a prepare puts its files in place: a new file, renamed over
    (np.arange(20, dtype=np.uint16) + 5000).tofile(new)
    os.replace(new, tmp_path / "d" / "train_000.bin")
    after = read_batch(data["splits"]["train"], data["dtype"], 8, 16, (0, 1))  # counted 1000 tokens: all still there
    assert all(torch.equal(a, b) for a, b in zip(before, after)) and int(after[0].max()) < 1000
    with pytest.raises(UserError, match=r"hold \[20\] tokens but meta.json says \[1000\]"):
        load_dataset(str(tmp_path / "d"), 16)  # a new load takes stock afresh


FEW_FILES = """
import resource, sys
sys.path.insert(0, {root!r})
from common import UserError
from dataset import load_dataset
resource.setrlimit(resource.RLIMIT_NOFILE, (64, {hard}))
try:
    print(len(load_dataset({data!r}, 16)["splits"]["train"]))
except UserError as e:
    print(e)
"""


@pytest.mark.parametrize("hard", ["resource.getrlimit(resource.RLIMIT_NOFILE)[1]", "64", "230"])
def test_a_dataset_of_more_shards_than_the_open_file_limit_raises_the_limit_or_says_so(tmp_path, hard):
    """Every token file stays open (see open_token_file): 200 shards under a limit of 64 open files."""
    import subprocess
    import sys
    from conftest import ROOT
    data = write_dataset(tmp_path / "d", [40] * 200, 40)
    out = subprocess.run([sys.executable, "-c", FEW_FILES.format(root=ROOT, hard=hard, data=data)],
                         capture_output=True, text=True, check=True).stdout.strip()
    if hard != "resource.getrlimit(resource.RLIMIT_NOFILE)[1]":  # the hard limit stops it, before any file is
        # opened, even where the token files alone would fit (230): a run's maps and logs would not, mid-run
        assert out == (f"the dataset's 201 token files stay open, beside about 64 more files of the run, but the "
                       f"open-file limit (ulimit -n) allows {hard}: raise it, or prepare the dataset with a larger "
                       "--shard_tokens"), out
    else:
        assert out == "200"


THREADS_AFTER_PREFETCH = """
import sys
sys.path.insert(0, {root!r})
import torch
from dataset import Prefetcher
if {prefetch}:
    batches = Prefetcher(lambda key: (torch.zeros(2, 2), torch.zeros(2, 2)), range(4), 2, "cpu")
    next(batches), next(batches)
print(torch.get_num_threads())
"""


def test_reading_ahead_leaves_the_main_thread_all_its_cores():
    """In a fresh interpreter, as `python train.py` starts (the suite's scripts fork from a warm one, whose main
    thread has computed already and so keeps its count): a reader thread's torch.set_num_threads(1) would become
    the main thread's default, and a new run would train on one core while its resume trained on all."""
    import subprocess
    import sys
    from conftest import ROOT
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    threads = [int(subprocess.run([sys.executable, "-c", THREADS_AFTER_PREFETCH.format(root=ROOT, prefetch=p)],
                                  capture_output=True, text=True, env=env, check=True).stdout) for p in (False, True)]
    assert threads[1] == threads[0]


def test_load_dataset_without_meta_scans_for_the_largest_id(tmp_path):
    write_tokens(tmp_path / "train.bin", 500)
    write_tokens(tmp_path / "val.bin", 100, start=1000)
    data = load_dataset(str(tmp_path), 32)
    assert data["dtype"] == np.uint16 and data["vocab_size"] is None and data["max_token_id"] == 1099


def test_a_character_dataset_of_one_character_lines_is_not_taken_for_uint32_tokens(tmp_path):
    """In nanoGPT's character tables id 0 is '\n', so one character per line reads as [x, 0, y, 0, ...], the
    pattern of uint32 tokens read as uint16: with meta.pkl that pattern says nothing, and the file loads."""
    import pickle
    chars = "\n0123456789"
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, f)
    lines = np.random.default_rng(0).integers(1, len(chars), 20_000)
    for split in ("train", "val"):
        np.stack([lines, np.zeros_like(lines)], 1).reshape(-1).astype(np.uint16).tofile(tmp_path / f"{split}.bin")
    data = load_dataset(str(tmp_path), 32)
    assert data["vocab_size"] == len(chars) and data["max_token_id"] == len(chars) - 1
    os.remove(tmp_path / "meta.pkl")  # GPT-2 ids, where id 0 is '!': that many of them is uint32's high halves
    with pytest.raises(UserError, match="train.bin looks like uint32 tokens"):
        load_dataset(str(tmp_path), 32)


def test_a_meta_pkl_table_with_numpy_int_keys_reads_and_one_of_longer_strings_is_refused(tmp_path):
    import pickle
    for split in ("train", "val"):
        (np.arange(500) % 2).astype(np.uint16).tofile(tmp_path / f"{split}.bin")
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 2, "itos": {np.int64(0): "a", np.int64(1): "b"}}, f)
    assert load_dataset(str(tmp_path), 32)["vocabulary"] == {"tokenizer": "char", "chars": "ab"}
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 2, "itos": {0: "ab", 1: "c"}}, f)  # "abc": id 1 would read as 'b'
    with pytest.raises(UserError, match="meta.pkl lacks vocab_size or an itos table of ids 0..n-1 to characters"):
        load_dataset(str(tmp_path), 32)


def test_count_tokens_rejects_a_missing_file(tmp_path):
    with pytest.raises(UserError, match="is missing"):
        count_tokens(str(tmp_path / "nope.bin"), np.uint16)


def test_estimate_loss_uses_the_same_windows_every_time(tmp_path):
    shards = [(write_tokens(tmp_path / "val.bin", 5000), 5000)]
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=5000, n_layer=1, n_head=2, n_embd=16))
    batch_fn = lambda split, k: get_batch(shards, np.uint16, 4, 16, (0, 1, 0, k), "cpu")
    first = estimate_loss(model, batch_fn, eval_iters=3, splits=("val",))
    second = estimate_loss(model, batch_fn, eval_iters=3, splits=("val",))
    assert first == second and first["val"] > 0
    assert model.training  # put back in training mode
    asked = []  # a stop asked for before the third batch: the evaluation is dropped, the model back in training
    assert estimate_loss(model, batch_fn, 3, splits=("val",), stop=lambda: asked.append(1) or len(asked) > 2) is None
    assert len(asked) == 3 and model.training
    assert estimate_loss(model, batch_fn, 3, splits=("val",), stop=lambda: False) == first
    grad_modes = []  # no autograd graph is built: it would hold every batch's activations
    model.register_forward_hook(lambda module, args, output: grad_modes.append(torch.is_grad_enabled()))
    estimate_loss(model, batch_fn, 2, splits=("val",))
    assert grad_modes == [False, False]


def test_ranks_draw_different_parts_of_one_global_batch(tmp_path):
    shards = [(write_tokens(tmp_path / "train.bin", 100_000), 100_000)]
    seed, step, accum_per_rank = 1337, 3, 2
    rank_batches = [[get_batch(shards, np.uint16, 4, 16, (seed, 0, step, rank * accum_per_rank + m), "cpu")[0]
                     for m in range(accum_per_rank)] for rank in range(2)]
    assert not torch.equal(rank_batches[0][0], rank_batches[1][0])
    # the same micro-batches, in the same order, as one process taking all four global micro-steps
    one_process = [get_batch(shards, np.uint16, 4, 16, (seed, 0, step, m), "cpu")[0] for m in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(rank_batches[0] + rank_batches[1], one_process))


def test_save_checkpoint_replaces_whole_files_and_keeps_the_old_one_on_failure(tmp_path):
    from checkpoint import save_checkpoint
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint({"iter_num": 1, "model": {}}, path)
    save_checkpoint({"iter_num": 2, "model": {}}, path)
    assert torch.load(path, weights_only=True) == {"iter_num": 2, "model": {}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temporary file left behind
    # a full disk: the temporary file is made a link to /dev/full, where every write fails with ENOSPC
    os.symlink("/dev/full", path + ".tmp")
    with pytest.raises(UserError, match=r"could not write checkpoint .*\(No space left on device; [\d,.]+ MiB free on "
                                        r"its disk\): the previous checkpoint is unchanged"):
        save_checkpoint({"iter_num": 3, "model": {"w": torch.zeros(100_000)}}, path)
    assert torch.load(path, weights_only=True) == {"iter_num": 2, "model": {}}
    assert not os.path.lexists(path + ".tmp")
    # weights gone non-finite are never written over a good checkpoint
    with pytest.raises(UserError, match=r"the weights are not finite \(1 tensor, e.g. w\) at iter 4: not saving "
                                        r"them, and .*ckpt.pt keeps the last good state"):
        save_checkpoint({"iter_num": 4, "model": {"w": torch.tensor([1.0, float("nan")])}}, path)
    assert torch.load(path, weights_only=True) == {"iter_num": 2, "model": {}}
    with pytest.raises(UserError, match=r"the weights are not finite \(2 tensors, e.g. w\) at iter 4: not saving "
                                        r"them, and no checkpoint was saved before"):  # a run's first save
        save_checkpoint({"iter_num": 4, "model": {"w": torch.tensor([float("inf")]), "v": torch.tensor([float("nan")])}},
                        str(tmp_path / "new.pt"))
    # out_dir gone mid-run (unmounted, deleted): the line says so, with no free space to look up
    with pytest.raises(UserError, match=r"could not write checkpoint .*gone/ckpt.pt \(No such file or directory\): "):
        save_checkpoint({"iter_num": 3, "model": {}}, str(tmp_path / "gone" / "ckpt.pt"))


def trained_checkpoint():
    """A tiny model after one AdamW step (weight_decay 0.1, betas (0.9, 0.99)), its optimizer, and its checkpoint
    as a bf16 or fp32 run saves it (the scaler disabled)."""
    from checkpoint import training_state
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    idx = torch.randint(32, (2, 8))
    model(idx, idx)[1].backward()
    optimizer.step()
    return model, optimizer, training_state(
        model.state_dict(), optimizer.state_dict(), torch.amp.GradScaler("cpu", enabled=False), {}, {},
        dict(iter_num=1, tokens=16, best_val_loss=9.0, best_iter=0, nonfinite_streak=0), [], None, True, {}, {}, "out")


def test_a_resume_takes_the_saved_moments_but_this_runs_optimizer_settings():
    """load_state_dict would put the checkpoint's weight_decay and betas back, silently undoing the resumed
    run's --weight_decay and --beta2 (which its config.json records)."""
    from checkpoint import restore_training_state
    model, saved, checkpoint = trained_checkpoint()
    optimizer = model.configure_optimizers(0.0, 1e-3, (0.8, 0.5), "cpu")
    restore_training_state(checkpoint, "ckpt.pt", model, optimizer, torch.amp.GradScaler("cpu", enabled=False),
                           0, 1, "cpu")
    assert [(g["weight_decay"], g["betas"]) for g in optimizer.param_groups] == [(0.0, (0.8, 0.5))] * 2
    p = optimizer.param_groups[0]["params"][0]
    assert torch.equal(optimizer.state[p]["exp_avg"], saved.state[p]["exp_avg"])


def test_a_bf16_checkpoint_resumes_as_float16_with_a_fresh_scaler():
    """dtype=auto picks float16 on GPUs without bf16: a run moved to one resumes with a new GradScaler."""
    from checkpoint import restore_training_state
    model, optimizer, checkpoint = trained_checkpoint()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    restore_training_state(checkpoint, "ckpt.pt", model, optimizer, scaler, 0, 1, "cpu")
    assert scaler.is_enabled() and scaler.get_scale() == 1024.0


def test_keep_last_n_deletes_the_oldest_steps_past_seven_digits_and_never_a_users_own_copy(tmp_path):
    from checkpoint import publish_checkpoint
    (tmp_path / "ckpt_before_lr_change.pt").write_bytes(b"a copy made by hand")
    (tmp_path / "ckpt_4.pt").write_bytes(b"a copy of step 4, named without the padding")
    for step in (9_998_000, 9_999_000, 10_000_000):
        (tmp_path / "ckpt.pt").write_bytes(str(step).encode())
        publish_checkpoint(str(tmp_path), step, False, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "ckpt_10000000.pt", "ckpt_4.pt", "ckpt_9999000.pt",
                                                          "ckpt_before_lr_change.pt"]
    assert (tmp_path / "ckpt_10000000.pt").read_bytes() == b"10000000"


def test_weights_that_are_not_finite_are_refused_as_a_start(tmp_path):
    """A file damaged on disk, or saved by another trainer after it diverged: a run from it could never save."""
    from checkpoint import load_pretrained
    model, _, checkpoint = trained_checkpoint()
    checkpoint["model_args"] = {k: getattr(model.config, k) for k in ("n_layer", "n_head", "n_embd", "block_size",
                                                                         "bias", "vocab_size")}
    torch.save(checkpoint, tmp_path / "good.pt")
    assert torch.equal(load_pretrained(str(tmp_path / "good.pt"), 0.0)[0].lm_head.weight, model.lm_head.weight)
    checkpoint["model"]["transformer.h.0.mlp.c_fc.weight"][3, 5] = float("inf")
    torch.save(checkpoint, tmp_path / "bad.pt")
    with pytest.raises(UserError, match=r"bad.pt holds weights that are not finite \(1 tensor, e.g. "
                                        r"transformer.h.0.mlp.c_fc.weight\): the file is damaged, or "
                                        r"was saved after training diverged; use another checkpoint$"):
        load_pretrained(str(tmp_path / "bad.pt"), 0.0)


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EIO], ids=["EINVAL", "EIO"])
def test_a_filesystem_that_cannot_sync_a_directory_still_saves_but_a_failing_disk_does_not(tmp_path, monkeypatch, code):
    """Some FUSE and network filesystems answer a directory's fsync with EINVAL, after the rename has happened."""
    from common import replace_durably
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    (tmp_path / "new.tmp").write_text("new")
    if code == errno.EIO:  # not "the previous file is unchanged": the rename has happened
        with pytest.raises(UserError, match="file was written, but syncing its folder failed"):
            replace_durably(str(tmp_path / "new.tmp"), str(tmp_path / "file"))
    else:
        replace_durably(str(tmp_path / "new.tmp"), str(tmp_path / "file"))
    assert (tmp_path / "file").read_text() == "new"


WRITER = """
import os, sys, time
sys.path.insert(0, {root!r})
from common import atomic_write
path, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with atomic_write(path, "wb", shared=True) as f:
    open(f"{{path}}.ready{{me}}", "w").close()  # every writer holds its file open before any finishes
    while sum(os.path.exists(f"{{path}}.ready{{k}}") for k in range(n)) < n:
        time.sleep(0.01)
    for _ in range(20):
        f.write(b"x" * 1000)
        f.flush()
        time.sleep(0.005)
"""


def test_shared_atomic_writes_from_several_processes_all_land_whole(tmp_path):
    # every rank of a torchrun job downloads HellaSwag or the rank file to the same path at once
    import subprocess
    import sys
    path, n = str(tmp_path / "file.bin"), 4
    code = WRITER.format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    writers = [subprocess.Popen([sys.executable, "-c", code, path, str(k), str(n)]) for k in range(n)]
    assert [w.wait(timeout=60) for w in writers] == [0] * n
    assert open(path, "rb").read() == b"x" * 20_000
    assert sorted(os.listdir(tmp_path)) == ["file.bin"] + [f"file.bin.ready{k}" for k in range(n)]  # no .tmp left


def test_a_checkpoint_is_mapped_not_read_into_each_process(tmp_path):
    """Every process of a node resumes from the same file: mapped, they share its pages instead of each holding a copy."""
    import psutil
    from checkpoint import read_file
    path = str(tmp_path / "big.pt")
    torch.save({"model": {"w": torch.ones(64 * 2**20)}}, path)  # 256 MiB
    process = psutil.Process()
    before = process.memory_info().rss
    checkpoint = read_file(path)
    assert process.memory_info().rss - before < 32 * 2**20  # nothing read yet
    assert checkpoint["model"]["w"][-1] == 1.0  # and the bytes are there when used
    torch.save({"w": torch.arange(3.0)}, path, _use_new_zipfile_serialization=False)  # torch's format before 1.6
    assert read_file(path)["w"].tolist() == [0.0, 1.0, 2.0]  # cannot be mapped: read whole


def test_a_checkpoints_digest_tells_a_copy_from_another_step_with_the_same_progress():
    from checkpoint import checkpoint_digest
    progress = dict(iter_num=8, tokens=100, best_val_loss=2.0, best_iter=8)
    saved = {"model": {"ln_f.weight": torch.ones(4), "wte.weight": torch.zeros(2**17)}, **progress}
    copy = {"model": {k: v.clone() for k, v in saved["model"].items()}, **progress}
    other = {"model": {**saved["model"], "ln_f.weight": torch.full((4,), 1.001)}, **progress}
    assert checkpoint_digest(saved) == checkpoint_digest(copy) != checkpoint_digest(other)


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP], ids=["ENOLCK", "EOPNOTSUPP"])
def test_a_filesystem_without_locks_runs_with_a_warning_but_a_held_lock_is_refused(tmp_path, monkeypatch, capsys, code):
    import fcntl
    from common import FolderLock
    held = FolderLock(str(tmp_path))
    held.claim("train.py (pid 1 on a host)")
    with pytest.raises(UserError, match=r"is in use by train.py \(pid 1 on a host\)"):
        FolderLock(str(tmp_path))
    # the text of the run before, which the holder keeps until its checks pass: that run's pid has ended
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    held.claim(f"train.py (pid {ended.pid} on {socket.gethostname()}, started then)")
    with pytest.raises(UserError, match=r"is in use by another process, still starting \(run.lock names the run "
                                        rf"before it, train.py \(pid {ended.pid} on .*, which has ended\): wait"):
        FolderLock(str(tmp_path))

    def flock(f, how):  # what an NFS, Lustre or FUSE mount without locks answers
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(fcntl, "flock", flock)
    (tmp_path / "elsewhere").mkdir()
    FolderLock(str(tmp_path / "elsewhere")).claim("a run")
    assert (tmp_path / "elsewhere" / "run.lock").read_text() == "a run\n"
    assert "on a filesystem without file locks" in capsys.readouterr().err


@pytest.mark.parametrize("hard_links", [True, False], ids=["linked", "copied"])
def test_best_and_kept_checkpoints_missed_by_a_kill_are_written_at_resume(tmp_path, monkeypatch, hard_links):
    from checkpoint import repair_published
    if not hard_links:  # a filesystem without them: publish_checkpoint copies
        def link(src, dst):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(os, "link", link)

    def state(it, best_iter, evaluated=True):  # val loss 10 - step: every eval improves
        return {"iter_num": it, "best_iter": best_iter, "best_val_loss": 10.0 - best_iter, "evaluated": evaluated,
                "config": {"keep_last_n": 2}, "model": {"w": torch.full((3,), float(it))}}

    def save(checkpoint, name):  # as save_checkpoint does: a new file renamed into place, so links keep the old
        torch.save(checkpoint, tmp_path / "new.tmp")
        os.replace(tmp_path / "new.tmp", tmp_path / name)

    def step_of(name):
        return torch.load(tmp_path / name, weights_only=True)["iter_num"]
    save(state(4, 4), "ckpt_0000004.pt")
    save(state(4, 4), "best.pt")
    ckpt = state(8, 8)
    save(ckpt, "ckpt.pt")  # killed here: before best.pt and ckpt_0000008.pt
    assert repair_published(str(tmp_path), ckpt) == ["best.pt", "ckpt_0000008.pt"]
    assert step_of("best.pt") == step_of("ckpt_0000008.pt") == 8
    assert repair_published(str(tmp_path), ckpt) == []  # all in place now: nothing is written again
    os.remove(tmp_path / "ckpt_0000008.pt")  # killed after best.pt, before the kept step
    assert repair_published(str(tmp_path), ckpt) == ["ckpt_0000008.pt"]
    later = state(12, 8, evaluated=False)  # a signal's save: best.pt stays the best eval's
    save(later, "ckpt.pt")
    assert repair_published(str(tmp_path), later) == [] and step_of("best.pt") == 8
    # an earlier checkpoint the user put back as ckpt.pt: the newer, better best.pt and kept steps stay as they are
    save(state(4, 4), "ckpt.pt")
    assert repair_published(str(tmp_path), state(4, 4)) == [] and step_of("best.pt") == 8
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("ckpt_")) == ["ckpt_0000004.pt", "ckpt_0000008.pt"]
    gone_back = {**state(6, 6), "best_val_loss": 1.0}  # from step 4 on again: a new best, better than step 8's,
    save(gone_back, "ckpt.pt")  # killed before best.pt: the older-numbered step is the newer best and is published
    assert repair_published(str(tmp_path), gone_back) == ["best.pt"] and step_of("best.pt") == 6


def test_another_runs_optimizer_state_is_taken_with_this_runs_settings():
    """init_from a checkpoint takes its AdamW moments (a finetune does not restart them from zero) but keeps this
    run's betas and weight decay; moments of other shapes are refused."""
    from checkpoint import take_optimizer_state
    torch.manual_seed(0)
    source = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    before = source.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    tokens = torch.randint(32, (2, 9))
    source(tokens[:, :-1], tokens[:, 1:])[1].backward()
    before.step()
    saved = before.state_dict()
    target = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    after = target.configure_optimizers(0.05, 1e-3, (0.8, 0.9), "cpu")
    assert take_optimizer_state(after, saved) is None
    taken = after.state_dict()
    assert len(taken["state"]) == len(saved["state"]) > 0
    assert all(torch.equal(taken["state"][k][m], saved["state"][k][m]) for k in saved["state"]
               for m in ("exp_avg", "exp_avg_sq"))
    assert all(tuple(g["betas"]) == (0.8, 0.9) for g in after.param_groups)
    assert sorted(g["weight_decay"] for g in after.param_groups) == [0.0, 0.05]
    wider = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=32))
    assert take_optimizer_state(wider.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu"), saved) == \
        "its moments have other shapes"


def test_cuda_graph_compile_modes_refuse_micro_steps_on_a_gpu_only():
    for mode in ("reduce-overhead", "max-autotune"):
        with pytest.raises(UserError, match=rf"compile_mode='{mode}' captures CUDA graphs, which overwrite the gradients "
                                            "that 4 micro-steps"):
            check_compile_mode(mode, 4, "cuda")
        check_compile_mode(mode, 1, "cuda")  # one micro-step: nothing to overwrite
        check_compile_mode(mode, 4, "cpu")  # no graphs captured off CUDA
    check_compile_mode("max-autotune-no-cudagraphs", 4, "cuda")


def test_overwrite_refuses_to_start_from_a_file_it_would_delete_but_not_from_a_hard_link_outside(tmp_path):
    from train import check_new_run
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"weights")
    os.link(out / "ckpt.pt", tmp_path / "start.pt")  # another name for the same file, which the deletion leaves
    os.symlink(out / "ckpt.pt", tmp_path / "link.pt")  # a name for the one inside, which goes
    assert check_new_run(str(out), True, str(tmp_path / "start.pt")) == ["ckpt.pt"]
    with pytest.raises(UserError, match=r"link.pt is ckpt.pt of the run that --overwrite=True replaces"):
        check_new_run(str(out), True, str(tmp_path / "link.pt"))


def test_settings_given_that_the_run_does_not_use_are_named_with_what_would_use_them():
    from train import config_defaults, unused_settings
    given = {"cooldown_frac", "muon_lr", "muon_momentum", "rope_theta", "fsdp_reduce", "compile_mode", "sample_prompt",
             "sample_tokens", "hellaswag_file", "hellaswag_items", "n_layer"}
    off = dict(config_defaults, compile=False)
    assert unused_settings(off, given) == [
        "cooldown_frac is not used: it needs lr_schedule='wsd' or 'wsd-sqrt'",
        "muon_lr is not used: it needs optimizer='muon'", "muon_momentum is not used: it needs optimizer='muon'",
        "rope_theta is not used: it needs pos_emb='rope'", "fsdp_reduce is not used: it needs parallelism='fsdp'",
        "compile_mode is not used: it needs compile=True",
        "hellaswag_file is not used: it needs hellaswag_interval > 0",
        "hellaswag_items is not used: it needs hellaswag_interval > 0",
        "sample_prompt is not used: it needs sample_interval > 0", "sample_tokens is not used: it needs sample_interval > 0"]
    used = dict(config_defaults, lr_schedule="wsd", optimizer="muon", pos_emb="rope", parallelism="fsdp",
                sample_interval=1, hellaswag_interval=1)
    assert unused_settings(used, given) == []
    assert unused_settings(dict(off, decay_lr=False), {"cooldown_frac"}) == []  # decay_lr=False's own warning names it


def test_a_copied_run_folder_is_told_from_a_moved_one(tmp_path):
    """A checkpoint saved in another folder that still holds the same wandb run: a copy (it needs a wandb run of
    its own); one that holds nothing now, or another run: the run was moved; the same folder by another path (a
    link, a mount): neither."""
    from checkpoint import copied_from
    from report import fork_run_id
    original, copy = tmp_path / "run", tmp_path / "copy"
    for folder in (original, copy):
        folder.mkdir()
        torch.save({"wandb_run_id": "abc123"}, folder / "ckpt.pt")
    os.symlink(original, tmp_path / "link")
    assert copied_from(str(original), str(copy), "abc123") == str(original)
    assert copied_from(str(original), str(original), "abc123") is None
    assert copied_from(str(original), str(tmp_path / "link"), "abc123") is None
    assert copied_from(None, str(copy), "abc123") is None  # a checkpoint from before folders were saved
    assert copied_from(str(original), str(copy), None) is None  # no wandb run to share
    torch.save({"wandb_run_id": "def456"}, original / "ckpt.pt")  # moved, and a new run started where it was
    assert copied_from(str(original), str(copy), "abc123") is None
    os.remove(original / "ckpt.pt")
    assert copied_from(str(original), str(copy), "abc123") is None  # moved: nothing is left where it was
    assert fork_run_id("abc123", str(copy)) == fork_run_id("abc123", str(copy)) != fork_run_id("abc123", str(original))
