import math

import pytest
import torch

from common import peak_flops, peak_flops_of
from model import GPT, GPTConfig


def tiny_config(**overrides) -> GPTConfig:
    return GPTConfig(**{**dict(block_size=16, vocab_size=97, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True),
                        **overrides})


def test_forward_shapes_and_initial_loss_near_uniform():
    torch.manual_seed(0)
    model = GPT(tiny_config())
    idx, targets = torch.randint(97, (2, 4, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (4, 16, 97)
    # a freshly initialised model should be close to guessing uniformly among the vocabulary
    assert abs(loss.item() - math.log(97)) < 0.1
    logits, loss = model(idx)
    assert logits.shape == (4, 1, 97) and loss is None  # inference computes the last position only


def test_sequence_longer_than_block_size_is_an_error():
    model = GPT(tiny_config())
    with pytest.raises(ValueError, match="longer than block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_embedding_and_output_weights_are_tied():
    model = GPT(tiny_config())
    assert model.lm_head.weight is model.transformer.wte.weight
    names = [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # counted once, as wte


def test_residual_projections_use_scaled_init():
    torch.manual_seed(0)
    model = GPT(tiny_config(n_layer=8, n_embd=64))
    expected = 0.02 / math.sqrt(2 * 8)
    assert model.transformer.h[0].attn.c_proj.weight.std().item() == pytest.approx(expected, rel=0.1)
    assert model.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("bias", [True, False])
def test_every_parameter_in_exactly_one_optimizer_group(bias):
    model = GPT(tiny_config(bias=bias))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    grouped = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])


def test_num_params_excludes_positions_by_default():
    model = GPT(tiny_config())
    total = sum(p.numel() for p in model.parameters())
    assert model.get_num_params(non_embedding=False) == total
    assert model.get_num_params() == total - 16 * 32


def test_the_printed_count_is_every_parameter_then_the_multiplied_ones_when_they_differ():
    """train.py's log, its dry run, bench.py and export.py give one count for one model: all of them first."""
    untied = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=50304, pos_emb="rope",
                           tie_embeddings=False))
    assert untied.parameters_text() == "6.54M parameters (3.32M without the embedding tables that are only looked up)"
    tied = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=50304, pos_emb="rope"))
    assert tied.parameters_text() == "3.32M parameters"  # nothing is only looked up


def test_crop_block_size_keeps_leading_positions_and_only_them(tmp_path):
    model = GPT(tiny_config())
    before = model.transformer.wpe.weight[:8].clone()
    model.crop_block_size(8)
    assert model.config.block_size == 8 and torch.equal(model.transformer.wpe.weight, before)
    wpe = model.transformer.wpe
    assert wpe.num_embeddings == 8 and wpe.weight.untyped_storage().nbytes() == before.numel() * 4
    torch.save({"wpe": wpe.weight}, tmp_path / "wpe.pt")  # a view would save the uncropped table's storage
    assert torch.load(tmp_path / "wpe.pt")["wpe"].untyped_storage().nbytes() == before.numel() * 4
    assert model(torch.zeros(1, 8, dtype=torch.long))[0].shape == (1, 1, 97)
    with pytest.raises(ValueError, match="cannot grow"):
        model.crop_block_size(9)


def test_generate_appends_tokens_and_respects_top_k():
    torch.manual_seed(0)
    model = GPT(tiny_config()).eval()
    idx = torch.zeros(2, 3, dtype=torch.long)
    out = model.generate(idx, 20, temperature=1.0, top_k=1)  # top_k=1 is greedy: rows agree
    assert out.shape == (2, 23) and torch.equal(out[:, :3], idx) and torch.equal(out[0], out[1])


@pytest.mark.slow
def test_temperature_zero_is_greedy_decoding():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16)).eval()
    idx = torch.tensor([[1, 2]])
    with torch.no_grad():
        out = model.generate(idx, 12, temperature=0.0)  # past block_size too: the context is cropped
        expected = idx
        for _ in range(12):
            logits, _ = model(expected[:, -8:])
            expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, expected)


def test_a_tiny_positive_temperature_samples_the_greedy_token_instead_of_failing():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16)).eval()
    idx = torch.tensor([[1, 2], [3, 4]])
    with torch.no_grad():  # 1e-40: logits / temperature alone overflow to inf, and inf - inf is nan in softmax
        assert torch.equal(model.generate(idx, 6, temperature=1e-40), model.generate(idx, 6, temperature=0.0))
        # 1e-320 is 0 in float32: the largest logit, shifted to 0, would be 0 / 0
        assert torch.equal(model.generate(idx, 6, temperature=1e-320), model.generate(idx, 6, temperature=0.0))


@pytest.mark.parametrize("bad", [dict(n_head=0), dict(block_size=0), dict(vocab_size=-1), dict(mlp_hidden=-1),
                                 dict(n_kv_head=-2), dict(dropout=1.0), dict(rope_theta=0.0), dict(rope_theta=math.nan),
                                 dict(rope_theta=math.inf)])
def test_a_config_no_model_has_is_a_value_error_not_a_crash_or_a_model_of_nan(bad):
    with pytest.raises(ValueError, match=f"^{next(iter(bad))} "):
        GPTConfig(**{"pos_emb": "rope", **bad})


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logits_that_are_not_finite_raise_rather_than_give_token_0_or_stop_inside_sampling(temperature):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16)).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight[3] = float("nan")  # every logit is nan
    idx = torch.tensor([[1, 2]])
    with pytest.raises(FloatingPointError, match="logits were nan or inf"):
        model.generate(idx, 3, temperature=temperature, top_k=5)
    forward = model.forward

    def floored(*args, **kwargs):  # a logit of -inf (float16's floor) is probability 0, not an error
        logits, loss = forward(*args, **kwargs)
        logits[..., 4] = -math.inf
        return logits, loss
    with torch.no_grad():
        model.transformer.ln_f.weight[3] = 1.0
        model.forward = floored
        assert (model.generate(idx, 20, temperature=temperature)[0, 2:] != 4).all()
        model.forward = forward
        model.transformer.ln_f.weight[3] = 1e6  # overflows float16 only
        assert torch.isfinite(model.generate(idx, 3, temperature=temperature)).all()
        with torch.autocast("cpu", torch.float16), pytest.raises(FloatingPointError, match="float16 holds"):
            model.generate(idx, 3, temperature=temperature)


def test_each_gpu_name_gets_its_own_peak_not_that_of_a_name_it_contains():
    names = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12,
             "NVIDIA H200": 989e12, "NVIDIA H200 NVL": 835e12, "NVIDIA L40S": 362e12, "NVIDIA L40": 181e12,
             "NVIDIA L4": 121e12, "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA A10G": 70e12, "NVIDIA A10": 125e12,
             "NVIDIA GeForce RTX 4090": 165e12, "Tesla T4": 65e12, "NVIDIA B200": 2250e12,
             "NVIDIA GB200": 2500e12, "NVIDIA GeForce GTX 1080": None}
    assert {name: peak_flops_of(name) for name in names} == names


def test_mfu_is_none_without_a_known_peak_and_follows_the_formula():
    model = GPT(tiny_config())
    assert peak_flops("cpu") is None
    assert model.estimate_mfu(1000, 0.1, None) is None
    flops_per_token = 6 * model.get_num_params() + 12 * 2 * 32 * 16
    assert model.estimate_mfu(1000, 0.5, 1e12) == pytest.approx(flops_per_token * 1000 / 0.5 / 1e12)
