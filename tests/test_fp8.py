"""fp8 matmuls (fp8.py), on the CPU, where torch runs _scaled_mm in software: the numbers, the layers it
touches, and a train.py run whose checkpoint a plain model reads."""
import pytest
import torch

from common import UserError
from conftest import read_metrics, run_script, step_losses, tiny_args
from fp8 import E4M3, Fp8Linear, to_fp8, use_fp8
from model import GPT, GPTConfig


def relative_error(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_to_fp8_fills_the_format_and_scales_back():
    t = torch.randn(64, 48) * 1e-3  # far below e4m3's range: the scale brings it up
    t8, inverse = to_fp8(t, E4M3)
    assert t8.dtype == E4M3 and t8.float().abs().max() == torch.finfo(E4M3).max
    assert relative_error(t8.float() * inverse, t) < 0.05  # 3 mantissa bits: a few percent per element


@pytest.mark.parametrize("autocast", [False, True])
def test_fp8_linear_matches_the_fp32_layer_forward_and_backward(autocast):
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    x = torch.randn(2, 16, 64, requires_grad=True)
    layer(x).square().sum().backward()
    expected = [layer(x).detach(), x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()]
    x.grad, layer.weight.grad, layer.bias.grad = None, None, None
    layer.__class__ = Fp8Linear
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = layer(x)
    assert out.dtype == (torch.bfloat16 if autocast else torch.float32) and out.shape == (2, 16, 48)
    out.float().square().sum().backward()
    errors = [relative_error(got, want) for got, want in
              zip([out.detach(), x.grad, layer.weight.grad, layer.bias.grad], expected)]
    assert all(e < 0.1 for e in errors)  # e4m3 forward, e5m2 gradients: several percent, not more
    assert all(e > 0.01 for e in errors[:3])  # but not less: bf16 alone rounds to about 0.3%, so fp8 did run
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32


def test_use_fp8_converts_the_blocks_linears_only_and_keeps_the_state_dict():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, mlp="swiglu", n_kv_head=1))
    names = list(model.state_dict())
    params = [id(p) for p in model.parameters()]
    assert use_fp8(model, 8 * 16) == 2 * 4  # q/k/v, attention out, MLP in, MLP out per block
    assert list(model.state_dict()) == names and [id(p) for p in model.parameters()] == params
    assert type(model.lm_head) is torch.nn.Linear
    assert {type(m) for m in model.transformer.h.modules() if isinstance(m, torch.nn.Linear)} == {Fp8Linear}
    with pytest.raises(UserError, match="multiples of 16"):
        use_fp8(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=40, block_size=16, vocab_size=64)), 8 * 16)
    with pytest.raises(UserError, match="batch_size \\* block_size to be a multiple of 16, and it is 100"):
        use_fp8(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64)), 100)


@pytest.mark.slow
def test_a_model_trained_in_fp8_follows_the_fp32_one():
    """40 AdamW steps on one fixed batch from the same start: fp8's loss curve stays close to fp32's (a model this
    small, since fp8 matmuls are emulated on a CPU at about a second a step for width 64)."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64)
    batch = torch.randint(64, (8, 33), generator=torch.Generator().manual_seed(1))
    curves = []
    for fp8 in (False, True):
        torch.manual_seed(0)
        model = GPT(config)
        if fp8:
            use_fp8(model, 8 * 32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(40):
            _, loss = model(batch[:, :-1], batch[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        curves.append(losses)
    plain, fp8 = curves
    assert plain[-1] < 0.6 * plain[0]  # it learned
    assert all(abs(a - b) < 0.05 * a for a, b in zip(plain, fp8))


@pytest.mark.slow
def test_train_py_with_fp8_writes_a_checkpoint_a_plain_model_reads(char_data, tmp_path):
    out = tmp_path / "run"
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=10, eval_interval=10, fp8=True), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "fp8: 8 matmuls in the blocks run in float8" in result.stdout
    losses = [loss for _, loss in sorted(step_losses(read_metrics(out)).items())]
    assert len(losses) == 10 and losses[-1] < losses[0]
    saved = torch.load(out / "ckpt.pt", weights_only=True)
    plain = GPT(GPTConfig(**saved["model_args"]))
    plain.load_state_dict(saved["model"])  # the same names and dtypes as a run without fp8
    assert all(v.dtype == torch.float32 for v in saved["model"].values())
