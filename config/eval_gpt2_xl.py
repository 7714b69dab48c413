# Evaluate OpenAI's gpt2-xl (1558M parameters) on OpenWebText: one evaluation, no training, written
# to out-eval-gpt2-xl/eval.json (each size its own folder, so their results sit side by side).
# Needs Hugging Face transformers and the weights (downloaded once); eval_iters x batch_size x 1024 tokens
# per split, so about 4.1M tokens (500 x 8 x 1024): minutes on one GPU.
# First run: python data/openwebtext/prepare.py (it needs `pip install datasets`).
# Run with train.py (its eval_only mode; eval.py scores HellaSwag): python train.py config/eval_gpt2_xl.py
batch_size = 8
eval_iters = 500  # more batches give a tighter estimate
eval_only = True
out_dir = "out-eval-gpt2-xl"
wandb_log = False
init_from = "gpt2-xl"
