"""
Plots runs from their out_dir/metrics.csv, overlaid, into one figure (PNG, or PDF or SVG by --out's suffix):

    python plot.py out-shakespeare-char                    # writes out-shakespeare-char/plot.png
    python plot.py out-a out-b --out compare.png --smooth 0.9 --logx

Panels: train and val loss against tokens, learning rate, gradient norm, tokens/s and MFU (when known).
Needs matplotlib (pip install matplotlib).
"""
import math
import os
import sys

import metrics
from common import ArgumentParser, UserError, atomic_write, plural, start_script


def read_metrics(out_dir: str) -> dict[str, list[tuple[float, float]]]:
    """Series of (tokens, value) per column from out_dir/metrics.csv, blanks skipped."""
    series = {}
    for row in metrics.read_rows(out_dir):
        for key, value in row.items():
            if key not in ("iter", "tokens") and value not in ("", None):
                series.setdefault(key, []).append((float(row["tokens"]), float(value)))
    return series


def run_labels(out_dirs: list[str]) -> list[str]:
    """A legend label per run: its folder's name (the working folder's for '.'), or its path where two runs'
    folders share a name (out-a/out and out-b/out; the absolute path for one given as '.' or from above)."""
    names = [os.path.basename(os.path.abspath(d)) for d in out_dirs]
    paths = [os.path.normpath(d) for d in out_dirs]
    paths = [os.path.abspath(p) if p in (".", "..") or p.startswith(".." + os.sep) else p for p in paths]
    return [name if names.count(name) == 1 else path for name, path in zip(names, paths)]


def smooth(values: list[float], weight: float) -> list[float]:
    """Exponential moving average, debiased like TensorBoard's, so early points are not pulled to zero. A
    non-finite value (a skipped step's NaN) is a gap at its point and is left out of the average after it."""
    out, avg, n = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(float("nan"))
            continue
        avg, n = weight * avg + (1 - weight) * v, n + 1
        out.append(avg / (1 - weight ** n) if weight > 0 else v)
    return out


def lone_points(values: list[float]) -> list[int]:
    """The indices of finite values with no finite neighbour, which a line alone does not draw: a run's one logged
    step, or a value between skipped steps' NaNs."""
    finite = [math.isfinite(v) for v in values]
    return [k for k, f in enumerate(finite)
            if f and not (k > 0 and finite[k - 1]) and not (k + 1 < len(finite) and finite[k + 1])]


def past_zero(series: dict[str, list[tuple[float, float]]]) -> dict[str, list[tuple[float, float]]]:
    """series without its points at 0 tokens (iter 0's evaluation), for a log axis, which has no 0: matplotlib
    would put them at the axis's left edge, drawing a flat line from there that no run had."""
    kept = {k: [(x, y) for x, y in points if x > 0] for k, points in series.items()}
    return {k: points for k, points in kept.items() if points}


def line_colors(n_runs: int, cycle: list, colormap) -> list:
    """2 * n_runs distinct colours, the train lines' then the val lines': matplotlib's cycle while it has enough
    (10), else evenly spaced along colormap."""
    if 2 * n_runs <= len(cycle):
        return list(cycle[:2 * n_runs])
    return [colormap(k / (2 * n_runs - 1)) for k in range(2 * n_runs)]


PANELS = [("loss", "loss (train: smoothed line, val: large markers)"), ("lr", "learning rate"),
          ("grad_norm", "gradient norm"), ("tokens_per_sec", "tokens/s"), ("mfu", "MFU")]
DRAWN = {column for column, _ in PANELS} | {"val_loss"}  # the columns the panels draw


def drawn_points(runs: list[tuple[str, dict]]) -> int:
    return sum(len(points) for _, series in runs for column, points in series.items() if column in DRAWN)


def plot_runs(out_dirs: list[str], out_path: str, smoothing: float = 0.9, logx: bool = False) -> str | None:
    """Draw every run's metrics into one figure at out_path; returns a note on what logx left out, if anything."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only; no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot.py needs matplotlib: pip install matplotlib") from None
    runs = list(zip(run_labels(out_dirs), map(read_metrics, out_dirs)))
    for d, (_, series) in zip(out_dirs, runs):
        if not series:  # a header and no whole row: a run killed during its first append
            raise UserError(f"{metrics.metrics_path(d)} has no rows yet: nothing to plot")
    note = None
    if logx:
        kept = [(name, past_zero(s)) for name, s in runs]
        gone = [name for name, s in kept if not DRAWN & set(s)]
        if len(gone) == len(runs):
            raise UserError("every point is at 0 tokens, where a log axis has none: leave out --logx")
        left_out = drawn_points(runs) - drawn_points(kept)
        if left_out:
            note = (f"--logx leaves out {plural(left_out, 'point')} at 0 tokens (iter 0's "
                    "evaluation): a log axis has no 0" + (f"; {', '.join(gone)} had no other, and is not drawn"
                                                          if gone else ""))
        runs = kept
    panels = [p for p in PANELS if any(p[0] in s or (p[0] == "loss" and "val_loss" in s) for _, s in runs)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels) + 0.6), sharex=True, squeeze=False)
    colors = line_colors(len(runs), plt.rcParams["axes.prop_cycle"].by_key()["color"], matplotlib.colormaps["turbo"])
    for (column, title), ax in zip(panels, axes[:, 0]):
        for i, (name, series) in enumerate(runs):
            color = colors[i]
            if column in series:
                x, y = zip(*series[column])
                y = smooth(list(y), smoothing) if column == "loss" else list(y)
                lone = lone_points(y)
                ax.plot(x, y, color=color, label=name, lw=1.2, alpha=0.8,
                        **({"marker": "o", "ms": 3, "markevery": lone} if lone else {}))
            if column == "loss" and "val_loss" in series:
                # val in a colour no train line uses, with black-edged markers on top, so train noise never hides it
                x, y = zip(*series["val_loss"])
                ax.plot(x, y, "D-", color=colors[i + len(runs)], ms=6, mec="black", mew=0.8, lw=1.5,
                        zorder=5, label=f"{name} val")
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        if column == "mfu":
            ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        if logx:
            ax.set_xscale("log")
    axes[0, 0].legend(fontsize=8)
    axes[-1, 0].set_xlabel("tokens")
    fig.tight_layout()
    try:
        with atomic_write(out_path, "wb") as f:  # a failed write leaves an earlier plot whole
            fig.savefig(f, format=os.path.splitext(out_path)[1][1:], dpi=110)
    except OSError as e:
        raise UserError(f"cannot write {out_path} ({e.strerror or e}): choose another --out") from None
    finally:
        plt.close(fig)
    return note


if __name__ == "__main__":
    start_script()  # as the other scripts: a reader gone (`| head`) ends it quietly
    parser = ArgumentParser(__doc__)
    parser.add_argument("out_dirs", nargs="+", help="run folders holding metrics.csv (or their metrics.csv files)")
    parser.add_argument("--out", help="PNG to write (default: plot.png in the first run's folder)")
    parser.add_argument("--smooth", type=float, default=0.9,
                        help="EMA weight for the train loss, from 0 (none) to below 1 (default: 0.9)")
    parser.add_argument("--logx", action="store_true", help="log-scale token axis")
    args = parser.parse_args()
    args.out_dirs = [os.path.dirname(d) or "." if os.path.basename(d) == "metrics.csv" and not os.path.isdir(d) else d
                     for d in args.out_dirs]  # a run's metrics.csv named, for its folder
    if not 0 <= args.smooth < 1:
        sys.exit(f"error: --smooth {args.smooth} is not in [0, 1)")
    out_path = args.out or os.path.join(args.out_dirs[0], "plot.png")
    if not out_path.endswith((".png", ".pdf", ".svg")):
        sys.exit(f"error: --out {out_path} does not end in .png, .pdf or .svg: name an image file (this also keeps "
                 "a run's other files from being overwritten)")
    if os.path.basename(out_path) in (".png", ".pdf", ".svg"):  # --out=out/$NAME.png, with NAME unset
        sys.exit(f"error: --out {out_path} has no name before its {os.path.basename(out_path)}: name the image, such "
                 f"as --out={os.path.join(os.path.dirname(out_path), 'plot.png')}")
    try:
        note = plot_runs(args.out_dirs, out_path, args.smooth, args.logx)
    except (UserError, ImportError) as e:
        sys.exit(f"error: {e}")
    except OSError as e:  # a metrics.csv this user may not read
        sys.exit(f"error: cannot read {e.filename} ({e.strerror or e}): check its permissions")
    if note:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {out_path}")
