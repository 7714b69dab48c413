"""
Checkpoints that survive crashes and resume exactly: atomic writes, strict loading, best and step copies,
and the RNG states of every rank. And the weights a run, sample.py, eval.py or export.py starts from
(load_pretrained, load_trained): a checkpoint file of ours or nanoGPT's, GPT-2 by name or a transformers folder,
with the checks that they fit the data (vocabulary, shape, context).
"""
import hashlib
import os
import random
import shutil

import numpy as np
import torch
import torch.distributed as dist

from common import UserError, atomic_write, plural, replace_durably
import hf
from dataset import declared_vocab, find_dataset
from model import GPT, GPTConfig, said_one_way
from sharding import load_optimizer_state, load_state
from tokenizer import decodable_ids


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
    bad = nonfinite_tensors(checkpoint["model"])
    if bad:
        kept = f"{path} keeps the last good state" if os.path.exists(path) else "no checkpoint was saved before"
        raise UserError(f"the weights are not finite ({plural(len(bad), 'tensor')}, e.g. {bad[0]}) at iter "
                        f"{checkpoint['iter_num']}: not saving them, and {kept}; lower learning_rate or raise "
                        "warmup_iters, then resume")
    try:
        with atomic_write(path, "wb") as f:
            torch.save(checkpoint, f)
    except (OSError, RuntimeError) as e:  # torch reports a failed write (a full disk) as a RuntimeError
        reason = getattr(e, "strerror", None) or str(e).strip().splitlines()[0]
        # a disk that fills mid-write reaches torch as a short write ("unexpected pos ..."): the space says more
        try:
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
            reason += f"; {free / 2**20:,.1f} MiB free on its disk"
        except OSError:  # the folder itself is gone (unmounted, deleted): the reason says so
            pass
        raise UserError(f"could not write checkpoint {path} ({reason}): the previous checkpoint is unchanged; if the "
                        "disk is full, free space or choose another out_dir") from e


def nonfinite_tensors(state: dict) -> list[str]:
    """The names of a state dict's tensors that hold a nan or an inf."""
    return [name for name, tensor in state.items() if not torch.isfinite(tensor).all()]


PROGRESS_KEYS = ("iter_num", "tokens", "best_val_loss", "best_iter")  # where the run stands
CHECKPOINT_KEYS = {"model", "optimizer", "scaler", "model_args", "config", "rng_states", "wandb_run_id", "evaluated",
                   *PROGRESS_KEYS}
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")  # in every checkpoint's model_args
# the rest of the architecture: checkpoints from before these existed lack them and are GPT-2, their defaults
ARCH_KEYS = ("pos_emb", "rope_theta", "norm", "mlp", "mlp_hidden", "n_kv_head", "qk_norm", "tie_embeddings")


def architecture(model_args: dict, path: str = "") -> dict:
    """The model-defining settings of a checkpoint's model_args (SHAPE_KEYS and ARCH_KEYS), with GPTConfig's
    defaults for ARCH_KEYS that an older checkpoint lacks; a UserError naming the checkpoint at path when one
    is not of the type GPTConfig's is (an int is fine where a float is)."""
    defaults = GPTConfig()
    args = {k: model_args[k] if k in model_args else getattr(defaults, k) for k in (*SHAPE_KEYS, *ARCH_KEYS)}

    def fits(value, default) -> bool:
        if isinstance(default, bool) or isinstance(value, bool):
            return isinstance(value, bool) and isinstance(default, bool)
        return isinstance(value, (int, float) if isinstance(default, float) else type(default))
    wrong = [f"{k}={v!r}" for k, v in args.items() if not fits(v, getattr(defaults, k))]
    if wrong:
        raise UserError(f"checkpoint {path} has model_args {', '.join(wrong)}, not of the types this trainer "
                        "writes: it is damaged, or not written by this trainer or nanoGPT")
    return args


def read_file(path: str):
    """torch.load of a checkpoint file onto the CPU without running code from it; a UserError when it is torn
    or not a checkpoint at all. The file is memory-mapped, not read into each process's own memory: the processes
    of a node that all resume from it share the page cache (8 copies of a 1B model's weights and moments would be
    136 GB), and a tensor's bytes are read when it is copied into the model. Our writes replace the file by a
    rename, which leaves a mapped file's bytes as they were."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # torch's format from before 1.6 cannot be mapped: read it whole
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several kinds for a torn or foreign file
        raise UserError(f"checkpoint {path} cannot be read ({e.__class__.__name__}): it is damaged or not a "
                        "checkpoint") from e


def load_checkpoint(path: str) -> dict:
    """A checkpoint written by save_checkpoint, read without running code from it and onto the CPU (so
    resuming does not spike GPU memory); a UserError when it is missing, unreadable or of another format."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: check out_dir (init_from='resume' continues a run saved there)"
                        + kept_hint(os.path.dirname(path)))
    checkpoint = read_file(path)
    missing = sorted(CHECKPOINT_KEYS - set(checkpoint)) if isinstance(checkpoint, dict) else ["everything"]
    if not missing and isinstance(checkpoint["model_args"], dict):
        missing = [f"model_args['{k}']" for k in SHAPE_KEYS if k not in checkpoint["model_args"]]
    if missing:
        raise UserError(f"checkpoint {path} lacks {missing}: it is from an older version or another trainer (nanoGPT): "
                        f"start a new run from its weights with --init_from={path}")
    architecture(checkpoint["model_args"], path)  # of the types the model takes, or an error line naming them
    return checkpoint


def checkpoint_digest(checkpoint: dict) -> str:
    """A digest of a checkpoint's progress and of the bytes of its small tensors (norms, biases), which every step
    changes: cheap to take from a mapped file, and different for another run's or an older checkpoint."""
    digest = hashlib.sha256(repr([checkpoint[k] for k in PROGRESS_KEYS]).encode())
    for name, tensor in sorted(checkpoint["model"].items()):
        if tensor.numel() <= 2**16:
            digest.update(name.encode() + tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def check_same_checkpoint(checkpoint: dict, path: str, world_size: int):
    """Every process reads ckpt.pt itself, where it sees out_dir; all must have read the same one. On a node's own
    disk a process finds another run's or an older checkpoint, and DDP's first broadcast would hide it: the weights
    agree, but steps, learning rates, moments and batches would not. A collective: all ranks call it."""
    seen = [None] * world_size
    dist.all_gather_object(seen, (checkpoint["iter_num"], checkpoint_digest(checkpoint)))
    others = [f"rank {r} one at iter {it:,}" for r, (it, d) in enumerate(seen) if d != seen[0][1]]
    if others:
        raise UserError(f"the processes read different checkpoints at {path}: rank 0 one at iter {seen[0][0]:,}, "
                        f"{', '.join(others)}; every node must see the same out_dir: put it on a filesystem that all "
                        "nodes share, not on each node's own disk")


def chars_differ(dataset: str, checkpoint: str) -> str:
    """How a dataset's characters differ from a checkpoint's, for an error: those only one has, or their order."""
    parts = []
    for who, ours, theirs in (("dataset", dataset, checkpoint), ("checkpoint", checkpoint, dataset)):
        only = "".join(sorted(set(ours) - set(theirs)))
        if only:
            parts.append(f"only the {who} has {plural(len(only), 'character')}, {only[:20]!r}"
                         + ("..." if len(only) > 20 else ""))
    return "; ".join(parts) or "the same characters in another order"


def check_vocabulary(saved: dict | None, vocabulary: dict, dataset: str, path: str, resuming: bool = True) -> dict:
    """A run from a checkpoint's weights must read its tokens as the checkpoint's run did (saved: the vocabulary
    the checkpoint keeps): the same tokenizer and, for a character dataset, the same characters in the same
    order. Checkpoints from before this was saved (None) pass. Returns the run's vocabulary: the dataset's, with
    what it does not say (nanoGPT's layout without meta.pkl) taken from the checkpoint, so no save loses it.
    resuming: the run continues the checkpoint's (else it starts from its weights), for the fix the error names."""
    saved = saved or {}
    for key in ("tokenizer", "chars"):
        if saved.get(key) is not None and vocabulary.get(key) is not None and saved[key] != vocabulary[key]:
            what = {"tokenizer": lambda v: f"tokenizer {v}", "chars": lambda v: f"{len(v)} characters"}[key]
            differ = f" ({chars_differ(vocabulary[key], saved[key])})" if key == "chars" else ""
            raise UserError(f"dataset {dataset} has {what(vocabulary[key])} but checkpoint {path} was trained on "
                            f"{what(saved[key])}{differ}: " + ("resume on the run's own dataset, or start a new run" if
                                                       resuming else "give a dataset prepared as the model's own was"))
    if vocabulary.get("tokenizer") is not None:  # the dataset says: its chars are its own (None for BPE)
        return vocabulary
    return {"tokenizer": saved.get("tokenizer"), "chars": saved.get("chars")}


def check_init_from(init_from: str, own: tuple[str, ...], checkpoint: str = "ckpt.pt"):
    """init_from must be one of the script's own choices (own: 'scratch', 'resume'), a GPT-2 name, a folder or a
    checkpoint file; checkpoint (sample.py's, eval.py's and export.py's choice of a file in out_dir) other than
    ckpt.pt only with init_from='resume', which alone reads it."""
    if init_from not in (*own, *hf.PRETRAINED) and not os.path.exists(init_from):
        raise UserError(f"init_from={init_from!r} is not {', '.join(own)}, one of {', '.join(hf.PRETRAINED)}, a folder "
                        "saved by transformers, or a checkpoint file (this trainer's or nanoGPT's ckpt.pt)")
    if checkpoint != "ckpt.pt" and init_from != "resume":
        raise UserError(f"checkpoint={checkpoint!r} picks a file in out_dir, which init_from={init_from!r} does not read: "
                        "drop --checkpoint, or pass that file's path as --init_from")


def strip_prefixes(name: str) -> str:
    """A parameter name without the prefixes that torch.compile (_orig_mod.) and DDP (module.) add."""
    while name.startswith(("_orig_mod.", "module.")):
        name = name.split(".", 1)[1]
    return name


def read_model_file(path: str, dropout: float) -> tuple[GPT, dict | None, dict | None]:
    """The model in a checkpoint file of this trainer or of nanoGPT (which lacks this trainer's other keys and,
    from compiled runs, has prefixed names), its vocabulary (None when unknown) and its optimizer state."""
    saved = read_file(path)
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict) or not isinstance(saved.get("model_args"), dict):
        raise UserError(f"{path} is not a checkpoint of this trainer or nanoGPT: it lacks 'model' or 'model_args'")
    missing = [k for k in SHAPE_KEYS if k not in saved["model_args"]]
    if missing:
        raise UserError(f"checkpoint {path} lacks model_args {missing}")
    args = architecture(saved["model_args"], path)
    try:
        model = GPT(GPTConfig(**args, dropout=dropout))
    except ValueError as e:  # GPTConfig's checks: pos_emb 'alibi', n_embd 33 with n_head 2, ...
        raise UserError(f"checkpoint {path} has model_args that build no model ({e}): it is damaged, or not "
                        "written by this trainer or nanoGPT") from None
    load_model_state(model, {strip_prefixes(k): v for k, v in saved["model"].items()}, path)
    vocab = saved.get("vocabulary")
    if vocab is not None and not isinstance(vocab, dict):
        raise UserError(f"checkpoint {path} has a vocabulary of type {type(vocab).__name__}, not the table this "
                        "trainer writes: it is damaged")
    dataset = (saved.get("config") or {}).get("dataset")
    if vocab is None and isinstance(dataset, str):  # nanoGPT's: the characters are in its dataset's meta.pkl
        try:
            data_dir = find_dataset(dataset)
            declared, vocab = declared_vocab(data_dir)
        except UserError:  # that dataset is not on this machine
            declared, vocab = None, None
        chars = (vocab or {}).get("chars")
        # nanoGPT sizes a char model to its alphabet; data/prepare.py's char datasets add the document separator
        if chars is not None and model.config.vocab_size not in (len(chars), declared):
            raise UserError(f"{path} is a nanoGPT model of {model.config.vocab_size} characters, but the alphabet of "
                            f"its dataset {data_dir} has {len(chars)}: that folder holds another text now; prepare the "
                            "text the model was trained on there")
        if (vocab or {}).get("tokenizer") == "gpt2" and model.config.vocab_size < 50257:
            raise UserError(f"{path} is a nanoGPT model of {model.config.vocab_size} tokens, too few for GPT-2's 50257, "
                            f"but its dataset {data_dir} now holds GPT-2 tokens: prepare the text the model was "
                            "trained on there")
    return model, vocab if vocab and (vocab.get("tokenizer") or vocab.get("chars")) else None, saved.get("optimizer")


def load_pretrained(init_from: str, dropout: float) -> tuple[GPT, dict | None, dict | None]:
    """The model that a new run (or, through load_trained, sample.py, eval.py or export.py) starts from, when
    init_from names one: a checkpoint file, a GPT-2
    name, or a transformers folder. Returns (model, its vocabulary or None for GPT-2's BPE or unknown, optimizer
    state or None)."""
    if os.path.isfile(init_from):
        model, vocab, optimizer_state = read_model_file(init_from, dropout)
    else:
        vocab = hf.read_vocabulary(init_from) if os.path.isdir(init_from) else None
        model, optimizer_state = hf.load(init_from, dropout), None
    chars = (vocab or {}).get("chars")
    tokens = len(chars) if chars is not None else decodable_ids(vocab) if vocab else None
    if tokens is not None and tokens > model.config.vocab_size:  # its ids would index past the embedding table
        fix = "write the folder again (export.py)" if os.path.isdir(init_from) else "the checkpoint is damaged"
        raise UserError(f"{init_from} holds a tokenizer of {tokens:,} tokens for a model of vocab_size "
                        f"{model.config.vocab_size:,}: they are not one model's; {fix}")
    if vocab is None and model.config.vocab_size > 50304 and os.path.isdir(init_from):  # 50304: GPT-2's, padded
        raise UserError(f"{init_from} holds a model of {model.config.vocab_size:,} tokens and no tokenizer files, so "
                        "not GPT-2's: this project's data, sampling and evaluation encode only GPT-2's BPE or characters")
    bad = nonfinite_tensors(model.state_dict())
    if bad:  # training from them could never save, and sampling, evaluating or exporting them gives nothing
        raise UserError(f"{init_from} holds weights that are not finite ({plural(len(bad), 'tensor')}, e.g. {bad[0]}): "
                        "the file is damaged, or was saved after training diverged; use another checkpoint")
    return model, vocab, optimizer_state


def kept_name(iter_num: int) -> str:
    """The file name of the checkpoint keep_last_n keeps for step iter_num: zero-padded, so names sort by step."""
    return f"ckpt_{iter_num:07d}.pt"


def kept_files(folder: str) -> list[str]:
    """The kept checkpoints in folder, by step; [] when the folder cannot be listed."""
    try:
        return sorted((n for n in os.listdir(folder or ".") if kept_step(n) >= 0), key=kept_step)
    except OSError:
        return []


def kept_hint(folder: str) -> str:
    """Where a run's ckpt.pt is missing (moved away to go back, say): the kept steps in its folder and the
    --resume_from that reads the last; '' when there are none, or the folder cannot be listed."""
    kept = kept_files(folder)
    if not kept:
        return ""
    return f"; {folder or '.'} keeps {', '.join(kept[-3:])}: --resume_from={kept[-1]} reads the last"


def kept_step(name: str) -> int:
    """The step a kept checkpoint's file name gives (ckpt_0000900.pt, or ckpt_900.pt unpadded); -1 for another name."""
    digits = name[5:-3] if name.startswith("ckpt_") and name.endswith(".pt") else ""
    return int(digits) if digits.isascii() and digits.isdigit() else -1  # "²".isdigit(), but int() refuses it


def own_kept_step(name: str) -> int:
    """The step of a checkpoint that keep_last_n wrote, by its exact, padded name; -1 for any other name, so a copy
    the user named ckpt_4.pt is never pruned or overwritten as one of the run's."""
    step = kept_step(name)
    return step if step >= 0 and name == kept_name(step) else -1


def checkpoint_file(out_dir: str, name: str) -> str:
    """The path of checkpoint `name` in out_dir; ckpt_<iter>.pt may name a kept step without the zero padding of
    its file name (ckpt_900.pt for ckpt_0000900.pt), unless a file has that very name (a copy the user named)."""
    path = os.path.join(out_dir, name)
    if kept_step(name) >= 0 and not os.path.isfile(path):
        padded = os.path.join(out_dir, kept_name(kept_step(name)))
        path = padded if os.path.isfile(padded) else path
    return path


def load_trained(init_from: str, ckpt_path: str) -> tuple[GPT, dict | None]:
    """The model that sample.py, export.py and eval.py read: the checkpoint at ckpt_path with init_from='resume',
    else what init_from names (see load_pretrained); and its vocabulary (None: GPT-2's BPE)."""
    if init_from == "resume" and not os.path.isfile(ckpt_path):
        folder = os.path.dirname(ckpt_path) or "."
        if hf.has_weights(folder):  # an export given as out_dir
            raise UserError(f"no checkpoint at {ckpt_path}: {folder} holds a transformers model (export.py's, say): "
                            f"pass --init_from={folder}")
        if os.path.isfile(folder):  # out_dir names the checkpoint itself
            raise UserError(f"no checkpoint at {ckpt_path}: {folder} is a file, not a run's folder; for a checkpoint "
                            f"file, pass --init_from={folder}")
        if not os.path.isdir(folder):
            raise UserError(f"no checkpoint at {ckpt_path}: there is no folder {folder}; check out_dir and checkpoint")
        try:  # the checkpoints that are there: ckpt.pt, best.pt and the like, and the last three kept steps
            named = sorted(n for n in os.listdir(folder) if n.endswith(".pt") and kept_step(n) < 0)
        except OSError:
            named = []
        kept = kept_files(folder)
        shown = named[:4] + (["..."] if len(named) > 4 else []) + \
            ([("kept steps ending " if len(kept) > 3 else "") + ", ".join(kept[-3:])] if kept else [])
        raise UserError(f"no checkpoint at {ckpt_path}: check out_dir and checkpoint" + (
            f"; {folder} holds {', '.join(shown)}: name one with --checkpoint" if shown else ""))
    source = ckpt_path if init_from == "resume" else init_from
    model, vocab, _ = load_pretrained(source, 0.0)
    if vocab is None and model.config.vocab_size < 50257:
        where = ("its tokenizer.json is missing (export.py writes one)" if os.path.isdir(source) else
                 "its dataset folder (with meta.pkl) is not here: put that folder in data/")
        raise UserError(f"{source} holds a model of {model.config.vocab_size} tokens but not its characters, and {where}")
    return model, vocab


def take_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> str | None:
    """Load an optimizer state saved by another run (AdamW moments for the same parameters) while keeping this
    run's hyperparameters; returns why it was not taken, or None when it was."""
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not groups or [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        return "its parameter groups differ from this run's"
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved = state.get("state", {})
    if any(key in saved and saved[key].get("exp_avg", p).shape != p.shape for key, p in enumerate(params)):
        return "its moments have other shapes"
    load_optimizer_state(optimizer, with_own_settings(optimizer, state))
    return None


def with_own_settings(optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """A saved optimizer state with this run's settings (weight_decay, betas, Muon's momentum and lr_scale, fused,
    ...) in place of the saved ones, which load_state_dict would restore. Before the load, not after: torch places
    each moment's step count by the fused and capturable flags it loads (on the GPU for a fused AdamW)."""
    own = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {**state, "param_groups": [{**saved, **mine} for saved, mine in zip(state["param_groups"], own)]}


def check_same_shape(model_args: dict, config: dict, defaults: dict, source: str = "", given=()):
    """Model settings (shape and architecture) that the user changed from the defaults, or gave at all (`given`:
    the keys set by a flag or config file, see configurator.configure), must agree with those of the model a run
    resumes (source '') or starts from (source: its init_from; train.py checks block_size then)."""
    saved = architecture(model_args)
    asked = {k: config[k] for k in saved if k in config and (config[k] != defaults[k] or k in given)
             and not (source and k == "block_size")}  # a model started from: its context may be cropped
    # compared as said one way: n_kv_head=4 of 4 heads is the n_kv_head=0 that an export reads back
    theirs, mine = said_one_way(saved), said_one_way({**saved, **asked})
    keys = [k for k in asked if asked[k] != saved[k] and mine[k] != theirs[k]]
    clashes = [f"{k}={config[k]!r} ({source or 'checkpoint'}: {saved[k]!r})" for k in keys]
    flags = " ".join(f"--{k}={saved[k]}" for k in keys)  # the model's own, for settings a config file sets
    if clashes and not source:  # the settings may come from a config file, where dropping them is no answer
        raise UserError(f"resuming a checkpoint of another model shape: {', '.join(clashes)}; give the checkpoint's "
                        f"({flags}), drop those settings, or use a new out_dir")
    if clashes:
        raise UserError(f"init_from={source} is a model of another shape: {', '.join(clashes)}; drop those settings "
                        f"(the model's own shape is used), give the model's where a config file sets them ({flags}), "
                        "or start from scratch")


def load_model_state(model: torch.nn.Module, state: dict, path: str, optimizer=None, optimizer_state: dict | None = None):
    """load_state_dict (and the optimizer's, when given), sharded as the model is (see sharding.py), with a
    UserError naming the keys that are missing, unexpected or of another shape."""
    own = model.state_dict()
    odd = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    if odd:
        raise UserError(f"checkpoint {path} holds values that are not tensors in its weights ({odd[:5]}): it is damaged")
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    reshaped = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or reshaped:
        raise UserError(f"checkpoint {path} does not fit the model: missing {missing[:5]}, unexpected "
                        f"{unexpected[:5]}, other shape {reshaped[:5]}")
    load_state(model, optimizer, state, optimizer_state)


def publish_checkpoint(out_dir: str, iter_num: int, improved: bool, keep_last_n: int):
    """After ckpt.pt is written: link it as best.pt when val loss improved, and as ckpt_<iter>.pt when
    keeping the last n; older step checkpoints are deleted only once the new one is in place."""
    latest = os.path.join(out_dir, "ckpt.pt")
    names = (["best.pt"] if improved else []) + ([kept_name(iter_num)] if keep_last_n > 0 else [])
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
        # by step, not by name (ckpt_10000000 is 8 digits); another name (ckpt_before_lr_change.pt, ckpt_4.pt: copies
        # the user made) is none of keep_last_n's and stays
        steps = sorted((f for f in os.listdir(out_dir) if own_kept_step(f) >= 0), key=own_kept_step)
        for old in steps[:-keep_last_n]:
            os.remove(os.path.join(out_dir, old))


def repair_published(out_dir: str, checkpoint: dict) -> list[str]:
    """Finish what publish_checkpoint did not for out_dir/ckpt.pt (read as checkpoint) when the run was killed
    between writing ckpt.pt and linking it: best.pt when ckpt.pt is the run's best and best.pt lags it,
    ckpt_<iter>.pt when the run kept steps and has none as recent. Returns the names written (none when all is in
    place). The link takes milliseconds, but a filesystem without hard links copies, for seconds on a large model.
    A better best.pt or a kept step newer than ckpt.pt is left alone: ckpt.pt may be an earlier copy put back."""
    iter_num, evaluated = checkpoint["iter_num"], checkpoint["evaluated"]
    keep_last_n = checkpoint["config"].get("keep_last_n", 0) if evaluated else 0
    kept_missing = keep_last_n > 0 and all(own_kept_step(f) < iter_num for f in os.listdir(out_dir))
    best_stale = evaluated and checkpoint["best_iter"] == iter_num and best_lags(out_dir, checkpoint)
    if not (best_stale or kept_missing):
        return []
    publish_checkpoint(out_dir, iter_num, best_stale, keep_last_n if kept_missing else 0)
    return (["best.pt"] if best_stale else []) + ([kept_name(iter_num)] if kept_missing else [])


def best_header(out_dir: str, path: str, checkpoint: dict) -> dict | None:
    """out_dir/best.pt's state, for comparing with the checkpoint at path (read as checkpoint): None when it is
    missing, unreadable or no checkpoint; the checkpoint itself when best.pt is a hard link to path (not read
    again); else best.pt read mapped, so only its small header is read."""
    best_path = os.path.join(out_dir, "best.pt")
    if not os.path.isfile(best_path):
        return None
    if os.path.samefile(best_path, path):
        return checkpoint
    try:
        best = read_file(best_path)
    except UserError:
        return None
    return best if isinstance(best, dict) else None


def best_lags(out_dir: str, checkpoint: dict) -> bool:
    """Whether out_dir/best.pt lags ckpt.pt (read as checkpoint): missing or unreadable, or with a worse val loss
    than ckpt.pt's best (from an earlier step, or from the steps a run went back from: either way superseded)."""
    best = best_header(out_dir, os.path.join(out_dir, "ckpt.pt"), checkpoint)
    return best is None or best.get("best_val_loss", float("inf")) > checkpoint["best_val_loss"]


def check_no_later_steps(out_dir: str, path: str, iter_num: int):
    """A resume from the checkpoint at path (iter_num; ckpt.pt, or a kept step to go back to) refuses an out_dir
    with checkpoints of later steps, its own kept ones or ckpt.pt: the resumed run would replace them as it went."""
    later = [f for f in sorted(os.listdir(out_dir)) if own_kept_step(f) > iter_num]
    latest = os.path.join(out_dir, "ckpt.pt")
    if os.path.isfile(latest) and not os.path.samefile(latest, path):
        try:
            state = read_file(latest)
            newer = not isinstance(state, dict) or state.get("iter_num", iter_num + 1) > iter_num
        except UserError:  # unreadable: not ours to judge, so not ours to replace
            newer = True
        later = ["ckpt.pt"] * newer + later
    if later:
        raise UserError(f"{path} is iter {iter_num}, but {out_dir} holds checkpoints of later steps "
                        f"({', '.join(later[:4])}{', ...' if len(later) > 4 else ''}), which resuming from it would "
                        "replace: move them out of out_dir to keep them (and copy metrics.csv, whose rows past that "
                        "step are dropped), or delete them, then resume; if they are the progress made since going "
                        "back, resume without --resume_from")


def better_best(out_dir: str, checkpoint: dict, path: str) -> tuple[float, int] | None:
    """(best_val_loss, best_iter) of out_dir/best.pt when it is better than the best that the checkpoint resumed
    (read from path as checkpoint) knows: the run goes back to an earlier step, and best.pt, from the steps after
    it, must stay best.pt until an evaluation beats it. None otherwise."""
    best = best_header(out_dir, path, checkpoint)
    if best is None or not best.get("best_val_loss", float("inf")) < checkpoint["best_val_loss"]:
        return None
    return float(best["best_val_loss"]), best.get("best_iter")


def training_state(model_state: dict, optimizer_state: dict, scaler, model_args: dict, config: dict, progress: dict,
                   rng_states: list[dict], wandb_run_id: str | None, evaluated: bool, vocabulary: dict,
                   data_files: dict, folder: str) -> dict:
    """The whole state of a run, as save_checkpoint writes it and restore_training_state puts it back: the
    unwrapped model's weights (no _orig_mod. or module. prefixes) and the optimizer's state, both whole
    (sharding.full_state), the scaler's state, the model's shape, the config, progress (PROGRESS_KEYS, and the
    steps skipped in a row as non-finite up to this one: a resume goes on counting them), every
    rank's RNG streams, the wandb run id, whether the step was evaluated before the save, the dataset's
    vocabulary (see check_vocabulary), its token files (dataset.token_files, for dataset.data_change) and the
    run's folder (its real path, for copied_from)."""
    return {"model": model_state, "optimizer": optimizer_state, "scaler": scaler.state_dict(),
            "model_args": model_args, "config": config, "rng_states": rng_states, "wandb_run_id": wandb_run_id,
            "evaluated": evaluated, "vocabulary": vocabulary, "data_files": data_files, "folder": folder,
            **{k: progress[k] for k in PROGRESS_KEYS}, "nonfinite_streak": progress["nonfinite_streak"]}


def restore_training_state(checkpoint: dict, path: str, model: torch.nn.Module, optimizer, scaler, rank: int,
                           world_size: int, device_type: str) -> dict:
    """Put a checkpoint's weights, optimizer and scaler state back, and this rank's RNG streams when the world
    size is the one that saved them. Returns the progress (PROGRESS_KEYS), wandb_run_id, evaluated, nonfinite_streak,
    folder (None from older checkpoints) and rng_restored (False under another world size: the caller seeds fresh
    streams)."""
    # a resume with --weight_decay=... changed takes the new value, as it does for the learning rate
    load_model_state(model, checkpoint["model"], path, optimizer, with_own_settings(optimizer, checkpoint["optimizer"]))
    if checkpoint["scaler"]:  # empty from a bf16 or fp32 run: a float16 resume starts its scaler afresh
        scaler.load_state_dict(checkpoint["scaler"])
    rng_restored = len(checkpoint["rng_states"]) == world_size
    if rng_restored:  # each rank continues its own dropout stream
        set_rng_state(checkpoint["rng_states"][rank], device_type)
    return {**{k: checkpoint[k] for k in (*PROGRESS_KEYS, "wandb_run_id", "evaluated")}, "rng_restored": rng_restored,
            "nonfinite_streak": checkpoint.get("nonfinite_streak", 0),  # older checkpoints: none kept
            "folder": checkpoint.get("folder")}


def copied_from(folder: str | None, out_dir: str, wandb_run_id: str | None) -> str | None:
    """The run folder that out_dir is a copy of: folder, where its checkpoint was saved, when that is another
    folder whose ckpt.pt is still of the same wandb run (a fork, which must not log to the original's wandb run).
    None for a checkpoint saved in out_dir, a folder moved (nothing, or another run, where it was), a run without
    wandb, or an older checkpoint."""
    path = os.path.join(folder or "", "ckpt.pt")
    if not folder or not wandb_run_id or not os.path.isfile(path):
        return None
    try:
        if os.path.samefile(folder, out_dir):  # the same folder by another path: a link's, a mount's
            return None
        return folder if read_file(path).get("wandb_run_id") == wandb_run_id else None  # mapped: its header only
    except (OSError, UserError, AttributeError):  # gone meanwhile, torn, or not a checkpoint's dict
        return None
