"""
Benchmarks. By default, times training steps (forward, backward, optimizer step) of any model config,
warm-up excluded, and prints ms/iter, tokens/s and MFU (where the device's peak FLOP/s is known; see
common.PEAK_FLOPS):

    python bench.py                                   # GPT-2 124M, batch 12 x 1024, synthetic tokens
    python bench.py --real_data=True --dataset=openwebtext
    python bench.py --device=cpu --compile=False --n_layer=4 --n_head=4 --n_embd=128 --block_size=64
    python bench.py --profile=True                    # also writes a torch profiler trace to bench_trace/

The data pipeline, on CPU:

    python bench.py --mode=get_batch --batch_size=64  # dataset.get_batch against nanoGPT's row-by-row loop
    python bench.py --mode=prepare --corpus_mb=300    # data/prepare.py against a one-process encode loop
"""
import glob
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import configurator
from common import UserError, excepthook, peak_flops
from model import GPT, GPTConfig

mode = "train"  # 'train' times training steps; 'get_batch' and 'prepare' time the data pipeline [mode in ('train', 'get_batch', 'prepare')]
# ---- data
batch_size = 12  # sequences per step [batch_size > 0]
block_size = 1024  # tokens per sequence [block_size > 0]
real_data = False  # sample batches from the dataset's train split instead of random tokens
dataset = "openwebtext"  # with real_data: a folder under data/ or a path
# ---- model
n_layer = 12  # transformer blocks [n_layer > 0]
n_head = 12  # attention heads per block [n_head > 0]
n_embd = 768  # width of the residual stream, split evenly among the heads [n_embd > 0 and n_embd % n_head == 0]
vocab_size = 50304  # GPT-2's vocabulary padded to a multiple of 64 [vocab_size > 0]
bias = False  # biases in Linear and LayerNorm layers
dropout = 0.0  # dropout rate [0 <= dropout < 1]
# ---- timing
warmup_steps = 10  # untimed steps first: compilation, allocator and cache warm-up [warmup_steps >= 0]
num_steps = 20  # timed steps [num_steps > 0]
profile = False  # write a torch profiler trace (bench_trace/, for TensorBoard or Perfetto) instead of timing
seed = 1337  # seeds init and the batches [0 <= seed < 2**63]
# ---- data pipeline benchmarks
token_file_tokens = 50_000_000  # --mode=get_batch: size of the random token files (uint16 and uint32) it reads [token_file_tokens > block_size]
corpus_text = "data/shakespeare_char/input.txt"  # --mode=prepare: text to build the benchmark corpus from
corpus_mb = 300  # --mode=prepare: corpus size in MB, as files of about 1 MB of shuffled paragraphs [corpus_mb > 0]
gpt2_tiktoken = ""  # --mode=prepare: GPT-2's rank file, for machines without network
# ---- system
device = "cuda"  # 'cpu', 'cuda', 'cuda:N' or 'mps'
dtype = "auto"  # 'float32', 'bfloat16', 'float16', or 'auto' (bf16 where the GPU has it, else fp16; fp32 off CUDA) [dtype in ('auto', 'float32', 'bfloat16', 'float16')]
compile = True  # torch.compile the model
config_defaults = configurator.config_keys(globals())  # taken here, so only the names above are settings


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
    """Microseconds per batch of dataset.get_batch and of the row-by-row loop, on uint16 and uint32 files."""
    from dataset import get_batch
    with tempfile.TemporaryDirectory() as tmp:
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


def make_corpus(text_path: str, out_dir: str, n_mb: int):
    """n_mb files of about 1 MB, each the paragraphs of text_path in a different order."""
    with open(text_path, encoding="utf-8") as f:
        paragraphs = f.read().split("\n\n")
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
    while proc.poll() is None:
        try:
            peak = max(peak, sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
        except psutil.Error:  # a worker exited between listing and reading
            pass
        time.sleep(0.05)
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed: {proc.stderr.read()[-2000:]}")
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
            code = f"import bench; bench.baseline_prepare({corpus!r}, {os.path.join(tmp, 'baseline.bin')!r}, {rank_file!r})"
            seconds, peak = run_measured([sys.executable, "-c", code])
            tokens = os.path.getsize(os.path.join(tmp, "baseline.bin")) // 2
            print(f"{n_mb} MB: one-process encode_ordinary loop: {tokens:,} tokens in {seconds:.1f} s, "
                  f"{tokens / seconds:,.0f} tokens/s, peak memory {peak / 2**20:,.0f} MiB")


if __name__ == "__main__":
    sys.excepthook = excepthook
    config = configurator.configure(config_defaults, sys.argv[1:], __file__)
    globals().update(config)
    if mode == "get_batch":
        bench_get_batch(batch_size, block_size, token_file_tokens)
        sys.exit(0)
    if mode == "prepare":
        bench_prepare(corpus_text, sorted({max(1, corpus_mb // 3), corpus_mb}), gpt2_tiktoken)
        sys.exit(0)
    from common import autocast_context, check_device, compile_problem, resolve_dtype
    from dataset import get_batch, load_dataset

    device_type = check_device(device)
    dtype = resolve_dtype(dtype, device_type)
    torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    ctx = autocast_context(device_type, dtype)

    if real_data:
        data = load_dataset(dataset, block_size)

        def batch(step):
            return get_batch(data["splits"]["train"], data["dtype"], batch_size, block_size, (seed, 0, step, 0), device)
    else:
        tokens = torch.randint(vocab_size, (batch_size, block_size + 1), generator=torch.Generator().manual_seed(seed))
        x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)

        def batch(step):
            return x, y

    model = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                          n_embd=n_embd, bias=bias, dropout=dropout)).to(device)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
    problem = compile_problem(device) if compile else None
    if problem:
        print(f"warning: compile=True but {problem}: timing without torch.compile", file=sys.stderr)
        compile = False
    train_model = torch.compile(model) if compile else model
    print(f"{model.get_num_params() / 1e6:.2f}M parameters, batch {batch_size} x {block_size}, "
          f"device {device}, dtype {dtype}, compile {compile}")

    def step(i):
        """One training step; returns the loss tensor (not synchronised)."""
        x, y = batch(i)
        with ctx:
            _, loss = train_model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for i in range(warmup_steps):
        step(i)
    synchronize(device_type)
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    if profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile, tensorboard_trace_handler
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
        with torch_profile(activities=activities, on_trace_ready=tensorboard_trace_handler("bench_trace")) as prof:
            for i in range(num_steps):
                step(warmup_steps + i)
            synchronize(device_type)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        print("trace written to bench_trace/")
    else:
        t0 = time.perf_counter()
        for i in range(num_steps):
            loss = step(warmup_steps + i)
        synchronize(device_type)
        dt = (time.perf_counter() - t0) / num_steps
        tokens_per_step = batch_size * block_size
        mfu = model.estimate_mfu(tokens_per_step, dt, peak_flops(device))
        mfu_text = f", MFU {mfu * 100:.1f}%" if mfu is not None else " (MFU: peak FLOP/s unknown for this device)"
        memory_text = (f", peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
                       if device_type == "cuda" else "")
        print(f"{dt * 1000:.2f} ms/iter, {tokens_per_step / dt:,.0f} tokens/s{mfu_text}{memory_text}; "
              f"final loss {loss.item():.4f}")
