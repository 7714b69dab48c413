"""The transformers format both ways (hf.py, export.py), and the ways in: transformers folders and nanoGPT
checkpoints as init_from, nanoGPT checkpoints sampled directly."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from checkpoint import load_pretrained, load_trained
from common import UserError
from conftest import ROOT, favour_padding, gpt2_rank_file, read_metrics, run_script, tiny_args

transformers = pytest.importorskip("transformers")  # a test dependency (requirements-dev.txt), optional for users
import hf  # noqa: E402  (after the skip: hf.py imports transformers lazily, but its tests need it)
from export import export  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

GPT2_SHAPE = dict()
LLAMA_SHAPE = dict(pos_emb="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, tie_embeddings=False, bias=False,
                   rope_theta=500.0)


def random_model(**arch) -> GPT:
    """A small model with every weight random (norm gains and biases too, so a mix-up between them shows)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=97, **arch)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def logits_of(model, idx):
    with torch.no_grad():
        return model(idx, idx)[0]  # with targets: the logits of every position


@pytest.mark.parametrize("arch,cls", [(GPT2_SHAPE, "GPT2LMHeadModel"), (dict(bias=False), "GPT2LMHeadModel"),
                                      (dict(tie_embeddings=False), "GPT2LMHeadModel"),
                                      (LLAMA_SHAPE, "LlamaForCausalLM"), (dict(LLAMA_SHAPE, bias=True, n_kv_head=0,
                                                                               tie_embeddings=True), "LlamaForCausalLM")])
def test_exported_folder_loads_in_transformers_with_our_logits(tmp_path, arch, cls):
    model = random_model(**arch)
    line = export(model, {"tokenizer": "char", "chars": "abcdefghij"}, str(tmp_path / "hf"), "float32", False)
    assert line.startswith(f"wrote {tmp_path / 'hf'}: {cls}")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert type(loaded).__name__ == cls
    idx = torch.randint(97, (2, 32))
    with torch.no_grad():
        theirs = loaded(idx).logits
    assert (logits_of(model, idx) - theirs).abs().max() < 1e-5


def test_an_exported_folders_files_take_the_umasks_permissions(tmp_path):
    """A folder exported to share (a group's disk): its weights as readable as its other files."""
    umask = os.umask(0o027)
    try:
        export(random_model(), {"tokenizer": "char", "chars": "abcdefghij"}, str(tmp_path / "hf"), "float32", False)
    finally:
        os.umask(umask)
    modes = {name: oct(os.stat(tmp_path / "hf" / name).st_mode & 0o777) for name in os.listdir(tmp_path / "hf")}
    assert "model.safetensors" in modes and set(modes.values()) == {"0o640"}, modes


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_an_export_in_16_bits_stores_and_loads_16_bit_weights(tmp_path, dtype):
    model = random_model()
    line = export(model, {"tokenizer": "char", "chars": "abcdefghij"}, str(tmp_path / "hf"), dtype, False)
    assert f", {dtype})" in line
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), torch_dtype="auto")
    assert {p.dtype for p in loaded.parameters()} == {getattr(torch, dtype)}  # as saved, not widened
    ours = dict(model.named_parameters())["transformer.h.0.mlp.c_fc.weight"]
    theirs = loaded.state_dict()["transformer.h.0.mlp.c_fc.weight"]  # Conv1D: stored as in by out
    assert torch.equal(theirs, ours.t().to(theirs.dtype))


def test_an_exported_padded_vocabulary_never_generates_a_padding_id(tmp_path):
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=50304, bias=True)).eval()
    favour_padding(model, 50257)
    start = torch.tensor([[50256]])
    assert model(start)[0].argmax() >= 50257  # greedy decoding would pick a padding id
    hf.to_transformers(model, None).save_pretrained(str(tmp_path))  # GPT-2's BPE, 50257 ids
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    generated = loaded.generate(start, max_new_tokens=5, do_sample=False, pad_token_id=50256)[0, 1:]
    assert len(generated) == 5 and generated.max() < 50257


@pytest.mark.parametrize("arch", [GPT2_SHAPE, dict(bias=False), dict(tie_embeddings=False), LLAMA_SHAPE])
def test_ours_to_transformers_to_ours_is_bit_exact(tmp_path, arch):
    model = random_model(**arch)
    hf.to_transformers(model).save_pretrained(str(tmp_path))
    back = hf.load(str(tmp_path))
    assert back.config == model.config
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_transformers_gpt2_loads_with_its_logits(tmp_path):
    torch.manual_seed(0)
    hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=64, vocab_size=101, n_positions=32, bos_token_id=0, eos_token_id=0)).eval()
    hf_model.save_pretrained(tmp_path)
    model = hf.load(str(tmp_path)).eval()
    assert (model.config.n_layer, model.config.block_size, model.config.vocab_size) == (2, 32, 101)
    idx = torch.randint(101, (2, 32))
    with torch.no_grad():
        expected = hf_model(idx).logits
    assert (logits_of(model, idx) - expected).abs().max() < 1e-5


@pytest.mark.parametrize("arch", [dict(mlp="relu2"), dict(qk_norm=True), dict(pos_emb="rope"),
                                  dict(LLAMA_SHAPE, norm="layernorm"), dict(n_kv_head=1)])
def test_combinations_without_a_transformers_class_are_refused(tmp_path, arch):
    with pytest.raises(UserError, match="transformers has no model class for"):
        export(random_model(**arch), None, str(tmp_path / "hf"), "float32", False)
    assert not os.path.exists(tmp_path / "hf")


def test_overwrite_replaces_an_earlier_export_and_nothing_else(tmp_path, monkeypatch):
    vocab = {"tokenizer": "char", "chars": "abcdefghij"}
    folder = str(tmp_path / "hf")
    export(random_model(), vocab, folder, "float32", False)
    with pytest.raises(UserError, match="already holds an export: choose another --to, or pass --overwrite=True"):
        export(random_model(), vocab, folder, "float32", False)
    second = random_model(bias=False)
    export(second, vocab, folder, "float32", True)  # an earlier export: replaced
    idx = torch.randint(97, (1, 32))
    with torch.no_grad():
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()(idx).logits
    assert (logits_of(second, idx) - theirs).abs().max() < 1e-5
    assert not any(n.startswith(".export-") for n in os.listdir(tmp_path))  # the old folder went with the staging
    run = tmp_path / "run"  # a training run's folder: never deleted, whatever --to says
    run.mkdir()
    (run / "ckpt.pt").write_bytes(b"weights")
    (run / "config.json").write_text("{}")
    for overwrite in (True, False):  # and the error offers no --overwrite, which would not replace it either
        with pytest.raises(UserError, match=r"already exists and is not an earlier export \(it holds ckpt.pt\): "
                                            r"choose another --to$"):
            export(random_model(), vocab, str(run), "float32", overwrite)
    assert (run / "ckpt.pt").read_bytes() == b"weights"
    for other in ("hellaswag.json", "NOTES.txt", "summary.json"):  # eval.py's result, notes, a run's summary
        (tmp_path / "hf" / other).write_text("{}")  # beside an earlier export: not replaced with it
        with pytest.raises(UserError, match=rf"is not an earlier export \(it holds {re.escape(other)}\)"):
            export(random_model(), vocab, folder, "float32", True)
        assert (tmp_path / "hf" / other).read_text() == "{}"
        os.remove(tmp_path / "hf" / other)
    sharded = tmp_path / "sharded"  # save_pretrained's sharded .bin weights: a transformers folder like ours
    sharded.mkdir()
    for name in ("config.json", "pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin"):
        (sharded / name).write_text("{}")
    with pytest.raises(UserError, match="already holds an export: choose another --to, or pass --overwrite=True"):
        export(random_model(), vocab, str(sharded), "float32", False)
    monkeypatch.chdir(folder)  # an earlier export, but the folder export.py runs in
    with pytest.raises(UserError, match="is the working folder or holds it"):
        export(random_model(), vocab, ".", "float32", True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "made").mkdir()  # an empty folder, made ahead for the export: written into, asked or not
    export(second, vocab, str(tmp_path / "made"), "float32", False)
    assert "config.json" in os.listdir(tmp_path / "made")
    (tmp_path / "real").mkdir()  # a link to one: the export goes where it links, and the link stays
    os.symlink(tmp_path / "real", tmp_path / "link")
    export(second, vocab, str(tmp_path / "link"), "float32", False)
    assert os.path.islink(tmp_path / "link") and "config.json" in os.listdir(tmp_path / "real")
    before = os.stat(tmp_path / "real" / "model.safetensors").st_ino
    export(random_model(), vocab, str(tmp_path / "link") + os.sep, "float32", True)  # link/: replaced there too
    assert os.path.islink(tmp_path / "link") and os.stat(tmp_path / "real" / "model.safetensors").st_ino != before
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UserError, match="exists and is not a folder"):
        export(random_model(), vocab, str(tmp_path / "a_file"), "float32", True)
    with pytest.raises(UserError, match="which is a file"):
        export(random_model(), vocab, str(tmp_path / "a_file" / "hf"), "float32", False)


def test_a_ctrl_c_while_an_export_replaces_another_waits_for_the_new_one_to_be_in_place(tmp_path, monkeypatch,
                                                                                        ctrl_c_raises):
    """Between moving the earlier export aside and renaming the new one in, a Ctrl-C would remove the staging
    folder, which by then holds the earlier export: neither would be left."""
    import signal
    vocab = {"tokenizer": "char", "chars": "abcdefghij"}
    folder = str(tmp_path / "hf")
    export(random_model(), vocab, folder, "float32", False)
    os_replace = os.replace

    def replace_then_ctrl_c(src, dst):
        os_replace(src, dst)
        if src == folder:  # the earlier export moved aside
            signal.raise_signal(signal.SIGINT)
    monkeypatch.setattr(os, "replace", replace_then_ctrl_c)
    second = random_model(bias=False)
    with pytest.raises(KeyboardInterrupt):
        export(second, vocab, folder, "float32", True)
    monkeypatch.undo()
    idx = torch.randint(10, (1, 16))
    with torch.no_grad():
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()(idx).logits
    assert (logits_of(second, idx) - theirs).abs().max() < 1e-5  # the new export, whole
    assert not any(n.startswith(".export-") for n in os.listdir(tmp_path))


def export_script(ckpt: str, to: str, *flags: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "export.py"), f"--init_from={ckpt}", f"--to={to}",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def save_checkpoint_of(model: GPT, path: str):
    """model as a checkpoint that export.py reads with --init_from=PATH: a character model where it has fewer ids
    than GPT-2's, else GPT-2's BPE."""
    n = model.config.vocab_size
    chars = "".join(chr(0x100 + i) for i in range(n)) if n < 50257 else None
    torch.save({"model": model.state_dict(), "model_args": vars(model.config),
                "vocabulary": {"tokenizer": "char" if chars else None, "chars": chars}}, path)


def test_an_export_that_finds_the_disk_full_is_one_error_line_and_leaves_the_earlier_export(tmp_path):
    """A file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) fails the weights' write as a full disk would: that was a
    safetensors traceback."""
    import resource
    import signal
    ckpt, folder = str(tmp_path / "ckpt.pt"), tmp_path / "hf"
    save_checkpoint_of(random_model(), ckpt)
    assert export_script(ckpt, str(folder)).wait(timeout=120) == 0
    before = (folder / "model.safetensors").read_bytes()

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # the weights take 0.4 MB
    proc = export_script(ckpt, str(folder), "--overwrite=True", preexec_fn=small_files)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1 and stderr.startswith(f"error: --to={folder}: cannot write the export ("), stderr
    assert stderr.endswith(f"free space on that disk or choose another --to; {folder} is as it was\n") and \
        len(stderr.splitlines()) == 1, stderr
    assert (folder / "model.safetensors").read_bytes() == before
    assert not any(n.startswith(".export-") for n in os.listdir(tmp_path))


def test_a_sigterm_during_an_export_leaves_no_half_written_folder(tmp_path):
    """A job's time limit, or `timeout`: the default SIGTERM ended the process where it was, leaving the staging
    folder (.export-*, with part of the weights) beside --to for good. The weights here take 160 MB, written once the
    staging folder's model/ appears; a stop after the export was in place (a slow machine) leaves it whole."""
    ckpt, folder = str(tmp_path / "ckpt.pt"), tmp_path / "hf"
    torch.manual_seed(0)
    save_checkpoint_of(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=768, block_size=32, vocab_size=50304)), ckpt)
    proc = export_script(ckpt, str(folder))
    while proc.poll() is None and not glob.glob(str(tmp_path / ".export-*" / "model")):  # the weights' folder
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert not any(n.startswith(".export-") for n in os.listdir(tmp_path))
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert stderr == ("stopped by SIGTERM: --to holds what it held before, or the new export whole if the stop came "
                      "as it was put in place\n")
    assert not folder.exists() or transformers.AutoConfig.from_pretrained(str(folder)).n_embd == 768


def test_unknown_names_are_refused():
    with pytest.raises(UserError, match="unknown pretrained model 'gpt3'"):
        hf.load("gpt3")


def test_a_run_folder_given_as_a_transformers_folder_points_to_its_checkpoint(tmp_path):
    with pytest.raises(UserError, match=rf"{tmp_path} is a folder without config.json, so not a transformers model"):
        hf.load(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")  # a run's folder has a config.json too: the run's settings
    (tmp_path / "run.json").write_text("{}")  # killed before its first save: nothing to start from
    with pytest.raises(UserError, match=rf"{tmp_path} is a training run's folder with no ckpt.pt, not "
                                        r"a transformers model: its run has not saved yet \(or stopped before its first save\)"):
        hf.load(str(tmp_path))
    for kept in ("best.pt", "ckpt_0000100.pt"):  # ckpt.pt moved away, to go back to a kept step
        (tmp_path / kept).write_bytes(b"weights")
    with pytest.raises(UserError, match=rf"{tmp_path} is a training run's folder with no ckpt.pt, not a transformers "
                                        rf"model: pass --init_from={tmp_path}/ckpt_0000100.pt \(it keeps best.pt, "
                                        r"ckpt_0000100.pt\)"):
        hf.load(str(tmp_path))
    (tmp_path / "ckpt.pt").write_bytes(b"weights")
    with pytest.raises(UserError, match=rf"{tmp_path} is a training run's folder, not a transformers model: pass "
                                        rf"--init_from={tmp_path}/ckpt.pt"):
        hf.load(str(tmp_path))


def test_an_export_given_as_out_dir_is_told_to_be_init_from(tmp_path, monkeypatch):
    from checkpoint import load_trained
    hf.to_transformers(random_model()).save_pretrained(str(tmp_path))
    with pytest.raises(UserError, match=rf"^no checkpoint at {tmp_path}/ckpt.pt: {tmp_path} holds a transformers model "
                                        rf"\(export.py's, say\): pass --init_from={tmp_path}$"):
        load_trained("resume", os.path.join(str(tmp_path), "ckpt.pt"))
    monkeypatch.chdir(tmp_path)  # --out_dir= (the folder it runs in): named as ., not left blank
    with pytest.raises(UserError, match=r"^no checkpoint at ckpt.pt: \. holds a transformers model .*: "
                                        r"pass --init_from=\.$"):
        load_trained("resume", "ckpt.pt")


def test_a_transformers_folder_without_weights_says_so(tmp_path):
    hf.to_transformers(random_model()).save_pretrained(str(tmp_path))
    os.remove(tmp_path / "model.safetensors")  # config.json copied without the weights
    with pytest.raises(UserError, match=rf"{tmp_path} has a config.json but no weights \(model.safetensors, "
                                        r"pytorch_model.bin or their sharded index\)"):
        hf.load(str(tmp_path))


def test_gpt2_tokenizer_files_encode_and_decode_as_tiktoken(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOGPT_GPT2_TIKTOKEN", gpt2_rank_file())
    from tokenizer import gpt2_encoding
    hf.write_tokenizer(None, 50304, str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n  they'll  x's 123 4567 héllo wörld "
            "日本語 🙂\t<|endoftext|> tail\r\n")
    ids = gpt2_encoding().encode(text, allowed_special="all")
    assert theirs.encode(text) == ids and theirs.decode(ids) == text
    assert theirs.eos_token_id == 50256
    assert hf.read_vocabulary(str(tmp_path)) == {"tokenizer": "gpt2", "chars": None}  # what a reader takes it for


@pytest.mark.parametrize("eot", [False, True], ids=["nanogpt-char", "prepare-char"])
def test_character_tokenizer_files_map_each_character_to_its_id(tmp_path, eot):
    """data/prepare.py's character datasets end each document with <|endoftext|>, the id after the characters
    (nanoGPT's shakespeare_char has none): the exported tokenizer has it, as its eos, when the model does."""
    chars = "\n !',.:;?ABCabc"
    hf.write_tokenizer({"tokenizer": "char", "chars": chars}, len(chars) + eot, str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = "Abc, cab!\n\nB a? C;"
    assert theirs.encode(text) == [chars.index(c) for c in text]
    assert theirs.decode(theirs.encode(text)) == text
    with pytest.raises(Exception, match="<a character this model was not trained on>"):  # not 'caf', silently
        theirs.encode("café")
    if eot:
        assert theirs.eos_token_id == len(chars) and theirs.encode("ab<|endoftext|>c") == [12, 13, len(chars), 14]
        assert theirs.decode([12, len(chars)]) == "a<|endoftext|>"
        assert hf.special_tokens({"tokenizer": "char", "chars": chars}, len(chars) + 1)["eos_token_id"] == len(chars)
    else:
        assert theirs.eos_token_id is None and len(theirs) == len(chars)
    assert hf.read_vocabulary(str(tmp_path)) == {"tokenizer": "char", "chars": chars}


def test_a_folder_whose_tokenizer_is_neither_gpt2_nor_characters_is_refused(tmp_path):
    from tokenizers import Tokenizer, models
    vocab = {c: i for i, c in enumerate("abcd")} | {"ab": 4, "cd": 5}
    Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("c", "d")])).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(UserError, match="is a tokenizer of 6 tokens that is neither GPT-2's BPE nor one token per"):
        hf.read_vocabulary(str(tmp_path))


def test_a_folder_without_tokenizer_json_reads_only_gpt2s_vocab_json_or_no_tokenizer_files(tmp_path, monkeypatch):
    """Before, a folder without tokenizer.json was taken for GPT-2's BPE whatever it held: sentencepiece's
    tokenizer.model, or a vocabulary of 64,000 tokens, sampled and exported as GPT-2's."""
    (tmp_path / "tokenizer.model").write_bytes(b"\n\x0esentencepiece")
    with pytest.raises(UserError, match=r"holds a tokenizer \(tokenizer.model\) that is neither GPT-2's BPE nor one "
                                        r"token per character"):
        hf.read_vocabulary(str(tmp_path))
    monkeypatch.setenv("NANOGPT_GPT2_TIKTOKEN", gpt2_rank_file())
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    hf.write_tokenizer(None, 50304, str(gpt2))
    saved = json.loads((gpt2 / "tokenizer.json").read_text())
    ids = {**saved["model"]["vocab"], **{t["content"]: t["id"] for t in saved["added_tokens"] if t["id"] < 50257}}
    (gpt2 / "vocab.json").write_text(json.dumps(ids))  # the slow tokenizer's files, as GPT2Tokenizer saves them
    (gpt2 / "merges.txt").write_text("#version: 0.2\n")
    (gpt2 / "tokenizer.json").unlink()
    assert hf.read_vocabulary(str(gpt2)) == {"tokenizer": "gpt2", "chars": None}
    big = tmp_path / "big"  # no tokenizer files at all, and a vocabulary that is not GPT-2's
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64000, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5)).save_pretrained(str(big))
    for load in (lambda: load_trained(str(big), ""), lambda: load_pretrained(str(big), 0.0)):  # sample, train
        with pytest.raises(UserError, match=r"holds a model of 64,000 tokens and no tokenizer files, so not GPT-2's"):
            load()


@pytest.mark.parametrize("setting", [dict(scale_attn_by_inverse_layer_idx=True), dict(scale_attn_weights=False)])
def test_a_transformers_gpt2_that_scales_its_attention_otherwise_is_refused(tmp_path, setting):
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=11, n_positions=8,
                                                         **setting)).save_pretrained(tmp_path)
    key, value = next(iter(setting.items()))
    with pytest.raises(UserError, match=f"'{key}': {value}"):
        hf.load(str(tmp_path))


def test_a_transformers_llama_with_an_odd_head_size_is_refused(tmp_path):
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=12, num_attention_heads=4, num_key_value_heads=4, intermediate_size=16,
        vocab_size=11, max_position_embeddings=8, rms_norm_eps=1e-5)).save_pretrained(tmp_path)
    with pytest.raises(UserError, match=r"head_dim 3, .* is not one model.py computes: .*\(even, for rotary positions\)"):
        hf.load(str(tmp_path))


def test_a_folder_with_damaged_weights_or_config_is_a_one_line_error(tmp_path):
    folder = str(tmp_path / "hf")
    export(random_model(), {"tokenizer": "char", "chars": "abcdefghij"}, folder, "float32", False)
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # cut short, as by a full disk or an interrupted copy
    with pytest.raises(UserError, match=r"could not read the model in .*hf \(.*\): the folder is damaged"):
        hf.load(folder)
    export(random_model(), {"tokenizer": "char", "chars": "abcdefghij"}, folder, "float32", True)
    (tmp_path / "hf" / "config.json").write_text("{")  # which transformers reports as an OSError, as it does no network
    with pytest.raises(UserError, match=r"could not read the model in .*hf \(OSError: .*\): the folder is damaged"):
        hf.load(folder)
    export(random_model(**LLAMA_SHAPE), None, folder, "float32", True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (config.get("rope_parameters") or config)["rope_theta"] = 0.0  # transformers loads it; the rotary tables are nan
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"config.json describes no model that model.py builds \(rope_theta 0.0 is not"):
        hf.load(folder)
    export(random_model(**LLAMA_SHAPE), None, folder, "float32", True)
    transformers.LlamaForCausalLM.from_pretrained(folder).model.save_pretrained(folder)  # the base model: no head
    with pytest.raises(UserError, match=r"the weights in .*hf do not fit its config.json \(missing lm_head.weight \(1 "
                                        r"in all\)\): copy the whole folder"):
        hf.load(folder)  # before, the head was random: samples of noise, and eval.py scored them
    export(random_model(), None, folder, "float32", True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "n_layer": 3}))  # a layer the files lack
    with pytest.raises(UserError, match=r"do not fit its config.json \(missing transformer.h.2.attn.c_attn.bias, .* "
                                        r"\(12 in all\)\)"):
        hf.load(folder)
    from safetensors.torch import load_file, save_file
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))  # as older transformers saved GPT-2: its mask
    save_file({**weights, "transformer.h.0.attn.masked_bias": torch.tensor(-1e4)},  # buffers, which are no weights
              str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    assert hf.load(folder).config.n_layer == 2
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "n_layer": 1}))  # and one with no place
    with pytest.raises(UserError, match=r"do not fit its config.json \(unexpected transformer.h.1.attn.c_attn.weight"):
        hf.load(folder)
    export(random_model(), {"tokenizer": "char", "chars": "abcdefghij"}, folder, "float32", True)
    hf.write_tokenizer({"tokenizer": "char", "chars": "".join(map(chr, range(200, 300)))}, 100, folder)  # not its own
    with pytest.raises(UserError, match=r"holds a tokenizer of 100 tokens for a model of vocab_size 97: they are not "
                                        r"one model's; write the folder again \(export.py\)"):
        load_trained(folder, "")


# ---- the ways in, end to end

@pytest.fixture(scope="module")
def run(char_data, tmp_path_factory):
    """A finished run of 6 steps."""
    out = str(tmp_path_factory.mktemp("run") / "out")
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=6, eval_interval=6), cwd=os.path.dirname(out))
    assert result.returncode == 0, result.stderr
    return out


def as_nanogpt(ckpt_path: str, dest: str, prefix: str):
    """Rewrite a checkpoint of ours in nanoGPT's format: its keys only, model_args with dropout, and (from a
    compiled run) every parameter name prefixed."""
    ours = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    model_args = {k: ours["model_args"][k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")}
    torch.save({"model": {prefix + k: v for k, v in ours["model"].items()}, "optimizer": ours["optimizer"],
                "model_args": {**model_args, "dropout": 0.0}, "iter_num": ours["iter_num"],
                "best_val_loss": torch.tensor(ours["best_val_loss"]), "config": {"dataset": ours["config"]["dataset"]}},
               dest)


def final_val_loss(out_dir) -> float:
    return [float(r["val_loss"]) for r in read_metrics(out_dir) if r["val_loss"]][-1]


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["", "_orig_mod."])
def test_a_nanogpt_checkpoint_samples_and_starts_a_run(run, char_data, tmp_path, prefix):
    nano = str(tmp_path / "nano")
    os.makedirs(nano)
    as_nanogpt(os.path.join(run, "ckpt.pt"), os.path.join(nano, "ckpt.pt"), prefix)
    greedy = ["--device=cpu", "--temperature=0", "--num_samples=1", "--max_new_tokens=40", "--start=ROMEO:"]
    ours = run_script("sample.py", f"--out_dir={run}", *greedy, cwd=str(tmp_path))
    theirs = run_script("sample.py", f"--out_dir={nano}", *greedy, cwd=str(tmp_path))
    assert ours.returncode == 0 and theirs.returncode == 0, theirs.stderr
    assert theirs.stdout == ours.stdout and theirs.stdout.startswith("ROMEO:")
    if not prefix:
        return  # the rest reads the weights the same way whatever their names were
    # its weights start a new run: evaluated before any step, the loss is the original run's last one
    evaluated = run_script("train.py", *tiny_args(char_data, str(tmp_path / "eval"), init_from=f"{nano}/ckpt.pt",
                                                  eval_only=True), cwd=str(tmp_path))
    assert evaluated.returncode == 0, evaluated.stderr
    with open(tmp_path / "eval" / "eval.json") as f:
        result = json.load(f)
    assert result["val_loss"] == pytest.approx(final_val_loss(run), abs=1e-6)
    assert result["iter"] is None and f"eval of {nano}/ckpt.pt: train loss" in evaluated.stdout  # not this run's step
    trained = run_script("train.py", *tiny_args(char_data, str(tmp_path / "new"), init_from=f"{nano}/ckpt.pt",
                                                max_iters=2, eval_interval=2), cwd=str(tmp_path))
    assert trained.returncode == 0, trained.stderr
    assert f"optimizer state of {nano}/ckpt.pt taken" in trained.stdout
    assert sorted(int(r["iter"]) for r in read_metrics(tmp_path / "new") if r["loss"]) == [1, 2]


def test_a_nanogpt_checkpoint_whose_dataset_now_holds_another_alphabet_or_gpt2_tokens_is_refused(run, tmp_path):
    import pickle
    other = tmp_path / "other_text"  # its dataset folder, prepared since from a text of 3 characters
    other.mkdir()
    with open(other / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 3, "itos": {0: "a", 1: "b", 2: "c"}, "stoi": {"a": 0, "b": 1, "c": 2}}, f)
    as_nanogpt(os.path.join(run, "ckpt.pt"), str(tmp_path / "nano.pt"), "")
    saved = torch.load(tmp_path / "nano.pt", map_location="cpu", weights_only=True)
    torch.save({**saved, "config": {"dataset": str(other)}}, tmp_path / "nano.pt")
    with pytest.raises(UserError, match=rf"nanoGPT model of {saved['model_args']['vocab_size']} characters, but the "
                                        rf"alphabet of its dataset {other} has 3"):
        load_trained(str(tmp_path / "nano.pt"), "")
    os.remove(other / "meta.pkl")  # prepared since as GPT-2 tokens, whose meta.json says so
    with open(other / "meta.json", "w") as f:
        json.dump({"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16",
                   "splits": {s: {"files": [f"{s}.bin"], "file_tokens": [100]} for s in ("train", "val")}}, f)
    for split in ("train", "val"):
        np.zeros(100, dtype=np.uint16).tofile(other / f"{split}.bin")
    with pytest.raises(UserError, match=rf"nanoGPT model of {saved['model_args']['vocab_size']} tokens, too few for "
                                        rf"GPT-2's 50257, but its dataset {other} now holds GPT-2 tokens"):
        load_trained(str(tmp_path / "nano.pt"), "")


def test_a_checkpoint_without_its_vocabulary_of_a_char_dataset_with_a_separator_loads(run, tmp_path):
    """Our checkpoints from before the vocabulary was kept in them, of a data/prepare.py char dataset, whose
    vocabulary is its characters and one id more, the document separator: the same dataset, not another text."""
    saved = torch.load(os.path.join(run, "ckpt.pt"), map_location="cpu", weights_only=True)
    chars = saved["vocabulary"]["chars"][:-1]  # one character fewer, and the separator's id in its place
    data = tmp_path / "jsonl_chars"
    data.mkdir()
    with open(data / "meta.json", "w") as f:
        json.dump({"tokenizer": "char", "chars": chars, "vocab_size": len(chars) + 1, "eot_token": len(chars),
                   "dtype": "uint16",
                   "splits": {s: {"files": [f"{s}.bin"], "file_tokens": [100]} for s in ("train", "val")}}, f)
    old = {k: v for k, v in saved.items() if k != "vocabulary"}
    torch.save({**old, "config": {**saved["config"], "dataset": str(data)}}, tmp_path / "old.pt")
    model, vocab = load_trained(str(tmp_path / "old.pt"), "")[:2]
    assert vocab["chars"] == chars and model.config.vocab_size == len(chars) + 1


@pytest.mark.slow
def test_a_run_from_a_checkpoint_takes_and_records_its_shape_and_refuses_another(run, char_data, tmp_path):
    flags = [f"--dataset={char_data}", "--device=cpu", "--compile=False", "--max_iters=1", "--eval_iters=1",
             "--batch_size=2", "--block_size=16", "--wandb_log=False", f"--init_from={run}/ckpt.pt"]
    trained = run_script("train.py", *flags, f"--out_dir={tmp_path / 'a'}", cwd=str(tmp_path))  # no shape flags
    assert trained.returncode == 0, trained.stderr
    with open(tmp_path / "a" / "config.json") as f:
        config = json.load(f)
    saved = torch.load(os.path.join(run, "ckpt.pt"), map_location="cpu", weights_only=True)["model_args"]
    assert {k: config[k] for k in ("n_layer", "n_head", "n_embd", "bias")} == {k: saved[k] for k in
                                                                              ("n_layer", "n_head", "n_embd", "bias")}
    assert config["block_size"] == 16  # cropped from the checkpoint's 32, as asked
    printed = next(line for line in trained.stdout.splitlines() if line.startswith("config: "))
    assert f"n_layer={saved['n_layer']}," in printed and "block_size=16," in printed  # the model trained, not the defaults
    refused = run_script("train.py", *flags, "--n_layer=3", f"--out_dir={tmp_path / 'b'}", cwd=str(tmp_path))
    assert refused.returncode != 0
    assert f"init_from={run}/ckpt.pt is a model of another shape: n_layer=3 (" in refused.stderr


@pytest.mark.slow
def test_a_run_from_a_checkpoint_checks_its_data_against_the_models_context_not_the_default(run, tmp_path):
    import numpy as np
    short = tmp_path / "short"  # nanoGPT's layout, val shorter than the default block_size of 1024
    short.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 5000), ("val", 500)):
        rng.integers(0, 60, n, dtype=np.uint16).tofile(short / f"{split}.bin")
    flags = ["--device=cpu", "--compile=False", "--eval_iters=1", "--batch_size=2", "--wandb_log=False",
             f"--dataset={short}", f"--init_from={run}/ckpt.pt"]
    evaluated = run_script("train.py", *flags, "--eval_only=True", f"--out_dir={tmp_path / 'a'}", cwd=str(tmp_path))
    assert evaluated.returncode == 0, evaluated.stderr  # the model's context, 32, is what the run takes
    refused = run_script("train.py", *flags, "--block_size=600", "--eval_only=True", f"--out_dir={tmp_path / 'b'}",
                         cwd=str(tmp_path))
    assert refused.returncode != 0 and "block_size 600 is not shorter than the val split" in refused.stderr


@pytest.mark.slow
def test_an_exported_folder_is_an_init_from_that_trains(run, char_data, tmp_path):
    folder = str(tmp_path / "hf")
    exported = run_script("export.py", f"--out_dir={run}", f"--to={folder}", cwd=str(tmp_path))  # the script itself
    assert exported.returncode == 0 and exported.stdout.startswith(f"wrote {folder}: GPT2LMHeadModel")
    assert exported.stderr == ""  # no progress bar of transformers' in a log
    evaluated = run_script("train.py", *tiny_args(char_data, str(tmp_path / "eval"), init_from=folder, eval_only=True),
                           cwd=str(tmp_path))
    assert evaluated.returncode == 0, evaluated.stderr
    with open(tmp_path / "eval" / "eval.json") as f:
        assert json.load(f)["val_loss"] == pytest.approx(final_val_loss(run), abs=1e-5)
    trained = run_script("train.py", *tiny_args(char_data, str(tmp_path / "new"), init_from=folder, max_iters=3,
                                                eval_interval=3), cwd=str(tmp_path))
    assert trained.returncode == 0, trained.stderr
    rows = read_metrics(tmp_path / "new")
    assert float(rows[0]["val_loss"]) == pytest.approx(final_val_loss(run), abs=1e-5)  # iter 0: the weights came in
    assert sorted(int(r["iter"]) for r in rows if r["loss"]) == [1, 2, 3]
    before = {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}
    into = run_script("train.py", *tiny_args(char_data, folder, init_from=folder, max_iters=3, overwrite=True),
                      cwd=str(tmp_path))  # a finetune "in place": its config.json would replace the model's
    assert into.returncode == 1 and into.stderr.strip().splitlines()[-1:] == [
        f"error: out_dir {folder} holds a transformers model (export.py's, say), whose config.json a run's would "
        "replace: choose another out_dir (a finetune of it keeps --init_from on that folder)"], into.stderr
    assert {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)} == before
    # and samples as the run does: its characters come back from the folder's tokenizer.json
    greedy = ["--device=cpu", "--temperature=0", "--num_samples=1", "--max_new_tokens=40", "--start=ROMEO:"]
    ours = run_script("sample.py", f"--out_dir={run}", *greedy, cwd=str(tmp_path))
    theirs = run_script("sample.py", f"--init_from={folder}", *greedy, cwd=str(tmp_path))
    assert theirs.returncode == 0 and theirs.stderr == "", theirs.stderr  # nor when the folder is read
    assert theirs.stdout == ours.stdout and theirs.stdout.startswith("ROMEO:")


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "x.pt")
    with pytest.raises(UserError, match="is not a checkpoint of this trainer or nanoGPT"):
        load_trained(str(tmp_path / "x.pt"), "")


@pytest.mark.slow  # two processes that import transformers
def test_a_hub_model_in_the_local_cache_loads_without_asking_the_hub(tmp_path):
    """init_from=gpt2 downloaded once loads from the cache with no request: on a node without network,
    transformers would first retry the hub; a damaged copy is named as such. The hub here is a local socket that
    counts its connections."""
    snapshot = tmp_path / "hub" / "models--gpt2" / "snapshots" / ("0" * 40)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32)
                                 ).save_pretrained(snapshot)
    (tmp_path / "hub" / "models--gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--gpt2" / "refs" / "main").write_text("0" * 40)
    hub, connections = socket.create_server(("127.0.0.1", 0)), []

    def answer():
        while True:
            try:
                conn, _ = hub.accept()
            except OSError:  # closed: the test is over
                return
            connections.append(conn)
            conn.close()  # no answer: the client falls back to its cache, or fails
    threading.Thread(target=answer, daemon=True).start()
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}"}
    env.pop("HF_HUB_OFFLINE", None)

    def load():
        return subprocess.run([sys.executable, "-c", "import hf; print(hf.load('gpt2').config.n_layer)"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
    try:
        loaded = load()
        (snapshot / "config.json").write_text("{torn")  # a damaged copy is named as one, not fetched again
        damaged = load()
    finally:
        hub.close()
    assert loaded.returncode == 0 and loaded.stdout == "1\n", loaded.stderr
    assert f"could not read the hub's cached copy of gpt2 in {snapshot}" in damaged.stderr
    assert f"it is damaged; delete {tmp_path / 'hub' / 'models--gpt2'} and load it again" in damaged.stderr
    assert connections == []
