"""
The one owner of metrics.csv, a run's row-per-event log: its columns, appending a row, dropping rows a
resumed run will redo, and reading it back (plot.py and the tests read it through here). Also the step
times of a run, ours from metrics.csv and nanoGPT's from its printed lines, reckoned by one rule so the two
compare fairly (scripts/compare_nanogpt.py and scripts/gpu_suite.py).

A kill in the middle of an append can leave a last line without its newline. That torn row is never
read (a cut number would read as a wrong one) and the next append removes it before writing.
"""
import csv
import io
import os
import re
import statistics

from common import UserError, atomic_write

COLUMNS = ["iter", "tokens", "loss", "val_loss", "train_eval_loss", "lr", "grad_norm", "dt_ms", "tokens_per_sec", "mfu",
           "hellaswag"]


def metrics_path(out_dir: str) -> str:
    return os.path.join(out_dir, "metrics.csv")


def whole_length(path: str) -> int:
    """The length of the file up to the end of its last complete line (0 when it has none)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        while end > 0:  # search backwards, a block at a time, for the last newline
            start = max(0, end - 4096)
            f.seek(start)
            block = f.read(end - start)
            if b"\n" in block:
                return start + block.rindex(b"\n") + 1
            end = start
    return 0


def append_row(out_dir: str, row: dict):
    """Append one row (a subset of COLUMNS; the rest stay blank), writing the header first when the file is
    new, and cutting off a torn last line first when there is one. An OSError (a full disk) is the caller's to
    report: report.writing_run_files."""
    path = metrics_path(out_dir)
    if os.path.exists(path) and whole_length(path) and header(path) != COLUMNS:
        rewrite(path, read_rows(out_dir))  # a file from a version with fewer columns: its rows under today's header
    with open(path, "a", newline="") as f:
        whole = whole_length(path)
        if whole < f.tell():
            f.truncate(whole)
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if whole == 0:
            writer.writeheader()
        writer.writerow(row)


def header(path: str) -> list[str]:
    with open(path, newline="") as f:
        return next(csv.reader(f), [])


def check_columns(path: str):
    """A UserError when metrics.csv has columns this version does not know (a newer version wrote them), which a
    rewrite would drop; a resume checks this before it writes anything."""
    unknown = [c for c in header(path) if c not in COLUMNS]
    if unknown:
        raise UserError(f"{path} has columns this version does not know ({', '.join(unknown)}): continue the run "
                        "with the version that wrote them, or move metrics.csv aside")


def rewrite(path: str, rows: list[dict]):
    check_columns(path)
    with atomic_write(path, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def read_rows(out_dir: str) -> list[dict]:
    """Every whole row as a dict of strings ('' where blank); a UserError when the file is missing, is not
    metrics.csv, or has a row that is not numbers."""
    path = metrics_path(out_dir)
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(out_dir, "run.json")):  # train.py's, before its first log line
            raise UserError(f"{path} not found: the run in {out_dir} has not logged a step yet (or stopped before "
                            "it did): try again later, or give a run that has")
        raise UserError(f"{path} not found: give the out_dir of a run")
    with open(path, "rb") as f:
        text = f.read(whole_length(path)).decode("utf-8", errors="replace")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows, columns = list(reader), reader.fieldnames
    if columns is None or "iter" not in columns or "tokens" not in columns:
        raise UserError(f"{path} is empty or has no header with iter and tokens columns: not a run's metrics.csv")
    for line, row in enumerate(rows, 2):
        for key, value in row.items():
            try:
                int(value) if key in ("iter", "tokens") else float(value or 0)  # iter and tokens are never blank
            except (TypeError, ValueError):
                raise UserError(f"{path} line {line} is damaged ({key}={value!r} is not a number): delete that "
                                "line") from None
    return rows


def truncate(out_dir: str, iter_num: int, redone: bool = False):
    """Drop rows past iter_num, written by a run that stopped after its last checkpoint, and iter_num's evaluation
    row when redone (the checkpoint was saved before that evaluation, so the resume evaluates again); iter_num -1
    drops all."""
    path = metrics_path(out_dir)
    if not os.path.exists(path):
        return
    if iter_num < 0:  # a new run: whatever wrote the old rows
        os.remove(path)
        return
    rows = read_rows(out_dir) if os.path.getsize(path) else []
    kept = [r for r in rows if int(r["iter"]) < iter_num or int(r["iter"]) == iter_num and not (redone and r["val_loss"])]
    if len(kept) < len(rows):
        rewrite(path, kept)


def median_step_ms(out_dir: str, skip: int) -> float | None:
    """Median ms per step of a run of this trainer, from its metrics.csv past step `skip` (None: none)."""
    times = [float(r["dt_ms"]) for r in read_rows(out_dir) if r["dt_ms"] and int(r["iter"]) > skip]
    return statistics.median(times) if times else None


def nanogpt_median_step_ms(output: str, skip: int) -> float | None:
    """Median ms per step of a run of nanoGPT's train.py, from its 'iter N: loss L, time Tms' lines past its first
    `skip` steps, as median_step_ms leaves out (None: none). nanoGPT numbers its first step 0, this trainer 1."""
    times = [float(t) for i, t in re.findall(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", output, re.M)
             if int(i) >= skip]
    return statistics.median(times) if times else None
