"""
How a run reports. The loop makes one call per event (start, eval, step, sample, summary; eval_only for a
run that only evaluates); this module turns each into the progress line or JSON line, the metrics.csv row
and the wandb call. Only rank 0 reports: other ranks get a Reporter that writes nothing. A new metric is a
column in metrics.COLUMNS, an argument of Reporter.step and the loop's value for it.
"""
import datetime
import hashlib
import os
import re
import shlex
import subprocess
import sys
from contextlib import contextmanager

import metrics
from common import (UserError, atomic_write, json_text, launcher_ranks, local_processes, read_json,
                    replaceable_result, write_json)

SAMPLE_HEADING = re.compile(r"^---- iter (\d+) ----\n", re.M)  # each sample in samples.txt starts with one


@contextmanager
def writing_run_files(out_dir: str, name: str, training: bool = True):
    """A run file (name, in out_dir) that cannot be written (a full disk, a read-only file) is one error line
    naming it: the earlier file stays whole (writes are atomic or appends), as do the checkpoints written so
    far, which a training run is told to resume from where there is one."""
    try:
        yield
    except OSError as e:
        resumable = training and os.path.exists(os.path.join(out_dir, "ckpt.pt"))
        raise UserError(f"cannot write {e.filename or os.path.join(out_dir, name)} ({e.strerror or e}): free space "
                        "on its disk or make it writable, then run again"
                        + (" with --init_from=resume (it continues from the last checkpoint)" if resumable else "")
                        ) from None


def foreign_config(out_dir: str) -> bool:
    """Whether out_dir holds a config.json that no run wrote (a transformers model's, say), which a new run must not
    write over. A run's holds its settings, max_iters and out_dir among them."""
    path = os.path.join(out_dir, "config.json")
    if not os.path.isfile(path):
        return False
    try:
        config = read_json(path, "")
    except UserError:  # not JSON: not a run's
        return True
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror}): make it readable, or choose another out_dir") from None
    return not (isinstance(config, dict) and {"max_iters", "out_dir"} <= config.keys())


def check_wandb(wandb_log: bool):
    """wandb_log=True needs wandb importable: said at the start, not after the data and model are ready."""
    if wandb_log:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise UserError("wandb_log=True but wandb is not installed: pip install wandb, or pass "
                            "--wandb_log=False") from None


def sample_entry(it: int, text: str) -> str:
    """A sample as samples.txt holds it: its heading (SAMPLE_HEADING), then its text."""
    return f"---- iter {it} ----\n{text}\n"


def read_samples(path: str) -> list[list]:
    """[iter, text] of each sample in a samples.txt (a sample torn by a kill keeps what was written of it)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        content = f.read()
    heads = list(SAMPLE_HEADING.finditer(content))
    ends = [h.start() for h in heads[1:]] + [len(content)]
    return [[int(h.group(1)), content[h.end():end].removesuffix("\n")] for h, end in zip(heads, ends)]


def truncate_samples(out_dir: str, iter_num: int, redone: bool = False) -> list[list]:
    """Drop the samples past iter_num from samples.txt, and iter_num's when its evaluation is redone, as
    metrics.truncate drops rows (a resumed run writes them again); returns the samples kept."""
    path = os.path.join(out_dir, "samples.txt")
    if not os.path.exists(path):
        return []
    samples = read_samples(path)
    kept = [s for s in samples if s[0] < iter_num or s[0] == iter_num and not redone]
    if len(kept) < len(samples):
        with atomic_write(path, encoding="utf-8") as f:
            f.writelines(sample_entry(it, text) for it, text in kept)
    return kept


class NoWandb:
    """Stands in for wandb when it is off, so that the events log to it with no `if wandb_log` (only the samples'
    table, which has no use but wandb's, is not built for it)."""

    def log(self, *args, **kwargs):
        pass

    def finish(self):
        pass


def format_duration(seconds: float) -> str:
    """A duration as h:mm:ss."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_line(it: int, max_iters: int, loss: float, lr: float, tokens_per_sec: float, mfu: float | None,
                  elapsed: float, eta: float | None) -> str:
    """One human-readable progress line (eta None: not known yet)."""
    mfu_text = f" | mfu {mfu * 100:.1f}%" if mfu is not None else ""
    return (f"iter {it}/{max_iters} ({100 * it / max_iters:.1f}%) | loss {loss:.4f} | lr {lr:.2e} | "
            f"{tokens_per_sec:,.0f} tok/s{mfu_text} | {format_duration(elapsed)} elapsed, ETA "
            + (format_duration(eta) if eta is not None else "not known yet"))


def launch_command(argv: list[str], env) -> list[str]:
    """The command that started this run: python and argv, or under torchrun (its variables in env) torchrun's
    command on rank 0's node, with the node and process counts it ran with (and its rendezvous, across nodes)."""
    ranks = launcher_ranks(env)  # as train.py decided it: torchrun's variables, or none
    if ranks is None:
        return [os.path.basename(sys.executable), *argv]
    per_node = local_processes(env)
    nodes = ranks[2] // per_node
    where = ["--standalone"] if nodes == 1 else [f"--nnodes={nodes}", "--node_rank=0",
                                                 f"--master_addr={env.get('MASTER_ADDR')}",
                                                 f"--master_port={env.get('MASTER_PORT')}"]
    return ["torchrun", *where, f"--nproc_per_node={per_node}", *argv]


def run_info(config: dict, argv: list[str], code_dir: str = os.path.dirname(os.path.abspath(__file__))) -> dict:
    """What reproduces a run besides its config: the command, the code version (code_dir's git commit, and whether
    a tracked file differs from it: untracked files, a run's own folders among them, are not the code) and the
    library versions."""
    import torch
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=code_dir, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=code_dir,
                                    capture_output=True, text=True, timeout=10).stdout.strip()) if commit else None
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"command": shlex.join(launch_command(argv, os.environ)), "git_commit": commit,
            "git_dirty": dirty, "torch": torch.__version__, "python": sys.version.split()[0],
            "started": datetime.datetime.now().isoformat(timespec="seconds"), "config": config}


EVAL_ONLY_KEYS = {"init_from", "checkpoint", "iter", "dataset", "eval_iters", "batch_size", "block_size", "train_loss",
                  "val_loss", "time"}  # what an eval_only run writes to eval.json; checkpoint: resume_from, or None
# an eval.json written before checkpoint was recorded, which a new evaluation may replace as well
EVAL_ONLY_KEYS_BEFORE = EVAL_ONLY_KEYS - {"checkpoint"}


def check_eval_file(out_dir: str):
    """An eval_only run replaces out_dir/eval.json only when it holds an earlier eval_only result (eval.py's
    HellaSwag score may be there)."""
    path = os.path.join(out_dir, "eval.json")
    fix = "move it aside, or evaluate into another out_dir"
    if not (replaceable_result(path, EVAL_ONLY_KEYS, fix) or replaceable_result(path, EVAL_ONLY_KEYS_BEFORE, fix)):
        raise UserError(f"{path} already exists and is not an earlier result of an eval_only run: {fix}")


def earlier_sessions(out_dir: str) -> list[dict]:
    """The sessions of the run in out_dir so far, from its run.json (each with its command, versions and start),
    the last with the summary.json it ended with (None: it did not finish). A file that is not valid JSON (edited
    by hand, say) is recorded as such: a resume goes on without it."""
    def read(name):
        try:
            return read_json(os.path.join(out_dir, name), "")
        except UserError:
            return f"{name} was not valid JSON"
    last, summary = read("run.json"), read("summary.json")
    if last is None and summary is None:
        return []
    last = last if isinstance(last, dict) else {"run.json": last}
    prior = last.pop("earlier_sessions", [])
    return [*(prior if isinstance(prior, list) else []), {**last, "summary": summary}]


def read_summary(out_dir: str) -> dict | None:
    """A finished run's summary.json (Reporter.summary writes it), or None where the run did not finish."""
    return read_json(os.path.join(out_dir, "summary.json"), "it was not written by this trainer: run again")


def failing_wandb(hook, wandb):
    """sys.excepthook while a wandb run is open: `hook` reports the error, then the run is marked failed (as
    wandb's own hook would, which prints the traceback instead)."""
    def excepthook(exc_type, exc, tb):
        hook(exc_type, exc, tb)  # first: a finish that hangs (no network) or is interrupted must not lose the line
        try:
            wandb.finish(exit_code=255 if issubclass(exc_type, KeyboardInterrupt) else 1)
        except BaseException:  # a run that cannot finish now keeps its files, for `wandb sync`
            pass
    return excepthook


def fork_run_id(run_id: str, folder: str) -> str:
    """The wandb run id of a copy of a run (see checkpoint.copied_from) in folder: a function of the original's id
    and the copy's real path, so that a copy stopped before its first save goes on with the same wandb run."""
    return hashlib.sha256(f"{run_id} {os.path.realpath(folder)}".encode()).hexdigest()[:12]


SUMMARY_KEYS = ("iters", "tokens", "stopped_by_signal", "skipped_steps", "final_train_loss", "final_val_loss",
                "final_loss_iter", "best_val_loss", "best_iter", "wall_time_s", "first_step_s", "mean_tokens_per_sec",
                "mean_mfu", "checkpoint")  # summary.json's (a rebuilt one adds "rebuilt")


class Reporter:
    def __init__(self, out_dir: str, log_format: str, active: bool):
        self.out_dir, self.format, self.active = out_dir, log_format, active
        self.wandb, self.samples, self.eta_announced = NoWandb(), [], False

    def print(self, text: str, always: bool = False):
        """A line of information: as it is in text mode, as {"message": text} in json mode (so that stdout
        stays one JSON object per line); in quiet mode only when always (a skipped step, a stop)."""
        if self.active and (always or self.format != "quiet"):
            print(json_text({"message": text}) if self.format == "json" else text, flush=True)

    def warn(self, text: str):
        """A warning, whatever log_format: `warning: text` on stderr (stdout stays progress lines, or JSON)."""
        if self.active:
            print(f"warning: {text}", file=sys.stderr, flush=True)

    def start(self, config: dict, info: dict, truncate_at: int, wandb_settings: dict | None,
              redone: bool = False) -> str | None:
        """Write config.json and run.json, drop metrics rows and samples past truncate_at (-1, a new run: all of
        them; and truncate_at's evaluation and sample when redone, as a resume from a checkpoint saved before
        them evaluates that step again), start wandb when wandb_settings (project, name, id, and `relogs`: why this session's steps may
        differ from those the run logged past truncate_at, as "with other settings", or None) are given; returns
        the wandb run id."""
        if not self.active:
            return None
        path = metrics.metrics_path(self.out_dir)
        resumed = truncate_at >= 0
        earlier = earlier_sessions(self.out_dir) if resumed else []  # the sessions before, read before any write
        logged = -1  # the last iter the run logged
        if resumed and os.path.exists(path):  # a damaged metrics.csv is an error before any file is written
            logged = max((int(r["iter"]) for r in metrics.read_rows(self.out_dir)), default=-1)
            metrics.check_columns(path)
            if not os.access(path, os.W_OK):  # and so is one the run could not go on writing
                raise UserError(f"{path} is not writable: make it writable (chmod u+w), then resume")
        run_id = None
        if wandb_settings is not None:
            import wandb
            # the id saved in the checkpoint makes a resumed run continue the same wandb run, unless the run had
            # logged past the checkpoint and this session's steps may differ: wandb keeps a run's steps increasing,
            # so it would drop them up to there, and show the abandoned steps
            name, run_id = wandb_settings["name"], wandb_settings["id"]
            if run_id and logged > truncate_at and wandb_settings["relogs"]:
                name, run_id = f"{name} from iter {truncate_at}", None
                self.print(f"wandb: the run logged iters up to {logged} {wandb_settings['relogs']}; this session logs "
                           f"to a new wandb run, {name!r}, as wandb would drop its steps up to iter {logged}", always=True)
            hook = sys.excepthook  # the scripts' one error line, which wandb.init replaces with its traceback
            try:
                wandb.init(project=wandb_settings["project"], name=name, config=config, id=run_id, resume="allow")
            except Exception as e:  # no API key, no network, a refused project; a bad WANDB_ setting (pydantic's)
                sys.excepthook = hook
                raise UserError(f"wandb_log=True but wandb could not start ({e.__class__.__name__}: "
                                f"{' '.join(str(e).split())[:300]}): check the WANDB_ variables, run `wandb login`, set "
                                "WANDB_MODE=offline (then `wandb sync` later), or pass --wandb_log=False") from None
            self.wandb, run_id = wandb, wandb.run.id
            sys.excepthook = failing_wandb(hook, wandb)
        with writing_run_files(self.out_dir, "config.json"):
            write_json(os.path.join(self.out_dir, "config.json"), dict(sorted(config.items())))
        with writing_run_files(self.out_dir, "run.json"):
            write_json(os.path.join(self.out_dir, "run.json"), {**run_info(config, sys.argv), **info,
                                                               **({"earlier_sessions": earlier} if earlier else {})})
        if resumed:  # kept in run.json: summary.json is only ever the summary of the session that wrote it last
            with writing_run_files(self.out_dir, "summary.json"):
                if os.path.exists(os.path.join(self.out_dir, "summary.json")):
                    os.remove(os.path.join(self.out_dir, "summary.json"))
        with writing_run_files(self.out_dir, "metrics.csv"):
            metrics.truncate(self.out_dir, truncate_at, redone)
        with writing_run_files(self.out_dir, "samples.txt"):
            self.samples = truncate_samples(self.out_dir, truncate_at, redone)  # wandb's table goes on with these
        return run_id

    def eval(self, it: int, tokens: int, losses: dict):
        """An eval's losses. It logs no learning rate: the step row of the same iter has the rate that made
        these weights, where the rate about to be used would give one iter two rates."""
        if not self.active:
            return
        hellaswag = losses.get("hellaswag")  # acc_norm, at the evals that score it
        if self.format == "json":
            print(json_text({"iter": it, "train_loss": losses["train"], "val_loss": losses["val"],
                              **({"hellaswag": hellaswag} if hellaswag is not None else {})}), flush=True)
        else:
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                  + (f", hellaswag acc_norm {hellaswag:.4f}" if hellaswag is not None else ""), flush=True)
        with writing_run_files(self.out_dir, "metrics.csv"):
            metrics.append_row(self.out_dir, {"iter": it, "tokens": tokens, "val_loss": losses["val"],
                                              "train_eval_loss": losses["train"], "hellaswag": hellaswag})
        self.wandb.log({"iter": it, "train/loss": losses["train"], "val/loss": losses["val"],
                        **({"hellaswag/acc_norm": hellaswag} if hellaswag is not None else {})}, step=it)

    def eval_only(self, result: dict):
        """The result of an eval_only run: printed, and written to eval.json, the one file such a run writes."""
        if set(result) != EVAL_ONLY_KEYS - {"time"}:  # this file format's keys, the time added here
            raise ValueError("the evaluation's keys differ from EVAL_ONLY_KEYS in "
                             f"{sorted(set(result) ^ (EVAL_ONLY_KEYS - {'time'}))}")
        if not self.active:
            return
        path = os.path.join(self.out_dir, "eval.json")
        with writing_run_files(self.out_dir, "eval.json", training=False):
            os.makedirs(self.out_dir, exist_ok=True)  # evaluating GPT-2 may name a new out_dir
            write_json(path, {**result, "time": datetime.datetime.now().isoformat(timespec="seconds")})
        if self.format == "json":
            print(json_text({"eval": result}), flush=True)
        else:
            at = f" at iter {result['iter']}" if result["iter"] is not None else ""  # None: not this run's step
            print(f"eval of {result['checkpoint'] or result['init_from']}{at}: train loss {result['train_loss']:.4f}, "
                  f"val loss {result['val_loss']:.4f} (written to {path})", flush=True)

    def step(self, it: int, max_iters: int, tokens: int, loss: float, lr: float, grad_norm: float, dt: float,
             tokens_per_sec: float, mfu: float | None, elapsed: float, steps_done: int, train_time: float):
        """A log step: dt is the mean time per step since the last one; train_time is this session's
        training time over its steps_done timed steps, which gives the ETA (None before any is timed: the
        first step's time, compiling included, says little of the pace)."""
        if not self.active:
            return
        eta = train_time / steps_done * (max_iters - it) if steps_done else None if it < max_iters else 0.0
        if self.format == "text":
            print(progress_line(it, max_iters, loss, lr, tokens_per_sec, mfu, elapsed, eta), flush=True)
        elif self.format == "json":
            print(json_text({"iter": it, "max_iters": max_iters, "loss": loss, "lr": lr, "tokens": tokens,
                              "tokens_per_sec": tokens_per_sec, "mfu": mfu, "grad_norm": grad_norm,
                              "elapsed_s": elapsed, "eta_s": eta}), flush=True)
        # announced once 10 steps are done, the untimed first one among them (so at iter 10 with log_interval 10),
        # and never for no step left (a session of a few steps, resumed near the end)
        if (not self.eta_announced and 0 < steps_done >= min(9, max_iters - (it - steps_done)) and it < max_iters
                and self.format == "text"):
            self.eta_announced = True
            print(f"estimated time for the remaining {max_iters - it:,} steps: {format_duration(eta)} "
                  f"({train_time / steps_done * 1000:.1f} ms/step so far, evaluations not included)", flush=True)
        with writing_run_files(self.out_dir, "metrics.csv"):
            metrics.append_row(self.out_dir, {"iter": it, "tokens": tokens, "loss": loss, "lr": lr,
                                              "grad_norm": grad_norm, "dt_ms": dt * 1000,
                                              "tokens_per_sec": tokens_per_sec, "mfu": mfu if mfu is not None else ""})
        self.wandb.log({"iter": it, "train/loss_step": loss, "lr": lr, "grad_norm": grad_norm,
                        **({"mfu": mfu} if mfu is not None else {})}, step=it)  # unknown (a CPU) is no 0% chart

    def sample(self, it: int, text: str):
        if not self.active:
            return
        if self.format == "json":
            print(json_text({"iter": it, "sample": text}), flush=True)
        else:
            print(f"---- sample at iter {it} ----\n{text}\n----", flush=True)
        with writing_run_files(self.out_dir, "samples.txt"), \
                open(os.path.join(self.out_dir, "samples.txt"), "a", encoding="utf-8") as f:
            f.write(sample_entry(it, text))
        self.samples.append([it, text])
        if not isinstance(self.wandb, NoWandb):
            self.wandb.log({"samples": self.wandb.Table(columns=["iter", "sample"], data=self.samples)}, step=it)

    def summary(self, summary: dict):
        """Write summary.json (SUMMARY_KEYS) and print it: one JSON line, or one sentence."""
        if set(summary) != set(SUMMARY_KEYS):  # the loop's keys, and rebuild_summary's, are this file format's
            raise ValueError(f"the summary's keys differ from SUMMARY_KEYS in {sorted(set(summary) ^ set(SUMMARY_KEYS))}")
        if not self.active:
            return
        with writing_run_files(self.out_dir, "summary.json"):
            write_json(os.path.join(self.out_dir, "summary.json"), summary)
        if self.format == "json":
            print(json_text({"summary": summary}), flush=True)
        else:
            fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
            evaluated = summary["final_loss_iter"] is not None
            print(f"done: {summary['iters']:,} iters, {summary['tokens']:,} tokens in "
                  f"{format_duration(summary['wall_time_s'])}; "
                  + (f"final train/val loss {fmt(summary['final_train_loss'])}/{fmt(summary['final_val_loss'])}"
                     if evaluated else "no evaluation in this session")
                  + (f" (from the last eval, at iter {summary['final_loss_iter']})"
                     if summary["final_loss_iter"] not in (None, summary["iters"]) else "")
                  + (f", best val {fmt(summary['best_val_loss'])} at iter {summary['best_iter']}"
                     if summary["best_val_loss"] is not None else "")
                  + (" (the weights it started from, so no best.pt)" if summary["best_iter"] == 0 else "") + "; "
                  + (f"{summary['mean_tokens_per_sec']:,.0f} tok/s" if summary["mean_tokens_per_sec"] else "no steps")
                  + (f", mfu {summary['mean_mfu'] * 100:.1f}%" if summary["mean_mfu"] else "")
                  + f"; checkpoint {summary['checkpoint']}; summary in {self.out_dir}/summary.json", flush=True)

    def rebuild_summary(self, checkpoint: dict) -> bool:
        """summary.json of a finished run whose last session was killed after its final save but before writing
        it: rebuilt from ckpt.pt (read as checkpoint) and metrics.csv's final evaluation, with null for what only
        that session knew (its times, its skipped steps). Returns whether it wrote one (none when it is there)."""
        path = os.path.join(self.out_dir, "summary.json")
        if not self.active or os.path.exists(path):
            return False
        it = checkpoint["iter_num"]
        try:
            final = [r for r in metrics.read_rows(self.out_dir) if int(r["iter"]) == it and r["val_loss"]][-1:]
        except UserError:  # no metrics.csv, or a damaged one: the final losses are not known
            final = []
        best = checkpoint["best_val_loss"]
        known = {"iters": it, "tokens": checkpoint["tokens"], "stopped_by_signal": False,
                 "final_train_loss": float(final[0]["train_eval_loss"]) if final else None,
                 "final_val_loss": float(final[0]["val_loss"]) if final else None,
                 "final_loss_iter": it if final else None, "best_val_loss": best if best < float("inf") else None,
                 "best_iter": checkpoint["best_iter"], "checkpoint": os.path.join(self.out_dir, "ckpt.pt")}
        with writing_run_files(self.out_dir, "summary.json"):  # the session's times and skipped steps: null
            write_json(path, {**{k: known.get(k) for k in SUMMARY_KEYS}, "rebuilt": "from ckpt.pt and metrics.csv"})
        return True

    def finish(self):
        self.wandb.finish()
