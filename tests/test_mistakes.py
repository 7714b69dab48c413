"""Mistakes and faults, one table row each, over every script: each must end in one `error:` line that names
the problem (no traceback, a non-zero exit) and leave every file of an earlier good run and of a prepared
dataset byte for byte as it was. A few faults are handled rather than refused (a torn metrics row); their
rows expect exit 0 and no error line, and the same untouched files.

Every case gets its own copy of the finished run and of the dataset, so the cases run two at a time (the
machine's two cores) and a changed file is pinned on the case that changed it. Each runs in a process of its
own, forked from a Python that has already imported torch (conftest.Warm)."""
import concurrent.futures
import hashlib
import os
import pickle
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from common import read_json
from conftest import ROOT, Warm, load_module, made_up_text

pytestmark = pytest.mark.slow  # about 100 script runs, two at a time

TINY = ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32",
        "--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=2", "--eval_interval=4", "--max_iters=4",
        "--warmup_iters=1", "--lr_decay_iters=4", "--learning_rate=1e-3", "--min_lr=1e-4"]
TRAIN = ["--dataset={data}", "--out_dir={run}", *TINY]  # a new run in the good run's folder: refused if it got far
RESUME = [*TRAIN, "--init_from=resume", "--max_iters=8", "--lr_decay_iters=8"]
# what a resumed run that trains may rewrite; its summary.json goes into run.json's earlier_sessions (checked)
RUN_LOGS = {"metrics.csv", "run.json", "config.json", "run.lock", "summary.json"}


@dataclass
class Case:
    id: str
    script: str  # relative to the repository root
    args: list  # '{run}', '{data}', '{tmp}' are replaced by the case's folders
    pattern: str | None  # matched against the error line; None: the script must succeed
    setup: object = None  # f(case folder, run, data): makes what the case needs
    env: dict = field(default_factory=dict)
    may_change: set = field(default_factory=set)  # files of the good run a case may rewrite (it trains on)
    may_create: set = field(default_factory=set)
    runner: object = None  # f(cmd, env, folders) -> CompletedProcess, for cases that need timing or signals


def write(path, content):
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(path, mode) as f:
        f.write(content)


def config_file(text):
    return lambda tmp, run, data: write(os.path.join(tmp, "exp.py"), text)


def edit_checkpoint(change):
    def setup(tmp, run, data):
        os.makedirs(os.path.join(tmp, "other"))
        saved = torch.load(os.path.join(run, "ckpt.pt"), weights_only=True)
        change(saved)
        torch.save(saved, os.path.join(tmp, "other", "ckpt.pt"))
    return setup


def copy_dataset(change):
    """A second dataset, a copy of the good one with one thing changed."""
    def setup(tmp, run, data):
        shutil.copytree(data, os.path.join(tmp, "other"))
        change(os.path.join(tmp, "other"))
    return setup


def nanogpt_layout(meta_pkl: bytes):
    """nanoGPT's layout: train.bin, val.bin and the given meta.pkl bytes, no meta.json."""
    def change(folder):
        os.remove(os.path.join(folder, "meta.json"))
        write(os.path.join(folder, "meta.pkl"), meta_pkl)
    return change


def wide_train_bin(folder):
    """nanoGPT's layout of GPT-2 ids (no meta.pkl) with train.bin written as uint32, as forks with larger
    vocabularies write it."""
    os.remove(os.path.join(folder, "meta.json"))
    os.remove(os.path.join(folder, "meta.pkl"))
    path = os.path.join(folder, "train.bin")
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens.astype(np.uint32).tofile(path)


def stray_token(folder):
    """A token id past the vocabulary written into train.bin after meta.json (whose max_token_id is trusted)."""
    tokens = np.fromfile(os.path.join(folder, "train.bin"), dtype=np.uint16)
    tokens[::50] = 70
    tokens.tofile(os.path.join(folder, "train.bin"))


def other_vocabulary(tmp, run, data):
    load_module("data/shakespeare_char/prepare.py").prepare(made_up_text(7, 300, 6, 20_000).upper(),
                                                            os.path.join(tmp, "other"))


IMPORT_LOCK = threading.Lock()


def save_tiny_gpt2(tmp):
    """A GPT-2-shaped model with a 1024-token context, saved by transformers, as a local init_from folder."""
    with IMPORT_LOCK:  # cases run two at a time, and transformers' lazy first import is not thread-safe
        from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=1024)).save_pretrained(
        os.path.join(tmp, "hf"))


def torn_row(tmp, run, data):
    with open(os.path.join(run, "metrics.csv"), "a") as f:
        f.write("5,2560,2.71")  # a kill in the middle of an append: no newline, a cut number


def run_holding_the_lock(cmd, env, folders):
    """Start a long run in a fresh out_dir, wait until it holds its lock, then start the case's run there."""
    live = os.path.join(folders["tmp"], "live")
    holder_cmd = [sys.executable, os.path.join(ROOT, "train.py"), f"--dataset={folders['data']}", f"--out_dir={live}",
                  *TINY, "--max_iters=100000", "--eval_interval=100000"]
    holder = subprocess.Popen(holder_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (os.path.exists(os.path.join(live, "metrics.csv")) and holder.poll() is None):
            assert time.time() < deadline and holder.poll() is None, "the holding run did not start"
            time.sleep(0.1)
        result = subprocess.run([c.replace("{live}", live) for c in cmd], env=env, capture_output=True, text=True,
                                timeout=120)
        assert holder.poll() is None, "the holding run was disturbed"
        assert f"pid {holder.pid}" in result.stderr, result.stderr  # the message names the holder
        return result
    finally:
        holder.kill()
        holder.wait()


def after(prelude):
    """Run the script in a Python that first runs `prelude`: the fault is set up inside the process."""
    def runner(cmd, env, folders):
        wrapper = f"import runpy, sys; {prelude}; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        return subprocess.run([cmd[0], "-c", wrapper, *cmd[1:]], env=env, capture_output=True, text=True, timeout=180)
    return runner


# writes past `limit` bytes fail (EFBIG) as they would on a full disk; the signal that would kill the process first
# is ignored, as it is by default for a write(2) to a full disk
def file_size_limit(limit):
    return after("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                 f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))")


WITHOUT_TRANSFORMERS = after("sys.modules['transformers'] = None")  # `import transformers` then fails as if absent


def sigterm_after_iter(iter_num):
    def runner(cmd, env, folders):
        proc = subprocess.Popen(cmd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if line.startswith(f"iter {iter_num}/"):
                proc.send_signal(signal.SIGTERM)
                break
        stdout, stderr = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    return runner


NOT_UTF8 = b"batch_size = 4  # \xe9t\xe9\n"

CASES = [
    # ---- train.py: settings out of range, each caught by its rule before any file is touched
    Case("batch_size=0", "train.py", [*TRAIN, "--batch_size=0"], r"^error: batch_size=0 is not valid: .*batch_size > 0"),
    Case("block_size=0", "train.py", [*TRAIN, "--block_size=0"], r"block_size=0 is not valid"),
    Case("grad_accum=0", "train.py", [*TRAIN, "--gradient_accumulation_steps=0"], r"gradient_accumulation_steps=0 is not valid"),
    Case("rope_theta=inf", "train.py", [*TRAIN, "--pos_emb=rope", "--rope_theta=inf"], r"rope_theta=inf is not valid"),
    Case("eval_iters=0", "train.py", [*TRAIN, "--eval_iters=0"], r"eval_iters=0 is not valid"),
    Case("eval_interval=0", "train.py", [*TRAIN, "--eval_interval=0"], r"eval_interval=0 is not valid"),
    Case("log_interval=0", "train.py", [*TRAIN, "--log_interval=0"], r"log_interval=0 is not valid"),
    Case("max_iters=0", "train.py", [*TRAIN, "--max_iters=0"], r"max_iters=0 is not valid"),
    Case("n_head=0", "train.py", [*TRAIN, "--n_head=0"], r"n_head=0 is not valid"),
    Case("n_embd%n_head", "train.py", [*TRAIN, "--n_embd=33"], r"n_embd=33 is not valid: .*n_embd % n_head == 0 \(with n_head=2\)"),
    Case("learning_rate<0", "train.py", [*TRAIN, "--learning_rate=-1"], r"learning_rate=-1.0 is not valid"),
    Case("ddp_timeout past torch's timers", "train.py", [*TRAIN, "--ddp_timeout=100000000000000"],
         r"ddp_timeout=100000000000000 is not valid: ddp_timeout must satisfy 0 < ddp_timeout <= 100000000"),
    Case("min_lr<0", "train.py", [*TRAIN, "--min_lr=-1e-4"], r"min_lr=-0.0001 is not valid: .*0 <= min_lr"),
    Case("min_lr>lr", "train.py", [*TRAIN, "--min_lr=0.5"],
         r"min_lr=0.5 is not valid: .*\(with learning_rate=0.001, lr_schedule='cosine', decay_lr=True\)"),
    Case("learning_rate below min_lr's default", "train.py",
         [*(a for a in TRAIN if not a.startswith("--min_lr=")), "--learning_rate=1e-5"],
         r"min_lr=6e-05 is not valid: .*\(with learning_rate=1e-05, .*\); min_lr was not given, so it kept its "
         r"default: give --min_lr as well$"),
    Case("min_lr>lr under a constant schedule, which never uses it", "train.py",
         [*TRAIN, "--out_dir={tmp}/new", "--min_lr=0.5", "--lr_schedule=constant"], None),
    Case("weight_decay<0", "train.py", [*TRAIN, "--weight_decay=-0.1"], r"weight_decay=-0.1 is not valid"),
    Case("beta2=1.5", "train.py", [*TRAIN, "--beta2=1.5"], r"beta2=1.5 is not valid: .*0 <= beta2 < 1"),
    Case("nccl on a cpu", "train.py", [*TRAIN, "--backend=nccl"], r"backend='nccl' is not valid: .*\(with device='cpu'\)"),
    Case("eval nccl on a cpu", "eval.py", ["--out_dir={run}", "--device=cpu", "--backend=nccl"],
         r"backend='nccl' is not valid: .*\(with device='cpu'\)"),
    Case("dropout=1.5", "train.py", [*TRAIN, "--dropout=1.5"], r"dropout=1.5 is not valid"),
    Case("seed=-1", "train.py", [*TRAIN, "--seed=-1"], r"seed=-1 is not valid"),
    Case("grad_clip<0", "train.py", [*TRAIN, "--grad_clip=-1"], r"grad_clip=-1.0 is not valid"),
    Case("keep_last_n<0", "train.py", [*TRAIN, "--keep_last_n=-1"], r"keep_last_n=-1 is not valid"),
    Case("log_format", "train.py", [*TRAIN, "--log_format=xml"], r"log_format='xml' is not valid: .*'text', 'json', 'quiet'"),
    Case("backend", "train.py", [*TRAIN, "--backend=mpi"], r"backend='mpi' is not valid"),
    Case("dtype", "train.py", [*TRAIN, "--dtype=float64"], r"dtype='float64' is not valid"),
    Case("batch_size not a number", "train.py", [*TRAIN, "--batch_size=max"], r"'batch_size' .* must be int or 'auto' \(default 12\), got 'max'"),
    Case("fp8 with matrix sides not multiples of 16", "train.py", [*TRAIN, "--fp8=True", "--n_embd=40"],
         r"fp8=True needs every matrix .* multiples of 16, and h.0.attn.c_attn is 120 x 40"),
    Case("type", "train.py", [*TRAIN, "--batch_size=big"], r"config key 'batch_size' in flag '--batch_size=big' must be int"),
    Case("unknown key", "train.py", [*TRAIN, "--lerning_rate=1"], r"unknown config key 'lerning_rate'.*did you mean 'learning_rate'"),
    Case("init_from", "train.py", [*TRAIN, "--init_from=gpt5"], r"init_from='gpt5' is not scratch, resume, one of gpt2"),
    Case("eval_only scratch", "train.py", [*TRAIN, "--eval_only=True"], r"eval_only=True evaluates a trained model"),
    Case("device", "train.py", [*TRAIN, "--device=cuda"], r"device 'cuda' asked for but CUDA is not available"),
    Case("out_dir empty", "train.py", [*TRAIN, "--out_dir="], r"out_dir is empty: give --out_dir=\.\.\."),
    Case("wandb without a login", "train.py", [*TRAIN, "--out_dir={tmp}/new", "--wandb_log=True"],
         r"wandb_log=True but wandb could not start \(\w+: No API key.*\): check the WANDB_ variables, run `wandb "
         r"login`, set WANDB_MODE=offline",
         env={"WANDB_MODE": "online", "WANDB_API_KEY": "", "HOME": "{tmp}", "WANDB_CONFIG_DIR": "{tmp}/wandb_config"}),
    Case("wandb with a bad WANDB_MODE", "train.py", [*TRAIN, "--out_dir={tmp}/new", "--wandb_log=True"],
         r"wandb_log=True but wandb could not start \(ValidationError: .*'bogus'.*\): check the WANDB_ variables",
         env={"WANDB_MODE": "bogus"}),
    Case("device meta", "train.py", [*TRAIN, "--device=meta"], r"device 'meta' is not a device this trainer runs on"),
    Case("device typo", "sample.py", ["--out_dir={run}", "--device=cpuu"], r"device 'cpuu' is not a device this trainer"),
    # ---- train.py: config files
    Case("config missing", "train.py", ["{tmp}/nope.py", *TRAIN], r"config file '.*nope.py' not found"),
    Case("config syntax", "train.py", ["{tmp}/exp.py", *TRAIN], r"config file '.*exp.py' line 2: syntax error",
         setup=config_file("batch_size = 4\nlearning_rate = (\n")),
    Case("config raises", "train.py", ["{tmp}/exp.py", *TRAIN], r"exp.py' line 2 raised ZeroDivisionError",
         setup=config_file("batch_size = 4\nlearning_rate = 1 / 0\n")),
    Case("config import", "train.py", ["{tmp}/exp.py", *TRAIN], r"exp.py' line 1 raised ModuleNotFoundError: No module named 'nonexistent'",
         setup=config_file("import nonexistent\n")),
    Case("config not utf8", "train.py", ["{tmp}/exp.py", *TRAIN], r"exp.py' is not UTF-8 text",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "exp.py"), NOT_UTF8)),
    Case("config bad value", "train.py", [*TRAIN, "{tmp}/exp.py"], r"eval_iters=-3 is not valid",
         setup=config_file("eval_iters = -3\n")),
    # ---- train.py: the launcher's environment
    Case("RANK without LOCAL_RANK", "train.py", TRAIN, r"RANK set but not LOCAL_RANK, WORLD_SIZE: launch with torchrun",
         env={"RANK": "0"}),
    Case("RANK not an int", "train.py", TRAIN, r"RANK, LOCAL_RANK and WORLD_SIZE must be integers",
         env={"RANK": "zero", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}),
    Case("RANK >= WORLD_SIZE", "train.py", TRAIN, r"RANK=2, LOCAL_RANK=0, WORLD_SIZE=2 do not fit together",
         env={"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}),
    Case("LOCAL_WORLD_SIZE not a count", "train.py", TRAIN, r"LOCAL_WORLD_SIZE must be a positive integer, not '0'",
         env={"LOCAL_WORLD_SIZE": "0"}),
    # ---- train.py: out_dir
    Case("scratch over a run", "train.py", TRAIN, r"out_dir .* already holds a run \(best.pt, ckpt.pt, metrics.csv, summary.json\): "
         r"continue it with --init_from=resume, .*--overwrite=True"),
    Case("out_dir a dangling link", "train.py", [*TRAIN, "--out_dir={tmp}/scratch/run"],
         r"out_dir .*scratch/run: .*scratch is a link to .*unmounted, which does not exist: mount or create its target",
         setup=lambda tmp, run, data: os.symlink(os.path.join(tmp, "unmounted"), os.path.join(tmp, "scratch"))),
    Case("init_from a run's folder", "train.py", [*TRAIN, "--out_dir={tmp}/new", "--init_from={run}"],
         r"run is a training run's folder, not a transformers model: pass --init_from=.*run/ckpt.pt"),
    Case("overwrite the run it starts from", "train.py", [*TRAIN, "--init_from={run}/ckpt.pt", "--overwrite=True"],
         r"init_from=.*run/ckpt.pt is (best|ckpt).pt of the run that --overwrite=True replaces, and would be deleted"),
    Case("new run over results without a checkpoint", "train.py", [*TRAIN, "--out_dir={tmp}/other"],
         r"out_dir .*other already holds a run \(eval.json, metrics.csv\): it has no ckpt.pt to resume: choose another "
         r"out_dir, or pass --overwrite=True",
         setup=lambda tmp, run, data: (os.makedirs(os.path.join(tmp, "other")),
                                       shutil.copy(os.path.join(run, "metrics.csv"), os.path.join(tmp, "other")),
                                       write(os.path.join(tmp, "other", "eval.json"), "{}"))),
    Case("resume over a damaged metrics row", "train.py", RESUME, r"metrics.csv line 3 is damaged \(iter='x' is not a number\)",
         setup=lambda tmp, run, data: write(os.path.join(run, "metrics.csv"), "".join(
             ("x" + line[line.index(","):]) if i == 2 else line
             for i, line in enumerate(open(os.path.join(run, "metrics.csv")).readlines())))),
    Case("out_dir holds another program's config.json", "train.py", [*TRAIN, "--out_dir={tmp}/hf"],
         r"out_dir .*hf holds a config.json that no training run wrote, which a run's would replace: choose another "
         r"out_dir, or move that file out of it$",
         setup=lambda tmp, run, data: (os.makedirs(os.path.join(tmp, "hf")),
                                       write(os.path.join(tmp, "hf", "config.json"), '{"model_type": "gpt2"}'))),
    Case("out_dir a dataset's folder", "train.py", [*TRAIN, "--out_dir={data}", "--overwrite=True"],
         r"out_dir .*data holds a dataset \(meta.json, train.bin, val.bin\): a run's files go in a folder of their own; "
         r"choose another out_dir$"),
    Case("out_dir a sharded dataset's folder", "train.py", [*TRAIN, "--out_dir={tmp}/shards"],
         r"out_dir .*shards holds a dataset \(train_000.bin\): a run's files go in a folder of their own",
         setup=lambda tmp, run, data: (os.makedirs(os.path.join(tmp, "shards")),
                                       write(os.path.join(tmp, "shards", "train_000.bin"), b""))),
    Case("out_dir not writable", "train.py", [*TRAIN, "--out_dir={tmp}/a_file/out"], r"out_dir .*a_file/out is not writable",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "a_file"), "not a folder")),
    Case("out_dir in use", "train.py", [*TRAIN, "--out_dir={live}", "--overwrite=True"],
         r"out_dir .*live is in use by train.py \(pid \d+ on .*\): wait for that run to end", runner=run_holding_the_lock),
    # ---- train.py: checkpoints
    Case("resume another shape", "train.py", [*RESUME, "--n_layer=3"], r"another model shape: n_layer=3 \(checkpoint: 2\); give the checkpoint's \(--n_layer=2\)"),
    Case("resume nothing", "train.py", [*RESUME, "--out_dir={tmp}/empty"],  # and no folder made of the typo
         r"no checkpoint at .*empty/ckpt.pt: there is no folder .*empty; check out_dir"),
    Case("torn checkpoint", "train.py", [*RESUME, "--out_dir={tmp}/other"], r"checkpoint .*other/ckpt.pt cannot be read",
         setup=lambda tmp, run, data: (os.makedirs(os.path.join(tmp, "other")), write(
             os.path.join(tmp, "other", "ckpt.pt"), open(os.path.join(run, "ckpt.pt"), "rb").read()[:5000]))),
    Case("foreign checkpoint", "train.py", [*RESUME, "--out_dir={tmp}/other"], r"lacks \['best_iter', 'best_val_loss', 'config'",
         setup=edit_checkpoint(lambda c: [c.pop(k) for k in list(c) if k not in ("model", "iter_num")])),
    Case("resume with another optimizer", "train.py", [*RESUME, "--optimizer=muon"],
         r"was trained with optimizer=adamw, not muon: resume with that optimizer"),
    Case("model_args lacks a key", "train.py", [*RESUME, "--out_dir={tmp}/other"], r"lacks \[\"model_args\['n_head'\]\"\]",
         setup=edit_checkpoint(lambda c: c["model_args"].pop("n_head"))),
    Case("checkpoint whose model_args build no model", "sample.py", ["--out_dir={tmp}/other", "--device=cpu"],
         r"checkpoint .*other/ckpt.pt has model_args that build no model \(pos_emb 'alibi' is not one of .*\): it is "
         r"damaged, or not written by this trainer or nanoGPT$",
         setup=edit_checkpoint(lambda c: c["model_args"].update(pos_emb="alibi"))),
    Case("checkpoint whose rope_theta is 0", "sample.py", ["--out_dir={tmp}/other", "--device=cpu"],
         r"has model_args that build no model \(rope_theta 0.0 is not a positive finite number\): it is damaged",
         setup=edit_checkpoint(lambda c: c["model_args"].update(rope_theta=0.0))),
    Case("checkpoint whose vocab_size is a float", "export.py", ["--out_dir={tmp}/other", "--to={tmp}/hf"],
         r"checkpoint .*other/ckpt.pt has model_args vocab_size=\d+\.0, not of the types this trainer writes: it is "
         r"damaged, or not written by this trainer or nanoGPT$",
         setup=edit_checkpoint(lambda c: c["model_args"].update(vocab_size=float(c["model_args"]["vocab_size"])))),
    Case("resume of a checkpoint whose vocab_size is a float", "train.py", [*RESUME, "--out_dir={tmp}/other"],
         r"checkpoint .*other/ckpt.pt has model_args vocab_size=\d+\.0, not of the types this trainer writes",
         setup=edit_checkpoint(lambda c: c["model_args"].update(vocab_size=float(c["model_args"]["vocab_size"])))),
    Case("checkpoint whose weights are lists", "sample.py", ["--out_dir={tmp}/other", "--device=cpu"],
         r"checkpoint .*other/ckpt.pt holds values that are not tensors in its weights \(\['lm_head.weight'\]\): it is "
         r"damaged$", setup=edit_checkpoint(lambda c: c["model"].update({"lm_head.weight": [0.0]}))),
    Case("checkpoint whose weights hold nan", "sample.py", ["--out_dir={tmp}/other", "--device=cpu"],
         r"other/ckpt.pt holds weights that are not finite \(1 tensor, e.g. transformer.ln_f.weight\): the file is "
         r"damaged, or was saved after training diverged; use another checkpoint$",
         setup=edit_checkpoint(lambda c: c["model"]["transformer.ln_f.weight"].fill_(float("nan")))),
    Case("checkpoint whose weights overflow", "sample.py", ["--out_dir={tmp}/other", "--device=cpu"],
         r"the model's logits were nan or inf while generating: .*, sampling in \w+: "
         r"(try --dtype=float32|check the checkpoint)$",  # finite weights whose norm's square passes float32's range
         setup=edit_checkpoint(lambda c: c["model"]["transformer.wte.weight"].fill_(1e20))),
    Case("checkpoint whose characters outnumber its vocab_size", "export.py", ["--out_dir={tmp}/other", "--to={tmp}/hf"],
         r"other/ckpt.pt holds a tokenizer of \d+ tokens for a model of vocab_size \d+: they are not one model's; "
         r"the checkpoint is damaged$",
         setup=edit_checkpoint(lambda c: c["vocabulary"].update(chars=c["vocabulary"]["chars"] + "".join(
             map(chr, range(300, 400)))))),
    Case("checkpoint whose vocabulary is a string", "eval.py", ["--out_dir={tmp}/other", "--device=cpu"],
         r"checkpoint .*other/ckpt.pt has a vocabulary of type str, not the table this trainer writes: it is damaged$",
         setup=edit_checkpoint(lambda c: c.update(vocabulary="char"))),
    Case("eval_only over eval.py's eval.json", "train.py", [*TRAIN, "--init_from=resume", "--eval_only=True"],
         r"eval.json already exists and is not an earlier result of an eval_only run: move it aside, or evaluate into "
         r"another out_dir$", setup=lambda tmp, run, data: write(os.path.join(run, "eval.json"), '{"acc_norm": 0.3}')),
    Case("resume with ckpt.pt moved away", "train.py", [*RESUME, "--out_dir={tmp}/moved"],
         r"no checkpoint at .*moved/ckpt.pt: .*moved keeps ckpt_0000004.pt: --resume_from=ckpt_0000004.pt reads the "
         r"last$", setup=lambda tmp, run, data: (os.makedirs(os.path.join(tmp, "moved")), shutil.copy(
             os.path.join(run, "ckpt.pt"), os.path.join(tmp, "moved", "ckpt_0000004.pt")))),
    Case("out_dir where nothing can be made", "train.py", ["--dataset={data}", "--out_dir=/proc/run", *TINY],
         r"out_dir /proc/run is not writable \(.*\): choose another out_dir$"),  # even for root
    Case("resume whose flag breaks a rule with the run's own", "train.py", ["--out_dir={run}", "--init_from=resume",
                                                                             "--max_iters=8", "--learning_rate=1e-5"],
         r"min_lr=0.0001 is not valid: .* \(with learning_rate=1e-05, lr_schedule='cosine', decay_lr=True\); min_lr is the run's own \(a "
         r"resume keeps each setting it is not given\): give --min_lr=... for another$"),
    Case("hellaswag_file not there", "train.py", [*TRAIN, "--out_dir={tmp}/new", "--hellaswag_interval=1",
                                                  "--hellaswag_file={tmp}/nope.jsonl"],
         r"HellaSwag file .*nope.jsonl not found: give --hellaswag_file=PATH of hellaswag_val.jsonl$"),
    Case("resume on another vocabulary", "train.py", [*RESUME, "--dataset={tmp}/other"],
         r"dataset .*other has \d+ characters but checkpoint .* was trained on \d+ characters \(only the dataset has "
         r"26 characters, 'ABCDEFGHIJKLMNOPQRST'\.\.\.; only the checkpoint has 26 characters, "
         r"'abcdefghijklmnopqrst'\.\.\.\): resume on the run's own dataset, or start a new run$",
         setup=other_vocabulary),
    Case("init_from on another vocabulary", "train.py", [*TRAIN, "--dataset={tmp}/other", "--out_dir={tmp}/new",
                                                         "--init_from={run}/ckpt.pt"],
         r"but checkpoint .*ckpt.pt was trained on \d+ characters .*: give a dataset prepared as the model's own was$",
         setup=other_vocabulary),
    Case("full disk at checkpoint", "train.py", RESUME,
         r"could not write checkpoint .*ckpt.pt \(.*\): the previous checkpoint is unchanged",
         runner=file_size_limit(48_000), may_change=RUN_LOGS),
    Case("SIGTERM with non-finite weights", "train.py",
         [*RESUME, "--max_iters=1000", "--learning_rate=1e39", "--min_lr=0", "--grad_clip=0", "--max_nonfinite_steps=1000"],
         None, runner=sigterm_after_iter(6), may_change=RUN_LOGS),  # stopped; ckpt.pt as it was
    Case("non-finite steps in a row", "train.py",
         [*RESUME, "--max_iters=40", "--learning_rate=1e30", "--min_lr=0", "--grad_clip=0", "--max_nonfinite_steps=3"],
         r"3 steps in a row had a non-finite loss .* the last good checkpoint, .*ckpt.pt at iter 4, is kept",
         may_change=RUN_LOGS),
    Case("non-finite steps in a row before any checkpoint", "train.py",
         [*TRAIN, "--out_dir={tmp}/new", "--max_iters=40", "--learning_rate=1e30", "--min_lr=0", "--grad_clip=0",
          "--max_nonfinite_steps=3"], r"3 steps in a row had a non-finite loss .*: stopping; no checkpoint had been written"),
    Case("non-finite weights at the last evaluation", "train.py",  # too few steps for max_nonfinite_steps to stop it
         [*RESUME, "--learning_rate=1e30", "--min_lr=0", "--grad_clip=0", "--max_nonfinite_steps=1000"],
         r"the last evaluation \(iter 8\) gave val loss nan: the weights are not finite and were not saved; the last "
         r"good checkpoint, .*ckpt.pt at iter 4, is kept", may_change=RUN_LOGS),
    # ---- train.py: datasets
    Case("dataset missing", "train.py", [*TRAIN, "--dataset={tmp}/nothing_here"],  # named once: the path is absolute
         r"dataset '(.*nothing_here)' not found: no folder \1; prepare it first"),
    Case("dataset name unknown", "train.py", [*TRAIN, "--dataset=no_such_dataset"],  # no data/no_such_dataset/prepare.py
         r"dataset 'no_such_dataset' not found: no folder no_such_dataset or .*data/no_such_dataset; prepare it first "
         r"\(python data/prepare.py --input YOUR_TEXT --out_dir data/no_such_dataset\)$"),
    Case("dataset a run's folder", "train.py", [*TRAIN, "--out_dir={tmp}/new", "--dataset={run}"],
         r"dataset '.*run' is a training run's folder \(ckpt.pt, run.json\), not a dataset: give the dataset folder "
         r"the run trained on \(its config.json names it\)$"),
    Case("dataset not prepared", "train.py", [*TRAIN, "--dataset={tmp}/fresh"],
         r"has no train.bin or meta.json in .*fresh: prepare it first \(python .*fresh/prepare.py\)",
         setup=lambda tmp, run, data: (os.makedirs(os.path.join(tmp, "fresh")),
                                       write(os.path.join(tmp, "fresh", "prepare.py"), "# writes the token files\n"))),
    Case("meta.json torn", "train.py", [*TRAIN, "--dataset={tmp}/other"], r"other/meta.json is not valid JSON",
         setup=copy_dataset(lambda d: write(os.path.join(d, "meta.json"), open(os.path.join(d, "meta.json")).read()[:40]))),
    Case("meta.json lacks a key", "train.py", [*TRAIN, "--dataset={tmp}/other"], r"meta.json lacks \['vocab_size'\]",
         setup=copy_dataset(lambda d: write(os.path.join(d, "meta.json"), open(os.path.join(d, "meta.json")).read()
                                            .replace('"vocab_size"', '"vocab"')))),
    Case("meta.json float16", "train.py", [*TRAIN, "--dataset={tmp}/other"], r"meta.json gives dtype 'float16', not uint16",
         setup=copy_dataset(lambda d: write(os.path.join(d, "meta.json"), open(os.path.join(d, "meta.json")).read()
                                            .replace('"uint16"', '"float16"')))),
    Case("meta.json char without chars", "train.py", [*TRAIN, "--dataset={tmp}/other"], r"meta.json gives no chars",
         setup=copy_dataset(lambda d: write(os.path.join(d, "meta.json"), open(os.path.join(d, "meta.json")).read()
                                            .replace('"chars"', '"characters"')))),
    Case("meta.pkl torn", "train.py", [*TRAIN, "--dataset={tmp}/other"], r"meta.pkl is torn or not a pickle",
         setup=copy_dataset(nanogpt_layout(b"\x80\x04\x95\x10\x00"))),
    Case("meta.pkl lacks itos", "train.py", [*TRAIN, "--dataset={tmp}/other"], r"meta.pkl lacks vocab_size or an itos table",
         setup=copy_dataset(nanogpt_layout(b"\x80\x04}\x94\x8c\nvocab_size\x94K\x05s."))),
    Case("meta.pkl itos keys mixed", "train.py", [*TRAIN, "--dataset={tmp}/other"],
         r"meta.pkl lacks vocab_size or an itos table of ids 0..n-1 to characters",
         setup=copy_dataset(nanogpt_layout(pickle.dumps({"vocab_size": 2, "itos": {0: "a", "1": "b"}})))),
    Case("legacy train.bin uint32", "train.py", [*TRAIN, "--dataset={tmp}/other"],
         r"train.bin looks like uint32 tokens \(every second uint16 is 0\), but without meta.json",
         setup=copy_dataset(wide_train_bin)),
    Case("token id past the vocabulary", "train.py", [*TRAIN, "--dataset={tmp}/other", "--out_dir={tmp}/new"],
         r"train.bin holds token id 70, out of range for the model's vocab_size \d+: the file changed since its "
         r"meta.json was written", setup=copy_dataset(stray_token)),
    Case("token file torn", "train.py", [*TRAIN, "--dataset={tmp}/other"], r"val.bin is \d+ bytes, not a whole number of 2-byte",
         setup=copy_dataset(lambda d: open(os.path.join(d, "val.bin"), "ab").write(b"\x01"))),
    Case("block_size past val", "train.py", [*TRAIN, "--block_size=100000"], r"block_size 100000 is not shorter than the val split"),
    Case("sample_prompt empty", "train.py", [*TRAIN, "--sample_interval=1", "--sample_prompt="],
         r"sample_prompt is empty: give --sample_prompt=\.\.\."),
    Case("gpt2 block_size too long", "train.py", [*TRAIN, "--init_from={tmp}/hf", "--block_size=2048"],
         r"block_size 2048 is longer than .*hf's context of 1024", setup=lambda tmp, run, data: save_tiny_gpt2(tmp)),
    Case("block_size given as its default", "train.py", [*TRAIN, "--out_dir={tmp}/new", "--init_from={run}/ckpt.pt",
                                                        "--block_size=1024"],
         r"block_size 1024 is longer than .*ckpt.pt's context of 32"),  # not taken as unset, and cropped
    Case("init_from of another shape", "train.py", [*TRAIN, "--init_from={tmp}/hf", "--n_layer=3"],
         r"init_from=.*hf is a model of another shape: n_layer=3 \(.*hf: 2\); drop those settings .*\(--n_layer=2\)",
         setup=lambda tmp, run, data: save_tiny_gpt2(tmp)),
    Case("dataset a token file", "train.py", [*TRAIN, "--dataset={data}/train.bin"],
         r"dataset '.*train.bin' is a file, not a dataset folder: give its folder, --dataset=.*"),
    Case("dataset a text file", "train.py", [*TRAIN, "--dataset={tmp}/notes.txt"],
         r"dataset '.*notes.txt' is a file, not a dataset folder: prepare it first \(python data/prepare.py --input "
         r".*notes.txt --out_dir data/NAME\), then give that folder", setup=lambda tmp, run, data: write(os.path.join(tmp, "notes.txt"), "hi")),
    Case("meta.json file names", "train.py", [*TRAIN, "--dataset={tmp}/other"], r"meta.json has no train split with a list",
         setup=copy_dataset(lambda d: write(os.path.join(d, "meta.json"), open(os.path.join(d, "meta.json")).read()
                                            .replace('"train.bin"', '5')))),
    Case("sample_prompt", "train.py", [*TRAIN, "--sample_interval=1", "--sample_prompt=XYZ"],
         r"sample_prompt: the text has characters the dataset does not: \['X', 'Y', 'Z'\]: write it with"),
    Case("gpt2 without transformers", "train.py", [*TRAIN, "--init_from=gpt2"],
         r"needs Hugging Face transformers: pip install transformers", runner=WITHOUT_TRANSFORMERS),
    Case("wandb_log without wandb", "train.py", [*TRAIN, "--wandb_log=True"],
         r"wandb_log=True but wandb is not installed: pip install wandb, or pass --wandb_log=False",
         runner=after("sys.modules['wandb'] = None")),
    Case("gpt2 offline", "train.py", [*TRAIN, "--init_from=gpt2"], r"could not load 'gpt2' \(.*\): without network access, save the model .* and pass that folder",
         env={"HF_HUB_OFFLINE": "1", "HF_HOME": "{tmp}/hf"}),
    Case("model too big for the host", "train.py", ["--dataset={data}", "--out_dir={tmp}/big", "--device=cpu", "--compile=False",
                                                    "--n_layer=1", "--n_head=1", "--n_embd=262144", "--block_size=32", "--dry_run=True"],
         r"the model's weights take \d+\.\d\d GiB in fp32 \(824\.\d\dB parameters\), built in host memory before they move "
         r"to the device, but the host has \d+\.\d\d GiB available \(memory and swap\): choose a smaller model"),  # was torch's traceback
    # ---- sample.py
    Case("sample given train.py's config", "sample.py", [os.path.join(ROOT, "config", "train_shakespeare_char.py")],
         r"config file '.*train_shakespeare_char.py' sets \d+ settings this script does not have \(eval_interval, .*"
         r"another script's config; for the out_dir it names, pass --out_dir=out-shakespeare-char;"),
    Case("sample temperature<0", "sample.py", ["--out_dir={run}", "--device=cpu", "--temperature=-1"], r"temperature=-1.0 is not valid"),
    Case("sample top_k<0", "sample.py", ["--out_dir={run}", "--device=cpu", "--top_k=-1"], r"top_k=-1 is not valid"),
    Case("sample top_p=0", "sample.py", ["--out_dir={run}", "--device=cpu", "--top_p=0"], r"top_p=0.0 is not valid: "
         r"top_p must satisfy 0 < top_p <= 1$"),
    Case("sample --checkpoint with a file as init_from", "sample.py",
         ["--init_from={run}/ckpt.pt", "--checkpoint=best.pt", "--device=cpu"],
         r"checkpoint='best.pt' picks a file in out_dir, which init_from='.*ckpt.pt' does not read: drop --checkpoint, "
         r"or pass that file's path as --init_from$"),
    Case("sample given a checkpoint as its config file", "sample.py", ["{run}/ckpt.pt", "--device=cpu"],
         r"'.*ckpt.pt' is a model's weights, not a config file: train.py, sample.py, eval.py and export.py take it "
         r"as --init_from=.*ckpt.pt$"),
    Case("sample given an eval config of GPT-2", "sample.py", [os.path.join(ROOT, "config", "eval_gpt2.py")],
         r"it reads as another script's config; for the model it evaluates, pass --init_from=gpt2; see --help"),
    Case("sample given a finetune config", "sample.py", [os.path.join(ROOT, "config", "finetune_shakespeare.py")],
         r"it reads as another script's config; for the out_dir it names, pass --out_dir=out-shakespeare; see --help"),
    Case("sample num_samples=0", "sample.py", ["--out_dir={run}", "--device=cpu", "--num_samples=0"], r"num_samples=0 is not valid"),
    Case("sample max_new_tokens=0", "sample.py", ["--out_dir={run}", "--device=cpu", "--max_new_tokens=0"], r"max_new_tokens=0 is not valid"),
    Case("sample prompt file", "sample.py", ["--out_dir={run}", "--device=cpu", "--start=FILE:{tmp}/nope.txt"],
         r"start='FILE:.*nope.txt': prompt file .*nope.txt' not found: check the path after FILE:"),
    Case("sample prompt chars", "sample.py", ["--out_dir={run}", "--device=cpu", "--start=XYZ"],
         r"start: the text has characters the dataset does not"),
    Case("sample no checkpoint", "sample.py", ["--out_dir={tmp}", "--device=cpu"], r"no checkpoint at .*ckpt.pt"),
    Case("sample which checkpoint", "sample.py", ["--out_dir={run}", "--device=cpu", "--checkpoint=ckpt_9.pt"], r"no checkpoint at .*ckpt_9.pt"),
    Case("sample gpt2 without transformers", "sample.py", ["--init_from=gpt2", "--device=cpu"],
         r"needs Hugging Face transformers", runner=WITHOUT_TRANSFORMERS),
    Case("a setting without its dashes", "sample.py", ["--out_dir={run}", "--device=cpu", "num_samples=2"],
         r"'num_samples=2' is not a config file: give settings with their dashes, --num_samples=2$"),
    Case("sample a run folder", "sample.py", ["{run}", "--device=cpu"],
         r"'.*run' is a folder, not a config file: settings are given as --key=value; for the run in it, pass --out_dir=.*run"),
    Case("sample empty prompt", "sample.py", ["--out_dir={run}", "--device=cpu", "--start="],
         r"start is empty: give a prompt of at least one token, e.g. --start=ROMEO:, or leave --start out"),
    Case("sample init_from", "sample.py", ["--out_dir={run}", "--device=cpu", "--init_from=gpt5"], r"init_from='gpt5' is not resume"),
    # ---- eval.py and export.py
    Case("eval of no checkpoint", "eval.py", ["--out_dir={tmp}/none", "--device=cpu", "--hellaswag={run}/metrics.csv"],
         r"no checkpoint at .*none/ckpt.pt: there is no folder .*none; check out_dir and checkpoint$"),  # before the file's items
    Case("sample a checkpoint not kept", "sample.py", ["--out_dir={run}", "--device=cpu", "--checkpoint=ckpt_40.pt"],
         r"no checkpoint at .*run/ckpt_40.pt: check out_dir and checkpoint; .*run holds best.pt, ckpt.pt: name one with "
         r"--checkpoint$"),
    Case("eval out_file over a checkpoint", "eval.py", ["--out_dir={run}", "--device=cpu", "--out_file={run}/ckpt.pt"],
         r"out_file=.*ckpt.pt' is not valid: out_file must satisfy out_file == '' or out_file.endswith\('.json'\)"),
    Case("eval out_file a folder", "eval.py", ["--out_dir={run}", "--device=cpu", "--out_file={tmp}/r.json"],
         r"out_file .*r.json is a folder: name a .json file", setup=lambda tmp, run, data: os.makedirs(os.path.join(tmp, "r.json"))),
    Case("eval out_file where nothing can be written", "eval.py", ["--out_dir={run}", "--device=cpu",
                                                                   "--out_file=/proc/result.json"],
         r"out_file /proc/result.json: cannot write in /proc \(.*\): name a file on a writable disk with space$"),
    Case("eval out_file of a name too long", "eval.py", ["--out_dir={run}", "--device=cpu", "--out_file={tmp}/" + "r" * 250 + ".json"],
         r"out_file .*rrr.json: its name is longer than the 251 bytes a name may have there: name a shorter file$"),
    Case("eval out_file on a full disk", "eval.py", ["--out_dir={run}", "--device=cpu", "--out_file={tmp}/full.json"],
         r"out_file .*full.json: cannot write in .* \(File too large\): name a file on a writable disk with space$",
         runner=file_size_limit(1000)),  # a full disk's failed write, before the scoring
    Case("eval out_file over a run's summary", "eval.py", ["--out_dir={run}", "--device=cpu", "--out_file={run}/summary.json"],
         r"out_file .*summary.json already exists and is not an earlier result of eval.py: choose another out_file"),
    Case("export under a link to nothing", "export.py", ["--out_dir={run}", "--to={tmp}/gone/hf"],
         r"--to=.*gone/hf lies under .*gone, a link to .*nowhere, which does not exist: make that folder, or choose "
         r"another --to$", setup=lambda tmp, run, data: os.symlink(os.path.join(tmp, "nowhere"), os.path.join(tmp, "gone"))),
    Case("export over the run", "export.py", ["--out_dir={run}", "--to={run}", "--overwrite=True"],
         r"already exists and is not an earlier export \(it holds best.pt, ckpt.pt"),
    Case("export under a file", "export.py", ["--out_dir={run}", "--to={run}/ckpt.pt/hf"], r"lies under .*ckpt.pt, which is a file"),
    Case("export where nothing can be written", "export.py", ["--out_dir={run}", "--to=/proc/hf"],
         r"--to=/proc/hf: cannot write in /proc \(.*\): choose a --to on a writable disk"),
    Case("export to a mount point", "export.py", ["--out_dir={run}", "--to=/proc", "--overwrite=True"],
         r"--to=/proc is a mount point, which an export, renamed into place, cannot replace: give a folder in it, "
         r"such as --to=/proc/hf$"),  # before, an empty one was said to lack config.json, a full one failed at the end
    Case("export of a name too long", "export.py", ["--out_dir={run}", "--to={tmp}/" + "h" * 300 + "/hf"],
         r"the name h{40}\.\.\. is longer than the 255 bytes a name may have in .*: choose a shorter --to$"),
    # ---- plot.py
    Case("plot missing", "plot.py", ["{tmp}"], r"metrics.csv not found: give the out_dir of a run"),
    Case("plot empty", "plot.py", ["{tmp}"], r"metrics.csv is empty or has no header",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "metrics.csv"), "")),
    Case("plot damaged row", "plot.py", ["{tmp}/other"], r"metrics.csv line 3 is damaged \(loss='x7' is not a number\)",
         setup=lambda tmp, run, data: (os.makedirs(os.path.join(tmp, "other")), write(
             os.path.join(tmp, "other", "metrics.csv"), "iter,tokens,loss\n1,8,4.1\n2,16,x7\n3,24,3.9\n"))),
    Case("plot blank tokens", "plot.py", ["{tmp}/other"], r"metrics.csv line 2 is damaged \(tokens='' is not a number\)",
         setup=lambda tmp, run, data: (os.makedirs(os.path.join(tmp, "other")), write(
             os.path.join(tmp, "other", "metrics.csv"), "iter,tokens,loss\n1,,4.1\n"))),
    Case("plot over a checkpoint", "plot.py", ["{run}", "--out={run}/ckpt.pt"], r"--out .*ckpt.pt does not end in .png"),
    Case("plot smooth", "plot.py", ["{run}", "--smooth=1.5"], r"--smooth 1.5 is not in \[0, 1\)"),
    Case("plot of a nameless image", "plot.py", ["{run}", "--out={run}/.png"],
         r"--out .*run/.png has no name before its .png: name the image, such as --out=.*run/plot.png$"),
    Case("plot smooth not a number", "plot.py", ["{run}", "--smooth=abc"],
         r"^error: argument --smooth: invalid float value: 'abc': see .*plot.py --help$"),  # argparse's, in one line
    Case("prepare flag unknown", "data/prepare.py", ["--input", "{tmp}/a.txt", "--out_dir", "{tmp}/d", "--shards=2"],
         r"^error: unrecognized arguments: --shards=2: see .*data/prepare.py --help$"),
    Case("plot torn last row", "plot.py", ["{run}"], None, setup=torn_row, may_create={"plot.png"}),
    # ---- data/prepare.py and data/shakespeare_char/prepare.py, into the prepared dataset's folder (with
    # --overwrite, to reach the failures past their refusal to replace it)
    Case("prepare into a run's folder", "data/prepare.py", ["--input", "{tmp}/a.txt", "--out_dir", "{run}",
                                                             "--overwrite", "--tokenizer", "char"],
         r"--out_dir .*run holds a training run \(ckpt.pt, run.json\): a dataset goes in a folder of its own; choose "
         r"another --out_dir$", setup=lambda tmp, run, data: write(os.path.join(tmp, "a.txt"), "hello world\n" * 100)),
    Case("prepare over a dataset", "data/prepare.py", ["--input", "{tmp}/a.txt", "--out_dir", "{data}", "--tokenizer", "char"],
         r"--out_dir .*data already holds a dataset \(char, [\d,]+ train tokens, vocab_size \d+, from .*\): choose another "
         r"--out_dir, or add --overwrite to replace it",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "a.txt"), "hello world\n" * 100)),
    Case("prepare empty", "data/prepare.py", ["--input", "{tmp}/empty.txt", "--out_dir", "{data}", "--overwrite", "--tokenizer", "char"],
         r"the corpus has no non-blank document",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "empty.txt"), "\n\n")),
    Case("prepare binary", "data/prepare.py", ["--input", "{tmp}/blob.txt", "--out_dir", "{data}", "--overwrite", "--tokenizer", "char"],
         r"blob.txt is not UTF-8 text \(byte 1 is 0x", setup=lambda tmp, run, data: write(os.path.join(tmp, "blob.txt"),
                                                                                        b"\x00\xff\xfe" * 100)),
    Case("prepare NUL bytes", "data/prepare.py", ["--input", "{tmp}/nul.txt", "--out_dir", "{data}", "--overwrite", "--tokenizer", "char"],
         r"nul.txt holds NUL bytes", setup=lambda tmp, run, data: write(os.path.join(tmp, "nul.txt"), b"ab\x00cd" * 100)),
    Case("prepare shard_tokens<0", "data/prepare.py", ["--input", "{tmp}/a.txt", "--out_dir", "{data}", "--overwrite", "--tokenizer", "char",
                                                       "--shard_tokens=-1"], r"--shard_tokens -1 must be >= 0 \(0: one file per split\)$",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "a.txt"), "hello world\n" * 100)),
    Case("prepare seed past the split hash's key", "data/prepare.py",
         ["--input", "{tmp}/a.txt", "--out_dir", "{tmp}/new", "--tokenizer", "char", "--seed=" + "9" * 65],
         r"--seed 9+ has 65 characters: give one of at most 64", setup=lambda tmp, run, data: write(
             os.path.join(tmp, "a.txt"), "some text\n" * 50)),
    Case("prepare val_fraction=0", "data/prepare.py", ["--input", "{tmp}/a.txt", "--out_dir", "{data}", "--overwrite", "--tokenizer", "char",
                                                       "--val_fraction=0"], r"--val_fraction 0.0 is not in \(0, 1\)",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "a.txt"), "hello world\n" * 100)),
    Case("prepare jsonl not a string", "data/prepare.py", ["--input", "{tmp}/d.jsonl", "--out_dir", "{data}", "--overwrite", "--tokenizer",
                                                           "char"], r"d.jsonl line 2: 'text' is a JSON number, not a string",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "d.jsonl"), '{"text": "fine"}\n{"text": 7}\n')),
    Case("prepare one small file", "data/prepare.py", ["--input", "{tmp}/one.txt", "--out_dir", "{tmp}/one", "--tokenizer",
                                                        "char"], None,  # handled: one document, cut by position
         setup=lambda tmp, run, data: write(os.path.join(tmp, "one.txt"), "a single document\n" * 50)),
    Case("prepare bad rank file", "data/prepare.py", ["--input", "{tmp}/a.txt", "--out_dir", "{data}", "--overwrite", "--gpt2_tiktoken",
                                                      "{tmp}/a.txt"], r"a.txt is not GPT-2's rank file",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "a.txt"), "hello world\n" * 100)),
    Case("prepare out_dir is a file", "data/prepare.py", ["--input", "{tmp}/a.txt", "--out_dir", "{data}/meta.json",
                                                          "--tokenizer", "char"], r"--out_dir .*meta.json is a file",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "a.txt"), "hello world\n" * 100)),
    Case("prepare full disk", "data/prepare.py", ["--input", "{tmp}/big.txt", "--out_dir", "{data}", "--overwrite", "--tokenizer", "char"],
         r"cannot write the dataset to .*data \(File too large\); the dataset that was there is unchanged",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "big.txt"), "lorem ipsum dolor\n\n" * 20_000),
         runner=file_size_limit(100_000)),
    Case("char prepare over a dataset", "data/shakespeare_char/prepare.py",
         ["--input", "{tmp}/a.txt", "--out_dir", "{data}"],
         r"--out_dir .*data already holds a dataset \(char, [\d,]+ train tokens, .*\): choose another --out_dir, or add "
         r"--overwrite to replace it", setup=lambda tmp, run, data: write(os.path.join(tmp, "a.txt"), "to be\n" * 100)),
    Case("char prepare full disk", "data/shakespeare_char/prepare.py",
         ["--input", "{tmp}/big.txt", "--out_dir", "{data}", "--overwrite"],
         r"cannot write the dataset to .*data \(File too large\)", runner=file_size_limit(100_000),
         setup=lambda tmp, run, data: write(os.path.join(tmp, "big.txt"), "lorem ipsum dolor\n\n" * 20_000)),
    Case("char prepare meta.pkl unwritable", "data/shakespeare_char/prepare.py",
         ["--input", "{tmp}/other.txt", "--out_dir", "{data}", "--overwrite"],
         r"cannot write the dataset to .*data \(Is a directory\); the dataset that was there is unchanged",
         setup=lambda tmp, run, data: (write(os.path.join(tmp, "other.txt"), "to be or not to be\n" * 100),
                                       os.mkdir(os.path.join(data, "meta.pkl.tmp")))),
    Case("char prepare not utf8", "data/shakespeare_char/prepare.py",
         ["--input", "{tmp}/latin1.txt", "--out_dir", "{data}", "--overwrite"],
         r"latin1.txt is not UTF-8 text", setup=lambda tmp, run, data: write(os.path.join(tmp, "latin1.txt"),
                                                                             "caf\xe9 au lait\n".encode("latin-1") * 50)),
    Case("char prepare tiny text", "data/shakespeare_char/prepare.py",
         ["--input", "{tmp}/tiny.txt", "--out_dir", "{data}", "--overwrite"],
         r"the text has 3 characters", setup=lambda tmp, run, data: write(os.path.join(tmp, "tiny.txt"), "abc")),
    Case("char prepare missing", "data/shakespeare_char/prepare.py",
         ["--input", "{tmp}/nope.txt", "--out_dir", "{data}", "--overwrite"],
         r"--input .*nope.txt is not a file"),
    # ---- bench.py
    Case("bench batch_size=0", "bench.py", ["--device=cpu", "--batch_size=0"], r"batch_size=0 is not valid"),
    Case("bench mode", "bench.py", ["--mode=fast"], r"mode='fast' is not valid"),
    # on a CPU a step past the free memory would have the kernel kill bench.py, with every config's figures
    Case("bench batch past the free memory", "bench.py",  # a prime batch: few smaller ones for the plan to try
         ["--device=cpu", "--compile=False", "--batch_size=999983"],
         r"this run needs about [\d.]+ GiB per device but [\d.]+ GiB is free .*it would run out of memory"),
    Case("bench compare quotes", "bench.py", ["--device=cpu", "--compare=--dtype='float32"],
         r"compare=.* cannot be read as flags"),
    Case("bench compare a timing setting", "bench.py", ["--device=cpu", "--compare=--mode=generate"],
         r"'--mode=generate' sets mode, which say how every config is timed, not what one costs"),
    Case("bench compare with profile", "bench.py", ["--device=cpu", "--profile=True", "--compare=--dropout=0.1"],
         r"compare='--dropout=0.1' is not valid: .*\(with mode='train', profile=True\)"),
    Case("bench compare empty", "bench.py", ["--device=cpu", "--compare=; ;"], r"compare=.* names no config"),
    Case("bench compare no change", "bench.py", ["--device=cpu", "--compare=--loss_chunk=64; --dropout=0.0"],
         r"'--dropout=0.0' changes no setting \(A has those values already\): give flags whose values differ from A's$"),
    Case("bench compare a training setting", "bench.py", ["--device=cpu", "--compare=--max_iters=5"],
         r"'--max_iters=5' changes no setting \(max_iters is train.py's alone, which bench leaves out\)"),
    Case("bench compare of reading ahead on random tokens", "bench.py", ["--device=cpu", "--compile=False",
                                                                       "--compare=--prefetch_batches=0"],
         r"prefetch_batches=0 reads the dataset's batches ahead, which only real_data=True reads \(random tokens are "
         r"made in place\): set both$"),
    Case("bench generation needs no warm-up steps", "bench.py", ["--mode=generate", "--device=cpu", "--warmup_steps=0",
                                                                 "--n_layer=1", "--gen_tokens=2", "--rounds=1"], None),
    Case("bench compile with no warm-up", "bench.py", ["--device=cpu", "--warmup_steps=0"],
         r"warmup_steps=0 is not valid: warmup_steps must satisfy warmup_steps >= 1 or \(warmup_steps == 0 and \(not "
         r"compile or mode != 'train'\)\) \(with mode='train', compile=True\)"),
    Case("bench corpus of tokens", "bench.py", ["--mode=prepare", "--corpus_text={tmp}/tokens.bin", "--corpus_mb=1"],
         r"corpus_text .*tokens.bin is not UTF-8 text: give --corpus_text=PATH of a text file$",
         setup=lambda tmp, run, data: open(os.path.join(tmp, "tokens.bin"), "wb").write(bytes(range(8)) * 100)),
    Case("bench auto batch generate", "bench.py", ["--mode=generate", "--batch_size=auto"],
         r"batch_size='auto' plans training memory: give --mode=generate a number"),
    Case("bench vocab too small", "bench.py", ["--device=cpu", "--real_data=True", "--dataset={data}", "--vocab_size=10"],
         r"has token id \d+, out of range for vocab_size 10"),
    Case("bench profile of generate", "bench.py", ["--mode=generate", "--profile=True", "--device=cpu"],
         r"profile=True is not valid: profile must satisfy not profile or mode == 'train' \(with mode='generate'\)"),
    Case("bench corpus missing", "bench.py", ["--mode=prepare", "--corpus_text={tmp}/nope.txt"], r"corpus_text .*nope.txt is not a file"),
    Case("bench corpus empty", "bench.py", ["--mode=prepare", "--corpus_text={tmp}/empty.txt"],
         r"corpus_text .*empty.txt is empty: give --corpus_text=PATH", setup=lambda tmp, run, data: write(
             os.path.join(tmp, "empty.txt"), "")),
    Case("bench corpus not UTF-8", "bench.py", ["--mode=prepare", "--corpus_text={tmp}/latin1.txt", "--corpus_mb=1"],
         r"corpus_text .*latin1.txt is not UTF-8 text", setup=lambda tmp, run, data: open(os.path.join(tmp, "latin1.txt"), "wb").write(b"caf\xe9")),
    Case("bench prepare's own error", "bench.py", ["--mode=prepare", "--corpus_text={tmp}/c.txt", "--corpus_mb=1",
                                                   "--gpt2_tiktoken={tmp}/nope.tiktoken"],
         r"^error: prepare.py stopped: --gpt2_tiktoken .*nope.tiktoken is not a file$",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "c.txt"), "some text\n\nmore text")),
    Case("bench n_embd%n_head", "bench.py", ["--device=cpu", "--n_head=5", "--n_embd=768"],
         r"n_embd=768 is not valid: .*\(with n_head=5\)$"),  # given, GPT-2's default or not: no CPU-default hint
    Case("bench profile where no trace folder can be made", "bench.py", ["--device=cpu", "--profile=True"],
         r"cannot make bench_trace/ here for the profiler trace \(File exists\): run bench.py from a writable folder",
         setup=lambda tmp, run, data: write(os.path.join(tmp, "bench_trace"), "a file")),
    Case("bench n_head against the CPU's n_embd", "bench.py", ["--device=cpu", "--n_head=6"],
         r"n_embd=128 is not valid: .* \(n_embd=128: bench's CPU default, as it was not given: give it too\)"),
]


def digests(folder) -> dict[str, str]:
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, name))}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A small character dataset and a finished run on it: what every case gets a copy of."""
    root = tmp_path_factory.mktemp("good")
    data, run = str(root / "data"), str(root / "run")
    load_module("data/shakespeare_char/prepare.py").prepare(made_up_text(3, 400, 7, 30_000), data)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                             *[a.format(data=data, run=run) for a in TRAIN]],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {"ckpt.pt", "best.pt", "metrics.csv", "config.json", "run.json", "summary.json", "run.lock"} <= set(os.listdir(run))
    return data, run


def run_case(case: Case, data: str, run: str, base: str, warm: "Warm") -> dict:
    tmp = os.path.join(base, re.sub(r"\W", "_", case.id))
    os.makedirs(tmp)
    folders = {"tmp": tmp, "run": os.path.join(tmp, "run"), "data": os.path.join(tmp, "data")}
    shutil.copytree(run, folders["run"])
    shutil.copytree(data, folders["data"])
    if case.setup:
        case.setup(tmp, folders["run"], folders["data"])
    before = {k: digests(folders[k]) for k in ("run", "data")}
    summary = read_json(os.path.join(folders["run"], "summary.json"), "")
    fill = lambda text: text.replace("{tmp}", tmp).replace("{run}", folders["run"]).replace("{data}", folders["data"])  # noqa: E731
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", **{k: fill(v) for k, v in case.env.items()}}
    cmd = [sys.executable, os.path.join(ROOT, case.script), *map(fill, case.args)]
    if case.runner:
        result = case.runner(cmd, env, folders)
    else:
        result = warm.run(cmd, env, tmp)
    after = {k: digests(folders[k]) for k in ("run", "data")}
    sessions = (read_json(os.path.join(folders["run"], "run.json"), "") or {}).get("earlier_sessions")
    return {"result": result, "before": before, "after": after, "summary": summary, "sessions": sessions}


@pytest.fixture(scope="module")
def outcomes(good, tmp_path_factory):
    data, run = good
    base = str(tmp_path_factory.mktemp("cases"))
    warms = queue.Queue()  # two warm Pythons, one per worker thread
    for _ in range(2):
        warms.put(Warm())

    def run_with_warm(case):
        warm = warms.get()
        try:
            return run_case(case, data, run, base, warm)
        finally:
            warms.put(warm)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case.id: pool.submit(run_with_warm, case) for case in CASES}
        concurrent.futures.wait(futures.values())
    while not warms.empty():
        warms.get().close()
    return futures


def test_there_are_enough_cases_over_every_script():
    assert len(CASES) >= 50 and len({c.id for c in CASES}) == len(CASES)
    assert {c.script for c in CASES} == {"train.py", "sample.py", "plot.py", "bench.py", "eval.py", "export.py",
                                         "data/prepare.py", "data/shakespeare_char/prepare.py"}


def test_a_resume_from_a_folder_that_is_not_there_makes_none(tmp_path):
    """A typo in out_dir: before, the refused resume left the folder behind with its run.lock."""
    from conftest import run_script
    result = run_script("train.py", "--init_from=resume", f"--out_dir={tmp_path / 'typo'}", "--device=cpu",
                        cwd=str(tmp_path))
    assert result.returncode == 1 and result.stderr.startswith(f"error: no checkpoint at {tmp_path / 'typo'}")
    assert not (tmp_path / "typo").exists()
    # under torchrun too: every rank says so (before, each went on to check the default device, cuda, which the
    # run's own settings, unread, would have replaced, and said that instead; one rank of several nodes that did
    # so left the others waiting to join until ddp_timeout)
    result = run_script("train.py", "--init_from=resume", f"--out_dir={tmp_path / 'typo'}", cwd=str(tmp_path),
                        torchrun_procs=2)
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode != 0 and len(errors) == 2, result.stderr
    assert all(f"error: no checkpoint at {tmp_path / 'typo'}" in line for line in errors), result.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_mistake(case, outcomes):
    outcome = outcomes[case.id].result()  # re-raises what went wrong inside the case's run
    result = outcome["result"]
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    if case.pattern is None:
        assert result.returncode == 0 and not errors, result.stderr
    else:
        assert result.returncode != 0, result.stdout[-2000:]
        assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], result.stderr
        assert re.search(case.pattern, errors[0]), errors[0]
    for folder in ("run", "data"):
        before, after = outcome["before"][folder], outcome["after"][folder]
        kept = {name for name in before if name not in case.may_change}
        assert {n: after.get(n) for n in kept} == {n: before[n] for n in kept}, f"{folder} files changed"
        assert set(after) - set(before) <= case.may_create, f"{folder}: new files {set(after) - set(before)}"
    if outcome["after"]["run"].get("summary.json") != outcome["before"]["run"].get("summary.json"):
        assert outcome["sessions"][-1]["summary"] == outcome["summary"]  # a resume moved it into run.json
