"""The LLaMA-era options of GPTConfig, each alone and in combination, and generation with a KV cache."""
import itertools

import pytest
import torch

from model import GPT, GPTConfig, rope_tables, rotate

OPTIONS = dict(pos_emb=["learned", "rope"], norm=["layernorm", "rmsnorm"], mlp=["gelu", "swiglu", "relu2"],
               n_kv_head=[0, 2], qk_norm=[False, True], tie_embeddings=[True, False], bias=[True, False])
COMBINATIONS = [dict(zip(OPTIONS, values)) for values in itertools.product(*OPTIONS.values())]


def config(**overrides) -> GPTConfig:
    return GPTConfig(**{**dict(block_size=16, vocab_size=40, n_layer=2, n_head=4, n_embd=32), **overrides})


def hand_count(c: GPTConfig) -> int:
    """Parameters of a GPTConfig, counted from the architecture's definition, not from the module tree."""
    C, hs = c.n_embd, c.n_embd // c.n_head
    kv = c.n_kv_head or c.n_head
    hidden = c.mlp_hidden or (-(-8 * C // 192) * 64 if c.mlp == "swiglu" else 4 * C)  # 8C/3 up to a multiple of 64
    norm = C * (2 if c.norm == "layernorm" and c.bias else 1)
    attn = C * (c.n_head + 2 * kv) * hs + C * C + (((c.n_head + 2 * kv) * hs + C) if c.bias else 0)
    fc_width = 2 * hidden if c.mlp == "swiglu" else hidden
    mlp = C * fc_width + hidden * C + ((fc_width + C) if c.bias else 0)
    total = c.n_layer * (2 * norm + attn + mlp) + norm + c.vocab_size * C  # blocks, ln_f, token table
    total += c.block_size * C if c.pos_emb == "learned" else 0
    total += 0 if c.tie_embeddings else c.vocab_size * C
    return total


def test_every_combination_runs_forward_and_backward_and_counts_its_parameters():
    for options in COMBINATIONS:
        torch.manual_seed(0)
        c = config(**options)
        model = GPT(c)
        x = torch.randint(40, (3, 16))
        logits, loss = model(x, torch.roll(x, -1, dims=1))
        loss.backward()
        assert logits.shape == (3, 16, 40) and torch.isfinite(loss), options
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters()), options
        assert model.get_num_params(non_embedding=False) == hand_count(c), options
        lookups = (c.block_size * c.n_embd if c.pos_emb == "learned" else 0) + (0 if c.tie_embeddings else 40 * 32)
        assert model.get_num_params() == hand_count(c) - lookups, options


def test_swiglu_width_follows_the_usual_rule_and_can_be_set():
    assert GPTConfig(n_embd=768, n_head=12, mlp="swiglu").hidden == 2048  # 8/3 * 768 = 2048 exactly
    assert GPTConfig(n_embd=2048, n_head=32, mlp="swiglu").hidden == 5504  # 5461.3 rounded up to a multiple of 64
    assert GPTConfig(n_embd=128, n_head=4, mlp="swiglu", mlp_hidden=300).hidden == 300
    assert GPTConfig(n_embd=128, n_head=4).hidden == 512


def test_settings_that_make_the_same_model_are_one_shape_to_a_resume_or_a_start():
    """n_kv_head = n_head, mlp_hidden at its default width and rope_theta with learned positions build the model
    their defaults build: a resume or a start from the model (its export reads them back as 0) takes them."""
    import dataclasses

    from checkpoint import check_same_shape
    from common import UserError
    saved = dataclasses.asdict(config(mlp="swiglu", n_embd=128))  # 4 heads, n_kv_head 0, mlp_hidden 0: 384 wide
    defaults = dataclasses.asdict(GPTConfig())
    for same in (dict(n_kv_head=4), dict(mlp_hidden=384), dict(rope_theta=5e5), dict(n_kv_head=4, mlp_hidden=384)):
        check_same_shape(saved, {**defaults, **saved, **same}, defaults, given=set(same))
        check_same_shape(saved, {**defaults, **saved, **same}, defaults, "export", given=set(same))
    for other in (dict(n_kv_head=2), dict(mlp_hidden=320), dict(mlp_hidden=384, mlp="gelu")):
        with pytest.raises(UserError, match="another model shape: " + ".*".join(f"{k}=" for k in sorted(other))):
            check_same_shape(saved, {**defaults, **saved, **other}, defaults, given=set(other))
    gqa = {**saved, "n_kv_head": 2}  # a setting given as the model has it is no clash, whatever else is
    with pytest.raises(UserError, match=r"another model shape: n_head=2 \(checkpoint: 4\); give the checkpoint's "
                                        r"\(--n_head=4\)"):
        check_same_shape(gqa, {**defaults, **gqa, "n_head": 2}, defaults, given={"n_head", "n_kv_head"})
    rotary = {**saved, "pos_emb": "rope"}  # where positions are rotary, their base is the model's
    with pytest.raises(UserError, match=r"another shape: rope_theta=500000.0 \(export: 10000.0\)"):
        check_same_shape(rotary, {**defaults, **rotary, "rope_theta": 5e5}, defaults, "export", given={"rope_theta"})


def test_rotary_scores_depend_only_on_the_offset_between_positions():
    c = config(pos_emb="rope")
    cos, sin = rope_tables(c, 64)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
    cos, sin = cos.double(), sin.double()

    def score(m, n):
        return (rotate(q, cos[m], sin[m]) * rotate(k, cos[n], sin[n])).sum().item()
    assert score(5, 2) == pytest.approx(score(40, 37), abs=1e-6) == pytest.approx(score(3, 0), abs=1e-6)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)  # another offset, another score


def test_gqa_with_as_many_kv_heads_as_heads_is_plain_attention():
    torch.manual_seed(0)
    plain = GPT(config())
    same = GPT(config(n_kv_head=4))
    same.load_state_dict(plain.state_dict())
    x = torch.randint(40, (2, 16))
    assert torch.equal(plain(x, x)[0], same(x, x)[0])


def test_gqa_shares_each_kv_head_among_its_group():
    torch.manual_seed(0)
    grouped = GPT(config(n_kv_head=2))
    full = GPT(config())  # four kv heads: heads 0,1 copy kv head 0 and heads 2,3 copy kv head 1
    state = grouped.state_dict()
    hs, C = 8, 32
    for i in range(2):
        w = state[f"transformer.h.{i}.attn.c_attn.weight"]
        b = state[f"transformer.h.{i}.attn.c_attn.bias"]
        q, k, v = w.split([C, 2 * hs, 2 * hs])
        qb, kb, vb = b.split([C, 2 * hs, 2 * hs])
        widen = lambda t: t.view(2, hs, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(4 * hs, *t.shape[1:])  # noqa: E731
        state[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat([q, widen(k), widen(v)])
        state[f"transformer.h.{i}.attn.c_attn.bias"] = torch.cat([qb, widen(kb), widen(vb)])
    full.load_state_dict(state)
    x = torch.randint(40, (2, 16))
    assert torch.allclose(grouped(x, x)[0], full(x, x)[0], atol=1e-6)


def test_defaults_are_gpt2_module_for_module():
    names = [n for n, _ in GPT(config()).named_parameters()]
    assert "transformer.wpe.weight" in names and "lm_head.weight" not in names  # tied: listed once, as wte
    assert names[:3] == ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight"]
    assert not [n for n, _ in GPT(config()).named_buffers()]


@pytest.mark.parametrize("options", [{}, dict(pos_emb="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, qk_norm=True,
                                              tie_embeddings=False, bias=False)], ids=["gpt2", "llama"])
@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (0.9, 1.0), (0.9, 0.8)])
def test_kv_cache_generation_gives_the_tokens_of_the_cache_free_path(options, temperature, top_p):
    torch.manual_seed(0)
    model = GPT(config(**options)).eval()
    prompt = torch.randint(40, (3, 5))  # a batch of 3; 30 new tokens go past block_size 16
    out = [model.generate(prompt, 30, temperature=temperature, top_k=20, use_cache=use_cache, top_p=top_p,
                          generator=torch.Generator().manual_seed(7)) for use_cache in (True, False)]
    assert out[0].shape == (3, 35) and torch.equal(out[0], out[1])


def test_nucleus_keeps_the_fewest_most_likely_tokens_that_reach_top_p():
    from model import nucleus
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3], [0.1, 0.4, 0.2, 0.3]])
    kept = lambda top_p: torch.isfinite(nucleus(probs.log(), top_p)).tolist()  # noqa: E731
    assert kept(0.75) == [[False, True, False, True], [False, True, True, True]]  # 0.5 + 0.3; 0.4 + 0.3 + 0.2
    assert kept(0.85) == [[False, True, True, True], [False, True, True, True]]
    assert kept(1e-9) == [[False, True, False, False], [False, True, False, False]]  # the most likely, never none
    assert all(all(row) for row in kept(1.0))


def test_a_small_top_p_samples_as_greedy_decoding_does():
    torch.manual_seed(0)
    model = GPT(config(pos_emb="rope")).eval()
    prompt = torch.randint(40, (3, 5))
    greedy = model.generate(prompt, 12, temperature=0.0)
    assert torch.equal(model.generate(prompt, 12, top_p=1e-6, generator=torch.Generator().manual_seed(3)), greedy)
    assert not torch.equal(model.generate(prompt, 12, top_p=0.95, generator=torch.Generator().manual_seed(3)), greedy)


def test_generation_compiles_whole_under_dynamic_shapes_as_sample_py_compiles_it():
    """sample.py compiles forward with dynamic=True; an is_causal that depended on a tensor size became a symbolic
    bool there, which attention refuses, so every call fell back to eager. fullgraph=True fails on any break."""
    torch.manual_seed(0)
    model = GPT(config(pos_emb="rope", n_kv_head=2)).eval()
    prompt = torch.randint(40, (2, 5))
    eager = model.generate(prompt, 12, generator=torch.Generator().manual_seed(7))
    model.forward = torch.compile(model.forward, dynamic=True, fullgraph=True, backend="eager")  # dynamo's tracing only
    assert torch.equal(model.generate(prompt, 12, generator=torch.Generator().manual_seed(7)), eager)


def test_kv_cache_logits_match_a_full_forward():
    torch.manual_seed(0)
    model = GPT(config(pos_emb="rope", n_kv_head=2)).eval()
    x = torch.randint(40, (2, 12))
    cache = [{} for _ in model.transformer.h]
    with torch.no_grad():
        model(x[:, :8], kv_cache=cache)
        stepped = [model(x[:, t:t + 1], kv_cache=cache)[0][:, -1] for t in range(8, 12)]
        full = [model(x[:, :t + 1])[0][:, -1] for t in range(8, 12)]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(stepped, full))
    assert cache[0]["k"].shape == (2, 2, 12, 8)  # n_kv_head keys per position are kept, not n_head


def test_generation_samples_only_ids_the_tokenizer_decodes():
    """A vocabulary padded past the tokenizer's (GPT-2's 50257 to 50304) has rows that decode to nothing."""
    from dataset import model_vocab_size
    assert model_vocab_size(50257, {"tokenizer": "gpt2", "chars": None}) == 50304
    assert model_vocab_size(None, {"tokenizer": None, "chars": None}) == 50304  # nanoGPT's folders without meta
    assert model_vocab_size(65, {"tokenizer": "char", "chars": "x" * 65}) == 65  # characters as they are
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=128)).eval()
    prompt = torch.zeros(4, 1, dtype=torch.long)
    for use_cache in (True, False):
        free = model.generate(prompt, 60, generator=torch.Generator().manual_seed(0), use_cache=use_cache)
        held = model.generate(prompt, 60, generator=torch.Generator().manual_seed(0), use_cache=use_cache, n_tokens=65)
        assert free.max() >= 65 and held.max() < 65  # an untrained model puts half its mass past 65
        assert model.generate(prompt, 20, temperature=0, use_cache=use_cache, n_tokens=65).max() < 65


def test_generation_refuses_arguments_it_cannot_honour_by_name():
    model = GPT(config(pos_emb="rope")).eval()
    prompt = torch.zeros(2, 3, dtype=torch.long)
    for kwargs, named in ((dict(top_k=0), "top_k 0"), (dict(top_k=-1), "top_k -1"), (dict(n_tokens=0), "n_tokens 0"),
                          (dict(temperature=-1.0), "temperature -1.0"),
                          (dict(temperature=float("nan")), "temperature nan"), (dict(top_p=0.0), "top_p 0.0"),
                          (dict(top_p=1.5), "top_p 1.5"), (dict(top_p=float("nan")), "top_p nan"),
                          (dict(max_new_tokens=-1), "max_new_tokens -1"), (dict(idx=prompt[:, :0]), "prompt length 0"),
                          (dict(idx=prompt[0]), r"idx of shape \(3,\)"), (dict(idx=prompt[0, 0]), r"idx of shape \(\)")):
        with pytest.raises(ValueError, match=rf"^generate got {named}: it takes idx of shape \(B, T\)"):
            model.generate(**{"idx": prompt, "max_new_tokens": 2, **kwargs})
    assert model.generate(prompt, 0).equal(prompt)
    assert model.generate(prompt, 2, top_k=1).shape == (2, 5)
