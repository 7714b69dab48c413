"""
The ground floor that every script stands on: the user-error type, the scripts' start (their error hook, and
output that any terminal can show) and their flag parser's one-line errors, device and
dtype resolution, the autocast context, joining torchrun's process group and the ranks' agreement on a stop, the
compile check, peak FLOP/s by GPU, and the durable atomic write that the files the project replaces whole go
through (metrics.csv and samples.txt are appended to; a dataset's token files, written in place as .tmp files, are
renamed in by dataset.write_meta). It imports nothing from the project, and torch only inside
the device and process-group helpers: data preparation and its worker processes use this module without loading
torch.
"""
import argparse
import errno
import importlib.util
import io
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import threading
import traceback
from contextlib import contextmanager, nullcontext


class UserError(ValueError):
    """Bad input from the user. Scripts print its message on one line and exit non-zero (see excepthook)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's, for the scripts that take flags of their own (plot.py, the prepare scripts): a bad flag is one
    error line, as a bad setting is elsewhere, where argparse printed its usage and then 'prog: error: ...'."""

    def __init__(self, doc: str):  # the script's docstring as its --help, laid out as written
        super().__init__(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message):
        self.exit(2, f"error: {message}: see {sys.argv[0]} --help\n")  # as run: data/shakespeare/prepare.py


def start_script():
    """What each script does first: an uncaught exception goes through excepthook, and stdout and stderr write any
    text, a character their encoding lacks (an ASCII or Latin-1 locale, PYTHONIOENCODING=ascii) as a backslash
    escape, where stdout would raise UnicodeEncodeError at the first config line, path or sample that holds one."""
    sys.excepthook = excepthook
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # not a stream closed at the start (None) or one a caller replaced
            stream.reconfigure(errors="backslashreplace")


def excepthook(exc_type, exc, tb):
    """sys.excepthook for the scripts: a UserError is one line on stderr, with the traceback only when
    NANOGPT_TRACEBACK=1, as is a Ctrl-C before train.py's own handler takes over (StopFlag, once training
    starts), a GPU out of memory, and a process's loss of a peer that stopped first (the peer's own error is the
    one to read); any
    other exception is a bug and keeps its traceback, a collective's timeout then an error line that names
    ddp_timeout. A gloo process group still alive is destroyed: left to
    the interpreter's exit, gloo's threads abort the process (SIGABRT) now and then, hiding the exit status."""
    lost = peer_lost(exc)
    if os.environ.get("NANOGPT_TRACEBACK") == "1":
        traceback.print_exception(exc_type, exc, tb)
    elif issubclass(exc_type, UserError):
        print(f"error: {exc}", file=sys.stderr)
    elif issubclass(exc_type, KeyboardInterrupt):
        print("interrupted (Ctrl-C)", file=sys.stderr)
    elif lost:
        print(f"error: another process of this run stopped ({lost}): its own output says why", file=sys.stderr)
    elif out_of_memory(exc_type):  # a GPU's: the batch asked for more than there is
        said = ". ".join(str(exc).strip().split(". ")[:3]).rstrip(".")  # what it asked for, and what was free
        print(f"error: the GPU ran out of memory ({said}): use a smaller micro-batch "
              "(batch_size, raising gradient_accumulation_steps to keep the tokens per step) "
              "or activation_checkpointing=True; NANOGPT_TRACEBACK=1 shows where", file=sys.stderr)
    elif issubclass(exc_type, BrokenPipeError) and stdout_closed():  # its reader went (`| head`): as a shell tool,
        to_devnull(sys.stdout)  # quietly
    else:
        traceback.print_exception(exc_type, exc, tb)
        waited = collective_timeout(exc)
        if waited:  # after the traceback, which says where this process waited
            print(f"error: this process waited {waited} for another of this run, past ddp_timeout: that one is slow "
                  "(rank 0 saving a large checkpoint, say) or hung; if slow, raise --ddp_timeout", file=sys.stderr)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()


def out_of_memory(exc_type) -> bool:
    """Whether exc_type is torch's out-of-memory error (a GPU's; a CPU raises a RuntimeError)."""
    oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    return oom is not None and issubclass(exc_type, oom)


def to_devnull(stream):
    """Point stdout or stderr at /dev/null, its reader having gone: later writes, and the exit's flush, go nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


class Outliving:
    """A stand-in for sys.stdout or sys.stderr in a process that must outlive the pipe's reader: a training run
    under `| tee log` that the same Ctrl-C ends, or under `| head`. A write that finds the reader gone points the
    stream at /dev/null and calls gone() (once) instead of raising BrokenPipeError, which would end the process
    mid-step, or from within a signal handler's message."""

    def __init__(self, stream, gone):
        self.stream, self.gone = stream, gone

    def write(self, text: str):
        return self._guarded(self.stream.write, text)

    def flush(self):
        return self._guarded(self.stream.flush)

    def _guarded(self, op, *args):
        try:
            return op(*args)
        except BrokenPipeError:
            to_devnull(self.stream)
            gone, self.gone = self.gone, None  # cleared first: gone() may write to this stream itself
            if gone is not None:
                gone()
            return op(*args)  # what was buffered, now to /dev/null

    def __getattr__(self, name):  # fileno, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it)."""
    import select
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no such fd, or no poll on this system
        return False


def peer_lost(exc: BaseException) -> str | None:
    """gloo's reason, when exc is what a collective raises in a process whose peer stopped (its connection
    closed or reset), else None; a timeout is not one (the peer may be alive and slow, saving say). NCCL has no
    such error: a lost peer is found by its watchdog, or by torchrun."""
    found = isinstance(exc, RuntimeError) and re.search(r"gloo/transport/tcp/\w+\.cc:\d+\] (.*?)(\. |\.?$)", str(exc))
    lost = found and re.search(r"Connection (closed|reset) by peer|Broken pipe", found.group(1))
    return found.group(1) if lost else None


def collective_timeout(exc: BaseException) -> str | None:
    """How long a collective or the join waited ('30 s'), when exc is torch.distributed's timeout (gloo's, or the
    store's while the processes join), else None. NCCL's watchdog ends the process itself, with its own message."""
    found = isinstance(exc, RuntimeError) and re.search(
        r"(?:[Tt]imed out (?:waiting |after )|wait timeout after )(\d+) ?(ms|seconds)", str(exc))
    return f"{int(found.group(1)) / (1000 if found.group(2) == 'ms' else 1):g} s" if found else None


# ---- devices and precision

def check_device(device: str) -> str:
    """The device type of `device`, or a UserError when that device is absent. A CUDA device given by index
    becomes the current one, so that the calls which take no device (synchronize, the RNG state, memory figures)
    mean it and not GPU 0."""
    import torch
    try:
        device_type = torch.device(device).type
    except RuntimeError:
        device_type = None
    if device_type not in ("cpu", "cuda", "mps"):  # torch knows more (meta, xla, ...), which this trainer does not run
        raise UserError(f"device '{device}' is not a device this trainer runs on: use cpu, cuda, cuda:N or mps")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device '{device}' asked for but CUDA is not available: use --device=cpu")
    index = torch.device(device).index
    if device_type == "cuda" and index is not None and index >= torch.cuda.device_count():
        raise UserError(f"device '{device}' asked for but there are {torch.cuda.device_count()} CUDA devices (0 to "
                        f"{torch.cuda.device_count() - 1})")
    if device_type == "cuda" and index is not None and "LOCAL_RANK" not in os.environ:  # torchrun: each rank's own,
        torch.cuda.set_device(index)  # set by setup_distributed (here every rank would make a context on this GPU)
    if device_type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device '{device}' asked for but MPS is not available: use --device=cpu")
    return device_type


def resolve_dtype(dtype: str, device_type: str) -> str:
    """The dtype name to run in: 'auto' picks bf16 on GPUs that have it, fp16 on older GPUs, fp32 elsewhere."""
    import torch
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise UserError(f"dtype '{dtype}' is not one of auto, float32, bfloat16, float16")
    if dtype == "auto":
        if device_type != "cuda":
            return "float32"
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if dtype == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("this GPU has no bfloat16: use --dtype=float16 (or --dtype=auto)")
    return dtype


def autocast_context(device_type: str, dtype: str):
    """The mixed-precision context for forward passes: none for float32, else torch.autocast to dtype."""
    import torch
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device_type=device_type, dtype={"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype])


def cpu_contention(load: float, cores: int, threads: int) -> str | None:
    """A warning when torch's `threads` compute threads would share `cores` with other work (the load average
    `load`, as os.getloadavg gives it, at least the cores): its threads wait on each other at every op, so a
    busy CPU can run many times slower than with one thread (a 4-layer model's step: 145 ms in 2 threads against
    36 ms in 1 on a 2-core VM with one core kept busy, where 2 threads took 22 ms on an idle one)."""
    if threads < 2 or load < cores:
        return None
    return (f"this machine's load average is {load:.1f} on {cores} cores, and torch computes in {threads} "
            "threads that wait on each other at every op: on a busy CPU, OMP_NUM_THREADS=1 can be many times faster")


# ---- processes

def launcher_ranks(env: dict) -> tuple[int, int, int] | None:
    """(rank, local_rank, world_size) as torchrun sets them in env, or None when none is set; a UserError when
    the set is partial or the values do not fit together."""
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    present = [k for k in keys if k in env]
    if not present:
        return None
    missing = [k for k in keys if k not in env]
    if missing:
        raise UserError(f"{', '.join(present)} set but not {', '.join(missing)}: launch with torchrun, which sets "
                        "them all, or unset them for a single process")
    try:
        rank, local_rank, world_size = (int(env[k]) for k in keys)
    except ValueError:
        raise UserError(f"RANK, LOCAL_RANK and WORLD_SIZE must be integers, not {[env[k] for k in keys]}") from None
    if not (0 <= rank < world_size and 0 <= local_rank <= rank):
        raise UserError(f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world_size} do not fit together: "
                        "launch with torchrun")
    return rank, local_rank, world_size


def local_processes(env: dict) -> int:
    """How many processes of this run share this node (torchrun's LOCAL_WORLD_SIZE; 1 without torchrun)."""
    raw = env.get("LOCAL_WORLD_SIZE", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise UserError(f"LOCAL_WORLD_SIZE must be a positive integer, not {raw!r}: launch with torchrun, which sets it")
    return int(raw)


def setup_distributed(ranks: tuple[int, int, int] | None, device: str, backend: str,
                      timeout_s: float = 1800) -> tuple[int, int, int, str]:
    """Join the process group when launched by torchrun (ranks from launcher_ranks). Returns (rank, local_rank,
    world_size, device)."""
    if ranks is None:
        return 0, 0, 1, device
    import datetime

    import torch
    import torch.distributed as dist
    rank, local_rank, world_size = ranks
    device_type = torch.device(device).type
    if device_type == "cuda" and local_rank >= torch.cuda.device_count():
        raise UserError(f"LOCAL_RANK {local_rank} but this node has {torch.cuda.device_count()} GPUs: start at most "
                        "that many processes per node (--nproc_per_node)")
    if device_type == "cuda":
        device = f"cuda:{local_rank}"  # one GPU per process, picked by its rank on this node
        torch.cuda.set_device(device)
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return rank, local_rank, world_size, device


def leave_distributed(world_size: int):
    """Leave the process group together (a no-op for one process). A rank tearing down gloo while another still
    talks to it can abort; and a group still alive when the interpreter exits aborts its process (SIGABRT) now and
    then, so it is destroyed here: drop any DDP wrapper first (`del model`), as DDP's reducer holds the group."""
    if world_size == 1:
        return
    import gc

    import torch.distributed as dist
    dist.barrier()
    gc.collect()  # the dropped wrapper's reducer, if a reference cycle still holds it
    dist.destroy_process_group()


STOP_CHECK_STEPS = 10  # under several processes: steps or evaluation batches between the small all-reduce that lets a signal to one rank stop all


def stop_agreed(stop, n: int, world_size: int, device) -> bool:
    """Whether a loop over evaluation batches (or items) stops before its pass n, as stop() asks: one process asks
    every pass (a host bool: free to read); several ask every STOP_CHECK_STEPS passes and agree by an all-reduce,
    so a signal to any one rank stops them all. A collective then: every rank must make as many passes."""
    if world_size == 1:
        return stop()
    if n % STOP_CHECK_STEPS:
        return False
    import torch
    import torch.distributed as dist
    flag = torch.tensor(float(stop()), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def on_rank0(fn, rank: int, world_size: int, share: bool = False):
    """fn() on rank 0 only, and its result there (None on the other ranks; every rank's with share, for a small
    result that all ranks must act on alike). Whatever it raises stops every rank: a check only rank 0 can make
    (of its files, say) must stop them all, or the others run on into a collective that rank 0 never joins and
    wait there until ddp_timeout. A UserError's line is every rank's; anything else (a full disk, a bug) is named
    on the others, and rank 0 shows its traceback."""
    result, error = None, None
    if rank == 0:
        try:
            result = fn()
        except Exception as e:
            error = e
    failure = None
    if error is not None:
        failure = str(error) if isinstance(error, UserError) else \
            f"rank 0 stopped with {type(error).__name__}: {error} (its traceback is in rank 0's output)"
    if world_size > 1:
        import torch.distributed as dist
        box = [failure, result if share else None]
        dist.broadcast_object_list(box, src=0)
        failure, result = box[0], box[1] if share else result
    if error is not None:
        raise error  # rank 0 raises its own, traceback and all (NANOGPT_TRACEBACK=1 shows it)
    if failure is not None:
        raise UserError(failure)
    return result


def first_of_ranks(message: str | None, world_size: int) -> tuple[int, str] | None:
    """The lowest rank with a message (an error, a problem), and that message, on every rank; None when no rank has
    one. A collective when world_size > 1: all ranks call it."""
    messages = [message]
    if world_size > 1:
        import torch.distributed as dist
        messages = [None] * world_size
        dist.all_gather_object(messages, message)
    return next(((r, m) for r, m in enumerate(messages) if m), None)


def raise_held(failure: str | None, world_size: int):
    """Stop every process with the error one of them met before they joined the process group (failure: this
    process's, or None): the lowest failing rank's message, on every rank. Such errors are held till the join,
    since a process that stopped alone before it would leave the others, on other nodes, waiting to join until
    ddp_timeout. A collective when world_size > 1: all ranks call it."""
    first = first_of_ranks(failure, world_size)
    if first:  # only reads of out_dir fail on one rank but not rank 0: a node that sees another out_dir
        r, message = first
        raise UserError(message if r == 0 else f"{message} (on rank {r}, not on rank 0: every node must see "
                        "out_dir, on a filesystem they share)")


def compile_problem(device: str) -> str | None:
    """Why torch.compile cannot work on this device, or None when it does: the compilers it needs are looked
    for, then a two-op function is compiled and run there, so a broken toolchain shows up here, as one line,
    and not as a long traceback in the middle of the first training step."""
    import torch
    device_type = torch.device(device).type
    if device_type == "cpu" and not (os.environ.get("CXX") or any(shutil.which(c) for c in ("g++", "c++", "clang++"))):
        return "no C++ compiler (g++, c++ or clang++) on PATH"
    if device_type == "cuda" and importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        torch.compile(lambda x: (x * 2).sin())(torch.ones(8, device=device))
    except Exception as e:  # inductor reports a failed compiler run as one of several exception types
        return f"a test compile failed ({e.__class__.__name__})"
    return None


def agreed_problem(problem: str | None, rank: int, world_size: int) -> str | None:
    """The first rank's problem (compile_problem's, say), on every rank, so that all of them do alike what it
    rules out: a node that cannot compile would otherwise train eager alone, and rank 0, which reports, would not
    know. Another rank's problem names that rank. A collective when world_size > 1: all ranks call it."""
    first = first_of_ranks(problem, world_size)
    if first is None:
        return None
    r, p = first
    return p if r == rank else f"{p} (on rank {r})"


def check_compile_mode(compile_mode: str, micro_steps: int, device_type: str):
    """torch.compile's 'reduce-overhead' and 'max-autotune' modes capture CUDA graphs on a GPU, whose outputs live
    in memory the next replay reuses, and a backward pass's outputs are the gradients: with several micro-steps per
    process, the next micro-step's graphs overwrite the gradients being summed (torch raises, or the sum is wrong).
    Elsewhere those modes capture no graphs, so any number of micro-steps is fine."""
    if device_type == "cuda" and compile_mode in ("reduce-overhead", "max-autotune") and micro_steps > 1:
        raise UserError(f"compile_mode={compile_mode!r} captures CUDA graphs, which overwrite the gradients that "
                        f"{micro_steps} micro-steps per process sum: use compile_mode='max-autotune-no-cudagraphs' (or "
                        "'default'), or one micro-step per process (gradient_accumulation_steps = the number of "
                        "processes, with a larger batch_size)")


# peak dense bf16/fp16 tensor-core throughput, FLOP/s, by a substring of torch.cuda.get_device_name(): the first
# that matches, so a name that holds another ("H100 NVL" holds "H100", "L40" holds "L4") comes before it
PEAK_FLOPS = [
    ("GB200", 2500e12), ("B200", 2250e12), ("B100", 1750e12), ("H200 NVL", 835e12), ("H200", 989e12),
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12),
    ("L40", 181e12), ("L4", 121e12), ("A10G", 70e12), ("A10", 125e12), ("RTX 4090", 165e12), ("RTX 3090", 71e12),
    ("A6000", 155e12), ("V100", 125e12), ("T4", 65e12),
]


def peak_flops_of(name: str) -> float | None:
    """Peak FLOP/s of the GPU called name (as torch.cuda.get_device_name gives it), or None where unlisted."""
    return next((flops for key, flops in PEAK_FLOPS if key in name), None)


def peak_flops(device) -> float | None:
    """Peak FLOP/s of a CUDA device, or None where unknown (CPU, MPS, an unlisted GPU)."""
    import torch
    device = torch.device(device)
    return peak_flops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


# ---- files

NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP)  # flock on a filesystem without locks


def ended_here(holder: str) -> bool:
    """Whether a holder's description (FolderLock.claim's, "... (pid N on HOST, ...") names a process of this host
    that is no longer running."""
    named = re.search(r"\(pid (\d+) on ([^,)]+)", holder)
    if not named or named[2] != socket.gethostname():
        return False
    try:
        os.kill(int(named[1]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's process; or no pid at all
        return False
    return False


class FolderLock:
    """An exclusive hold on a folder for the life of this process: an flock on folder/run.lock, which the
    kernel releases when the process ends, however it ends (kill -9 too), so no stale lock is left.
    The holder writes who it is into the file, for the message a second process gets."""

    NAME = "run.lock"

    def __init__(self, folder: str):
        import fcntl
        self.file = open(os.path.join(folder, self.NAME), "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            if ended_here(holder):  # the holder writes its name only once its checks pass: the text is its forerunner's
                holder = f"another process, still starting (run.lock names the run before it, {holder}, which has ended)"
            raise UserError(f"out_dir {folder} is in use by {holder}: wait for that run to end, or choose another "
                            "out_dir") from None
        except OSError as e:  # a filesystem without locks (some NFS, Lustre or FUSE mounts): run, but say so
            if e.errno not in NO_LOCKS:
                raise
            print(f"warning: out_dir {folder} is on a filesystem without file locks ({e.strerror or e}): a second "
                  "run started in it would not be refused, so start only one", file=sys.stderr)

    def claim(self, who: str):
        """Write the holder's description, once every check has passed and the holder starts writing."""
        self.file.seek(0)
        self.file.truncate()
        self.file.write(who + "\n")
        self.file.flush()


def fsync_file(path: str):
    """Flush the file at path to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: str, path: str):
    """Flush the finished file tmp to disk, rename it over path, and make the rename itself durable: after a
    crash at any moment, path holds the old file or the new one, whole."""
    fsync_file(tmp)
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(directory)
    except OSError as e:  # some FUSE and network filesystems cannot sync a directory; the rename has happened
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise UserError(f"{path} was written, but syncing its folder failed ({e.strerror or e}), so a crash now "
                            "could still lose it: check the disk") from None
    finally:
        os.close(directory)


@contextmanager
def signals_deferred():
    """Run the block with SIGINT and SIGTERM held back: one that comes meanwhile is raised again at its end, to the
    handler that was there. In the main thread only, where Python runs signal handlers; elsewhere, as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    held = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in held.items():
        if handler is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(sig, lambda signum, _: caught.append(signum))
    try:
        yield
    finally:
        try:  # nested, so that a signal that meets its own handler between the two still finds the other put back
            if held[signal.SIGINT] is not None:
                signal.signal(signal.SIGINT, held[signal.SIGINT])
        finally:
            if held[signal.SIGTERM] is not None:
                signal.signal(signal.SIGTERM, held[signal.SIGTERM])
        if caught:
            signal.raise_signal(caught[0])


@contextmanager
def atomic_write(path: str, mode: str = "w", shared: bool = False, **open_kwargs):
    """Open a temporary file beside path; when the block ends without error, put it in place with
    replace_durably. An error (a full disk) removes the temporary file and leaves the old one.
    shared: several processes may write path at once (every rank downloading the same file), so each gets a
    temporary file of its own; otherwise the name is fixed, so the next write reuses what a kill left behind."""
    tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp" if shared else f"{path}.tmp"  # hosts may share a folder
    try:
        with open(tmp, mode, **open_kwargs) as f:
            yield f
        replace_durably(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def json_text(obj, **dumps_kwargs) -> str:
    """obj as strict JSON, each NaN or infinity written as null: JSON has no such numbers, and strict parsers
    (jq, JavaScript, most JSON libraries) refuse the NaN that Python's json writes by default."""
    def finite(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        return [finite(x) for x in v] if isinstance(v, (list, tuple)) else v
    return json.dumps(finite(obj), allow_nan=False, **dumps_kwargs)


def plural(n: int, word: str) -> str:
    """'1 step', '2 steps': n and word, with an s unless n is 1."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def write_json(path: str, obj: dict):
    """Write obj as strict JSON (json_text), atomically."""
    with atomic_write(path) as f:
        f.write(json_text(obj, indent=2) + "\n")


def replaceable_result(path: str, keys: set, fix: str) -> bool:
    """Whether a script may write its result (a JSON object of exactly these keys) to path: nothing is there, or
    an earlier result of its own is, not another file that a slip of a path names. fix: as read_json's."""
    old = read_json(path, fix)
    return old is None or (isinstance(old, dict) and set(old) == keys)


def read_json(path: str, fix: str):
    """What the JSON file at path holds, or None when there is no such file; a UserError ending in `fix` (what
    the user should do) when it is not UTF-8 JSON, e.g. torn by a kill or written by something else."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}): {fix}") from None
