"""The CUDA paths: bf16 autocast, torch.compile with triton, fused AdamW, pinned batches read ahead, fp16 loss
scaling, checkpoints on a GPU, nccl. Skipped without a GPU; the GPU suite (scripts/gpu_suite.py) runs them."""
import os

import pytest
import torch

from conftest import load_module, made_up_text, read_metrics, run_script, step_losses, tiny_args
from common import peak_flops
from model import GPT, GPTConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory):
    """A character dataset of made-up words, written here so the test needs no download."""
    out_dir = str(tmp_path_factory.mktemp("gpu_chars"))
    load_module("data/shakespeare_char/prepare.py").prepare(made_up_text(0, 300, 8, 60_000), out_dir)
    return out_dir


def gpu_args(data_dir, out_dir, **overrides):
    """tiny_args on the GPU in bf16, a little wider, with dropout."""
    return tiny_args(data_dir, out_dir, **{**dict(device="cuda", dtype="bfloat16", n_head=4, n_embd=128, block_size=64,
                                                 batch_size=16, eval_interval=10, max_iters=20, lr_decay_iters=40,
                                                 dropout=0.1), **overrides})


def test_peak_flops_are_known_for_this_gpu():
    assert peak_flops("cuda") is not None, torch.cuda.get_device_name()


def test_pinned_batches_on_the_gpu_equal_the_cpu_ones(gpu_data):
    from dataset import get_batch, load_dataset
    data = load_dataset(gpu_data, 64)
    for step in range(3):
        x_cpu, y_cpu = get_batch(data["splits"]["train"], data["dtype"], 8, 64, (0, 0, step, 0), "cpu")
        x_gpu, y_gpu = get_batch(data["splits"]["train"], data["dtype"], 8, 64, (0, 0, step, 0), "cuda")
        assert x_gpu.is_cuda and torch.equal(x_gpu.cpu(), x_cpu) and torch.equal(y_gpu.cpu(), y_cpu)


def test_batches_read_ahead_in_pinned_memory_reach_the_gpu_as_the_cpu_reads_them(gpu_data):
    from dataset import Prefetcher, get_batch, load_dataset, read_batch
    data = load_dataset(gpu_data, 64)
    keys = [(0, 0, step, m) for step in range(4) for m in range(2)]
    batches = Prefetcher(lambda key: read_batch(data["splits"]["train"], data["dtype"], 8, 64, key, pin=True), keys, 3,
                         "cuda:0")  # a device index: the threads set it before pinning
    for key, (x, y) in zip(keys, batches):
        x_cpu, y_cpu = get_batch(data["splits"]["train"], data["dtype"], 8, 64, key, "cpu")
        assert x.is_cuda and torch.equal(x.cpu(), x_cpu) and torch.equal(y.cpu(), y_cpu)
    batches.close()


def test_bf16_compiled_model_matches_eager_and_learns_with_fused_adamw():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=128, bias=False)).cuda()
    tokens = torch.randint(256, (8, 65), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]
    compiled = torch.compile(model)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, eager_loss = model(x, y)
        _, compiled_loss = compiled(x, y)
    assert abs(eager_loss.item() - compiled_loss.item()) < 2e-2  # bf16 rounding, fused differently
    optimizer = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cuda")
    assert optimizer.defaults["fused"]
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = compiled(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert loss.item() < eager_loss.item() - 2.0  # memorising one batch


def test_attention_kernel_flash_and_cudnn_run_their_kernels_compiled_with_the_same_numbers():
    """attention_kernel='flash' and 'cudnn' (GPT.prefer_attention): compiled, in bf16, each runs its kernel (cuDNN's
    where the GPU has it: sm90+ here), with the same loss and gradients to bf16 rounding."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=128, vocab_size=256, n_layer=2, n_head=4, n_embd=256, bias=False)
    models = {"flash": GPT(config).cuda(), "cudnn": GPT(config).cuda()}
    models["cudnn"].load_state_dict(models["flash"].state_dict())
    tokens = torch.randint(256, (8, 129), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]
    losses, grads, ops = {}, {}, {}
    for kernel, model in models.items():
        model.prefer_attention(kernel)
        compiled = torch.compile(model)

        def step():
            model.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = compiled(x, y)
            loss.backward()
            return loss
        step()  # compiles
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            losses[kernel] = step().item()
        grads[kernel] = [p.grad.float() for p in model.parameters()]
        ops[kernel] = sorted({event.name for event in prof.events() if "attention" in event.name})
    assert "aten::_scaled_dot_product_flash_attention" in ops["flash"] and not any("cudnn" in op for op in ops["flash"]), ops
    if torch.cuda.get_device_capability() >= (9, 0):
        assert "aten::_scaled_dot_product_cudnn_attention" in ops["cudnn"], ops
    assert abs(losses["flash"] - losses["cudnn"]) < 2e-2
    assert all((a - b).norm() <= 0.05 * a.norm() + 1e-6 for a, b in zip(grads["flash"], grads["cudnn"]))


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 matmuls need compute capability 8.9+")
def test_fp8_compiled_training_on_the_gpu_follows_bf16(gpu_data, tmp_path):
    """fp8 (fp8.py) in hardware, compiled, through train.py: its losses stay near the bf16 run's."""
    losses = {}
    for fp8 in (False, True):
        out = tmp_path / f"fp8_{fp8}"
        result = run_script("train.py", *gpu_args(gpu_data, out, compile=True, dropout=0.0, fp8=fp8, max_iters=40,
                                                  eval_interval=40), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        losses[fp8] = step_losses(read_metrics(out))
    assert sorted(losses[True]) == list(range(1, 41))
    assert all(abs(losses[True][i] - losses[False][i]) < 0.1 * losses[False][i] for i in losses[False])
    first, last = [losses[True][i] for i in range(1, 6)], [losses[True][i] for i in range(36, 41)]
    assert sum(last) / 5 < sum(first) / 5 - 0.15  # it learns, as bf16 does in the test below


def test_a_checkpoint_of_an_unfused_adamw_resumes_into_a_fused_one():
    """A checkpoint from MPS (no fused AdamW) resumed on CUDA: torch places each step count by the fused flag it
    loads, and the fused kernel wants them on the GPU, so the run's flag must be in place before the load."""
    from checkpoint import restore_training_state, training_state
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64)).cuda()
    idx = torch.randint(64, (2, 16), device="cuda")
    saved = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "mps")  # fused=False, as on MPS
    model(idx, idx)[1].backward()
    saved.step()
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    checkpoint = training_state(model.state_dict(), saved.state_dict(), scaler, {}, {},
                                dict(iter_num=1, tokens=32, best_val_loss=9.0, best_iter=0, nonfinite_streak=0), [], None, True, {}, {}, "out")
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cuda")
    restore_training_state(checkpoint, "ckpt.pt", model, optimizer, scaler, 0, 1, "cuda")
    assert all(g["fused"] for g in optimizer.param_groups)
    assert all(s["step"].is_cuda for s in optimizer.state.values())
    model(idx, idx)[1].backward()
    optimizer.step()


def test_resume_on_the_gpu_continues_an_unbroken_run(gpu_data, tmp_path):
    straight, broken = str(tmp_path / "straight"), str(tmp_path / "broken")
    result = run_script("train.py", *gpu_args(gpu_data, straight), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert run_script("train.py", *gpu_args(gpu_data, broken, max_iters=10), cwd=str(tmp_path)).returncode == 0
    resumed = run_script("train.py", *gpu_args(gpu_data, broken, init_from="resume"), cwd=str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
    expected, got = step_losses(read_metrics(straight)), step_losses(read_metrics(broken))
    assert [got[i] for i in range(11, 21)] == [expected[i] for i in range(11, 21)]


def test_compiled_bf16_training_run_on_the_gpu(gpu_data, tmp_path):
    out = str(tmp_path / "out")
    result = run_script("train.py", *gpu_args(gpu_data, out, compile=True, max_iters=40, eval_interval=40),
                        cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "compiling the model" in result.stdout and "warning" not in result.stderr
    losses = step_losses(read_metrics(out))
    first, last = [losses[i] for i in range(1, 6)], [losses[i] for i in range(36, 41)]
    assert sum(last) / 5 < sum(first) / 5 - 0.15  # on an H100 (deterministic): 3.215 for steps 1-5, 2.971 for 36-40
    state = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["model"]
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in state)


def test_fp16_on_the_gpu_trains_through_the_grad_scaler(gpu_data, tmp_path):
    out = str(tmp_path / "out")
    result = run_script("train.py", *gpu_args(gpu_data, out, dtype="float16"), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    losses = step_losses(read_metrics(out))
    assert losses[20] < losses[1]
    scaler = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)["scaler"]
    assert scaler["scale"] > 1.0  # a live GradScaler, checkpointed


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpu_ddp_over_nccl_matches_one_gpu(gpu_data, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    args = dict(dtype="float32", max_iters=10, gradient_accumulation_steps=4, dropout=0.0)
    assert run_script("train.py", *gpu_args(gpu_data, one, **args), cwd=str(tmp_path)).returncode == 0
    result = run_script("train.py", *gpu_args(gpu_data, two, **args), cwd=str(tmp_path), torchrun_procs=2)
    assert result.returncode == 0, result.stderr
    a, b = step_losses(read_metrics(one)), step_losses(read_metrics(two))
    for i in a:
        assert b[i] == pytest.approx(a[i], abs=1e-3), i


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_run_on_the_second_gpu_resumes_exactly(gpu_data, tmp_path):
    """--device=cuda:1 in one process: its CUDA RNG state (dropout) is GPU 1's, so the resume is exact."""
    straight, broken = str(tmp_path / "straight"), str(tmp_path / "broken")
    args = dict(device="cuda:1", dtype="float32", max_iters=20)
    assert run_script("train.py", *gpu_args(gpu_data, straight, **args), cwd=str(tmp_path)).returncode == 0
    assert run_script("train.py", *gpu_args(gpu_data, broken, **dict(args, max_iters=10)), cwd=str(tmp_path)).returncode == 0
    assert run_script("train.py", *gpu_args(gpu_data, broken, **dict(args, init_from="resume")),
                      cwd=str(tmp_path)).returncode == 0
    a, b = step_losses(read_metrics(straight)), step_losses(read_metrics(broken))
    assert a == b


@pytest.mark.parametrize("mlp", ["gelu", "relu2", "swiglu"])
def test_the_mlp_hidden_activation_stays_16_bit_under_autocast(mlp):
    """CUDA's autocast runs some ops (pow among them) in fp32: a hidden activation made by one would be twice the
    memory the plan counts."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=16, vocab_size=65, mlp=mlp)).cuda()
    seen = []
    model.transformer.h[0].mlp.c_proj.register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(torch.randint(65, (2, 16), device="cuda"))
    assert seen == [torch.bfloat16]
