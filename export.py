"""
Writes a trained model as a Hugging Face transformers folder (weights, config.json, tokenizer), which
transformers, lm-evaluation-harness and vLLM load as they are:

    python export.py --out_dir=out-shakespeare-char --to=hf-shakespeare-char
    python export.py --init_from=gpt2 --to=hf-gpt2 --dtype=bfloat16

GPT-2-shaped models become GPT2LMHeadModel, LLaMA-shaped ones (rope, rmsnorm, swiglu; GQA and untied
embeddings allowed) LlamaForCausalLM; other combinations have no transformers class and are refused. The
folder is written beside `to` and renamed into place, so a failed export (a full disk, a Ctrl-C, a SIGTERM)
leaves no half-written folder.
An empty folder is written into; --overwrite=True replaces only an earlier export (a folder of config.json,
weights and tokenizer files, and nothing else), so a slip of --to never deletes a run, nor an eval.py result
saved beside an export.
"""
import os
import shutil
import signal
import sys
import tempfile

import torch

import configurator
from checkpoint import check_init_from, checkpoint_file, load_trained
from common import UserError, signals_deferred, start_script
from hf import FOLDER_FILES, has_weights, no_progress_bars, to_transformers, write_tokenizer

init_from = "resume"  # 'resume' (a checkpoint in out_dir, ours or nanoGPT's), gpt2, gpt2-medium, gpt2-large, gpt2-xl, a folder saved by transformers, or a checkpoint file
out_dir = "out"  # where the checkpoint is, with init_from='resume'
checkpoint = "ckpt.pt"  # which checkpoint in out_dir: ckpt.pt (latest), best.pt (best val loss) or ckpt_<iter>.pt
to = ""  # the folder to write [to != '']
dtype = "float32"  # the weights' type in the folder [dtype in ('float32', 'bfloat16', 'float16')]
overwrite = False  # replace `to` when it holds an earlier export (nothing else is replaced)
config_defaults = configurator.config_keys(globals())  # taken here, so only the names above are settings


def check_target(folder: str, overwrite: bool):
    """Refuse a `to` that export would fail on or that is not ours to replace, before any work is done."""
    parent = os.path.dirname(os.path.abspath(folder))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.exists(parent):  # a link to nothing, in which no folder can be made
        raise UserError(f"--to={folder} lies under {parent}, a link to {os.readlink(parent)}, which does not exist: "
                        "make that folder, or choose another --to")
    if not os.path.isdir(parent):
        raise UserError(f"--to={folder} lies under {parent}, which is a file: choose a folder path")
    if os.path.ismount(folder):  # moved aside as a whole, then replaced: a mount point cannot be
        raise UserError(f"--to={folder} is a mount point, which an export, renamed into place, cannot replace: give a "
                        f"folder in it, such as --to={os.path.join(folder, 'hf')}")
    name_max = os.pathconf(parent, "PC_NAME_MAX")  # the folders still to make, each a name that must fit
    long = [n for n in os.path.relpath(os.path.abspath(folder), parent).split(os.sep) if len(os.fsencode(n)) > name_max]
    if long:
        raise UserError(f"--to={folder}: the name {long[0][:40]}... is longer than the {name_max} bytes a name may "
                        f"have in {parent}: choose a shorter --to")
    try:  # a folder that cannot be written in (read-only, /proc) fails now, not after the model is converted
        with signals_deferred():  # a stop in between would leave the folder behind
            tempfile.TemporaryDirectory(dir=parent, prefix=".export-").cleanup()
    except OSError as e:
        raise UserError(f"--to={folder}: cannot write in {parent} ({e.strerror}): choose a --to on a writable disk")
    if not os.path.lexists(folder):
        return
    if not os.path.isdir(folder):
        raise UserError(f"--to={folder} exists and is not a folder: choose another --to")
    here, target = os.path.abspath(os.getcwd()), os.path.abspath(folder)
    if here == target or here.startswith(target + os.sep):
        raise UserError(f"--to={folder} is the working folder or holds it: choose another --to")
    names = os.listdir(folder)
    if not names:  # made ahead (mkdir) for the export, nothing in it to lose: replaced as a whole
        return
    # a file of another tool's beside an export (eval.py's results, notes) would go with it: only what a transformers
    # folder holds by name is replaced
    others = [n for n in names if not (os.path.isfile(os.path.join(folder, n)) and FOLDER_FILES.fullmatch(n))]
    if others or "config.json" not in names or not has_weights(folder):  # whatever overwrite says: only an export is replaced
        why = f"it holds {', '.join(sorted(others)[:4])}" if others else "it lacks config.json or weights"
        raise UserError(f"--to={folder} already exists and is not an earlier export ({why}): choose another --to")
    if not overwrite:
        raise UserError(f"--to={folder} already holds an export: choose another --to, or pass --overwrite=True to "
                        "replace it")


def target_folder(to: str) -> str:
    """The folder an export replaces: to, or the folder to links to (a link to a larger disk, say), so that the
    export lands there and the link stays a link."""
    link = to.rstrip(os.sep) or to  # link/, as a shell completes it, is the link too
    return os.path.realpath(link) if os.path.islink(link) and os.path.isdir(link) else to


def export(model, vocab: dict | None, folder: str, dtype: str, overwrite: bool) -> str:
    """Write model and its tokenizer to folder (see target_folder); returns a line saying what was written."""
    folder = target_folder(folder)
    check_target(folder, overwrite)
    hf_model = to_transformers(model, vocab).to(getattr(torch, dtype))
    from safetensors import SafetensorError  # save_pretrained's, for a failed write of the weights
    parent = os.path.dirname(os.path.abspath(folder))
    try:
        files, tokenizer = stage_and_replace(hf_model, vocab, model.config.vocab_size, folder)
    except (OSError, SafetensorError) as e:  # a full disk, a quota: the temporary folder has gone with the error
        written = isinstance(e, SafetensorError) and "I/O error" in str(e) or isinstance(e, OSError) and (
            e.filename is None or os.path.commonpath([parent, os.path.abspath(e.filename)]) == parent)
        if not written:  # another file's (a rank file the tokenizer reads), or a bug: as it is
            raise
        raise UserError(f"--to={folder}: cannot write the export ({getattr(e, 'strerror', None) or e}): free space "
                        f"on that disk or choose another --to; {folder} is as it was") from None
    params = sum(p.numel() for p in model.parameters())
    return (f"wrote {folder}: {type(hf_model).__name__} ({params / 1e6:.2f}M parameters, {dtype}) and {tokenizer}; "
            f"files {', '.join(files)}")


def stage_and_replace(hf_model, vocab: dict | None, vocab_size: int, folder: str) -> tuple[list[str], str]:
    """Write the transformers model and its tokenizer to a temporary folder beside folder, then put it in place of
    folder; returns the files written and what the tokenizer is."""
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = None
    try:  # a stop (Ctrl-C, SIGTERM) as tmp is made, or as it is removed, waits: either would leave it behind
        with signals_deferred():
            tmp = tempfile.mkdtemp(dir=parent, prefix=".export-")
        staged = os.path.join(tmp, "model")
        with no_progress_bars():  # the last line says what was written
            hf_model.save_pretrained(staged)
        tokenizer = write_tokenizer(vocab, vocab_size, staged)
        files = sorted(os.listdir(staged))
        # transformers writes the weights through a private temporary file (0600): each file takes the permissions
        # the umask gives a new file (the folder's, which save_pretrained made, less execute), for a folder to share
        mode = os.stat(staged).st_mode & 0o666
        for name in files:
            os.chmod(os.path.join(staged, name), mode)
        with signals_deferred():  # a Ctrl-C between the two renames would delete the earlier export with tmp
            if os.path.exists(folder):  # moved aside, not deleted, until the new folder is in place
                os.replace(folder, os.path.join(tmp, "old"))
            try:
                os.replace(staged, folder)
            except OSError:  # put the earlier export back before tmp, which now holds it, is removed
                if os.path.exists(os.path.join(tmp, "old")):
                    os.replace(os.path.join(tmp, "old"), folder)
                raise
    finally:
        if tmp is not None and os.path.exists(os.path.join(tmp, "old")) and not os.path.exists(folder):
            raise UserError(f"--to={folder}: the new export could not be renamed into place, nor the earlier one "
                            f"back: it is in {os.path.join(tmp, 'old')}; move it back by hand")
        if tmp is not None:
            with signals_deferred():
                shutil.rmtree(tmp, ignore_errors=True)
            if os.path.exists(tmp):
                print(f"warning: could not remove the staging folder {tmp}: remove it by hand", file=sys.stderr)
    return files, tokenizer


def stopped(signum, frame):
    """A SIGTERM (a job's time limit, `timeout`) unwinds as a Ctrl-C does, so the temporary folder goes with it."""
    print(f"stopped by {signal.Signals(signum).name}: --to holds what it held before, or the new export whole if the "
          "stop came as it was put in place", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    start_script()
    signal.signal(signal.SIGTERM, stopped)
    config = configurator.configure(config_defaults, sys.argv[1:], __file__)
    globals().update(config)
    check_init_from(init_from, ("resume",), checkpoint)
    check_target(target_folder(to), overwrite)
    model, vocab = load_trained(init_from, checkpoint_file(out_dir, checkpoint))
    print(export(model, vocab, to, dtype, overwrite))
