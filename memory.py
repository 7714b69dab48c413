"""
A memory plan before a run: what training will hold on each device, against what the device has free.

Weights, gradients and optimizer state follow from the parameter count. Activations (what autograd keeps
from the forward pass for the backward) are not estimated by formula: a forward pass of the micro-batch
runs on the meta device, which computes shapes and nothing else, and the tensors autograd saves are added
up. Doing that for a 1-block and a 2-block copy of the model gives one block's share and the rest (embeddings,
final norm, the loss), whatever the architecture. In 16-bit precision the trace is of a model cast to that
type, with two corrections for what stays fp32 under autocast: what the norms of the residual stream save
(that stream is fp32, as the weights it adds up are), counted at 4 bytes; and the loss's log-softmax, one float
per logit and at GPT-2's vocabulary the largest tensor of all, which plan() adds. Both checked against autograd's
saved tensors under the CPU's bf16 autocast (tests/test_memory.py). (QK-norm's rms_norm needs no correction: it
computes in fp32 and saves fp32 in the trace too.)
"""
import dataclasses
import os
from contextlib import nullcontext

import torch
from torch.nn import functional as F

from common import UserError
from model import GPT, GPTConfig, LayerNorm, RMSNorm

GIB = 2 ** 30
ADAM_STATES = 2  # exp_avg and exp_avg_sq per parameter; Muon keeps one momentum buffer for its matrices
# Bytes per logit that the loss holds at once in backward, outside a compiled 16-bit run: the saved log-softmax,
# its gradient and the logits' gradient, each fp32 (autocast computes the loss in fp32). Measured at 12.7, fp32
# and bf16 alike, at vocab 50304 on a CPU (tests/test_memory.py). Inductor's fused loss in bf16 holds less (the
# H100 figures in the same file); compiled in fp32 on a CPU it held as much.
LOSS_BACKWARD = 12


class FlashAttentionSaves(torch.autograd.Function):
    """What a fused attention kernel (flash or memory-efficient, as GPUs and CPUs run it) keeps for backward:
    q, k, v, the output and the log-sum-exp rows, never the T x T weights."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q.new_empty(*q.shape[:-1], v.size(-1))
        ctx.save_for_backward(q, k, v, out, q.new_empty(q.shape[:-1], dtype=torch.float32))
        return out


class FusedAttention(torch.overrides.TorchFunctionMode):
    """On the meta device attention always takes the math path, which saves the T x T weights; under this mode
    it saves what the fused kernels of real devices save instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            return FlashAttentionSaves.apply(*args[:3])
        return func(*args, **(kwargs or {}))


def saved_bytes(config: GPTConfig, batch_size: int, dtype: torch.dtype, fused_attention: bool) -> tuple[int, int]:
    """Bytes of the tensors that autograd saves in one training forward pass of (batch_size, block_size)
    tokens, traced on the meta device. Parameters and buffers are not counted: they exist anyway.
    fused_attention: whether the device's attention kernel is a fused one (see FusedAttention). Returns the
    total and the largest single tensor."""
    # the chunked loss saves its inputs and a float per row, whatever its chunk: traced as one chunk, not thousands
    chunk = batch_size * config.block_size if config.loss_chunk else 0
    with torch.device("meta"):
        model = GPT(dataclasses.replace(config, activation_checkpointing=False, loss_chunk=chunk)).to(dtype)
    model.train()
    own = {id(t) for t in (*model.parameters(), *model.buffers())}
    kept = {}  # id -> tensor, held so that ids stay unique; views are counted once, through their base
    wide, in_norm = set(), False  # ids of what the residual stream's norms save: fp32 in a real run

    def pack(t):
        base = t if t._base is None else t._base
        if id(base) not in own and id(t) not in own:
            kept[id(base)] = base
            if in_norm:
                wide.add(id(base))
        return t

    def enter_norm(*_):
        nonlocal in_norm
        in_norm = True

    def leave_norm(*_):
        nonlocal in_norm
        in_norm = False

    for module in model.modules():
        if isinstance(module, (LayerNorm, RMSNorm)):
            module.register_forward_pre_hook(enter_norm)
            module.register_forward_hook(leave_norm)
    idx = torch.zeros((batch_size, config.block_size), dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), FusedAttention() if fused_attention else nullcontext():
        model(idx, idx)
    sizes = [t.numel() * (max(4, t.element_size()) if i in wide else t.element_size()) for i, t in kept.items()]
    return sum(sizes), max(sizes)


def plan(model: GPT, batch_size: int, dtype: str, optimizer: str, world_size: int, parallelism: str,
         activation_checkpointing: bool, device_type: str, micro_steps: int = 1, fsdp_reduce: str = "micro_step",
         training: bool = True, compiled: bool = False, loss_chunk: int | None = None) -> dict:
    """Bytes per device: weights, gradients, DDP's gradient buckets, optimizer state and activations of one
    micro-batch (with checkpointing: each block's input, plus one block's full activations while it is
    recomputed), and their total. Weights, gradients and optimizer state are fp32 whatever dtype is: autocast
    computes in 16 bits from fp32 weights. Under FSDP each process holds 1/world_size of those three, plus
    the gathered weights of the block that runs and the next one (in the 16-bit dtype, so no autocast
    copies), and the root's (embeddings, final norm, head): FSDP2 gathers those for the whole forward and
    backward, and in training holds their whole gradient from the head's backward to the end. But with
    fsdp_reduce='step' and micro_steps > 1 (this process's micro-steps per step) train.py reduce-scatters only
    on the last, so until then it holds every gradient whole and every block's weights gathered.
    training=False plans an eval_only run instead: forward passes under no_grad, with nothing saved for
    backward (eval_activations). In 16 bits (not under FSDP) autocast keeps a 16-bit copy of every
    matmul's weight until its forward pass ends (its cache; and autograd saves them for backward):
    'weight_copies'. compiled: whether the model runs under torch.compile, whose fused loss holds less in
    backward in 16 bits (see LOSS_BACKWARD). loss_chunk: the training loss's rows per chunk, if not the
    model's own (check_fits tries one)."""
    config = model.config if loss_chunk is None else dataclasses.replace(model.config, loss_chunk=loss_chunk)
    n_params = sum(p.numel() for p in model.parameters())
    fp = getattr(torch, dtype)
    fsdp = world_size > 1 and parallelism == "fsdp"
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    root = n_params - config.n_layer * block  # outside the blocks: gathered with the root's FSDP unit
    matmuls = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    copies = matmuls * fp.itemsize if fp.itemsize == 2 and not fsdp else 0
    if not training:
        parts = {"weights": 4 * n_params // world_size if fsdp else 4 * n_params,
                 "gathered_blocks": 2 * block * fp.itemsize if fsdp else 0,
                 "gathered_root": root * fp.itemsize if fsdp else 0, "weight_copies": copies,
                 "activations": eval_activations(config, batch_size, fp)}
        return {**parts, "total": sum(parts.values())}
    fused = device_type == "cuda" or config.dropout == 0  # the CPU's fused kernel has no dropout: math path
    (one, largest), (two, _) = (saved_bytes(dataclasses.replace(config, n_layer=n), batch_size, fp, fused)
                                for n in (1, 2))
    per_block, rest = two - one, 2 * one - two
    logits = batch_size * config.block_size * config.vocab_size
    # backward holds gradients beside the activations it frees: about the largest activation's worth at a
    # time, twice that while a checkpointed block is recomputed (measured within 10% on a CPU, tests/test_memory.py)
    if activation_checkpointing:
        block_input = batch_size * config.block_size * config.n_embd * 4  # the residual stream stays fp32
        held, backward = rest + config.n_layer * block_input, per_block + 2 * largest
    else:
        held, backward = rest + config.n_layer * per_block, largest
    if config.loss_chunk:  # the chunked loss's logits exist a chunk at a time, with their gradient in backward
        held += 2 * min(config.loss_chunk, batch_size * config.block_size) * config.vocab_size * 4
        # and its backward sums the output matrix's gradient in fp32 beside each chunk's share of it
        backward = max(backward, 2 * config.vocab_size * config.n_embd * 4)
    else:
        if fp.itemsize == 2:  # autocast (CUDA's and the CPU's) keeps the log-softmax in fp32, not 16 bits
            held += logits * 2
        if not (compiled and fp.itemsize == 2):  # the loss's backward: its two gradients beside the log-softmax
            backward = max(backward, logits * (LOSS_BACKWARD - 4))
    activations = held + backward
    if optimizer == "muon":
        matrices = sum(p.numel() for n, p in model.named_parameters() if n.startswith("transformer.h.") and p.dim() == 2)
        state = 4 * (matrices + ADAM_STATES * (n_params - matrices))
    else:
        state = 4 * ADAM_STATES * n_params
    if fsdp:
        whole = micro_steps > 1 and fsdp_reduce == "step"
        parts = {"weights": 4 * n_params // world_size, "gradients": 4 * n_params // (1 if whole else world_size),
                 "gathered_blocks": (n_params if whole else 2 * block) * fp.itemsize,
                 "gathered_root": 0 if whole else 2 * root * fp.itemsize,  # whole: counted in the two above
                 "optimizer": state // world_size}
    else:
        parts = {"weights": 4 * n_params, "weight_copies": copies, "gradients": 4 * n_params,
                 "ddp_buckets": 4 * n_params if world_size > 1 else 0, "optimizer": state}
    parts["activations"] = activations
    return {**parts, "total": sum(parts.values())}


def eval_activations(config: GPTConfig, batch_size: int, fp: torch.dtype) -> int:
    """Bytes a forward pass under no_grad holds at its peak, beyond the weights: nothing is saved for backward,
    so the peak is one block's transients (the MLP's two hidden tensors, a few of the residual stream's) or, if
    larger, the logits (a loss_chunk's rows at a time, if set) with autocast's fp32 copy and the fp32
    log-softmax beside them (checked against the measured peak on a CPU, tests/test_memory.py)."""
    rows = batch_size * config.block_size
    per_logit = fp.itemsize + 4 + (4 if fp.itemsize == 2 else 0)
    logits = min(config.loss_chunk or rows, rows) * config.vocab_size * per_logit + 4 * rows * config.n_embd * 4
    in_block = 2 * rows * config.hidden * fp.itemsize + 6 * rows * config.n_embd * 4
    return max(logits, in_block)


def free_bytes(device: str, processes: int = 1) -> int | None:
    """Memory free for this process on device: the GPU's free memory, or the host's available memory (Linux)
    divided among the `processes` of this node that share it; None where it cannot be known."""
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0]
    host = host_memory()
    if torch.device(device).type == "cpu" and host is not None:
        return host["MemAvailable"] // processes
    return None


def host_memory() -> dict[str, int] | None:
    """/proc/meminfo's fields in bytes (MemAvailable, SwapFree, ...); None off Linux."""
    if not os.path.exists("/proc/meminfo"):
        return None
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(v.split()[0]) * (1024 if v.strip().endswith("kB") else 1) for k, v in fields.items()}


def check_host_fits(config: GPTConfig):
    """A UserError when the fp32 weights of a GPT of this config exceed the host's available memory and free swap
    together (Linux; elsewhere nothing is checked): the model is built there before it moves to its device, so such
    a model failed in torch's allocator with a traceback, before the plan (which then checks the rest). One copy
    against the whole host, so that every process of a node, reading it at its own moment while the others build
    theirs, comes to the same answer, and a run whose models only pass through swap on their way is not refused."""
    host = host_memory()
    if host is None:
        return
    free = host["MemAvailable"] + host.get("SwapFree", 0)
    with torch.device("meta"):  # shapes only: no memory, and the RNG streams untouched
        n_params = sum(p.numel() for p in GPT(config).parameters())
    if 4 * n_params > free:
        raise UserError(f"the model's weights take {4 * n_params / GIB:.2f} GiB in fp32 ({n_params / 1e9:.2f}B "
                        f"parameters), built in host memory before they move to the device, but the host has "
                        f"{free / GIB:.2f} GiB available (memory and swap): choose a smaller model (n_layer, n_embd, "
                        "mlp_hidden)")


def breakdown(parts: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v / GIB:.2f}" for k, v in parts.items() if k != "total" and v) + " GiB"


def describe(parts: dict, free: int | None) -> str:
    room = f" of {free / GIB:.2f} GiB free" if free is not None else ""
    return f"memory plan per device: {parts['total'] / GIB:.2f} GiB{room} ({breakdown(parts)})"


LOSS_CHUNK_HINT = 4096  # the loss_chunk check_fits tries: 4096 rows of 50304 fp32 logits are 0.77 GiB
AUTO_SHARE = 0.85  # batch_size='auto' plans into this share of the free memory: the plan is an estimate
AUTO_LIMIT = 1024  # and tries no micro-batch past this many sequences


def largest_batch(model: GPT, settings: dict, free: int) -> int | None:
    """batch_size='auto': the largest power-of-two micro-batch (up to AUTO_LIMIT) whose plan, made by
    plan(model, **settings) with that batch_size, fits in AUTO_SHARE of `free` bytes; None when not even 1 does."""
    best, batch = None, 1
    while batch <= AUTO_LIMIT and plan(model, **{**settings, "batch_size": batch})["total"] <= AUTO_SHARE * free:
        best, batch = batch, 2 * batch
    return best


def check_fits(parts: dict, free: int | None, model: GPT, settings: dict):
    """A UserError naming the changes that would fit when the plan (parts, made by plan(model, **settings)) is
    more than the free memory."""
    if free is None or parts["total"] <= free:
        return
    fits = lambda **change: plan(model, **{**settings, **change})["total"] <= free
    batch_size, world_size = settings["batch_size"], settings["world_size"]
    training = settings.get("training", True)
    fixes = []
    smaller = next((b for b in range(batch_size - 1, 0, -1)
                    if (batch_size % b == 0 or not training) and fits(batch_size=b)), None)
    if smaller and not training:
        fixes.append(f"--batch_size={smaller}")
    elif smaller:  # a divisor, so that raising the accumulation keeps the tokens per step exactly
        fixes.append(f"--batch_size={smaller} with gradient_accumulation_steps raised {batch_size // smaller}x (the "
                     "same tokens per step)")
    if training and not settings["activation_checkpointing"] and fits(activation_checkpointing=True):
        fixes.append("--activation_checkpointing=True")
    if training and not model.config.loss_chunk and fits(loss_chunk=LOSS_CHUNK_HINT):  # the logits never whole
        fixes.append(f"--loss_chunk={LOSS_CHUNK_HINT}")
    if world_size > 1 and settings["parallelism"] == "ddp" and fits(parallelism="fsdp"):
        fixes.append("--parallelism=fsdp")
    if world_size > 1 and settings["parallelism"] == "fsdp" and settings.get("fsdp_reduce") == "step" \
            and fits(fsdp_reduce="micro_step"):
        fixes.append("--fsdp_reduce=micro_step")
    hint = "; ".join(fixes) if fixes else "a smaller model, or more devices"
    raise UserError(f"this run needs about {parts['total'] / GIB:.2f} GiB per device but {free / GIB:.2f} GiB is "
                    f"free ({breakdown(parts)}): it would run out of memory. What fits: {hint}")


def no_auto_batch(model: GPT, settings: dict, free: int | None) -> str:
    """Why batch_size='auto' found no micro-batch (largest_batch gave None, settings as it took them): what would
    fit, as check_fits says it for a batch of 1, when not even that fits in the free memory; else the batch of 1
    fits, but not in AUTO_SHARE of it."""
    if free is None:
        return "batch_size='auto' needs the device's free memory, which is not known here: give --batch_size=N"
    one = {**settings, "batch_size": 1}
    try:
        check_fits(plan(model, **one), free, model, one)
    except UserError as e:
        return f"batch_size='auto' found no micro-batch that fits, not even 1 sequence: {e}"
    return (f"batch_size='auto' found no micro-batch that fits in {AUTO_SHARE:.0%} of the {free / GIB:.2f} GiB free (the "
            "plan is an estimate): --batch_size=1 fits in all of it, if barely")
