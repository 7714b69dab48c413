"""
Times this trainer's train.py and nanoGPT's own train.py on the same command, the same data and the same
machine, in alternation, and prints the per-step times and their ratio:

    python scripts/compare_nanogpt.py --nanogpt=PATH_TO_NANOGPT_CHECKOUT [--rounds=3] [--iters=300]

PATH holds nanoGPT's train.py, model.py, configurator.py and config/train_shakespeare_char.py. Both
trainers run the README's CPU command (with --max_iters=ITERS; --flags replaces it) on tiny Shakespeare
as characters, prepared here with data/shakespeare_char/prepare.py. A step's time is the median over the
steps past the first 10 (nanoGPT prints each step's time; ours writes it to metrics.csv); evaluation is
left out of both (ours leaves it out of its step times; nanoGPT's median is not moved by its few eval steps).
"""
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import metrics  # noqa: E402
from common import ArgumentParser  # noqa: E402

README_CPU_FLAGS = ("--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 "
                    "--n_layer=4 --n_head=4 --n_embd=128 --lr_decay_iters=2000 --dropout=0.0 --wandb_log=False")


def run(cmd: list[str], cwd: str) -> str:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(cmd[:2])} in {cwd} failed:\n{result.stderr[-2000:]}")
    return result.stdout


if __name__ == "__main__":
    parser = ArgumentParser(__doc__)
    parser.add_argument("--nanogpt", required=True, help="a nanoGPT checkout (train.py, model.py, configurator.py, config/)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each trainer, alternating")
    parser.add_argument("--iters", type=int, default=300, help="steps per run")
    parser.add_argument("--flags", default=README_CPU_FLAGS, help="the flags both trainers get after the config file")
    args = parser.parse_args()
    needed = ["train.py", "model.py", "configurator.py", os.path.join("config", "train_shakespeare_char.py")]
    missing = [f for f in needed if not os.path.isfile(os.path.join(args.nanogpt, f))]
    if missing:
        sys.exit(f"error: --nanogpt {args.nanogpt} lacks {missing}: give a nanoGPT checkout")
    if args.rounds < 1 or args.iters <= 20:
        sys.exit("error: --rounds must be >= 1 and --iters > 20")

    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "data", "shakespeare_char")  # where nanoGPT looks, relative to its cwd
        run([sys.executable, os.path.join(ROOT, "data", "shakespeare_char", "prepare.py"), "--out_dir", data], ROOT)
        nano = os.path.join(work, "nanogpt")
        os.makedirs(os.path.join(nano, "config"))
        for f in needed:
            shutil.copy(os.path.join(args.nanogpt, f), os.path.join(nano, f))
        os.symlink(os.path.join(work, "data"), os.path.join(nano, "data"))
        flags = [*shlex.split(args.flags), f"--max_iters={args.iters}"]
        ours_times, nano_times = [], []
        for r in range(args.rounds):
            out = os.path.join(work, f"ours_{r}")
            run([sys.executable, os.path.join(ROOT, "train.py"), os.path.join(ROOT, "config", "train_shakespeare_char.py"),
                 *flags, f"--dataset={data}", f"--out_dir={out}"], work)
            ours_times.append(metrics.median_step_ms(out, 10))
            output = run([sys.executable, "train.py", "config/train_shakespeare_char.py", *flags,
                          f"--out_dir={os.path.join(work, f'nano_{r}')}"], nano)
            nano_times.append(metrics.nanogpt_median_step_ms(output, 10))
            if None in (ours_times[-1], nano_times[-1]):
                sys.exit(f"error: a run logged no step past its first 10 (ours {ours_times[-1]}, nanoGPT {nano_times[-1]})")
            print(f"round {r + 1}/{args.rounds}: ours {ours_times[-1]:.2f} ms/step, nanoGPT {nano_times[-1]:.2f} ms/step, "
                  f"nanoGPT/ours {nano_times[-1] / ours_times[-1]:.3f}x", flush=True)
    ratios = sorted(n / o for n, o in zip(nano_times, ours_times))
    print(f"ours {statistics.median(ours_times):.2f} ms/step, nanoGPT {statistics.median(nano_times):.2f} ms/step (medians); "
          f"ours is {statistics.median(ratios):.3f}x nanoGPT's speed (min {ratios[0]:.3f}x, max {ratios[-1]:.3f}x over "
          f"{args.rounds} rounds)")
