"""
The one owner of metrics.csv, a run's row-per-event log: its columns, appending a row, dropping rows a
resumed run will redo, and reading it back (plot.py and the tests read it through here).
"""
import csv
import os

from common import UserError, atomic_write

COLUMNS = ["iter", "tokens", "loss", "val_loss", "train_eval_loss", "lr", "grad_norm", "dt_ms", "tokens_per_sec", "mfu"]


def metrics_path(out_dir: str) -> str:
    return os.path.join(out_dir, "metrics.csv")


def append_row(out_dir: str, row: dict):
    """Append one row (a subset of COLUMNS; the rest stay blank), writing the header first when the file is new."""
    path = metrics_path(out_dir)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def read_rows(out_dir: str) -> list[dict]:
    """Every row as a dict of strings ('' where blank); a UserError when the file is missing or not metrics.csv."""
    path = metrics_path(out_dir)
    if not os.path.isfile(path):
        raise UserError(f"{path} not found: give the out_dir of a run")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows, columns = list(reader), reader.fieldnames
    if columns is None or "iter" not in columns:
        raise UserError(f"{path} is empty or has no header with an iter column: not a run's metrics.csv")
    return rows


def truncate(out_dir: str, iter_num: int):
    """Drop rows past iter_num, written by a run that stopped after its last checkpoint; iter_num -1 drops all."""
    path = metrics_path(out_dir)
    if not os.path.exists(path):
        return
    rows = read_rows(out_dir) if iter_num >= 0 and os.path.getsize(path) else []
    kept = [r for r in rows if int(r["iter"]) <= iter_num]
    if iter_num < 0 or len(kept) < len(rows):
        with atomic_write(path, newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(kept)
