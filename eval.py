"""
HellaSwag accuracy of a trained model or of GPT-2 (see hellaswag.py for how it is scored):

    python eval.py --out_dir=out-gpt2                      # the checkpoint in out_dir
    python eval.py --init_from=gpt2 --device=cuda          # GPT-2 124M (0.2955 acc_norm published; see README)
    torchrun --standalone --nproc_per_node=8 eval.py --init_from=gpt2-xl
    python eval.py --init_from=gpt2 --hellaswag=path/to/hellaswag_val.jsonl --limit=500

Under torchrun each process scores its share of the items. The result is printed, and written as JSON to
out_file when one is named.
"""
import os
import sys
import tempfile
import time

import configurator
from checkpoint import check_init_from, checkpoint_file, load_trained
from common import (UserError, autocast_context, check_device, launcher_ranks, leave_distributed,
                    replaceable_result, resolve_dtype, setup_distributed, start_script, to_devnull,
                    write_json)
from hellaswag import check_encodable, find_data, read_examples, score
from tokenizer import codec

init_from = "resume"  # 'resume' (a checkpoint in out_dir, ours or nanoGPT's), gpt2, gpt2-medium, gpt2-large, gpt2-xl, a folder saved by transformers, or a checkpoint file
out_dir = "out"  # where the checkpoint is, with init_from='resume'
checkpoint = "ckpt.pt"  # which checkpoint in out_dir: ckpt.pt (latest), best.pt (best val loss) or ckpt_<iter>.pt
hellaswag = ""  # the validation jsonl; '' uses data/hellaswag/hellaswag_val.jsonl, downloading it there first
limit = 0  # score only the first this many items; 0: all [limit >= 0]
out_file = ""  # also write the result here as JSON, replacing only an earlier result; '': print only [out_file == '' or out_file.endswith('.json')]
device = "cuda"  # 'cpu', 'cuda', 'cuda:N' or 'mps'
dtype = "float32"  # as the published figures were scored (16-bit logits can flip items whose endings score close); 'bfloat16', 'float16' or 'auto' (bf16 where the GPU has it, else fp16; fp32 off CUDA) are faster [dtype in ('auto', 'float32', 'bfloat16', 'float16')]
backend = "auto"  # under torchrun: 'nccl' (CUDA only), 'gloo', or 'auto' (nccl on CUDA, gloo otherwise) [backend in ('auto', 'gloo') or (backend == 'nccl' and device.startswith('cuda'))]
config_defaults = configurator.config_keys(globals())  # taken here, so only the names above are settings
RESULT_KEYS = {"model", "items", "acc", "acc_norm", "dtype"}  # what this script writes to out_file


def check_out_file(path: str):
    """Refuse an out_file that cannot be written, or whose replacement would lose another file: an existing one
    is overwritten only when it holds an earlier result of this script (not a run's summary.json or meta.json)."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"out_file {path}: its folder does not exist: create it, or name another")
    if os.path.isdir(path):
        raise UserError(f"out_file {path} is a folder: name a .json file")
    fix = "choose another out_file, or remove that file"
    if not replaceable_result(path, RESULT_KEYS, fix):
        raise UserError(f"out_file {path} already exists and is not an earlier result of eval.py: {fix}")
    # before the scoring (an hour for a large model): the name of write_json's temporary file must fit, and a file
    # of a block of bytes (a name of its own, as every rank probes) must be written there, which a full disk fails
    name_max = os.pathconf(folder, "PC_NAME_MAX")
    if len(os.fsencode(os.path.basename(path) + ".tmp")) > name_max:
        raise UserError(f"out_file {path}: its name is longer than the {name_max - 4} bytes a name may have there: "
                        "name a shorter file")
    probe = None
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".eval-probe-")
        with open(fd, "wb") as f:
            f.write(bytes(4096))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise UserError(f"out_file {path}: cannot write in {folder} ({e.strerror or e}): name a file on a writable "
                        "disk with space") from None
    finally:
        if probe is not None:
            os.remove(probe)


if __name__ == "__main__":
    start_script()
    config = configurator.configure(config_defaults, sys.argv[1:], __file__)
    globals().update(config)
    check_init_from(init_from, ("resume",), checkpoint)
    device_type = check_device(device)
    dtype = resolve_dtype(dtype, device_type)
    check_out_file(out_file)
    ckpt_path = checkpoint_file(out_dir, checkpoint)
    # the files named are checked before anything is downloaded (GPT-2's weights, then HellaSwag's items)
    data_path = find_data(hellaswag, "hellaswag") if hellaswag else None
    model, vocab = load_trained(init_from, ckpt_path)
    examples = read_examples(data_path or find_data(hellaswag, "hellaswag"))[:limit or None]
    rank, _, world_size, device = setup_distributed(launcher_ranks(os.environ), device, backend)
    model.to(device)
    encode, _ = codec(vocab, model.config.vocab_size)
    check_encodable(examples, encode)
    source = ckpt_path if init_from == "resume" else init_from
    t0 = time.time()

    def progress(done: int, total: int, acc_norm: float):
        if rank == 0:
            try:
                print(f"hellaswag {done:,}/{total:,} items, {time.time() - t0:.0f}s: acc_norm so far {acc_norm:.4f} "
                      "(rank 0's share)", flush=True)
            except BrokenPipeError:  # stdout's reader went (`| head -1`): the scoring goes on, for out_file
                to_devnull(sys.stdout)

    result = score(model, examples, encode, device, autocast_context(device_type, dtype), rank, world_size, progress)
    result = {"model": source, **result, "dtype": dtype}
    unwritten = None
    if rank == 0:
        if out_file:  # first: the result is kept whatever becomes of stdout (a closed pipe, a full disk)
            try:
                write_json(out_file, result)
            except OSError as e:  # the disk filled while scoring: the result is printed all the same
                unwritten = e
        print(f"hellaswag of {source}: acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f} over "
              f"{result['items']:,} items ({time.time() - t0:.0f}s)", flush=True)
    leave_distributed(world_size)  # every rank, before rank 0's error: under torchrun the others wait to leave
    if rank == 0 and unwritten:
        raise UserError(f"out_file {out_file}: cannot write it ({unwritten.strerror or unwritten}): the result is "
                        "the line above; free space on that disk, or name another out_file next time")
