"""
The GPU suite: checks and times everything that needs a GPU in one command, for short borrowed slots.

    python scripts/gpu_suite.py --out=gpu_results            # everything (about 8 minutes on one H100)
    python scripts/gpu_suite.py --out=gpu_results --only=tests,char
    python scripts/gpu_suite.py --out=gpu_results --nanogpt=PATH   # also time nanoGPT's train.py beside ours

Each step runs in its own process; its row goes to <out>/table.md and its output into <out>/logs.tar.gz
(one file, so it comes back from a remote machine); runs and data go to a scratch folder, --work.
Without a GPU the same command runs a reduced version on the CPU (tiny models, few steps, no compile
modes), so the suite is exercised by the test suite and never rots between GPU slots.
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
STEPS = ["env", "tests", "char", "gpt2", "fastpaths", "converge", "nanogpt"]
ON_GPU = False  # set in __main__: whether this machine has CUDA (else the reduced CPU version runs)


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
        "torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else print('no GPU: the reduced CPU suite')")],
                             120)
    suite.row("environment", code == 0, " / ".join(output.strip().splitlines()[-3:]))


def step_tests(suite: Suite, args):
    code, output = suite.run("tests", [sys.executable, "-m", "pytest", "-q", "-rs", "tests/test_cuda.py"], 600)
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", line)]
    suite.row("CUDA tests (tests/test_cuda.py)", code == 0, summary[-1].strip("= ") if summary else "no summary")


def char_data(suite: Suite, args) -> str | None:
    """Tiny Shakespeare as characters: --char_data, else prepared once into the scratch folder."""
    if args.char_data:
        return args.char_data
    data = os.path.join(args.work, "shakespeare_char")
    if not os.path.isfile(os.path.join(data, "meta.json")):
        code, _ = suite.run("char_prepare", [sys.executable, "data/shakespeare_char/prepare.py", "--out_dir", data], 300)
        if code:
            suite.row("Shakespeare char prepare", False, "see logs/char_prepare.log")
            return None
    return data


def char_run(suite: Suite, args, name: str, extra: list[str]) -> dict | None:
    """The Shakespeare char recipe for --char_iters steps (bf16 + compile on a GPU, a tiny fp32 model on a
    CPU); its summary.json, or None when it failed."""
    data = char_data(suite, args)
    if data is None:
        return None
    out_dir = os.path.join(args.work, name)
    device = (["--dtype=bfloat16", "--compile=True"] if ON_GPU else
              ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64",
               "--batch_size=8", "--eval_iters=5"])
    code, _ = suite.run(name, [sys.executable, "train.py", "config/train_shakespeare_char.py", f"--dataset={data}",
                               f"--out_dir={out_dir}", f"--max_iters={args.char_iters}",
                               f"--lr_decay_iters={args.char_iters}", "--wandb_log=False", "--log_interval=50",
                               "--overwrite=True", *device, *extra], 600)
    if code:
        return None
    with open(os.path.join(out_dir, "summary.json")) as f:
        return json.load(f)


def step_char(suite: Suite, args):
    s = char_run(suite, args, "char", [])
    figures = (f"{args.char_iters} iters, val loss {s['final_val_loss']:.4f} (best {s['best_val_loss']:.4f}), "
               f"{s['mean_tokens_per_sec']:,.0f} tok/s, {s['wall_time_s']:.0f} s wall") if s else "see logs/char.log"
    suite.row("Shakespeare char, " + ("bf16 + compile" if ON_GPU else "tiny model on the CPU"), s is not None, figures)


def step_converge(suite: Suite, args):
    """The fast path's val loss against the plain path's (host sync every step, full logits, eager), same run."""
    fast = char_run(suite, args, "converge_fast", [f"--loss_chunk={LOSS_CHUNK}"])
    plain = char_run(suite, args, "converge_plain", ["--sync_every_step=True", "--loss_chunk=0", "--compile=False"])
    ok = fast is not None and plain is not None
    suite.row(f"fast path vs plain path, Shakespeare char {args.char_iters} steps", ok,
              f"val loss {fast['final_val_loss']:.4f} fast (loss_chunk={LOSS_CHUNK}, verdicts on the device"
              f"{', compile' if ON_GPU else ''}) "
              f"vs {plain['final_val_loss']:.4f} plain; {fast['mean_tokens_per_sec']:,.0f} vs "
              f"{plain['mean_tokens_per_sec']:,.0f} tok/s" if ok else "see logs/converge_*.log")
    if ON_GPU:  # fp8 needs compute capability 8.9+; on a CPU it is emulated and tested by tests/test_fp8.py
        fp8 = char_run(suite, args, "converge_fp8", [f"--loss_chunk={LOSS_CHUNK}", "--fp8=True"])
        ok = fp8 is not None and fast is not None
        suite.row(f"fp8 vs bf16 (both on the fast path), Shakespeare char {args.char_iters} steps", ok,
                  f"val loss {fp8['final_val_loss']:.4f} fp8 vs {fast['final_val_loss']:.4f} bf16; "
                  f"{fp8['mean_tokens_per_sec']:,.0f} vs {fast['mean_tokens_per_sec']:,.0f} tok/s (separate runs)"
                  if ok else "see logs/converge_fp8.log")


def step_gpt2(suite: Suite, args):
    """GPT-2 124M at block 1024: the default micro-batch 12, then 32, 64, ... until one no longer fits (on a
    CPU, bench.py's small CPU model at batch 12 and 32)."""
    batch, fitted = 12, None
    what = "GPT-2 124M, batch {} x 1024, bf16, compile, fused AdamW" if ON_GPU else "CPU model, batch {} x 64, eager"
    while batch <= (args.max_batch if ON_GPU else 32):
        r = bench(suite, f"gpt2_b{batch}", [*BENCH_ARGS, f"--batch_size={batch}", f"--num_steps={30 if ON_GPU else 3}"])
        if r is None:
            suite.row(what.format(batch), False, "did not run (out of memory?): see log")
            break
        suite.row(what.format(batch), True, bench_text(r))
        fitted, batch = batch, 32 if batch == 12 else batch * 2
    if fitted:
        print(f"largest micro-batch that ran: {fitted}")


LOSS_CHUNK = 4096  # rows of logits per chunk in the chunked loss: 4096 x 50304 fp32 logits are 0.8 GB
RATIO_LINE = re.compile(r"B/A tokens/s: ([\d.]+)x \(min ([\d.]+)x, max ([\d.]+)x")
# (what, the A config's flags, the B config as --compare flags): B/A is each speed setting's on/off ratio. On a
# CPU only the first runs: compile's cost there is covered by the test suite, and the modes need CUDA.
FASTPATHS = [
    ("verdicts on the device vs a host sync every step", ["--sync_every_step=True"], "--sync_every_step=False"),
    (f"chunked loss (loss_chunk={LOSS_CHUNK}) vs full logits", [], f"--loss_chunk={LOSS_CHUNK}"),
    ("chunked loss at batch 24 vs full logits at batch 12", [], f"--loss_chunk={LOSS_CHUNK} --batch_size=24"),
    ("compile vs eager, GPT-2 124M batch 12", ["--compile=False"], "--compile=True"),
    ("compile max-autotune vs default", [], "--compile_mode=max-autotune"),
    ("compile reduce-overhead (CUDA graphs) vs default", [], "--compile_mode=reduce-overhead"),
    ("activation checkpointing vs off (its cost)", [], "--activation_checkpointing=True"),
    ("Muon vs AdamW (the optimizer step's cost)", [], "--optimizer=muon"),
    ("fp8 matmuls in the blocks vs bf16", [], "--fp8=True"),
    ("fp8 with the chunked loss at batch 24 vs bf16 at batch 12", [], f"--fp8=True --loss_chunk={LOSS_CHUNK} --batch_size=24"),
]


def step_fastpaths(suite: Suite, args):
    """Each speed setting against its plain path, compile against eager among them, from one bench.py --compare
    each (GPT-2 124M, batch 12, on a GPU)."""
    for i, (what, base, variant) in enumerate(FASTPATHS if ON_GPU else FASTPATHS[:1]):
        steps = ["--num_steps=20", "--rounds=5"] if ON_GPU else ["--num_steps=2", "--rounds=2", "--warmup_steps=1"]
        code, output = suite.run(f"fastpath_{i}", [sys.executable, "bench.py", *BENCH_ARGS, *base, *steps,
                                                   f"--compare={variant}"], 600)
        ratio = RATIO_LINE.search(output) if code == 0 else None
        suite.row(what, ratio is not None, f"B/A tokens/s {ratio[1]}x (min {ratio[2]}x, max {ratio[3]}x), one process, "
                  "alternating" if ratio else "see log (out of memory?)")


def trainer_ms(out_dir: str, skip: int) -> float:
    """Median ms per step of a run of ours, from its metrics.csv, after the first `skip` steps."""
    sys.path.insert(0, ROOT)
    import metrics
    return statistics.median(float(r["dt_ms"]) for r in metrics.read_rows(out_dir) if r["dt_ms"] and int(r["iter"]) > skip)


def step_nanogpt(suite: Suite, args):
    """nanoGPT's train.py and ours on the same synthetic OpenWebText-sized tokens, same settings (on a GPU; on a
    CPU, scripts/compare_nanogpt.py times the README's CPU command)."""
    if not args.nanogpt or not ON_GPU:
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
    parser.add_argument("--char_data", default="", help="a prepared tiny Shakespeare char dataset (else prepared in --work)")
    args = parser.parse_args()
    import torch
    ON_GPU = torch.cuda.is_available()
    BENCH_ARGS = [] if ON_GPU else ["--device=cpu", "--compile=False", "--vocab_size=512"]
    if not ON_GPU:
        args.char_iters = min(args.char_iters, 20)
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
