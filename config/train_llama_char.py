# A small LLaMA-style model on tiny Shakespeare characters: rotary positions, RMSNorm, SwiGLU, grouped-query
# attention (4 query heads sharing 2 key/value heads), no biases, an untied output layer. Its size, steps
# and tokens per step are those of the README's GPT-2-style CPU command, so the two val losses compare;
# it trains on a CPU in a few minutes. First run: python data/shakespeare_char/prepare.py
#   python train.py config/train_llama_char.py
# On a GPU, scale it up like config/train_shakespeare_char.py, e.g. --device=cuda --compile=True
#   --n_layer=6 --n_head=6 --n_kv_head=2 --n_embd=384 --block_size=256 --batch_size=64 --dropout=0.2
#   --max_iters=5000 --lr_decay_iters=5000 --eval_iters=200 (scripts/gpu_suite.py runs it so, for 2000 steps)

out_dir = "out-llama-char"
eval_interval = 250
eval_iters = 20
log_interval = 10
always_save_checkpoint = False

wandb_log = False
wandb_project = "shakespeare-char"
wandb_run_name = "llama-char"

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 12
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
pos_emb = "rope"
norm = "rmsnorm"
mlp = "swiglu"  # hidden width 384: 8/3 * 128 rounded up to a multiple of 64
n_kv_head = 2
tie_embeddings = False

learning_rate = 2e-3  # the GPT-2-style CPU run's rate, so only the architecture differs
max_iters = 2000
lr_decay_iters = 2000
min_lr = 2e-4
beta2 = 0.99
warmup_iters = 100

device = "cpu"
compile = False
