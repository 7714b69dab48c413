"""
Times training steps (forward, backward, optimizer step) of any model config, warm-up excluded:

    python bench.py                                   # GPT-2 124M, batch 12 x 1024, synthetic tokens
    python bench.py --real_data=True --dataset=openwebtext
    python bench.py --device=cpu --compile=False --n_layer=4 --n_head=4 --n_embd=128 --block_size=64
    python bench.py --profile=True                    # also writes a torch profiler trace to bench_trace/

Prints ms/iter, tokens/s and MFU (MFU where the device's peak FLOP/s is known; see model.PEAK_FLOPS).
"""
import os
import sys
import time
from contextlib import nullcontext

import torch

import configurator
from model import GPT, GPTConfig, peak_flops

# ---- data
batch_size = 12  # sequences per step
block_size = 1024  # tokens per sequence
real_data = False  # sample batches from the dataset's train split instead of random tokens
dataset = "openwebtext"  # with real_data: a folder under data/ or a path
# ---- model
n_layer = 12  # transformer blocks
n_head = 12  # attention heads per block
n_embd = 768  # width of the residual stream
vocab_size = 50304  # GPT-2's vocabulary padded to a multiple of 64
bias = False  # biases in Linear and LayerNorm layers
dropout = 0.0  # dropout rate
# ---- timing
warmup_steps = 10  # untimed steps first: compilation, allocator and cache warm-up
num_steps = 20  # timed steps
profile = False  # write a torch profiler trace (bench_trace/, for TensorBoard or Perfetto) instead of timing
seed = 1337  # seeds init and the batches
# ---- system
device = "cuda"  # 'cpu', 'cuda', 'cuda:N' or 'mps'
dtype = "auto"  # 'float32', 'bfloat16', 'float16', or 'auto' (bf16 where the GPU has it, else fp16; fp32 off CUDA)
compile = True  # torch.compile the model


def synchronize(device_type: str):
    """Wait for the device, so wall-clock time covers the work queued so far."""
    if device_type == "cuda":
        torch.cuda.synchronize()
    elif device_type == "mps":
        torch.mps.synchronize()


if __name__ == "__main__":
    sys.excepthook = configurator.excepthook
    config = configurator.configure(configurator.config_keys(globals()), sys.argv[1:], __file__)
    globals().update(config)
    from train import check_device, get_batch, load_dataset, resolve_dtype

    device_type = check_device(device)
    dtype = resolve_dtype(dtype, device_type)
    torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if dtype == "float32" else torch.autocast(device_type=device_type, dtype=ptdtype)

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
        print(f"{dt * 1000:.2f} ms/iter, {tokens_per_step / dt:,.0f} tokens/s{mfu_text}; final loss {loss.item():.4f}")
