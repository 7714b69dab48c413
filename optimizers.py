"""
The optimizer step that train.py and bench.py both take, with the verdict on non-finite steps.

A step whose loss or gradient norm is NaN or inf on any rank is skipped on every rank. Reading that verdict
on the host costs a device sync per step, which stalls a GPU's queue; with a fused optimizer the verdict
can instead stay on the device, handed to the optimizer as `found_inf`: the fused kernel then leaves the
weights, moments and step count as they were, exactly as a skipped step does.
"""
import torch
import torch.distributed as dist


def nonfinite_flag(loss_sum: torch.Tensor, grad_norm: torch.Tensor, loss_scaling: bool, ddp: bool) -> torch.Tensor:
    """1.0 on the device when this step must be skipped on every rank (a non-finite loss anywhere, or a
    non-finite gradient norm where no fp16 GradScaler is there to handle it), else 0.0. No host sync: under
    DDP one small all-reduce, queued like any other kernel."""
    bad = ~torch.isfinite(loss_sum)
    if not loss_scaling:
        bad = bad | ~torch.isfinite(grad_norm)
    bad = bad.float()
    if ddp:
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
