"""End-to-end runs of train.py, sample.py and bench.py on tiny models, as a user would run them."""
import glob
import json
import math
import os
import re
import signal
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import pytest
import torch

from conftest import (ROOT, char_vocab_size, gpt2_rank_file, load_module, read_metrics, run_script, shakespeare,
                      step_losses, tiny_args)

pytestmark = pytest.mark.slow  # each test runs the scripts end to end


def test_short_run_lowers_loss_and_writes_checkpoint_metrics_and_config(char_data, tmp_path):
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = read_metrics(out)
    assert list(rows[0]) == ["iter", "tokens", "loss", "val_loss", "train_eval_loss", "lr", "grad_norm", "dt_ms",
                             "tokens_per_sec", "mfu", "hellaswag"]
    val = [float(r["val_loss"]) for r in rows if r["val_loss"]]
    assert len(val) == 3  # iterations 0, 20 and 40: the last step is always evaluated
    vocab_size = char_vocab_size(char_data)  # 65 for tiny Shakespeare
    assert val[0] == pytest.approx(math.log(vocab_size), abs=0.3) and val[-1] < val[0] - 0.5
    losses = step_losses(rows)
    assert sorted(losses) == list(range(1, 41))  # exactly max_iters optimizer steps
    rates = [(int(r["iter"]), r["lr"]) for r in rows if r["lr"]]
    assert [it for it, _ in rates] == list(range(1, 41))  # one rate per iter, the step's: eval rows give none
    assert int(rows[-1]["tokens"]) == 40 * 2 * 8 * 32

    checkpoint = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert checkpoint["iter_num"] == 40 and checkpoint["best_val_loss"] == pytest.approx(min(val), rel=1e-6)
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in checkpoint["model"])
    assert checkpoint["model_args"]["vocab_size"] == vocab_size  # from the dataset's meta
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["max_iters"] == 40
    assert "error" not in result.stderr


@pytest.mark.parametrize("settings", [{}, dict(lr_schedule="wsd-sqrt", cooldown_frac=0.5, optimizer="muon")],
                         ids=["cosine-adamw", "wsd-sqrt-muon"])  # wsd: the resumed half crosses into the cooldown (30)
def test_resume_continues_with_the_same_losses_as_an_unbroken_run(char_data, tmp_path, settings):
    straight, broken = str(tmp_path / "straight"), str(tmp_path / "broken")
    assert run_script("train.py", *tiny_args(char_data, straight, **settings), cwd=str(tmp_path)).returncode == 0
    first = run_script("train.py", *tiny_args(char_data, broken, max_iters=20, **settings), cwd=str(tmp_path))
    assert first.returncode == 0, first.stderr
    # given its folder and its new length only: every other setting (dataset, device, schedule, optimizer) is the run's
    resumed = run_script("train.py", f"--out_dir={broken}", "--init_from=resume", "--max_iters=40", cwd=str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
    assert "starting at iteration 20" in resumed.stdout
    assert "resumed with settings other than the run's: max_iters=40 (was 20)\n" in resumed.stdout
    assert f"the run's own settings, which this command does not give: eval_interval=20, eval_iters=4, dataset=" \
           f"{char_data!r}" in resumed.stdout
    expected, got = step_losses(read_metrics(straight)), step_losses(read_metrics(broken))
    assert sorted(got) == list(range(1, 41))
    assert [got[i] for i in range(21, 41)] == [expected[i] for i in range(21, 41)]


def test_batches_read_ahead_train_exactly_as_batches_read_in_the_loop(char_data, tmp_path):
    losses, weights = {}, {}
    for depth in (0, 3):
        out = str(tmp_path / f"prefetch_{depth}")
        result = run_script("train.py", *tiny_args(char_data, out, max_iters=12, eval_interval=12, prefetch_batches=depth),
                            cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        losses[depth] = step_losses(read_metrics(out))
        weights[depth] = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["model"]
    assert sorted(losses[3]) == list(range(1, 13)) and losses[3] == losses[0]
    assert all(torch.equal(weights[3][k], weights[0][k]) for k in weights[0])


LLAMA = dict(pos_emb="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=1, qk_norm=True, tie_embeddings=False, bias=False)


def test_a_llama_style_run_resumes_exactly_and_its_checkpoint_rebuilds_the_model_without_flags(char_data, tmp_path):
    straight, broken = str(tmp_path / "straight"), str(tmp_path / "broken")
    assert run_script("train.py", *tiny_args(char_data, straight, **LLAMA), cwd=str(tmp_path)).returncode == 0
    assert run_script("train.py", *tiny_args(char_data, broken, max_iters=20, **LLAMA), cwd=str(tmp_path)).returncode == 0
    # resumed with none of the architecture flags: the checkpoint's model_args say it all
    resumed = run_script("train.py", *tiny_args(char_data, broken, init_from="resume"), cwd=str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
    expected, got = step_losses(read_metrics(straight)), step_losses(read_metrics(broken))
    assert [got[i] for i in range(21, 41)] == [expected[i] for i in range(21, 41)]
    saved = torch.load(os.path.join(broken, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert {k: saved["model_args"][k] for k in LLAMA} == LLAMA
    val = [float(r["val_loss"]) for r in read_metrics(straight) if r["val_loss"]]
    assert val[-1] < val[0]
    result = run_script("sample.py", f"--out_dir={broken}", "--device=cpu", "--num_samples=2", "--max_new_tokens=40",
                        "--start=ROMEO:", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ROMEO:")
    clash = run_script("train.py", *tiny_args(char_data, broken, init_from="resume", max_iters=60, mlp="relu2"),
                       cwd=str(tmp_path))
    assert "another model shape: mlp='relu2' (checkpoint: 'swiglu')" in clash.stderr


def test_a_resume_under_torchrun_whose_settings_break_a_rule_stops_with_its_line(char_data, tmp_path):
    out = str(tmp_path / "out")  # a gloo run on the CPU: nccl meets the run's device, which the command never gave
    assert run_script("train.py", *tiny_args(char_data, out, max_iters=2), cwd=str(tmp_path)).returncode == 0
    result = run_script("train.py", f"--out_dir={out}", "--init_from=resume", "--backend=nccl", cwd=str(tmp_path),
                        torchrun_procs=2)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    line = ("error: backend='nccl' is not valid: backend must satisfy backend in ('auto', 'gloo') or (backend == "
            "'nccl' and device.startswith('cuda')) (with device='cpu'); device is the run's own (a resume keeps each "
            "setting it is not given): give --device=... for another\n")
    # each rank checks and writes the line, but torchrun stops the other rank when the first exits: once or twice
    assert result.stderr.count(line) in (1, 2), result.stderr
    odd = str(tmp_path / "odd")  # a one-process run of 3 micro-steps, resumed on two processes
    assert run_script("train.py", *tiny_args(char_data, odd, max_iters=1, gradient_accumulation_steps=3),
                      cwd=str(tmp_path)).returncode == 0
    result = run_script("train.py", f"--out_dir={odd}", "--init_from=resume", "--max_iters=2", cwd=str(tmp_path),
                        torchrun_procs=2)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert ("error: gradient_accumulation_steps=3 is not divisible by the world size 2: make it a multiple of the "
            "number of processes; gradient_accumulation_steps is the run's own") in result.stderr, result.stderr


def test_a_quiet_resume_still_names_the_settings_it_changed(char_data, tmp_path):
    out = str(tmp_path / "out")
    assert run_script("train.py", *tiny_args(char_data, out, max_iters=2), cwd=str(tmp_path)).returncode == 0
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=4, learning_rate=1e-3, init_from="resume",
                                               log_format="quiet"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "resumed with settings other than the run's: log_format='quiet' (was 'text'), learning_rate=0.001 (was " \
           "0.003), max_iters=4 (was 2)\n" in result.stdout


def test_resume_without_checkpoint_is_a_one_line_error(char_data, tmp_path):
    (tmp_path / "empty").mkdir()  # a folder that is not there has its own line (test_mistakes.py)
    result = run_script("train.py", *tiny_args(char_data, str(tmp_path / "empty"), init_from="resume"), cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [f"error: no checkpoint at {tmp_path / 'empty' / 'ckpt.pt'}: check "
                                                  "out_dir (init_from='resume' continues a run saved there)"]


def test_unknown_flag_is_a_one_line_error(tmp_path):
    result = run_script("train.py", "--lerning_rate=1e-3", cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip() == ("error: unknown config key 'lerning_rate' in flag '--lerning_rate=1e-3'; "
                                     "did you mean 'learning_rate'?")


def test_missing_dataset_is_a_one_line_error(tmp_path):
    result = run_script("train.py", "--dataset=no_such_dataset", "--device=cpu", cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.startswith("error: dataset 'no_such_dataset' not found")
    assert "Traceback" not in result.stderr


def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path):
    import json
    import numpy as np
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for split in ("train", "val"):
        (np.arange(2000) % 100).astype(np.uint16).tofile(data_dir / f"{split}.bin")
    (data_dir / "meta.json").write_text(json.dumps({
        "tokenizer": "char", "vocab_size": 50, "chars": "".join(map(chr, range(65, 115))), "dtype": "uint16", "max_token_id": 99,
        "splits": {s: {"files": [f"{s}.bin"], "file_tokens": [2000]} for s in ("train", "val")}}))
    result = run_script("train.py", *tiny_args(str(data_dir), str(tmp_path / "out")), cwd=str(tmp_path))
    assert result.returncode != 0
    assert "has token id 99, out of range for the model's vocab_size 50" in result.stderr


def test_accumulation_steps_must_divide_among_processes(char_data, tmp_path):
    result = run_script("train.py", *tiny_args(char_data, str(tmp_path / "out"), gradient_accumulation_steps=3),
                        cwd=str(tmp_path), torchrun_procs=2)
    assert result.returncode != 0
    assert "gradient_accumulation_steps=3 is not divisible by the world size 2" in result.stderr


def test_two_process_ddp_matches_one_process(char_data, tmp_path):
    single, double = str(tmp_path / "single"), str(tmp_path / "ddp")
    args = dict(max_iters=20, gradient_accumulation_steps=4)
    one = run_script("train.py", *tiny_args(char_data, single, **args), cwd=str(tmp_path))
    assert one.returncode == 0, one.stderr
    two = run_script("train.py", *tiny_args(char_data, double, backend="gloo", **args), cwd=str(tmp_path),
                     torchrun_procs=2)
    assert two.returncode == 0, two.stderr
    assert "world size 2" in two.stdout
    a, b = step_losses(read_metrics(single)), step_losses(read_metrics(double))
    assert sorted(a) == sorted(b) == list(range(1, 21))
    # the same global batches; only the order of floating-point sums differs (gradient all-reduce)
    for i in a:
        assert b[i] == pytest.approx(a[i], abs=2e-4), i
    val_a = [float(r["val_loss"]) for r in read_metrics(single) if r["val_loss"]]
    val_b = [float(r["val_loss"]) for r in read_metrics(double) if r["val_loss"]]
    assert val_b == pytest.approx(val_a, abs=2e-4)


def test_wandb_offline_run_is_written(char_data, tmp_path):
    pytest.importorskip("wandb")
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=4, eval_interval=2, wandb_log=True,
                                               wandb_project="tiny-proj-7", wandb_run_name="tiny-run-9"),
                        cwd=str(tmp_path), env={"WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"})
    assert result.returncode == 0, result.stderr
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 1
    run_id = runs[0].rsplit("-", 1)[-1]
    with open(glob.glob(os.path.join(runs[0], "run-*.wandb"))[0], "rb") as f:
        record = f.read()  # wandb's own binary log: the run's project and name are stored in it as text
    assert b"tiny-proj-7" in record and b"tiny-run-9" in record
    checkpoint = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert checkpoint["wandb_run_id"] == run_id


def test_a_prompt_file_s_byte_order_mark_is_no_part_of_the_prompt(tmp_path):
    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbfROMEO:")  # as Notepad saves UTF-8
    assert load_module("sample.py").read_prompt(f"FILE:{tmp_path / 'p.txt'}") == "ROMEO:"


def test_sample_decodes_characters_from_a_checkpoint(char_data, tmp_path):
    out = str(tmp_path / "out")
    assert run_script("train.py", *tiny_args(char_data, out, max_iters=20), cwd=str(tmp_path)).returncode == 0
    result = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=2", "--max_new_tokens=50",
                        "--start=ROMEO:", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    samples = result.stdout.split("---------------\n")
    assert len(samples) == 3 and samples[0].startswith("ROMEO:") and len(samples[0].rstrip("\n")) == 6 + 50
    again, other = (run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=2", "--max_new_tokens=50",
                               "--start=ROMEO:", *seed, cwd=str(tmp_path)).stdout for seed in ([], ["--seed=7"]))
    assert again == result.stdout and other != result.stdout  # the same seed draws the same samples


def test_bench_reports_time_per_iteration(tmp_path):
    result = run_script("bench.py", "--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=32",
                        "--block_size=32", "--batch_size=4", "--vocab_size=128", "--warmup_steps=2", "--num_steps=3",
                        cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "ms/iter" in result.stdout and "tokens/s" in result.stdout


def test_bench_profile_writes_a_trace_and_a_failed_one_leaves_no_folder(tmp_path):
    tiny = ["--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32",
            "--batch_size=2", "--vocab_size=128", "--warmup_steps=1", "--num_steps=1", "--profile=True"]
    failed = run_script("bench.py", *tiny, "--real_data=True", "--dataset=absent", cwd=str(tmp_path))
    assert failed.returncode == 1 and "dataset 'absent' not found" in failed.stderr
    assert not os.path.exists(tmp_path / "bench_trace")  # checked as writable at the start, made only for a trace
    result = run_script("bench.py", *tiny, cwd=str(tmp_path))
    assert result.returncode == 0 and "trace written to bench_trace/" in result.stdout, result.stderr
    traces = os.listdir(tmp_path / "bench_trace")
    assert len(traces) == 1 and traces[0].endswith(".pt.trace.json")
    assert '"traceEvents"' in (tmp_path / "bench_trace" / traces[0]).read_text()


def test_bench_times_the_data_pipeline_on_files_of_the_sizes_it_is_given(tmp_path):
    result = run_script("bench.py", "--mode=get_batch", "--token_file_tokens=100000", "--batch_size=4",
                        "--block_size=32", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines() if "row loop" in line] == \
        ["uint16, batch 4 x 32", "uint32, batch 4 x 32"]
    if os.path.isdir("/dev/shm"):  # Linux's tmpfs: its files are memory, so no figure "from the disk" is given
        shm = tempfile.mkdtemp(dir="/dev/shm")
        try:
            in_memory = run_script("bench.py", "--mode=get_batch", "--token_file_tokens=100000", "--batch_size=4",
                                   "--block_size=32", cwd=str(tmp_path), env={"TMPDIR": shm})
        finally:
            shutil.rmtree(shm)
        assert in_memory.returncode == 0, in_memory.stderr
        assert [line.split(" not measured: ")[0] for line in in_memory.stdout.splitlines()
                if "from the disk" in line] == ["uint16, batch 4 x 32, from the disk:", "uint32, batch 4 x 32, from the disk:"]
    result = run_script("bench.py", "--mode=prepare", "--corpus_mb=1", f"--corpus_text={shakespeare()['path']}",
                        f"--gpt2_tiktoken={gpt2_rank_file()}", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    counts = [int(m.replace(",", "")) for m in re.findall(r"^1 MB: .*?: ([\d,]+) tokens in", result.stdout, re.M)]
    assert len(counts) == 2 and counts[0] == counts[1]  # prepare.py's workers and the one-process loop agree
    assert 200_000 < counts[0] < 400_000  # about 1 MB of English at 3 to 4 bytes a token


def test_bench_says_that_a_finetune_config_s_model_is_not_loaded(tmp_path):
    result = run_script("bench.py", os.path.join(ROOT, "config", "finetune_shakespeare.py"), "--device=cpu",
                        "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--warmup_steps=0",
                        "--num_steps=1", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("note: init_from='gpt2-xl' is not loaded: bench times a model of random weights")
    assert "of train.py alone" not in result.stdout  # the config file's max_iters, out_dir, ...: its own business
    resumed = run_script("bench.py", "--init_from=resume", "--device=cpu", "--compile=False", "--n_layer=1",
                         "--warmup_steps=0", "--num_steps=1", cwd=str(tmp_path))  # out_dir's run: not loaded either
    assert resumed.stdout.startswith("note: init_from='resume' is not loaded"), resumed.stderr


def test_bench_notes_a_training_only_setting_typed_as_a_flag(tmp_path):
    typed = run_script("bench.py", "--max_iters=9", "--device=cpu", "--compile=False", "--n_layer=1", "--max_iters=8",
                       "--warmup_steps=0", "--num_steps=1", cwd=str(tmp_path))
    assert typed.stdout.startswith("note: --max_iters is a setting of train.py alone: bench.py times the same step "
                                   "whatever the value\n"), typed.stderr


def test_bench_on_a_cpu_shrinks_only_the_model_keys_no_file_or_flag_set(tmp_path):
    config = tmp_path / "deep.py"
    config.write_text("n_layer = 12  # GPT-2's default, but set: it stays\n")
    result = run_script("bench.py", str(config), "--device=cpu", "--compile=False", "--n_embd=64", "--vocab_size=128",
                        "--warmup_steps=1", "--num_steps=1", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "the model keys left at their defaults are shrunk: n_head=4, block_size=64\n" in result.stdout
    assert "\n0.60M parameters" in result.stdout  # 12 layers of 12 x 64^2 (4 layers would be 0.20M)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_times_generation_with_and_without_the_cache(tmp_path, dtype):
    """float32 must give the same tokens both ways; bfloat16, a GPU's default, rounds the two differently, which
    makes sampling part after a few dozen tokens here: reported, not an error."""
    result = run_script("bench.py", "--mode=generate", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=128",
                        "--vocab_size=500", "--block_size=128", "--batch_size=4", "--gen_tokens=200", "--rounds=1",
                        "--seed=1", f"--dtype={dtype}", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "with the KV cache:" in result.stdout and "cache/no-cache tokens/s:" in result.stdout
    alike = re.search(r"(same tokens|the two part after \d+ of 200 tokens)", result.stdout)
    assert alike and (dtype == "bfloat16" or alike[1] == "same tokens")


def test_bench_takes_a_training_config_and_compares_two_configs_in_one_process(char_data, tmp_path):
    result = run_script("bench.py", os.path.join(ROOT, "config", "train_shakespeare_char.py"), f"--dataset={char_data}",
                        "--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32",
                        "--batch_size=4", "--warmup_steps=1", "--num_steps=2", "--rounds=3",
                        "--compare=--loss_chunk=40 --batch_size=8", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"vocab {char_vocab_size(char_data)}, 1 x 4 x 32 tokens" in result.stdout  # the dataset's vocabulary
    assert "A: batch_size=4, loss_chunk=0\nB: batch_size=8, loss_chunk=40" in result.stdout  # in settings order
    assert len(re.findall(r"^round \d/3: A [\d.]+ ms/iter, B [\d.]+ ms/iter$", result.stdout, re.M)) == 3
    ratio = re.search(r"^B/A tokens/s: ([\d.]+)x \(min ([\d.]+)x, max ([\d.]+)x over 3 rounds", result.stdout, re.M)
    assert ratio and float(ratio[2]) <= float(ratio[1]) <= float(ratio[3])


def test_bench_compares_several_configs_in_one_process_and_leaves_out_one_that_fails(tmp_path):
    """Each ';'-separated config against A; one that cannot be built (fp8 with a width that is no multiple of 16)
    is reported and left out, the others' ratios stand, and the exit status says something failed."""
    result = run_script("bench.py", "--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32",
                        "--block_size=32", "--batch_size=4", "--vocab_size=64", "--warmup_steps=1", "--num_steps=2",
                        "--rounds=2", "--compare=--loss_chunk=40; --fp8=True --n_embd=40; --batch_size=auto",
                        cwd=str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: B2 failed to run (see above); the other ratios stand"
    assert re.search(r"^B2 failed, left out: UserError: .*16", result.stdout, re.M)
    assert re.search(r"^round 2/2: A [\d.]+ ms/iter, B1 [\d.]+ ms/iter, B3 [\d.]+ ms/iter$", result.stdout, re.M)
    chosen = int(re.search(r"^batch_size auto: (\d+) sequences", result.stdout, re.M)[1])
    assert chosen >= 4 and chosen & (chosen - 1) == 0  # a power of two, from the host's free memory
    assert re.search(r"^B3: .* tokens/s .*\nB1/A tokens/s: [\d.]+x .*\nB3/A tokens/s: [\d.]+x", result.stdout, re.M)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_bench_compare_stopped_by_sigterm_reports_the_rounds_it_timed(tmp_path, sig):
    """A caller's time limit (SIGTERM), or a Ctrl-C, ends the timing after the round in progress, not the figures."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench.py"), "--device=cpu", "--compile=False",
                             "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
                             "--vocab_size=64", "--warmup_steps=1", "--num_steps=2", "--rounds=100000",
                             "--compare=--loss_chunk=40"], cwd=str(tmp_path), stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("round 3/"):
            proc.send_signal(sig)
            break
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=60) == 0
    done = int(re.search(rf"^stopped by {sig.name} after (\d+) of 100000 rounds$", "".join(lines), re.M)[1])
    assert 3 <= done < 100000 and sum(line.startswith("round ") for line in lines) == done
    assert re.search(rf"^B/A tokens/s: [\d.]+x \(min [\d.]+x, max [\d.]+x over {done} rounds", "".join(lines), re.M)


def test_bench_compare_stopped_while_building_times_one_round_of_the_configs_built(tmp_path):
    """A step of the GPU suite cut off by its budget while configs still compile keeps the ratios of those built."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench.py"), "--device=cpu", "--compile=False",
                             "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
                             "--vocab_size=64", "--warmup_steps=500", "--num_steps=2", "--rounds=5",
                             # B2 is 8 layers of 128: its 500 warm-up steps take seconds, so the signal finds it in
                             # them even on a loaded machine (at A's size they took 0.7 s, not always enough)
                             "--compare=--loss_chunk=40; --n_layer=8 --n_embd=128"], cwd=str(tmp_path),
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("B1 warm-up:"):  # A and B1 are built; B2 is in its 500 warm-up steps
            proc.send_signal(signal.SIGTERM)
            break
    output = "".join(lines + proc.stdout.readlines())
    assert proc.wait(timeout=60) == 0, output
    assert "while the configs were built: B2 left out, one round of the others" in output
    assert "stopped by SIGTERM after 1 of 5 rounds" in output and "B2 warm-up" not in output
    assert re.search(r"^B1/A tokens/s: [\d.]+x", output, re.M) and "B2/A" not in output


def test_a_sigterm_to_a_data_bench_removes_its_token_files(tmp_path):
    """--mode=get_batch writes token files of hundreds of MB to a temporary folder: gone on SIGTERM as on Ctrl-C."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench.py"), "--mode=get_batch", "--device=cpu",
                             "--batch_size=256", "--block_size=1024", "--token_file_tokens=2000000"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(tmp_path.glob("*/tokens_uint16.bin")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "bench ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr
    assert list(tmp_path.iterdir()) == []


def test_bench_gives_a_dataset_the_vocabulary_train_gives_it(char_data, tmp_path):
    import bench
    from conftest import char_vocab_size
    assert bench.dataset_vocab_size(char_data) == char_vocab_size(char_data)  # characters exactly
    split = {"files": ["x.bin"], "file_tokens": [10]}
    (tmp_path / "meta.json").write_text(json.dumps({"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16",
                                                    "splits": {"train": split, "val": split}}))
    assert bench.dataset_vocab_size(str(tmp_path)) == 50304  # GPT-2's BPE padded, as train.py pads it
    assert bench.dataset_vocab_size(str(tmp_path / "not_prepared")) == 50304
    # said, as a character config timed at 50304 would be another model: not found, or a folder of no data
    assert bench.unprepared(char_data) is None and bench.unprepared(str(tmp_path)) is None
    not_prepared = str(tmp_path / "not_prepared")
    assert bench.unprepared(not_prepared).startswith(f"dataset '{not_prepared}' not found")
    (tmp_path / "a_file").write_text("x")  # named as the dataset: a note, not a traceback
    assert bench.unprepared(str(tmp_path / "a_file")) is not None
    os.makedirs(tmp_path / "empty")
    assert bench.unprepared(str(tmp_path / "empty")) == f"dataset '{tmp_path / 'empty'}' is not prepared in " \
                                                         f"{tmp_path / 'empty'}"


def test_a_compared_dataset_that_is_not_prepared_is_said_not_timed_as_a_and_read_as_the_datasets_doing(char_data,
                                                                                                     tmp_path):
    """--compare=--dataset=typo built B at GPT-2's vocabulary, the model A is, and printed its ratio with no note."""
    result = run_script("bench.py", "--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32",
                        "--block_size=32", "--batch_size=2", "--num_steps=1", "--warmup_steps=1", "--rounds=1",
                        f"--dataset={char_data}", f"--compare=--dataset={tmp_path / 'typo'}", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith(f"note: B: dataset '{tmp_path / 'typo'}' not found")
    assert notes[0].endswith("until it is, the model is timed with GPT-2's vocabulary, 50304 (or give --vocab_size=N)")


def test_every_train_setting_is_a_bench_setting_or_declared_irrelevant_to_speed():
    import bench
    import train
    assert set(bench.TRAINING_ONLY) <= set(train.config_defaults)
    assert set(train.config_defaults) - set(bench.config_defaults) - set(bench.TRAINING_ONLY) == set()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_autocast_on_cpu_trains(char_data, tmp_path, dtype):
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=10, eval_interval=10, dtype=dtype),
                        cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"dtype {dtype}" in result.stdout
    val = [float(r["val_loss"]) for r in read_metrics(out) if r["val_loss"]]
    assert val[-1] < val[0]
    # it computed in 16 bits: the same run in fp32 gives close losses, not equal ones
    plain = str(tmp_path / "fp32")
    assert run_script("train.py", *tiny_args(char_data, plain, max_iters=10, eval_interval=10, dtype="float32"),
                      cwd=str(tmp_path)).returncode == 0
    low, high = step_losses(read_metrics(out)), step_losses(read_metrics(plain))
    assert all(low[i] != high[i] and abs(low[i] - high[i]) < 0.05 for i in high)
    scaler = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["scaler"]
    # fp16 trains with a GradScaler, whose state is checkpointed; bf16 needs none
    assert (scaler.get("_growth_tracker") == 10) if dtype == "float16" else scaler == {}


@pytest.mark.parametrize("script, key", [("train.py", "gradient_accumulation_steps"), ("sample.py", "max_new_tokens"),
                                         ("bench.py", "warmup_steps")])
def test_help_lists_settings(script, key, tmp_path):
    result = run_script(script, "--help", cwd=str(tmp_path))
    assert result.returncode == 0 and f"--{key}=" in result.stdout


def test_evaluation_windows_do_not_depend_on_the_seed(char_data, tmp_path):
    out = str(tmp_path / "out")
    assert run_script("train.py", *tiny_args(char_data, out, max_iters=10, eval_interval=10), cwd=str(tmp_path)).returncode == 0
    lines = []
    for seed in (1, 2):
        result = run_script("train.py", *tiny_args(char_data, out, init_from="resume", eval_only=True, seed=seed),
                            cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        lines.append([line for line in result.stdout.splitlines() if line.startswith("eval of ckpt.pt at iter 10:")])
    assert lines[0] == lines[1] and len(lines[0]) == 1


def test_compiled_training_saves_plain_parameter_names(char_data, tmp_path):
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out, n_layer=1, max_iters=4, eval_interval=4, eval_iters=2,
                                               compile=True), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "compiling the model" in result.stdout
    state = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["model"]
    assert "transformer.wte.weight" in state and not any(k.startswith(("_orig_mod.", "module.")) for k in state)


def test_the_gpu_suite_runs_its_reduced_version_on_a_cpu(char_data, tmp_path):
    result = run_script(os.path.join("scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}",
                        f"--char_data={char_data}", cwd=str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stderr
    rows = [line for line in open(tmp_path / "out" / "table.md").read().splitlines()[2:]]
    rows.remove("| this train.py against nanoGPT's | not run | no --nanogpt=PATH given |")  # autotune: GPU only
    assert len(rows) >= 18 and all("| ok |" in row for row in rows), rows
    # 2 speed settings, 8 model options and reading ahead, one process each
    assert sum("x tokens/s (min" in row for row in rows) == 11
    assert any(row.startswith("| fast path vs plain path") and "another seed" in row for row in rows)
    assert any(row.startswith("| get_batch, 12 x 1024 tokens") and "from the page cache" in row for row in rows)
    assert rows[-2].startswith("| batches read ahead (prefetch_batches=4) vs in the loop")
    assert re.fullmatch(r"\| seconds each step took \| ok \| env \d+, checks \d+, gpt2 \d+, fastpaths \d+, options \d+, "
                        r"nanogpt \d+, prefetch \d+, autotune \d+ \|", rows[-1])
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:
        assert {"logs/tests_0.log", "logs/char_fast.log", "logs/llama_char.log", "logs/options.log",
                "logs/get_batch.log", "logs/prefetch.log"} <= set(tar.getnames())


def test_the_gpu_suite_stops_a_step_at_the_budget_and_names_it_for_the_next_call(char_data, tmp_path):
    """The checks start (the CPU version counts 5 s a step) but their runs are longer than the budget: they are
    stopped at its end, all at once, with everything they started, their rows say so, and the step is named for the
    next call."""
    import psutil
    result = run_script(os.path.join("scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}",
                        f"--char_data={char_data}", "--char_iters=100000", "--only=checks", "--budget=8",
                        "--ours_flags=--compile=False --dtype=float32", cwd=str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    rows = open(tmp_path / "out" / "table.md").read().splitlines()[2:]
    assert any(row.startswith("| Shakespeare char") and "| FAILED | see logs/char_fast.log" in row for row in rows), rows
    assert (f"next, python scripts/gpu_suite.py --out=DIR --only=checks --work={tmp_path / 'work'} "
            f"--char_iters=100000 '--ours_flags=--compile=False --dtype=float32' --char_data={char_data}\n"
            ) in result.stdout  # the next call keeps this one's settings, quoted for the shell, but for its budget
    assert re.search(r"char_fast: exit 124 after \d+ s", result.stdout)
    ends = [int(s) for s in re.findall(r"\] \w+: exit 124 after (\d+) s", result.stdout)]  # the tests' too, if stopped
    assert len(ends) >= 4 and max(ends) - min(ends) <= 2, result.stdout  # stopped together, not one by one
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path / "work") in " ".join(p.info["cmdline"] or [])]


def test_the_gpu_suite_leaves_the_nanogpt_step_on_a_cpu_to_a_call_with_the_time_it_takes(tmp_path):
    """nanoGPT's CPU runs take minutes (a 50257-token head): a budget short of that starts none of them."""
    nanogpt = tmp_path / "nanoGPT"
    nanogpt.mkdir()
    for name in ("train.py", "model.py", "configurator.py"):  # never run: the step is not started
        (nanogpt / name).write_text("raise SystemExit('ran')\n")
    result = run_script(os.path.join("scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}",
                        "--only=nanogpt", "--budget=120", f"--nanogpt={nanogpt}", cwd=str(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    table = open(tmp_path / "out" / "table.md").read()
    assert re.search(r"\| step nanogpt \| not run \| about 300 s, \d+ s of the 120 s budget left \|", table), table
    assert "--only=nanogpt" in result.stdout and not os.path.exists(tmp_path / "work" / "nanogpt_8x12")


def test_a_gpu_suite_stopped_by_sigterm_stops_every_job_it_started(char_data, tmp_path):
    """A borrowed machine's time limit ends the suite's command: its jobs, in process groups of their own, must
    go with it rather than run on during the next call."""
    import psutil
    suite = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}",
                              f"--work={tmp_path / 'work'}", f"--char_data={char_data}", "--char_iters=100000",
                              "--only=checks", "--budget=300"], cwd=str(tmp_path), stdout=subprocess.PIPE, text=True)
    jobs = []
    for _ in range(600):  # the long char run has started: a job of the suite's
        jobs = [p for p in psutil.Process(suite.pid).children(recursive=True) if "char_fast" in " ".join(p.cmdline())]
        if jobs:
            break
        time.sleep(0.1)
    assert jobs and os.getpgid(jobs[0].pid) != os.getpgid(suite.pid) and os.getsid(jobs[0].pid) == os.getsid(suite.pid)
    suite.send_signal(signal.SIGTERM)
    assert suite.wait(timeout=60) == 143
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path / "work") in " ".join(p.info["cmdline"] or [])]


GRANDCHILD = """
import signal, sys, time
def stop(*_):  # as train.py's SIGTERM: a moment to save, then exit
    time.sleep(1)
    open(sys.argv[1], "w").write("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(600)
"""


def test_the_gpu_suite_stops_what_a_job_started_in_a_group_of_its_own(tmp_path):
    """As pytest's warm Python forks a test's script: once the job has gone, that script is an orphan which the
    job's group no longer reaches, and it would run on into the next step's timings. It gets its SIGTERM with the
    job, and the same time to stop before the SIGKILL."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gpu_suite import Suite
    suite = Suite(str(tmp_path / "out"), str(tmp_path / "work"), 60, gpu=False, fp8=False)
    forks = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}, "
             f"{str(tmp_path / 'saved')!r}], process_group=0); print(p.pid, flush=True); time.sleep(600)")
    job = suite.start("forks", [sys.executable, "-c", forks])
    for _ in range(300):
        lines = open(job["log"]).read().splitlines()
        if len(lines) > 1:
            break
        time.sleep(0.05)
    grandchild = int(lines[1])
    assert os.getpgid(grandchild) == grandchild != job["proc"].pid
    time.sleep(0.5)  # its SIGTERM handler in place
    code, _ = suite.wait(job, 0.1)
    assert code == 124
    import psutil
    try:
        assert psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE  # ended; its new parent has yet to reap it
    except psutil.NoSuchProcess:
        pass
    except AssertionError:
        os.kill(grandchild, signal.SIGKILL)
        pytest.fail("the job's own group was stopped, and the group it started was left running")
    assert (tmp_path / "saved").read_text() == "saved"  # stopped by its SIGTERM, not killed before it had saved


def test_the_gpu_suite_leaves_out_what_its_budget_cannot_hold(tmp_path):
    result = run_script(os.path.join("scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}",
                        "--only=env,gpt2,options", "--budget=3", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = open(tmp_path / "out" / "table.md").read().splitlines()[2:]
    assert [row.split(" | ")[:2] for row in rows] == [["| step env", "not run"], ["| step gpt2", "not run"],
                                                      ["| step options", "not run"]]
    assert "next, python scripts/gpu_suite.py --out=DIR --only=env,gpt2,options" in result.stdout


def test_the_gpu_suites_next_call_names_its_machine_again(tmp_path):
    """env ran, the nanogpt step (300 s on a CPU) did not fit: the next call, maybe in another slot on another
    machine, runs env too, and takes the budget its own slot gives."""
    nanogpt = tmp_path / "nanoGPT"
    nanogpt.mkdir()
    for name in ("train.py", "model.py", "configurator.py"):  # never run: the step is not started
        (nanogpt / name).write_text("raise SystemExit('ran')\n")
    result = run_script(os.path.join("scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}",
                        "--only=env,nanogpt", "--budget=120", f"--nanogpt={nanogpt}", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = open(tmp_path / "out" / "table.md").read().splitlines()[2:]
    assert [row.split(" | ")[:2] for row in rows[:2]] == [["| environment", "ok"], ["| step nanogpt", "not run"]]
    assert (f"next, python scripts/gpu_suite.py --out=DIR --only=env,nanogpt --work={tmp_path / 'work'} "
            f"--nanogpt={nanogpt}\n") in result.stdout


@pytest.mark.parametrize("flags,problem", [("--batch_size=48", "sets the batch shape"),
                                           ("--compile_mode=reduce-overhead", "sets a compile_mode with CUDA graphs"),
                                           ("--dtype=float16 --compile_mode=max-autotune", "compile_mode with CUDA graphs"),
                                           ("--compile_mode='reduce-overhead'", "compile_mode with CUDA graphs"),
                                           ("--block_size'=512'", "sets the batch shape"),
                                           ("config/train_gpt2.py", "not a config file"),
                                           ("--fp8=True --compile", "not a config file or a bare word"),
                                           ("--dtype='bfloat16", "balance its quotes")])
def test_the_gpu_suite_refuses_ours_flags_that_the_nanogpt_steps_runs_cannot_take(tmp_path, flags, problem):
    """Found only after nanoGPT's own runs had spent a minute and a half of the slot."""
    result = run_script(os.path.join("scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}",
                        f"--ours_flags={flags}", cwd=str(tmp_path))
    assert result.returncode == 1 and problem in result.stderr and result.stderr.startswith("error: ")
    assert not os.path.exists(tmp_path / "out")


def test_the_gpu_suite_reads_from_get_batch_whether_the_prefetch_step_read_from_storage():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gpu_suite import reads_storage
    ahead, random_access = " with the kernel's read-ahead, ", " with random_access"  # bench_get_batch's line
    assert reads_storage("1812 us (1.50 MiB read per batch)" + ahead + "995 us (0.02 MiB read per batch)" + random_access)
    assert reads_storage("1812 us" + ahead + "995 us" + random_access)  # a system that counts no reads
    assert not reads_storage("40 us (0.00 MiB read per batch)" + ahead + "38 us (0.00 MiB read per batch)" + random_access)
    assert not reads_storage("not measured: /w/tmpab is on a tmpfs, in memory; set TMPDIR to a folder on a disk")


def test_a_step_of_the_gpu_suite_that_raises_is_a_failed_row_and_the_steps_after_it_run(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "synthetic_tokens_1000000_512").write_text("a file where the prefetch step makes its data")
    result = run_script(os.path.join("scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}",
                        "--only=prefetch,autotune", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = open(tmp_path / "out" / "table.md").read().splitlines()[2:]
    assert rows[0].startswith("| step prefetch | FAILED | FileExistsError: ") and "traceback" in rows[0]
    assert re.fullmatch(r"\| seconds each step took \| ok \| prefetch \d+, autotune \d+ \|", rows[1]), rows
    assert "Traceback (most recent call last)" in result.stderr


def test_the_gpu_suite_compiles_ahead_each_graph_its_timed_steps_compile():
    """The GPU's choices, which a CPU machine's run of the suite never makes."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gpu_suite import OPTIONS, SAME_GRAPH, char_runs, fastpaths, warm_configs, warm_processes
    assert warm_configs(gpu=False, fp8=False, processes=0) == []
    timed = sorted(flags for _, flags, _ in fastpaths(True, True) + OPTIONS if flags not in SAME_GRAPH)
    for processes in (warm_processes(79.2), warm_processes(139.8)):  # an H100's GiB, an H200's
        dealt = warm_configs(gpu=True, fp8=True, processes=processes)
        assert len(dealt) == processes and max(map(len, dealt)) - min(map(len, dealt)) <= 1
        assert dealt[0][0] == "--batch_size=12" and sorted(sum(dealt, [])[1:]) == timed
    assert (warm_processes(79.2), warm_processes(139.8)) == (2, 4)
    assert len(fastpaths(True, True)) == len(fastpaths(True, False)) + 2 == len(fastpaths(False, False)) + 9
    assert [name for name, _, _ in char_runs(True, True)][-1] == "char_fp8"
    assert "char_fp8" not in [name for name, _, _ in char_runs(True, False)]


def test_the_gpu_suite_checks_its_nanogpt_checkout_before_it_starts(tmp_path):
    """Found missing only at the nanogpt step, the checkout cost the steps after it on a borrowed GPU."""
    (tmp_path / "nanogpt").mkdir()
    (tmp_path / "nanogpt" / "train.py").write_text("")
    result = run_script(os.path.join("scripts", "gpu_suite.py"), f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}",
                        f"--nanogpt={tmp_path / 'nanogpt'}", cwd=str(tmp_path))
    assert result.returncode == 1 and not (tmp_path / "out").exists()
    assert result.stderr == f"error: --nanogpt={tmp_path / 'nanogpt'} lacks model.py, configurator.py: give a nanoGPT checkout's folder\n"


def test_the_gpu_suite_reckons_the_nanogpt_ratios_as_tokens_per_second_of_the_same_tokens_per_step():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gpu_suite import nanogpt_rows
    ms = {("nanogpt", 8, 12): 220.0, ("ours", 8, 12): 200.0, ("nanogpt", 2, 48): 180.0, ("ours", 2, 48): None}
    rows = nanogpt_rows(ms, 1024)
    assert [ok for _, ok, _ in rows] == [True, False, False]  # no fp8 rows without an fp8 run; a failed run is a failed row
    assert rows[0][0].endswith("96 x 1024 tokens/step") and rows[0][2].startswith("1.10x tokens/s: 200 ms/step (491,520 tok/s)")
    assert "logs/ours_2x48.log" in rows[1][2]
    ms.update({("ours", 2, 48): 176.0, ("ours_fp8", 2, 48): 110.0})
    rows = nanogpt_rows(ms, 1024)
    assert all(ok for _, ok, _ in rows) and len(rows) == 5
    assert [text.split("x tokens/s")[0] for _, _, text in rows] == ["1.10", "1.02", "1.25", "2.00", "1.60"]
    assert all(what.endswith(", ours with `--loss_chunk=4096`") for what, _, _ in nanogpt_rows(ms, 1024, "--loss_chunk=4096"))


def test_every_optimizer_and_schedule_setting_reaches_the_step(char_data, tmp_path):
    """Each set away from its default, so that a setting the loop drops on the way fails here (the golden run
    keeps them all at their defaults): the AdamW moments' betas and decay, the schedule's shape, the clipping
    threshold; Muon's rate and momentum, and decay_lr=False."""
    from train import get_lr
    adamw = dict(beta1=0.8, beta2=0.9, weight_decay=0.05, learning_rate=2e-3, lr_schedule="wsd", cooldown_frac=0.5,
                 warmup_iters=2, lr_decay_iters=8, min_lr=1e-4, grad_clip=1e-12)
    muon = dict(optimizer="muon", muon_lr=0.05, muon_momentum=0.8, learning_rate=2e-3, decay_lr=False)
    for name, settings in (("adamw", adamw), ("muon", muon)):
        out = str(tmp_path / name)
        result = run_script("train.py", *tiny_args(char_data, out, max_iters=8, eval_interval=8, **settings),
                            cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        rows = {int(r["iter"]): float(r["lr"]) for r in read_metrics(out) if r["lr"]}
        checkpoint = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
        groups, state = checkpoint["optimizer"]["param_groups"], checkpoint["optimizer"]["state"]
        if name == "adamw":
            # step k's row logs the rate its update took, get_lr(k - 1): warmup, the stable phase, the linear cooldown
            assert rows == pytest.approx({k: get_lr(k - 1, 2e-3, 2, 8, 1e-4, "wsd", 0.5) for k in range(1, 9)})
            assert len(set(rows.values())) >= 5
            assert all(tuple(g["betas"]) == (0.8, 0.9) for g in groups)
            assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.05]
            # every gradient clipped to a norm of 1e-12: its second moments sum to under 1e-24
            assert sum(float(s["exp_avg_sq"].sum()) for s in state.values()) < 1e-24
        else:
            assert set(rows.values()) == {2e-3}  # no warmup, no decay
            assert groups[0]["muon"] and groups[0]["momentum"] == 0.8 and groups[0]["lr"] == pytest.approx(0.05)
