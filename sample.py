"""
Samples text from a trained model (out_dir/ckpt.pt) or from OpenAI's GPT-2 weights:

    python sample.py --out_dir=out-shakespeare-char --device=cpu
    python sample.py --init_from=gpt2-xl --start="What is the answer to life?" --num_samples=3
    python sample.py --start=FILE:prompt.txt

Text is decoded with the characters the checkpoint was trained on when it is a character model, else with
GPT-2's BPE.
"""
import sys

import torch

import configurator
from checkpoint import check_init_from, checkpoint_file, load_trained
from common import UserError, autocast_context, check_device, compile_problem, resolve_dtype, start_script
from tokenizer import codec, decodable_ids, encode_setting

# ---- model
init_from = "resume"  # 'resume' (a checkpoint in out_dir, ours or nanoGPT's), gpt2, gpt2-medium, gpt2-large, gpt2-xl, a folder saved by transformers, or a checkpoint file
out_dir = "out"  # where the checkpoint is, with init_from='resume'
checkpoint = "ckpt.pt"  # which checkpoint in out_dir: ckpt.pt (latest), best.pt (best val loss) or ckpt_<iter>.pt
# ---- sampling
start = "\n"  # the prompt; "FILE:prompt.txt" reads it from a file
num_samples = 10  # samples to draw [num_samples > 0]
max_new_tokens = 500  # tokens per sample [max_new_tokens > 0]
temperature = 0.8  # 1.0 samples the model's distribution as is; lower is more conservative; 0 is greedy [0 <= temperature < inf]
top_k = 200  # sample only among the top_k most likely tokens; 0 disables the cut [top_k >= 0]
top_p = 1.0  # nucleus sampling: then only among the fewest most likely tokens whose probabilities add up to top_p (0.9, say); 1.0 disables the cut [0 < top_p <= 1]
seed = 1337  # same seed, same samples [0 <= seed < 2**63]
# ---- system
device = "cuda"  # 'cpu', 'cuda', 'cuda:N' or 'mps'
dtype = "auto"  # 'float32', 'bfloat16', 'float16', or 'auto' (bf16 where the GPU has it, else fp16; fp32 off CUDA) [dtype in ('auto', 'float32', 'bfloat16', 'float16')]
compile = False  # torch.compile the model: worth it only for long generations
config_defaults = configurator.config_keys(globals())  # taken here, so only the names above are settings


def read_prompt(start: str) -> str:
    """The prompt: start itself, or the text of the file that "FILE:path" names."""
    if not start.startswith("FILE:"):
        return start
    path = start[len("FILE:"):]
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark is no part of the prompt
            return f.read()
    except FileNotFoundError:
        raise UserError(f"start={start!r}: prompt file {path!r} not found: check the path after FILE:") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"start={start!r}: prompt file {path} cannot be read as UTF-8 text ({e.__class__.__name__})") from None


if __name__ == "__main__":
    start_script()
    config = configurator.configure(config_defaults, sys.argv[1:], __file__)
    globals().update(config)

    check_init_from(init_from, ("resume",), checkpoint)
    device_type = check_device(device)
    dtype = resolve_dtype(dtype, device_type)
    prompt = read_prompt(start)
    torch.manual_seed(seed)
    ctx = autocast_context(device_type, dtype)

    model, vocab = load_trained(init_from, checkpoint_file(out_dir, checkpoint))
    model.eval().to(device)
    problem = compile_problem(device) if compile else None
    if problem:  # sampling works the same without: say so, rather than fail deep inside the first forward pass
        print(f"warning: compile=True but {problem}: sampling without torch.compile", file=sys.stderr)
    elif compile:
        model.forward = torch.compile(model.forward, dynamic=True)  # generate() calls forward on growing inputs
    encode, decode = codec(vocab, model.config.vocab_size)
    ids = encode_setting(encode, "start", prompt, config_defaults["start"])
    if not ids:
        raise UserError("start is empty: give a prompt of at least one token, e.g. --start=ROMEO:, or leave --start "
                        "out for the default, a newline")
    if len(ids) > model.config.block_size:  # printed whole below, though the model sees only its end
        print(f"note: the prompt's {len(ids):,} tokens are more than block_size {model.config.block_size}: the model "
              f"sees its last {model.config.block_size}", file=sys.stderr)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
    with torch.no_grad(), ctx:
        for _ in range(num_samples):
            try:
                y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None,
                                   top_p=top_p, n_tokens=decodable_ids(vocab))
            except FloatingPointError as e:
                fix = "try --dtype=float32" if dtype != "float32" else "check the checkpoint"
                raise UserError(f"{e}, sampling in {dtype}: {fix}") from None
            print(decode(y[0].tolist()))
            print("---------------")
