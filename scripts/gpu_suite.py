"""
The GPU suite: checks and times everything that needs a GPU in one command, for short borrowed slots.

    python scripts/gpu_suite.py --out=gpu_results            # everything (about 8 minutes on one H100)
    python scripts/gpu_suite.py --out=gpu_results --only=tests,char
    python scripts/gpu_suite.py --out=gpu_results --nanogpt=PATH   # also time nanoGPT's train.py beside ours

Each step runs in its own process; its row goes to <out>/table.md and its output into <out>/logs.tar.gz
(one file, so it comes back from a remote machine); runs and data go to a scratch folder, --work.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ["env", "tests", "char", "gpt2", "compile", "nanogpt"]


class Suite:
    def __init__(self, out: str, work: str):
        self.out, self.work, self.rows = out, work, []
        os.makedirs(out, exist_ok=True)
        os.makedirs(os.path.join(work, "logs"), exist_ok=True)

    def run(self, name: str, cmd: list[str], timeout: int, cwd: str = ROOT) -> tuple[int, str]:
        """Run cmd, log its output to logs/<name>.log; returns (exit code, output). A timeout is exit code 124."""
        t0 = time.time()
        env = {**os.environ, "WANDB_MODE": "disabled"}
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            code, output = 124, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        with open(os.path.join(self.work, "logs", f"{name}.log"), "w") as f:
            f.write(f"$ {' '.join(cmd)}\n# exit {code} after {time.time() - t0:.0f} s\n{output}")
        print(f"[{time.strftime('%H:%M:%S')}] {name}: exit {code} after {time.time() - t0:.0f} s", flush=True)
        return code, output

    def row(self, check: str, ok: bool, figures: str):
        self.rows.append(f"| {check} | {'ok' if ok else 'FAILED'} | {figures} |")
        self.write()

    def write(self):
        with open(os.path.join(self.out, "table.md"), "w") as f:
            f.write("| check | result | figures |\n| --- | --- | --- |\n" + "\n".join(self.rows) + "\n")

    def finish(self):
        with tarfile.open(os.path.join(self.out, "logs.tar.gz"), "w:gz") as tar:
            tar.add(os.path.join(self.work, "logs"), arcname="logs")
        print("\n" + open(os.path.join(self.out, "table.md")).read())


BENCH_LINE = re.compile(r"([\d.]+) ms/iter, ([\d,]+) tokens/s(?:, MFU ([\d.]+)%)?(?:, peak memory ([\d.]+) GiB)?")


def bench(suite: Suite, name: str, args: list[str], timeout: int = 300) -> dict | None:
    """One bench.py run; its figures, or None when it failed."""
    code, output = suite.run(name, [sys.executable, "bench.py", *args], timeout)
    match = BENCH_LINE.search(output) if code == 0 else None
    if not match:
        return None
    ms, tps, mfu, mem = match.groups()
    return {"ms": float(ms), "tokens_per_s": float(tps.replace(",", "")), "mfu": float(mfu) if mfu else None,
            "peak_gib": float(mem) if mem else None}


def bench_text(r: dict) -> str:
    return (f"{r['ms']:.1f} ms/iter, {r['tokens_per_s']:,.0f} tok/s"
            + (f", MFU {r['mfu']:.1f}%" if r["mfu"] is not None else "")
            + (f", peak {r['peak_gib']:.1f} GiB" if r["peak_gib"] is not None else ""))


def step_env(suite: Suite, args):
    code, output = suite.run("env", [sys.executable, "-c", (
        "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, "
        "'cuda', torch.version.cuda); print('gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0), "
        "torch.cuda.get_device_capability(0))")], 120)
    suite.row("environment", code == 0, " / ".join(output.strip().splitlines()[-3:]))


def step_tests(suite: Suite, args):
    code, output = suite.run("tests", [sys.executable, "-m", "pytest", "-q", "-rs", "tests/test_cuda.py"], 600)
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    suite.row("CUDA tests (tests/test_cuda.py)", code == 0, summary[-1].strip("= ") if summary else "no summary")


def step_char(suite: Suite, args):
    code, _ = suite.run("char_prepare", [sys.executable, "data/shakespeare_char/prepare.py"], 300)
    if code:
        return suite.row("Shakespeare char prepare", False, "see logs/char_prepare.log")
    out_dir = os.path.join(args.work, "char_run")
    code, output = suite.run("char", [sys.executable, "train.py", "config/train_shakespeare_char.py", f"--out_dir={out_dir}",
                                      f"--max_iters={args.char_iters}", f"--lr_decay_iters={args.char_iters}",
                                      "--dtype=bfloat16", "--compile=True", "--wandb_log=False", "--log_interval=50"], 600)
    figures = "see logs/char.log"
    if code == 0:
        with open(os.path.join(out_dir, "summary.json")) as f:
            s = json.load(f)
        figures = (f"{args.char_iters} iters, val loss {s['final_val_loss']:.4f} (best {s['best_val_loss']:.4f}), "
                   f"{s['mean_tokens_per_sec']:,.0f} tok/s, {s['wall_time_s']:.0f} s wall")
    suite.row("Shakespeare char, bf16 + compile", code == 0, figures)


def step_gpt2(suite: Suite, args):
    """GPT-2 124M at block 1024: the default micro-batch 12, then 32, 64, ... until one no longer fits."""
    batch, fitted = 12, None
    while batch <= args.max_batch:
        r = bench(suite, f"gpt2_b{batch}", [f"--batch_size={batch}", "--num_steps=30"])
        if r is None:
            suite.row(f"GPT-2 124M, batch {batch} x 1024", False, "did not run (out of memory?): see log")
            break
        suite.row(f"GPT-2 124M, batch {batch} x 1024, bf16, compile, fused AdamW", True, bench_text(r))
        fitted, batch = batch, 32 if batch == 12 else batch * 2
    if fitted:
        print(f"largest micro-batch that ran: {fitted}")


def step_compile(suite: Suite, args):
    """Ratio of compiled to eager speed, GPT-2 124M batch 12."""
    eager = bench(suite, "gpt2_eager", ["--compile=False", "--num_steps=30"])
    compiled = bench(suite, "gpt2_compiled", ["--num_steps=30"])
    ok = eager is not None and compiled is not None
    suite.row("compile on/off, GPT-2 124M batch 12", ok,
              f"eager {bench_text(eager)}; compiled {bench_text(compiled)}; "
              f"speed-up {eager['ms'] / compiled['ms']:.2f}x (separate processes)" if ok else "see logs")


def trainer_ms(out_dir: str, skip: int) -> float:
    """Median ms per step of a run of ours, from its metrics.csv, after the first `skip` steps."""
    sys.path.insert(0, ROOT)
    import metrics
    return statistics.median(float(r["dt_ms"]) for r in metrics.read_rows(out_dir) if r["dt_ms"] and int(r["iter"]) > skip)


def step_nanogpt(suite: Suite, args):
    """nanoGPT's train.py and ours on the same synthetic OpenWebText-sized tokens, same settings."""
    if not args.nanogpt:
        return
    import numpy as np
    data_dir = os.path.join(args.work, "synthetic_tokens")
    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 50_000_000), ("val", 1_000_000)):
        rng.integers(0, 50257, n, dtype=np.uint16).tofile(os.path.join(data_dir, f"{split}.bin"))
    common = [f"--dataset={data_dir}", f"--max_iters={args.trainer_iters}", "--eval_interval=100000", "--eval_iters=1",
              "--gradient_accumulation_steps=8", "--compile=True", "--wandb_log=False", "--always_save_checkpoint=False"]
    code, output = suite.run("nanogpt", [sys.executable, "train.py", *common, f"--out_dir={args.work}/nano_out"], 600,
                             cwd=args.nanogpt)
    times = [float(t) for i, t in re.findall(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", output) if int(i) > 5]
    ours_out = os.path.join(args.work, "ours_out")
    code2, _ = suite.run("ours_trainer", [sys.executable, "train.py", *common, f"--out_dir={ours_out}"], 600)
    ok = code == 0 and code2 == 0 and times
    if ok:
        nano_ms, our_ms = statistics.median(times), trainer_ms(ours_out, 5)
        tokens = 8 * 12 * 1024
        figures = (f"nanoGPT {nano_ms:.0f} ms/step ({tokens / nano_ms * 1000:,.0f} tok/s), ours {our_ms:.0f} ms/step "
                   f"({tokens / our_ms * 1000:,.0f} tok/s): ours {nano_ms / our_ms:.2f}x (median of steps 6+, "
                   "separate processes)")
    else:
        figures = "see logs/nanogpt.log and logs/ours_trainer.log"
    suite.row("trainer against nanoGPT's, GPT-2 124M, 8 x 12 x 1024 tokens/step", ok, figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for table.md, logs/ and logs.tar.gz")
    parser.add_argument("--work", default="/tmp/gpu_suite", help="scratch folder for runs, data and logs")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps among {','.join(STEPS)}")
    parser.add_argument("--char_iters", type=int, default=2000, help="steps of the Shakespeare char run")
    parser.add_argument("--max_batch", type=int, default=128, help="largest GPT-2 micro-batch to try")
    parser.add_argument("--nanogpt", default="", help="a nanoGPT checkout, to time its train.py beside ours")
    parser.add_argument("--trainer_iters", type=int, default=25, help="steps of each trainer in the nanogpt step")
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - set(STEPS)
    if unknown:
        sys.exit(f"error: unknown steps {sorted(unknown)}: choose among {','.join(STEPS)}")
    suite = Suite(args.out, args.work)
    try:
        for name in STEPS:
            if name in args.only.split(","):
                globals()[f"step_{name}"](suite, args)
    finally:
        suite.finish()
