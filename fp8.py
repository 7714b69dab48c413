"""
fp8 matmuls for training (train.py and bench.py --fp8=True). The blocks' Linear layers multiply in float8
through torch._scaled_mm, each operand with one scale per tensor taken from its current largest magnitude
(dynamic scaling, so no history to keep in checkpoints). Activations and weights are cast to e4m3 (more
precision), gradients to e5m2 (more range), the split of the FP8 formats paper (Micikevicius et al., 2022);
the products accumulate in fp32 and come out in the autocast dtype. Embeddings, norms and the output head
stay out of fp8, in the run's dtype: the head's logits are where low precision would cost the most.

The weights themselves are untouched (fp32 masters under the same names): checkpoints, resume, sampling
and export never know that fp8 was used. NVIDIA GPUs of compute capability 8.9 and up (Ada, Hopper) run
it in hardware; torch also runs it on CPUs, slowly, which is how the tests check its numbers.
"""
import torch
import torch.nn as nn

from common import UserError
from model import compute_dtype

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def check_fp8(device: str):
    """Refuse a device without fp8 matmuls, in one line, before anything is built."""
    kind = torch.device(device).type
    if kind == "cuda" and torch.cuda.get_device_capability(torch.device(device)) < (8, 9):
        name = torch.cuda.get_device_name(torch.device(device))
        raise UserError(f"fp8=True needs a GPU of compute capability 8.9 or more (H100, L4, RTX 4090), and {name} "
                        "has less: set --fp8=False")
    if kind not in ("cuda", "cpu"):
        raise UserError(f"fp8=True runs on CUDA GPUs (and slowly on CPUs), not on {kind}: set --fp8=False")


def to_fp8(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """t in the fp8 `dtype`, scaled so that its largest magnitude lands on the format's largest, and the
    reciprocal of that scale, which _scaled_mm multiplies back in."""
    limit = torch.finfo(dtype).max
    scale = limit / t.detach().abs().amax().float().clamp(min=1e-12)  # on the device: no sync
    return (t.float() * scale).clamp(-limit, limit).to(dtype), scale.reciprocal()


def column_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix laid out column by column: _scaled_mm wants its second operand that way."""
    return t.t().contiguous().t()


class Fp8Matmul(torch.autograd.Function):
    """x (M, K) @ weight (N, K).T in fp8, forward and backward. Only the fp8 copies are saved for backward,
    a quarter of fp32's memory."""

    @staticmethod
    def forward(ctx, x, weight, out_dtype):
        x8, x_inv = to_fp8(x, E4M3)
        w8, w_inv = to_fp8(weight, E4M3)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.dtypes = (x.dtype, weight.dtype)
        return torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, grad):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        g8, g_inv = to_fp8(grad.contiguous(), E5M2)
        grad_x = torch._scaled_mm(g8, column_major(w8), scale_a=g_inv, scale_b=w_inv, out_dtype=ctx.dtypes[0])
        grad_w = torch._scaled_mm(g8.t().contiguous(), column_major(x8), scale_a=g_inv, scale_b=x_inv,
                                  out_dtype=ctx.dtypes[1])
        return grad_x, grad_w, None


class Fp8Linear(nn.Linear):
    """nn.Linear whose matmul runs in fp8 (see Fp8Matmul); the bias is added in the output dtype."""

    def forward(self, x):
        out_dtype = compute_dtype(x)
        y = Fp8Matmul.apply(x.reshape(-1, x.size(-1)), self.weight, out_dtype)
        if self.bias is not None:
            y = y + self.bias.to(out_dtype)
        return y.view(*x.shape[:-1], self.out_features)


def use_fp8(model: nn.Module, tokens: int) -> int:
    """Turn the Linear layers inside the transformer blocks into Fp8Linear, in place, and return how many.
    Only the class changes, so parameters (and an optimizer already holding them) and state_dict names stay
    as they are. On GPUs _scaled_mm needs the sides of each matrix, and the tokens of a micro-batch (`tokens`,
    batch_size * block_size, the inner size of the weight gradient's matmul), to be multiples of 16."""
    if tokens % 16:
        raise UserError(f"fp8=True needs batch_size * block_size to be a multiple of 16, and it is {tokens}: change "
                        "batch_size or block_size, or set --fp8=False")
    layers = [(name, m) for name, m in model.transformer.h.named_modules() if type(m) is nn.Linear]
    for name, m in layers:
        if m.in_features % 16 or m.out_features % 16:
            raise UserError(f"fp8=True needs every matrix in the blocks to have sides that are multiples of 16, and "
                            f"h.{name} is {m.out_features} x {m.in_features}: change n_embd, n_head, n_kv_head or "
                            "mlp_hidden, or set --fp8=False")
    for _, m in layers:
        m.__class__ = Fp8Linear
    return len(layers)
