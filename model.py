"""
The GPT language model: one file, no dependencies beyond torch. GPT-2 by default; the GPTConfig fields from
`pos_emb` on switch parts to their LLaMA-era alternatives (rotary positions, RMSNorm, SwiGLU or ReLU^2,
grouped-query attention, QK-norm, untied embeddings) and size them, and the defaults are GPT-2 bit for bit.

Parameter names follow GPT-2's published checkpoints (transformer.h.0.attn.c_attn, ...) so that hf.py
copies OpenAI's weights in by name.
"""
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest sequence the model sees
    vocab_size: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers, as GPT-2 has; False is a bit faster and no worse
    loss_chunk: int = 0  # rows of logits per chunk in the training loss (see ChunkedCrossEntropy); 0: all at once
    activation_checkpointing: bool = False  # in training, keep only each block's input and recompute the rest in backward
    pos_emb: str = "learned"  # 'learned' (a position table, GPT-2) or 'rope' (rotary, applied to queries and keys)
    rope_theta: float = 10000.0  # RoPE's base: the longest wavelength in positions is about 2*pi*rope_theta
    norm: str = "layernorm"  # 'layernorm' or 'rmsnorm' (no mean, no bias)
    mlp: str = "gelu"  # 'gelu' (tanh approximation, GPT-2), 'swiglu' (LLaMA) or 'relu2' (ReLU squared)
    mlp_hidden: int = 0  # hidden width; 0: 4*n_embd, or for swiglu 2/3 of that rounded up to a multiple of 64
    n_kv_head: int = 0  # key/value heads, shared by groups of query heads (GQA); 0 means n_head (plain attention)
    qk_norm: bool = False  # RMS-normalise each head's queries and keys before attention
    tie_embeddings: bool = True  # the output projection is the token embedding matrix (GPT-2); False: its own

    def __post_init__(self):
        sizes = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")
        bad = [f"{k} {getattr(self, k)}" for k in sizes if getattr(self, k) < 1]
        bad += [f"{k} {getattr(self, k)}" for k in ("mlp_hidden", "n_kv_head", "loss_chunk") if getattr(self, k) < 0]
        if bad:
            raise ValueError(f"{', '.join(bad)}: {', '.join(sizes)} must be 1 or more, the others 0 or more")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout {self.dropout} is not in [0, 1)")
        if not 0 < self.rope_theta < math.inf:  # nan fails it too: rotary tables of nan, and no error
            raise ValueError(f"rope_theta {self.rope_theta} is not a positive finite number")
        choices = {"pos_emb": ("learned", "rope"), "norm": ("layernorm", "rmsnorm"), "mlp": ("gelu", "swiglu", "relu2")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} {getattr(self, key)!r} is not one of {allowed}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}: "
                             "pick n_embd = n_head * head size")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_kv_head {self.n_kv_head}")
        if self.pos_emb == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"rotary positions need an even head size, not {self.n_embd // self.n_head}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or default_hidden(self.n_embd, self.mlp)


def default_hidden(n_embd: int, mlp: str) -> int:
    """The MLP's hidden width when mlp_hidden is 0."""
    if mlp == "swiglu":  # three matrices instead of two: 2/3 of the width keeps the parameter count
        return 64 * math.ceil(8 * n_embd / 3 / 64)
    return 4 * n_embd


def said_one_way(args: dict) -> dict:
    """Model settings (GPTConfig's fields; a dict, unchecked) with the values that make the same model said one way,
    as a config file says them: n_kv_head equal to n_head is 0, mlp_hidden at its default width is 0, and rope_theta,
    which learned positions do not use, is its default. Two models are alike when these agree."""
    args = dict(args)
    if args["n_kv_head"] == args["n_head"]:
        args["n_kv_head"] = 0
    if args["mlp_hidden"] == default_hidden(args["n_embd"], args["mlp"]):
        args["mlp_hidden"] = 0
    if args["pos_emb"] != "rope":
        args["rope_theta"] = GPTConfig.rope_theta
    return args


class LayerNorm(nn.Module):
    """LayerNorm whose bias can be switched off (nn.LayerNorm's bias flag is all-or-nothing per version)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class RMSNorm(nn.Module):
    def __init__(self, ndim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, 1e-5)


def norm(config: GPTConfig) -> nn.Module:
    return RMSNorm(config.n_embd) if config.norm == "rmsnorm" else LayerNorm(config.n_embd, bias=config.bias)


def rope_tables(config: GPTConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, (length, head size): the two halves of a head rotate in pairs
    (i, i + hs/2) at frequencies rope_theta^(-2i/hs), the layout Hugging Face's LLaMA uses."""
    hs = config.n_embd // config.n_head
    freqs = config.rope_theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), freqs)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate(x, cos, sin):
    """Rotate each pair (x_i, x_{i+hs/2}) of x (B, heads, T, hs) by its position's angle."""
    half = x.size(-1) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


# The attention kernels scaled_dot_product_attention may use, for GPT.prefer_attention: (kernels, whether their order
# is the order to try them in). 'auto' is torch's own choice: in recent releases cuDNN's kernel first on Hopper and
# Blackwell with a cuDNN newer than 9.15, elsewhere FlashAttention first. 'flash' turns cuDNN's kernel off, so
# FlashAttention runs where it serves the shape. 'cudnn' tries cuDNN's kernel first and the rest after it. (torch
# settles its own order at the first attention call on CUDA, and a 'cudnn' model run before any other in a process
# leaves the unsettled order, FlashAttention first, to the 'auto' models after it: bench.py times 'auto' first.)
ATTENTION_KERNELS = {"auto": None,
                     "flash": ([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], False),
                     "cudnn": ([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                SDPBackend.MATH, SDPBackend.OVERRIDEABLE], True)}


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.kernels = None  # a value of ATTENTION_KERNELS, None for torch's choice (set by GPT.prefer_attention)
        self.n_head, self.n_kv_head, self.hs = config.n_head, config.kv_heads, config.n_embd // config.n_head
        # q, k, v in one matmul; with GQA the k and v parts are n_kv_head heads wide
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.hs, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.qk_norm = config.qk_norm

    def forward(self, x, rope=None, cache: dict | None = None):
        """rope: (cos, sin) for these T positions, or None. cache: this layer's keys and values so far, for
        generation; they are extended by this call's (prefill: an empty dict and the whole prompt; then one
        token per call)."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split([self.n_head * self.hs, self.n_kv_head * self.hs, self.n_kv_head * self.hs], dim=2)
        q = q.view(B, T, self.n_head, self.hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, self.hs).transpose(1, 2)  # (B, n_kv_head, T, hs)
        v = v.view(B, T, self.n_kv_head, self.hs).transpose(1, 2)
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.hs,)), F.rms_norm(k, (self.hs,))
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        causal = not cache  # no cache, or prefill: the causal mask (a Python bool, also under dynamic shapes)
        if cache is not None:
            if cache and T > 1:
                raise ValueError("a KV cache takes a prompt once, then one token per call")
            if cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        if self.n_kv_head != self.n_head:  # each group of query heads reads the same key/value head
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        # flash attention where the device has it; the causal mask is built in, never materialised. One new
        # token against a filled cache attends to every key, so it needs no mask.
        with nullcontext() if self.kernels is None else sdpa_kernel(self.kernels[0], set_priority=self.kernels[1]):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=causal)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.kind = config.mlp
        width = 2 * config.hidden if config.mlp == "swiglu" else config.hidden  # swiglu: gate and value in one matmul
        self.c_fc = nn.Linear(config.n_embd, width, bias=config.bias)
        self.c_proj = nn.Linear(config.hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = self.c_fc(x)
        if self.kind == "gelu":
            h = F.gelu(h, approximate="tanh")  # GPT-2 was trained with the tanh approximation
        elif self.kind == "relu2":
            h = F.relu(h)
            h = h * h  # not square(): that is pow, which CUDA's autocast runs in fp32, doubling this activation
        else:
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """Pre-norm transformer block: the residual stream is never normalised, only what branches off it."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, cache=None):
        x = x + self.attn(self.ln_1(x), rope, cache)
        x = x + self.mlp(self.ln_2(x))
        return x


# the device types autocast serves (the meta device, which memory.py traces on, is not one): asked once here,
# because torch.compile of torch 2.11 cannot trace torch.amp.is_autocast_available and breaks the graph at
# each call (one break per fp8 matmul, and the chunked loss left eager)
AUTOCAST_DEVICES = frozenset(d for d in ("cpu", "cuda", "mps", "xpu") if torch.amp.is_autocast_available(d))


def no_autocast(device_type: str):
    """Autocast switched off on devices that have it."""
    return torch.autocast(device_type, enabled=False) if device_type in AUTOCAST_DEVICES else nullcontext()


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of t runs in here: autocast's where it is on for t's device, else t's own. For code
    that turns autocast off and casts by hand (the chunked loss, fp8.py)."""
    device_type = t.device.type
    on = device_type in AUTOCAST_DEVICES and torch.is_autocast_enabled(device_type)
    return torch.get_autocast_dtype(device_type) if on else t.dtype


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits = h @ weight.T against targets (-1 ignored), computed `chunk` rows at a
    time and recomputed in the backward pass, so the (rows, vocab) logits, in fp32 the largest tensor of a
    GPT-2 step, never exist whole. Matmuls run in the autocast dtype when autocast is on; the softmax in
    fp32 (or the inputs' dtype, if wider)."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk: int):
        dtype = compute_dtype(h)
        wide = torch.promote_types(h.dtype, torch.float32)
        with no_autocast(h.device.type):
            hc, wc = h.to(dtype), weight.to(dtype)
            lse = torch.empty(h.size(0), dtype=wide, device=h.device)
            total = torch.zeros((), dtype=wide, device=h.device)
            for s in range(0, h.size(0), chunk):
                logits = (hc[s:s + chunk] @ wc.t()).to(wide)
                lse[s:s + chunk] = torch.logsumexp(logits, dim=-1)
                t = targets[s:s + chunk]
                picked = logits.gather(1, t.clamp(min=0)[:, None])[:, 0]
                total += ((lse[s:s + chunk] - picked) * (t != -1)).sum()
                del logits  # else it lives on while the next chunk's logits are made: a chunk more at the peak
        count = (targets != -1).sum().clamp(min=1)
        ctx.save_for_backward(h, weight, targets, lse, count)
        ctx.chunk, ctx.dtype = chunk, dtype
        return total / count

    @staticmethod
    def backward(ctx, grad):
        h, weight, targets, lse, count = ctx.saved_tensors
        with no_autocast(h.device.type):
            hc, wc = h.to(ctx.dtype), weight.to(ctx.dtype)
            grad_h = torch.empty_like(h)
            grad_w = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device)
            scale = grad / count
            for s in range(0, h.size(0), ctx.chunk):
                t = targets[s:s + ctx.chunk]
                # d loss / d logits = softmax - onehot(target), per kept row, times the upstream gradient
                # in place, and freed before the next chunk's: one chunk of fp32 logits at a time, as memory.py plans
                dlogits = (hc[s:s + ctx.chunk] @ wc.t()).to(lse.dtype).sub_(lse[s:s + ctx.chunk, None]).exp_()
                dlogits.scatter_add_(1, t.clamp(min=0)[:, None], torch.full_like(dlogits[:, :1], -1.0))
                dlogits = dlogits.mul_((t != -1)[:, None] * scale).to(ctx.dtype)
                grad_h[s:s + ctx.chunk] = (dlogits @ wc).to(h.dtype)
                grad_w += (dlogits.t() @ hc[s:s + ctx.chunk]).to(lse.dtype)
                del dlogits
        return grad_h, grad_w.to(weight.dtype), None, None


def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """logits (B, V) with -inf for all but the fewest most likely tokens whose probabilities add up to top_p: a
    token is dropped when the tokens more likely than it already hold top_p, so the most likely always stays."""
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = F.softmax(ordered.float(), dim=-1)  # summed in fp32 whatever the logits' type
    before = probs.cumsum(dim=-1) - probs  # the mass of the tokens ahead of each
    drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= top_p)  # back in vocabulary order
    return logits.masked_fill(drop, -float("inf"))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            **({"wpe": nn.Embedding(config.block_size, config.n_embd)} if config.pos_emb == "learned" else {}),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=norm(config),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:  # the input embedding and the output projection are one matrix
            self.lm_head.weight = self.transformer.wte.weight
        if config.pos_emb == "rope":  # computed, not learned: buffers that checkpoints need not hold
            cos, sin = rope_tables(config, config.block_size)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        """GPT-2 init: N(0, 0.02) for Linear and Embedding weights, zero biases; LayerNorms start as identity.
        The residual projections (c_proj) are then rescaled by 1/sqrt(2 * n_layer) in __init__, because each
        block adds two of them to the residual stream and its variance would otherwise grow with depth."""
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count. non_embedding leaves out the tables that are only looked up, never multiplied:
        the position table, and the token table when it is not also the output projection. What is left
        is the count of matmul weights that estimate_mfu needs (norms and biases are a rounding error)."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if "wpe" in self.transformer:
                n_params -= self.transformer.wpe.weight.numel()
            if not self.config.tie_embeddings:
                n_params -= self.transformer.wte.weight.numel()
        return n_params

    def parameters_text(self) -> str:
        """The count the scripts print: every parameter (as export.py's transformers model counts them), then,
        when fewer, the multiplied ones that get_num_params gives (nanoGPT's printed count, the N of MFU)."""
        counts = (self.get_num_params(non_embedding=False), self.get_num_params())
        total, multiplied = (f"{n / 1e6:.2f}M" for n in counts)
        return f"{total} parameters" + (f" ({multiplied} without the embedding tables that are only looked up)"
                                        if multiplied != total else "")

    def forward(self, idx, targets=None, kv_cache: list[dict] | None = None, all_logits: bool = False):
        """Logits and loss of idx (B, T). With targets, the mean cross-entropy over all positions; without,
        the logits of the last position only, or of every position with all_logits (for scoring). kv_cache
        (one dict per layer, see generate) continues a sequence: idx then holds the new tokens, placed after
        the cached ones."""
        B, T = idx.size()
        start = kv_cache[0]["k"].size(2) if kv_cache and kv_cache[0] else 0  # positions already cached
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size {self.config.block_size}")
        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(start, start + T, dtype=torch.long, device=idx.device))
        else:
            rope = (self.rope_cos[start:start + T], self.rope_sin[start:start + T])
        x = self.transformer.drop(x)
        recompute = self.config.activation_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.transformer.h):
            if recompute:  # the RNG state is restored for the recomputation, so dropout masks repeat exactly
                x = checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope, kv_cache[i] if kv_cache is not None else None)
        x = self.transformer.ln_f(x)
        if targets is not None and self.config.loss_chunk > 0:  # the loss without the full logits, which are not returned
            logits = None
            loss = ChunkedCrossEntropy.apply(x.reshape(B * T, -1), self.lm_head.weight, targets.reshape(-1),
                                             self.config.loss_chunk)
        elif targets is not None:
            logits = self.lm_head(x)  # (B, T, vocab_size)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        else:
            # generation needs only the last position: (B, 1, vocab_size)
            logits = self.lm_head(x if all_logits else x[:, [-1], :])
            loss = None
        return logits, loss

    def prefer_attention(self, kernel: str):
        """Which attention kernel to run, a key of ATTENTION_KERNELS; before torch.compile, which bakes the choice
        into its graph. The arithmetic is the same; the kernels round differently."""
        for block in self.transformer.h:
            block.attn.kernels = ATTENTION_KERNELS[kernel]

    def crop_block_size(self, block_size: int):
        """Shrink the context length, e.g. to finetune GPT-2 (1024) with a smaller block_size."""
        if block_size > self.config.block_size:
            raise ValueError(f"cannot grow block_size from {self.config.block_size} to {block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            # a copy: a view would keep the whole table's storage alive, and torch.save writes all of it
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())
            self.transformer.wpe.num_embeddings = block_size
        else:
            self.rope_cos, self.rope_sin = self.rope_cos[:block_size], self.rope_sin[:block_size]

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                             device_type: str) -> torch.optim.AdamW:
        """AdamW with weight decay on matrices (matmul weights, embeddings) only; biases and norms are not decayed."""
        params = [p for p in self.parameters() if p.requires_grad]  # parameters() yields the tied matrix once
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        # the fused kernel does the whole update in a few launches; CUDA and CPU have it
        fused = device_type in ("cuda", "cpu")
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self) -> int:
        """Training FLOPs per token, as in the PaLM paper, appendix B: 6N for the matmuls forward and backward
        (N from get_num_params, so GQA's narrower keys and values, SwiGLU's third matrix and an untied head
        count as they are), plus 12 * n_layer * n_embd * T for attention (Q @ K^T and A @ V, forward and
        backward, per query head: GQA shares keys and values, not this work)."""
        cfg = self.config
        return 6 * self.get_num_params() + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size

    def estimate_mfu(self, tokens_per_iter: int, dt: float, peak: float | None) -> float | None:
        """Model FLOPs utilisation: achieved FLOP/s (flops_per_token) over `peak` (None where it is unknown)."""
        if peak is None:
            return None
        return self.flops_per_token() * tokens_per_iter / dt / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, use_cache: bool = True, n_tokens: int | None = None,
                 top_p: float = 1.0):
        """Extend the token ids idx (B, T) by max_new_tokens tokens, sampled at `temperature` among the top_k
        most likely (all when None) and, of those, the fewest most likely whose probabilities add up to top_p
        (nucleus sampling; 1.0 keeps them all); temperature 0 takes the most likely token (greedy decoding). n_tokens: only
        ids below it are sampled (the tokenizer's; a vocabulary padded past it has rows no text decodes). Put the
        model in eval mode first.

        With use_cache, the prompt is read once and each new token attends to the keys and values kept from
        before (a KV cache): the same tokens as without it, far fewer FLOPs. Once the sequence outgrows
        block_size, every position of the window would move, so each further token re-reads the last
        block_size tokens, as without the cache: still exact, no longer faster.

        Logits of nan or +inf (damaged weights, or float16 overflowing) raise FloatingPointError at the end,
        rather than sampling token 0 or stopping the process inside torch.multinomial."""
        if idx.dim() != 2:
            problems = [f"idx of shape {tuple(idx.shape)}"]
        else:
            problems = [] if idx.size(1) else ["prompt length 0"]
        limits = (("max_new_tokens", max_new_tokens, 0), ("top_k", top_k, 1), ("n_tokens", n_tokens, 1))
        problems += [f"{name} {value}" for name, value, low in limits if value is not None and value < low]
        if not temperature >= 0:  # nan too
            problems.append(f"temperature {temperature}")
        if not 0 < top_p <= 1:
            problems.append(f"top_p {top_p}")
        if problems:
            raise ValueError(f"generate got {', '.join(problems)}: it takes idx of shape (B, T) with T >= 1, "
                             "max_new_tokens >= 0, temperature >= 0, 0 < top_p <= 1, and top_k and n_tokens of 1 or "
                             "more (or None)")
        cache = None
        finite = torch.ones((), dtype=torch.bool, device=idx.device)  # read once, at the end: per token, it would wait
        for _ in range(max_new_tokens):
            if not use_cache or idx.size(1) > self.config.block_size:
                logits, _ = self(idx[:, -self.config.block_size:])
            elif cache is None:
                cache = [{} for _ in self.transformer.h]
                logits, _ = self(idx, kv_cache=cache)  # prefill: the whole prompt at once
            else:
                logits, _ = self(idx[:, -1:], kv_cache=cache)
            logits = logits[:, -1, :n_tokens]
            finite &= (logits < math.inf).all()  # no nan or +inf; a -inf (float16's floor) has probability 0 anyway
            logits = logits.nan_to_num()  # whatever is sampled now is thrown away below
            if temperature < torch.finfo(logits.dtype).tiny:  # 0, or so small that dividing by it is dividing by 0
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                # shifted so the largest is 0 first: a tiny temperature then sends the rest to -inf, never to nan
                logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                if top_p < 1:
                    logits = nucleus(logits, top_p)
                probs = F.softmax(logits, dim=-1)
                idx_next = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, idx_next), dim=1)
        if not finite:
            raise FloatingPointError("the model's logits were nan or inf while generating: its weights are damaged, "
                                     "or overflow the dtype (float16 holds values up to 65504)")
        return idx
