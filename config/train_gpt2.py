# GPT-2 124M on OpenWebText: about 4 days on 8 A100 40GB to reach a val loss of about 2.85 (nanoGPT's figure
# for this config; not yet measured here).
# First run: python data/openwebtext/prepare.py (it needs `pip install datasets`)
# Launch: torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py

wandb_log = True
wandb_project = "owt"
wandb_run_name = "gpt2-124M"

# 12 sequences x 1024 tokens x 40 micro-steps = 491,520 tokens per step (about GPT-2's 0.5M),
# whatever the number of GPUs (one that divides 40): the micro-steps are split among them
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

# 600,000 steps x 0.5M tokens = about 300B tokens
max_iters = 600000
lr_decay_iters = 600000

eval_interval = 1000
eval_iters = 200
log_interval = 10

weight_decay = 1e-1
