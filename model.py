"""
The GPT-2 language model: one file, no dependencies beyond torch.

Parameter names follow GPT-2's published checkpoints (transformer.h.0.attn.c_attn, ...) so that
`GPT.from_pretrained` can copy OpenAI's weights in by name.
"""
import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest sequence the position table covers
    vocab_size: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers, as GPT-2 has; False is a bit faster and no worse
    loss_chunk: int = 0  # rows of logits per chunk in the training loss (see ChunkedCrossEntropy); 0: all at once


class LayerNorm(nn.Module):
    """LayerNorm whose bias can be switched off (nn.LayerNorm's bias flag is all-or-nothing per version)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.n_embd % config.n_head != 0:
            raise ValueError(f"n_embd {config.n_embd} is not a multiple of n_head {config.n_head}: "
                             "pick n_embd = n_head * head size")
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        # flash attention where the device has it; the causal mask is built in, never materialised
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2 was trained with the tanh approximation
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: the residual stream is never normalised, only what branches off it."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits = h @ weight.T against targets (-1 ignored), computed `chunk` rows at a
    time and recomputed in the backward pass, so the (rows, vocab) logits, in fp32 the largest tensor of a
    GPT-2 step, never exist whole. Matmuls run in the autocast dtype when autocast is on; the softmax in
    fp32 (or the inputs' dtype, if wider)."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk: int):
        device_type = h.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else h.dtype
        wide = torch.promote_types(h.dtype, torch.float32)
        with torch.autocast(device_type, enabled=False):
            hc, wc = h.to(dtype), weight.to(dtype)
            lse = torch.empty(h.size(0), dtype=wide, device=h.device)
            total = torch.zeros((), dtype=wide, device=h.device)
            for s in range(0, h.size(0), chunk):
                logits = (hc[s:s + chunk] @ wc.t()).to(wide)
                lse[s:s + chunk] = torch.logsumexp(logits, dim=-1)
                t = targets[s:s + chunk]
                picked = logits.gather(1, t.clamp(min=0)[:, None])[:, 0]
                total += ((lse[s:s + chunk] - picked) * (t != -1)).sum()
        count = (targets != -1).sum().clamp(min=1)
        ctx.save_for_backward(h, weight, targets, lse, count)
        ctx.chunk, ctx.dtype = chunk, dtype
        return total / count

    @staticmethod
    def backward(ctx, grad):
        h, weight, targets, lse, count = ctx.saved_tensors
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(ctx.dtype), weight.to(ctx.dtype)
            grad_h = torch.empty_like(h)
            grad_w = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device)
            scale = grad / count
            for s in range(0, h.size(0), ctx.chunk):
                t = targets[s:s + ctx.chunk]
                # d loss / d logits = softmax - onehot(target), per kept row, times the upstream gradient
                dlogits = torch.exp((hc[s:s + ctx.chunk] @ wc.t()).to(lse.dtype) - lse[s:s + ctx.chunk, None])
                dlogits.scatter_add_(1, t.clamp(min=0)[:, None], torch.full_like(dlogits[:, :1], -1.0))
                dlogits = (dlogits * ((t != -1)[:, None] * scale)).to(ctx.dtype)
                grad_h[s:s + ctx.chunk] = (dlogits @ wc).to(h.dtype)
                grad_w += (dlogits.t() @ hc[s:s + ctx.chunk]).to(lse.dtype)
        return grad_h, grad_w.to(weight.dtype), None, None


PRETRAINED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's GPT-2 sizes on the Hugging Face hub


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: the input embedding and the output projection are one matrix
        self.lm_head.weight = self.transformer.wte.weight
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
        """Parameter count. The position table is left out by default; the token table is counted
        because, tied to lm_head, it is used as weights in the last layer."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def forward(self, idx, targets=None):
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None and self.config.loss_chunk > 0:  # the loss without the full logits, which are not returned
            logits = None
            loss = ChunkedCrossEntropy.apply(x.reshape(B * T, -1), self.lm_head.weight, targets.reshape(-1),
                                             self.config.loss_chunk)
        elif targets is not None:
            logits = self.lm_head(x)  # (B, T, vocab_size)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # generation needs only the last position: (B, 1, vocab_size)
            loss = None
        return logits, loss

    def crop_block_size(self, block_size: int):
        """Shrink the context length, e.g. to finetune GPT-2 (1024) with a smaller block_size."""
        if block_size > self.config.block_size:
            raise ValueError(f"cannot grow block_size from {self.config.block_size} to {block_size}")
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    @classmethod
    def from_pretrained(cls, model_type: str, override_args: dict | None = None) -> "GPT":
        """GPT-2 weights through Hugging Face transformers: 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl',
        or a local directory written by transformers' save_pretrained. Only dropout may be overridden."""
        override_args = override_args or {}
        if set(override_args) - {"dropout"}:
            raise ValueError(f"from_pretrained can only override dropout, not {sorted(set(override_args) - {'dropout'})}")
        if model_type not in PRETRAINED and not os.path.isdir(model_type):
            raise ValueError(f"unknown pretrained model '{model_type}': use {', '.join(PRETRAINED)} or a folder "
                            "saved by transformers' save_pretrained")
        try:
            from transformers import GPT2LMHeadModel
        except ImportError:
            raise ImportError("loading GPT-2 weights needs Hugging Face transformers: pip install transformers") from None
        try:
            hf_model = GPT2LMHeadModel.from_pretrained(model_type)
        except OSError as e:  # no network, no such folder, or a folder without the weights
            raise OSError(f"could not load GPT-2 weights '{model_type}' ({e.__class__.__name__}): without network "
                            "access, save them on a machine that has it (GPT2LMHeadModel.from_pretrained(name)"
                            ".save_pretrained(folder)) and pass that folder as init_from") from e
        hf = hf_model.config
        config = GPTConfig(block_size=hf.n_positions, vocab_size=hf.vocab_size, n_layer=hf.n_layer,
                           n_head=hf.n_head, n_embd=hf.n_embd, bias=True, dropout=override_args.get("dropout", 0.0))
        model = GPT(config)
        sd = model.state_dict()
        sd_hf = {k: v for k, v in hf_model.state_dict().items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
        if set(sd) != set(sd_hf):
            raise ValueError(f"checkpoint keys differ from the model's: missing {sorted(set(sd) - set(sd_hf))[:5]}, "
                             f"unexpected {sorted(set(sd_hf) - set(sd))[:5]}")
        # GPT-2 stores these as Conv1D, i.e. (in, out); nn.Linear wants (out, in)
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        with torch.no_grad():
            for k, v in sd_hf.items():
                sd[k].copy_(v.t() if k.endswith(transposed) else v)
        return model

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

    def estimate_mfu(self, tokens_per_iter: int, dt: float, peak: float | None) -> float | None:
        """Model FLOPs utilisation: achieved FLOP/s over `peak` (None where the peak is unknown).
        FLOPs per token follow the PaLM paper, appendix B: 6N for the matmuls forward and backward,
        plus 12 * n_layer * n_embd * T for attention (Q @ K^T and A @ V, forward and backward)."""
        if peak is None:
            return None
        cfg = self.config
        flops_per_token = 6 * self.get_num_params() + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
        return flops_per_token * tokens_per_iter / dt / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None):
        """Extend the token ids idx (B, T) by max_new_tokens tokens, sampled at `temperature` among the top_k
        most likely (all when None); temperature 0 takes the most likely token (greedy decoding). Put the
        model in eval mode first."""
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            if temperature == 0:
                idx_next = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            else:
                logits = logits[:, -1, :] / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                probs = F.softmax(logits, dim=-1)
                idx_next = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
