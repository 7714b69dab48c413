"""A golden loss curve: a tiny deterministic CPU run must reproduce the recorded per-step losses and final
weights, so a refactor that changes the numbers is caught. Regenerate only on purpose, saying why in the
commit:  GOLDEN_REGENERATE=1 python -m pytest tests/test_golden.py

Not bit for bit: CPUs differ in their kernels (MKL and ATen pick AVX2 or AVX-512 code by the processor, and
those add in another order), which moves the weights by about 1e-6 of their size and the losses by less. The
tolerances below are 10x that; a real change (one step more or less, another learning rate, init or batch)
moves them by 1e-3 or more."""
import json
import os

import pytest
import torch

from conftest import ROOT, load_module, made_up_text, read_metrics, run_script, step_losses

GOLDEN = os.path.join(ROOT, "tests", "golden", "tiny_char_run.json")
SETTINGS = dict(device="cpu", compile=False, dtype="float32", n_layer=2, n_head=2, n_embd=32, block_size=32,
                batch_size=8, gradient_accumulation_steps=2, dropout=0.1, eval_iters=4, eval_interval=10,
                log_interval=1, max_iters=20, warmup_iters=5, lr_decay_iters=30, learning_rate=3e-3, min_lr=3e-4,
                seed=1234, wandb_log=False)
LOSS_RTOL = 1e-5
WEIGHT_RTOL = 1e-4  # of each tensor's norm


def fingerprint(weights: dict) -> dict:
    """Per tensor: its norm and its dot product with a fixed random vector, in float64. Any change to the
    weights beyond rounding moves the second; the first gives the scale it is compared at."""
    prints = {}
    for name in sorted(weights):
        w = weights[name].double().flatten()
        probe = torch.randn(w.numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        prints[name] = [w.norm().item(), (w @ probe).item()]
    return prints


def test_tiny_run_reproduces_the_golden_losses_and_weights(tmp_path):
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    load_module("data/shakespeare_char/prepare.py").prepare(made_up_text(7, 200, 7, 20_000), data)
    result = run_script("train.py", f"--dataset={data}", f"--out_dir={out}",
                        *[f"--{k}={v}" for k, v in SETTINGS.items()], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = read_metrics(out)
    model = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["model"]
    got = {"step_losses": {str(i): v for i, v in sorted(step_losses(rows).items())},
           "val_losses": {r["iter"]: float(r["val_loss"]) for r in rows if r["val_loss"]},
           "weights": fingerprint(model)}
    if os.environ.get("GOLDEN_REGENERATE") == "1":
        with open(GOLDEN, "w") as f:
            json.dump({"settings": SETTINGS, **got}, f, indent=1)
            f.write("\n")
    with open(GOLDEN) as f:
        golden = json.load(f)
    assert golden["settings"] == SETTINGS
    assert got["step_losses"] == pytest.approx(golden["step_losses"], rel=LOSS_RTOL)
    assert got["val_losses"] == pytest.approx(golden["val_losses"], rel=LOSS_RTOL)
    assert sorted(got["weights"]) == sorted(golden["weights"])
    for name, (norm, projection) in golden["weights"].items():
        assert got["weights"][name] == pytest.approx([norm, projection], abs=WEIGHT_RTOL * norm), name


def test_the_golden_check_sees_a_change_the_size_of_one_more_step():
    """The tolerance is far below what a real change does: one tiny AdamW-sized step on every weight fails it."""
    torch.manual_seed(0)
    weights = {"w": 0.02 * torch.randn(64, 32), "b": torch.ones(32)}
    golden = fingerprint(weights)
    for name in weights:
        nudged = {**weights, name: weights[name] + 3e-4 * torch.randn_like(weights[name]).sign()}
        norm, projection = golden[name]
        assert fingerprint(nudged)[name] != pytest.approx([norm, projection], abs=WEIGHT_RTOL * norm)
