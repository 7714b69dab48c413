"""
Checkpoints that survive crashes and resume exactly: atomic writes, strict loading, best and step copies,
and the RNG states of every rank.
"""
import os
import random
import shutil

import numpy as np
import torch
import torch.distributed as dist

from common import UserError, atomic_write, replace_durably
from model import GPT, PRETRAINED, GPTConfig


def gather_rng_states(device_type: str, world_size: int) -> list[dict]:
    """Every rank's RNG states, in rank order: torch's drive dropout; numpy's and Python's are kept for code
    that a fork adds (the batch sampler has its own generator). A collective: all ranks call it."""
    np_state = np.random.get_state()
    state = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None,
             "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
             "python": random.getstate()}
    if world_size == 1:
        return [state]
    states = [None] * world_size
    dist.all_gather_object(states, state)
    return states


def set_rng_state(state: dict, device_type: str):
    """Restore one rank's RNG states from gather_rng_states."""
    torch.set_rng_state(state["cpu"])
    if device_type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    random.setstate(state["python"])


def save_checkpoint(checkpoint: dict, path: str):
    """Write to a temporary file beside path, flush it to disk, then rename it over path: a crash at any
    moment leaves either the old file or the new one, whole. A failed write (disk full) removes the
    temporary file and keeps the old one. Weights that are not finite are never written."""
    bad = [name for name, tensor in checkpoint["model"].items() if not torch.isfinite(tensor).all()]
    if bad:
        raise UserError(f"the weights are not finite ({len(bad)} tensors, e.g. {bad[0]}) at iter "
                        f"{checkpoint['iter_num']}: not saving them, so {path} keeps the last good state; lower "
                        "learning_rate or raise warmup_iters, then resume")
    try:
        with atomic_write(path, "wb") as f:
            torch.save(checkpoint, f)
    except (OSError, RuntimeError) as e:  # torch reports a failed write (a full disk) as a RuntimeError
        reason = getattr(e, "strerror", None) or str(e).strip().splitlines()[0]
        raise UserError(f"could not write checkpoint {path} ({reason}): the previous checkpoint is unchanged; "
                        "if the disk is full, free space or choose another out_dir") from e


PROGRESS_KEYS = ("iter_num", "tokens", "best_val_loss", "best_iter")  # where the run stands
CHECKPOINT_KEYS = {"model", "optimizer", "scaler", "model_args", "config", "rng_states", "wandb_run_id", "evaluated",
                   *PROGRESS_KEYS}
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")  # in every checkpoint's model_args
# the rest of the architecture: checkpoints from before these existed lack them and are GPT-2, their defaults
ARCH_KEYS = ("pos_emb", "rope_theta", "norm", "mlp", "mlp_hidden", "n_kv_head", "qk_norm", "tie_embeddings")


def architecture(model_args: dict) -> dict:
    """The model-defining settings of a checkpoint's model_args (SHAPE_KEYS and ARCH_KEYS), with GPTConfig's
    defaults for ARCH_KEYS that an older checkpoint lacks."""
    defaults = GPTConfig()
    return {k: model_args[k] if k in model_args else getattr(defaults, k) for k in (*SHAPE_KEYS, *ARCH_KEYS)}


def load_checkpoint(path: str) -> dict:
    """A checkpoint written by save_checkpoint, read without running code from it and onto the CPU (so
    resuming does not spike GPU memory); a UserError when it is missing, unreadable or of another format."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: check out_dir (init_from='resume' continues a run saved there)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several kinds for a torn or foreign file
        raise UserError(f"checkpoint {path} cannot be read ({e.__class__.__name__}): it is damaged or not a "
                        "checkpoint of this trainer") from e
    missing = sorted(CHECKPOINT_KEYS - set(checkpoint)) if isinstance(checkpoint, dict) else ["everything"]
    if not missing and isinstance(checkpoint["model_args"], dict):
        missing = [f"model_args['{k}']" for k in SHAPE_KEYS if k not in checkpoint["model_args"]]
    if missing:
        raise UserError(f"checkpoint {path} lacks {missing}: it is from an older version or another trainer")
    return checkpoint


def check_vocabulary(checkpoint: dict, vocabulary: dict, dataset: str, path: str):
    """A resumed run must read its tokens as the checkpoint's run did: the same tokenizer and, for a character
    dataset, the same characters in the same order. Checkpoints from before this was saved pass."""
    saved = checkpoint.get("vocabulary") or {}
    for key in ("tokenizer", "chars"):
        if saved.get(key) is not None and vocabulary.get(key) is not None and saved[key] != vocabulary[key]:
            what = {"tokenizer": lambda v: f"tokenizer {v}", "chars": lambda v: f"{len(v)} characters {v[:12]!r}..."}[key]
            raise UserError(f"dataset {dataset} has {what(vocabulary[key])} but checkpoint {path} was trained on "
                            f"{what(saved[key])}: resume on the run's own dataset, or start a new run")


def check_init_from(init_from: str, own: tuple[str, ...]):
    """init_from must be one of the script's own choices (own: 'scratch', 'resume'), a GPT-2 name, or a folder."""
    if init_from not in (*own, *PRETRAINED) and not os.path.isdir(init_from):
        raise UserError(f"init_from={init_from!r} is not {', '.join(own)}, one of {', '.join(PRETRAINED)}, or a folder "
                        "saved by transformers")


def load_pretrained(name: str, dropout: float) -> GPT:
    """GPT.from_pretrained, with its failures (no transformers, no network, an unknown name) as UserErrors."""
    try:
        return GPT.from_pretrained(name, dict(dropout=dropout))
    except (ImportError, OSError, ValueError) as e:
        raise UserError(str(e)) from e


def check_resume_shape(checkpoint_args: dict, config: dict, defaults: dict):
    """Model settings (shape and architecture) that the user changed from the defaults must agree with the
    checkpoint's."""
    saved = architecture(checkpoint_args)
    clashes = [f"{k}={config[k]!r} (checkpoint: {saved[k]!r})" for k in saved
               if k in config and config[k] != defaults[k] and config[k] != saved[k]]
    if clashes:
        raise UserError(f"resuming a checkpoint of another model shape: {', '.join(clashes)}; drop those settings "
                        "or use a new out_dir")


def load_model_state(model: torch.nn.Module, state: dict, path: str):
    """load_state_dict, with a UserError naming the keys that are missing, unexpected or of another shape."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    reshaped = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or reshaped:
        raise UserError(f"checkpoint {path} does not fit the model: missing {missing[:5]}, unexpected "
                        f"{unexpected[:5]}, other shape {reshaped[:5]}")
    model.load_state_dict(state)


def publish_checkpoint(out_dir: str, iter_num: int, improved: bool, keep_last_n: int):
    """After ckpt.pt is written: link it as best.pt when val loss improved, and as ckpt_<iter>.pt when
    keeping the last n; older step checkpoints are deleted only once the new one is in place."""
    latest = os.path.join(out_dir, "ckpt.pt")
    names = (["best.pt"] if improved else []) + ([f"ckpt_{iter_num:07d}.pt"] if keep_last_n > 0 else [])
    for name in names:
        tmp = os.path.join(out_dir, name + ".tmp")
        try:
            if os.path.lexists(tmp):
                os.remove(tmp)
            try:
                os.link(latest, tmp)  # a second name for the same bytes: no copy, and ckpt.pt's next rename leaves it
            except OSError:  # a filesystem without hard links
                shutil.copyfile(latest, tmp)
            replace_durably(tmp, os.path.join(out_dir, name))
        except OSError as e:
            if os.path.lexists(tmp):
                os.remove(tmp)
            raise UserError(f"could not write {name} in {out_dir} ({e.strerror or e}): the previous {name} is "
                            "unchanged and ckpt.pt holds this step; free disk space or choose another out_dir") from e
    if keep_last_n > 0:
        steps = sorted(f for f in os.listdir(out_dir) if f.startswith("ckpt_") and f.endswith(".pt"))
        for old in steps[:-keep_last_n]:
            os.remove(os.path.join(out_dir, old))


def training_state(model: torch.nn.Module, optimizer, scaler, model_args: dict, config: dict, progress: dict,
                   rng_states: list[dict], wandb_run_id: str | None, evaluated: bool, vocabulary: dict) -> dict:
    """The whole state of a run, as save_checkpoint writes it and restore_training_state puts it back: the
    unwrapped model's weights (no _orig_mod. or module. prefixes), optimizer and scaler state, the model's
    shape, the config, progress (PROGRESS_KEYS), every rank's RNG streams, the wandb run id, whether
    the step was evaluated before the save, and the dataset's vocabulary (see check_vocabulary)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
            "model_args": model_args, "config": config, "rng_states": rng_states, "wandb_run_id": wandb_run_id,
            "evaluated": evaluated, "vocabulary": vocabulary, **{k: progress[k] for k in PROGRESS_KEYS}}


def restore_training_state(checkpoint: dict, path: str, model: torch.nn.Module, optimizer, scaler, rank: int,
                           world_size: int, device_type: str) -> dict:
    """Put a checkpoint's weights, optimizer and scaler state back, and this rank's RNG streams when the world
    size is the one that saved them. Returns the progress (PROGRESS_KEYS), wandb_run_id, evaluated, and
    rng_restored (False under another world size: the caller seeds fresh streams)."""
    load_model_state(model, checkpoint["model"], path)
    optimizer.load_state_dict(checkpoint["optimizer"])
    scaler.load_state_dict(checkpoint["scaler"])
    rng_restored = len(checkpoint["rng_states"]) == world_size
    if rng_restored:  # each rank continues its own dropout stream
        set_rng_state(checkpoint["rng_states"][rank], device_type)
    return {**{k: checkpoint[k] for k in (*PROGRESS_KEYS, "wandb_run_id", "evaluated")}, "rng_restored": rng_restored}
