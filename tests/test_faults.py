"""Crash safety and exact resume: kill -9, SIGTERM, non-finite losses, DDP faults, multi-node, bad input."""
import csv
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from common import FolderLock, UserError
from conftest import ROOT, char_vocab_size, read_metrics, run_script, step_losses

pytestmark = pytest.mark.slow  # each test runs the scripts end to end

FAULT_ARGS = dict(device="cpu", compile=False, n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8,
                  gradient_accumulation_steps=2, dropout=0.1, eval_iters=2, eval_interval=4, log_interval=1,
                  max_iters=24, warmup_iters=4, lr_decay_iters=24, learning_rate=3e-3, min_lr=3e-4)


def args_for(data_dir, out_dir, **overrides):
    return [f"--{k}={v}" for k, v in {**FAULT_ARGS, "dataset": data_dir, "out_dir": out_dir, **overrides}.items()]


def losses(out_dir):
    return step_losses(read_metrics(out_dir))


def weights(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu", weights_only=True)["model"]


def assert_same_run(a, b, max_iters=24):
    la, lb = losses(a), losses(b)
    assert sorted(la) == sorted(lb) == list(range(1, max_iters + 1))
    assert [la[i] for i in sorted(la)] == [lb[i] for i in sorted(lb)]  # identical, not merely close
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def start(data_dir, out_dir, cwd, **overrides):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args_for(data_dir, out_dir, **overrides)],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_iter(out_dir, iter_num, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if max(losses(out_dir), default=0) >= iter_num:
                return
        except (OSError, KeyError, ValueError):  # not written yet, or caught halfway through a line
            pass
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError(f"no iter {iter_num} in {out_dir}")


@pytest.fixture(scope="module")
def straight_run(char_data, tmp_path_factory):
    """The uninterrupted run every faulted run is compared with."""
    out = str(tmp_path_factory.mktemp("straight") / "out")
    result = run_script("train.py", *args_for(char_data, out), cwd=os.path.dirname(out))
    assert result.returncode == 0, result.stderr
    return out


def test_resume_after_kill_9_is_exact(char_data, straight_run, tmp_path):
    out = str(tmp_path / "out")
    proc = start(char_data, out, str(tmp_path))
    wait_for_iter(out, 14, proc)  # past the checkpoints at 4, 8 and 12
    proc.kill()
    proc.wait()
    result = run_script("train.py", *args_for(char_data, out, init_from="resume"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert_same_run(straight_run, out)


def test_sigterm_checkpoints_exits_0_and_resumes_exactly(char_data, straight_run, tmp_path):
    out = str(tmp_path / "out")
    proc = start(char_data, out, str(tmp_path))
    wait_for_iter(out, 6, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "SIGTERM: checkpointing after this step" in stderr and "stopped by signal" in stdout
    saved = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert saved["iter_num"] == max(losses(out)) and not saved["evaluated"]
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    last_eval = max(int(r["iter"]) for r in read_metrics(out) if r["val_loss"])
    assert summary["stopped_by_signal"] and summary["final_loss_iter"] == last_eval < summary["iters"] == saved["iter_num"]
    assert f"(from the last eval, at iter {last_eval})" in stdout
    result = run_script("train.py", *args_for(char_data, out, init_from="resume"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "resumed with settings other than" not in result.stdout  # the same command
    assert_same_run(straight_run, out)


def test_a_stop_during_an_evaluation_drops_it_saves_and_resumes_exactly(char_data, straight_run, tmp_path):
    """A long evaluation (eval_iters 100,000 here; HellaSwag-sized ones take minutes) would outlast the grace a
    scheduler gives after its SIGTERM: the evaluation is dropped, the weights saved unevaluated, and the resume
    evaluates them again, as the unbroken run did."""
    first = str(tmp_path / "first")  # a new run stopped in its first evaluation
    proc = start(char_data, first, str(tmp_path), eval_iters=100_000)
    while not os.path.exists(os.path.join(first, "run.json")):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr  # its first weights saved unevaluated, so that a requeued job resumes
    assert "stopped by signal during the evaluation at iter 0 (dropped); resume with --init_from=resume\n" in stdout
    saved = torch.load(os.path.join(first, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert saved["iter_num"] == 0 and not saved["evaluated"]
    # a session stopped in its first evaluation, before any step of its own, has nothing to save
    proc = start(char_data, first, str(tmp_path), init_from="resume", eval_iters=100_000)
    while not os.path.exists(os.path.join(first, "run.json")) or \
            "earlier_sessions" not in open(os.path.join(first, "run.json")).read():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert ("stopped by signal during the evaluation at iter 0, before any step of this session: nothing to save; "
            "resume with --init_from=resume\n") in stdout
    out = str(tmp_path / "out")
    result = run_script("train.py", *args_for(char_data, out, max_iters=2), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    proc = start(char_data, out, str(tmp_path), init_from="resume", eval_iters=100_000)  # stopped in iter 4's
    for line in proc.stdout:
        if line.startswith("iter 4/24"):
            break
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "stopped by signal during the evaluation at iter 4 (dropped); resume with --init_from=resume" in stdout
    saved = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert saved["iter_num"] == 4 and not saved["evaluated"]
    # a session that resumed, evaluated iter 4 and was killed before its next save leaves that row: redone, not kept
    from metrics import append_row
    append_row(out, {"iter": 4, "tokens": 0, "val_loss": 9.0, "train_eval_loss": 9.0})
    result = run_script("train.py", *args_for(char_data, out, init_from="resume"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert_same_run(straight_run, out)
    evals = [(int(r["iter"]), float(r["val_loss"])) for r in read_metrics(out) if r["val_loss"]]
    assert len({it for it, _ in evals}) == len(evals) and (4, 9.0) not in evals and 4 in dict(evals)  # one each


def test_a_kill_right_after_a_checkpoint_loses_no_sample(char_data, tmp_path):
    """Each eval's sample is written before its checkpoint: once ckpt.pt of iter 4 is there, so is iter 4's sample
    (written after it, a kill while sampling would leave a checkpoint that the resume takes as evaluated and
    sampled, and the sample would never be written)."""
    out = str(tmp_path / "out")
    proc = start(char_data, out, str(tmp_path), max_iters=8, eval_interval=4, sample_interval=1, sample_tokens=3000)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(out, "ckpt.pt")):
        assert time.time() < deadline and proc.poll() is None, "no checkpoint at iter 4"
        time.sleep(0.02)
    proc.kill()
    proc.communicate()
    result = run_script("train.py", *args_for(char_data, out, max_iters=8, eval_interval=4, sample_interval=1,
                                              sample_tokens=3000, init_from="resume"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    from report import read_samples
    assert [it for it, _ in read_samples(os.path.join(out, "samples.txt"))] == [0, 4, 8]


def test_an_eval_of_weights_that_are_not_finite_writes_no_sample(char_data, tmp_path):
    result = run_script("train.py", *args_for(char_data, str(tmp_path / "out"), max_iters=8, lr_decay_iters=8,
                                              eval_interval=4, sample_interval=1, learning_rate=1e30, min_lr=0,
                                              grad_clip=0, max_nonfinite_steps=100), cwd=str(tmp_path))
    assert "iter 4: no sample, the val loss is nan" in result.stdout
    assert result.stderr.strip().startswith("error: the last evaluation (iter 8) gave val loss nan")


def test_a_streak_of_non_finite_steps_goes_on_counting_across_a_resume(char_data, tmp_path):
    """A checkpoint written during a streak (its evaluation beat the best) keeps the streak: the resume stops where
    the unbroken run would have, not max_nonfinite_steps later. Here the checkpoint says 2 skipped in a row, and a
    nan in its final norm makes every step after it non-finite: the resumed run's first is the streak's third."""
    out = str(tmp_path / "out")
    first = run_script("train.py", *args_for(char_data, out, max_iters=4, eval_interval=4), cwd=str(tmp_path))
    assert first.returncode == 0, first.stderr
    checkpoint = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert checkpoint["nonfinite_streak"] == 0
    checkpoint["nonfinite_streak"] = 2
    checkpoint["model"]["transformer.ln_f.weight"][0] = float("nan")
    torch.save(checkpoint, os.path.join(out, "ckpt.pt"))
    result = run_script("train.py", *args_for(char_data, out, max_iters=20, eval_interval=20, init_from="resume",
                                              max_nonfinite_steps=3), cwd=str(tmp_path))
    assert result.returncode == 1
    assert "iter 5: non-finite loss or gradient norm, 1 step skipped so far this session" in result.stdout, result.stdout
    assert "error: 3 steps in a row had a non-finite loss or gradient norm (by iter 5)" in result.stderr, result.stderr


def test_a_sample_whose_logits_are_not_finite_is_a_warning_and_the_run_goes_on(tmp_path):
    """The val loss can be finite while a sample is not: here the prompt's character never occurs in the data, and
    its row of the (untied) embedding is 1e20, which the first norm squares past float32's range."""
    import data.prepare as prepare
    from conftest import made_up_text
    lines = made_up_text(seed=3, n_words=300, max_word_len=6, n_tokens=3000).splitlines()
    prepare.prepare_corpus(lines, str(tmp_path / "data"), "char", "".join(sorted(prepare.alphabet(lines) + "#")),
                           val_fraction=0.1, workers=1, progress=False)
    first = run_script("train.py", *args_for(str(tmp_path / "data"), str(tmp_path / "a"), max_iters=2,
                                             tie_embeddings=False), cwd=str(tmp_path))
    assert first.returncode == 0, first.stderr
    checkpoint = torch.load(tmp_path / "a" / "ckpt.pt", map_location="cpu", weights_only=True)
    checkpoint["model"]["transformer.wte.weight"][checkpoint["vocabulary"]["chars"].index("#")] = 1e20
    torch.save(checkpoint, tmp_path / "overflowing.pt")
    result = run_script("train.py", *args_for(str(tmp_path / "data"), str(tmp_path / "b"), max_iters=4,
                                              warmup_iters=1, init_from=str(tmp_path / "overflowing.pt"),
                                              sample_interval=1, sample_prompt="#"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    for it in (0, 4):
        assert (f"warning: no sample at iter {it}: the model's logits were nan or inf while generating"
                in result.stderr)
    assert "---- sample at" not in result.stdout
    assert torch.load(tmp_path / "b" / "ckpt.pt", map_location="cpu", weights_only=True)["iter_num"] == 4


def test_weights_that_give_non_finite_steps_are_not_saved_though_their_val_loss_is_finite(char_data, tmp_path):
    """A step at a learning rate of 1e5 is finite but leaves weights whose val loss is about 1e11 (finite: the
    norms keep the forward pass in range) and whose gradients overflow, so every later step is skipped. Those
    weights must not replace ckpt.pt, nor push the kept steps out, at an evaluation or at the end."""
    out = str(tmp_path / "out")
    shape = dict(batch_size=4, dropout=0.0, warmup_iters=2, max_iters=8, lr_decay_iters=8, keep_last_n=1)
    assert run_script("train.py", *args_for(char_data, out, **shape), cwd=str(tmp_path)).returncode == 0
    before = {name: open(os.path.join(out, name), "rb").read() for name in ("ckpt.pt", "ckpt_0000008.pt", "best.pt")}
    result = run_script("train.py", f"--out_dir={out}", "--init_from=resume", "--learning_rate=1e5",
                        "--decay_lr=False", "--max_iters=20", "--max_nonfinite_steps=100", cwd=str(tmp_path))
    assert "iter 12: not saved, as the last 3 steps were skipped as non-finite and the val loss is no better than " \
           f"the best; the last good checkpoint, {out}/ckpt.pt at iter 8, is kept" in result.stdout, result.stdout
    evals = [r for r in read_metrics(out) if r["val_loss"] and int(r["iter"]) > 8]
    assert [int(r["iter"]) for r in evals] == [12, 16, 20] and all(1e6 < float(r["val_loss"]) < 1e30 for r in evals)
    assert result.returncode == 1 and re.fullmatch(
        r"error: the run ended in 11 steps in a row with a non-finite loss or gradient norm, and its val loss \S+ is no "
        rf"better than the best: its weights were not saved; the last good checkpoint, {re.escape(out)}/ckpt.pt at "
        r"iter 8, is kept. Lower learning_rate, raise warmup_iters or check the data", result.stderr.strip())
    assert {name: open(os.path.join(out, name), "rb").read() for name in before} == before
    assert sorted(f for f in os.listdir(out) if f.endswith(".pt")) == sorted(before)


def test_a_stop_before_the_first_log_line_still_counts_its_steps_in_the_summary(char_data, tmp_path):
    out = str(tmp_path / "out")
    proc = start(char_data, out, str(tmp_path), log_interval=1000, max_iters=1000)
    deadline = time.time() + 120
    while not any(r["val_loss"] and int(r["iter"]) >= 4 for r in (read_metrics(out) if os.path.exists(
            os.path.join(out, "metrics.csv")) else [])):  # eval rows only: no step has logged
        assert time.time() < deadline and proc.poll() is None, "no eval at iter 4"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["stopped_by_signal"] and 4 <= summary["iters"] < 1000
    assert summary["mean_tokens_per_sec"] > 0  # the steps' time is counted, though no log line took it
    # resumed with a max_iters below where it stopped: it ends there, evaluated, and says so
    ended = run_script("train.py", f"--out_dir={out}", "--init_from=resume", "--max_iters=2", cwd=str(tmp_path))
    stopped_at = summary["iters"]
    assert ended.returncode == 0 and f"the checkpoint is at iter {stopped_at}, past max_iters 2: the run ends there, " \
        "with its final evaluation and save" in ended.stdout, ended.stderr
    assert max(int(r["iter"]) for r in read_metrics(out) if r["val_loss"]) == stopped_at


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_ctrl_c_exits_at_once_and_a_repeated_sigterm_still_saves(char_data, tmp_path, second):
    """Under torchrun a scheduler's SIGTERM reaches each worker twice at once: directly and forwarded by torchrun."""
    out = str(tmp_path / "out")
    # ctrl-c: no evaluation saves a checkpoint before the signals, however late this process reads the log
    evals = {"eval_interval": 100_000} if second == signal.SIGINT else {}
    proc = start(char_data, out, str(tmp_path), max_iters=100_000, n_layer=4, n_embd=256, n_head=4, keep_last_n=2,
                 **evals)
    wait_for_iter(out, 2, proc)
    proc.send_signal(signal.SIGTERM)
    for line in proc.stderr:  # wait until the first one has been handled
        if "checkpointing after this step" in line:
            break
    proc.send_signal(second)  # before the 3M-parameter model's step in progress can finish
    _, stderr = proc.communicate(timeout=60)
    if second == signal.SIGINT:
        assert proc.returncode == 128 + signal.SIGINT and stderr.endswith("SIGINT again: exiting now, without saving\n")
        assert not os.path.exists(os.path.join(out, "ckpt.pt"))  # it did not stay to save
    else:
        assert proc.returncode == 0
        assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["iter_num"] >= 2
        # keep_last_n keeps evaluated checkpoints (every 4 steps): the signal's save takes no place among them
        assert all(int(f[5:-3]) % 4 == 0 for f in os.listdir(out) if f.startswith("ckpt_"))


@pytest.mark.parametrize("both", [False, True], ids=["stdout-closed", "tee-and-ctrl-c"])
def test_a_run_whose_output_reader_goes_checkpoints_and_exits_0(char_data, tmp_path, both):
    """`train.py | head`: stdout's reader goes. `train.py 2>&1 | tee log` and Ctrl-C: the signal ends tee too, so
    the handler's own message meets a closed pipe. Either way the run saves the step it is on, as for a SIGTERM."""
    out = str(tmp_path / "out")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args_for(
        char_data, out, max_iters=100_000, eval_interval=4)], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if both else subprocess.PIPE, text=True)
    for line in proc.stdout:  # past the checkpoint at iter 4
        if re.match(r"iter ([6-9]|\d\d+)/", line):
            break
    if both:  # the signal first: one that came after a stop had begun could find the run already past its loop
        proc.send_signal(signal.SIGINT)
    proc.stdout.close()
    stderr = "" if both else proc.stderr.read()
    assert proc.wait(timeout=60) == 0, stderr
    assert both or "the output pipe's reader is gone: checkpointing after this step" in stderr
    saved = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert saved["iter_num"] == max(losses(out)) > 6  # the stop's own save, of the last step trained
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["stopped_by_signal"]


def test_a_run_started_with_stdout_and_stderr_closed_trains_and_saves(char_data, tmp_path):
    out = str(tmp_path / "out")  # Python's sys.stdout and sys.stderr are None then
    result = subprocess.run(["bash", "-c", '"$@" >&- 2>&-', "_", sys.executable, os.path.join(ROOT, "train.py"),
                             *args_for(char_data, out, max_iters=4)], cwd=str(tmp_path), timeout=120)
    assert result.returncode == 0
    assert torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["iter_num"] == 4


def test_kill_9_at_random_moments_never_loses_the_run(char_data, tmp_path):
    """Kills land anywhere, some during a checkpoint write: a 3M-parameter model checkpointed every 2 steps
    spends much of its time saving. KILL_SOAK_KILLS sets how many kills."""
    soak = dict(n_layer=4, n_head=4, n_embd=256, eval_interval=2)
    straight_run, out = str(tmp_path / "straight"), str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, straight_run, **soak), cwd=str(tmp_path)).returncode == 0
    rng = random.Random(int(os.environ.get("KILL_SOAK_SEED", "0")))
    kills = int(os.environ.get("KILL_SOAK_KILLS", "4"))
    during_save = 0
    def restart():  # a kill after metrics.csv's first row but before the first checkpoint leaves nothing to resume
        return {"init_from": "resume"} if os.path.exists(os.path.join(out, "ckpt.pt")) else {"overwrite": True}
    for _ in range(kills):
        proc = start(char_data, out, str(tmp_path), **restart(), **soak)
        time.sleep(rng.uniform(2.0, 6.0))  # start-up (torch's import, the first eval) takes about 2.5 s
        proc.kill()
        proc.wait()
        during_save += os.path.exists(os.path.join(out, "ckpt.pt.tmp"))  # a write the kill cut short
        if os.path.exists(os.path.join(out, "ckpt.pt")):
            torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)  # always loadable
    print(f"{kills} kills, {during_save} of them during a checkpoint write")
    result = run_script("train.py", *args_for(char_data, out, **restart(), **soak), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    la, lb = losses(straight_run), losses(out)
    assert [la[i] for i in sorted(la)] == [lb[i] for i in sorted(lb)]
    wa, wb = weights(straight_run), weights(out)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_going_back_to_a_kept_step_keeps_best_pt_and_refuses_to_replace_later_checkpoints(char_data, tmp_path):
    """--resume_from=ckpt_8.pt (unpadded): the checkpoints after step 8 are refused, not overwritten; once moved
    out, the run goes on from step 8, and best.pt (of a later, better step) is not replaced by worse evaluations."""
    out = str(tmp_path / "out")
    args = dict(max_iters=16, dropout=0.0, keep_last_n=4)
    assert run_script("train.py", *args_for(char_data, out, **args), cwd=str(tmp_path)).returncode == 0
    best = torch.load(os.path.join(out, "best.pt"), map_location="cpu", weights_only=True)
    step_8 = torch.load(os.path.join(out, "ckpt_0000008.pt"), map_location="cpu", weights_only=True)
    assert best["iter_num"] > 8 and best["best_val_loss"] < step_8["best_val_loss"]
    before = digests(out)
    back = dict(args, init_from="resume", resume_from="ckpt_8.pt")  # the same steps again: never strictly better
    refused = run_script("train.py", *args_for(char_data, out, **back), cwd=str(tmp_path))
    assert refused.returncode != 0 and (f"ckpt_0000008.pt is iter 8, but {out} holds checkpoints of later steps "
                                        "(ckpt.pt, ckpt_0000012.pt, ckpt_0000016.pt)") in refused.stderr
    assert digests(out) == before
    os.makedirs(tmp_path / "later")
    for name in ("ckpt.pt", "ckpt_0000012.pt", "ckpt_0000016.pt"):
        os.rename(os.path.join(out, name), tmp_path / "later" / name)
    result = run_script("train.py", *args_for(char_data, out, **back), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"best.pt (iter {best['iter_num']}, val loss" in result.stdout
    val = {int(r["iter"]): float(r["val_loss"]) for r in read_metrics(out) if r["val_loss"]}
    assert val[12] < step_8["best_val_loss"]  # so best.pt would have been replaced at step 12, had the run
    assert digests(out)["best.pt"] == before["best.pt"]  # gone by ckpt_8's best alone
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert (summary["best_iter"], summary["best_val_loss"]) == (best["iter_num"], pytest.approx(best["best_val_loss"]))
    redone, first = weights(out), torch.load(tmp_path / "later" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert all(torch.equal(redone[k], first["model"][k]) for k in redone)  # and exactly: step 8 on is as before
    again = run_script("train.py", *args_for(char_data, out, **back), cwd=str(tmp_path))  # a requeued job, say
    assert again.returncode != 0 and "if they are the progress made since going back, resume without --resume_from" \
        in again.stderr


@pytest.mark.parametrize("always", [True, False])
def test_always_save_checkpoint_false_saves_only_improvements_and_the_end(char_data, tmp_path, always):
    """A learning rate too small to move any fp32 weight: every eval's val loss equals iter 0's, so none improves."""
    out = str(tmp_path / "out")
    result = run_script("train.py", *args_for(char_data, out, max_iters=8, learning_rate=1e-30, min_lr=0,
                                              keep_last_n=5, always_save_checkpoint=always), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert len({r["val_loss"] for r in read_metrics(out) if r["val_loss"]}) == 1  # no eval improved on iter 0's
    kept = sorted(f for f in os.listdir(out) if f.startswith("ckpt_"))
    assert kept == (["ckpt_0000004.pt", "ckpt_0000008.pt"] if always else ["ckpt_0000008.pt"])


def test_best_checkpoint_and_keep_last_n(char_data, tmp_path):
    out = str(tmp_path / "out")
    result = run_script("train.py", *args_for(char_data, out, dropout=0.0, keep_last_n=2), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(f for f in os.listdir(out) if f.endswith(".pt")) == ["best.pt", "ckpt.pt", "ckpt_0000020.pt",
                                                                          "ckpt_0000024.pt"]
    with open(os.path.join(out, "metrics.csv")) as f:
        val = {int(r["iter"]): float(r["val_loss"]) for r in csv.DictReader(f) if r["val_loss"]}
    best = torch.load(os.path.join(out, "best.pt"), map_location="cpu", weights_only=True)
    assert best["best_val_loss"] == pytest.approx(min(v for i, v in val.items() if i > 0), rel=1e-6)
    assert val[best["iter_num"]] == pytest.approx(best["best_val_loss"], rel=1e-6)
    from checkpoint import checkpoint_file, load_trained  # a kept step is named by its iter, padded or not
    assert checkpoint_file(out, "ckpt_20.pt") == os.path.join(out, "ckpt_0000020.pt")
    model, _ = load_trained("resume", checkpoint_file(out, "ckpt_20.pt"))
    kept = torch.load(os.path.join(out, "ckpt_0000020.pt"), map_location="cpu", weights_only=True)["model"]
    assert kept.keys() == model.state_dict().keys()
    assert all(torch.equal(v, kept[k]) for k, v in model.state_dict().items())
    shutil.copyfile(os.path.join(out, "ckpt_0000024.pt"), os.path.join(out, "ckpt_20.pt"))  # a copy named so
    assert checkpoint_file(out, "ckpt_20.pt") == os.path.join(out, "ckpt_20.pt")  # the file named, not the kept step
    copy = re.escape(os.path.join(out, "ckpt_20.pt"))
    with pytest.raises(UserError, match=rf": {copy} is a file, not a run's folder; for a checkpoint file, "
                                        rf"pass --init_from={copy}$"):
        load_trained("resume", checkpoint_file(os.path.join(out, "ckpt_20.pt"), "ckpt.pt"))  # --out_dir=the file


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc, *args, nnodes=1, node_rank=0, port=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nnodes}", f"--node_rank={node_rank}", "--master_addr=127.0.0.1", f"--master_port={port}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd + [os.path.join(ROOT, "train.py"), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def worker_pids(launcher_pid):
    """The train.py processes that a torchrun started, from the process table (no terminal width involved)."""
    import psutil
    return sorted(p.pid for p in psutil.Process(launcher_pid).children()
                  if any(arg.endswith("train.py") for arg in p.cmdline()))


def test_sigterm_to_one_ddp_rank_saves_and_stops_both(char_data, tmp_path):
    out = str(tmp_path / "out")
    proc = torchrun(2, *args_for(char_data, out, backend="gloo", max_iters=200))
    wait_for_iter(out, 3, proc)
    os.kill(worker_pids(proc.pid)[1], signal.SIGTERM)  # rank 1 only
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    saved = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert saved["iter_num"] == max(losses(out)) < 200 and len(saved["rng_states"]) == 2
    with open(os.path.join(out, "summary.json")) as f:  # rank 0 writes it, and was not the one signalled
        assert json.load(f)["stopped_by_signal"] is True


def test_a_ddp_rank_killed_makes_the_other_exit(char_data, tmp_path):
    out = str(tmp_path / "out")
    proc = torchrun(2, *args_for(char_data, out, backend="gloo", max_iters=100_000, ddp_timeout=60))
    wait_for_iter(out, 3, proc)
    t0 = time.time()
    os.kill(worker_pids(proc.pid)[1], signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0 and time.time() - t0 < 90


@pytest.mark.parametrize("check", ["new run over a run", "resume over a damaged metrics.csv"])
def test_a_check_only_rank_0_makes_stops_every_ddp_rank_with_its_line(char_data, tmp_path, check):
    """Only rank 0 looks at out_dir and metrics.csv: its refusal reaches rank 1 as the same line, not as a
    traceback from a collective that rank 0 never joined. The earlier run's files stay as they were."""
    out = str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, out, max_iters=2, eval_interval=2), cwd=str(tmp_path)).returncode == 0
    resume = check == "resume over a damaged metrics.csv"
    if resume:
        with open(os.path.join(out, "metrics.csv"), "a") as f:
            f.write("x,1,2\n")
    before = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
    proc = torchrun(2, *args_for(char_data, out, backend="gloo", max_iters=4, init_from="resume" if resume else "scratch"))
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    line = r"metrics.csv line \d+ is damaged" if resume else r"out_dir .* already holds a run"
    for rank in (0, 1):
        assert re.search(rf"^\[rank{rank}\]: error: .*{line}", stderr, re.M), stderr
    assert "[rank1]: Traceback" not in stderr and "[rank0]: Traceback" not in stderr
    assert {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)} == before


def test_two_nodes_on_loopback_match_one_node(char_data, tmp_path):
    single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
    common = dict(backend="gloo", dropout=0.0, max_iters=8)
    one = torchrun(2, *args_for(char_data, single, **common))
    assert one.wait(timeout=180) == 0, one.communicate()
    port = free_port()
    nodes = [torchrun(1, *args_for(char_data, multi, **common), nnodes=2, node_rank=r, port=port) for r in (0, 1)]
    for node in nodes:
        assert node.wait(timeout=180) == 0, node.communicate()
    la, lb = losses(single), losses(multi)
    assert sorted(la) == sorted(lb) == list(range(1, 9))
    assert all(abs(la[i] - lb[i]) < 1e-6 for i in la)


NODE_LOCAL = """import os, runpy, sys
os.chdir("n" + os.environ["GROUP_RANK"])  # this node's folder: out_dir on the node's own disk
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as running train.py itself would
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_nodes_that_read_different_checkpoints_are_stopped_before_training(char_data, tmp_path):
    """Two nodes on loopback, out_dir on each node's own disk: node 1 finds an older checkpoint than node 0's, and
    must not train from it; then none at all; then node 0 alone fails (its out_dir is in use). Each time both
    nodes stop with the line, rather than one waiting to join until ddp_timeout."""
    for node, iters in (("n0", 8), ("n1", 4)):
        os.makedirs(tmp_path / node)
        assert run_script("train.py", *args_for(char_data, "out", max_iters=iters), cwd=str(tmp_path / node)).returncode == 0
    before = digests(tmp_path / "n0" / "out")
    (tmp_path / "node_local.py").write_text(NODE_LOCAL)

    def resume() -> str:
        port = free_port()
        nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--nnodes=2",
                                   f"--node_rank={r}", "--master_addr=127.0.0.1", f"--master_port={port}",
                                   str(tmp_path / "node_local.py"), os.path.join(ROOT, "train.py"),
                                   *args_for(char_data, "out", backend="gloo", init_from="resume")],
                                  cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}) for r in (0, 1)]
        stderr = [node.communicate(timeout=180)[1] for node in nodes]
        assert all(node.returncode != 0 for node in nodes)
        return "".join(stderr)
    assert ("error: the processes read different checkpoints at out/ckpt.pt: rank 0 one at iter 8, rank 1 one at "
            "iter 4; every node must see the same out_dir") in resume()
    os.rename(tmp_path / "n1" / "out" / "ckpt.pt", tmp_path / "n1" / "ckpt.pt")
    assert ("error: no checkpoint at out/ckpt.pt: check out_dir (init_from='resume' continues a run saved there) "
            "(on rank 1, not on rank 0: every node must see out_dir, on a filesystem they share)") in resume()
    assert digests(tmp_path / "n0" / "out") == before  # node 0's run is as it was
    alone = run_script("train.py", *args_for(char_data, "out", init_from="resume"), cwd=str(tmp_path / "n1"),
                       torchrun_procs=1)  # one rank of a launch: nothing to compare, the error all the same
    assert alone.returncode != 0 and "error: no checkpoint at out/ckpt.pt: check out_dir" in alone.stderr
    os.rename(tmp_path / "n1" / "ckpt.pt", tmp_path / "n1" / "out" / "ckpt.pt")  # node 0 alone fails: both stop,
    lock = FolderLock(str(tmp_path / "n0" / "out"))  # with node 0's line (its out_dir in use by another run)
    lock.claim("another train.py")
    assert "error: out_dir out is in use by another train.py" in resume()


def test_a_new_run_on_character_ids_without_their_names_warns_that_they_are_taken_as_gpt2s(char_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(char_data, data)
    os.remove(data / "meta.json"), os.remove(data / "meta.pkl")  # train.bin and val.bin alone: nanoGPT's GPT-2 layout
    result = run_script("train.py", *args_for(str(data), str(tmp_path / "out"), max_iters=2), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (f"warning: dataset {data} has no meta.json or meta.pkl to name its tokens, so they are taken as GPT-2's "
            f"(nanoGPT's layout), but its largest id is {char_vocab_size(char_data) - 1}") in result.stderr


def test_a_resume_on_data_that_no_longer_names_its_characters_keeps_the_checkpoints_characters(char_data, tmp_path):
    """nanoGPT's layout without meta.pkl (train.bin and val.bin copied alone): the tokens are the same, so the
    run goes on, and its checkpoints keep the characters the model was trained on, for sample.py to decode."""
    data, out = tmp_path / "data", str(tmp_path / "out")
    shutil.copytree(char_data, data)
    assert run_script("train.py", *args_for(str(data), out, max_iters=4), cwd=str(tmp_path)).returncode == 0
    before = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["vocabulary"]
    os.remove(data / "meta.json"), os.remove(data / "meta.pkl")
    result = run_script("train.py", *args_for(str(data), out, max_iters=8, init_from="resume", sample_interval=1,
                                              sample_prompt="ROMEO:"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "---- sample at iter 8 ----\nROMEO:" in result.stdout  # encoded and decoded as characters, not BPE
    assert "taken as GPT-2's" not in result.stderr
    saved = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert saved["iter_num"] == 8 and saved["vocabulary"] == before and len(before["chars"]) == char_vocab_size(char_data)
    sampled = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=5",
                         "--start=ROMEO:", cwd=str(tmp_path))
    assert sampled.returncode == 0 and sampled.stdout.startswith("ROMEO:"), sampled.stderr
    assert sampled.stderr == ""  # a prompt inside block_size: no note
    long = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=5",
                      f"--start={'ROMEO:' * 7}", cwd=str(tmp_path))  # 42 characters, block_size 32
    assert long.stderr == "note: the prompt's 42 tokens are more than block_size 32: the model sees its last 32\n"
    started = run_script("train.py", *args_for(str(data), str(tmp_path / "new"), max_iters=2, sample_interval=1,
                                               sample_prompt="ROMEO:", init_from=os.path.join(out, "ckpt.pt")),
                         cwd=str(tmp_path))  # a new run from its weights: the same characters
    assert "---- sample at iter 2 ----\nROMEO:" in started.stdout, started.stderr


def test_a_resume_whose_metrics_csv_cannot_be_written_is_refused_before_any_file_changes(char_data, tmp_path):
    out = str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, out, max_iters=4, lr_decay_iters=8),
                      cwd=str(tmp_path)).returncode == 0
    path = os.path.join(out, "metrics.csv")
    os.chmod(path, 0o444)
    immutable = os.access(path, os.W_OK)  # root: the mode does not stop it, the immutable flag does
    if immutable:
        subprocess.run(["chattr", "+i", path], check=True)
    try:
        before = digests(out)
        result = run_script("train.py", *args_for(char_data, out, max_iters=8, lr_decay_iters=8, init_from="resume"),
                            cwd=str(tmp_path))  # a decay within the run: no warning beside the line
        assert result.returncode != 0
        assert result.stderr.strip() == f"error: {path} is not writable: make it writable (chmod u+w), then resume"
        assert digests(out) == before
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", path], check=True)


def test_a_dry_run_needs_no_writable_out_dir(char_data, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    immutable = os.access(locked, os.W_OK)  # root: the mode does not stop it, the immutable flag does
    if immutable:
        subprocess.run(["chattr", "+i", str(locked)], check=True)
    try:
        args = args_for(char_data, str(locked / "run"), max_iters=4)
        refused = run_script("train.py", *args, cwd=str(tmp_path))
        assert refused.returncode != 0 and "is not writable" in refused.stderr  # a real run would need it
        dry = run_script("train.py", *args, "--dry_run=True", cwd=str(tmp_path))
        assert dry.returncode == 0 and "dry run: it fits; nothing trained or written" in dry.stdout, dry.stderr
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        os.chmod(locked, 0o755)


def test_a_run_file_that_cannot_be_written_is_one_error_line_that_offers_a_resume_only_where_one_is(tmp_path):
    """A full disk before the first checkpoint has nothing to resume from; an eval_only run resumes nothing."""
    from report import Reporter
    out = str(tmp_path)
    os.makedirs(tmp_path / "metrics.csv")  # where the file should be: open() fails as on a full disk
    os.makedirs(tmp_path / "eval.json.tmp")  # the temporary file that atomic_write renames into place
    reporter = Reporter(out, "quiet", True)
    step = lambda: reporter.step(1, 10, 64, 2.0, 1e-3, 1.0, 0.1, 640.0, None, 1.0, 1, 0.1)  # noqa: E731
    told = f"cannot write {tmp_path / 'metrics.csv'} (Is a directory): free space on its disk or make it writable, " \
           "then run again"
    with pytest.raises(UserError) as refused:
        step()
    assert str(refused.value) == told
    (tmp_path / "ckpt.pt").write_bytes(b"")
    with pytest.raises(UserError) as refused:
        step()
    assert str(refused.value) == told + " with --init_from=resume (it continues from the last checkpoint)"
    result = {"init_from": "resume", "checkpoint": "ckpt.pt", "iter": 4, "dataset": "d", "eval_iters": 1,
              "batch_size": 1, "block_size": 8, "train_loss": 2.0, "val_loss": 2.1}
    with pytest.raises(UserError, match=r"cannot write .*eval.json.tmp \(Is a directory\): .*then run again$"):
        reporter.eval_only(result)
    # a resume cuts samples.txt back to its step: a full disk there (no file name in the error) names that file
    os.rmdir(tmp_path / "metrics.csv")
    (tmp_path / "samples.txt").write_text("---- iter 2 ----\nab\n---- iter 4 ----\ncd\n")
    os.symlink("/dev/full", tmp_path / "samples.txt.tmp")
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path / 'samples.txt'} \(No space left on device\)"):
        reporter.start({}, {}, 2, None)


def test_a_resume_on_changed_data_says_how_it_changed(char_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(char_data, data)
    out = str(tmp_path / "out")
    for max_iters in (4, 8):
        result = run_script("train.py", *args_for(str(data), out, max_iters=max_iters,
                                                  init_from="resume" if max_iters == 8 else "scratch"), cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        assert "changed since the checkpoint" not in result.stdout
    meta = json.loads((data / "meta.json").read_text())  # the val split re-made, half as long
    val = meta["splits"]["val"]
    n = val["file_tokens"][0]
    with open(data / val["files"][0], "r+b") as f:
        f.truncate(n // 2 * 2)  # uint16 tokens
    val["file_tokens"] = [n // 2]
    (data / "meta.json").write_text(json.dumps(meta))
    result = run_script("train.py", *args_for(str(data), out, max_iters=12, init_from="resume"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (f"warning: dataset {data} changed since the checkpoint (val: 1 file of {n:,} tokens then, 1 file of "
            f"{n // 2:,} tokens now): the batches from here are not an unbroken run's, and val losses before and after "
            "are on different data") in result.stderr
    train = np.fromfile(data / "train.bin", dtype=np.uint16)  # prepared again from a reordered text: the same size
    np.roll(train, len(train) // 2).tofile(data / "train.bin")
    result = run_script("train.py", *args_for(str(data), out, max_iters=16, init_from="resume"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (f"warning: dataset {data} changed since the checkpoint (train: the same 1 file of {len(train):,} tokens, "
            "with other tokens in them now): the batches from here are not an unbroken run's") in result.stderr

# ---- off the happy path, handled without an error (the mistakes that are refused are in test_mistakes.py)

def digests(folder):
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest() for name in os.listdir(folder)}


@pytest.fixture()
def trained(char_data, tmp_path):
    """A finished run of 4 steps."""
    out = str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, out, max_iters=4), cwd=str(tmp_path)).returncode == 0
    return out


@pytest.mark.parametrize("always_save", [True, False])
def test_resuming_a_finished_run_says_so_and_changes_nothing(char_data, tmp_path, always_save):
    out = str(tmp_path / "out")
    # a learning rate far too high: the val loss at the last eval is worse than at iter 0, so only the rule that
    # the last eval always writes ckpt.pt leaves a checkpoint to resume from
    args = args_for(char_data, out, max_iters=8, eval_interval=100, learning_rate=3.0, min_lr=0.3, warmup_iters=0,
                    always_save_checkpoint=always_save)
    assert run_script("train.py", *args, cwd=str(tmp_path)).returncode == 0
    before = digests(out)
    result = run_script("train.py", *args, "--init_from=resume", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"the run in {out} is finished: its checkpoint is at iter 8 and max_iters is 8" in result.stdout
    assert digests(out) == before
    val = [float(r["val_loss"]) for r in read_metrics(out) if r["val_loss"]]
    assert val[-1] > val[0] and "best.pt" not in before  # the last eval did not improve


def test_a_kill_between_ckpt_and_best_is_repaired_when_the_run_resumes(char_data, tmp_path):
    out = str(tmp_path / "out")
    args = args_for(char_data, out, max_iters=8, dropout=0.0, keep_last_n=2)
    assert run_script("train.py", *args, cwd=str(tmp_path)).returncode == 0

    def load(name):
        return torch.load(os.path.join(out, name), map_location="cpu", weights_only=True)
    assert load("ckpt.pt")["best_iter"] == 8  # the last eval improved: ckpt.pt, best.pt and ckpt_0000008.pt alike
    os.remove(os.path.join(out, "best.pt"))  # what a kill right after ckpt.pt's rename leaves: best.pt of iter 4
    shutil.copyfile(os.path.join(out, "ckpt_0000004.pt"), os.path.join(out, "best.pt"))
    os.remove(os.path.join(out, "ckpt_0000008.pt"))
    summary = json.load(open(os.path.join(out, "summary.json")))
    os.remove(os.path.join(out, "summary.json"))  # nor is summary.json written yet
    ckpt_digest = digests(out)["ckpt.pt"]
    result = run_script("train.py", *args, "--init_from=resume", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "best.pt was missing or older than ckpt.pt" in result.stdout and "is finished" in result.stdout
    assert load("best.pt")["iter_num"] == load("ckpt_0000008.pt")["iter_num"] == 8
    assert digests(out)["ckpt.pt"] == ckpt_digest
    assert "summary.json was missing" in result.stdout
    rebuilt = json.load(open(os.path.join(out, "summary.json")))  # the run's figures as the session had them
    same = ("iters", "tokens", "final_train_loss", "final_val_loss", "final_loss_iter", "best_val_loss", "best_iter",
            "checkpoint")
    assert {k: rebuilt[k] for k in same} == {k: summary[k] for k in same} and rebuilt["final_val_loss"] is not None
    assert rebuilt["wall_time_s"] is None and rebuilt["skipped_steps"] is None  # only that session knew them


def test_sigterm_is_acted_on_at_the_next_step_not_the_next_log_line(char_data, tmp_path):
    out = str(tmp_path / "out")
    proc = start(char_data, out, str(tmp_path), max_iters=100_000, log_interval=5000, eval_interval=4)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(out, "ckpt.pt")):  # the first checkpoint, at iter 4
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    saved = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert not saved["evaluated"] and 4 < saved["iter_num"] < 5000


def test_eval_only_writes_eval_json_and_nothing_else(trained, char_data, tmp_path):
    before = digests(trained)
    summary = json.load(open(os.path.join(trained, "summary.json")))
    result = run_script("train.py", *args_for(char_data, trained, max_iters=4, init_from="resume", eval_only=True,
                                              learning_rate=1e-3), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert set(digests(trained)) - set(before) == {"eval.json"}
    assert {k: v for k, v in digests(trained).items() if k != "eval.json"} == before
    evaluated = json.load(open(os.path.join(trained, "eval.json")))
    assert evaluated["iter"] == 4 and evaluated["val_loss"] == pytest.approx(summary["final_val_loss"], rel=1e-6)
    assert evaluated["checkpoint"] == "ckpt.pt"
    # its lines describe the evaluation, not the training run the config also describes
    batches = (f"{evaluated['eval_iters']} batches of {evaluated['batch_size']} sequences x "
               f"{evaluated['block_size']} tokens")
    assert f"evaluation: {batches} per split" in result.stdout and "; one evaluation of iteration 4;" in result.stdout
    assert "evaluating with settings other than the run's: learning_rate=0.001 (was 0.003)" in result.stdout
    assert "tokens per iteration" not in result.stdout and "steps of" not in result.stdout
    dry = run_script("train.py", *args_for(char_data, trained, max_iters=4, init_from="resume", eval_only=True),
                     "--dry_run=True", cwd=str(tmp_path))
    assert dry.returncode == 0 and f"an evaluation of {batches} per split" in dry.stdout, dry.stderr
    assert "per step" not in dry.stdout


def test_eval_json_names_the_checkpoint_evaluated_and_replaces_one_written_before_it_did(trained, char_data, tmp_path):
    """A best.pt and a ckpt.pt of the same iter (a run that went back) gave eval.json files that differed in their
    losses alone; an eval.json of the keys written before is still an evaluation's own, for the next to replace."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    old = {"init_from": "resume", "iter": 4, "dataset": "d", "eval_iters": 1, "batch_size": 1, "block_size": 1,
           "train_loss": 1.0, "val_loss": 1.0, "time": "2026-12-01T00:00:00"}
    with open(run / "eval.json", "w") as f:
        json.dump(old, f)
    result = run_script("train.py", *args_for(char_data, str(run), max_iters=4, init_from="resume", eval_only=True,
                                              resume_from="best.pt"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "eval of best.pt at iter 4:" in result.stdout
    evaluated = json.load(open(run / "eval.json"))
    assert evaluated["checkpoint"] == "best.pt" and evaluated["time"] != old["time"]
    gpt2_style = run_script("train.py", *args_for(char_data, str(tmp_path / "new"), max_iters=4, eval_only=True,
                                                  init_from=str(run / "best.pt")), cwd=str(tmp_path))
    assert gpt2_style.returncode == 0, gpt2_style.stderr
    assert json.load(open(tmp_path / "new" / "eval.json"))["checkpoint"] is None  # init_from names the file


@pytest.mark.parametrize("blocked", ["config.json.tmp", "summary.json.tmp"])
def test_a_run_file_that_cannot_be_written_is_one_error_line(char_data, tmp_path, blocked):
    """A folder where the file (or its temporary) goes: open fails as it would on a full disk, even for root."""
    out = tmp_path / "out"
    os.makedirs(out / blocked)
    result = run_script("train.py", *args_for(char_data, str(out), max_iters=4, sample_interval=1, sample_tokens=4),
                        cwd=str(tmp_path))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"error: cannot write {out / blocked} (Is a directory): free space on its disk or make it" in result.stderr
    assert os.path.isfile(out / "ckpt.pt") == (blocked == "summary.json.tmp")  # the end's checkpoint, then summary


@pytest.mark.parametrize("flag", ["--dry_run=True", "--eval_only=True"])
def test_dry_runs_and_evaluations_need_no_wandb_whatever_wandb_log_says(trained, char_data, tmp_path, flag):
    """A config with wandb_log = True (train_gpt2.py) on a machine without wandb: neither starts a wandb run."""
    without_wandb = (f"import runpy, sys; sys.modules['wandb'] = None; sys.argv = sys.argv[1:]; "
                     f"sys.path.insert(0, {ROOT!r}); runpy.run_path(sys.argv[0], run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", without_wandb, os.path.join(ROOT, "train.py"),
                             *args_for(char_data, trained, max_iters=4, init_from="resume", wandb_log=True), flag],
                            cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_eval_only_reads_the_weights_alone_so_a_muon_run_needs_no_optimizer_setting(char_data, tmp_path):
    out = str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, out, max_iters=4, optimizer="muon"), cwd=str(tmp_path)).returncode == 0
    result = run_script("train.py", *args_for(char_data, out, max_iters=4, init_from="resume", eval_only=True),
                        cwd=str(tmp_path))  # optimizer: the default adamw, which the run did not use
    assert result.returncode == 0, result.stderr
    summary = json.load(open(os.path.join(out, "summary.json")))
    evaluated = json.load(open(os.path.join(out, "eval.json")))
    assert evaluated["val_loss"] == pytest.approx(summary["final_val_loss"], rel=1e-6)


@pytest.mark.parametrize("how", ["finished", "eval_only", "dry_run"])
def test_each_early_exit_under_ddp_leaves_the_group_cleanly(trained, char_data, how):
    """The three ways train.py ends before training: every rank leaves the process group and exits 0."""
    flag = {"finished": [], "eval_only": ["--eval_only=True"], "dry_run": ["--dry_run=True"]}[how]  # of a finished run
    before = digests(trained)
    proc = torchrun(2, *args_for(char_data, trained, backend="gloo", max_iters=4, init_from="resume"), *flag)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert {"finished": "is finished", "eval_only": "eval of ckpt.pt at iter 4", "dry_run": "dry run: it fits"}[how] in stdout
    assert "Traceback" not in stderr
    assert {k: v for k, v in digests(trained).items() if k != "eval.json"} == before


def test_overwrite_replaces_the_earlier_run_whole(char_data, tmp_path):
    out = str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, out, max_iters=8, keep_last_n=3), cwd=str(tmp_path)).returncode == 0
    assert {"ckpt_0000004.pt", "ckpt_0000008.pt", "best.pt"} <= set(os.listdir(out))
    mine = os.path.join(out, "ckpt_before_lr_change.pt")  # a copy the user named: not the run's, so it stays
    shutil.copy(os.path.join(out, "ckpt.pt"), mine)
    shutil.copy(os.path.join(out, "ckpt.pt"), os.path.join(out, "ckpt_2.pt"))  # a name like the run's, unpadded
    result = run_script("train.py", *args_for(char_data, out, max_iters=4, overwrite=True, init_from=mine),
                        cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(f for f in os.listdir(out) if f.startswith("ckpt_")) == ["ckpt_2.pt", "ckpt_before_lr_change.pt"]
    assert ("overwrite=True: deleted the earlier run's best.pt, ckpt.pt, ckpt_0000004.pt, ckpt_0000008.pt, "
            "summary.json, and began metrics.csv anew") in result.stdout
    assert max(losses(out)) == 4 and torch.load(os.path.join(out, "best.pt"), weights_only=True)["iter_num"] == 4
    for name in ("ckpt.pt", "best.pt", "summary.json"):  # as a run stopped before its first checkpoint leaves it
        os.remove(os.path.join(out, name))
    again = run_script("train.py", *args_for(char_data, out, max_iters=2, overwrite=True), cwd=str(tmp_path))
    assert again.returncode == 0 and "overwrite=True: began metrics.csv anew\n" in again.stdout, again.stderr


def test_a_torn_metrics_row_is_cut_off_when_the_run_resumes(char_data, straight_run, tmp_path):
    out = str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, out, max_iters=12), cwd=str(tmp_path)).returncode == 0
    with open(os.path.join(out, "metrics.csv"), "a") as f:
        f.write("13,1664,4.1")  # a kill in the middle of an append
    result = run_script("train.py", *args_for(char_data, out, init_from="resume"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert_same_run(straight_run, out)
    with open(os.path.join(out, "metrics.csv")) as f:
        lines = f.read().splitlines()
    assert all(line.count(",") == lines[0].count(",") for line in lines)


def test_a_broken_compiler_falls_back_to_eager_with_a_warning(char_data, tmp_path):
    broken = tmp_path / "broken_bin"
    broken.mkdir()
    for name in ("g++", "c++", "clang++", "gcc", "cc"):
        (broken / name).write_text("#!/bin/sh\necho 'this compiler is broken' >&2\nexit 1\n")
        (broken / name).chmod(0o755)
    out = str(tmp_path / "out")
    result = run_script("train.py", *args_for(char_data, out, max_iters=2, compile=True), cwd=str(tmp_path),
                        env={"PATH": f"{broken}:{os.environ['PATH']}", "CXX": "",
                             "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert result.returncode == 0, result.stderr
    assert "warning: compile=True but a test compile failed" in result.stderr and "Traceback" not in result.stderr


def test_compile_unavailable_falls_back_with_a_warning(char_data, tmp_path):
    out = str(tmp_path / "out")
    empty = tmp_path / "empty_path"
    empty.mkdir()
    result = run_script("train.py", *args_for(char_data, out, max_iters=2, compile=True), cwd=str(tmp_path),
                        env={"PATH": str(empty), "CXX": ""})
    assert result.returncode == 0, result.stderr
    assert "warning: compile=True but no C++ compiler" in result.stderr
    sampled = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--compile=True", "--num_samples=1",
                         "--max_new_tokens=5", cwd=str(tmp_path), env={"PATH": str(empty), "CXX": ""})
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stderr.strip() == "warning: compile=True but no C++ compiler (g++, c++ or clang++) on PATH: " \
                                     "sampling without torch.compile"


def test_a_resume_that_moves_the_schedule_says_how_the_learning_rate_jumps(char_data, tmp_path):
    """Extending a finished run with a longer lr_decay_iters sends its rate back up from min_lr."""
    out = str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, out, max_iters=4, lr_decay_iters=4),
                      cwd=str(tmp_path)).returncode == 0
    result = run_script("train.py", *args_for(char_data, out, max_iters=8, lr_decay_iters=8, init_from="resume"),
                        cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert ("the learning rate at iter 4 is 0.003 by this command's schedule, where the run's gave 0.0003 (10x)\n"
            in result.stdout)
    same = run_script("train.py", *args_for(char_data, out, max_iters=12, lr_decay_iters=8, init_from="resume",
                                            eval_iters=3), cwd=str(tmp_path))  # max_iters moves no rate
    assert same.returncode == 0 and "the learning rate at iter" not in same.stdout, same.stderr
    assert re.search(r"^warning: eval_iters changed: evaluations from here read other batches of each split, so val "
                     r"losses before and after are not on the same windows, and the best val loss \([\d.]+, iter \d+\) "
                     r"was measured on the old ones$", same.stderr, re.M)
    path = os.path.join(out, "ckpt.pt")  # a run from before lr_schedule and cooldown_frac: cosine, their defaults
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    del checkpoint["config"]["lr_schedule"], checkpoint["config"]["cooldown_frac"]
    torch.save(checkpoint, path)
    older = run_script("train.py", *args_for(char_data, out, max_iters=16, lr_decay_iters=8, lr_schedule="constant",
                                             init_from="resume"), cwd=str(tmp_path))
    assert older.returncode == 0, older.stderr
    assert "lr_schedule='constant' (was 'cosine')" in older.stdout
    assert "the learning rate at iter 12 is 0.003 by this command's schedule, where the run's gave 0.0003 (10x)\n" \
        in older.stdout


def test_resume_takes_the_shape_from_the_checkpoint_when_not_given(char_data, tmp_path):
    out = str(tmp_path / "out")
    assert run_script("train.py", *args_for(char_data, out, max_iters=4), cwd=str(tmp_path)).returncode == 0
    # only dataset, device and length given: n_layer, n_embd, block_size ... come from the checkpoint
    result = run_script("train.py", f"--dataset={char_data}", f"--out_dir={out}", "--device=cpu", "--compile=False",
                        "--init_from=resume", "--max_iters=6", "--eval_iters=2", "--batch_size=4", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "starting at iteration 4" in result.stdout and "x 32 tokens" in result.stdout  # block_size 32, not 1024
    # 4 steps of 512 tokens done, 2 of 256 to go: the batch this command gives counts from here only
    assert "6 steps of 256 tokens (8 sequences): 2,560 tokens planned; starting at iteration 4, 2,048 tokens in" \
        in result.stdout
    # given, though at its default, it is a choice that contradicts the checkpoint: refused, not silently dropped
    given = run_script("train.py", f"--dataset={char_data}", f"--out_dir={out}", "--device=cpu", "--compile=False",
                       "--init_from=resume", "--max_iters=8", "--block_size=1024", cwd=str(tmp_path))
    assert given.returncode != 0
    assert "another model shape: block_size=1024 (checkpoint: 32); give the checkpoint's (--block_size=32)" \
        in given.stderr


def test_a_ctrl_c_before_training_starts_is_one_line_not_a_traceback():
    """train.py's StopFlag takes SIGINT once training starts; before that (the data read, the model built, the test
    compile) Python raises KeyboardInterrupt, which the scripts' excepthook reports in a line; Python then ends
    by SIGINT, as a shell expects of a Ctrl-C (its status 130)."""
    env = {k: v for k, v in os.environ.items() if k != "NANOGPT_TRACEBACK"}
    result = subprocess.run([sys.executable, "-c", "import sys, common; sys.excepthook = common.excepthook; "
                             "raise KeyboardInterrupt"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (-signal.SIGINT, "interrupted (Ctrl-C)\n")


TWO_RANKS = """
import datetime, sys
sys.path.insert(0, {root!r})
import torch, torch.distributed as dist
from common import UserError, excepthook, on_rank0
sys.excepthook = excepthook
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://{store}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=120))
"""  # the start of a script run as two processes, `python script RANK`, without torchrun

RANK0_FAILS = TWO_RANKS + """
def check():
    if {kind!r} == "user":
        raise UserError("out_dir is bad: fix it")
    open("{missing}")  # an OSError: not the user's input, still rank 0's alone
on_rank0(check, rank, 2)
dist.barrier()  # not reached: a rank that went on would wait here for rank 0 until the timeout
"""

RANK0_STOPS = TWO_RANKS + """
dist.barrier()
if rank == 0:
    raise UserError("metrics.csv is bad: fix it")  # found by rank 0 alone, with no on_rank0 to share it
for _ in range(1000):
    dist.all_reduce(torch.ones(1000))  # rank 1 goes on till its connection to rank 0 closes
"""


def test_a_rank_whose_peer_stopped_says_so_in_a_line_and_exits_by_itself(tmp_path):
    """An error that only one process meets outside on_rank0 (a batch with a stray token id, a run file that
    cannot be written) reaches the others as gloo's closed connection: one line that points at the peer's
    output, not a traceback. Both exit with status 1: the process group is destroyed on the way out, where
    gloo's threads would otherwise abort a process now and then (SIGABRT)."""
    script = tmp_path / "rank0_stops.py"
    script.write_text(RANK0_STOPS.format(root=ROOT, store=tmp_path / "store"))
    procs = [subprocess.Popen([sys.executable, str(script), str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=str(tmp_path)) for rank in (0, 1)]
    stderr = [proc.communicate(timeout=100)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [1, 1], stderr
    assert stderr[0].splitlines()[-1].endswith("error: metrics.csv is bad: fix it"), stderr[0]
    assert re.fullmatch(r"(\[rank1\]: )?error: another process of this run stopped \(.*Connection (closed|reset) by "
                        r"peer.*\): its own output says why", stderr[1].splitlines()[-1]), stderr[1]
    assert "Traceback" not in stderr[1]


def test_only_a_closed_or_reset_connection_is_a_lost_peer_not_a_timeout():
    """A timeout may be a peer that is alive and slow (rank 0 saving a large checkpoint): it keeps its traceback."""
    from common import peer_lost
    gloo = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/{}] {}"
    assert peer_lost(RuntimeError(gloo.format("pair.cc:553", "Connection closed by peer [127.0.0.1]:32147. This is "
                                              "typically caused by a remote worker crashing."))) == \
        "Connection closed by peer [127.0.0.1]:32147"
    reset = "Read error [127.0.0.1]:1925: Connection reset by peer"
    assert peer_lost(RuntimeError(gloo.format("pair.cc:534", reset))) == reset
    assert peer_lost(RuntimeError(gloo.format("unbound_buffer.cc:81", "Timed out waiting 3000ms for recv operation to "
                                              "complete"))) is None
    assert peer_lost(RuntimeError("Connection closed by peer")) is None  # not gloo's: not a collective's


def test_a_gpu_out_of_memory_is_one_line_that_says_what_to_lower(capsys, monkeypatch):
    """The memory plan refuses a batch it sees will not fit, but it estimates: a step may still run out."""
    from common import excepthook
    monkeypatch.delenv("NANOGPT_TRACEBACK", raising=False)
    try:
        raise torch.OutOfMemoryError(  # torch's message, one line
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.50 GiB "
            "is free. Including non-PyTorch memory, this process has 77.68 GiB memory in use. Of the allocated memory "
            "75.10 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html"
            "#environment-variables)")
    except torch.OutOfMemoryError as e:
        excepthook(type(e), e, e.__traceback__)
    assert capsys.readouterr().err == (
        "error: the GPU ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.19 GiB of which 1.50 GiB is free): use a smaller micro-batch (batch_size, raising "
        "gradient_accumulation_steps to keep the tokens per step) or "
        "activation_checkpointing=True; NANOGPT_TRACEBACK=1 shows where\n")


def test_a_collectives_timeout_keeps_its_traceback_and_ends_with_a_line_naming_ddp_timeout(capsys):
    from common import excepthook
    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1000ms "
            "for recv operation to complete")
    try:
        raise RuntimeError(gloo)
    except RuntimeError as e:
        excepthook(RuntimeError, e, e.__traceback__)
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.splitlines()[-1] == (
        "error: this process waited 1 s for another of this run, past ddp_timeout: that one is slow (rank 0 saving a "
        "large checkpoint, say) or hung; if slow, raise --ddp_timeout")
    from common import collective_timeout
    assert collective_timeout(RuntimeError("wait timeout after 2000ms, keys: /default_pg/0//cpu//0")) == "2 s"
    assert collective_timeout(RuntimeError("Timed out after 3 seconds waiting for clients. 1/2 clients joined.")) == "3 s"
    try:
        raise RuntimeError("a bug")
    except RuntimeError as e:
        excepthook(RuntimeError, e, e.__traceback__)
    assert "error:" not in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["user", "other"])
def test_whatever_stops_rank_0_in_its_own_check_stops_the_other_ranks_at_once(tmp_path, kind):
    """Two processes without torchrun, whose agent would kill the survivor: rank 1 must stop by itself with the
    reason, rather than in the next collective (gloo: a traceback when rank 0's connection closes; nccl may
    wait there until ddp_timeout)."""
    script = tmp_path / "rank0_fails.py"
    script.write_text(RANK0_FAILS.format(root=ROOT, store=tmp_path / "store", kind=kind, missing=tmp_path / "nope.txt"))
    procs = [subprocess.Popen([sys.executable, str(script), str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=str(tmp_path)) for rank in (0, 1)]
    t0 = time.time()
    stderr = [proc.communicate(timeout=100)[1] for proc in procs]
    assert all(proc.returncode != 0 for proc in procs) and time.time() - t0 < 60, stderr
    # gloo's threads may add "terminate called without an active exception" as the process ends: the line is
    # looked for among the last lines, not as the very last
    if kind == "user":
        for r in (0, 1):
            assert f"[rank{r}]: error: out_dir is bad: fix it" in stderr[r].splitlines() and "Traceback" not in stderr[r]
    else:
        assert "Traceback" in stderr[0] and "FileNotFoundError" in stderr[0]
        assert "Traceback" not in stderr[1]
        assert any(line.startswith("[rank1]: error: rank 0 stopped with FileNotFoundError: ")
                   for line in stderr[1].splitlines())


def two_ranks(tmp_path, script: str) -> tuple[list[int], list[tuple[str, str]]]:
    """Run a TWO_RANKS script as ranks 0 and 1: their exit codes and (stdout, stderr)."""
    path = tmp_path / "two_ranks.py"
    path.write_text(script.format(root=ROOT, store=tmp_path / "store"))
    procs = [subprocess.Popen([sys.executable, str(path), str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=str(tmp_path)) for rank in (0, 1)]
    outputs = [proc.communicate(timeout=100) for proc in procs]
    return [proc.returncode for proc in procs], outputs


RANKS_AGREE = TWO_RANKS + """
from common import agreed_problem, leave_distributed
print(agreed_problem("no C++ compiler on PATH" if rank == 1 else None, rank, 2))
print(agreed_problem(None, rank, 2))
leave_distributed(2)
"""


def test_a_problem_one_rank_meets_is_every_ranks(tmp_path):
    """A node that cannot compile makes every rank train eager, and rank 0, which reports, names it."""
    codes, outputs = two_ranks(tmp_path, RANKS_AGREE)
    assert codes == [0, 0], outputs
    assert [stdout for stdout, _ in outputs] == ["no C++ compiler on PATH (on rank 1)\nNone\n",
                                                 "no C++ compiler on PATH\nNone\n"]


SCORE_STOPS = TWO_RANKS + """
from common import leave_distributed
from hellaswag import score
from model import GPT, GPTConfig
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=16, vocab_size=5))
items = [dict(ctx="ab", endings=["a", "b", "c", "d"], label=0)] * 21  # 11 passes each: rank 1's last scores nothing
encode = lambda text: [" abcd".index(c) for c in text]
ctx = torch.autocast("cpu", enabled=False)
asked = []
print(score(model, items, encode, "cpu", ctx, rank, 2)["items"])
print(score(model, items, encode, "cpu", ctx, rank, 2, stop=lambda: asked.append(1) or (rank == 1 and len(asked) > 1)))
leave_distributed(2)
"""


def test_a_stop_on_one_rank_drops_hellaswag_scoring_on_both_whatever_their_share_of_the_items(tmp_path):
    """The ranks agree on a stop every 10 items by an all-reduce, so each makes as many passes: 21 items on 2
    ranks, and a signal to rank 1 alone, seen at its check before the 11th item."""
    codes, outputs = two_ranks(tmp_path, SCORE_STOPS)
    assert codes == [0, 0], outputs
    assert [stdout for stdout, _ in outputs] == ["21\nNone\n", "21\nNone\n"]
