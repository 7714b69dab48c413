"""Each speed setting against the plain path it replaces: the same numbers, on the CPU."""
import copy

import pytest
import torch

from model import GPT, GPTConfig
from optimizers import nonfinite_flag, skips_on_device, take_step


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=2, n_embd=32, bias=False))


def test_skipping_on_the_device_skips_exactly_the_steps_the_host_check_skips():
    models = [tiny_gpt(), tiny_gpt()]
    optimizers = [m.configure_optimizers(0.1, 1e-2, (0.9, 0.95), "cpu") for m in models]
    assert all(skips_on_device(o) for o in optimizers)  # fused AdamW on the CPU
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    poisoned = {2: "loss", 5: "grad", 6: "grad"}  # steps whose loss or gradient is made non-finite
    generator = torch.Generator().manual_seed(1)
    for step in range(9):
        x = torch.randint(37, (4, 16), generator=generator)
        y = torch.randint(37, (4, 16), generator=generator)
        before = [copy.deepcopy(m.state_dict()) for m in models]
        for model, optimizer, on_device in zip(models, optimizers, (False, True)):
            _, loss = model(x, y)
            loss.backward()
            if poisoned.get(step) == "grad":
                model.transformer.h[0].mlp.c_fc.weight.grad[0, 0] = float("inf")
            loss_sum = loss.detach() * (float("nan") if poisoned.get(step) == "loss" else 1.0)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            skip = nonfinite_flag(loss_sum, grad_norm, loss_scaling=False, distributed=False)
            assert skip.item() == (step in poisoned)
            take_step(optimizer, scaler, skip, on_device=on_device)
        host, device = (m.state_dict() for m in models)
        assert all(torch.equal(host[k], device[k]) for k in host), f"step {step}"
        if step in poisoned:  # a skipped step leaves the weights as they were
            assert all(torch.equal(before[1][k], device[k]) for k in device)
    states = [o.state_dict()["state"] for o in optimizers]
    for i in states[0]:
        assert all(torch.equal(states[0][i][k], states[1][i][k]) for k in states[0][i])
        assert states[1][i]["step"].item() == 9 - len(poisoned)  # skipped steps are not counted by Adam


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_cross_entropy_equals_f_cross_entropy_in_value_and_gradient(chunk):
    torch.manual_seed(0)
    h = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(29, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(29, (50,))
    targets[[3, 17, 40]] = -1  # ignored positions
    reference = torch.nn.functional.cross_entropy(h @ weight.t(), targets, ignore_index=-1)
    reference.backward()
    expected = (reference.detach(), h.grad.clone(), weight.grad.clone())
    h.grad, weight.grad = None, None
    from model import ChunkedCrossEntropy
    loss = ChunkedCrossEntropy.apply(h, weight, targets, chunk)
    (loss * 3).backward()  # an upstream gradient other than 1
    assert torch.allclose(loss, expected[0], rtol=1e-12, atol=1e-12)
    assert torch.allclose(h.grad, 3 * expected[1], rtol=1e-10, atol=1e-12)
    assert torch.allclose(weight.grad, 3 * expected[2], rtol=1e-10, atol=1e-12)


def test_a_model_with_a_chunked_loss_trains_like_the_plain_one():
    plain, chunked = tiny_gpt(), tiny_gpt()
    chunked.config.loss_chunk = 24
    x, y = torch.randint(37, (4, 16), generator=torch.Generator().manual_seed(2)), None
    y = torch.roll(x, -1, dims=1)
    for model in (plain, chunked):
        _, loss = model(x, y)
        loss.backward()
        model.loss = loss.item()
    assert chunked.loss == pytest.approx(plain.loss, rel=1e-6)
    for (name, a), b in zip(plain.named_parameters(), chunked.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6), name
    with torch.autocast("cpu", dtype=torch.bfloat16):  # in bf16 the matmuls round alike; the softmax is fp32 in both
        _, loss_plain = plain(x, y)
        _, loss_chunked = chunked(x, y)
    assert loss_chunked.item() == pytest.approx(loss_plain.item(), rel=2e-2)


def test_preferring_an_attention_kernel_changes_no_number_and_reaches_the_compiled_graph():
    """On a CPU attention_kernel changes nothing: the same loss and gradients, eager and compiled. torch.compile
    must bake it into the graph (tests/test_cuda.py checks on a GPU that the kernel asked for then runs), so a model
    that prefers one gets a graph of its own that sets the kernels around attention and puts torch's back after."""
    models = [tiny_gpt(), tiny_gpt(), tiny_gpt()]
    models[1].prefer_attention("flash")
    models[2].prefer_attention("cudnn")
    tokens = torch.randint(37, (4, 17), generator=torch.Generator().manual_seed(2))
    x, y = tokens[:, :-1], tokens[:, 1:]
    order = torch._C._get_sdp_priority_order()
    graphs = []

    def record(gm, inputs):  # a torch.compile backend that keeps the graph's calls and runs it as traced
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward
    for run in (lambda m: m, lambda m: torch.compile(m, backend=record, fullgraph=True)):
        losses, grads = [], []
        for model in models:
            model.zero_grad(set_to_none=True)
            _, loss = run(model)(x, y)
            loss.backward()
            losses.append(loss)
            grads.append([p.grad for p in model.parameters()])
        assert all(torch.equal(losses[0], loss) for loss in losses[1:])
        assert all(torch.equal(a, b) for other in grads[1:] for a, b in zip(grads[0], other))
    assert [sum("sdpa_kernel" in call for call in graph) for graph in graphs] == [0, 4, 4]  # set and reset, 2 layers
    assert torch._C._get_sdp_priority_order() == order and torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.parametrize("fast_path", ["loss_chunk", "fp8"])
def test_the_chunked_loss_and_fp8_compile_whole_under_autocast(fast_path):
    """Both turn autocast off inside and cast by hand (model.no_autocast, compute_dtype). Under torch 2.11,
    asking torch.amp.is_autocast_available there broke the graph at every fp8 matmul and left the chunked loss
    eager (torch 2.13 traces it, so run this under 2.11 to see it fail). fullgraph=True fails on any break."""
    from fp8 import use_fp8
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=128, n_layer=2, n_head=2, n_embd=64, bias=False,
                          loss_chunk=48 if fast_path == "loss_chunk" else 0))
    if fast_path == "fp8":
        use_fp8(model, 4 * 32)
    x = torch.randint(128, (4, 32), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # dynamo's tracing only
    losses = []
    for run in (model, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(x, x)[1]
        loss.backward()
        losses.append(loss.detach())
    assert torch.isfinite(losses[1]) and torch.allclose(losses[0], losses[1])
