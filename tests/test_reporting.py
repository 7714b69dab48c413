"""Seeing a run: plots, wandb that resumes, progress formats, samples, --help, run.json and summary.json."""
import glob
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, load_module, read_metrics, run_script, tiny_args
from report import read_summary


@pytest.mark.slow
def test_plot_renders_two_runs(char_data, tmp_path):
    import matplotlib.image
    runs = []
    for lr in ("3e-3", "1e-3"):
        out = str(tmp_path / f"lr{lr}")
        assert run_script("train.py", *tiny_args(char_data, out, max_iters=20, eval_interval=10, learning_rate=lr),
                          cwd=str(tmp_path)).returncode == 0
        runs.append(out)
    png = str(tmp_path / "compare.png")
    result = run_script("plot.py", *runs, "--out", png, "--smooth", "0.5", "--logx", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 800 and image.shape[1] > 800  # four panels: loss, lr, grad norm, tokens/s
    assert image[..., :3].std() > 0.05  # something was drawn
    # each run's iter-0 evaluation is at 0 tokens, which a log axis has not: left out, and said
    assert "note: --logx leaves out 2 points at 0 tokens (iter 0's evaluation): a log axis has no 0\n" == result.stderr
    named = run_script("plot.py", os.path.join(runs[0], "metrics.csv"), cwd=str(tmp_path))  # the file, for its run
    assert named.returncode == 0 and named.stdout == f"wrote {os.path.join(runs[0], 'plot.png')}\n", named.stderr
    os.remove(os.path.join(runs[0], "plot.png"))
    read_end, write_end = os.pipe()  # `plot.py run | head -0`: the reader has gone before the last line
    os.close(read_end)
    piped = subprocess.run([sys.executable, os.path.join(ROOT, "plot.py"), runs[0]], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, cwd=str(tmp_path), timeout=120)
    os.close(write_end)
    assert piped.returncode == 1 and piped.stderr == "", piped.stderr  # no traceback
    assert os.path.isfile(os.path.join(runs[0], "plot.png"))  # written before the line that failed


def test_a_log_axis_leaves_out_the_points_at_0_tokens_which_it_would_draw_at_its_edge():
    plot = load_module("plot.py")
    series = {"val_loss": [(0.0, 4.2), (100.0, 3.1)], "loss": [(100.0, 3.0)], "mfu": [(0.0, 0.1)]}
    assert plot.past_zero(series) == {"val_loss": [(100.0, 3.1)], "loss": [(100.0, 3.0)]}


def test_plot_with_logx_of_a_run_evaluated_only_at_0_tokens_is_a_one_line_error(tmp_path):
    import metrics
    (tmp_path / "run").mkdir()
    row = {c: "" for c in metrics.COLUMNS} | {"iter": "0", "tokens": "0", "val_loss": "4.2"}
    (tmp_path / "run" / "metrics.csv").write_text(",".join(metrics.COLUMNS) + "\n" + ",".join(row.values()) + "\n")
    assert run_script("plot.py", str(tmp_path / "run"), cwd=str(tmp_path)).returncode == 0
    result = run_script("plot.py", str(tmp_path / "run"), "--logx", cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["error: every point is at 0 tokens, where a log axis has none: "
                                                  "leave out --logx"]
    (tmp_path / "later").mkdir()  # beside a run that has more, the run is left out with a word
    row |= {"iter": "10", "tokens": "640", "val_loss": "3.5"}
    (tmp_path / "later" / "metrics.csv").write_text(",".join(metrics.COLUMNS) + "\n" + ",".join(row.values()) + "\n")
    result = run_script("plot.py", str(tmp_path / "run"), str(tmp_path / "later"), "--logx", "--out",
                        str(tmp_path / "p.png"), cwd=str(tmp_path))
    assert result.returncode == 0 and "leaves out 1 point at 0 tokens" in result.stderr
    assert result.stderr.rstrip().endswith("; run had no other, and is not drawn"), result.stderr


def test_plot_gives_every_train_and_val_line_its_own_colour_however_many_runs():
    import matplotlib
    from plot import line_colors
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for n_runs in (1, 5, 6, 12):
        colors = [matplotlib.colors.to_hex(c) for c in line_colors(n_runs, cycle, matplotlib.colormaps["turbo"])]
        assert len(colors) == len(set(colors)) == 2 * n_runs, n_runs


def test_plot_marks_the_points_a_line_alone_would_not_draw():
    from plot import lone_points
    nan = float("nan")
    assert lone_points([3.0]) == [0]  # a run of one logged step
    assert lone_points([nan, 1.0, nan, 2.0, 3.0, nan, 4.0]) == [1, 6]  # finite values between skipped steps
    assert lone_points([1.0, 2.0]) == [] and lone_points([]) == []


def test_plot_labels_runs_by_folder_name_and_by_path_where_names_collide(tmp_path, monkeypatch):
    from plot import run_labels
    assert run_labels(["runs/a/", "runs/b"]) == ["a", "b"]
    assert run_labels(["sweep/lr1/out", "sweep/lr2/out", "base"]) == ["sweep/lr1/out", "sweep/lr2/out", "base"]
    (tmp_path / "lr3" / "inner").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "lr3" / "inner")
    assert run_labels([".", ".."]) == ["inner", "lr3"]  # a legend of '.' named no run
    assert run_labels([".", "../../b/inner"]) == [str(tmp_path / "lr3" / "inner"), str(tmp_path / "b" / "inner")]


def test_plot_of_a_metrics_file_with_a_header_and_no_rows_is_a_one_line_error(tmp_path):
    import metrics
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").write_text(",".join(metrics.COLUMNS) + "\n1,8,4.2")  # the first row torn
    result = run_script("plot.py", str(tmp_path / "run"), cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path / 'run' / 'metrics.csv'} has no rows yet: "
                                                  "nothing to plot"]


def test_plot_smoothing_is_debiased():
    from plot import smooth
    assert smooth([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])
    assert smooth([1.0, 3.0], 0.0) == [1.0, 3.0]
    gapped = smooth([2.0, float("nan"), 2.0, float("inf"), 2.0], 0.9)  # a skipped step: a gap, not the rest
    assert math.isnan(gapped[1]) and math.isnan(gapped[3]) and [gapped[i] for i in (0, 2, 4)] == pytest.approx([2.0] * 3)


def test_plot_of_a_folder_without_metrics_is_an_error(tmp_path):
    result = run_script("plot.py", str(tmp_path), cwd=str(tmp_path))
    assert result.returncode != 0 and "metrics.csv not found" in result.stderr


def wandb_records(run_dir) -> list:
    """The protobuf Records of an offline run's .wandb file: wandb's record log (32 KiB blocks of CRC, length,
    type headers), read with wandb's own message classes."""
    from wandb.proto import wandb_internal_pb2
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    data, pos, chunks, records = open(path, "rb").read(), 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            records.append(chunks)
            chunks = b""
    parsed = []
    for raw in records:
        parsed.append(wandb_internal_pb2.Record())
        parsed[-1].ParseFromString(raw)
    return parsed


def wandb_history(run_dir):
    """(run id, [history steps], the keys logged) of an offline run."""
    run_id, steps, keys = None, [], set()
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            steps.append(record.history.step.num)
            keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
    return run_id, steps, keys


@pytest.mark.slow
def test_wandb_resume_continues_one_run_with_monotonic_steps(char_data, tmp_path):
    out = str(tmp_path / "out")
    env = {"WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    first = run_script("train.py", *tiny_args(char_data, out, max_iters=10, eval_interval=5, wandb_log=True,
                                              sample_interval=1, sample_tokens=10), cwd=str(tmp_path), env=env)
    assert first.returncode == 0, first.stderr
    second = run_script("train.py", *tiny_args(char_data, out, max_iters=20, eval_interval=5, wandb_log=True,
                                               init_from="resume"), cwd=str(tmp_path), env=env)
    assert second.returncode == 0, second.stderr
    runs = sorted(glob.glob(str(tmp_path / "wandb" / "offline-run-*")))
    assert len(runs) == 2
    (id_a, steps_a, keys), (id_b, steps_b, _) = wandb_history(runs[0]), wandb_history(runs[1])
    assert id_a == id_b  # one wandb run, continued
    assert {"lr", "train/loss_step", "val/loss"} <= keys and "mfu" not in keys  # unknown on a CPU: no 0% chart
    steps = steps_a + steps_b
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 20
    shutil.copytree(out, tmp_path / "fork")  # a copy of the run, to branch from: a wandb run of its own
    fork = run_script("train.py", *tiny_args(char_data, str(tmp_path / "fork"), max_iters=25, eval_interval=5,
                                             wandb_log=True, init_from="resume"), cwd=str(tmp_path), env=env)
    assert fork.returncode == 0, fork.stderr
    assert f"wandb: {tmp_path / 'fork'} is a copy of the run in {os.path.realpath(out)}, which logs to the same " \
           f"wandb run; this copy logs to a wandb run of its own, 'gpt2 (fork)'" in fork.stdout.splitlines(), fork.stdout[-3000:]
    (id_c, steps_c, _), = [wandb_history(run) for run in glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
                           if run not in runs]
    assert id_c != id_a and steps_c[-1] == 25


@pytest.mark.slow
def test_an_error_after_wandb_started_is_one_line_and_a_failed_wandb_run(char_data, tmp_path):
    """wandb.init puts its own excepthook in place, which printed the traceback before the error line."""
    result = run_script("train.py", *tiny_args(char_data, str(tmp_path / "out"), wandb_log=True, learning_rate=1e30,
                                               grad_clip=0, max_nonfinite_steps=2),
                        cwd=str(tmp_path), env={"WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: 2 steps in a row had a non-finite loss")
    (run,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert [r.exit.exit_code for r in wandb_records(run) if r.WhichOneof("record_type") == "exit"] == [1]


@pytest.mark.slow
def test_a_resume_that_goes_back_with_other_settings_logs_to_a_new_wandb_run(char_data, tmp_path):
    """wandb keeps a run's steps increasing: the steps this session logs up to the last one the run had logged
    would be dropped there, and the abandoned ones shown. With the run's own settings they are the same steps
    (the resume is exact), so the run goes on."""
    import shutil
    out = str(tmp_path / "out")
    env = {"WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    args = dict(max_iters=10, eval_interval=5, keep_last_n=2, wandb_log=True)
    assert run_script("train.py", *tiny_args(char_data, out, **args), cwd=str(tmp_path), env=env).returncode == 0
    os.makedirs(tmp_path / "aside")
    for name in ("ckpt.pt", "ckpt_0000010.pt"):  # back to iter 5, as after a loss spike
        shutil.move(os.path.join(out, name), tmp_path / "aside" / name)
    shutil.copy(os.path.join(out, "ckpt_0000005.pt"), tmp_path / "aside" / "at_5.pt")
    same = run_script("train.py", *tiny_args(char_data, out, **args, init_from="resume", resume_from="ckpt_0000005.pt",
                                             log_interval=2), cwd=str(tmp_path), env=env)  # the same values
    assert same.returncode == 0 and "new wandb run" not in same.stdout, same.stderr
    for name in ("ckpt.pt", "ckpt_0000010.pt"):
        os.remove(os.path.join(out, name))
    shutil.copy(tmp_path / "aside" / "at_5.pt", os.path.join(out, "ckpt_0000005.pt"))
    lower = run_script("train.py", *tiny_args(char_data, out, **args, init_from="resume", resume_from="ckpt_0000005.pt",
                                              learning_rate=1e-3), cwd=str(tmp_path), env=env)
    assert lower.returncode == 0, lower.stderr
    assert "wandb: the run logged iters up to 10 with other settings; this session logs to a new wandb run" in lower.stdout
    ids = [wandb_history(r)[0] for r in sorted(glob.glob(str(tmp_path / "wandb" / "offline-run-*")))]
    assert len(ids) == 3 and ids[0] == ids[1] != ids[2]
    changed = shutil.copytree(char_data, tmp_path / "changed")  # the same settings on other tokens: other steps
    tokens = np.fromfile(changed / "train.bin", dtype=np.uint16)
    np.roll(tokens, 1).tofile(changed / "train.bin")
    for name in ("ckpt.pt", "ckpt_0000010.pt"):
        os.remove(os.path.join(out, name))
    shutil.copy(tmp_path / "aside" / "at_5.pt", os.path.join(out, "ckpt_0000005.pt"))
    moved = run_script("train.py", *tiny_args(str(changed), out, **args, init_from="resume",
                                              resume_from="ckpt_0000005.pt"), cwd=str(tmp_path), env=env)
    assert moved.returncode == 0, moved.stderr
    assert "wandb: the run logged iters up to 10 on data that has changed since; this session logs to a new" in moved.stdout


@pytest.mark.slow
def test_json_log_format_is_one_object_per_line(char_data, tmp_path):
    result = run_script("train.py", *tiny_args(char_data, str(tmp_path / "out"), max_iters=6, eval_interval=3,
                                               log_format="json"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.splitlines()]  # every line of stdout is one
    assert any(o.get("message", "").startswith("tokens per iteration") for o in objects)
    progress = [o for o in objects if "loss" in o]
    assert [o["iter"] for o in progress] == [1, 2, 3, 4, 5, 6]
    assert {"tokens_per_sec", "eta_s", "elapsed_s", "lr", "mfu"} <= set(progress[0])
    assert [o["iter"] for o in objects if "val_loss" in o] == [0, 3, 6]
    assert objects[-1]["summary"]["iters"] == 6


@pytest.mark.slow
def test_text_progress_line_and_quiet_mode(char_data, tmp_path):
    text = run_script("train.py", *tiny_args(char_data, str(tmp_path / "a"), max_iters=4, eval_interval=4), cwd=str(tmp_path))
    line = next(l for l in text.stdout.splitlines() if l.startswith("iter 2/4"))
    assert "(50.0%)" in line and "tok/s" in line and "elapsed, ETA 0:00:" in line
    quiet = run_script("train.py", *tiny_args(char_data, str(tmp_path / "b"), max_iters=4, eval_interval=4,
                                              log_format="quiet"), cwd=str(tmp_path))
    assert quiet.returncode == 0 and "step 4: train loss" in quiet.stdout
    assert [l.split(":")[0] for l in quiet.stdout.splitlines()] == ["step 0", "step 4", "done"]  # evals and summary


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "quiet"])
def test_a_run_writing_to_a_pipe_prints_each_line_as_it_happens(char_data, tmp_path, log_format):
    """Under nohup, Slurm, `> log` or `| tee`, stdout is no terminal, and Python holds what is printed until its
    8 KB buffer fills: an evaluation's line came many evaluations late, and a kill -9 lost it."""
    import select
    import signal
    import subprocess
    import sys
    import time
    out = str(tmp_path / "out")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"),
                             *tiny_args(char_data, out, max_iters=1_000_000, log_interval=200, log_format=log_format,
                                        eval_interval=1_000_000 if log_format == "text" else 200, eval_iters=1)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=str(tmp_path))
    # the line that has no other after it for a while: a progress line (text), an evaluation's (quiet)
    line, column = (b"iter 200/", "loss") if log_format == "text" else (b"step 200:", "val_loss")
    printed = b""
    try:
        while not any(row["iter"] == "200" and row[column] for row in
                      (read_metrics(out) if os.path.exists(os.path.join(out, "metrics.csv")) else [])):
            assert proc.poll() is None
            time.sleep(0.2)
        # the line is printed before its row is written: it is on the pipe now, not a buffer-full later
        while line not in printed:
            assert select.select([proc.stdout], [], [], 30)[0], printed.decode()
            printed += os.read(proc.stdout.fileno(), 1 << 16)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


@pytest.mark.slow
def test_samples_during_training_go_to_stdout_and_a_file_on_the_same_schedule_across_a_resume(char_data, tmp_path):
    out = str(tmp_path / "out")
    for max_iters, resume in ((10, "scratch"), (20, "resume")):  # every 2nd eval of iters 0, 5, 10, 15, 20
        result = run_script("train.py", *tiny_args(char_data, out, max_iters=max_iters, lr_decay_iters=20,
                                                   eval_interval=5, sample_interval=2, sample_prompt="ROMEO:",
                                                   sample_tokens=30, init_from=resume), cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        if resume == "scratch":  # as if the run had gone on past its checkpoint at 10 and been killed
            with open(os.path.join(out, "samples.txt"), "a") as f:
                f.write("---- iter 15 ----\nwritten after the checkpoint, before a kill\n")
    with open(os.path.join(out, "samples.txt")) as f:
        text = f.read()
    assert text.count("---- iter ") == 2 and "---- iter 5 ----\nROMEO:" in text and "---- iter 15 ----" in text
    assert "before a kill" not in text
    assert "---- sample at iter 15 ----" in result.stdout


@pytest.mark.slow
def test_a_terminal_whose_encoding_lacks_the_texts_characters_gets_escapes_where_it_raised(tmp_path):
    """Under an ASCII locale (or PYTHONIOENCODING=ascii, or Latin-1 and a CJK sample) stdout raised
    UnicodeEncodeError at the config line that holds the prompt, before training, and sample.py at its first sample;
    now the character is written escaped, and the run's own files keep it as it is."""
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    load_module("data/shakespeare_char/prepare.py").prepare("ROMEO: 日本の夜。\n" * 200, data)
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    trained = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                              *tiny_args(data, out, max_iters=4, eval_interval=2, sample_interval=1,
                                         sample_prompt="日本", sample_tokens=8)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, encoding="ascii")
    assert trained.returncode == 0, trained.stderr
    assert "sample_prompt='\\u65e5\\u672c'" in trained.stdout
    assert "---- sample at iter 4 ----\n\\u65e5\\u672c" in trained.stdout
    with open(os.path.join(out, "samples.txt"), encoding="utf-8") as f:
        assert "---- iter 4 ----\n日本" in f.read()
    sampled = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={out}", "--device=cpu",
                              "--num_samples=1", "--max_new_tokens=8", "--start=日本"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, encoding="ascii")
    assert sampled.returncode == 0 and sampled.stdout.startswith("\\u65e5\\u672c"), sampled.stderr


@pytest.mark.slow
def test_run_info_and_summary_files(char_data, tmp_path):
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=8, eval_interval=4), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    with open(os.path.join(out, "run.json")) as f:
        info = json.load(f)
    assert info["config"]["max_iters"] == 8 and "--max_iters=8" in info["command"]
    assert info["torch"] and info["parameters"] > 0 and info["tokens_per_iter"] == 2 * 8 * 32
    assert info["git_commit"] is None or len(info["git_commit"]) == 40
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    val = [float(r["val_loss"]) for r in read_metrics(out) if r["val_loss"]]
    assert summary["iters"] == 8 and summary["tokens"] == 8 * 2 * 8 * 32
    assert summary["final_val_loss"] == pytest.approx(val[-1]) and summary["best_val_loss"] == pytest.approx(min(val[1:]))
    assert summary["mean_tokens_per_sec"] > 0 and summary["checkpoint"].endswith("ckpt.pt")
    assert "done: 8 iters" in result.stdout
    # the first step (which compiles, with compile) is timed apart: the means are of steps 2-8, whose log lines'
    # times (log_interval 1, evaluations left out) add up to the training time
    dt = {int(r["iter"]): float(r["dt_ms"]) / 1000 for r in read_metrics(out) if r["dt_ms"]}
    assert sorted(dt) == list(range(1, 9)) and summary["first_step_s"] == pytest.approx(dt[1])
    assert summary["mean_tokens_per_sec"] == pytest.approx(7 * 2 * 8 * 32 / sum(dt[i] for i in range(2, 9)), rel=1e-6)
    assert re.search(r"^first step: [\d.]+ s; the times from here leave it out$", result.stdout, re.M)
    assert re.search(r"^iter 1/8 .* ETA not known yet$", result.stdout, re.M)


def test_run_json_records_torchruns_command_under_torchrun():
    """Pasted back, the command of a 2-process run starts 2 processes, not one."""
    from report import launch_command
    argv = ["train.py", "--batch_size=4"]
    assert launch_command(argv, {})[1:] == argv == launch_command(argv, {"LOCAL_WORLD_SIZE": "2"})[1:]  # not torchrun
    ranks = {"RANK": "0", "LOCAL_RANK": "0"}
    assert launch_command(argv, {**ranks, "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}) == \
        ["torchrun", "--standalone", "--nproc_per_node=2", *argv]
    assert launch_command(argv, {**ranks, "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16", "MASTER_ADDR": "node0",
                                 "MASTER_PORT": "29500"}) == \
        ["torchrun", "--nnodes=2", "--node_rank=0", "--master_addr=node0", "--master_port=29500",
         "--nproc_per_node=8", *argv]


@pytest.mark.slow
def test_a_resume_keeps_the_sessions_before_it_in_run_json_and_summary_json_is_the_last_finished_session_s(
        char_data, tmp_path):
    import shlex
    import signal
    import subprocess
    import sys
    import time
    out = str(tmp_path / "out")
    first = tiny_args(char_data, out, max_iters=4, eval_interval=4, wandb_run_name="my run")
    assert run_script("train.py", *first, cwd=str(tmp_path)).returncode == 0
    run = json.loads(open(os.path.join(out, "run.json")).read())
    assert shlex.split(run["command"])[1:] == [os.path.join(ROOT, "train.py"), *first]  # pasted back, it runs
    resume = tiny_args(char_data, out, max_iters=8, eval_interval=4, init_from="resume")
    assert run_script("train.py", *resume, cwd=str(tmp_path)).returncode == 0
    run = json.loads(open(os.path.join(out, "run.json")).read())
    assert "--max_iters=8" in run["command"] and len(run["earlier_sessions"]) == 1
    assert "--max_iters=4" in run["earlier_sessions"][0]["command"]
    assert run["earlier_sessions"][0]["summary"]["iters"] == 4 and read_summary(out)["iters"] == 8
    # a session killed before its end leaves no summary.json: the one there was the session's before
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"),
                             *tiny_args(char_data, out, max_iters=100_000, eval_interval=100_000, init_from="resume")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(tmp_path))
    while not any(int(row["iter"]) > 8 for row in read_metrics(out)):
        assert proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # before any checkpoint past iter 8, however late: none is evaluated till then
    proc.wait()
    assert read_summary(out) is None
    sessions = json.loads(open(os.path.join(out, "run.json")).read())["earlier_sessions"]
    assert [s["summary"]["iters"] for s in sessions] == [4, 8]
    (tmp_path / "out" / "run.json").write_text('{"command": "py')  # torn by hand: recorded as such, no refusal
    assert run_script("train.py", *tiny_args(char_data, out, max_iters=12, init_from="resume"),
                      cwd=str(tmp_path)).returncode == 0
    sessions = json.loads(open(os.path.join(out, "run.json")).read())["earlier_sessions"]
    assert sessions == [{"run.json": "run.json was not valid JSON", "summary": None}]


def test_a_session_of_one_step_takes_its_means_from_that_step(char_data, tmp_path):
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=1, eval_interval=1), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = read_summary(out)
    assert summary["mean_tokens_per_sec"] == pytest.approx(2 * 8 * 32 / summary["first_step_s"], rel=1e-6)
    assert "no steps" not in result.stdout and re.search(r"at iter 1; [\d,]+ tok/s;", result.stdout)
    assert "warning: warmup_iters 5 is not below max_iters 1: the learning rate never reaches" in result.stderr


def test_a_run_that_has_not_logged_yet_is_told_apart_from_a_folder_that_is_no_run(tmp_path):
    """plot.py in the first seconds of a run (its first evaluation): run.json is there, metrics.csv not yet."""
    import metrics
    from common import UserError
    with pytest.raises(UserError, match=r"metrics.csv not found: give the out_dir of a run$"):
        metrics.read_rows(str(tmp_path))
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(UserError, match=rf"metrics.csv not found: the run in {tmp_path} has not logged a step yet "
                                        r"\(or stopped before it did\): try again later, or give a run that has$"):
        metrics.read_rows(str(tmp_path))


def test_a_schedule_that_decay_lr_false_leaves_unused_is_named(char_data, tmp_path):
    """A fork of a finetune config (decay_lr = False) that adds lr_schedule='wsd' trains at a constant rate."""
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=3, eval_interval=3), "--decay_lr=False",
                        "--lr_schedule=wsd", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "warning: warmup_iters=5, lr_decay_iters=60, min_lr=0.0003, lr_schedule='wsd' are not used: " \
           "decay_lr=False keeps learning_rate from the first step to the last" in result.stderr
    assert len({row["lr"] for row in read_metrics(out) if row["lr"]}) == 1  # as it says: one rate throughout


def test_settings_that_leave_the_model_as_it_is_resume_and_an_unused_rope_theta_is_named(char_data, tmp_path):
    """n_kv_head = n_head and mlp_hidden at its default width are the run's own model: a resume (or the command that
    trained it) takes them. rope_theta with learned positions changes nothing, and is named as unused."""
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=2, eval_interval=2), "--rope_theta=5e5",
                        cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "warning: rope_theta is not used: it needs pos_emb='rope'" in result.stderr
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=4, eval_interval=2), "--init_from=resume",
                        "--n_kv_head=2", "--mlp_hidden=128", "--rope_theta=500", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert [row["iter"] for row in read_metrics(out) if row["val_loss"]] == ["0", "2", "4"]


def test_a_config_json_is_a_runs_only_when_it_holds_a_runs_settings(tmp_path):
    from report import foreign_config
    assert not foreign_config(str(tmp_path))  # none there
    for text, foreign in (('{"max_iters": 5, "out_dir": "out", "n_layer": 2}', False), ("null", True), ("[]", True),
                          ('{"model_type": "gpt2"}', True), ("{torn", True)):
        (tmp_path / "config.json").write_text(text)
        assert foreign_config(str(tmp_path)) is foreign, text


def test_the_tree_is_dirty_when_a_tracked_file_changed_not_when_a_run_adds_its_folder(tmp_path):
    from report import run_info

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "train.py").write_text("print('v1')\n")
    git("add", "train.py")
    git("commit", "-qm", "v1")
    (tmp_path / "lr2e-3").mkdir()  # an out_dir the README's example names, which .gitignore does not list
    (tmp_path / "lr2e-3" / "ckpt.pt").write_bytes(b"weights")
    assert run_info({}, ["train.py"], str(tmp_path))["git_dirty"] is False
    (tmp_path / "train.py").write_text("print('v2')\n")
    assert run_info({}, ["train.py"], str(tmp_path))["git_dirty"] is True


def test_help_shows_every_key_that_the_gpt2_config_sets(tmp_path):
    import ast
    result = run_script("train.py", "--help", cwd=str(tmp_path))
    assert result.returncode == 0
    with open(os.path.join(ROOT, "config", "train_gpt2.py")) as f:
        tree = ast.parse(f.read())
    set_keys = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    assert len(set_keys) >= 10 and all(f"--{k}=" in result.stdout for k in set_keys)
    assert "--learning_rate=0.0006" in result.stdout and "peak learning rate" in result.stdout


def test_plot_of_an_empty_metrics_file_is_a_one_line_error(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").write_text("")
    result = run_script("plot.py", str(tmp_path / "run"), cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path / 'run' / 'metrics.csv'} is empty or has no header "
                                                  "with iter and tokens columns: not a run's metrics.csv"]


def test_metrics_skip_a_torn_last_row_and_the_next_append_cuts_it_off(tmp_path):
    import metrics
    out = str(tmp_path)
    metrics.append_row(out, {"iter": 1, "tokens": 8, "loss": 4.25})
    with open(metrics.metrics_path(out), "a") as f:
        f.write("2,,4.1")  # a kill in the middle of an append: a cut number, no newline
    assert [r["iter"] for r in metrics.read_rows(out)] == ["1"]
    metrics.append_row(out, {"iter": 2, "tokens": 16, "loss": 4.125})
    assert [(r["iter"], r["loss"]) for r in metrics.read_rows(out)] == [("1", "4.25"), ("2", "4.125")]
    with open(metrics.metrics_path(out)) as f:
        assert f.read().count("\n") == 3  # the header and two whole rows, nothing of the torn one


def test_a_metrics_file_from_before_a_column_existed_is_rewritten_under_todays_header(tmp_path):
    import metrics
    old_columns = metrics.COLUMNS[:-1]  # the file a run wrote before the hellaswag column
    with open(metrics.metrics_path(str(tmp_path)), "w") as f:
        f.write(",".join(old_columns) + "\n" + "1,8,4.25" + "," * (len(old_columns) - 3) + "\n")
    metrics.append_row(str(tmp_path), {"iter": 2, "tokens": 16, "val_loss": 4.0, "hellaswag": 0.25})
    rows = metrics.read_rows(str(tmp_path))
    assert [(r["iter"], r["loss"], r["val_loss"], r["hellaswag"]) for r in rows] == [("1", "4.25", "", ""),
                                                                                     ("2", "", "4.0", "0.25")]
    assert metrics.header(metrics.metrics_path(str(tmp_path))) == metrics.COLUMNS


def test_step_times_of_ours_and_nanogpts_skip_the_same_first_steps_and_take_the_median(tmp_path):
    import metrics
    for i, dt in enumerate([900.0, 12.0, 10.0, 14.0, 11.0], start=1):  # train.py logs its first step as iter 1
        metrics.append_row(str(tmp_path), {"iter": i, "tokens": 8 * i, "loss": 4.0, "dt_ms": dt})
    metrics.append_row(str(tmp_path), {"iter": 5, "tokens": 40, "val_loss": 3.9})  # an eval row: no step time
    # nanoGPT's train.py prints f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {mfu*100:.2f}%"
    printed = "".join(f"iter {i}: loss 4.0000, time {dt:.2f}ms, mfu -100.00%\n" for i, dt in
                      enumerate([900.0, 12.0, 10.0, 14.0, 11.0]))
    printed += "step 4: train loss 3.9000, val loss 3.9100\n"
    assert metrics.median_step_ms(str(tmp_path), 1) == metrics.nanogpt_median_step_ms(printed, 1) == 11.5
    assert metrics.median_step_ms(str(tmp_path), 3) == metrics.nanogpt_median_step_ms(printed, 3) == 12.5
    assert metrics.median_step_ms(str(tmp_path), 5) is None and metrics.nanogpt_median_step_ms(printed, 5) is None


def test_a_metrics_file_with_a_column_from_a_newer_version_is_refused_and_kept(tmp_path):
    import metrics
    from common import UserError
    path = metrics.metrics_path(str(tmp_path))
    with open(path, "w") as f:
        f.write(",".join(metrics.COLUMNS + ["bpb"]) + "\n" + "1,8,4.25" + "," * (len(metrics.COLUMNS) - 2) + "1.1\n")
    before = open(path).read()
    for change in (lambda: metrics.append_row(str(tmp_path), {"iter": 2, "tokens": 16}),
                   lambda: metrics.truncate(str(tmp_path), 0)):
        with pytest.raises(UserError, match=r"has columns this version does not know \(bpb\)"):
            change()
        assert open(path).read() == before


def test_samples_read_back_as_written_and_a_truncation_keeps_the_earlier_ones_whole(tmp_path):
    from report import read_samples, truncate_samples
    path = tmp_path / "samples.txt"
    path.write_text("---- iter 5 ----\nROMEO:\nline two\n\n---- iter 10 ----\nx\n---- iter 15 ----\ntorn by a ki")
    assert read_samples(str(path)) == [[5, "ROMEO:\nline two\n"], [10, "x"], [15, "torn by a ki"]]
    assert truncate_samples(str(tmp_path), 10) == [[5, "ROMEO:\nline two\n"], [10, "x"]]
    assert path.read_text() == "---- iter 5 ----\nROMEO:\nline two\n\n---- iter 10 ----\nx\n"
    # from a checkpoint saved before iter 10's evaluation, the resume samples iter 10 again: that one goes too
    assert truncate_samples(str(tmp_path), 10, redone=True) == [[5, "ROMEO:\nline two\n"]]


def test_the_summary_line_says_where_its_losses_come_from(tmp_path, capsys):
    from report import Reporter
    summary = dict(iters=526, tokens=1000, stopped_by_signal=True, skipped_steps=0, final_train_loss=4.1798,
                   final_val_loss=4.1823, final_loss_iter=500, best_val_loss=2.1898, best_iter=0, wall_time_s=10.0,
                   first_step_s=1.0, mean_tokens_per_sec=100.0, mean_mfu=None, checkpoint=None)
    Reporter(str(tmp_path), "text", active=True).summary(summary)
    line = capsys.readouterr().out
    assert "final train/val loss 4.1798/4.1823 (from the last eval, at iter 500)" in line
    assert "best val 2.1898 at iter 0 (the weights it started from, so no best.pt)" in line
    Reporter(str(tmp_path), "text", active=True).summary(dict(summary, final_loss_iter=526, best_iter=400))
    line = capsys.readouterr().out
    assert "final train/val loss 4.1798/4.1823, best val 2.1898 at iter 400; " in line
    # a session stopped before its first evaluation (a resume, Ctrl-C at once): no losses of its own to give
    Reporter(str(tmp_path), "text", active=True).summary(dict(summary, final_train_loss=None, final_val_loss=None,
                                                             final_loss_iter=None, best_iter=400))
    line = capsys.readouterr().out
    assert "in 0:00:10; no evaluation in this session, best val 2.1898 at iter 400; " in line and "None/" not in line


def test_a_nan_loss_is_null_in_the_json_log_and_files_which_strict_parsers_read(tmp_path, capsys):
    from report import Reporter

    def strict(text):  # as jq or JavaScript parse: NaN and Infinity are not JSON
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    nan = float("nan")
    reporter = Reporter(str(tmp_path), "json", active=True)
    reporter.eval(10, 1000, {"train": nan, "val": float("inf")})
    reporter.step(11, 20, 1100, nan, 1e-3, float("inf"), 0.1, 100.0, None, 5.0, 11, 5.0)
    reporter.summary(dict(iters=11, tokens=1100, stopped_by_signal=False, skipped_steps=0, final_train_loss=nan,
                          final_val_loss=float("-inf"), best_val_loss=None, best_iter=None, final_loss_iter=10,
                          wall_time_s=5.0, first_step_s=1.0, mean_tokens_per_sec=100.0, mean_mfu=None, checkpoint=None))
    eval_line, step_line, summary_line = (strict(line) for line in capsys.readouterr().out.splitlines())
    assert eval_line["train_loss"] is None and eval_line["val_loss"] is None
    assert step_line["loss"] is None and step_line["grad_norm"] is None and step_line["lr"] == 1e-3
    with open(tmp_path / "summary.json") as f:
        written = strict(f.read())
    assert written == summary_line["summary"]
    assert written["final_val_loss"] is None and written["final_train_loss"] is None and written["iters"] == 11
    from common import json_text  # and inside lists and dicts, as run.json's earlier sessions hold summaries
    assert strict(json_text({"history": [1.5, nan], "summary": {"loss": float("inf")}})) == \
        {"history": [1.5, None], "summary": {"loss": None}}


def test_the_time_estimate_is_announced_once_after_ten_steps_and_never_with_no_step_left(tmp_path, capsys):
    from report import Reporter
    def session(first, last, max_iters):  # steps first..last, the first one untimed, as train.py gives them
        reporter = Reporter(str(tmp_path), "text", True)
        for it in range(first, last + 1):
            reporter.step(it, max_iters, 64 * it, 2.0, 1e-3, 1.0, 0.1, 640.0, None, 1.0, it - first, 0.1 * (it - first))
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("estimated time")]
    assert session(0, 30, 100) == ["estimated time for the remaining 91 steps: 0:00:09 (100.0 ms/step so far, "
                                   "evaluations not included)"]
    assert session(95, 100, 100) == []  # resumed at 95: no estimate of the 0 steps left at the end
