"""
The optimizers (AdamW through model.configure_optimizers, and Muon) and the step that train.py and bench.py
both take, with the verdict on non-finite steps.

A step whose loss or gradient norm is NaN or inf on any rank is skipped on every rank. Reading that verdict
on the host costs a device sync per step, which stalls a GPU's queue; with a fused optimizer the verdict
can instead stay on the device, handed to the optimizer as `found_inf`: the fused kernel then leaves the
weights, moments and step count as they were, exactly as a skipped step does.
"""
import torch
import torch.distributed as dist

from sharding import is_dtensor, like


def nonfinite_flag(loss_sum: torch.Tensor, grad_norm: torch.Tensor, loss_scaling: bool, distributed: bool) -> torch.Tensor:
    """1.0 on the device when this step must be skipped on every rank (a non-finite loss anywhere, or a
    non-finite gradient norm where no fp16 GradScaler is there to handle it), else 0.0. No host sync: under
    DDP one small all-reduce, queued like any other kernel."""
    bad = ~torch.isfinite(loss_sum)
    if not loss_scaling:
        bad = bad | ~torch.isfinite(grad_norm)
    bad = bad.float()
    if distributed:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bad


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer can take the skip verdict as a device tensor (the fused Adam and AdamW kernels)."""
    return bool(optimizer.defaults.get("fused")) and getattr(optimizer, "_step_supports_amp_scaling", False)


def take_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, skip: torch.Tensor, on_device: bool):
    """Apply the step unless `skip` (from nonfinite_flag), then clear the gradients. With fp16 the GradScaler
    skips steps whose gradients overflowed, as usual. on_device keeps the verdict on the device (see the
    module docstring); otherwise it is read on the host, one sync."""
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
    elif on_device:
        optimizer.found_inf = skip  # read by the fused kernel, which skips the update where it is nonzero
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not skip.item():
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ---- Muon

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic: pushes singular values into about [0.7, 1.2] in 5 steps


def orthogonalize(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The orthogonal factor U V^T of G = U S V^T, approximately, by a quintic Newton-Schulz iteration: every
    singular value moves towards 1 and the singular vectors stay. Runs in bf16 on a GPU (the iteration
    tolerates it), in fp32 elsewhere."""
    a, b, c = NS_COEFFS
    X = G.to(torch.bfloat16 if G.is_cuda else torch.float32)
    tall = X.size(0) > X.size(1)
    if tall:  # iterate on the smaller Gram matrix
        X = X.t()
    X = X / (X.norm() + 1e-7)  # the spectral norm is at most the Frobenius norm: singular values now <= 1
    for _ in range(steps):
        A = X @ X.t()
        X = a * X + (b * A + c * A @ A) @ X
    return (X.t() if tall else X).to(G.dtype)


class Muon(torch.optim.Optimizer):
    """Muon (momentum, then orthogonalised) for the 2-D matrices of the transformer blocks, and AdamW for the
    rest (embeddings, an untied head, norms, biases), as modded-nanogpt and nanochat split them. A group with
    muon=True takes Muon's update, scaled by sqrt(max(1, rows/cols)) so that every matrix moves by a similar
    RMS; the others take AdamW's. A group's weight_decay is decoupled (p *= 1 - lr * weight_decay); muon_groups
    gives Muon's matrices none. One optimizer, so its state_dict is the checkpoint's. Under DDP every rank
    computes the same update from the same averaged gradient; under FSDP every rank gathers each matrix's
    update, orthogonalises it whole and keeps its own rows."""

    def __init__(self, param_groups: list[dict], lr: float, momentum: float = 0.95, betas=(0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(param_groups, dict(lr=lr, momentum=momentum, betas=betas, eps=eps,
                                            weight_decay=weight_decay, muon=False))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                if group["muon"]:
                    if not state:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    buf = state["momentum_buffer"]
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    update = p.grad.lerp(buf, group["momentum"])  # Nesterov: look one momentum step ahead
                    if is_dtensor(update):  # FSDP: every rank orthogonalises the whole matrix, keeps its shard
                        update = like(orthogonalize(update.full_tensor()), update)
                    else:
                        update = orthogonalize(update)
                    scale = max(1.0, p.size(0) / p.size(1)) ** 0.5
                    p.add_(update, alpha=-group["lr"] * scale)
                else:
                    if not state:
                        state["step"] = torch.zeros((), dtype=torch.float32)
                        state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                    beta1, beta2 = group["betas"]
                    state["step"] += 1
                    step = state["step"].item()
                    state["exp_avg"].lerp_(p.grad, 1 - beta1)
                    state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                    denom = (state["exp_avg_sq"] / (1 - beta2 ** step)).sqrt_().add_(group["eps"])
                    p.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - beta1 ** step))


def muon_groups(model: torch.nn.Module, weight_decay: float, learning_rate: float, muon_lr: float) -> list[dict]:
    """Muon's parameter groups for a GPT: the blocks' matrices (muon), then AdamW's decayed matrices (the
    embeddings, an untied head) and undecayed vectors (norms, biases). lr_scale is each group's learning rate
    over learning_rate, which train.py's schedule multiplies."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # a tied matrix is named once
    hidden = [p for n, p in named if p.dim() == 2 and n.startswith("transformer.h.")]
    other = [p for n, p in named if not (p.dim() == 2 and n.startswith("transformer.h."))]
    return [dict(params=hidden, muon=True, lr=muon_lr, lr_scale=muon_lr / learning_rate, weight_decay=0.0),
            dict(params=[p for p in other if p.dim() >= 2], lr=learning_rate, weight_decay=weight_decay),
            dict(params=[p for p in other if p.dim() < 2], lr=learning_rate, weight_decay=0.0)]


def build_optimizer(model, kind: str, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                    muon_lr: float, muon_momentum: float, device_type: str) -> torch.optim.Optimizer:
    """The optimizer a run's settings name: 'adamw' (model.configure_optimizers: fused where the device has
    it) or 'muon' (Muon for the blocks' matrices, AdamW for the rest)."""
    if kind == "muon":
        return Muon(muon_groups(model, weight_decay, learning_rate, muon_lr), lr=learning_rate,
                    momentum=muon_momentum, betas=betas)
    return model.configure_optimizers(weight_decay, learning_rate, betas, device_type)
