import os
import pickle

import numpy as np
import pytest

from conftest import GPT2_RANKS, TINY_SHAKESPEARE, load_module
from tokenizer import encoding_from_ranks, gpt2_encoding


def test_char_prepare_writes_splits_and_vocabulary(char_data):
    with open(os.path.join(char_data, "meta.pkl"), "rb") as f:
        meta = pickle.load(f)
    train = np.fromfile(os.path.join(char_data, "train.bin"), dtype=np.uint16)
    val = np.fromfile(os.path.join(char_data, "val.bin"), dtype=np.uint16)
    assert meta["vocab_size"] == 65 and len(train) + len(val) == 1_115_394
    assert len(train) == int(1_115_394 * 0.9)
    assert "".join(meta["itos"][i] for i in train[:14]) == "First Citizen:"
    assert max(train.max(), val.max()) < 65


def test_char_prepare_prefers_the_named_input(tmp_path):
    prepare_module = load_module("data/shakespeare_char/prepare.py")
    text, source = prepare_module.load_text(TINY_SHAKESPEARE, here=str(tmp_path))
    assert source == TINY_SHAKESPEARE and len(text) == 1_115_394
    (tmp_path / "input.txt").write_text("to be or not to be")
    assert prepare_module.load_text(None, here=str(tmp_path)) == ("to be or not to be", str(tmp_path / "input.txt"))


def test_gpt2_encoding_from_a_rank_file_gives_gpt2_ids():
    enc = gpt2_encoding(GPT2_RANKS)
    assert enc.encode("hello world") == [31373, 995]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257
    assert enc.decode(enc.encode("Shall I compare thee?")) == "Shall I compare thee?"


def test_gpt2_encoding_reads_the_environment_variable(monkeypatch):
    monkeypatch.setenv("NANOGPT_GPT2_TIKTOKEN", GPT2_RANKS)
    assert gpt2_encoding().encode("hello world") == [31373, 995]


def test_a_rank_file_that_is_not_gpt2s_is_refused(tmp_path):
    fake = tmp_path / "fake.tiktoken"
    fake.write_bytes(open(GPT2_RANKS, "rb").read()[:-10])
    with pytest.raises(ValueError, match="is not GPT-2's rank file"):
        encoding_from_ranks(str(fake))


def test_shakespeare_bpe_prepare_matches_nanogpts_token_counts(tmp_path):
    import json
    shakespeare = load_module("data/shakespeare/prepare.py")
    with open(TINY_SHAKESPEARE, encoding="utf-8") as f:
        meta = shakespeare.prepare(f.read(), str(tmp_path), GPT2_RANKS)
    assert meta["splits"]["train"]["tokens"] == 301_966 and meta["splits"]["val"]["tokens"] == 36_059
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    assert gpt2_encoding(GPT2_RANKS).decode(train[:6].tolist()) == "First Citizen:\nBefore we"
    assert json.loads((tmp_path / "meta.json").read_text())["vocab_size"] == 50257


def test_char_prepare_writes_meta_json_that_train_reads(char_data):
    from train import load_dataset
    data = load_dataset(char_data, 256)
    assert data["vocab_size"] == 65 and data["max_token_id"] == 64 and data["dtype"] == np.uint16


def test_gpt2_encoding_uses_a_cached_rank_file(tmp_path, monkeypatch):
    import shutil
    import tokenizer
    monkeypatch.delenv("NANOGPT_GPT2_TIKTOKEN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    os.makedirs(os.path.dirname(tokenizer.cache_path()))
    shutil.copy(GPT2_RANKS, tokenizer.cache_path())
    # offline, tiktoken's own download fails and the cached copy is used; online, tiktoken gives the same ids
    assert gpt2_encoding().encode("hello world") == [31373, 995]
    assert tokenizer.cache_path() == str(tmp_path / "nanogpt" / "gpt2.tiktoken")
