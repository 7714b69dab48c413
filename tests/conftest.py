"""Shared fixtures and helpers: small real data, a runner for the scripts, readers for what a run writes.

Tiny Shakespeare and GPT-2's rank file come from ../shared/data when it is there (it saves a download),
else by the routes the main job takes: data/shakespeare_char/prepare.py's text sources and tokenizer.py's
package-index fallback. Where that yields another text than the canonical tiny Shakespeare (the Gutenberg
plays), the tests that pin its exact counts check the same properties against the text they got."""
import functools
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
sys.path.insert(0, ROOT)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs for more than a few seconds; -m 'not slow' leaves it out")


def load_module(relative_path: str):
    """Import a script that is not on a package path, such as data/shakespeare_char/prepare.py."""
    spec = importlib.util.spec_from_file_location(os.path.basename(relative_path)[:-3], os.path.join(ROOT, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def shakespeare() -> dict:
    """{'text', 'path', 'canonical'}: tiny Shakespeare from ../shared, else what prepare.py finds here."""
    path = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    else:
        here = tempfile.mkdtemp(prefix="shakespeare_")
        text, _ = load_module("data/shakespeare_char/prepare.py").load_text(None, here=here)
        path = os.path.join(here, "input.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        with open(path, encoding="utf-8") as f:  # read back as prepare.py reads it (newlines translated)
            text = f.read()
    canonical = load_module("data/shakespeare_char/prepare.py").is_tiny_shakespeare(text)
    return {"text": text, "path": path, "canonical": canonical}


def made_up_text(seed: int, n_words: int, max_word_len: int, n_tokens: int) -> str:
    """Words of random letters from a fixed seed: the same text on every machine, no download."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, max_word_len)))
             for _ in range(n_words)]
    return " ".join(rng.choice(words) + ("\n" if rng.random() < 0.1 else "") for _ in range(n_tokens))


@functools.cache
def gpt2_rank_file() -> str:
    """GPT-2's gpt2.tiktoken: ../shared's copy, else tokenizer.py's cached copy from the package index."""
    path = os.path.join(SHARED_DATA, "gpt2.tiktoken")
    if os.path.isfile(path):
        return path
    from tokenizer import cache_path, cache_ranks, cached_ranks, whisper_ranks
    if cached_ranks(cache_path()) is None:
        cache_ranks(whisper_ranks(), cache_path())
    return cache_path()


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    """Shakespeare prepared as characters (train.bin, val.bin, meta.json, meta.pkl) in a temporary folder."""
    out_dir = str(tmp_path_factory.mktemp("shakespeare_char"))
    load_module("data/shakespeare_char/prepare.py").prepare(shakespeare()["text"], out_dir)
    return out_dir


def char_vocab_size(data_dir: str) -> int:
    from dataset import read_meta
    return read_meta(data_dir)["vocab_size"]


# A Python that has imported torch once and forks a child per job, which runs the script as `python script`
# would: as __main__, its folder first on sys.path, stdin empty, numpy's global RNG freshly seeded (Python's
# `random` reseeds itself after a fork), uncaught exceptions through sys.excepthook, threads joined and atexit
# run, the exit status the interpreter would give. A job past its timeout is killed and reported as such. What
# differs: torch read OMP_NUM_THREADS once, at its import here (1, as run_script gives every script anyway).
# Each job saves the import of torch and of torch._dynamo, about two seconds.
WARM = r"""
import atexit, json, os, runpy, signal, sys, threading, time
import numpy, torch
import torch._dynamo  # the memory plan's meta-device model imports it (random init there goes through torch._refs)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            sys.stdin = open(os.devnull)
            sys.argv, sys.path[0] = job["argv"], os.path.dirname(job["argv"][0])
            numpy.random.seed()
            try:
                runpy.run_path(job["argv"][0], run_name="__main__")
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:  # sys.exit("message"): the message on stderr, status 1
                    print(e.code, file=sys.stderr)
            except BaseException:
                sys.excepthook(*sys.exc_info())
            threading._shutdown()  # as the interpreter does at exit: wait for non-daemon threads, then atexit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # never back into this loop
    deadline, timed_out = time.time() + job["timeout"], False
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            timed_out = True
        time.sleep(0.02)
    print(json.dumps({"code": os.waitstatus_to_exitcode(done[1]), "timed_out": timed_out}), flush=True)
"""


class Warm:
    """One warm Python (WARM), its jobs run one at a time: run() takes the place of subprocess.run."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", WARM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def run(self, cmd, env, cwd, timeout=180) -> subprocess.CompletedProcess:
        """cmd ([python, script, args...]) in a process forked from the warm one, its output through two
        temporary files; the prepare scripts, which start worker processes, in a fresh Python instead."""
        if os.path.relpath(cmd[1], ROOT).startswith("data" + os.sep):
            return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        handle, out = tempfile.mkstemp(suffix=".stdout")
        os.close(handle)
        err = out[:-len(".stdout")] + ".stderr"
        job = dict(argv=cmd[1:], env=env, cwd=cwd, stdout=out, stderr=err, timeout=timeout)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        status = json.loads(self.proc.stdout.readline())
        try:
            with open(out) as f, open(err) as g:
                stdout, stderr = f.read(), g.read()
        finally:
            os.remove(out)
            os.remove(err)
        if status["timed_out"]:  # as subprocess.run would: a hang fails the test that waited for it
            raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
        return subprocess.CompletedProcess(cmd, status["code"], stdout, stderr)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def run_script(script: str, *args: str, cwd: str, torchrun_procs: int = 0, timeout: int = 300,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run one of the repository's scripts in a process of its own: under torchrun when torchrun_procs > 0, else
    through the warm Python (Warm.run)."""
    launcher = [sys.executable]
    if torchrun_procs:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun_procs}"]
    full_env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = launcher + [os.path.join(ROOT, script), *args]
    if torchrun_procs:
        return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    with WARM_LOCK:
        global warm
        if warm is None:
            warm = Warm()
        return warm.run(cmd, full_env, str(cwd), timeout)


warm, WARM_LOCK = None, threading.Lock()  # run_script's warm Python, made at its first use


def tiny_args(data_dir, out_dir, **overrides) -> list[str]:
    """train.py flags for a 2-layer model that trains on a CPU in seconds."""
    settings = dict(dataset=data_dir, out_dir=out_dir, device="cpu", compile=False, n_layer=2, n_head=2, n_embd=32,
                    block_size=32, batch_size=8, gradient_accumulation_steps=2, eval_iters=4, eval_interval=20,
                    log_interval=1, max_iters=40, warmup_iters=5, lr_decay_iters=60, learning_rate=3e-3,
                    min_lr=3e-4, dropout=0.0, wandb_log=False)
    settings.update(overrides)
    return [f"--{k}={v}" for k, v in settings.items()]


def read_metrics(out_dir) -> list[dict]:
    import metrics
    return metrics.read_rows(str(out_dir))


def step_losses(rows) -> dict[int, float]:
    return {int(r["iter"]): float(r["loss"]) for r in rows if r["loss"]}


def favour_padding(model, n_tokens: int):
    """Make a model (bias=True) give nearly all its probability to the ids from n_tokens up, the rows a
    padded vocabulary has past its tokenizer's, whatever the input: the final norm then gives one vector b at every
    position, and those rows of the output layer are 10 b."""
    import torch
    with torch.no_grad():
        b = torch.randn(model.config.n_embd, generator=torch.Generator().manual_seed(0))
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(b)
        model.lm_head.weight[n_tokens:] = 10 * b
