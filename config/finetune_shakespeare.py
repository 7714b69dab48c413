# Finetune GPT-2 XL (1.5B) on tiny Shakespeare in GPT-2 BPE tokens: a few minutes on one A100.
# First run: python data/shakespeare/prepare.py
# Needs Hugging Face transformers and the GPT-2 weights (downloaded once, or a local directory in init_from).

out_dir = "out-shakespeare"
eval_interval = 5
eval_iters = 40
wandb_log = False
wandb_project = "shakespeare"
wandb_run_name = "ft-gpt2-xl"

dataset = "shakespeare"
init_from = "gpt2-xl"  # the largest GPT-2; gpt2 (124M) is the quick one

always_save_checkpoint = False  # write ckpt.pt when val loss improves and at the last eval; best.pt keeps the best

# 1 sequence x 32 micro-steps x 1024 tokens = 32,768 tokens per step; tiny Shakespeare is about 300K tokens,
# so one epoch is about 9 steps
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

# finetune at a small constant learning rate
learning_rate = 3e-5
decay_lr = False
