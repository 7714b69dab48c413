"""
Trains a GPT on one device, or on several with DDP or FSDP (parallelism=). One GPU, or a CPU with the model
shrunk (the README's first command, minutes on 2 cores):

    python train.py config/train_shakespeare_char.py
    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1 \
        --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 \
        --dropout=0.0

4 GPUs on one node, or 2 nodes of 8 (the micro-steps divide among the processes: 32 of 15 for 16 of them):

    torchrun --standalone --nproc_per_node=4 train.py config/train_gpt2.py
    torchrun --nproc_per_node=8 --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=1234 train.py \
        config/train_gpt2.py --gradient_accumulation_steps=32 --batch_size=15
    (and --node_rank=1 on the second node)

The defaults below train GPT-2 124M on OpenWebText; `python train.py --help` lists them all.
"""
import datetime
import itertools
import math
import os
import re
import signal
import socket
import sys
import tempfile
import time
from contextlib import nullcontext, suppress

import torch
import torch.distributed as dist

import configurator
from checkpoint import (ARCH_KEYS, PROGRESS_KEYS, SHAPE_KEYS, architecture, better_best, check_init_from,
                        check_no_later_steps, check_same_checkpoint, check_same_shape, check_vocabulary,
                        checkpoint_file, gather_rng_states, load_checkpoint, load_model_state, load_pretrained,
                        copied_from, own_kept_step, publish_checkpoint, repair_published, restore_training_state,
                        save_checkpoint, take_optimizer_state, training_state)
from common import (STOP_CHECK_STEPS, FolderLock, Outliving, UserError, agreed_problem, autocast_context,
                    check_compile_mode, check_device, compile_problem, cpu_contention, excepthook, launcher_ranks,
                    leave_distributed, local_processes, on_rank0, peak_flops, plural, raise_held, resolve_dtype,
                    setup_distributed, start_script, stop_agreed)
from dataset import (Prefetcher, check_block_size, data_change, dataset_files_in, eval_key, get_batch, load_dataset,
                     model_vocab_size, read_batch, seed_from, token_files)
from fp8 import check_fp8, use_fp8
from hellaswag import check_encodable, find_data, read_examples, score
from hf import has_weights
from memory import check_fits, check_host_fits, describe, free_bytes, largest_batch, no_auto_batch, plan
from model import GPT, GPTConfig
from optimizers import build_optimizer, nonfinite_flag, skips_on_device, take_step
from report import Reporter, check_eval_file, check_wandb, foreign_config, fork_run_id
from sharding import full, full_state, shard
from tokenizer import codec as codec_of, decodable_ids, encode_setting

# ---- I/O
out_dir = "out"  # where checkpoints, metrics.csv, samples.txt, config.json, run.json, summary.json, eval.json and run.lock go [out_dir != '']
eval_interval = 2000  # evaluate (and maybe checkpoint) every this many steps, and after the last [eval_interval > 0]
log_interval = 1  # print a progress line every this many steps [log_interval > 0]
log_format = "text"  # 'text' progress lines, 'json' (one JSON object per line, for scripts) or 'quiet' (evals, samples, the summary, skipped steps, stops and a resume's changed settings) [log_format in ('text', 'json', 'quiet')]
eval_iters = 200  # batches per split in each evaluation; under parallelism='fsdp' a multiple of the processes [eval_iters > 0]
dry_run = False  # print the memory plan, tokens per step, model size and FLOPs per token, then exit: nothing is trained or written
eval_only = False  # evaluate a trained model once (any init_from but scratch), write out_dir/eval.json and exit; the run's own files stay as they are
always_save_checkpoint = True  # write ckpt.pt at every eval after step 0, not only when val loss improves (the last eval always writes it)
keep_last_n = 0  # also keep the last n checkpoints written at evaluations as ckpt_<iter>.pt (with always_save_checkpoint=False, only those that improved, and the last); 0 keeps none [keep_last_n >= 0]
max_nonfinite_steps = 10  # stop after this many steps in a row with a non-finite loss or gradient norm (counted at log lines) [max_nonfinite_steps > 0]
init_from = "scratch"  # 'scratch', 'resume' (from out_dir/ckpt.pt, taking the run's own value of each setting not given), gpt2, gpt2-medium, gpt2-large, gpt2-xl, a folder saved by transformers (GPT-2 or LLaMA), or a checkpoint file (ours or nanoGPT's ckpt.pt) to start a new run from
resume_from = "ckpt.pt"  # the checkpoint in out_dir that init_from='resume' continues: a kept ckpt_<iter>.pt goes back to that step (the run's later checkpoints must be moved out first; best.pt stays unless beaten)
overwrite = False  # let a new run (any init_from but 'resume') replace the run whose files (checkpoints, metrics.csv, summary.json, ...) out_dir holds
seed = 1337  # seeds init, dropout and the batch sampler [0 <= seed < 2**63]
hellaswag_interval = 0  # every this many evals, also score HellaSwag (acc_norm, into metrics.csv and wandb; see eval.py); 0: never; not yet under parallelism='fsdp' [hellaswag_interval >= 0]
hellaswag_file = ""  # HellaSwag's validation jsonl; '' uses data/hellaswag/hellaswag_val.jsonl, downloaded there once
hellaswag_items = 0  # score only the first this many items (10,042 in all); 0: all [hellaswag_items >= 0]
sample_interval = 0  # every this many evals, rank 0 writes a sample to stdout, out_dir/samples.txt and wandb; 0: never; not yet under parallelism='fsdp' [sample_interval >= 0]
sample_prompt = "\n"  # the prompt of those samples [sample_prompt != '']
sample_tokens = 200  # tokens per sample [sample_tokens > 0]
# ---- wandb logging
wandb_log = False  # log to Weights & Biases (WANDB_MODE=offline works without network)
wandb_project = "owt"  # wandb project name
wandb_run_name = "gpt2"  # wandb run name
# ---- data
dataset = "openwebtext"  # a folder under data/, or a path, holding meta.json and token files (or nanoGPT's train.bin, val.bin)
gradient_accumulation_steps = 5 * 8  # micro-steps per optimizer step, summed over all processes: a multiple of the number of processes [gradient_accumulation_steps > 0]
batch_size = 12  # sequences per micro-step per process; 'auto': the largest power of two up to 1024 that the memory plan fits in 85% of the free memory (for GPUs; on a CPU, this process's share of the host's RAM), agreed by all processes; a resumed run keeps its checkpoint's [batch_size == 'auto' or batch_size > 0]
block_size = 1024  # context length in tokens [block_size > 0]
prefetch_batches = 4  # micro-batches read ahead, by as many background threads, while the device works (a window of a token file not in the page cache takes milliseconds to read); 0: each is read in the loop when it is due [prefetch_batches >= 0]
# ---- model
n_layer = 12  # transformer blocks [n_layer > 0]
n_head = 12  # attention heads per block [n_head > 0]
n_embd = 768  # width of the residual stream, split evenly among the heads [n_embd > 0 and n_embd % n_head == 0]
dropout = 0.0  # 0 for pretraining, try 0.1+ for finetuning [0 <= dropout < 1]
bias = False  # biases in Linear and LayerNorm layers
pos_emb = "learned"  # positions: 'learned' (a table, GPT-2) or 'rope' (rotary, LLaMA; needs an even head size) [pos_emb == 'learned' or (pos_emb == 'rope' and n_embd // n_head % 2 == 0)]
rope_theta = 10000.0  # with rope: the base of the rotation frequencies [0 < rope_theta < inf]
norm = "layernorm"  # 'layernorm' (GPT-2) or 'rmsnorm' (LLaMA) [norm in ('layernorm', 'rmsnorm')]
mlp = "gelu"  # 'gelu' (GPT-2), 'swiglu' (LLaMA) or 'relu2' (ReLU squared, modded-nanogpt) [mlp in ('gelu', 'swiglu', 'relu2')]
mlp_hidden = 0  # MLP width; 0: 4 * n_embd, or for swiglu 8/3 * n_embd rounded up to a multiple of 64 [mlp_hidden >= 0]
n_kv_head = 0  # key/value heads for grouped-query attention; 0: n_head (plain attention) [n_kv_head >= 0 and n_head % (n_kv_head or n_head) == 0]
qk_norm = False  # RMS-normalise queries and keys per head before attention
tie_embeddings = True  # the output projection shares the token embedding matrix (GPT-2); False gives it its own
activation_checkpointing = False  # keep only each block's input in the forward pass and recompute the block in backward: much less activation memory for about a third more compute
loss_chunk = 0  # compute the training loss this many rows of logits at a time, never holding all (B*T, vocab) logits: less memory at GPT-2's vocabulary, one more lm_head matmul; 0: all at once [loss_chunk >= 0]
# ---- optimizer
optimizer = "adamw"  # 'adamw', or 'muon': Muon (orthogonalised momentum) for the blocks' matrices, AdamW for embeddings, head, norms and biases [optimizer in ('adamw', 'muon')]
learning_rate = 6e-4  # peak learning rate (AdamW's) [0 < learning_rate < inf]
muon_lr = 0.02  # Muon's peak learning rate; the schedule scales it with learning_rate's [0 < muon_lr < inf]
muon_momentum = 0.95  # Muon's (Nesterov) momentum [0 <= muon_momentum < 1]
max_iters = 600000  # optimizer steps in the whole run [max_iters > 0]
weight_decay = 1e-1  # decoupled weight decay on AdamW's matrices (under optimizer='muon', the blocks' matrices take none) [0 <= weight_decay < inf]
beta1 = 0.9  # AdamW beta1 [0 <= beta1 < 1]
beta2 = 0.95  # AdamW beta2 [0 <= beta2 < 1]
grad_clip = 1.0  # clip the global gradient norm to this; 0 disables clipping [0 <= grad_clip < inf]
# ---- learning rate schedule
lr_schedule = "cosine"  # after warmup: 'cosine' decay to min_lr at lr_decay_iters (nanoGPT's), 'wsd' (warmup, stable, then a linear cooldown over the last cooldown_frac of lr_decay_iters), 'wsd-sqrt' (the same with a 1-sqrt cooldown) or 'constant' [lr_schedule in ('cosine', 'wsd', 'wsd-sqrt', 'constant')]
cooldown_frac = 0.2  # wsd: the fraction of lr_decay_iters spent cooling down to min_lr [0 < cooldown_frac <= 1]
decay_lr = True  # False: learning_rate from the first step to the last, no warmup (nanoGPT's switch, kept for its config files)
warmup_iters = 2000  # linear warmup steps [warmup_iters >= 0]
lr_decay_iters = 600000  # steps until the schedule reaches min_lr; about max_iters per Chinchilla [lr_decay_iters >= 0]
min_lr = 6e-5  # floor of the schedule; about learning_rate / 10 per Chinchilla [0 <= min_lr and (min_lr <= learning_rate or not decay_lr or lr_schedule == 'constant')]
# ---- system
parallelism = "ddp"  # with several processes: 'ddp' (each holds the whole model and optimizer) or 'fsdp' (FSDP2: each holds 1/world_size of the weights, gradients and optimizer state; a block's weights are gathered as it runs) [parallelism in ('ddp', 'fsdp')]
fsdp_reduce = "micro_step"  # with parallelism='fsdp' and several micro-steps per process, when gradients are reduce-scattered: 'micro_step' after every micro-step's backward, which then frees the gathered weights (the least memory: 1/world_size of the gradients, two blocks gathered; one more gather and reduce-scatter per micro-step), or 'step' on the last micro-step only, keeping every gradient whole (fp32) and every block gathered until then (one gather and one reduce-scatter per step, at DDP's gradient memory) [fsdp_reduce in ('micro_step', 'step')]
backend = "auto"  # DDP backend: 'nccl' (CUDA only), 'gloo', or 'auto' (nccl on CUDA, gloo otherwise) [backend in ('auto', 'gloo') or (backend == 'nccl' and device.startswith('cuda'))]
ddp_timeout = 1800  # seconds a collective waits for the slowest rank (e.g. rank 0 saving) before the run fails; at most 100000000 (three years), past which torch's timers overflow [0 < ddp_timeout <= 100000000]
device = "cuda"  # 'cpu', 'cuda', 'cuda:N' or 'mps'; under torchrun the GPU comes from LOCAL_RANK
dtype = "auto"  # 'float32', 'bfloat16', 'float16', or 'auto' (bf16 where the GPU has it, else fp16; fp32 off CUDA) [dtype in ('auto', 'float32', 'bfloat16', 'float16')]
compile = True  # torch.compile the model: slower start, faster steps
compile_mode = "default"  # torch.compile's mode: 'default', 'max-autotune' (slower compile, tuned kernels, CUDA graphs), 'reduce-overhead' (CUDA graphs) or 'max-autotune-no-cudagraphs'; on a GPU the two with CUDA graphs need one micro-step per process [compile_mode in ('default', 'max-autotune', 'reduce-overhead', 'max-autotune-no-cudagraphs')]
fp8 = False  # the transformer blocks' matmuls in float8 with dynamic scaling (fp8.py): faster on GPUs of compute capability 8.9+ (H100, L4, RTX 4090); the head, embeddings, norms and the saved weights stay as they are
attention_kernel = "auto"  # the attention kernel on CUDA: 'auto' (torch's choice: cuDNN's first on Hopper and Blackwell with a recent cuDNN, else FlashAttention), 'flash' (cuDNN's off) or 'cudnn' (cuDNN's first, where it serves the shape) [attention_kernel in ('auto', 'flash', 'cudnn')]
sync_every_step = False  # read each step's skip and stop verdicts on the host (a device sync per step); False reads them once per log line where the optimizer can skip a step on the device (the fused AdamW, on CUDA and CPU), and every step still under optimizer='muon' or on mps
config_defaults = configurator.config_keys(globals())  # taken here, so only the names above are settings


# ---------------------------------------------------------------------------------------------
# the run's folder

def check_writable(out_dir: str):
    """Make sure out_dir can be created or written, without creating it or touching any file in it (or, to see
    whether it could be created, leaving anything in the folder it would be made in)."""
    existing = out_dir
    while not os.path.exists(existing):  # the nearest folder that exists decides whether out_dir can be made
        if os.path.islink(existing):  # a link to nothing, such as a scratch disk that is not mounted
            raise UserError(f"out_dir {out_dir}: {existing} is a link to {os.readlink(existing)}, which does not exist: "
                            "mount or create its target, or choose another out_dir")
        existing = os.path.dirname(os.path.abspath(existing))
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(f"{existing} is a file")
        if existing == out_dir:
            with tempfile.TemporaryFile(dir=out_dir):
                pass
        else:  # a folder made there and removed: os.access lets root through where no one can write (/proc)
            os.rmdir(tempfile.mkdtemp(dir=existing))
    except OSError as e:
        raise UserError(f"out_dir {out_dir} is not writable ({e.strerror or e}): choose another out_dir") from None


# settings a resume neither takes from the run nor compares with its: how this command runs, and the shape (the
# checkpoint's model_args fix that)
COMMAND_KEYS = ("init_from", "resume_from", "overwrite", "eval_only", "dry_run", "out_dir")
RESUME_SAME = (*COMMAND_KEYS, *SHAPE_KEYS, *ARCH_KEYS)
# settings that give a step other logged values (its batches, its learning rate, its arithmetic): a resume that
# changes one of these, past steps the run logged, logs them anew (see Reporter.start). Not those that move a loss
# at rounding level only (compile, compile_mode, loss_chunk, attention_kernel, parallelism: 1e-7 of it; and
# activation_checkpointing, which recomputes the same ops), which would split a wandb run for nothing
VALUE_KEYS = ("seed", "gradient_accumulation_steps", "batch_size", "dropout", "learning_rate", "muon_lr",
              "muon_momentum", "weight_decay", "beta1", "beta2", "grad_clip", "lr_schedule", "cooldown_frac", "decay_lr",
              "warmup_iters", "lr_decay_iters", "min_lr", "dtype", "fp8", "eval_iters")
RUN_FILES = ("ckpt.pt", "best.pt", "summary.json", "samples.txt", "metrics.csv", "eval.json", "plot.png")  # a run's results


VALUES_NAMED = ("device", "dataset", "hellaswag_file")  # settings whose errors name their value, not their key


def naming_runs_own(runs_own: dict):
    """sys.excepthook for a resume: a UserError that names a setting the run's checkpoint gave (`key=`), or the value
    of one of VALUES_NAMED, which the user never typed, says so and how to give another."""
    def hook(exc_type, exc, tb):
        text = str(exc) if issubclass(exc_type, UserError) else ""
        named = [k for k, v in runs_own.items() if re.search(rf"\b{k}=", text) or (
            k in VALUES_NAMED and re.search(rf"(?<![\w/.-]){re.escape(v)}(?![\w/.-])", text))]
        if named:
            exc = UserError(f"{text}; {', '.join(named)} {'is' if len(named) == 1 else 'are'} the run's own (a "
                            f"resume keeps each setting it is not given): give {' '.join(f'--{k}=...' for k in named)} "
                            "for another")
        excepthook(exc_type, exc, tb)
    return hook


def check_new_run(out_dir: str, overwrite: bool, init_from: str) -> list[str]:
    """A new run (not a resume) into out_dir: refused when an earlier run's results are there (checkpoints,
    metrics, summary, ...), unless overwrite, and then still refused when init_from is one of them; returns
    those files, which the new run then deletes. A checkpoint copy the user named (ckpt_before_lr_change.pt)
    is not the run's."""
    old = [f for f in sorted(os.listdir(out_dir)) if f in RUN_FILES or own_kept_step(f) >= 0]
    if old and not overwrite:
        resume = "continue it with --init_from=resume, " if "ckpt.pt" in old else "it has no ckpt.pt to resume: "
        raise UserError(f"out_dir {out_dir} already holds a run ({', '.join(old[:4])}{', ...' if len(old) > 4 else ''}): "
                        f"{resume}choose another out_dir, or pass --overwrite=True to replace that run")
    # by path, links resolved: a hard link outside out_dir is another name that survives the deletion
    starts_from = [f for f in old if os.path.isfile(init_from)
                   and os.path.realpath(init_from) == os.path.realpath(os.path.join(out_dir, f))]
    if starts_from:
        raise UserError(f"init_from={init_from} is {starts_from[0]} of the run that --overwrite=True replaces, and "
                        "would be deleted before the new run saves anything: copy it out of out_dir (or to a name of "
                        "your own, such as ckpt_start.pt) and start from the copy")
    return old


def kept_checkpoint(saved: tuple[str, int] | None) -> str:
    """What a run that stops on non-finite weights leaves to resume from (saved: the path and iter of the
    checkpoint last written or resumed, None when there is none)."""
    if saved is None:
        return "no checkpoint had been written"
    return f"the last good checkpoint, {saved[0]} at iter {saved[1]}, is kept"


class StopFlag:
    """Set by the first SIGTERM or SIGINT (preemption, Ctrl-C, a scheduler's time limit), so the run can
    finish its step (or drop the evaluation under way), checkpoint and exit 0; a second signal exits at once, except a SIGTERM within
    REPEAT_GRACE_S of the first: a scheduler such as Slurm signals every process of the job and torchrun
    forwards its own copy, so each worker gets two at once. A single process looks at the flag after every
    step and evaluation batch; under DDP the ranks agree on it every STOP_CHECK_STEPS steps or batches (and at log
    lines).
    The loss of stdout's or stderr's reader (`| tee log` and a Ctrl-C that ends both, or `| head`) sets it too, as
    the SIGPIPE that Python ignores would have: the run writes on to /dev/null until it has checkpointed."""

    def __init__(self):
        self.requested, self.signalled, self.first = False, False, 0.0
        self.training = True  # False once the loop is over: a reader lost then stops nothing
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        # a stream closed at the start (>&-) is None, and stays so
        sys.stdout, sys.stderr = (stream and Outliving(stream, self._reader_gone)
                                  for stream in (sys.stdout, sys.stderr))

    def _handle(self, signum, frame):
        if self.signalled:  # a lost reader arms nothing: the Ctrl-C that follows it is the first
            if signum == signal.SIGINT or time.monotonic() - self.first > REPEAT_GRACE_S:
                with suppress(OSError):  # a stderr whose reader is gone
                    os.write(2, f"{signal.Signals(signum).name} again: exiting now, without saving\n".encode())
                os._exit(128 + signum)
            return
        self.requested, self.signalled, self.first = True, True, time.monotonic()
        self._say(signal.Signals(signum).name, " (send it again to exit at once)")

    def _reader_gone(self):
        if self.training and not self.requested:
            self.requested = True
            self._say("the output pipe's reader is gone", "")

    @staticmethod
    def _say(cause: str, again: str):
        print(f"{cause}: checkpointing after this step (an evaluation under way is dropped; under DDP, within "
              f"{STOP_CHECK_STEPS} steps or batches), then exiting{again}", file=sys.stderr, flush=True)


REPEAT_GRACE_S = 5  # a SIGTERM this soon after the first is the same one, forwarded


# ---------------------------------------------------------------------------------------------
# learning rate schedule and evaluation

# the settings get_lr takes, in its order, after decay_lr, which chooses it
SCHEDULE_KEYS = ("decay_lr", "learning_rate", "warmup_iters", "lr_decay_iters", "min_lr", "lr_schedule", "cooldown_frac")


def get_lr(it: int, learning_rate: float, warmup_iters: int, lr_decay_iters: int, min_lr: float,
           schedule: str = "cosine", cooldown_frac: float = 0.2) -> float:
    """Learning rate at step `it`: linear warmup to learning_rate, then the schedule (see lr_schedule) down to
    min_lr at lr_decay_iters, then min_lr. A pure function of the step, so a resumed run continues it exactly."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if schedule == "constant":
        return learning_rate
    if it >= lr_decay_iters:
        return min_lr
    if schedule == "cosine":
        progress = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)
    cooldown_start = wsd_cooldown_start(warmup_iters, lr_decay_iters, cooldown_frac)
    if it < cooldown_start:
        return learning_rate  # the stable phase
    progress = (it - cooldown_start) / (lr_decay_iters - cooldown_start)
    remaining = 1.0 - progress if schedule == "wsd" else 1.0 - math.sqrt(progress)
    return min_lr + remaining * (learning_rate - min_lr)


def wsd_cooldown_start(warmup_iters: int, lr_decay_iters: int, cooldown_frac: float) -> int:
    """The step the wsd schedules start cooling down from learning_rate, reaching min_lr at lr_decay_iters."""
    return max(warmup_iters, lr_decay_iters - round(cooldown_frac * lr_decay_iters))


def schedule_problem(warmup_iters: int, lr_decay_iters: int, max_iters: int, schedule: str,
                     cooldown_frac: float = 0.2) -> str | None:
    """What is odd about a schedule (get_lr's, with decay_lr) that the settings' rules allow: a warmup as long as
    the run, which never reaches learning_rate (a quick run that kept GPT-2's 2000 steps of warmup), one that
    reaches lr_decay_iters or the step before, which falls from its peak to min_lr in one step (within the run),
    no decay at all (lr_decay_iters 0 or 1 without warmup: min_lr throughout), a wsd cooldown too short to have a
    step between the two, or a decay that the run stops less than half way down (a short run of a config's long
    schedule); None when none of these."""
    if warmup_iters >= max_iters and warmup_iters > 0:
        return (f"warmup_iters {warmup_iters} is not below max_iters {max_iters}: the learning rate never reaches "
                "learning_rate in this run; lower warmup_iters")
    if warmup_iters >= lr_decay_iters - 1 and warmup_iters > 0 and schedule != "constant":
        if lr_decay_iters >= max_iters:  # then warmup_iters is max_iters - 1: the fall would come after the run
            return (f"warmup_iters {warmup_iters} ends at the run's last step, which trains at learning_rate: no step "
                    "decays; lower warmup_iters")
        return (f"warmup_iters {warmup_iters} leaves no step between the warmup and lr_decay_iters {lr_decay_iters}: "
                "the learning rate falls from its peak to min_lr in one step; raise lr_decay_iters (usually max_iters)")
    if (lr_decay_iters == 0 or lr_decay_iters == 1 < max_iters) and schedule != "constant":  # and no warmup, or the
        # check above would have spoken (a one-step run with lr_decay_iters 1 takes its step at learning_rate)
        return (f"lr_decay_iters {lr_decay_iters} ends the decay at once: every step trains at min_lr"
                + (" but the first" if lr_decay_iters else "") + ", never near learning_rate; set lr_decay_iters to "
                "max_iters (or lr_schedule='constant' for learning_rate throughout)")
    start = wsd_cooldown_start(warmup_iters, lr_decay_iters, cooldown_frac)
    if schedule in ("wsd", "wsd-sqrt") and lr_decay_iters - start < 2 and 0 < lr_decay_iters <= max_iters:
        # (a warmup that squeezes the cooldown so is named above; a cooldown after the run, below)
        return (f"the cooldown, from cooldown_frac {cooldown_frac} to lr_decay_iters {lr_decay_iters}, is "
                f"{lr_decay_iters - start} step(s): no step trains between learning_rate and min_lr; raise "
                "cooldown_frac or raise lr_decay_iters")
    left = get_lr(max_iters - 1, 1.0, warmup_iters, lr_decay_iters, 0.0, schedule, cooldown_frac)  # 1: learning_rate
    if schedule != "constant" and lr_decay_iters > max_iters and left > 0.5:
        return (f"lr_decay_iters {lr_decay_iters} is past max_iters {max_iters}: the run stops with its learning rate "
                f"{left:.0%} of the way from min_lr up to learning_rate; set lr_decay_iters to max_iters to decay "
                "within the run (or leave it, for a run to be resumed on)")
    return None


def unused_settings(config: dict, given: set) -> list[str]:
    """The settings given (by a flag or a config file) that this run does not use, each with what would use it:
    a fork that switches a feature off keeps the settings that went with it. config: the run's, its model's
    architecture settled (a resume's or an init_from's)."""
    wsd, muon = config["lr_schedule"] in ("wsd", "wsd-sqrt"), config["optimizer"] == "muon"
    # (with decay_lr=False every schedule setting is unused, which train.py names apart)
    needs = dict(cooldown_frac=("lr_schedule='wsd' or 'wsd-sqrt'", wsd or not config["decay_lr"]),
                 muon_lr=("optimizer='muon'", muon), muon_momentum=("optimizer='muon'", muon),
                 rope_theta=("pos_emb='rope'", config["pos_emb"] == "rope"),
                 fsdp_reduce=("parallelism='fsdp'", config["parallelism"] == "fsdp"),
                 compile_mode=("compile=True", config["compile"]))
    needs.update({k: ("hellaswag_interval > 0", config["hellaswag_interval"] > 0)
                  for k in ("hellaswag_file", "hellaswag_items")})
    needs.update({k: ("sample_interval > 0", config["sample_interval"] > 0) for k in ("sample_prompt", "sample_tokens")})
    return [f"{k} is not used: it needs {what}" for k, (what, used) in needs.items() if k in given and not used]


@torch.no_grad()
def estimate_loss(model, batch_fn, eval_iters: int, ctx=nullcontext(), rank: int = 0, world_size: int = 1,
                  splits=("train", "val"), stop=None) -> dict[str, float] | None:
    """Mean loss over eval_iters batches per split, batch_fn(split, k) giving batch k. Each rank evaluates
    its share of the k and the results are summed across ranks, so every rank returns the same numbers.
    stop: a function asked between batches (see stop_agreed): when it says so, the evaluation is dropped and None
    returned, on every rank."""
    device = next(model.parameters()).device
    model.eval()
    try:
        out = {}
        for split in splits:
            losses = torch.zeros(eval_iters, device=device)
            for n in range(-(-eval_iters // world_size)):  # as many on every rank, for the stop checks' all-reduces
                if stop is not None and stop_agreed(stop, n, world_size, device):
                    return None
                k = rank + n * world_size
                if k < eval_iters:
                    x, y = batch_fn(split, k)
                    with ctx:
                        loss = model(x, y)[1]
                    losses[k] = loss.detach()  # stays on the device: one sync per split (and per stop check under DDP)
            if world_size > 1:
                dist.all_reduce(losses)
            out[split] = losses.mean().item()
        return out
    finally:
        model.train()


# ---------------------------------------------------------------------------------------------

if __name__ == "__main__":
    start_script()
    given = set()  # the settings the user set, if to their default (see check_same_shape)
    config = configurator.configure(config_defaults, sys.argv[1:], __file__, check=False, given=given)  # types; rules below
    setting_rules = configurator.rules(__file__, config_defaults)
    # a resume's other settings are the run's own unless given (below): their rules are checked once they are known
    configurator.check_rules(config, {k: rule for k, rule in setting_rules.items()
                                      if config["init_from"] != "resume" or k in COMMAND_KEYS}, given)
    check_init_from(config["init_from"], ("scratch", "resume"))
    if config["resume_from"] != "ckpt.pt" and (config["init_from"] != "resume" or os.path.basename(
            config["resume_from"]) != config["resume_from"]):
        raise UserError(f"resume_from={config['resume_from']!r} names a checkpoint in out_dir (ckpt.pt, or a kept "
                        "ckpt_<iter>.pt to go back to) with --init_from=resume: give a file name without a folder, "
                        "or use --init_from=PATH to start a new run from a checkpoint's weights")
    if config["eval_only"] and config["init_from"] == "scratch":
        raise UserError("eval_only=True evaluates a trained model: give --init_from=resume (the checkpoint in "
                        "out_dir), a GPT-2 name, a transformers folder or a checkpoint file")
    ranks = launcher_ranks(os.environ)  # checked before anything else, so a bad environment is one line
    node_processes = local_processes(os.environ)  # on a CPU they share the host's memory (see the memory plan)
    master_process = ranks is None or ranks[0] == 0  # only rank 0 writes files and prints
    # errors met in out_dir before the processes join: under torchrun held till they have (see raise_held)
    held, checkpoint, runs_own = None, None, {}
    try:
        if config["init_from"] == "resume" and not os.path.isdir(config["out_dir"]):  # a typo: make no folder of it
            raise UserError(f"no checkpoint at {os.path.join(config['out_dir'], config['resume_from'])}: there is no "
                            f"folder {config['out_dir']}; check out_dir (init_from='resume' continues a run saved there)")
        if master_process:  # only rank 0 logs, and dry runs and evaluations start no wandb run
            check_wandb(config["wandb_log"] and not (config["eval_only"] or config["dry_run"]))
        if master_process and not config["dry_run"]:  # a dry run writes nothing, so a read-only out_dir will do
            check_writable(config["out_dir"])
            if config["eval_only"]:
                check_eval_file(config["out_dir"])
        if master_process and not (config["eval_only"] or config["dry_run"]):  # these two write no run files
            if config["init_from"] != "resume" and has_weights(config["out_dir"]):  # whatever overwrite says
                raise UserError(f"out_dir {config['out_dir']} holds a transformers model (export.py's, say), whose "
                                "config.json a run's would replace: choose another out_dir (a finetune of it keeps "
                                "--init_from on that folder)")
            if config["init_from"] != "resume" and foreign_config(config["out_dir"]):
                raise UserError(f"out_dir {config['out_dir']} holds a config.json that no training run wrote, which a "
                                "run's would replace: choose another out_dir, or move that file out of it")
            data_files = dataset_files_in(config["out_dir"]) if config["init_from"] != "resume" else []
            if data_files:
                raise UserError(f"out_dir {config['out_dir']} holds a dataset ({', '.join(data_files[:3])}"
                                f"{', ...' if len(data_files) > 3 else ''}): a run's files go in a folder of their own; "
                                "choose another out_dir")
            os.makedirs(config["out_dir"], exist_ok=True)
            # taken before the checkpoint is read and held until this process ends: a second run here is refused
            lock = FolderLock(config["out_dir"])
        if config["init_from"] == "resume":  # the checkpoint fixes the model's shape: read it before anything uses it
            ckpt_path = checkpoint_file(config["out_dir"], config["resume_from"])
            checkpoint = load_checkpoint(ckpt_path)  # every process reads it, where it sees out_dir
            check_same_shape(checkpoint["model_args"], config, config_defaults, given=given)
            # the run goes on as it was configured: a setting this command does not give is the run's own
            runs_own = {k: v for k, v in checkpoint["config"].items()  # those that differ from the command's
                        if k in config and k not in given and k not in RESUME_SAME and v != config[k]}
            config.update(runs_own)
            config.update({k: v for k, v in architecture(checkpoint["model_args"]).items() if k in config})
            sys.excepthook = naming_runs_own(runs_own)
            if master_process:  # the run's wandb_log, if it had it
                check_wandb(config["wandb_log"] and not (config["eval_only"] or config["dry_run"]))
            if checkpoint["config"].get("optimizer", "adamw") != config["optimizer"] and not config["eval_only"]:
                raise UserError(f"checkpoint {ckpt_path} was trained with optimizer="
                                f"{checkpoint['config'].get('optimizer', 'adamw')}, not {config['optimizer']}: resume "
                                f"with that optimizer, or start a new run from its weights with --init_from={ckpt_path} "
                                "in another out_dir")
    except UserError as e:
        if ranks is None:
            raise
        held, checkpoint = str(e), None
    if config["init_from"] == "resume" and held is None:  # unheld: every process that read the checkpoint meets it
        configurator.check_rules(config, setting_rules)
    if checkpoint is not None:
        if config["batch_size"] == "auto":  # the batch it was planned with, wherever it resumes: the same batches
            config["batch_size"] = checkpoint["config"]["batch_size"]
    globals().update(config)

    # ---- distributed setup
    if held is not None:  # an error to tell the other processes (ranks is set): this one may lack the run's own
        # settings, which it could not read, so it checks none of them, joins on the CPU where its device is not
        # there, and raises the error with the others (else they would wait for it to join until ddp_timeout). A
        # run whose own device is not this command's, on nodes that have this one (a CPU run on GPU nodes), still
        # joins here with another backend than the others: they then wait until ddp_timeout
        try:
            check_device(device)
        except UserError:
            device, backend = "cpu", "auto"
        raise_held(held, setup_distributed(ranks, device, backend, ddp_timeout)[2])
    device_type = check_device(device)
    dtype = resolve_dtype(dtype, device_type)
    if fp8:
        check_fp8(device)
    if ranks is not None and gradient_accumulation_steps % ranks[2]:
        raise UserError(f"gradient_accumulation_steps={gradient_accumulation_steps} is not divisible by the "
                        f"world size {ranks[2]}: make it a multiple of the number of processes")
    if compile:
        check_compile_mode(compile_mode, gradient_accumulation_steps // (ranks[2] if ranks else 1), device_type)
    rank, local_rank, world_size, device = setup_distributed(ranks, device, backend, ddp_timeout)
    distributed = world_size > 1  # several processes, whichever the parallelism
    raise_held(held, world_size)
    if distributed and init_from == "resume":
        check_same_checkpoint(checkpoint, ckpt_path, world_size)
    fsdp = distributed and parallelism == "fsdp"
    report = Reporter(out_dir, log_format, active=master_process)  # rank 0's lines, rows and wandb calls
    if checkpoint is not None and not (eval_only or dry_run):  # those two leave the run's files as they are
        on_rank0(lambda: check_no_later_steps(out_dir, ckpt_path, checkpoint["iter_num"]), rank, world_size)
        repaired = on_rank0(lambda: repair_published(out_dir, checkpoint), rank, world_size) \
            if resume_from == "ckpt.pt" else None  # what it repairs are links to ckpt.pt
        for name in repaired or []:
            moved = "" if name == "best.pt" else ", or that kept step was moved to ckpt.pt"
            report.print(f"{name} was missing or older than ckpt.pt (the run was stopped between writing the two{moved}): "
                         f"written now from ckpt.pt, iter {checkpoint['iter_num']}", always=True)
        best = on_rank0(lambda: better_best(out_dir, checkpoint, ckpt_path), rank, world_size, share=True)
        if best is not None:  # the run went back to an earlier step: what best.pt holds is still the run's best
            checkpoint["best_val_loss"], checkpoint["best_iter"] = best
            report.print(f"best.pt (iter {best[1]}, val loss {best[0]:.4f}) is better than any step up to iter "
                         f"{checkpoint['iter_num']}: it stays best.pt until an evaluation beats it", always=True)
    if checkpoint is not None and checkpoint["evaluated"] and checkpoint["iter_num"] >= max_iters \
            and not (eval_only or dry_run):  # a dry run still shows its plan
        if resume_from == "ckpt.pt" and on_rank0(lambda: report.rebuild_summary(checkpoint), rank, world_size):
            report.print("summary.json was missing (the session that finished the run was stopped before writing it): "
                         "written now from ckpt.pt and metrics.csv, with null for that session's times and skipped "
                         "steps", always=True)
        report.print(f"the run in {out_dir} is finished: its checkpoint is at iter {checkpoint['iter_num']} and "
                     f"max_iters is {max_iters}; nothing to do (raise --max_iters to train it further, or evaluate it "
                     "with --eval_only=True)", always=True)
        leave_distributed(world_size)  # every rank read the same checkpoint (checked above), so every rank ends here
        sys.exit(0)
    if checkpoint is not None and checkpoint["iter_num"] > max_iters and not (eval_only or dry_run):  # a stop's save
        report.print(f"the checkpoint is at iter {checkpoint['iter_num']}, past max_iters {max_iters}: the run ends "
                     "there, with its final evaluation and save (raise --max_iters to train it further)", always=True)
    if fsdp:  # every rank runs every forward pass under FSDP (each gathers weights from all): no rank may do fewer
        if eval_iters % world_size:
            raise UserError(f"eval_iters={eval_iters} is not divisible by the world size {world_size}: under FSDP "
                            "every process evaluates the same number of batches; make it a multiple")
        if (sample_interval or hellaswag_interval) and not eval_only:  # an eval_only run neither samples nor scores
            on = [f"{k}={v}" for k, v in (("sample_interval", sample_interval), ("hellaswag_interval", hellaswag_interval))
                  if v]
            raise UserError(f"{' and '.join(on)} {'is' if len(on) == 1 else 'are'} not available with parallelism='fsdp' "
                            "yet: set 0, and sample or evaluate the checkpoint with sample.py or eval.py")
    accum_steps = gradient_accumulation_steps // world_size  # micro-steps on this process
    report.print(f"world size {world_size}, device {device}, dtype {dtype}")
    odd_schedule = schedule_problem(warmup_iters, lr_decay_iters, max_iters, lr_schedule, cooldown_frac) \
        if decay_lr and not eval_only else None
    unused = [k for k in ("warmup_iters", "lr_decay_iters", "min_lr", "lr_schedule", "cooldown_frac") if k in given] \
        if not decay_lr and not eval_only else []
    if unused:  # a fork of a finetune config (decay_lr = False) that adds a warmup or a schedule
        odd_schedule = (f"{', '.join(f'{k}={config[k]!r}' for k in unused)} {'is' if len(unused) == 1 else 'are'} "
                        "not used: decay_lr=False keeps learning_rate from the first step to the last, with no warmup "
                        f"(nanoGPT's meaning); drop decay_lr=False to use {'it' if len(unused) == 1 else 'them'}")
    if odd_schedule:
        report.warn(odd_schedule)
    if device_type == "cpu" and master_process and hasattr(os, "getloadavg"):
        contention = cpu_contention(os.getloadavg()[0], os.cpu_count() or 1, torch.get_num_threads())
        if contention:
            report.warn(contention)
    torch.manual_seed(seed + rank)  # dropout masks differ across ranks
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    ctx = autocast_context(device_type, dtype)

    # ---- data (a run from a model's weights without a block_size of its own takes the model's context, which
    # may be shorter: its splits are checked against it once the model is loaded, below)
    context_known = init_from in ("scratch", "resume") or "block_size" in given
    data = load_dataset(dataset, block_size if context_known else None)
    # what checkpoints record of the data read, and what a resume compares: rank 0's, which saves and prints
    data_files = token_files(data) if master_process else None
    report.print(f"dataset {dataset}: {sum(n for _, n in data['splits']['train']):,} train and "
                 f"{sum(n for _, n in data['splits']['val']):,} val tokens ({data['dtype'].name}), "
                 f"vocab_size {data['vocab_size'] or 'unknown'}" + ("; more than half this machine's RAM, so its windows "
                                                                    "are read without the kernel's read-ahead"
                                                                    if data["random_access"] else ""))
    if checkpoint is not None:
        data["vocabulary"] = check_vocabulary(checkpoint.get("vocabulary"), data["vocabulary"], dataset, ckpt_path)
        change = data_change(checkpoint.get("data_files"), data_files) if master_process else {}
        if change:  # more data may be meant; a changed val split makes losses before and after incomparable
            report.warn(f"dataset {dataset} changed since the checkpoint ("
                         + "; ".join(f"{split}: {how}" for split, how in change.items())
                         + "): the batches from here are not an unbroken run's"
                         + (", and val losses before and after are on different data (best.pt was chosen on the "
                            "old val split)" if "val" in change else ""))

    def read_train_batch(step_and_micro_step: tuple[int, int]):
        """This process's micro-batch of a step, in host memory: part (seed, step, global micro-step) of the step's
        global batch."""
        it, micro_step = step_and_micro_step
        key = (seed, 0, it, rank * accum_steps + micro_step)
        return read_batch(data["splits"]["train"], data["dtype"], batch_size, block_size, key, device_type == "cuda",
                          data["random_access"], token_limit)

    def eval_batch(split, k):
        return get_batch(data["splits"][split], data["dtype"], batch_size, block_size, eval_key(split, k), device,
                         data["random_access"], token_limit)

    # ---- model init
    free = free_bytes(device, node_processes)  # before the model is built: on a CPU its weights take from it
    iter_num, tokens_seen, best_val_loss, best_iter = 0, 0, float("inf"), None
    model_args = dict(vocab_size=model_vocab_size(data["vocab_size"], data["vocabulary"]),  # GPT-2's 50257: 50304
                      dropout=dropout, loss_chunk=loss_chunk, activation_checkpointing=activation_checkpointing,
                      **{k: config[k] for k in (*SHAPE_KEYS, *ARCH_KEYS) if k != "vocab_size"})
    if init_from == "resume":
        model_args["vocab_size"] = checkpoint["model_args"]["vocab_size"]  # the rest of its shape is in config now
    if init_from in ("scratch", "resume"):
        check_host_fits(GPTConfig(**model_args))
        model = GPT(GPTConfig(**model_args))  # a resume's state is restored with the optimizer's, below
    else:  # weights to start from: GPT-2 by name, a transformers folder, or a checkpoint file (ours or nanoGPT's)
        model, start_vocabulary, start_optimizer = load_pretrained(init_from, dropout)
        data["vocabulary"] = check_vocabulary(start_vocabulary, data["vocabulary"], dataset, init_from, resuming=False)
        model.config.loss_chunk, model.config.activation_checkpointing = loss_chunk, activation_checkpointing
        for k in (*SHAPE_KEYS, *ARCH_KEYS):
            model_args[k] = getattr(model.config, k)
        check_same_shape(model_args, config, config_defaults, init_from, given)
        arch = {k: v for k, v in architecture(model_args).items() if k in config and k != "block_size"}
        config.update(arch)  # config.json and run.json record the model trained, not the defaults
        globals().update(arch)
        if "block_size" not in given:  # the model's context, where that is shorter
            block_size = config["block_size"] = min(block_size, model.config.block_size)
    if block_size < model.config.block_size:
        model.crop_block_size(block_size)  # e.g. finetune GPT-2 (1024) with a shorter context
        model_args["block_size"] = block_size
    elif block_size > model.config.block_size:
        raise UserError(f"block_size {block_size} is longer than {init_from}'s context of {model.config.block_size}: "
                        f"use --block_size={model.config.block_size} or less")
    if not context_known:
        check_block_size(data, block_size)
    if data["max_token_id"] >= model.config.vocab_size:
        raise UserError(f"dataset {dataset} has token id {data['max_token_id']}, out of range for the model's "
                        f"vocab_size {model.config.vocab_size}: prepare the data with the model's tokenizer")
    token_limit = model.config.vocab_size  # every batch read is checked against it too (see read_batch)
    for unused in unused_settings(config, given) if not eval_only else []:  # with the model's architecture settled
        report.warn(unused)
    if data["vocabulary"] == {"tokenizer": None, "chars": None} and data["max_token_id"] < 256 and \
            init_from != "resume" and not eval_only:
        report.warn(f"dataset {dataset} has no meta.json or meta.pkl to name its tokens, so they are taken as GPT-2's "
                    f"(nanoGPT's layout), but its largest id is {data['max_token_id']}, where GPT-2 text has ids in the "
                    "thousands: if they are characters, prepare the text again (data/prepare.py --tokenizer char "
                    "writes meta.json) or put its meta.pkl back, or sample.py will decode them as GPT-2's")
    # from the run's vocabulary, now settled: without meta.pkl, the characters of the checkpoint started from
    codec = codec_of(data["vocabulary"], model.config.vocab_size) \
        if hellaswag_interval or (sample_interval and master_process) else None
    if sample_interval:  # a prompt the dataset cannot encode fails now, not at the first sample
        on_rank0(lambda: encode_setting(codec[0], "sample_prompt", sample_prompt, config_defaults["sample_prompt"]),
                 rank, world_size)
    hellaswag = None  # (items, encode) when HellaSwag is scored during training
    if hellaswag_interval:
        hellaswag = (read_examples(find_data(hellaswag_file, "hellaswag_file"))[:hellaswag_items or None], codec[0])
        check_encodable(*hellaswag)
    # before the plan, as a compiled loss holds less; a dry run skips the test compile (seconds) and plans as compiled
    problem = compile_problem(device) if compile and not dry_run else None
    problem = agreed_problem(problem, rank, world_size)  # all ranks compiled, or none
    if problem:
        report.warn(f"compile=True but {problem}: training without torch.compile")
    compiled = compile and not problem
    # the memory plan: what training will hold per device, checked against what was free before the model
    planned = dict(batch_size=batch_size, dtype=dtype, optimizer=optimizer, world_size=world_size,
                   parallelism=parallelism, activation_checkpointing=activation_checkpointing, device_type=device_type,
                   micro_steps=accum_steps, fsdp_reduce=fsdp_reduce, training=not eval_only, compiled=compiled)
    if batch_size == "auto":
        own = batch_size = largest_batch(model, planned, free) if free is not None else None
        if distributed:  # every process must take the same micro-batch: the one that fits on all of them
            box = torch.tensor(batch_size or 0, device=device)
            dist.all_reduce(box, op=dist.ReduceOp.MIN)
            batch_size = int(box) or None
        if batch_size is None:
            raise UserError(no_auto_batch(model, planned, free) if own is None else "batch_size='auto' found no "
                            "micro-batch that fits on another process of this run: its own line says what would")
        config["batch_size"] = planned["batch_size"] = batch_size  # what config.json and checkpoints record
        report.print(f"batch_size auto: {batch_size} sequences per micro-step")
    # here, once the model's shape (from init_from) and batch_size='auto' are settled: the config trained
    report.print("config: " + ", ".join(f"{k}={v!r}" for k, v in config.items()))
    if runs_own:
        report.print("the run's own settings, which this command does not give: "
                     + ", ".join(f"{k}={v!r}" for k, v in runs_own.items()))
    relogs = None  # why this session's steps may differ from those the run logged past its checkpoint (None: they cannot)
    if checkpoint is not None:  # a resume takes the settings this command gives: say which differ from the run's
        run_config = {**config_defaults, **checkpoint["config"]}  # a setting newer than the run: its default then
        changed = {k: v for k, v in config.items() if k not in RESUME_SAME and run_config.get(k, v) != v}
        if changed:
            report.print(f"{'evaluating' if eval_only else 'resumed'} with settings other than the run's: "
                         + ", ".join(f"{k}={v!r} (was {run_config[k]!r})" for k, v in changed.items()),
                         always=True)
        relogs = "with other settings" if any(k in VALUE_KEYS for k in changed) else \
            "on data that has changed since" if change else None  # (rank 0's: only its Reporter starts wandb)
        if any(k in SCHEDULE_KEYS for k in changed) and not eval_only:  # extending a run's schedule moves its rate
            rates = [get_lr(checkpoint["iter_num"], *(c[k] for k in SCHEDULE_KEYS[1:])) if c["decay_lr"]
                     else c["learning_rate"] for c in (run_config, config)]
            if not math.isclose(*rates, rel_tol=1e-3):
                report.print(f"the learning rate at iter {checkpoint['iter_num']} is {rates[1]:.3g} by this command's "
                             f"schedule, where the run's gave {rates[0]:.3g}"
                             + (f" ({rates[1] / rates[0]:.3g}x)" if rates[0] else ""), always=True)
        windows = [k for k in ("batch_size", "eval_iters") if k in changed]
        if windows and not eval_only:  # the evaluation's batches are eval_iters x batch_size windows of each split
            best = checkpoint["best_val_loss"]  # best.pt's, unless the weights the run started from (iter 0) are best
            report.warn(f"{' and '.join(windows)} changed: evaluations from here read other batches of each split, so "
                        "val losses before and after are not on the same windows" + (
                            f", and the best val loss ({best:.4f}, iter {checkpoint['best_iter']}) was measured on the "
                            "old ones" if math.isfinite(best) else ""))
    tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
    eval_text = (f"{eval_iters} batches of {batch_size} sequences x {block_size} tokens per split = "
                 f"{eval_iters * batch_size * block_size:,} tokens")  # what an eval_only run does, for its lines
    report.print(f"evaluation: {eval_text}" if eval_only else f"tokens per iteration {tokens_per_iter:,} ("
                 f"{plural(gradient_accumulation_steps, 'micro-step')} x {plural(batch_size, 'sequence')} x "
                 f"{block_size} tokens)")
    model.prefer_attention(attention_kernel)
    if fp8:
        report.print(f"fp8: {use_fp8(model, batch_size * block_size)} matmuls in the blocks run in float8, the "
                     f"head in {dtype}")
    needs = plan(model, **planned)
    report.print(describe(needs, free))
    if dry_run and eval_only:
        report.print(f"dry run: {model.parameters_text()}, an evaluation of {eval_text}")
    elif dry_run:
        report.print(f"dry run: {model.parameters_text()}, "
                     f"{model.flops_per_token() / 1e9:.3f} GFLOPs per token in training, {tokens_per_iter:,} tokens "
                     f"per step, {model.flops_per_token() * tokens_per_iter / 1e12:.3f} TFLOPs per step")
    check_fits(needs, free, model, planned)
    if dry_run:
        report.print("dry run: it fits; nothing trained or written")
        leave_distributed(world_size)
        sys.exit(0)
    model.to(device)
    if fsdp:
        shard(model, dtype)  # before the optimizer is made: it must hold the shards

    # ---- optimizer, and the rest of a resumed run's state
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))  # fp16 needs loss scaling, bf16 not
    # the setting `optimizer` names the kind; from here on the name holds the optimizer itself
    optimizer = None if eval_only else build_optimizer(model, optimizer, weight_decay, learning_rate, (beta1, beta2),
                                                       muon_lr, muon_momentum, device_type)  # eval_only: no moments
    wandb_run_id, skip_first_eval, streak_before = None, False, 0
    if init_from not in ("scratch", "resume") and start_optimizer is not None and not eval_only:
        refused = take_optimizer_state(optimizer, start_optimizer)
        report.print(f"optimizer state of {init_from} " + (f"not taken: {refused}" if refused else "taken (its moments)"))
    if checkpoint is not None and eval_only:  # the weights alone, as the memory plan of an evaluation counts
        load_model_state(model, checkpoint["model"], ckpt_path)
        iter_num, checkpoint = checkpoint["iter_num"], None
    if checkpoint is not None:
        state = restore_training_state(checkpoint, ckpt_path, model, optimizer, scaler, rank, world_size, device_type)
        iter_num, tokens_seen, best_val_loss, best_iter = (state[k] for k in PROGRESS_KEYS)
        wandb_run_id = state["wandb_run_id"]
        copied = copied_from(state["folder"], out_dir, wandb_run_id)
        if copied:  # a fork: it would log its steps into the original's wandb run, now or later
            wandb_run_id = fork_run_id(wandb_run_id, out_dir)  # the same for every session of the copy until it saves
            copy = os.path.realpath(out_dir)
            if "wandb_run_name" not in given:  # named after the copy's folder, which config.json then records
                config["wandb_run_name"] = wandb_run_name = f"{wandb_run_name} ({os.path.basename(copy)})"
            if wandb_log:
                report.print(f"wandb: {out_dir} is a copy of the run in {copied}, which logs to the same wandb run; "
                             f"this copy logs to a wandb run of its own, {wandb_run_name!r}", always=True)
        streak_before = state["nonfinite_streak"]  # a streak of skipped steps goes on counting across the resume
        skip_first_eval = state["evaluated"]  # the checkpoint was written right after this eval
        if not state["rng_restored"]:  # another world size: fresh streams, still a function of (seed, step, rank)
            torch.manual_seed(seed_from((seed, 2, iter_num, rank)))
        checkpoint = None  # free the CPU copy
    # a resume may have changed the batch: the steps done count what they took
    work = f"{max_iters:,} steps of {tokens_per_iter:,} tokens ({gradient_accumulation_steps * batch_size} " \
        f"sequences): {tokens_seen + max(0, max_iters - iter_num) * tokens_per_iter:,} tokens planned; starting at " \
        f"iteration {iter_num}" + (f", {tokens_seen:,} tokens in" if iter_num else "")
    if eval_only:
        work = "one evaluation" + (f" of iteration {iter_num}" if init_from == "resume" else "")
    report.print(f"model: {model.parameters_text()}; {work}; world size {world_size}, {device}, {dtype}, "
                 f"compile {compile}")

    # ---- compile and DDP wrap
    raw_model = model  # what gets saved: no _orig_mod. or module. prefixes
    if compiled:
        report.print(f"compiling the model (mode {compile_mode})...")
        model = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
    eval_model = model
    if distributed and not fsdp and not eval_only:  # an evaluation computes no gradients to all-reduce
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device_type == "cuda" else None)

    def evaluates(it: int) -> bool:
        """Whether the loop evaluates (and may checkpoint) at step it: every eval_interval steps, and the last."""
        return it % eval_interval == 0 or it >= max_iters

    def write_sample(it: int):
        """Generate sample_tokens tokens from sample_prompt on rank 0 and report them."""
        encode, decode = codec
        prompt = torch.tensor(encode(sample_prompt), dtype=torch.long, device=device)[None]
        raw_model.eval()
        try:
            with torch.no_grad(), ctx:  # its own generator: sampling leaves the training RNG streams alone
                ids = raw_model.generate(prompt, sample_tokens, temperature=0.8, top_k=200,
                                         generator=torch.Generator(device).manual_seed(seed),
                                         n_tokens=decodable_ids(data["vocabulary"]))
        except FloatingPointError as e:  # the evaluation has its loss; a sample is not worth the run
            report.warn(f"no sample at iter {it}: {e}")
            return
        finally:
            raw_model.train()
        report.sample(it, decode(ids[0].tolist()))

    def stop_here(streak: int, where: str):
        """A stop that a signal asked for: save the weights and say so, unless the last `streak` steps were skipped
        as non-finite, weights no evaluation vouches for: then the resume goes back to the last checkpoint."""
        if streak:
            report.print(f"stopped by signal {where}, in {plural(streak, 'step')} in a row with a non-finite loss or "
                         "gradient norm: not saved; " + (f"--init_from=resume goes on from {saved[0]} at iter "
                                                         f"{saved[1]}" if saved else "no checkpoint had been written"),
                         always=True)
        else:
            save(evaluated=False, improved=False, streak=0)
            report.print(f"stopped by signal {where}; resume with --init_from=resume", always=True)

    def save(evaluated: bool, improved: bool, streak: int):
        """Checkpoint the whole run state to ckpt.pt (and best.pt, ckpt_<iter>.pt), with the streak of steps skipped
        as non-finite up to it (as the caller read it). All ranks call it; when rank 0 cannot save, every rank stops
        with its message."""
        rng_states = gather_rng_states(device_type, world_size)
        model_state, optimizer_state = full_state(raw_model, optimizer, keep=rank == 0)  # gathered under FSDP

        def write():
            progress = dict(iter_num=iter_num, tokens=tokens_seen, best_val_loss=best_val_loss, best_iter=best_iter,
                            nonfinite_streak=streak)
            save_checkpoint(training_state(model_state, optimizer_state, scaler, model_args, config, progress, rng_states,
                                           wandb_run_id, evaluated, data["vocabulary"], data_files,
                                           os.path.realpath(out_dir)),
                            os.path.join(out_dir, "ckpt.pt"))
            publish_checkpoint(out_dir, iter_num, improved, keep_last_n if evaluated else 0)  # a signal's save: ckpt.pt only
            report.print(f"saved checkpoint to {out_dir}/ckpt.pt" + (" and best.pt" if improved else ""))
        on_rank0(write, rank, world_size)

    if eval_only:  # one evaluation into eval.json; the run's metrics, summary, config and run.json stay as they are
        losses = estimate_loss(eval_model, eval_batch, eval_iters, ctx, rank, world_size)
        ours = init_from == "resume"  # else a step and a checkpoint name that are not this run's
        report.eval_only(dict(init_from=init_from, checkpoint=resume_from if ours else None, iter=iter_num if ours else None,
                              dataset=dataset, eval_iters=eval_iters, batch_size=batch_size, block_size=block_size,
                              train_loss=losses["train"], val_loss=losses["val"]))
        leave_distributed(world_size)
        sys.exit(0)

    # ---- the run's files are written only now that every input has been checked (a resume's repair above only
    # finishes the last save of the run)
    stale_files = on_rank0(lambda: check_new_run(out_dir, overwrite, init_from) if init_from != "resume" else [],
                           rank, world_size)
    wandb_run_id = on_rank0(lambda: report.start(  # its checks (metrics.csv, wandb's start) stop every rank
        config, dict(world_size=world_size, device=device, dtype=dtype, parameters=raw_model.get_num_params(),
                     tokens_per_iter=tokens_per_iter, start_iter=iter_num),
        # a resumed run drops rows logged after its checkpoint; a new run starts a new log
        truncate_at=iter_num if init_from == "resume" else -1,
        wandb_settings=dict(project=wandb_project, name=wandb_run_name, id=wandb_run_id, relogs=relogs)
        if wandb_log else None,
        redone=evaluates(iter_num) and not skip_first_eval,  # the loop's test at its first step
    ), rank, world_size) or wandb_run_id
    if master_process:  # with overwrite=True, the earlier run's checkpoints and results go (start emptied metrics.csv)
        deleted = [name for name in stale_files if name != "metrics.csv"]
        for name in deleted:
            os.remove(os.path.join(out_dir, name))
        done = ([f"deleted the earlier run's {', '.join(deleted)}"] if deleted else []) + \
            (["began metrics.csv anew"] if "metrics.csv" in stale_files else [])
        if done:
            report.print(f"overwrite=True: {', and '.join(done)}", always=True)
        lock.claim(f"train.py (pid {os.getpid()} on {socket.gethostname()}, started "
                   f"{datetime.datetime.now().isoformat(timespec='seconds')})")
    peak = peak_flops(device)
    stop = StopFlag()

    # ---- training loop
    skip_on_device = not sync_every_step and skips_on_device(optimizer)
    skipped_steps = torch.zeros((), device=device)
    in_a_row, worst_in_a_row = (torch.full((), float(streak_before), device=device) for _ in range(2))
    skipped_reported, last_losses, last_eval_iter = 0, None, None
    saved = (ckpt_path, iter_num) if init_from == "resume" else None  # the checkpoint to go back to, if any
    t_start, train_time, start_iter = time.monotonic(), 0.0, iter_num
    # the session's first step compiles the graphs (with compile) and warms the device up: it is timed apart
    # (first_step_s), and the times (tok/s, the ETA, the summary's means) are of the steps after it
    first_step_s = None
    train_batches = Prefetcher(read_train_batch, ((it, m) for it in itertools.count(iter_num) for m in range(accum_steps)),
                               prefetch_batches, device)
    X, Y = next(train_batches)
    t_log, iters_since_log = time.monotonic(), 0
    stopped_by_signal = False  # the loop's own verdict: under DDP the signal may have come to another rank
    while True:
        lr = (get_lr(iter_num, learning_rate, warmup_iters, lr_decay_iters, min_lr, lr_schedule, cooldown_frac)
              if decay_lr else learning_rate)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # Muon's groups run at muon_lr / learning_rate of it

        # evaluate and checkpoint, unless the checkpoint just resumed was written right after this same eval
        if evaluates(iter_num) and not skip_first_eval:
            t_eval = time.monotonic()
            losses = estimate_loss(eval_model, eval_batch, eval_iters, ctx, rank, world_size, stop=lambda: stop.requested)
            evals_done = -(-iter_num // eval_interval) + 1  # counting iter 0's; from the step, so a resume keeps the schedule
            if losses is not None and hellaswag and evals_done % hellaswag_interval == 0:
                # the uncompiled model, as items vary in length; a stop drops it and the losses with it
                scored = score(raw_model, *hellaswag, device, ctx, rank, world_size, stop=lambda: stop.requested)
                losses = None if scored is None else {**losses, "hellaswag": scored["acc_norm"]}
            if losses is None:  # a stop signal came during it: dropped (a long one would outlast a scheduler's grace)
                t_log += time.monotonic() - t_eval
                if iters_since_log:
                    train_time += time.monotonic() - t_log
                if iter_num == start_iter and saved:  # nothing trained since the checkpoint this session resumed
                    report.print(f"stopped by signal during the evaluation at iter {iter_num}, before any step of this "
                                 "session: nothing to save; resume with --init_from=resume", always=True)
                else:  # the resume evaluates again (a new run's first weights too: saved, so that it resumes)
                    stop_here(int(in_a_row.item()), f"during the evaluation at iter {iter_num} (dropped)")
                stopped_by_signal = True
                break
            improved = math.isfinite(losses["val"]) and losses["val"] < best_val_loss  # NaN never becomes best
            if improved:
                best_val_loss, best_iter = losses["val"], iter_num
            last_losses, last_eval_iter = losses, iter_num
            report.eval(iter_num, tokens_seen, losses)
            final = iter_num >= max_iters  # always saved, so a finished run is known as one and resumes as nothing
            finite = math.isfinite(losses["val"])
            if final and not finite:  # not a finished run: its last weights are not finite
                raise UserError(f"the last evaluation (iter {iter_num}) gave val loss {losses['val']}: the weights are "
                                f"not finite and were not saved; {kept_checkpoint(saved)}. Lower "
                                "learning_rate, raise warmup_iters or check the data")
            # steps skipped up to now left the weights as the last step applied made them: one bad batch, or weights
            # a step broke (a val loss of 1e11 is finite). Only an evaluation that beats the best tells the two apart
            streak = int(in_a_row.item())  # one sync, beside the evaluation's own
            in_doubt = streak > 0 and not improved
            if final and in_doubt:
                raise UserError(f"the run ended in {plural(streak, 'step')} in a row with a non-finite loss or gradient "
                                f"norm, and its val loss {losses['val']:.4g} is no better than the best: its weights were "
                                f"not saved; {kept_checkpoint(saved)}. Lower learning_rate, raise warmup_iters or check "
                                "the data")
            # the sample before the save: a kill between the two then redoes both on resume, rather than neither
            if master_process and sample_interval and evals_done % sample_interval == 0:
                if finite:
                    write_sample(iter_num)
                else:  # nothing to sample from
                    report.print(f"iter {iter_num}: no sample, the val loss is {losses['val']}", always=True)
            if iter_num > 0 and finite and (improved or always_save_checkpoint or final):
                if in_doubt:
                    report.print(f"iter {iter_num}: not saved, as the last {plural(streak, 'step')} were skipped as "
                                 f"non-finite and the val loss is no better than the best; {kept_checkpoint(saved)}",
                                 always=True)
                else:
                    save(evaluated=True, improved=improved, streak=streak)
                    saved = (os.path.join(out_dir, "ckpt.pt"), iter_num)
            t_log += time.monotonic() - t_eval  # keep evaluation out of the ms/iter figures
        skip_first_eval = False
        if iter_num >= max_iters:
            break

        # one optimizer step: accum_steps micro-steps, gradients all-reduced on the last one only
        loss_sum = torch.zeros((), device=device)
        for micro_step in range(accum_steps):
            sync = not distributed or micro_step == accum_steps - 1
            if fsdp and fsdp_reduce == "step":  # reduce-scatter on the last micro-step only; weights stay gathered till then
                raw_model.set_requires_gradient_sync(sync)
                raw_model.set_reshard_after_backward(sync)
            with ctx, (nullcontext() if sync or fsdp else model.no_sync()):
                # the logits dropped at once: held through backward, they would be one more (B, T, vocab) tensor
                loss = model(X, Y)[1] / accum_steps  # the gradient of the mean over micro-steps
            X, Y = next(train_batches)  # the next micro-step's, copied while the device works on this one
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        scaler.unscale_(optimizer)
        grad_norm = full(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf")))
        skip = nonfinite_flag(loss_sum, grad_norm, scaler.is_enabled(), distributed)
        take_step(optimizer, scaler, skip, on_device=skip_on_device)
        skipped_steps += skip  # these three stay on the device until the next check
        in_a_row = (in_a_row + skip) * skip
        worst_in_a_row = torch.maximum(worst_in_a_row, in_a_row)
        iter_num += 1
        tokens_seen += tokens_per_iter
        iters_since_log += 1
        first_step = iter_num == start_iter + 1

        # the host looks at the verdicts every step only when asked to (or the optimizer cannot skip on the
        # device); otherwise once per log line (and after the first step, to time it), so the device's queue is
        # never drained mid-interval
        log_now = iter_num % log_interval == 0 or iter_num == max_iters
        stop_check = stop.requested if not distributed else iter_num % STOP_CHECK_STEPS == 0  # a host bool: free to read
        if log_now or stop_check or sync_every_step or not skip_on_device or first_step:
            stop_flag = torch.tensor(float(stop.requested), device=device)
            if distributed:
                dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)  # a signal to any one rank stops them all
                if log_now:
                    dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)  # the mean over every rank's micro-steps
            loss_value, grad_value, skipped, worst, streak, stop_now = torch.stack(
                [loss_sum, grad_norm.float(), skipped_steps, worst_in_a_row, in_a_row, stop_flag]).tolist()  # one sync
            if skipped > skipped_reported:
                skipped_reported = int(skipped)
                report.print(f"iter {iter_num}: non-finite loss or gradient norm, {plural(skipped_reported, 'step')} "
                             "skipped so far this session", always=True)
            if worst >= max_nonfinite_steps:
                raise UserError(f"{int(worst)} steps in a row had a non-finite loss or gradient norm (by iter "
                                f"{iter_num}): stopping; {kept_checkpoint(saved)}. Lower "
                                "learning_rate, raise warmup_iters or check the data")
            if log_now or first_step:
                t_now = time.monotonic()  # after the sync above, so the timing is real
                dt = (t_now - t_log) / iters_since_log
                if first_step:
                    first_step_s = dt
                    report.print(f"first step: {dt:.2f} s" + (" (compiling the model)" if compiled else "")
                                 + "; the times from here leave it out")
                else:
                    train_time += t_now - t_log
                t_log, iters_since_log = t_now, 0
            if log_now:
                report.step(iter_num, max_iters, tokens_seen, loss_value, lr, grad_value, dt, tokens_per_iter / dt,
                            raw_model.estimate_mfu(tokens_per_iter // world_size, dt, peak), t_now - t_start,
                            iter_num - start_iter - 1, train_time)
            if stop_now:
                if iters_since_log:  # the steps since the last log line count in the summary's times too
                    train_time += time.monotonic() - t_log
                stop_here(int(streak), f"at iter {iter_num}")
                stopped_by_signal = True
                break

    train_batches.close()
    stop.training = False

    # ---- summary
    steps_done = iter_num - start_iter - 1 if first_step_s is not None else 0  # the timed steps
    if steps_done == 0 and first_step_s is not None:  # the session's only step: its time is all there is to go on
        steps_done, train_time = 1, first_step_s
    report.summary({
        "iters": iter_num, "tokens": tokens_seen, "stopped_by_signal": stopped_by_signal, "skipped_steps": int(skipped_steps.item()),
        "final_train_loss": last_losses["train"] if last_losses else None,
        "final_val_loss": last_losses["val"] if last_losses else None, "final_loss_iter": last_eval_iter,
        "best_val_loss": best_val_loss if math.isfinite(best_val_loss) else None, "best_iter": best_iter,
        "wall_time_s": time.monotonic() - t_start, "first_step_s": first_step_s,
        "mean_tokens_per_sec": steps_done * tokens_per_iter / train_time if train_time else None,
        "mean_mfu": (raw_model.estimate_mfu(tokens_per_iter // world_size, train_time / steps_done, peak)
                     if steps_done and train_time else None),
        "checkpoint": os.path.join(out_dir, "ckpt.pt") if os.path.exists(os.path.join(out_dir, "ckpt.pt")) else None,
    })
    report.finish()
    del model  # the DDP wrapper holds the process group
    leave_distributed(world_size)
