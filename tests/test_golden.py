"""A golden loss curve: a tiny deterministic CPU run must reproduce the recorded per-step losses and final
weights bit for bit, so a refactor that changes the numbers is caught. Regenerate only on purpose, saying
why in the commit:  GOLDEN_REGENERATE=1 python -m pytest tests/test_golden.py"""
import hashlib
import json
import os

import torch

from conftest import ROOT, load_module, made_up_text, read_metrics, run_script, step_losses

GOLDEN = os.path.join(ROOT, "tests", "golden", "tiny_char_run.json")
SETTINGS = dict(device="cpu", compile=False, dtype="float32", n_layer=2, n_head=2, n_embd=32, block_size=32,
                batch_size=8, gradient_accumulation_steps=2, dropout=0.1, eval_iters=4, eval_interval=10,
                log_interval=1, max_iters=20, warmup_iters=5, lr_decay_iters=30, learning_rate=3e-3, min_lr=3e-4,
                seed=1234, wandb_log=False)


def test_tiny_run_reproduces_the_golden_losses_and_weights(tmp_path):
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    load_module("data/shakespeare_char/prepare.py").prepare(made_up_text(7, 200, 7, 20_000), data)
    result = run_script("train.py", f"--dataset={data}", f"--out_dir={out}",
                        *[f"--{k}={v}" for k, v in SETTINGS.items()], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = read_metrics(out)
    model = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["model"]
    digest = hashlib.sha256(b"".join(model[k].numpy().tobytes() for k in sorted(model))).hexdigest()
    got = {"step_losses": {str(i): v for i, v in sorted(step_losses(rows).items())},
           "val_losses": {r["iter"]: float(r["val_loss"]) for r in rows if r["val_loss"]},
           "weights_sha256": digest}
    if os.environ.get("GOLDEN_REGENERATE") == "1":
        with open(GOLDEN, "w") as f:
            json.dump({"settings": SETTINGS, **got}, f, indent=1)
            f.write("\n")
    with open(GOLDEN) as f:
        golden = json.load(f)
    assert golden["settings"] == SETTINGS
    assert got["step_losses"] == golden["step_losses"]
    assert got["val_losses"] == golden["val_losses"]
    assert got["weights_sha256"] == golden["weights_sha256"]
