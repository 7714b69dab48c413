"""
Benchmarks. By default, times training steps (forward, backward, optimizer step) of any model config,
warm-up excluded, and prints ms/iter, tokens/s and MFU (where the device's peak FLOP/s is known; see
common.PEAK_FLOPS):

    python bench.py                                   # GPT-2 124M, batch 12 x 1024, random tokens (on a GPU)
    python bench.py --real_data=True --dataset=openwebtext
    python bench.py --real_data=True --cold_data=True --compare="--prefetch_batches=0"  # reads from the disk, ahead or not
    python bench.py config/train_shakespeare_char.py  # a training config's model and batch (its other keys ignored)
    python bench.py --device=cpu                      # a small model (CPU_MODEL) that times in seconds
    python bench.py --profile=True                    # writes a torch profiler trace to bench_trace/ instead

Every speed claim is a ratio from one process: --compare times a second config, given as flags on top of
the first, in alternation with it, and prints the tokens/s ratio with its spread over rounds; several
configs, separated by ';', are each timed against the first:

    python bench.py config/train_shakespeare_char.py --device=cpu --n_layer=4 --n_head=4 --n_embd=128 \
        --block_size=64 --batch_size=12 --compare="--compile=False"  # the README's CPU model; the config's own is
                                                                     # 6 x 384 at 64 x 256 tokens: an hour on 2 cores
    python bench.py --compare="--fp8=True; --loss_chunk=4096; --batch_size=auto"

Generation, with the KV cache against without it (the same tokens, checked):

    python bench.py --mode=generate --device=cpu --n_layer=6 --n_head=6 --n_embd=384 --block_size=512 --batch_size=1

The data pipeline, on CPU:

    python bench.py --mode=get_batch --batch_size=64  # dataset.get_batch against nanoGPT's row-by-row loop
    python bench.py --mode=prepare --corpus_mb=300    # data/prepare.py against a one-process encode loop
"""
import dataclasses
import glob
import itertools
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import configurator
from common import (UserError, autocast_context, check_compile_mode, check_device, compile_problem, cpu_contention,
                    peak_flops, resolve_dtype, start_script)
from fp8 import check_fp8, use_fp8
from model import GPT, GPTConfig

mode = "train"  # 'train' times training steps; 'generate' times sampling with and without the KV cache; 'get_batch' and 'prepare' time the data pipeline [mode in ('train', 'generate', 'get_batch', 'prepare')]
# ---- data
batch_size = 12  # sequences per micro-step; 'auto': the largest power of two whose memory plan fits, as in train.py (one process) [batch_size == 'auto' or batch_size > 0]
block_size = 1024  # tokens per sequence [block_size > 0]
gradient_accumulation_steps = 1  # micro-steps per optimizer step, as in train.py (one process here) [gradient_accumulation_steps > 0]
real_data = False  # sample batches from the dataset's train split instead of random tokens
dataset = "openwebtext"  # a folder under data/ or a path: real_data reads it, and vocab_size=0 takes its vocabulary
prefetch_batches = 4  # with real_data, as in train.py: micro-batches read ahead by background threads; 0: each read when due [prefetch_batches >= 0]
cold_data = False  # with real_data: evict the dataset's token files from the page cache (Linux) before each timed round, so reads go to the disk, as they do for a dataset not read yet or larger than RAM
# ---- model
n_layer = 12  # transformer blocks [n_layer > 0]
n_head = 12  # attention heads per block [n_head > 0]
n_embd = 768  # width of the residual stream, split evenly among the heads [n_embd > 0 and n_embd % n_head == 0]
vocab_size = 0  # 0: the model's vocabulary as train.py gives it for the dataset (a tokenizer's padded to a multiple of 64; GPT-2's 50304 where the dataset is not prepared); N: N tokens [vocab_size >= 0]
bias = False  # biases in Linear and LayerNorm layers
dropout = 0.0  # dropout rate [0 <= dropout < 1]
loss_chunk = 0  # as in train.py: rows of logits per chunk of the training loss; 0 computes them all at once [loss_chunk >= 0]
activation_checkpointing = False  # as in train.py: recompute each block in backward instead of keeping its activations
pos_emb = "learned"  # the architecture, as in train.py (see its --help) [pos_emb == 'learned' or (pos_emb == 'rope' and n_embd // n_head % 2 == 0)]
rope_theta = 10000.0  # with rope: the base of the rotation frequencies [0 < rope_theta < inf]
norm = "layernorm"  # 'layernorm' or 'rmsnorm' [norm in ('layernorm', 'rmsnorm')]
mlp = "gelu"  # 'gelu', 'swiglu' or 'relu2' [mlp in ('gelu', 'swiglu', 'relu2')]
mlp_hidden = 0  # MLP width; 0: the default for mlp [mlp_hidden >= 0]
n_kv_head = 0  # key/value heads (GQA); 0: n_head [n_kv_head >= 0 and n_head % (n_kv_head or n_head) == 0]
qk_norm = False  # RMS-normalise queries and keys per head
tie_embeddings = True  # the output projection shares the token embedding matrix
# ---- optimizer, as in train.py
optimizer = "adamw"  # 'adamw' or 'muon', as in train.py [optimizer in ('adamw', 'muon')]
learning_rate = 6e-4  # AdamW learning rate [0 < learning_rate < inf]
muon_lr = 0.02  # Muon's learning rate [0 < muon_lr < inf]
muon_momentum = 0.95  # Muon's momentum [0 <= muon_momentum < 1]
weight_decay = 1e-1  # decoupled weight decay on matrices [0 <= weight_decay < inf]
beta1 = 0.9  # AdamW beta1 [0 <= beta1 < 1]
beta2 = 0.95  # AdamW beta2 [0 <= beta2 < 1]
grad_clip = 1.0  # clip the global gradient norm to this; 0 disables clipping [0 <= grad_clip < inf]
sync_every_step = False  # as in train.py: read each step's skip verdict on the host (a device sync per step)
# ---- timing
warmup_steps = 10  # --mode=train: untimed steps first: compilation, allocator and cache warm-up; at least 1 with compile, or the first timed step compiles [warmup_steps >= 1 or (warmup_steps == 0 and (not compile or mode != 'train'))]
num_steps = 20  # --mode=train: timed steps (per round, with compare) [num_steps > 0]
compare = ""  # flags for a second config to time against this one, in alternation, e.g. "--compile=False"; prints the speed ratio; several configs separated by ';' are each timed against this one; --mode=train only, and not with --profile [compare == '' or (mode == 'train' and not profile)]
rounds = 5  # with compare: rounds of num_steps steps of each config in turn, the ratio's spread over them; --mode=generate: samples each way, the median taken [rounds > 0]
gen_tokens = 500  # --mode=generate: new tokens per sample, after a one-token prompt [gen_tokens > 0]
profile = False  # write a torch profiler trace (bench_trace/, for TensorBoard or Perfetto) instead of timing; --mode=train only [not profile or mode == 'train']
seed = 1337  # seeds init and the batches [0 <= seed < 2**63]
# ---- data pipeline benchmarks
token_file_tokens = 50_000_000  # --mode=get_batch: size of the random token files (uint16 and uint32) it reads [token_file_tokens > block_size]
corpus_text = "data/shakespeare_char/input.txt"  # --mode=prepare: text to build the benchmark corpus from
corpus_mb = 300  # --mode=prepare: corpus size in MB, as files of about 1 MB of shuffled paragraphs [corpus_mb > 0]
gpt2_tiktoken = ""  # --mode=prepare: GPT-2's rank file, for machines without network
# ---- system
device = "auto"  # 'auto' (cuda if there is a GPU, else cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'; on a CPU, --mode=train's model keys left at their defaults shrink to n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12 (CPU_MODEL; --help shows GPT-2's defaults)
dtype = "auto"  # 'float32', 'bfloat16', 'float16', or 'auto' (bf16 where the GPU has it, else fp16; fp32 off CUDA) [dtype in ('auto', 'float32', 'bfloat16', 'float16')]
compile = True  # torch.compile the model (after a test compile; without it where that fails)
compile_mode = "default"  # torch.compile's mode: 'default', 'max-autotune' (slower compile, tuned kernels, CUDA graphs), 'reduce-overhead' (CUDA graphs) or 'max-autotune-no-cudagraphs'; on a GPU the two with CUDA graphs need gradient_accumulation_steps=1 [compile_mode in ('default', 'max-autotune', 'reduce-overhead', 'max-autotune-no-cudagraphs')]
fp8 = False  # as in train.py: the blocks' matmuls in float8 (see fp8.py)
attention_kernel = "auto"  # as in train.py: the attention kernel on CUDA, 'auto', 'flash' or 'cudnn' [attention_kernel in ('auto', 'flash', 'cudnn')]
config_defaults = configurator.config_keys(globals())  # taken here, so only the names above are settings

# train.py settings that do not change what a step costs: a training config file may set them, and bench
# ignores them (tests/test_training.py checks that every train.py setting is here or a bench setting)
TRAINING_ONLY = ("out_dir", "eval_interval", "log_interval", "log_format", "eval_iters", "eval_only", "dry_run",
                 "always_save_checkpoint", "keep_last_n", "max_nonfinite_steps", "init_from", "resume_from",
                 "overwrite", "sample_interval", "sample_prompt", "sample_tokens", "wandb_log", "wandb_project",
                 "wandb_run_name", "hellaswag_interval", "hellaswag_file", "hellaswag_items", "max_iters",
                 "lr_schedule", "cooldown_frac", "decay_lr", "warmup_iters", "lr_decay_iters", "min_lr",
                 "parallelism", "fsdp_reduce", "backend", "ddp_timeout")
# settings that go to GPTConfig as they are: its fields, but the two a config's data and timing decide
MODEL_KEYS = tuple(f.name for f in dataclasses.fields(GPTConfig) if f.name not in ("block_size", "vocab_size"))
# settings of the timing itself, the same for every config of a --compare
HOW_TO_TIME = ("mode", "warmup_steps", "num_steps", "compare", "rounds", "gen_tokens", "profile", "token_file_tokens",
               "corpus_text", "corpus_mb", "gpt2_tiktoken")
# GPT-2 124M at 12 x 1024 takes minutes per step on a CPU; there, --mode=train's model keys left at their defaults
# take these
CPU_MODEL = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)


def synchronize(device_type: str):
    """Wait for the device, so wall-clock time covers the work queued so far."""
    if device_type == "cuda":
        torch.cuda.synchronize()
    elif device_type == "mps":
        torch.mps.synchronize()


def get_batch_rows(path: str, dtype, batch_size: int, block_size: int, generator: torch.Generator):
    """nanoGPT's get_batch, for comparison: one slice, copy and tensor per row, then a stack."""
    data = np.memmap(path, dtype=dtype, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


def bench_get_batch(batch_size: int, block_size: int, n_tokens: int, repeats: int = 200):
    """Microseconds per batch of dataset.get_batch and of the row-by-row loop, on uint16 and uint32 files in the
    page cache; and of get_batch reading from the disk, the file evicted from the cache (Linux), with the kernel's
    read-ahead and without it (random_access), with the bytes read from storage per batch."""
    from dataset import get_batch
    with tempfile.TemporaryDirectory() as tmp:
        kind = filesystem_type(tmp)  # a tmpfs (/tmp on many systems) is memory: eviction leaves its pages there
        for dtype in (np.uint16, np.uint32):
            path = os.path.join(tmp, f"tokens_{np.dtype(dtype).name}.bin")
            np.random.default_rng(0).integers(0, 50257, n_tokens, dtype=dtype).tofile(path)
            shards = [(path, n_tokens)]
            timings = {}
            for name, fn in (("get_batch", lambda i: get_batch(shards, dtype, batch_size, block_size, (0, i), "cpu")),
                             ("row loop", lambda i: get_batch_rows(path, dtype, batch_size, block_size, generator))):
                generator = torch.Generator().manual_seed(0)
                for i in range(20):  # warm the page cache and the allocator
                    fn(i)
                t0 = time.perf_counter()
                for i in range(repeats):
                    fn(i)
                timings[name] = (time.perf_counter() - t0) / repeats * 1e6
            print(f"{np.dtype(dtype).name}, batch {batch_size} x {block_size}: get_batch {timings['get_batch']:.0f} us, "
                  f"row loop {timings['row loop']:.0f} us ({timings['row loop'] / timings['get_batch']:.1f}x)")
            if not hasattr(os, "posix_fadvise"):
                continue
            where = f"{np.dtype(dtype).name}, batch {batch_size} x {block_size}, from the disk:"
            if kind in ("tmpfs", "ramfs"):
                print(f"{where} not measured: {tmp} is on a {kind}, in memory; set TMPDIR to a folder on a disk")
                continue
            cold = {}
            for random_access in (False, True):
                evict([path])
                read_before, t0 = disk_reads(), time.perf_counter()
                for i in range(repeats):  # new windows: their pages come from the disk
                    get_batch(shards, dtype, batch_size, block_size, (1 + random_access, i), "cpu", random_access)
                seconds, read = time.perf_counter() - t0, disk_reads()
                cold[random_access] = (f"{seconds / repeats * 1e6:.0f} us" + ("" if read is None else
                                       f" ({(read - read_before) / repeats / 2**20:.2f} MiB read per batch)"))
            print(f"{where} get_batch {cold[False]} with the kernel's read-ahead, {cold[True]} with random_access")


def make_corpus(text_path: str, out_dir: str, n_mb: int):
    """n_mb files of about 1 MB, each the paragraphs of text_path in a different order."""
    try:
        with open(text_path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:  # a token file, say: NUL bytes are UTF-8, but no text has them
        raise UserError(f"corpus_text {text_path} is not UTF-8 text: give --corpus_text=PATH of a text file")
    paragraphs = text.split("\n\n")
    os.makedirs(out_dir, exist_ok=True)
    for i in range(n_mb):
        random.Random(i).shuffle(paragraphs)
        text, size = [], 0
        for p in paragraphs:
            text.append(p)
            size += len(p) + 2
            if size >= 1 << 20:
                break
        with open(os.path.join(out_dir, f"part_{i:04d}.txt"), "w", encoding="utf-8") as f:
            f.write("\n\n".join(text))


def run_measured(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak resident memory (summed over the process tree, sampled every 50 ms) of cmd."""
    try:
        import psutil
    except ImportError:
        raise UserError("--mode=prepare measures memory with psutil: pip install psutil") from None
    t0, peak = time.perf_counter(), 0
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    try:
        while proc.poll() is None:
            try:
                peak = max(peak, sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
            except psutil.Error:  # a worker exited between listing and reading
                pass
            time.sleep(0.05)
    finally:  # stopped (SIGTERM, Ctrl-C) while it runs: its process tree goes too, not on by itself
        if proc.poll() is None:
            for p in [*root.children(recursive=True), root]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            proc.wait()
    if proc.returncode:
        lines = proc.stderr.read().strip().splitlines() or ["no output"]
        if lines[-1].startswith("error: "):  # the script's own line (a rank file it cannot find, say)
            raise UserError(f"{os.path.basename(cmd[1])} stopped: {lines[-1][len('error: '):]}")
        raise RuntimeError(f"{cmd} failed: {chr(10).join(lines)[-2000:]}")  # a bug: its traceback in full
    return time.perf_counter() - t0, peak


def baseline_prepare(corpus_dir: str, out_path: str, rank_file: str):
    """The simple way, for comparison: one process, encode_ordinary per file, append to one file."""
    from tokenizer import EOT, gpt2_encoding
    enc = gpt2_encoding(rank_file or None)
    with open(out_path, "wb") as out:
        for path in sorted(glob.glob(os.path.join(corpus_dir, "*.txt"))):
            with open(path, encoding="utf-8") as f:
                ids = enc.encode_ordinary(f.read())
            ids.append(EOT)
            out.write(np.array(ids, dtype=np.uint16).tobytes())


def bench_prepare(text_path: str, sizes_mb: list[int], rank_file: str):
    """Tokens/s and peak memory of data/prepare.py and of baseline_prepare on corpora of the given sizes."""
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        for n_mb in sizes_mb:
            corpus = os.path.join(tmp, f"corpus_{n_mb}")
            make_corpus(text_path, corpus, n_mb)
            rank_args = ["--gpt2_tiktoken", rank_file] if rank_file else []
            out = os.path.join(tmp, f"out_{n_mb}")
            seconds, peak = run_measured([sys.executable, os.path.join(here, "data", "prepare.py"), "--input", corpus,
                                          "--out_dir", out, "--val_fraction", "0.01"] + rank_args)
            tokens = sum(os.path.getsize(p) // 2 for p in glob.glob(os.path.join(out, "*.bin")))
            print(f"{n_mb} MB: data/prepare.py ({os.cpu_count()} workers): {tokens:,} tokens in {seconds:.1f} s, "
                  f"{tokens / seconds:,.0f} tokens/s, peak memory {peak / 2**20:,.0f} MiB")
            baseline = os.path.join(tmp, "baseline.bin")  # bench imported from here, wherever it runs from
            code = f"import sys; sys.path.insert(0, {here!r}); import bench; bench.baseline_prepare({corpus!r}, {baseline!r}, {rank_file!r})"
            seconds, peak = run_measured([sys.executable, "-c", code])
            tokens = os.path.getsize(baseline) // 2
            print(f"{n_mb} MB: one-process encode_ordinary loop: {tokens:,} tokens in {seconds:.1f} s, "
                  f"{tokens / seconds:,.0f} tokens/s, peak memory {peak / 2**20:,.0f} MiB")


def resolve_device(device: str) -> str:
    """'auto' is the GPU where there is one, else the CPU."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def dataset_vocab_size(dataset: str) -> int:
    """The vocabulary train.py would give a model of the dataset (dataset.model_vocab_size): GPT-2's padded 50304
    where it is not prepared or does not say."""
    from dataset import declared_vocab, find_dataset, model_vocab_size
    try:
        data_dir = find_dataset(dataset)
    except UserError:
        return model_vocab_size(None, {})
    return model_vocab_size(*declared_vocab(data_dir))


def unprepared(dataset: str) -> str | None:
    """Why a dataset gives no vocabulary here (not found, or a folder with no token files or meta), else None:
    the model is then timed at GPT-2's, which a character dataset's 65 is far from."""
    from dataset import find_dataset
    try:
        data_dir = find_dataset(dataset)
    except UserError as e:
        return str(e)
    try:
        files = os.listdir(data_dir)
    except OSError as e:  # a file named as the dataset, or a folder it cannot read
        return f"dataset '{dataset}' cannot be read ({e.strerror or e})"
    if any(f.endswith(".bin") or f in ("meta.json", "meta.pkl") for f in files):
        return None
    return f"dataset '{dataset}' is not prepared in {data_dir}"


def gpt_config(cfg: dict) -> GPTConfig:
    """The model of the config cfg. vocab_size 0 takes the one train.py would for the dataset (GPT-2's padded
    50304 where it is not prepared)."""
    vocab = cfg["vocab_size"] or dataset_vocab_size(cfg["dataset"])
    return GPTConfig(block_size=cfg["block_size"], vocab_size=vocab, **{k: cfg[k] for k in MODEL_KEYS})


def planned_batch(cfg: dict, compiled: bool) -> int:
    """The micro-batch of cfg by its memory plan, as train.py plans a run of one process (compiled: whether the
    step runs compiled). batch_size='auto': the largest power of two whose plan fits in memory.AUTO_SHARE of the
    device's free memory. A number: itself, checked on a CPU, where a step past the free memory would have the
    kernel kill the process and every config's figures with it (a GPU's out-of-memory error is reported, and
    left out of the comparison, as any failing config's)."""
    from memory import check_fits, free_bytes, largest_batch, no_auto_batch, plan
    device_type = check_device(cfg["device"])
    if cfg["batch_size"] != "auto" and device_type != "cpu":
        return cfg["batch_size"]
    with torch.device("meta"):  # the plan needs the shapes only
        model = GPT(gpt_config(cfg))
    free = free_bytes(cfg["device"])
    settings = dict(dtype=resolve_dtype(cfg["dtype"], device_type), optimizer=cfg["optimizer"], world_size=1,
                    parallelism="ddp", activation_checkpointing=cfg["activation_checkpointing"],
                    device_type=device_type, compiled=compiled)
    if cfg["batch_size"] != "auto":
        settings["batch_size"] = cfg["batch_size"]
        check_fits(plan(model, **settings), free, model, settings)
        return cfg["batch_size"]
    batch = largest_batch(model, settings, free) if free is not None else None
    if batch is None:
        raise UserError(no_auto_batch(model, settings, free))
    return batch


def model_of(cfg: dict) -> tuple[str, str, object, GPT]:
    """The device type, dtype and autocast context of the config cfg, and its model, seeded and on the device."""
    device_type = check_device(cfg["device"])
    dtype = resolve_dtype(cfg["dtype"], device_type)
    torch.manual_seed(cfg["seed"])
    model = GPT(gpt_config(cfg))
    model.prefer_attention(cfg["attention_kernel"])
    if cfg["fp8"]:
        check_fp8(cfg["device"])
        use_fp8(model, cfg["batch_size"] * cfg["block_size"])
    return device_type, dtype, autocast_context(device_type, dtype), model.to(cfg["device"])


def check_data_settings(cfg: dict):
    """The settings of reading a dataset need real_data=True, which reads one (else they would be timed as no
    change); cold_data needs posix_fadvise."""
    if cfg["cold_data"] and not cfg["real_data"]:
        raise UserError("cold_data=True evicts the dataset's files, which only real_data=True reads: set both")
    if cfg["prefetch_batches"] != config_defaults["prefetch_batches"] and not cfg["real_data"]:
        raise UserError(f"prefetch_batches={cfg['prefetch_batches']} reads the dataset's batches ahead, which only "
                        "real_data=True reads (random tokens are made in place): set both")
    if cfg["cold_data"] and not hasattr(os, "posix_fadvise"):
        raise UserError("cold_data=True evicts files from the page cache with posix_fadvise, which this system lacks "
                        "(Linux has it): leave cold_data False")


def build(cfg: dict) -> dict:
    """A training step of the config cfg, ready to time: {'step': f() -> loss, 'model', 'tokens_per_step',
    'device_type', 'dtype', 'batch_size' (the micro-batch, 'auto' resolved), 'compiled', 'cold_files' (the token
    files to evict before a round, with cold_data) and 'wait_reads' (f() that waits for the batches read ahead)}.
    The step is train.py's: micro-steps, gradient clipping, the skip verdict, the update."""
    from dataset import Prefetcher, load_dataset, read_batch
    from optimizers import build_optimizer, nonfinite_flag, skips_on_device, take_step

    if cfg["compile"]:
        check_compile_mode(cfg["compile_mode"], cfg["gradient_accumulation_steps"], torch.device(cfg["device"]).type)
    check_data_settings(cfg)
    check_device(cfg["device"])  # before the test compile, which needs the device
    problem = compile_problem(cfg["device"]) if cfg["compile"] else None  # before the plan: a compiled loss holds less
    if problem:
        print(f"warning: compile=True but {problem}: timing without torch.compile", file=sys.stderr)
    compiled = cfg["compile"] and not problem
    batch = planned_batch(cfg, compiled)
    if cfg["batch_size"] == "auto":
        print(f"batch_size auto: {batch} sequences per micro-step")
    cfg = {**cfg, "batch_size": batch}
    device = cfg["device"]
    device_type, dtype, ctx, model = model_of(cfg)
    vocab = model.config.vocab_size
    B, T = cfg["batch_size"], cfg["block_size"]
    if cfg["real_data"]:
        data = load_dataset(cfg["dataset"], T)
        if data["max_token_id"] >= vocab:
            raise UserError(f"dataset {cfg['dataset']} has token id {data['max_token_id']}, out of range for "
                            f"vocab_size {vocab}: leave vocab_size at 0 (the dataset's) or raise it")

        # batch i is micro-step i of the run: steps are timed in order from step 0, whatever the rounds
        batches = Prefetcher(lambda i: read_batch(data["splits"]["train"], data["dtype"], B, T, (cfg["seed"], 0, i),
                                                  device_type == "cuda", data["random_access"]),
                             itertools.count(), cfg["prefetch_batches"], device)
        cold_files = [path for split in data["splits"].values() for path, _ in split] if cfg["cold_data"] else []
        wait_reads = batches.wait

        def batch():
            return next(batches)
    else:
        tokens = torch.randint(vocab, (B, T + 1), generator=torch.Generator().manual_seed(cfg["seed"]))
        x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        cold_files, wait_reads = [], lambda: None

        def batch():
            return x, y
    optimizer = build_optimizer(model, cfg["optimizer"], cfg["weight_decay"], cfg["learning_rate"],
                                (cfg["beta1"], cfg["beta2"]), cfg["muon_lr"], cfg["muon_momentum"], device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
    on_device = not cfg["sync_every_step"] and skips_on_device(optimizer)
    how = None if cfg["compile_mode"] == "default" else cfg["compile_mode"]
    # static shapes: a second config with another batch in this process must not turn the first one's graph dynamic
    train_model = torch.compile(model, mode=how, dynamic=False) if compiled else model
    accum, clip = cfg["gradient_accumulation_steps"], cfg["grad_clip"] or float("inf")

    def step():
        """One optimizer step; returns the loss tensor (not synchronised)."""
        loss_sum = torch.zeros((), device=device)
        for _ in range(accum):
            x, y = batch()
            with ctx:
                loss = train_model(x, y)[1]  # as train.py: the logits are not held through backward
            scaler.scale(loss / accum).backward()
            loss_sum += loss.detach() / accum
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        take_step(optimizer, scaler, nonfinite_flag(loss_sum, grad_norm, scaler.is_enabled(), False), on_device)
        return loss_sum

    print(f"{model.parameters_text()}, vocab {vocab}, {accum} x {B} x {T} tokens per step, "
          f"device {device}, dtype {dtype}, compile {compiled}, fp8 {cfg['fp8']}")
    return {"step": step, "model": model, "tokens_per_step": accum * B * T, "device_type": device_type, "dtype": dtype,
            "batch_size": B, "cold_files": cold_files, "wait_reads": wait_reads, "compiled": compiled}


def bench_generate(cfg: dict):
    """Tokens/s of GPT.generate with the KV cache and without it, alternating over rounds, on one model with
    random weights (speed does not depend on them); in float32 the two must give the same tokens. In 16 bits
    their matmuls round differently (one token's row against the whole window's), as do fp8's (each input's
    scale is taken over one token's row or the whole window's), so sampling drifts apart at some point; the
    report says where."""
    device_type, dtype, ctx, model = model_of(cfg)
    model.eval()
    prompt = torch.zeros((cfg["batch_size"], 1), dtype=torch.long, device=cfg["device"])
    print(f"{model.parameters_text()}, block_size {cfg['block_size']}, {cfg['batch_size']} "
          f"sample(s) of {cfg['gen_tokens']} tokens, device {cfg['device']}")
    times, outputs, agree = {True: [], False: []}, {}, []
    for use_cache in (True, False):  # untimed: the first call of each pays for allocations (and any compile)
        with ctx:
            model.generate(prompt, cfg["gen_tokens"], temperature=1.0, top_k=200, use_cache=use_cache)
    for r in range(cfg["rounds"]):
        for use_cache in (True, False):
            synchronize(device_type)
            t0 = time.perf_counter()
            with ctx:
                outputs[use_cache] = model.generate(prompt, cfg["gen_tokens"], temperature=1.0, top_k=200,
                                                    generator=torch.Generator(cfg["device"]).manual_seed(r),
                                                    use_cache=use_cache)
            synchronize(device_type)
            times[use_cache].append(time.perf_counter() - t0)
        same = (outputs[True] == outputs[False]).all(dim=0).int().cumprod(0).sum().item() - prompt.size(1)  # new tokens alike
        exact = dtype == "float32" and not cfg["fp8"]
        if exact and same < cfg["gen_tokens"]:
            raise RuntimeError(f"generation with the KV cache gave other tokens than without it (from token {same})")
        agree.append(same)
    tokens = cfg["batch_size"] * cfg["gen_tokens"]
    for use_cache, label in ((True, "with the KV cache"), (False, "without")):
        print(f"{label}: {tokens / statistics.median(times[use_cache]):,.0f} tokens/s (median of {cfg['rounds']} rounds)")
    ratios = sorted(b / a for a, b in zip(times[True], times[False]))
    alike = "same tokens" if min(agree) == cfg["gen_tokens"] else \
        f"in {dtype}{' with fp8' if cfg['fp8'] else ''} the two part after {min(agree)} of {cfg['gen_tokens']} " \
        "tokens (they round differently; float32 without fp8 gives the same tokens)"
    print(f"cache/no-cache tokens/s: {statistics.median(ratios):.2f}x (min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x), "
          + alike)


def evict(paths: list[str]):
    """Drop the files' pages from the page cache, so their next reads go to the disk (Linux; pages that some
    process has mapped stay)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # pages not yet written back would stay
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem path is on (Linux's /proc/self/mounts: the longest mount point above it), or
    None where it is not told."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return None
    real = os.path.realpath(path)
    above = [(point, kind) for point, kind in mounts if real == point or real.startswith(point.rstrip("/") + "/")]
    return max(above, key=lambda m: len(m[0]))[1] if above else None


def disk_reads() -> int | None:
    """Bytes this process has had read from storage (Linux's /proc/self/io), or None where it is not told."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration, ValueError):
        return None


def time_steps(run: dict, n: int) -> tuple[float, torch.Tensor]:
    """Seconds per step of the next n steps, the device drained before and after, and so are the
    batches read ahead (Prefetcher.wait); and the last loss. With cold_data the dataset's files leave the page
    cache first."""
    evict(run["cold_files"])
    synchronize(run["device_type"])
    t0 = time.perf_counter()
    for _ in range(n):
        loss = run["step"]()
    run["wait_reads"]()
    synchronize(run["device_type"])
    return (time.perf_counter() - t0) / n, loss


def figures(run: dict, dt: float, device: str) -> str:
    """ms/iter, tokens/s and MFU of a step time."""
    mfu = run["model"].estimate_mfu(run["tokens_per_step"], dt, peak_flops(device))
    return (f"{dt * 1000:.2f} ms/iter, {run['tokens_per_step'] / dt:,.0f} tokens/s"
            + (f", MFU {mfu * 100:.1f}%" if mfu is not None else ""))


def warm_up(run: dict, steps: int) -> str:
    """Run the first steps (compilation included) untimed; the line that says how long they took."""
    t0 = time.perf_counter()
    for _ in range(steps):
        run["step"]()
    synchronize(run["device_type"])
    return f"warm-up: {steps} steps in {time.perf_counter() - t0:.1f} s" + (" (compilation included)" if run["compiled"] else "")


def vocabulary_note(cfg: dict) -> str | None:
    """What to say of a config whose dataset gives no vocabulary (see unprepared), else None. Not for the default,
    openwebtext, which is GPT-2's vocabulary either way, nor with real_data, whose read says the same as an error."""
    if cfg["mode"] not in ("train", "generate") or cfg["vocab_size"] or cfg["real_data"] or \
            cfg["dataset"] == config_defaults["dataset"]:
        return None
    why = unprepared(cfg["dataset"])
    return f"{why}; until it is, the model is timed with GPT-2's vocabulary, 50304 (or give --vocab_size=N)" if why \
        else None


def variants_of(config: dict, compare: str) -> dict[str, dict]:
    """The configs that --compare names: flags on top of config, several separated by ';'. Labelled B, or
    B1, B2, ... when there are several."""
    texts = [text for text in compare.split(";") if text.strip()]
    configs = []
    for text in texts:
        try:
            flags = shlex.split(text)
        except ValueError as e:
            raise UserError(f"compare={compare!r} cannot be read as flags ({e}): e.g. --compare=\"--compile=False\"") from None
        other = configurator.configure(config, flags, __file__, ignored=TRAINING_ONLY, types=config_defaults,
                                       check=False)  # the rules after this check, which names the mistake better
        other["device"] = resolve_device(other["device"])  # as A's was
        fixed = [k for k in HOW_TO_TIME if other[k] != config[k]]  # by a flag, or a config file among them
        if fixed:
            raise UserError(f"compare={compare!r}: {text.strip()!r} sets {', '.join(fixed)}, which say how every config "
                            "is timed, not what one costs: set them outside --compare")
        configurator.check_rules(other, configurator.rules(__file__, other))
        check_data_settings(other)  # before any config is built and timed
        if other == config:
            dropped = [f[2:].split("=")[0] for f in flags if f[2:].split("=")[0] in TRAINING_ONLY]
            why = (f"{', '.join(dropped)} {'is' if len(dropped) == 1 else 'are'} train.py's alone, which bench leaves "
                   "out" if dropped else "A has those values already")
            raise UserError(f"compare={compare!r}: {text.strip()!r} changes no setting ({why}): give flags whose values "
                            "differ from A's")
        configs.append(other)
    if not configs:
        raise UserError(f"compare={compare!r} names no config: give flags such as \"--compile=False\"")
    return {("B" if len(configs) == 1 else f"B{i + 1}"): c for i, c in enumerate(configs)}


class StoppedBuilding(BaseException):
    """SIGTERM while --compare's configs are built: not an Exception, so that no config is reported as failed."""


def compare_configs(config: dict, compare: str, warmup_steps: int, num_steps: int, rounds: int):
    """Config A and the --compare configs, timed in alternation in this one process: each one's tokens/s ratio
    to A, and its spread over rounds. A config that fails (out of memory, a compile error, fp8 on an older GPU)
    is reported and left out, the others go on, and the exit status is 1. SIGTERM (a caller's time limit) or a
    Ctrl-C ends the timing after the round in progress, and the rounds done are reported (a second Ctrl-C exits at
    once); while the configs are still being built (compiled), it stops the one in progress and times one round of
    those built, if A is among them. Every
    config is compiled in this process, so Dynamo may recompile the model's code once per config: its limit is
    raised to match."""
    configs = {"A": config, **variants_of(config, compare)}
    changed = sorted({k for c in configs.values() for k in c if c[k] != config[k]}, key=list(config).index)
    for label, c in configs.items():
        print(f"{label}: " + ", ".join(f"{k}={c[k]!r}" for k in changed))
    for label, c in configs.items():  # A's was said before (main)
        note = vocabulary_note(c) if label != "A" and c["dataset"] != config["dataset"] else None
        if note:  # else B is timed as A, and its ratio read as the dataset's doing
            print(f"note: {label}: {note}")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * len(configs))
    stopped, building = [], [True]

    def on_sigterm(signum, _):
        if stopped and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stopped.append(signal.Signals(signum).name)
        if building[0]:  # a compile can take a minute, longer than a caller waits after SIGTERM
            building[0] = False  # once: a second signal (timeout sends two) must not break the first one's unwinding
            raise StoppedBuilding

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    runs, times, failed, built = {}, {}, [], []

    def attempt(label: str, work):
        """work() for config `label`; a B config that raises is reported and left out."""
        try:
            return work()
        except Exception as e:
            if stopped and not building[0] and label not in built:  # the stop, whose StoppedBuilding a context it
                raise StoppedBuilding from e  # unwound through replaced (torch's "pop from empty mode stack")
            if label == "A":
                raise
            print(f"{label} failed, left out: {type(e).__name__}: {(str(e).strip() or '?').splitlines()[0][:300]}",
                  flush=True)
        runs.pop(label, None), times.pop(label, None), failed.append(label)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # here, past the except block, whose traceback held the config's tensors

    def start(label: str, c: dict):
        runs[label], times[label] = build(c), []
        line = warm_up(runs[label], warmup_steps)
        built.append(label)  # before the line is printed: a caller may send SIGTERM the moment it reads it
        print(f"{label} {line}", flush=True)

    label = "A"
    try:
        for label, c in configs.items():
            if stopped:  # in case a compile swallowed the exception
                break
            attempt(label, lambda: start(label, c))
        building[0] = False
    except StoppedBuilding:
        if label not in built:
            runs.pop(label, None), times.pop(label, None)
    if stopped:
        if "A" not in runs:
            raise UserError(f"stopped by {stopped[0]} while A was built: nothing was timed")
        unbuilt = [label for label in configs if label not in runs and label not in failed]
        if unbuilt:
            print(f"stopped by {stopped[0]} while the configs were built: {', '.join(unbuilt)} left out, one round "
                  "of the others", flush=True)
    done = 0
    while done < rounds and (not stopped or not done):
        for label in list(runs):
            attempt(label, lambda: times[label].append(time_steps(runs[label], num_steps)[0]))
        done += 1
        print(f"round {done}/{rounds}: " + ", ".join(f"{label} {times[label][-1] * 1000:.2f} ms/iter" for label in runs),
              flush=True)
    if stopped:
        print(f"stopped by {stopped[0]} after {done} of {rounds} rounds")
    if not done:
        raise UserError(f"stopped by {stopped[0]} before a round was timed")
    for label, run in runs.items():
        print(f"{label}: {figures(run, statistics.median(times[label]), configs[label]['device'])} (median of {done} "
              "rounds)")
    for label in runs:
        if label == "A":
            continue
        # throughput ratio per round (tokens per step may differ between A and B)
        ratios = sorted(runs[label]["tokens_per_step"] / b / (runs["A"]["tokens_per_step"] / a)
                        for a, b in zip(times["A"], times[label]))
        print(f"{label}/A tokens/s: {statistics.median(ratios):.3f}x (min {ratios[0]:.3f}x, max {ratios[-1]:.3f}x over "
              f"{done} rounds of {num_steps} steps, alternating)")
    if failed:
        raise UserError(f"{', '.join(failed)} failed to run (see above); the other ratios stand")


if __name__ == "__main__":
    start_script()
    # read once for the device and mode, which pick the defaults: on a CPU, --mode=train's model keys default to
    # CPU_MODEL, so what a file or flag sets stays, even where it equals GPT-2's default (--n_layer=12)
    first = configurator.configure({**config_defaults, "init_from": "scratch"}, sys.argv[1:], __file__,
                                   ignored=tuple(k for k in TRAINING_ONLY if k != "init_from"), check=False,
                                   quiet=True)
    starts = first.pop("init_from")  # a finetune config's model, which bench does not load
    flags = [a[2:].partition("=")[0] for a in sys.argv[1:] if a.startswith("--")]  # a config file's: its business
    typed = [f"--{k}" for k in dict.fromkeys(flags) if k in TRAINING_ONLY and k != "init_from"]
    if typed:
        print(f"note: {', '.join(typed)} {'is a setting' if len(typed) == 1 else 'are settings'} of train.py alone: "
              "bench.py times the same step whatever the value")
    if starts != "scratch":  # out_dir's checkpoint (resume) included
        print(f"note: init_from={starts!r} is not loaded: bench times a model of random weights with the shape of "
              "its model keys (set n_layer, n_head, n_embd, vocab_size, bias, ... to that model's)")
    device = resolve_device(first["device"])
    on_cpu = check_device(device) == "cpu" and first["mode"] == "train"
    try:
        config = configurator.configure({**config_defaults, **CPU_MODEL} if on_cpu else config_defaults, sys.argv[1:],
                                        __file__, ignored=TRAINING_ONLY)
    except UserError as e:  # a rule may meet a CPU default the user never typed: --n_head=6 with n_embd=128
        # a key that reads otherwise: not given
        cpu_read = configurator.configure({**config_defaults, **CPU_MODEL}, sys.argv[1:], None,
                                          ignored=TRAINING_ONLY, check=False, quiet=True)
        unset = [k for k in CPU_MODEL if cpu_read[k] != first[k] and re.search(rf"\b{k}=", str(e))]
        raise UserError(f"{e}" + (f" ({', '.join(f'{k}={CPU_MODEL[k]}' for k in unset)}: bench's CPU default, as it "
                                  "was not given: give it too)" if on_cpu and unset else "")) from None
    if check_device(device) == "cpu" and first["mode"] in ("train", "generate") and hasattr(os, "getloadavg"):
        # as train.py: timings on a busy CPU mislead (the data modes time reads, where torch's threads do not matter)
        contention = cpu_contention(os.getloadavg()[0], os.cpu_count() or 1, torch.get_num_threads())
        if contention:
            print(f"warning: {contention}; what else runs is timed too", file=sys.stderr)
    if config["profile"]:  # the trace is written after the timing: a folder that cannot be made fails now, not then
        made = not os.path.isdir("bench_trace")
        try:
            os.makedirs("bench_trace", exist_ok=True)
            tempfile.TemporaryFile(dir="bench_trace").close()  # and it can be written in
            if made:  # the trace's writer makes it again: a run that fails before then leaves no empty folder
                os.rmdir("bench_trace")
        except OSError as e:
            raise UserError(f"cannot make bench_trace/ here for the profiler trace ({e.strerror or e}): run bench.py "
                            "from a writable folder") from None
    config["device"] = device
    shrunk = {k: config[k] for k in CPU_MODEL if config[k] != first[k]}
    if shrunk:
        print("on a CPU, the model keys left at their defaults are shrunk: "
              + ", ".join(f"{k}={v}" for k, v in shrunk.items()))
    globals().update(config)
    note = vocabulary_note(config)
    if note:
        print(f"note: {note}")
    if batch_size == "auto" and mode != "train":
        raise UserError(f"batch_size='auto' plans training memory: give --mode={mode} a number, e.g. --batch_size=12")
    if mode in ("get_batch", "prepare"):  # a SIGTERM (a budget's, the GPU suite's) unwinds: their temporary files go
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if mode == "get_batch":
        bench_get_batch(batch_size, block_size, token_file_tokens)
        sys.exit(0)
    if mode == "prepare":
        if not os.path.isfile(corpus_text):
            raise UserError(f"corpus_text {corpus_text} is not a file: give --corpus_text=PATH (a text of a few MB), "
                            "or run data/shakespeare_char/prepare.py without --input where it can download tiny "
                            "Shakespeare, which it keeps there (offline it uses the Gutenberg plays and keeps no text)")
        if not os.path.getsize(corpus_text):  # else prepare.py's own line would name its --input, not this flag
            raise UserError(f"corpus_text {corpus_text} is empty: give --corpus_text=PATH of a text of a few MB")
        bench_prepare(corpus_text, sorted({max(1, corpus_mb // 3), corpus_mb}), gpt2_tiktoken)
        sys.exit(0)
    if mode == "generate":
        bench_generate(config)
        sys.exit(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    if compare:
        compare_configs(config, compare, warmup_steps, num_steps, rounds)
        sys.exit(0)

    run = build(config)
    print(warm_up(run, warmup_steps), flush=True)
    if run["device_type"] == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile, tensorboard_trace_handler
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run["device_type"] == "cuda" else [])
        with torch_profile(activities=activities, on_trace_ready=tensorboard_trace_handler("bench_trace")) as prof:
            time_steps(run, num_steps)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        print("trace written to bench_trace/")
    else:
        dt, loss = time_steps(run, num_steps)
        mfu_text = "" if peak_flops(device) else " (MFU: peak FLOP/s unknown for this device)"
        memory_text = ""
        if run["device_type"] == "cuda":  # beside memory.py's plan for the same step, which train.py checks runs against
            from memory import plan
            planned = plan(run["model"], run["batch_size"], run["dtype"], optimizer, 1, "ddp", activation_checkpointing,
                           "cuda", compiled=run["compiled"])
            memory_text = (f", peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB (planned "
                           f"{planned['total'] / 2**30:.2f} GiB)")
        print(f"{figures(run, dt, device)}{mfu_text}{memory_text}; final loss {loss.item():.4f}")
