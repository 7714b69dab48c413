"""
FSDP2 for a GPT, and the one checkpoint layout whatever the parallelism.

`shard` wraps each transformer block, then the whole model, with torch.distributed.fsdp.fully_shard: every
process keeps 1/world_size of each weight, gradient and optimizer moment (as DTensors), and a block's
weights are gathered just before it runs and freed after. Checkpoints hold the full, unsharded state in
the same format as a single process or DDP writes (`full_state` gathers it; `load_state` takes each
process's shard of it), so a run can resume as FSDP, DDP or one process, on any number of processes. The
cost is one gather of the state per save, tensor by tensor into rank 0's CPU memory;
torch.distributed.checkpoint would write shards in parallel, but its folder of files would no longer be the
ckpt.pt that sample.py, export.py and every resume path read.
"""
import sys

import torch


def shard(model: torch.nn.Module, dtype: str):
    """Shard model in place, from rank 0's weights: each block, then the root (embeddings, final norm, head).
    With a 16-bit dtype the
    gathered weights compute in that type while gradients are reduced in fp32 and the sharded master weights
    stay fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.no_grad():  # every rank starts from rank 0's weights, as DDP makes them at its wrap (ranks seed apart)
        for p in model.parameters():
            torch.distributed.broadcast(p, src=0)
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32) \
        if dtype != "float32" else MixedPrecisionPolicy()
    for block in model.transformer.h:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def is_dtensor(t) -> bool:
    """Whether t is a DTensor (an FSDP shard), without importing torch.distributed.tensor, which costs most of a
    second at every start-up: until something imports it, no DTensor exists."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def full(t):
    """The whole tensor behind a DTensor shard (a collective: every rank calls it), or t itself."""
    return t.full_tensor() if is_dtensor(t) else t


def like(value, param):
    """value, a full tensor, as param holds it: this rank's shard when param is a DTensor, else as it is."""
    if is_dtensor(param) and isinstance(value, torch.Tensor) and value.shape == param.shape:
        from torch.distributed.tensor import distribute_tensor
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
    return value


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, keep: bool) -> tuple[dict, dict]:
    """The model's and the optimizer's state_dict with every shard gathered: what a checkpoint holds. A
    collective under FSDP (every rank calls it); the plain state_dicts otherwise. Under FSDP each gathered
    tensor goes to the CPU at once, kept only where `keep` (the rank that writes it; the others get None in
    its place): whole on every GPU at once, weights and moments would need 12 more bytes per parameter there."""
    def gathered(t):
        if not is_dtensor(t):
            return t
        whole = t.full_tensor()
        return whole.cpu() if keep else None

    first = {}  # every name of a parameter -> its first: a tied weight (wte and lm_head) is gathered and kept once,
    seen = {}   # as a plain state_dict shares it (named by structure, so every rank makes the same gathers)
    for name, p in model.named_parameters(remove_duplicate=False):
        first[name] = seen.setdefault(id(p), name)
    model_state = {}
    for k, v in model.state_dict().items():
        model_state[k] = model_state[first[k]] if first.get(k, k) != k else gathered(v)
    optimizer_state = optimizer.state_dict()
    optimizer_state = {**optimizer_state, "state": {i: {k: gathered(v) for k, v in s.items()}
                                                    for i, s in optimizer_state["state"].items()}}
    return model_state, optimizer_state


def load_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, model_state: dict,
               optimizer_state: dict | None):
    """Load full states (as full_state returns them) into a model and optimizer, sharded or not."""
    own = model.state_dict()
    model.load_state_dict({k: like(v, own[k]) if k in own else v for k, v in model_state.items()})
    if optimizer is not None and optimizer_state is not None:
        load_optimizer_state(optimizer, optimizer_state)


def load_optimizer_state(optimizer: torch.optim.Optimizer, optimizer_state: dict):
    """optimizer.load_state_dict of a full state, each moment sharded as its parameter is."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {i: {k: like(v, params[int(i)]) for k, v in s.items()} for i, s in optimizer_state["state"].items()}
    optimizer.load_state_dict({**optimizer_state, "state": state})
