"""Muon (optimizers.py): the orthogonalisation, the parameter split, its AdamW half against torch's AdamW."""
import pytest
import torch

from model import GPT, GPTConfig
from optimizers import Muon, build_optimizer, muon_groups, orthogonalize


# not square: a square random matrix has singular values near 0, which 5 steps leave small (Muon's known trade;
# its update then still points along the exact orthogonal factor)
@pytest.mark.parametrize("shape", [(96, 32), (32, 96), (128, 48)])
def test_orthogonalize_leaves_singular_values_near_one_and_keeps_the_singular_vectors(shape):
    torch.manual_seed(0)
    G = torch.randn(*shape) * 1e-3  # a gradient's scale: the iteration normalises first
    O = orthogonalize(G)
    s = torch.linalg.svdvals(O)
    assert s.min() > 0.6 and s.max() < 1.25  # the quintic's band, not exactly 1: that is its trade for speed
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    polar = U @ Vh  # the exact orthogonal factor
    assert (O * polar).sum() / (O.norm() * polar.norm()) > 0.98
    assert torch.linalg.svdvals(G).max() / torch.linalg.svdvals(G).min() > 2  # the input was far from orthogonal


def tiny(**arch) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50, **arch))


@pytest.mark.parametrize("tied", [True, False])
def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(tied):
    model = tiny(tie_embeddings=tied)
    muon, decayed, plain = muon_groups(model, 0.1, 1e-3, 0.02)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in muon["params"]) == sorted(
        n for n, p in model.named_parameters() if n.startswith("transformer.h.") and p.dim() == 2)
    assert {names[id(p)] for p in decayed["params"]} == {"transformer.wte.weight", "transformer.wpe.weight",
                                                          *(() if tied else ("lm_head.weight",))}
    assert all(p.dim() == 1 for p in plain["params"]) and plain["weight_decay"] == 0.0
    assert len(muon["params"]) + len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))
    assert muon["muon"] and muon["lr_scale"] == pytest.approx(20.0)


def test_the_adamw_half_follows_torch_adamw_step_for_step():
    torch.manual_seed(0)
    start = [torch.randn(16, 8), torch.randn(8)]
    ours_params, theirs_params = ([torch.nn.Parameter(t.clone()) for t in start] for _ in range(2))
    groups = lambda ps: [dict(params=[ps[0]], weight_decay=0.1), dict(params=[ps[1]], weight_decay=0.0)]
    ours = Muon(groups(ours_params), lr=1e-2, betas=(0.9, 0.95))
    theirs = torch.optim.AdamW(groups(theirs_params), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for _ in range(5):  # the same gradients for both, so only the update rule can tell them apart
        grads = [torch.randn_like(t) for t in start]
        for params, opt in ((ours_params, ours), (theirs_params, theirs)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for p, q in zip(ours_params, theirs_params):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert not torch.equal(ours_params[0], start[0])


def test_muon_steps_move_each_matrix_by_its_orthogonalised_nesterov_momentum():
    model = tiny()
    m = 0.8  # not the default 0.95: the setting must reach the optimizer
    opt = build_optimizer(model, "muon", 0.0, 1e-3, (0.9, 0.95), 0.02, m, "cpu")
    w = model.transformer.h[0].mlp.c_fc.weight  # (128, 32): tall, so the step is scaled by sqrt(128 / 32)
    expected, buf = w.detach().clone(), torch.zeros_like(w)
    for step in range(3):
        tokens = torch.randint(50, (4, 17), generator=torch.Generator().manual_seed(step))
        model(tokens[:, :-1], tokens[:, 1:])[1].backward()
        grad = w.grad.clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        # by hand: the buffer is the gradients' moving average, the update looks one momentum step ahead
        buf = m * buf + (1 - m) * grad
        expected -= 0.02 * 2.0 * orthogonalize((1 - m) * grad + m * buf)
        torch.testing.assert_close(w.detach(), expected, rtol=1e-4, atol=1e-6)


def test_muon_state_round_trips_through_state_dict():
    model = tiny()
    opt = build_optimizer(model, "muon", 0.1, 1e-3, (0.9, 0.95), 0.02, 0.95, "cpu")
    model(torch.randint(50, (4, 16)), torch.randint(50, (4, 16)))[1].backward()
    opt.step()
    again = build_optimizer(model, "muon", 0.1, 1e-3, (0.9, 0.95), 0.02, 0.95, "cpu")
    again.load_state_dict(opt.state_dict())
    w = model.transformer.h[1].attn.c_attn.weight
    assert torch.equal(again.state[w]["momentum_buffer"], opt.state[w]["momentum_buffer"])
    assert again.param_groups[0]["muon"] and again.param_groups[0]["lr_scale"] == opt.param_groups[0]["lr_scale"]
