import os
import pickle

import numpy as np
import pytest

from conftest import ROOT, gpt2_rank_file, load_module, run_script, shakespeare
from common import UserError
from tokenizer import encoding_from_bytes, gpt2_encoding, read_ranks


def test_char_prepare_writes_splits_and_vocabulary(char_data):
    with open(os.path.join(char_data, "meta.pkl"), "rb") as f:
        meta = pickle.load(f)
    train = np.fromfile(os.path.join(char_data, "train.bin"), dtype=np.uint16)
    val = np.fromfile(os.path.join(char_data, "val.bin"), dtype=np.uint16)
    text = shakespeare()["text"]
    assert meta["vocab_size"] == len(set(text)) and len(train) + len(val) == len(text)
    assert len(train) == int(len(text) * 0.9)
    assert "".join(meta["itos"][i] for i in train[:200]) == text[:200]
    assert max(train.max(), val.max()) < meta["vocab_size"]
    if shakespeare()["canonical"]:
        assert meta["vocab_size"] == 65 and len(text) == 1_115_394 and text.startswith("First Citizen:")


def test_tiny_shakespeare_is_read_from_the_named_input_then_each_folder_in_turn(tmp_path):
    from data.tinyshakespeare import load_text
    path = shakespeare()["path"]
    text, source = load_text(path, [str(tmp_path)])
    assert source == path and text == shakespeare()["text"]
    (tmp_path / "input.txt").write_text("to be or not to be")
    assert load_text(None, [str(tmp_path)]) == ("to be or not to be", str(tmp_path / "input.txt"))
    # the BPE prepare (another folder) reads the char dataset's copy when its own folder has none
    bpe = tmp_path / "bpe"
    bpe.mkdir()
    assert load_text(None, [str(bpe), str(tmp_path)]) == ("to be or not to be", str(tmp_path / "input.txt"))
    (bpe / "input.txt").write_text("that is the question")
    assert load_text(None, [str(bpe), str(tmp_path)]) == ("that is the question", str(bpe / "input.txt"))
    assert load_module("data/shakespeare/prepare.py").TEXT_FOLDERS == [os.path.join(ROOT, "data", "shakespeare"),
                                                                       os.path.join(ROOT, "data", "shakespeare_char")]


def test_gpt2_encoding_from_a_rank_file_gives_gpt2_ids():
    enc = gpt2_encoding(gpt2_rank_file())
    assert enc.encode("hello world") == [31373, 995]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257
    assert enc.decode(enc.encode("Shall I compare thee?")) == "Shall I compare thee?"


def test_gpt2_encoding_reads_the_environment_variable(monkeypatch):
    monkeypatch.setenv("NANOGPT_GPT2_TIKTOKEN", gpt2_rank_file())
    assert gpt2_encoding().encode("hello world") == [31373, 995]


def test_a_rank_file_that_is_not_gpt2s_is_refused(tmp_path):
    fake = tmp_path / "fake.tiktoken"
    fake.write_bytes(open(gpt2_rank_file(), "rb").read()[:-10])
    with pytest.raises(ValueError, match="is not GPT-2's rank file"):
        encoding_from_bytes(read_ranks(str(fake)), str(fake))


def test_shakespeare_bpe_prepare_matches_nanogpts_token_counts(tmp_path):
    import json
    bpe = load_module("data/shakespeare/prepare.py")
    text = shakespeare()["text"]
    meta = bpe.prepare(text, str(tmp_path), gpt2_rank_file())
    enc = gpt2_encoding(gpt2_rank_file())
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16)
    assert len(train) == meta["splits"]["train"]["tokens"] and len(val) == meta["splits"]["val"]["tokens"]
    assert enc.decode(train.tolist()) + enc.decode(val.tolist()) == text
    if shakespeare()["canonical"]:
        assert meta["splits"]["train"]["tokens"] == 301_966 and meta["splits"]["val"]["tokens"] == 36_059
        assert enc.decode(train[:6].tolist()) == "First Citizen:\nBefore we"
    assert json.loads((tmp_path / "meta.json").read_text())["vocab_size"] == 50257


def test_char_prepare_writes_meta_json_that_train_reads(char_data):
    from dataset import load_dataset
    data = load_dataset(char_data, 256)
    vocab_size = len(set(shakespeare()["text"]))  # 65 for tiny Shakespeare
    assert data["vocab_size"] == vocab_size and data["max_token_id"] == vocab_size - 1 and data["dtype"] == np.uint16


def test_gpt2_encoding_uses_a_cached_rank_file(tmp_path, monkeypatch):
    import shutil
    import tokenizer
    monkeypatch.delenv("NANOGPT_GPT2_TIKTOKEN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    os.makedirs(os.path.dirname(tokenizer.cache_path()))
    shutil.copy(gpt2_rank_file(), tokenizer.cache_path())
    # the cached copy comes first, online or not
    assert gpt2_encoding().encode("hello world") == [31373, 995]
    assert tokenizer.cache_path() == str(tmp_path / "nanogpt" / "gpt2.tiktoken")


def test_a_rank_file_given_once_is_cached_for_the_scripts_that_take_none(tmp_path, monkeypatch):
    import tokenizer
    monkeypatch.delenv("NANOGPT_GPT2_TIKTOKEN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gpt2_encoding(gpt2_rank_file())  # as data/prepare.py --gpt2_tiktoken does
    with open(tokenizer.cache_path(), "rb") as cached, open(gpt2_rank_file(), "rb") as given:
        assert cached.read() == given.read()


def test_a_damaged_cached_rank_file_is_replaced_by_a_good_one(tmp_path, monkeypatch):
    """A torn copy in the cache (a full disk, a kill mid-copy) is replaced by the next good rank file given, not
    kept for the scripts that take no path to fail on every time."""
    import tokenizer
    monkeypatch.delenv("NANOGPT_GPT2_TIKTOKEN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    os.makedirs(os.path.dirname(tokenizer.cache_path()))
    with open(gpt2_rank_file(), "rb") as given:
        good = given.read()
    with open(tokenizer.cache_path(), "wb") as torn:
        torn.write(good[:len(good) // 2])
    assert gpt2_encoding(gpt2_rank_file()).encode("hello world") == [31373, 995]
    with open(tokenizer.cache_path(), "rb") as cached:
        assert cached.read() == good
    assert gpt2_encoding().encode("hello world") == [31373, 995]  # the scripts that take no path
    with pytest.raises(UserError, match="not GPT-2's"):
        tokenizer.cache_ranks(good[:100], tokenizer.cache_path())  # what the other routes' copies go through too
    with open(tokenizer.cache_path(), "rb") as cached:
        assert cached.read() == good  # left as it was


def test_an_encoding_written_back_as_a_rank_file_is_gpt2_tiktoken_byte_for_byte():
    """How tiktoken's downloaded encoding is cached: it must pass the same sha256 check as any other copy. And the
    bytes of a download serve a run as they are where the cache cannot be written (a read-only home)."""
    import tokenizer
    with open(gpt2_rank_file(), "rb") as f:
        data = f.read()
    assert tokenizer.rank_file_bytes(encoding_from_bytes(data, gpt2_rank_file())) == data
    assert tokenizer.encoding_from_bytes(data, "the download").encode("hello world") == [31373, 995]
    with pytest.raises(UserError, match="^the download is not GPT-2's rank file"):
        tokenizer.encoding_from_bytes(data[:-1], "the download")


def test_a_damaged_cached_rank_file_is_named_when_no_route_replaces_it(tmp_path):
    """Offline, with the cache torn: every route is tried (the torn copy passed over, not taken for GPT-2's),
    and one error line says what failed, the torn cache among it, and what to do."""
    import subprocess
    import sys
    from conftest import ROOT
    cached = tmp_path / "xdg" / "nanogpt" / "gpt2.tiktoken"
    os.makedirs(cached.parent)
    cached.write_bytes(b"torn")
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, so every download fails at once
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "TIKTOKEN_CACHE_DIR": str(tmp_path / "tk"),
           "HTTPS_PROXY": closed, "HTTP_PROXY": closed, "https_proxy": closed, "http_proxy": closed,
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}
    env.pop("NANOGPT_GPT2_TIKTOKEN", None)
    result = subprocess.run([sys.executable, "-c", "import sys, common, tokenizer; sys.excepthook = common.excepthook; "
                             "tokenizer.gpt2_encoding()"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert f"warning: the cached {cached} is not GPT-2's rank file (damaged?): fetching it again" in result.stderr
    assert f"the cached {cached} is damaged; tiktoken download: " in result.stderr
    assert "set NANOGPT_GPT2_TIKTOKEN to its path" in result.stderr


def test_a_cached_rank_file_is_used_before_any_download(tmp_path):
    """A proxy that takes the connection and never answers: tiktoken's download (no timeout) would wait on it
    for good; with the cached copy, nothing goes to the network."""
    import shutil
    import socket
    import subprocess
    import sys
    from conftest import ROOT
    os.makedirs(tmp_path / "xdg" / "nanogpt")
    shutil.copy(gpt2_rank_file(), tmp_path / "xdg" / "nanogpt" / "gpt2.tiktoken")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        proxy = f"http://127.0.0.1:{silent.getsockname()[1]}"
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "TIKTOKEN_CACHE_DIR": str(tmp_path / "tk"),
               "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "https_proxy": proxy, "http_proxy": proxy}
        env.pop("NANOGPT_GPT2_TIKTOKEN", None)
        result = subprocess.run([sys.executable, "-c", "from tokenizer import gpt2_encoding; "
                                 "print(gpt2_encoding().encode('hello world'))"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[31373, 995]", result.stderr


def test_a_data_change_names_each_split_that_changed():
    from dataset import data_change
    saved = {"train": [["train_000.bin", 1000]], "val": [["val.bin", 100]]}
    assert data_change(saved, saved) == {} and data_change(None, saved) == {}  # unchanged; a checkpoint from before
    more = {**saved, "train": [["train_000.bin", 1000], ["train_001.bin", 500]]}
    assert data_change(saved, more) == {"train": "1 file of 1,000 tokens then, 2 files of 1,500 tokens now"}
    printed = {"train": [["train_000.bin", 1000, "ab12"]], "val": [["val.bin", 100, "cd34"]]}  # with fingerprints
    assert data_change(saved, printed) == {} and data_change(printed, printed) == {}  # none then: none compared
    other = {**printed, "val": [["val.bin", 100, "ef56"]]}  # prepared again from a text of the same counts
    assert data_change(printed, other) == {"val": "the same 1 file of 100 tokens, with other tokens in them now"}


def test_a_token_file_s_fingerprint_is_of_its_ends(tmp_path):
    from dataset import FINGERPRINT_BYTES, fingerprint
    ids = np.arange(3 * FINGERPRINT_BYTES, dtype=np.uint16)  # 3 fingerprints' worth of bytes
    ids.tofile(tmp_path / "a.bin")
    first = fingerprint(str(tmp_path / "a.bin"))
    ids[::-1].tofile(tmp_path / "a.bin")  # reordered: the same size, other tokens at both ends
    assert fingerprint(str(tmp_path / "a.bin")) != first
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "small.bin")  # smaller than its two ends: read whole (twice)
    small = fingerprint(str(tmp_path / "small.bin"))
    np.arange(1, 11, dtype=np.uint16).tofile(tmp_path / "small.bin")
    assert len(small) == 16 and fingerprint(str(tmp_path / "small.bin")) != small


@pytest.mark.parametrize("script", ["shakespeare_char", "shakespeare"])
def test_a_shakespeare_prepare_replaces_another_folder_s_dataset_only_with_overwrite(tmp_path, script):
    """Its own folder's dataset it replaces (the README's command runs it again); a --out_dir given by a slip,
    holding a dataset a run trained on, it did too."""
    data = tmp_path / "data"
    load_module("data/shakespeare_char/prepare.py").prepare("someone else's text\n" * 40, str(data))
    before = {name: (data / name).read_bytes() for name in os.listdir(data)}
    (tmp_path / "input.txt").write_text(shakespeare()["text"][:20_000])
    args = [os.path.join("data", script, "prepare.py"), "--input", str(tmp_path / "input.txt"), "--out_dir", str(data),
            *(["--gpt2_tiktoken", gpt2_rank_file()] if script == "shakespeare" else [])]
    refused = run_script(*args, cwd=str(tmp_path))
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith(f"error: --out_dir {data} already holds a dataset (char, 720 train tokens")
    assert refused.stderr.rstrip().endswith("choose another --out_dir, or add --overwrite to replace it (a run trained "
                                            "on it resumes only on the same tokens)")
    assert {name: (data / name).read_bytes() for name in os.listdir(data)} == before
    replaced = run_script(*args, "--overwrite", cwd=str(tmp_path))
    assert replaced.returncode == 0, replaced.stderr
    assert "text given to prepare()" not in (data / "meta.json").read_text()


def test_no_training_batch_key_seeds_as_an_evaluation_key_does_whatever_the_seed():
    """numpy's SeedSequence pads keys of up to four 32-bit words with zeros, so (1, 2, 3) seeds as (1, 2, 3, 0) does:
    a training key (seed, 0, step, 0) would meet an evaluation key if it read as one, which EVAL_STREAM prevents."""
    from dataset import eval_key, seed_from
    assert seed_from((1, 2, 3)) == seed_from((1, 2, 3, 0))
    for seed in (0, 1, 1337, 2**32 - 1, 2**32, 2**32 + 1, 2**62):
        for step in (0, 1, 5):
            train = {seed_from((seed, 0, step, micro)) for micro in (0, 1)}
            assert not train & {seed_from(eval_key(split, step)) for split in ("train", "val")}, (seed, step)
