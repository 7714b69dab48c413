"""Shared fixtures: small real data made from ../shared/data, and a helper that runs the scripts."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
TINY_SHAKESPEARE = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")
GPT2_RANKS = os.path.join(SHARED_DATA, "gpt2.tiktoken")
sys.path.insert(0, ROOT)


def load_module(relative_path: str):
    """Import a script that is not on a package path, such as data/shakespeare_char/prepare.py."""
    spec = importlib.util.spec_from_file_location(os.path.basename(relative_path)[:-3], os.path.join(ROOT, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    """tiny Shakespeare prepared as characters (train.bin, val.bin, meta.pkl) in a temporary folder."""
    prepare = load_module("data/shakespeare_char/prepare.py").prepare
    with open(TINY_SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()
    out_dir = str(tmp_path_factory.mktemp("shakespeare_char"))
    prepare(text, out_dir)
    return out_dir


def run_script(script: str, *args: str, cwd: str, torchrun_procs: int = 0, timeout: int = 300,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run one of the repository's scripts in a fresh Python, under torchrun when torchrun_procs > 0."""
    launcher = [sys.executable]
    if torchrun_procs:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun_procs}"]
    full_env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(launcher + [os.path.join(ROOT, script), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
