"""train.py's functions, called directly: importing train.py starts nothing."""
import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
from train import check_split, estimate_loss, get_batch, get_lr, UserError


def write_tokens(path, n, dtype=np.uint16):
    np.arange(n, dtype=np.int64).astype(dtype).tofile(path)
    return str(path)


def test_get_lr_warmup_peak_decay_and_floor():
    args = dict(learning_rate=1e-3, warmup_iters=10, lr_decay_iters=110, min_lr=1e-4)
    assert get_lr(0, **args) == pytest.approx(1e-3 / 11)
    assert get_lr(9, **args) == pytest.approx(1e-3 * 10 / 11)
    assert get_lr(10, **args) == pytest.approx(1e-3)  # peak at the end of warmup
    assert get_lr(60, **args) == pytest.approx((1e-3 + 1e-4) / 2)  # halfway down the cosine
    assert get_lr(110, **args) == pytest.approx(1e-4)
    assert get_lr(10_000, **args) == 1e-4
    lrs = [get_lr(it, **args) for it in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_get_batch_targets_are_inputs_shifted_by_one(tmp_path):
    path = write_tokens(tmp_path / "train.bin", 1000)
    x, y = get_batch(path, 8, 32, (1, 0, 0, 0), "cpu")
    assert x.shape == y.shape == (8, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y - x, torch.ones_like(x))  # the file counts up, so each target is its input + 1


def test_get_batch_depends_on_its_key_alone(tmp_path):
    path = write_tokens(tmp_path / "train.bin", 100_000)
    a = get_batch(path, 4, 16, (1337, 0, 5, 2), "cpu")
    torch.manual_seed(123)  # the global RNG plays no part
    b = get_batch(path, 4, 16, (1337, 0, 5, 2), "cpu")
    c = get_batch(path, 4, 16, (1337, 0, 5, 3), "cpu")
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_check_split_rejects_short_and_torn_files(tmp_path):
    assert check_split(write_tokens(tmp_path / "ok.bin", 100), 64) == 100
    with pytest.raises(UserError, match="block_size 100 is not shorter than .* \\(100 tokens\\)"):
        check_split(str(tmp_path / "ok.bin"), 100)
    torn = tmp_path / "torn.bin"
    torn.write_bytes(b"\x00" * 101)
    with pytest.raises(UserError, match="not a whole number of 2-byte tokens"):
        check_split(str(torn), 8)


def test_estimate_loss_uses_the_same_windows_every_time(tmp_path):
    path = write_tokens(tmp_path / "val.bin", 5000)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=5000, n_layer=1, n_head=2, n_embd=16))
    batch_fn = lambda split, k: get_batch(path, 4, 16, (0, 1, 0, k), "cpu")
    first = estimate_loss(model, batch_fn, eval_iters=3, splits=("val",))
    second = estimate_loss(model, batch_fn, eval_iters=3, splits=("val",))
    assert first == second and first["val"] > 0
    assert model.training  # put back in training mode
