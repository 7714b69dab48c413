"""parallelism='fsdp' (FSDP2, sharding.py) on 2 gloo processes: the same steps as DDP, and checkpoints that
move between FSDP, DDP and one process."""
import os
import shutil

import pytest
import torch

from conftest import ROOT, char_vocab_size, read_metrics, run_script, step_losses, tiny_args
from memory import plan
from model import GPT, GPTConfig

pytestmark = pytest.mark.slow  # two-process runs


def train(char_data, out, tmp_path, procs, **settings):
    result = run_script("train.py", *tiny_args(char_data, out, backend="gloo", gradient_accumulation_steps=4,
                                               eval_interval=4, lr_decay_iters=40, **settings),
                        cwd=str(tmp_path), torchrun_procs=procs)
    assert result.returncode == 0, result.stderr
    return step_losses(read_metrics(out))


def test_fsdp_takes_ddps_steps_and_checkpoints_move_between_fsdp_ddp_and_one_process(char_data, tmp_path):
    runs = {}
    for name, procs, layout in (("ddp", 2, {}), ("fsdp", 2, {"parallelism": "fsdp"}), ("single", 0, {}),
                                ("fsdp-step", 2, {"parallelism": "fsdp", "fsdp_reduce": "step"})):
        runs[name] = (procs, layout, train(char_data, str(tmp_path / name), tmp_path, procs, max_iters=16, **layout))
    # the same global batches and the same sums: DDP all-reduces gradients where FSDP reduce-scatters them, each
    # micro-step's (fsdp_reduce='micro_step') or the step's (fsdp_reduce='step'); on 2 processes with 2 micro-steps
    # each, the sums differ in order only, so the steps agree to float rounding
    for name in ("fsdp", "fsdp-step"):
        assert sorted(runs[name][2]) == list(range(1, 17))
        assert all(abs(runs[name][2][i] - runs["ddp"][2][i]) < 1e-5 for i in runs["ddp"][2]), name
    # the same ckpt.pt whatever the layout: the tied embedding and output weight stored once, as one process does
    for name in ("ddp", "fsdp"):
        saved = torch.load(os.path.join(tmp_path, name, "ckpt.pt"), map_location="cpu", weights_only=True)["model"]
        assert saved["transformer.wte.weight"].data_ptr() == saved["lm_head.weight"].data_ptr(), name
    # half a run in one layout, the rest in another, against the whole run in the second layout: one process and
    # two sum gradients in another order, hence a tolerance, far below a step's change
    halves = {}
    for first, then in (("fsdp", "ddp"), ("fsdp", "single"), ("ddp", "fsdp")):
        if first not in halves:
            halves[first] = str(tmp_path / f"{first}-8")
            train(char_data, halves[first], tmp_path, runs[first][0], max_iters=8, **runs[first][1])
        out = str(tmp_path / f"{first}-then-{then}")
        shutil.copytree(halves[first], out)
        procs, layout, straight = runs[then]
        resumed = train(char_data, out, tmp_path, procs, max_iters=16, init_from="resume", **layout)
        assert sorted(resumed) == list(range(1, 17))
        assert all(abs(resumed[i] - straight[i]) < 2e-4 for i in range(9, 17)), (first, then)


def test_muon_under_fsdp_takes_ddps_steps_and_under_ddp_one_process_steps(char_data, tmp_path):
    runs = [train(char_data, str(tmp_path / name), tmp_path, procs, max_iters=8, optimizer="muon", **layout)
            for name, procs, layout in (("single", 0, {}), ("ddp", 2, {}), ("fsdp", 2, {"parallelism": "fsdp"}))]
    single, ddp, fsdp = runs
    assert sorted(fsdp) == list(range(1, 9)) and all(abs(fsdp[i] - ddp[i]) < 1e-5 for i in ddp)
    assert all(abs(ddp[i] - single[i]) < 2e-4 for i in ddp)  # the gradients' summation order differs


def test_the_plan_divides_weights_gradients_and_optimizer_state_among_fsdp_processes():
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65))
    ddp = plan(model, 8, "float32", "adamw", 4, "ddp", False, "cpu")
    fsdp = plan(model, 8, "float32", "adamw", 4, "fsdp", False, "cpu")
    for key in ("weights", "gradients", "optimizer"):
        assert fsdp[key] == pytest.approx(ddp[key] / 4, abs=4)
    assert ddp["ddp_buckets"] == ddp["weights"] and "ddp_buckets" not in fsdp
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    assert fsdp["gathered_blocks"] == 2 * block * 4 and fsdp["activations"] == ddp["activations"]
    # the root's weights (wte, wpe, ln_f) stay gathered through forward and backward: seen in FSDP2's own state,
    # with each block's hooks, on 2 gloo processes; in training their whole gradient is held beside them
    root = sum(p.numel() for p in model.parameters()) - 4 * block
    assert fsdp["gathered_root"] == 2 * root * 4 and "gathered_root" not in ddp
    evaluating = plan(model, 8, "bfloat16", "adamw", 4, "fsdp", False, "cuda", training=False)
    assert evaluating["gathered_root"] == root * 2 and evaluating["gathered_blocks"] == 2 * block * 2
    # with micro-steps and fsdp_reduce='step', train.py reduce-scatters on the last one only: till then gradients
    # are whole and every block stays gathered (measured through FSDP2's own state after a first micro-step: 48.2
    # MiB of each for a 12.64M-parameter model on 2 processes, where fsdp_reduce='micro_step' held a 24.1 MiB shard)
    accumulating = plan(model, 8, "bfloat16", "adamw", 4, "fsdp", False, "cuda", micro_steps=2, fsdp_reduce="step")
    n_params = sum(p.numel() for p in model.parameters())
    assert accumulating["gradients"] == 4 * n_params and accumulating["gathered_blocks"] == 2 * n_params
    assert accumulating["gathered_root"] == 0  # its weights and gradient are among those, whole
    assert accumulating["weights"] == fsdp["weights"] and accumulating["optimizer"] == fsdp["optimizer"]
    assert plan(model, 8, "bfloat16", "adamw", 4, "fsdp", False, "cuda", micro_steps=2) == \
        plan(model, 8, "bfloat16", "adamw", 4, "fsdp", False, "cuda")  # the default reduces every micro-step


def test_sigterm_to_one_fsdp_rank_saves_a_whole_checkpoint_and_stops_both(char_data, tmp_path):
    import signal

    from test_faults import args_for, torchrun, wait_for_iter, worker_pids
    out = str(tmp_path / "out")
    proc = torchrun(2, *args_for(char_data, out, backend="gloo", max_iters=200, parallelism="fsdp"))
    wait_for_iter(out, 3, proc)
    os.kill(worker_pids(proc.pid)[1], signal.SIGTERM)  # rank 1 only
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    saved = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert 3 <= saved["iter_num"] < 200 and not saved["evaluated"]
    # the gathered, unsharded state: every tensor has its model shape, every moment its parameter's
    assert saved["model"]["transformer.wte.weight"].shape == (char_vocab_size(char_data), 32)
    assert all(s["exp_avg"].dim() >= 1 for s in saved["optimizer"]["state"].values())


def test_non_finite_steps_in_a_row_stop_an_fsdp_run(char_data, tmp_path):
    result = run_script("train.py", *tiny_args(char_data, str(tmp_path / "out"), backend="gloo", parallelism="fsdp",
                                               learning_rate=1e30, min_lr=0, grad_clip=0, max_nonfinite_steps=3,
                                               gradient_accumulation_steps=2),
                        cwd=str(tmp_path), torchrun_procs=2)
    assert result.returncode != 0
    assert "3 steps in a row had a non-finite loss or gradient norm" in result.stderr



FULL_STATE = """
import gc, sys
sys.path.insert(0, {root!r})
import torch, torch.distributed as dist
from model import GPT, GPTConfig
from sharding import full_state, shard
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
shapes = {{k: v.shape for k, v in model.state_dict().items()}}
shard(model, "float32")
optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
x = torch.randint(64, (2, 16))
model(x, x)[1].backward()
optimizer.step()
weights, moments = full_state(model, optimizer, keep=rank == 0)
gathered = [*weights.values(), *(s["exp_avg"] for s in moments["state"].values())]
if rank == 0:  # whole, plain tensors in host memory
    ok = all(type(t) is torch.Tensor and t.device.type == "cpu" for t in gathered) and \\
        all(weights[k].shape == shapes[k] for k in shapes)
else:
    ok = all(t is None for t in gathered)
open(f"rank{{rank}}.txt", "w").write(str(ok))  # a file each: the two processes' prints can interleave
dist.barrier()  # leave together, with nothing left holding the gloo group (as train.py ends)
del model, optimizer
gc.collect()
dist.destroy_process_group()
"""


def test_a_save_gathers_the_whole_state_onto_rank_0_alone(tmp_path):
    """Under FSDP every rank takes part in each gather, but only rank 0, which writes the checkpoint, keeps it."""
    script = tmp_path / "full_state.py"
    script.write_text(FULL_STATE.format(root=ROOT))
    result = run_script(str(script), cwd=str(tmp_path), torchrun_procs=2)
    assert result.returncode == 0, result.stderr
    assert [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)] == ["True", "True"]


@pytest.mark.parametrize("setting,message", [({"eval_iters": 3}, "error: eval_iters=3 is not divisible by the world size 2"),
                                             ({"sample_interval": 1}, "error: sample_interval=1 is not available with "
                                                                      "parallelism='fsdp'")])
def test_what_fsdp_cannot_do_is_refused_before_it_hangs(char_data, tmp_path, setting, message):
    """Under FSDP every rank joins every forward pass: an evaluation split unevenly, or a sample on rank 0 alone,
    would wait in a collective until ddp_timeout (30 minutes by default) instead."""
    out = str(tmp_path / "out")
    result = run_script("train.py", *tiny_args(char_data, out, backend="gloo", parallelism="fsdp", max_iters=4,
                                               ddp_timeout=60, **setting),
                        cwd=str(tmp_path), torchrun_procs=2, timeout=120)
    assert result.returncode != 0 and message in result.stderr
    assert not os.path.exists(os.path.join(out, "metrics.csv"))


def test_a_run_that_samples_is_evaluated_under_fsdp_and_its_resume_is_refused_naming_the_run_s_setting(char_data,
                                                                                                          tmp_path):
    out = str(tmp_path / "out")
    train(char_data, out, tmp_path, 1, max_iters=4, sample_interval=1, sample_tokens=5)
    fsdp = ["--backend=gloo", "--device=cpu", "--parallelism=fsdp", "--eval_iters=2"]
    evaluated = run_script("train.py", f"--out_dir={out}", "--init_from=resume", "--eval_only=True", *fsdp,
                           cwd=str(tmp_path), torchrun_procs=2)  # an eval_only run neither samples nor scores
    assert evaluated.returncode == 0 and os.path.exists(os.path.join(out, "eval.json")), evaluated.stderr
    resumed = run_script("train.py", f"--out_dir={out}", "--init_from=resume", "--max_iters=8", *fsdp,
                         cwd=str(tmp_path), torchrun_procs=2)
    assert resumed.returncode != 0
    assert resumed.stderr.splitlines()[-1].endswith(
        "error: sample_interval=1 is not available with parallelism='fsdp' yet: set 0, and sample or evaluate the "
        "checkpoint with sample.py or eval.py; sample_interval is the run's own (a resume keeps each setting it is "
        "not given): give --sample_interval=... for another"), resumed.stderr
