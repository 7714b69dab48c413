# A LLaMA-style 1.4B model on OpenWebText: the shape of the simple_llama walkthrough's 1.3B model (24 layers,
# 2048 wide, 32 heads of 64, rotary positions, SwiGLU), with RMSNorm, no biases and an untied output layer;
# its GPT-2 vocabulary (50304, padded) makes it 1.42B parameters, 1.21B of them in the blocks.
# First run: python data/openwebtext/prepare.py (it needs `pip install datasets`). On 8 GPUs of 80 GB:
#   torchrun --standalone --nproc_per_node=8 train.py config/train_llama_1b.py
#
# Estimates, not yet measured. Memory, from the memory plan (the torchrun command above with `--dry_run=True`
# prints it on the GPUs; with compile, as here): weights, gradients and AdamW state in fp32 take 16 bytes per
# parameter, 22.7 GB on every GPU under DDP (which replicates them), DDP's gradient buckets 5.7 GB, autocast's
# bf16 copies of the weights 2.6 GB, and the activations of one 8 x 2048 micro-batch in bf16 50.0 GB: 81.1 GB
# (75.5 GiB) per GPU, which fits an 80 GB GPU (79.6 GiB) with little room; without compile the plan is 80.1
# GiB, more than such a GPU holds. With less memory: --batch_size=4 --gradient_accumulation_steps=64 (the same
# tokens per step) plans 56.1 GB, or, at batch 8, --parallelism=fsdp 53.9 GB (60.7 GB with
# --fsdp_reduce=step, which holds gradients whole between micro-steps). Speed: 9.1 GFLOPs a token
# (model.flops_per_token), so at 40% MFU on an H100 (989 TFLOP/s bf16) one GPU does about 43,000 tokens/s and
# 8 about 350,000: 45B tokens in about 36 hours.

out_dir = "out-llama-1b"
eval_interval = 1000
eval_iters = 96  # under FSDP every process evaluates as many batches: a multiple of 8 (and of 16 and 32)
log_interval = 10
wandb_log = False
wandb_project = "owt"
wandb_run_name = "llama-1b"

dataset = "openwebtext"
# 8 sequences x 2048 tokens x 32 micro-steps (4 per GPU on 8 GPUs) = 524,288 tokens per step
batch_size = 8
block_size = 2048
gradient_accumulation_steps = 32

n_layer = 24
n_head = 32
n_embd = 2048
dropout = 0.0
bias = False
pos_emb = "rope"
norm = "rmsnorm"
mlp = "swiglu"  # hidden width 5504: 8/3 * 2048 rounded up to a multiple of 64
tie_embeddings = False

# 45B tokens / 524,288 per step = about 86,000 steps
learning_rate = 3e-4
max_iters = 86000
lr_decay_iters = 86000
min_lr = 3e-5
warmup_iters = 2000
weight_decay = 0.1
beta2 = 0.95
