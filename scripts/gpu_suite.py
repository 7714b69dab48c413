"""
The GPU suite: checks and times everything that needs a GPU, for short borrowed slots.

    python scripts/gpu_suite.py --out=gpu_results                 # what fits in --budget seconds (480: 8 minutes)
    python scripts/gpu_suite.py --out=gpu_results --only=env,options,nanogpt,prefetch,autotune --budget=220
    python scripts/gpu_suite.py --out=gpu_results --nanogpt=PATH   # also time nanoGPT's train.py beside ours

Steps, in order: env; checks (the CUDA tests and the Shakespeare char runs, side by side on the GPU, since only
their results count; meanwhile GPT-2 124M's timed configs are compiled once to fill the compile caches); gpt2
(batch 12, the memory plan's batch and twice that); fastpaths and options (each speed setting and each model
option against GPT-2 124M, from one bench.py --compare each); nanogpt (with --nanogpt: nanoGPT's train.py beside
ours); prefetch (batches read ahead against read in the loop, from the disk); autotune. A step that would not end
inside the budget is not started, and one still running at its end is stopped: the suite names both in the --only
that runs them next.

Each row goes to <out>/table.md as it is made, and every step's output into <out>/logs.tar.gz, so a call that
is cut off still brings back what it did. Runs and data go to a scratch folder, --work. Without a GPU the same
command runs a reduced version on the CPU (tiny models, few steps), so the test suite exercises it and it
never rots between GPU slots.
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common import ArgumentParser  # noqa: E402
from metrics import median_step_ms, nanogpt_median_step_ms  # noqa: E402  (the repository's own modules, from its root)
from report import read_summary  # noqa: E402
# Seconds each step takes on one H100 (an H200 computes as fast): guesses from the 2026-11-22 run of the first
# version (about 35 s per GPT-2 124M process, most of it compiling), with the compile caches warm for gpt2, fastpaths
# and options; set them from the logs of the next run. The budget starts no step that would not end in time.
GPU_SECONDS = {"env": 15, "checks": 180, "gpt2": 100, "fastpaths": 170, "options": 200, "nanogpt": 240, "prefetch": 90,
               "autotune": 300}
CPU_STEP_SECONDS = 5  # each step of the reduced CPU version, as counted (checks take up to 20, their jobs sharing the cores: a budget short of that stops them at its end)
# but nanogpt's: four runs of a model with GPT-2's 50257-token head, 2 to 4 s a step on the 2-core VM (118 s for one)
CPU_SECONDS = {"nanogpt": 300}
LOSS_CHUNK = 4096  # rows of logits per chunk in the chunked loss: 4096 x 50304 fp32 logits are 0.8 GB


class Suite:
    """The steps' shared state: the machine (gpu: CUDA is here, else the reduced CPU version runs; fp8: its GPU has
    fp8 matmuls, compute capability 8.9+), the budget, the jobs started and the table's rows."""

    def __init__(self, out: str, work: str, budget: float, gpu: bool, fp8: bool):
        self.out, self.work, self.rows, self.jobs, self.stopped, self.groups = out, work, [], [], set(), {}
        self.gpu, self.fp8 = gpu, fp8
        self.starting, self.terminated = False, False
        self.deadline = time.time() + budget
        os.makedirs(out, exist_ok=True)
        os.makedirs(os.path.join(work, "logs"), exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.time()

    def start(self, name: str, cmd: list[str], cwd: str = ROOT, env: dict | None = None) -> dict:
        """Start cmd with its output going to logs/<name>.log."""
        log = os.path.join(self.work, "logs", f"{name}.log")
        f = open(log, "w")
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        # a process group of its own, to stop it with all it started; not a session of its own, which a borrowed
        # machine would leave running after the suite's command is killed, on the GPU that the next call times
        self.starting = True  # a SIGTERM now waits till the job is listed, or stop_all would miss it
        try:
            env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", **(env or {})}
            proc = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, text=True, process_group=0,
                                    env=env)
            self.jobs.append(proc)
        finally:
            self.starting = False
            if self.terminated:  # also when Popen failed: the SIGTERM ends the suite, not just this step
                sys.exit(143)
        return {"name": name, "proc": proc, "log": log, "file": f, "t0": time.time()}

    def on_sigterm(self, *_):
        """A SIGTERM (a borrowed machine's time limit) ends the suite by its finally, which stops every job; a
        second one is ignored, so that the stopping is not cut short."""
        if self.terminated:
            return
        self.terminated = True
        if not self.starting:
            sys.exit(143)

    def wait(self, job: dict, timeout: float) -> tuple[int, str]:
        """Wait for a started job; past timeout stop it and every process it started, past the budget's end every
        job still running: SIGTERM (bench.py then reports the rounds it timed, train.py saves), SIGKILL 20 s
        later. Returns (exit code, output); a job stopped that way exits with 124."""
        try:
            code = job["proc"].wait(timeout=max(1.0, min(timeout, self.left())))
        except subprocess.TimeoutExpired:
            # at the budget's end every job still running is stopped at once: one after another, each stopping
            # (a checkpoint saved) would add to the next call's wait
            running = [p for p in self.jobs if p.poll() is None]
            self.stop(*(running if self.left() <= 0 else [job["proc"]]))
        if job["proc"] in self.stopped:
            code = 124
        seconds = time.time() - job["t0"]
        with open(job["log"]) as f:
            output = f.read().split("\n", 1)[1]  # after the command line
        job["file"].write(f"\n# exit {code} after {seconds:.0f} s\n")
        job["file"].close()
        print(f"[{time.strftime('%H:%M:%S')}] {job['name']}: exit {code} after {seconds:.0f} s", flush=True)
        return code, output

    def stop(self, *procs: subprocess.Popen):
        """SIGTERM to each job's process group and to every group under it, SIGKILL to what is left of them 20 s
        later. A job already sent its SIGTERM (the suite's own SIGTERM came while it waited) is not sent another:
        train.py takes a second one a few seconds on for a hurry, and exits without its checkpoint."""
        fresh = [proc for proc in procs if proc not in self.stopped]
        self.stopped.update(procs)
        for proc in procs:  # found before the signals: a test's script, forked by pytest's warm Python into a group
            self.groups.setdefault(proc, set()).update(process_groups(proc.pid))  # of its own, is an orphan once
        groups = {g for proc in procs for g in self.groups[proc]}               # pytest has gone
        for sig, grace, targets in ((signal.SIGTERM, 20, {g for proc in fresh for g in self.groups[proc]}),
                                    (signal.SIGKILL, 30, groups)):
            for group in targets:
                try:
                    os.killpg(group, sig)
                except OSError:  # nothing of the group is left
                    pass
            deadline = time.time() + grace
            while time.time() < deadline and (any(proc.poll() is None for proc in procs) or live_groups(groups)):
                time.sleep(0.1)

    def stop_all(self):
        """Every job still running, or whose groups are (the suite itself is ending, on an error or a SIGTERM): none
        may outlive it."""
        self.stop(*(proc for proc in self.jobs if proc.poll() is None or live_groups(self.groups.get(proc, set()))))

    def run(self, name: str, cmd: list[str], timeout: float, cwd: str = ROOT) -> tuple[int, str]:
        return self.wait(self.start(name, cmd, cwd), timeout)

    def row(self, check: str, ok: bool | None, figures: str):
        """A row of the table; ok None is a step the budget left out. The table and the logs are written at once."""
        self.rows.append(f"| {check} | {'not run' if ok is None else 'ok' if ok else 'FAILED'} | {figures} |")
        with open(os.path.join(self.out, "table.md"), "w") as f:
            f.write("| check | result | figures |\n| --- | --- | --- |\n" + "\n".join(self.rows) + "\n")
        with tarfile.open(os.path.join(self.out, "logs.tar.gz"), "w:gz") as tar:
            tar.add(os.path.join(self.work, "logs"), arcname="logs")


def processes() -> list[tuple[int, int, int, str]] | None:
    """(pid, parent, process group, state) of every process, from /proc; None where there is no /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    table = []
    for entry in filter(str.isdigit, entries):
        try:
            with open(f"/proc/{entry}/stat") as f:  # "pid (name) state ppid pgrp ...": a name may hold ")"
                state, parent, group = f.read().rsplit(")", 1)[1].split()[:3]
            table.append((int(entry), int(parent), int(group), state))
        except (OSError, ValueError):  # a process that has just ended
            continue
    return table


def process_groups(pid: int) -> set[int]:
    """The process groups of pid (a job started in a group of its own) and of every process under it (only its
    own where there is no /proc)."""
    children = {}
    for child, parent, group, _ in processes() or []:
        children.setdefault(parent, []).append((child, group))
    groups, todo = {pid}, [pid]
    while todo:
        for child, group in children.get(todo.pop(), []):
            groups.add(group)
            todo.append(child)
    return groups


def live_groups(groups: set[int]) -> set[int]:
    """Those of groups that hold a process still running (a zombie has ended: its parent has yet to reap it)."""
    table = processes()
    if table is not None:
        return {group for _, _, group, state in table if group in groups and state != "Z"}
    alive = set()
    for group in groups:
        try:
            os.killpg(group, 0)
            alive.add(group)
        except ProcessLookupError:
            pass
        except PermissionError:  # someone else's: it runs
            alive.add(group)
    return alive


# ---- bench.py's output
BENCH_LINE = re.compile(r"([\d.]+) ms/iter, ([\d,]+) tokens/s(?:, MFU ([\d.]+)%)?(?:, peak memory ([\d.]+) GiB)?")
CONFIG_LINE = re.compile(r"^(A|B\d*): ([\d.]+) ms/iter, ([\d,]+) tokens/s(?:, MFU ([\d.]+)%)? \(median", re.M)
RATIO_LINE = re.compile(r"^(B\d*)/A tokens/s: ([\d.]+)x \(min ([\d.]+)x, max ([\d.]+)x", re.M)


def bench_text(ms: str, tps: str, mfu: str | None, peak: str | None = None) -> str:
    return (f"{float(ms):.1f} ms/iter, {float(tps.replace(',', '')):,.0f} tok/s" + (f", MFU {mfu}%" if mfu else "")
            + (f", peak {float(peak):.1f} GiB" if peak else ""))


def bench_args(gpu: bool) -> list[str]:
    """GPT-2 124M at 12 x 1024 in bf16 with compile on a GPU; bench.py's small CPU model, eager, on a CPU."""
    return [] if gpu else ["--device=cpu", "--compile=False", "--vocab_size=512", "--warmup_steps=1"]


def compare(suite: Suite, name: str, rows: list[tuple[str, str, bool]], base: tuple[str, ...] = ()):
    """One bench.py --compare of GPT-2 124M's defaults (A; with the flags base) against each (what, flags, invert) of
    rows, alternating in one process; a row each. invert: the row's ratio is A over B (B is the setting turned off)."""
    steps = ["--num_steps=20", "--rounds=5"] if suite.gpu else ["--num_steps=2", "--rounds=2"]
    code, output = suite.run(name, [sys.executable, "bench.py", *bench_args(suite.gpu), *base, *steps,
                                    "--compare=" + "; ".join(flags for _, flags, _ in rows)], 600)
    figures = {m[1]: m.groups()[1:] for m in CONFIG_LINE.finditer(output)}
    stopped = re.search(r"^stopped by SIGTERM after (\d+) of (\d+) rounds", output, re.M)
    ratios = {m[1]: [float(x) for x in m.groups()[1:]] for m in RATIO_LINE.finditer(output)}
    for i, (what, flags, invert) in enumerate(rows):
        label = "B" if len(rows) == 1 else f"B{i + 1}"
        if label not in ratios:
            suite.row(what, False, f"`{flags}`: did not run, see logs/{name}.log" + (" (stopped at the budget)" if code == 124 else ""))
            continue
        median, low, high = ratios[label]
        if invert:
            median, low, high = 1 / median, 1 / high, 1 / low
        suite.row(what, True, f"{median:.3f}x tokens/s (min {low:.3f}x, max {high:.3f}x over rounds, one process); "
                              f"`{flags}`: {bench_text(*figures[label])}, A: {bench_text(*figures['A'])}"
                              + (f" (stopped at the budget after {stopped[1]} of {stopped[2]} rounds)" if stopped else ""))


# ---- the steps
def step_env(suite: Suite, args):
    code, output = suite.run("env", [sys.executable, "-c", (
        "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', "
        "torch.version.cuda, 'cudnn', torch.backends.cudnn.version()); print('gpus', torch.cuda.device_count(), "
        "torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else "
        "print('no GPU: the reduced CPU suite')")],
                             120)
    if suite.gpu:  # side-by-side checks need a compute mode that lets several processes share the GPU
        smi = suite.run("nvidia_smi", ["nvidia-smi", "--query-gpu=name,compute_mode,memory.total,driver_version",
                                       "--format=csv,noheader"], 60)[1]
        output += "nvidia-smi: " + smi.strip()
    suite.row("environment", code == 0, " / ".join(output.strip().splitlines()))


def char_data(suite: Suite, args) -> str | None:
    """Tiny Shakespeare as characters: --char_data, else prepared once into the scratch folder, from --char_text
    or where prepare.py finds it (data/shakespeare_char/input.txt, else a download: a borrowed GPU without network
    needs the text carried there)."""
    if args.char_data:
        return args.char_data
    data = os.path.join(args.work, "shakespeare_char")
    if not os.path.isfile(os.path.join(data, "meta.json")):
        text = ["--input", args.char_text] if args.char_text else []
        code, _ = suite.run("char_prepare", [sys.executable, "data/shakespeare_char/prepare.py", "--out_dir", data, *text],
                            120)
        if code:
            return None
    return data


# the Shakespeare char runs: (name, config file, flags); the GPU runs are the recipe (6 layers, batch 64 x 256,
# bf16, compile), the CPU runs a tiny fp32 model. fast: the defaults plus the chunked loss; plain: a host sync
# every step, full logits, eager, batches read in the loop; plain_seed: the same with another seed, for the noise
# between runs.
GPU_CHAR = ["--device=cuda", "--dtype=bfloat16", "--compile=True", "--eval_interval=500"]
CPU_CHAR = ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64",
            "--batch_size=8", "--eval_iters=5", "--eval_interval=10"]
FAST, PLAIN = [f"--loss_chunk={LOSS_CHUNK}"], ["--sync_every_step=True", "--loss_chunk=0", "--compile=False",
                                               "--prefetch_batches=0"]
# config/train_llama_char.py at the GPU recipe's size (its comment gives the same flags), dropout as the recipe's
LLAMA_GPU = ["--n_layer=6", "--n_head=6", "--n_kv_head=2", "--n_embd=384", "--block_size=256", "--batch_size=64",
             "--dropout=0.2", "--eval_iters=200"]


def char_runs(gpu: bool, fp8: bool) -> list[tuple[str, str, list[str]]]:
    recipe, llama = "config/train_shakespeare_char.py", "config/train_llama_char.py"
    runs = [("char_fast", recipe, FAST), ("char_plain", recipe, PLAIN), ("char_plain_seed", recipe, [*PLAIN, "--seed=1338"]),
            ("llama_char", llama, [*FAST, *(LLAMA_GPU if gpu else ["--n_kv_head=1"])])]
    if fp8:  # on a CPU fp8 is emulated, and tests/test_fp8.py checks it
        runs.append(("char_fp8", recipe, [*FAST, "--fp8=True"]))
    return runs


# Compiling GPT-2 124M takes about half a minute a config, and the timed steps compile about 20. While the checks
# run (and only their results count), a few processes compile those configs one after the other, one bench.py run
# each, and are stopped when the checks end: the timed steps then find what they compiled in the compile caches.
WARM = ("import subprocess, sys\n"
        "for flags in sys.argv[1:]:\n"
        "    subprocess.run([sys.executable, 'bench.py', *flags.split(), '--warmup_steps=1', '--num_steps=1'])")


SAME_GRAPH = ("--sync_every_step=True", "--optimizer=muon", "--compile=False")  # A's compiled graph, or none


def warm_configs(gpu: bool, fp8: bool, processes: int) -> list[list[str]]:
    """The timed steps' compiled configs (A first: every step times against it), dealt to processes; none on a
    CPU."""
    if not gpu:
        return []
    configs = ["--batch_size=12"] + [flags for _, flags, _ in fastpaths(gpu, fp8) + OPTIONS if flags not in SAME_GRAPH]
    return [configs[i::processes] for i in range(processes)]


def warm_processes(memory_gib: float) -> int:
    """How many processes compile ahead during the checks. Each holds GPT-2 124M at up to 24 x 1024 (about 17 GiB)
    beside the char runs and the tests: 4 on a GPU of 120 GiB or more (an H200's 139), which compile the 17 configs
    (15 without fp8) in about the checks' 3 minutes at half a minute each; 2 on an H100's 79, which compile some 12.
    (Their compile threads and the other jobs then ask for about the 16 cores of the H200 machine.)"""
    return 4 if memory_gib >= 120 else 2


def step_checks(suite: Suite, args):
    """The CUDA tests and the Shakespeare char runs, all at once (their results count, not their speed); on a GPU,
    bench.py compiles the configs of the timed steps alongside, so that their compiles hit the caches later."""
    data = char_data(suite, args)
    iters = args.char_iters or (2000 if suite.gpu else 20)
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "4"} if suite.gpu else {}  # many processes share the CPU's cores
    # the CUDA tests: on a GPU in two processes, the longest pair apart from the rest, so they end with the char
    # runs; on a CPU, where they all skip, in one
    selections = [["-k", "fp8 or resume"], ["-k", "not (fp8 or resume)"]] if suite.gpu else [[]]
    tests = [f"tests_{i}" for i in range(len(selections))]
    jobs = [suite.start(name, [sys.executable, "-m", "pytest", "-q", "-rs", "tests/test_cuda.py", *k], env=env)
            for name, k in zip(tests, selections)]
    runs = char_runs(suite.gpu, suite.fp8) if data else []
    for name, config, flags in runs:
        jobs.append(suite.start(name, [sys.executable, "train.py", config, f"--dataset={data}",
                                       f"--out_dir={os.path.join(args.work, name)}", f"--max_iters={iters}",
                                       f"--lr_decay_iters={iters}", "--wandb_log=False", "--log_interval=50",
                                       "--overwrite=True", *(GPU_CHAR if suite.gpu else CPU_CHAR), *flags], env=env))
    import torch
    processes = warm_processes(torch.cuda.get_device_properties(0).total_memory / 2**30) if suite.gpu else 0
    warmers = [suite.start(f"compile_warm_{i}", [sys.executable, "-c", WARM, *configs], env=env)
               for i, configs in enumerate(warm_configs(suite.gpu, suite.fp8, processes))]
    results = {job["name"]: suite.wait(job, 900) for job in jobs}
    for job in warmers:  # what they compiled is in the caches; the rest compiles in its own step
        suite.wait(job, 0)
    summaries = []
    for name in tests:
        lines = [line for line in results[name][1].splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", line)]
        summaries.append(lines[-1].strip("= ") if lines else f"no summary (logs/{name}.log)")
    suite.row(f"CUDA tests (tests/test_cuda.py, in {'two processes' if suite.gpu else 'one process'})",
              all(results[n][0] == 0 for n in tests), "; ".join(summaries))
    if not data:
        suite.row("Shakespeare char runs", False, "could not prepare tiny Shakespeare: see logs/char_prepare.log")
        return
    s = {name: read_summary(os.path.join(args.work, name)) if results[name][0] == 0 else None for name, _, _ in runs}
    s = {name: v if v and v["final_val_loss"] is not None else None for name, v in s.items()}  # null: a NaN loss
    side = f"{len(jobs) + len(warmers)} processes side by side, so no speed is quoted"
    fast, plain, seed = s["char_fast"], s["char_plain"], s["char_plain_seed"]
    suite.row(f"Shakespeare char, {'bf16 + compile' if suite.gpu else 'tiny model on the CPU'}, {iters} steps", fast is not None,
              f"val loss {fast['final_val_loss']:.4f} (best {fast['best_val_loss']:.4f}), {fast['wall_time_s']:.0f} s "
              f"wall ({side})" if fast else "see logs/char_fast.log")
    ok = fast is not None and plain is not None and seed is not None
    suite.row(f"fast path vs plain path, Shakespeare char {iters} steps", ok,
              f"val loss {fast['final_val_loss']:.4f} fast (loss_chunk={LOSS_CHUNK}, verdicts on the device"
              f"{', compile' if suite.gpu else ''}) vs {plain['final_val_loss']:.4f} plain (a host sync every step, full "
              f"logits, eager, batches read in the loop), a difference of "
              f"{fast['final_val_loss'] - plain['final_val_loss']:+.4f}; the plain path "
              f"with another seed: {seed['final_val_loss']:.4f} ({seed['final_val_loss'] - plain['final_val_loss']:+.4f})"
              if ok else "see logs/char_fast.log, char_plain.log, char_plain_seed.log")
    if suite.fp8:
        fp8 = s["char_fp8"]
        suite.row(f"fp8 vs bf16 (both on the fast path), Shakespeare char {iters} steps", fp8 is not None and fast is not None,
                  f"val loss {fp8['final_val_loss']:.4f} fp8 vs {fast['final_val_loss']:.4f} bf16"
                  if fp8 and fast else "see logs/char_fp8.log")
    llama = s["llama_char"]
    suite.row(f"LLaMA-style (config/train_llama_char.py{' at the recipe size' if suite.gpu else ''}) vs GPT-2-style, "
              f"Shakespeare char {iters} steps", llama is not None and fast is not None,
              f"val loss {llama['final_val_loss']:.4f} (best {llama['best_val_loss']:.4f}) LLaMA-style vs "
              f"{fast['final_val_loss']:.4f} (best {fast['best_val_loss']:.4f}) GPT-2-style, same steps and tokens"
              if llama and fast else "see logs/llama_char.log")


def step_gpt2(suite: Suite, args):
    """GPT-2 124M at block 1024: the default micro-batch 12, the memory plan's batch_size='auto' and twice that
    (the largest that fits; on a CPU, bench.py's small model at batch 12 and 32)."""
    what = "GPT-2 124M, batch {} x 1024, bf16, compile, fused AdamW" if suite.gpu else "CPU model, batch {} x 64, eager"
    steps = ["--num_steps=30"] if suite.gpu else ["--num_steps=3"]
    auto = None
    for batch in ([12, "auto", "double"] if suite.gpu else [12, 32]):
        if batch == "double":
            if auto is None:
                break
            batch = 2 * auto
        code, output = suite.run(f"gpt2_b{batch}", [sys.executable, "bench.py", *bench_args(suite.gpu), f"--batch_size={batch}",
                                                    *steps], 300)
        match = BENCH_LINE.search(output) if code == 0 else None
        chosen = re.search(r"batch_size auto: (\d+)", output)
        label = f"{chosen[1]} (batch_size='auto')" if chosen else batch
        if match:
            plan = re.search(r"planned ([\d.]+) GiB", output)
            suite.row(what.format(label), True, bench_text(*match.groups()) + (f" (planned {plan[1]} GiB)" if plan else ""))
        elif auto is not None and "out of memory" in output.lower():
            suite.row(what.format(batch), True, f"out of memory: {auto} (the plan's choice) is the largest power of two that fits")
        else:
            suite.row(what.format(label), False, f"see logs/gpt2_b{batch}.log")
        if batch == "auto" and chosen and match:  # twice a batch that did not run would tell nothing
            auto = int(chosen[1])


# (what, the B config's flags, invert): each speed setting against GPT-2 124M's defaults (A: bf16, compile,
# verdicts on the device, full logits); invert where B is the setting turned off
FASTPATHS = [
    ("verdicts on the device vs a host sync every step", "--sync_every_step=True", True),
    (f"chunked loss (loss_chunk={LOSS_CHUNK}) vs full logits", f"--loss_chunk={LOSS_CHUNK}", False),
    ("chunked loss at batch 24 vs full logits at batch 12", f"--loss_chunk={LOSS_CHUNK} --batch_size=24", False),
    ("compile vs eager, GPT-2 124M batch 12", "--compile=False", True),
    ("FlashAttention (cuDNN's kernel off) vs torch's choice (attention_kernel=auto)", "--attention_kernel=flash", False),
    ("cuDNN attention first vs torch's choice (attention_kernel=auto)", "--attention_kernel=cudnn", False),
    ("compile reduce-overhead (CUDA graphs) vs default", "--compile_mode=reduce-overhead", False),
    ("activation checkpointing vs off (its cost)", "--activation_checkpointing=True", False),
    ("Muon vs AdamW (the optimizer step's cost)", "--optimizer=muon", False),
    ("fp8 matmuls in the blocks vs bf16", "--fp8=True", False),
    ("fp8 with the chunked loss at batch 24 vs bf16 at batch 12", f"--fp8=True --loss_chunk={LOSS_CHUNK} --batch_size=24", False),
]
# each model option (issue 9) against GPT-2, forward + backward + step of GPT-2 124M
OPTIONS = [
    ("rotary positions (pos_emb=rope) vs learned", "--pos_emb=rope", False),
    ("RMSNorm vs LayerNorm", "--norm=rmsnorm", False),
    ("SwiGLU MLP vs GELU", "--mlp=swiglu", False),
    ("ReLU² MLP vs GELU", "--mlp=relu2", False),
    ("grouped-query attention (2 key/value heads) vs multi-head", "--n_kv_head=2", False),
    ("QK-norm vs none", "--qk_norm=True", False),
    ("untied output layer vs tied", "--tie_embeddings=False", False),
    ("LLaMA-style (all of the above but ReLU² and QK-norm) vs GPT-2",
     "--pos_emb=rope --norm=rmsnorm --mlp=swiglu --n_kv_head=2 --tie_embeddings=False", False),
]


def fastpaths(gpu: bool, fp8: bool) -> list[tuple[str, str, bool]]:
    """The speed settings this machine times: those that mean something on a CPU there, fp8 where the GPU has it."""
    rows = FASTPATHS if gpu else FASTPATHS[:2]
    return [row for row in rows if fp8 or "fp8" not in row[1]]


def step_fastpaths(suite: Suite, args):
    """Each speed setting against GPT-2 124M's defaults, from one bench.py --compare."""
    compare(suite, "fastpaths", fastpaths(suite.gpu, suite.fp8))


def step_options(suite: Suite, args):
    """Each model option against GPT-2, in bf16 with compile on a GPU, from one bench.py --compare."""
    compare(suite, "options", OPTIONS)


def reads_storage(disk: str) -> bool:
    """Whether get_batch's from-the-disk figures (bench.py --mode=get_batch) read from storage: not where the folder
    is in memory (a tmpfs: not measured) or where eviction left the pages in memory (0.00 MiB read per batch both
    ways, as under a sandbox that keeps files in memory); where the system counts no reads, taken as read."""
    return "not measured" not in disk and len(re.findall(r"\(0\.00 MiB read per batch\)", disk)) < 2


def step_prefetch(suite: Suite, args):
    """Batches read ahead by background threads against read in the loop, GPT-2 124M reading a token file of 1 GB
    (on a CPU, 2 MB) from the disk: bench.py --cold_data evicts it from the page cache before each timed round.
    First bench.py --mode=get_batch, in the same folder, says how long a batch takes from the page cache and from
    the disk there, and how many bytes the latter read from storage (none where eviction does nothing, as on a
    tmpfs)."""
    # on a CPU, ids under the small model's vocabulary (bench_args), which GPT-2's would multiply by 7
    data = synthetic_tokens(args.work, 500_000_000, 50257) if suite.gpu else synthetic_tokens(args.work, 1_000_000, 512)
    job = suite.start("get_batch", [sys.executable, "bench.py", "--mode=get_batch", "--batch_size=12",
                                    "--block_size=1024", f"--token_file_tokens={100_000_000 if suite.gpu else 1_000_000}"],
                      env={"TMPDIR": args.work})
    code, output = suite.wait(job, 120)
    cached = re.search(r"^uint16, batch 12 x 1024: get_batch (\d+ us)", output, re.M)
    disk = re.search(r"^uint16, batch 12 x 1024, from the disk: (?:get_batch )?(.*)$", output, re.M)  # or not measured
    suite.row("get_batch, 12 x 1024 tokens, from the page cache and from the disk", cached is not None,
              f"{cached[1]} from the page cache; from the disk {disk[1] if disk else '(no eviction on this system)'}"
              if cached else "see logs/get_batch.log")
    what = ("GPT-2 124M reading its tokens from a 1 GB file" if suite.gpu
            else "the CPU model reading its tokens from a 2 MB file")
    where = (" evicted from the page cache before each round" if disk is None or reads_storage(disk[1]) else
             " that stays in memory here, eviction or not (see the get_batch row), so both read it from memory")
    compare(suite, "prefetch", [(f"batches read ahead (prefetch_batches=4) vs in the loop, {what}{where}",
                                 "--prefetch_batches=0", True)],
            base=("--real_data=True", f"--dataset={data}", "--cold_data=True", *(["--vocab_size=0"] if suite.gpu else [])))


def step_autotune(suite: Suite, args):
    """compile's max-autotune (tuned kernels, no CUDA graphs: reduce-overhead's row has those) against the default;
    its own step, since tuning takes minutes and its results are not compiled ahead."""
    if suite.gpu:
        compare(suite, "autotune", [("compile max-autotune (no CUDA graphs) vs default",
                                     "--compile_mode=max-autotune-no-cudagraphs", False)])


# (micro-steps, sequences per micro-step) of the nanogpt step's runs: nanoGPT's GPT-2 micro-batch (its config's 40
# micro-steps cut to 8 for time), and the same tokens per step as fewer, larger micro-batches (48 fits both trainers)
NANO_SHAPES = [(8, 12), (2, 48)]


def nanogpt_rows(ms: dict, block_size: int, flags: str = "") -> list[tuple[str, bool, str]]:
    """The nanogpt step's rows from the median ms/step of its runs, keyed (trainer, micro-steps, sequences) with
    trainer 'nanogpt', 'ours' or 'ours_fp8' (None: the run failed); flags: what ours ran with beyond its defaults.
    Every shape moves the same tokens per step, so a ratio of step times is the inverse ratio of tokens/s."""
    (n1, b1), (n2, b2) = NANO_SHAPES

    def side(key) -> str:
        return f"{ms[key]:.0f} ms/step ({key[1] * key[2] * block_size / ms[key] * 1000:,.0f} tok/s)"
    pairs = [(f"this train.py against nanoGPT's, both at {n1} x {b1} (nanoGPT's GPT-2 micro-batch)", ("ours", n1, b1), ("nanogpt", n1, b1)),
             (f"this train.py against nanoGPT's, both at {n2} x {b2}", ("ours", n2, b2), ("nanogpt", n2, b2)),
             (f"this train.py at {n2} x {b2} against nanoGPT's at {n1} x {b1}", ("ours", n2, b2), ("nanogpt", n1, b1))]
    if ("ours_fp8", n2, b2) in ms:
        pairs += [(f"this train.py with fp8 at {n2} x {b2} against nanoGPT's at {n1} x {b1}", ("ours_fp8", n2, b2), ("nanogpt", n1, b1)),
                  (f"fp8 against bf16, this train.py at {n2} x {b2}", ("ours_fp8", n2, b2), ("ours", n2, b2))]
    rows = []
    for what, b, a in pairs:
        ok = ms.get(a) is not None and ms.get(b) is not None
        rows.append((f"{what}, {n1 * b1} x {block_size} tokens/step" + (f", ours with `{flags}`" if flags else ""), ok,
                     f"{ms[a] / ms[b]:.2f}x tokens/s: {side(b)} against {side(a)} (medians of steps 6+, separate processes)"
                     if ok else f"see logs/{a[0]}_{a[1]}x{a[2]}.log and logs/{b[0]}_{b[1]}x{b[2]}.log"))
    return rows


def synthetic_tokens(work: str, n_train: int, n_ids: int = 50257) -> str:
    """A dataset in nanoGPT's layout (train.bin and val.bin, uint16) of random ids under n_ids (GPT-2's by default),
    n_train of them in train.bin; its folder."""
    import numpy as np
    data_dir = os.path.join(work, f"synthetic_tokens_{n_train}_{n_ids}")
    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", 1_000_000)):
        rng.integers(0, n_ids, n, dtype=np.uint16).tofile(os.path.join(data_dir, f"{split}.bin"))
    return data_dir


def step_nanogpt(suite: Suite, args):
    """With --nanogpt: nanoGPT's train.py and ours (its defaults and --ours_flags) on the same synthetic tokens and
    the same tokens per step, at nanoGPT's GPT-2 micro-batch and at a larger one, and ours with fp8 where the GPU has
    it. On a GPU, GPT-2 124M in bf16 with compile; on a CPU, a tiny fp32 model, eager (scripts/compare_nanogpt.py
    times the README's CPU command)."""
    if not args.nanogpt:
        suite.row("this train.py against nanoGPT's", None, "no --nanogpt=PATH given")
        return
    data_dir = synthetic_tokens(args.work, 50_000_000 if suite.gpu else 1_000_000)
    block_size = 1024 if suite.gpu else 64
    common = [f"--dataset={data_dir}", f"--max_iters={args.trainer_iters}", "--eval_interval=100000", "--eval_iters=1",
              "--wandb_log=False", "--always_save_checkpoint=False", f"--block_size={block_size}"]
    common += ["--compile=True"] if suite.gpu else ["--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=2",
                                                 "--n_head=2", "--n_embd=64"]
    ms = {}
    for n, b in NANO_SHAPES:
        shape = [f"--gradient_accumulation_steps={n}", f"--batch_size={b}"]
        name = f"nanogpt_{n}x{b}"
        code, output = suite.run(name, [sys.executable, "train.py", *common, *shape, f"--out_dir={args.work}/{name}"],
                                 600, cwd=args.nanogpt)
        ms["nanogpt", n, b] = nanogpt_median_step_ms(output, 5) if code == 0 else None
        fp8 = suite.fp8 and (n, b) != NANO_SHAPES[0]
        for trainer, extra in [("ours", [])] + ([("ours_fp8", ["--fp8=True"])] if fp8 else []):
            out_dir = os.path.join(args.work, f"{trainer}_{n}x{b}")
            code, _ = suite.run(f"{trainer}_{n}x{b}", [sys.executable, "train.py", *common, *shape, *shlex.split(args.ours_flags),
                                                      *extra, f"--out_dir={out_dir}", "--overwrite=True"], 600)
            ms[trainer, n, b] = median_step_ms(out_dir, 5) if code == 0 else None
    for row in nanogpt_rows(ms, block_size, args.ours_flags):
        suite.row(*row)


STEPS = {"env": step_env, "checks": step_checks, "gpt2": step_gpt2, "fastpaths": step_fastpaths,
         "options": step_options, "nanogpt": step_nanogpt, "prefetch": step_prefetch, "autotune": step_autotune}
NANOGPT_FILES = ("train.py", "model.py", "configurator.py")  # what the nanogpt step runs of a nanoGPT checkout


def next_call(args, parser, steps: list[str]) -> str:
    """The command that runs steps next: this one's settings, but for --out, --only and --budget (the time the next
    call has is its own). env leads it where this call ran env: the next call may come in another slot, on another
    machine, and its table must name that machine."""
    if "env" in args.only.split(",") and "env" not in steps:
        steps = ["env", *steps]
    kept = [shlex.quote(f"--{k}={v}") for k, v in vars(args).items()
            if k not in ("out", "only", "budget") and v != parser.get_default(k)]
    return " ".join(["python scripts/gpu_suite.py --out=DIR", f"--only={','.join(steps)}", *kept])


if __name__ == "__main__":
    parser = ArgumentParser(__doc__)
    parser.add_argument("--out", required=True, help="folder for table.md and logs.tar.gz")
    parser.add_argument("--work", default="/tmp/gpu_suite", help="scratch folder for runs, data and logs")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps among {','.join(STEPS)}")
    parser.add_argument("--budget", type=float, default=480, help="seconds: steps that would end later are not started")
    parser.add_argument("--char_iters", type=int, default=0, help="steps of the Shakespeare char runs (0: 2000, 20 on a CPU)")
    parser.add_argument("--nanogpt", default="", help="a nanoGPT checkout, to time its train.py beside ours")
    parser.add_argument("--trainer_iters", type=int, default=25, help="steps of each trainer in the nanogpt step")
    parser.add_argument("--ours_flags", default="", help="train.py flags for our runs in the nanogpt step, e.g. the speed "
                                                          "settings the fastpaths step found faster")
    parser.add_argument("--char_data", default="", help="a prepared tiny Shakespeare char dataset (else prepared in --work)")
    parser.add_argument("--char_text", default="", help="tiny Shakespeare's text, for the prepare (else prepare.py's own search)")
    args = parser.parse_args()
    args.work = os.path.abspath(args.work)  # the nanogpt step runs nanoGPT's train.py in its own folder
    chosen = args.only.split(",")
    unknown = set(chosen) - set(STEPS)
    if unknown:
        sys.exit(f"error: unknown steps {sorted(unknown)}: choose among {','.join(STEPS)}")
    if args.budget <= 0 or args.char_iters < 0 or args.trainer_iters <= 5:  # the nanogpt step's medians skip 5 steps
        sys.exit("error: --budget must be > 0, --char_iters >= 0 (0: the default) and --trainer_iters > 5")
    missing = [f for f in NANOGPT_FILES if args.nanogpt and not os.path.isfile(os.path.join(args.nanogpt, f))]
    if missing:
        sys.exit(f"error: --nanogpt={args.nanogpt} lacks {', '.join(missing)}: give a nanoGPT checkout's folder")
    try:  # as a shell splits them: --ours_flags="--compile_mode='max-autotune' --fp8=True"
        ours_flags = shlex.split(args.ours_flags)
    except ValueError as e:
        sys.exit(f"error: --ours_flags={args.ours_flags!r} cannot be split into flags ({e}): balance its quotes")
    ours = dict(flag[2:].partition("=")[::2] for flag in ours_flags)
    if not all(flag.startswith("--") and "=" in flag for flag in ours_flags):  # a config file's settings go unseen
        sys.exit(f"error: --ours_flags={args.ours_flags!r} takes train.py's --key=value flags alone, not a config file "
                 "or a bare word: give each setting as a flag")
    if {"batch_size", "gradient_accumulation_steps", "block_size"} & set(ours):
        sys.exit(f"error: --ours_flags={args.ours_flags!r} sets the batch shape, which the nanogpt step sets for both "
                 "trainers alike: leave it out")
    if ours.get("compile_mode") in ("reduce-overhead", "max-autotune"):
        micro_steps = " and ".join(str(n) for n, _ in NANO_SHAPES)
        sys.exit(f"error: --ours_flags={args.ours_flags!r} sets a compile_mode with CUDA graphs, which train.py "
                 f"refuses with more than one micro-step, and the nanogpt step's runs take {micro_steps} micro-steps: "
                 "leave it out, or give --compile_mode=max-autotune-no-cudagraphs")
    import torch
    gpu = torch.cuda.is_available()
    if gpu and "checks" in chosen and not (args.char_data or args.char_text or
                                              os.path.isfile(os.path.join(ROOT, "data/shakespeare_char/input.txt"))):
        # a borrowed GPU reaches no network: prepare.py would spend minutes of the slot failing to download it
        sys.exit("error: the checks need tiny Shakespeare and data/shakespeare_char/input.txt is not here: carry it "
                 "to this machine, or give --char_text=PATH or --char_data=DIR")
    suite = Suite(args.out, args.work, args.budget, gpu, gpu and torch.cuda.get_device_capability() >= (8, 9))
    signal.signal(signal.SIGTERM, suite.on_sigterm)
    left_out = []  # steps not started, or stopped at the budget's end: the next call's --only
    seconds = []  # each step's, for the next run's GPU_SECONDS
    try:
        for name in (s for s in STEPS if s in chosen):
            needs = 0 if name == "nanogpt" and not args.nanogpt else GPU_SECONDS[name] if gpu else \
                CPU_SECONDS.get(name, CPU_STEP_SECONDS)
            if needs > suite.left():
                left_out.append(name)
                suite.row(f"step {name}", None, f"about {needs} s, {max(0, suite.left()):.0f} s of the "
                                                f"{args.budget:.0f} s budget left")
                continue
            t0 = time.time()
            try:
                STEPS[name](suite, args)
            except Exception as e:  # a step's own failure (a tool missing, a full disk) costs none of the steps after it
                traceback.print_exc()
                suite.stop_all()
                suite.row(f"step {name}", False, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                                                 " (its traceback is in the suite's output)")
            seconds.append(f"{name} {time.time() - t0:.0f}")
            if suite.left() <= 0:
                left_out.append(name)
        if seconds:
            suite.row("seconds each step took", True, ", ".join(seconds))
    finally:
        suite.terminated = True  # a SIGTERM from here on must not cut the stopping short
        suite.stop_all()
    if left_out:
        print(f"not run for lack of time: next, {next_call(args, parser, left_out)}")
    print("\n" + open(os.path.join(args.out, "table.md")).read())
