"""data/prepare.py on corpora made inside the tests."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import torch

import data.prepare as prepare  # the repository root is on sys.path (conftest.py)
from common import UserError
from conftest import ROOT, favour_padding, gpt2_rank_file, load_module, run_script, shakespeare
from model import GPT, GPTConfig
from tokenizer import gpt2_encoding


def make_corpus(folder, n_docs=40):
    folder.mkdir(parents=True, exist_ok=True)
    docs = [f"Document {i}: " + " ".join(f"word{j * i % 97}" for j in range(20 + i)) for i in range(n_docs)]
    for i, doc in enumerate(docs):
        (folder / f"doc_{i:03d}.txt").write_text(doc)
    return docs


def read_split(out_dir, split, meta):
    info = meta["splits"][split]
    return np.concatenate([np.fromfile(os.path.join(out_dir, f), dtype=meta["dtype"]) for f in info["files"]])


def run_prepare(files, out_dir, **kwargs):
    kwargs = {"workers": 2, "rank_file": gpt2_rank_file(), "progress": False, **kwargs}
    docs = prepare.iter_documents(prepare.list_files(files), kwargs.pop("text_field", "text"))
    return prepare.prepare_corpus(docs, str(out_dir), **kwargs)


def test_gpt2_corpus_round_trips_with_documents_separated(tmp_path):
    docs = make_corpus(tmp_path / "corpus")
    meta = run_prepare([str(tmp_path / "corpus")], tmp_path / "out", val_fraction=0.2)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 50257 and meta["tokenizer"] == "gpt2"
    enc = gpt2_encoding(gpt2_rank_file())
    texts = []
    for split in ("train", "val"):
        ids = read_split(tmp_path / "out", split, meta)
        assert len(ids) == meta["splits"][split]["tokens"] and ids[-1] == 50256
        texts += enc.decode(ids.tolist()).split("<|endoftext|>")[:-1]
    assert sorted(texts) == sorted(docs)  # every document once, in one split or the other
    assert 0 < meta["splits"]["val"]["documents"] < 40
    assert meta["max_token_id"] == 50256
    with open(tmp_path / "out" / "meta.json") as f:
        assert json.load(f) == meta


def test_document_split_does_not_depend_on_order_or_workers(tmp_path):
    make_corpus(tmp_path / "corpus")
    a = run_prepare([str(tmp_path / "corpus")], tmp_path / "a", val_fraction=0.3, workers=1)
    files = sorted(str(p) for p in (tmp_path / "corpus").iterdir())[::-1]  # reversed file order
    b = run_prepare(files, tmp_path / "b", val_fraction=0.3, workers=2)
    enc = gpt2_encoding(gpt2_rank_file())
    val_a = set(enc.decode(read_split(tmp_path / "a", "val", a).tolist()).split("<|endoftext|>"))
    val_b = set(enc.decode(read_split(tmp_path / "b", "val", b).tolist()).split("<|endoftext|>"))
    assert val_a == val_b and len(val_a) > 2
    c = run_prepare([str(tmp_path / "corpus")], tmp_path / "c", val_fraction=0.3, seed=1)
    assert c["splits"]["val"]["tokens"] != a["splits"]["val"]["tokens"]  # the seed picks another split


def test_shards_hold_the_same_tokens_as_one_file(tmp_path):
    make_corpus(tmp_path / "corpus")
    whole = run_prepare([str(tmp_path / "corpus")], tmp_path / "whole", val_fraction=0.1)
    sharded = run_prepare([str(tmp_path / "corpus")], tmp_path / "sharded", val_fraction=0.1, shard_tokens=300)
    files = sharded["splits"]["train"]["files"]
    assert files[:2] == ["train_000.bin", "train_001.bin"] and len(files) > 2
    assert all(n == 300 for n in sharded["splits"]["train"]["file_tokens"][:-1])
    assert np.array_equal(read_split(tmp_path / "whole", "train", whole), read_split(tmp_path / "sharded", "train", sharded))
    # preparing again without shards removes the old shard files, and only those: not a file of the user's; and
    # an earlier meta.pkl (nanoGPT's vocabulary file, which its own scripts would read for the new tokens)
    for name in ("train_backup.bin", "train_2024.bin"):  # the second named like a shard, but no prepare's listed it
        (tmp_path / "sharded" / name).write_bytes(b"mine")
    (tmp_path / "sharded" / "meta.pkl").write_bytes(b"a character prepare's")
    run_prepare([str(tmp_path / "corpus")], tmp_path / "sharded", val_fraction=0.1)
    assert not (tmp_path / "sharded" / "train_000.bin").exists() and (tmp_path / "sharded" / "train.bin").exists()
    assert all((tmp_path / "sharded" / name).read_bytes() == b"mine" for name in ("train_backup.bin", "train_2024.bin"))
    assert not (tmp_path / "sharded" / "meta.pkl").exists()


@pytest.mark.parametrize("shard_tokens", [0, 300, 100])  # 100: the held-out tail spans whole shards
@pytest.mark.parametrize("hashed_to", ["train", "val", "split"])  # split: the larger to val, 77% of the tokens
def test_a_corpus_whose_documents_all_hash_to_one_split_is_cut_by_position(tmp_path, hashed_to, shard_tokens,
                                                                           capsys):
    docs = ["".join(f"line {i} of {j}\n" for i in range(n)) for j, n in enumerate((30, 100))]  # 1,350 tokens
    to_val = {"train": (False, False), "val": (True, True), "split": (False, True)}[hashed_to]
    seed = next(s for s in range(10_000) if tuple(prepare.goes_to_val(d, 0.1, s) for d in docs) == to_val)
    meta = prepare.prepare_corpus(docs, str(tmp_path / "out"), "char", prepare.alphabet(docs), val_fraction=0.1,
                                  seed=seed, workers=1, shard_tokens=shard_tokens, progress=False)
    assert ("the 2 documents put 77% of the tokens in val" if hashed_to == "split" else
            "every document (2) went to one split") in capsys.readouterr().err
    train, val = (read_split(tmp_path / "out", split, meta) for split in ("train", "val"))
    eot = meta["vocab_size"] - 1
    stream = np.concatenate([train, val])
    assert "".join(meta["chars"][i] if i != eot else "|" for i in stream) == "|".join(docs) + "|"  # order kept
    assert len(val) == round(0.1 * len(stream)) and meta["splits"]["val"]["tokens"] == len(val)
    if shard_tokens:
        assert all(n == shard_tokens for n in meta["splits"]["train"]["file_tokens"][:-1])
    assert sorted(os.listdir(tmp_path / "out")) == sorted(["meta.json"] + meta["splits"]["train"]["files"]
                                                          + meta["splits"]["val"]["files"])  # no .tmp left


def test_char_vocabulary_past_uint16_is_written_as_uint32(tmp_path):
    chars = "".join(chr(c) for c in range(0x100, 0x100 + 70_000) if not 0xD800 <= c <= 0xDFFF)
    text = chars + chars[::-1]
    seed = next(s for s in range(100) if not prepare.goes_to_val(text, 0.5, s) and prepare.goes_to_val("ab", 0.5, s))
    meta = prepare.prepare_corpus([text, "ab"], str(tmp_path / "out"), "char", prepare.alphabet([text, "ab"]), val_fraction=0.5,
                                  seed=seed, workers=1, progress=False)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == len(chars) + 3
    ids = read_split(tmp_path / "out", "train", meta)
    assert ids.dtype == np.uint32 and ids[-1] == len(chars) + 2 and ids.max() == len(chars) + 2
    assert "".join(meta["chars"][i] for i in ids[:-1]) == text


def test_small_char_vocabulary_is_uint16(tmp_path):
    seed = next(s for s in range(100) if not any(prepare.goes_to_val(d, 0.5, s) for d in ("abc", "cab"))
                and prepare.goes_to_val("b", 0.5, s))
    meta = prepare.prepare_corpus(["abc", "cab", "b"], str(tmp_path / "out"), "char", "abc", val_fraction=0.5,
                                  seed=seed, workers=1, progress=False)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 4
    assert read_split(tmp_path / "out", "train", meta).tolist() == [0, 1, 2, 3, 2, 0, 1, 3]


def test_a_char_prepare_notes_a_files_null_texts_once(tmp_path):
    """The character alphabet's pass reads the corpus too: its notes are not said twice."""
    (tmp_path / "d.jsonl").write_text('{"text": null}\n' + '{"text": "some words here"}\n' * 20)
    result = run_script("data/prepare.py", "--input", str(tmp_path / "d.jsonl"), "--out_dir", str(tmp_path / "out"),
                        "--tokenizer", "char", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("skipped 1 line whose 'text' is null") == 1, result.stderr


def test_jsonl_reads_the_named_field_and_reports_bad_lines(tmp_path, capsys):
    path = tmp_path / "dump.jsonl"
    path.write_text(json.dumps({"body": "hello world", "id": 1}) + "\n\n" + json.dumps({"body": "again"}) + "\n")
    assert list(prepare.iter_documents([str(path)], "body")) == ["hello world", "again"]
    with pytest.raises(prepare.PrepareError, match=r"line 1: no 'text' field \(it has 'body', 'id'\): set --text_field"):
        list(prepare.iter_documents([str(path)], "text"))
    path.write_text('{"body": null}\n{"body": "kept"}\n')  # no text, as a parquet null is: skipped, not an error
    assert list(prepare.iter_documents([str(path)], "body")) == ["kept"]
    assert capsys.readouterr().err == f"note: {path}: skipped 1 line whose 'body' is null\n"
    path.write_text('{"body": null, "text": "x"}\n\n' * 2)  # a blank line is no text either
    assert list(prepare.iter_documents([str(path)], "body")) == []
    assert capsys.readouterr().err == (f"note: {path}: skipped 2 lines whose 'body' is null (every line: check "
                                       "--text_field)\n")
    path.write_text('["hello world"]\n')
    with pytest.raises(prepare.PrepareError, match=r"line 1: a JSON array, not an object: each line must be one JSON "
                                                   r"object, its text in a 'body' field$"):
        list(prepare.iter_documents([str(path)], "body"))
    for line, problem in (('{"body": "x",', "Expecting property name"), ('{"body": "x", "id": ' + "9" * 5000 + "}",
                                                                          "digits"), ("[" * 100_000, "recursion depth")):
        path.write_text(line + "\n")  # a torn line, an integer past Python's digit limit, nesting past its depth
        with pytest.raises(prepare.PrepareError, match=rf"line 1: not valid JSON \(.*{problem}.*\): fix or drop"):
            list(prepare.iter_documents([str(path)], "body"))


def test_long_text_files_are_cut_at_paragraph_breaks_whatever_the_chunks_they_arrive_in():
    text = "\n\n".join("x" * 100 for _ in range(50))
    pieces = list(prepare.split_paragraphs([text], max_chars=1000))
    assert "".join(pieces) == text and len(pieces) > 3
    assert all(p.endswith("\n\n") and 1000 < len(p) < 1110 for p in pieces[:-1])
    assert list(prepare.split_paragraphs([text[i:i + 7] for i in range(0, len(text), 7)], max_chars=1000)) == pieces
    # no blank line at all: cut after a line break, or hard, so that no piece (and no buffer) outgrows 2 x 1000
    for runs_on in ("y" * 99 + "\n") * 60, "z" * 5000:
        pieces = list(prepare.split_paragraphs([runs_on[i:i + 300] for i in range(0, len(runs_on), 300)], 1000))
        assert "".join(pieces) == runs_on and max(map(len, pieces)) <= 2000 and len(pieces) >= 3


def test_text_is_decoded_across_chunk_boundaries_and_its_errors_name_the_byte(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("é\r\nü€\r\n\r\nend\r".encode())  # multi-byte characters and \r\n cut by 3-byte chunks
    assert "".join(prepare.read_chunks(str(path), chunk_bytes=3)) == "é\nü€\n\nend\r"
    path.write_bytes("abcdé".encode() + b"\xff" + b"tail")
    with pytest.raises(prepare.PrepareError, match=r"a.txt is not UTF-8 text \(byte 6 is 0xff\)"):
        list(prepare.read_chunks(str(path), chunk_bytes=4))


def test_documents_are_read_as_they_are_needed_not_a_whole_file_first(tmp_path):
    """A multi-GB jsonl or txt must not be read into memory: the first document comes before a bad byte further on."""
    jsonl = tmp_path / "dump.jsonl"
    jsonl.write_bytes(json.dumps({"text": "first"}).encode() + b"\n" * 100_000 + b'{"text": "\xff"}\n')
    txt = tmp_path / "big.txt"
    txt.write_bytes(("x" * 1000 + "\n\n").encode() * 3000 + b"\xff")  # 3 MB, then a byte that is no UTF-8
    for path in jsonl, txt:
        documents = prepare.iter_documents([str(path)])
        assert next(documents).startswith(("first", "x"))
        with pytest.raises(prepare.PrepareError, match="is not UTF-8 text"):
            list(documents)


def test_a_lone_surrogate_in_jsonl_is_an_error_not_a_traceback(tmp_path):
    path = tmp_path / "dump.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "half a pair \\ud800"}\n')
    with pytest.raises(prepare.PrepareError, match=r"line 2: 'text' holds a lone surrogate"):
        list(prepare.iter_documents([str(path)]))


def test_a_double_star_glob_spans_folders(tmp_path):
    for path in ("top.txt", "a/one.txt", "a/b/two.txt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("words")
    assert prepare.list_files([str(tmp_path / "**" / "*.txt")]) == \
        [str(tmp_path / p) for p in ("a/b/two.txt", "a/one.txt", "top.txt")]


def test_a_folder_a_glob_matches_is_searched_and_a_file_named_twice_is_read_once(tmp_path):
    for path in ("c/x.txt", "c/sub/y.txt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("words")
    assert prepare.list_files([str(tmp_path / "c" / "*")]) == [str(tmp_path / p) for p in ("c/sub/y.txt", "c/x.txt")]
    assert prepare.list_files([str(tmp_path / "c" / "x.txt"), str(tmp_path / "c")]) == \
        [str(tmp_path / p) for p in ("c/x.txt", "c/sub/y.txt")]  # not x.txt twice: its documents would count twice


def test_a_folder_takes_its_corpus_files_whatever_their_case_and_names_the_files_it_skips(tmp_path, capsys):
    for path in ("c/A.TXT", "c/b.jsonl", "c/c.jsonl.gz", "c/README.md", "c/sub/README.md", "c/.git/objects/x.txt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text('{"text": "words"}' if ".jsonl" in path else "words")
    c = tmp_path / "c"
    # named twice, and by a glob: each file once, and each skipped one named once
    assert prepare.list_files([str(c), str(c), str(c / "*")]) == [str(c / "A.TXT"), str(c / "b.jsonl")]
    assert capsys.readouterr().err == (f"note: skipped 3 files that are not .txt, .jsonl or .parquet ({c}/README.md, "
                                       f"{c}/c.jsonl.gz, {c}/sub/README.md); c.jsonl.gz is compressed: decompress such "
                                       "files first\n")  # .git's files are not searched
    assert list(prepare.iter_documents([str(c / "A.TXT")])) == ["words"]  # read as text, not parquet
    (c / "sub" / "more.txt").write_text("words")
    prepare.list_files([str(c / "sub" / "*")])
    assert capsys.readouterr().err.startswith(f"note: skipped 1 file that is not .txt, .jsonl or .parquet ({c}/sub/")
    (c / "sub" / "more.txt").unlink()
    (c / "A.TXT").unlink()
    (c / "b.jsonl").unlink()
    with pytest.raises(prepare.PrepareError, match=r"^--input .*c matches no .txt/.jsonl/.parquet file \(hidden folders "
                                                   r"such as .git are not searched\); c.jsonl.gz is compressed: "
                                                   r"decompress such files first$"):
        prepare.list_files([str(c)])
    with pytest.raises(prepare.PrepareError, match=r"c.jsonl.gz is not .txt, .jsonl or .parquet; c.jsonl.gz is "
                                                   r"compressed"):
        prepare.list_files([str(c / "c.jsonl.gz")])


def test_a_file_is_taken_as_named_and_a_folder_through_its_links_each_folder_once(tmp_path):
    (tmp_path / "notes [draft].txt").write_text("words")  # [draft] would be a glob's character class
    assert prepare.list_files([str(tmp_path / "notes [draft].txt")]) == [str(tmp_path / "notes [draft].txt")]
    (tmp_path / "books" / "old").mkdir(parents=True)
    (tmp_path / "books" / "old" / "a.txt").write_text("words")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "b.txt").write_text("words")
    os.symlink(tmp_path / "books", tmp_path / "corpus" / "books")  # a linked folder, as a glob's ** follows
    os.symlink(tmp_path / "corpus", tmp_path / "books" / "old" / "up")  # and a link back up: walked once, not forever
    assert prepare.list_files([str(tmp_path / "corpus")]) == \
        [str(tmp_path / "corpus" / p) for p in ("b.txt", "books/old/a.txt")]


def test_a_stop_while_a_dataset_is_put_in_place_waits_for_the_whole_of_it(tmp_path, monkeypatch, ctrl_c_raises):
    """A Ctrl-C among the renames would leave old token files beside new ones of the same size, which nothing could
    tell apart: it is held until the new dataset is whole, then raised."""
    (tmp_path / "a.txt").write_text("ab\n\n" * 40)
    (tmp_path / "b.txt").write_text("ba\n\n" * 40)  # the same sizes, other tokens
    old = run_prepare([str(tmp_path / "a.txt")], tmp_path / "data", tokenizer="char", chars="\nab", shard_tokens=8,
                      val_fraction=0.5)
    renames = []

    def replace_after_a_ctrl_c(src, dst):  # the stop comes once the first token file is in place
        if dst.endswith(".bin"):
            renames.append(dst)
            if len(renames) == 2:
                signal.raise_signal(signal.SIGINT)
        os_replace(src, dst)
    os_replace = os.replace
    monkeypatch.setattr(os, "replace", replace_after_a_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run_prepare([str(tmp_path / "b.txt")], tmp_path / "data", tokenizer="char", chars="\nab", shard_tokens=8,
                    val_fraction=0.5, workers=1)
    monkeypatch.undo()
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert meta["splits"] == old["splits"]  # the same files and sizes: only their tokens tell the two apart
    decoded = "".join("\nab|"[i] for i in read_split(tmp_path / "data", "train", meta))  # 3: the document end
    assert decoded.startswith("ba") and "ab" not in decoded  # every file is the new corpus's
    assert len(renames) == len(old["splits"]["train"]["files"]) + len(old["splits"]["val"]["files"]) > 2
    assert not [f for f in os.listdir(tmp_path / "data") if f.endswith(".tmp")]


def written(path) -> bool:
    """Whether the file at path has bytes in it (False where it is not there, or gone as it is looked at)."""
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_prepare_stopped_midway_says_so_and_leaves_the_dataset_that_was_there(tmp_path, sig):
    """SIGTERM (a job's time limit) and Ctrl-C, to the process group: one line, no traceback (the workers'
    included) or warning, no .tmp file left, and a folder the prepare made is gone. It exits at once: a Pool's
    own shutdown hung now and then here, on a task half written to workers that were gone."""
    (tmp_path / "big.txt").write_text(shakespeare()["text"] * 20)  # about 6M tokens: seconds of work
    (tmp_path / "small.txt").write_text("some words here")
    kept = tmp_path / "kept"
    assert run_script("data/prepare.py", "--input", str(tmp_path / "small.txt"), "--out_dir", str(kept),
                      "--gpt2_tiktoken", gpt2_rank_file(), cwd=str(tmp_path)).returncode == 0
    before = {f: (kept / f).read_bytes() for f in os.listdir(kept)}
    for out, overwrite, said in ((kept, ["--overwrite"], f"{kept} holds the dataset that was there"),
                                 (tmp_path / "new", [], f"{tmp_path / 'new'}, which was not there before, is not there now")):
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "data", "prepare.py"), "--input",
                                 str(tmp_path / "big.txt"), "--out_dir", str(out), *overwrite, "--workers", "2",
                                 "--gpt2_tiktoken", gpt2_rank_file()], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.time() + 60
        # midway: tokens written, so the workers run (a stop in the half second they take to start can still let one
        # print a traceback as it dies: a gap this test once met under load)
        while not written(out / "train.bin.tmp") and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, sig)  # to the group, as a terminal's Ctrl-C reaches the workers too
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig and "Traceback" not in stderr, stderr
        assert stderr.splitlines()[-1].startswith(f"stopped by {signal.Signals(sig).name}: {said}"), stderr
        assert "Warning" not in stderr, stderr
    assert {f: (kept / f).read_bytes() for f in os.listdir(kept)} == before
    assert not (tmp_path / "new").exists()
    if sig != signal.SIGTERM:
        return
    # a worker killed alone (the out-of-memory killer): the Pool starts another, but the task it held is never done,
    # and the prepare waited for it for ever
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "data", "prepare.py"), "--input",
                             str(tmp_path / "big.txt"), "--out_dir", str(kept), "--overwrite", "--workers", "2",
                             "--gpt2_tiktoken", gpt2_rank_file()], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while not written(kept / "train.bin.tmp") and proc.poll() is None and time.time() < deadline + 60:
        time.sleep(0.02)
    workers = [p for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
    assert proc.poll() is None and len(workers) == 2, proc.communicate()
    workers[0].kill()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in stderr and "Warning" not in stderr, stderr
    assert stderr.splitlines()[-1] == (f"error: a worker process of this prepare ended (killed by SIGKILL, as the "
                                       f"system's out-of-memory killer kills); {kept} holds the dataset that was "
                                       "there: run it again, with fewer --workers if memory ran short"), stderr
    assert {f: (kept / f).read_bytes() for f in os.listdir(kept)} == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the threads' signal masks from Linux's /proc")
def test_a_stop_reaches_the_main_thread_while_it_waits_on_the_workers(tmp_path):
    """The Pool's threads block SIGINT and SIGTERM, which the resource tracker's start had unblocked; and a stop
    that another thread takes still ends the wait for a result (the prepare waited for ever on one that a worker
    killed by that stop would never send: a test here hung so once)."""
    script = tmp_path / "pool.py"
    script.write_text(f"""import os, signal, sys, threading, time
sys.path.insert(0, {ROOT!r})
import data.prepare as prepare
if __name__ == "__main__":
    other = threading.Thread(target=time.sleep, args=(60,), daemon=True)  # as numpy's threads: signals not blocked
    other.start()
    before = set(os.listdir("/proc/self/task"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stop handled"))
    with prepare.running_pool(1, ("char", "ab", None, 0.5, 0)) as pool:
        for task in sorted(set(os.listdir("/proc/self/task")) - before):
            print(*(line.split()[1] for line in open(f"/proc/self/task/{{task}}/status") if line.startswith("SigBlk")))
        never = pool.apply_async(time.sleep, (60,))  # a result that does not come
        signal.pthread_kill(other.ident, signal.SIGTERM)  # taken by that thread, not the main one
        prepare.wait_for(never, [])
""")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    term_and_int = (1 << signal.SIGTERM - 1) | (1 << signal.SIGINT - 1)
    masks = [int(mask, 16) for mask in result.stdout.split()]
    assert len(masks) >= 3 and all(mask & term_and_int == term_and_int for mask in masks), result.stdout
    assert result.returncode == 1 and result.stderr.strip().endswith("stop handled"), result.stderr


def test_a_stop_while_a_character_dataset_is_put_in_place_leaves_its_meta_pkl_too(tmp_path, monkeypatch, ctrl_c_raises):
    """nanoGPT's meta.pkl goes into place with the token files, in the same held moment, not after them."""
    import pickle
    char_prepare = load_module("data/shakespeare_char/prepare.py")
    char_prepare.prepare("to be or not to be\n" * 50, str(tmp_path / "data"))
    os_replace = os.replace

    def replace_after_a_ctrl_c(src, dst):
        os_replace(src, dst)
        if dst.endswith("train.bin"):
            signal.raise_signal(signal.SIGINT)
    monkeypatch.setattr(os, "replace", replace_after_a_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        char_prepare.prepare("all the world's a stage\n" * 50, str(tmp_path / "data"))
    monkeypatch.undo()
    with open(tmp_path / "data" / "meta.pkl", "rb") as f:
        assert "".join(pickle.load(f)["itos"].values()) == json.loads((tmp_path / "data" / "meta.json").read_text())[
            "chars"] == "".join(sorted(set("all the world's a stage\n")))


def test_openwebtext_checks_its_settings_before_the_download_starts(tmp_path):
    owt = load_module("data/openwebtext/prepare.py")
    calls = []

    def load_dataset(repo, split, num_proc, revision):  # datasets' signature, answering as it would offline
        calls.append(revision)
        if revision is None:
            raise RuntimeError("Dataset scripts are no longer supported, but found openwebtext.py")
        return [{"text": f"document {i} of the web"} for i in range(30)] + [{"text": ""}, {"text": "  "}, {"text": None}]
    with pytest.raises(prepare.PrepareError, match="--shard_tokens -1"):
        prepare.prepare_corpus(owt.openwebtext_texts(load_dataset, 1), str(tmp_path / "bad"), shard_tokens=-1,
                               rank_file=gpt2_rank_file(), progress=False)
    assert calls == []  # refused before a byte was fetched
    meta = prepare.prepare_corpus(owt.openwebtext_texts(load_dataset, 1), str(tmp_path / "owt"), workers=1,
                                  val_fraction=0.2, rank_file=gpt2_rank_file(), progress=False)
    assert calls == [None, "refs/convert/parquet"]  # the plain load refused, then the Hub's parquet copy
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 30  # no blank or null one


def test_openwebtext_replaces_a_dataset_in_another_folder_only_with_overwrite(tmp_path):
    """As the Shakespeare scripts do: its own folder is its own to write again, another's needs --overwrite."""
    kept = tmp_path / "kept"
    load_module("data/shakespeare_char/prepare.py").prepare("to be or not to be\n" * 50, str(kept))
    before = {name: (kept / name).read_bytes() for name in os.listdir(kept)}
    result = run_script("data/openwebtext/prepare.py", "--out_dir", str(kept), cwd=str(tmp_path))
    assert result.returncode != 0 and result.stderr.startswith(f"error: --out_dir {kept} already holds a dataset (char")
    assert {name: (kept / name).read_bytes() for name in os.listdir(kept)} == before


def test_a_byte_order_mark_starts_a_jsonl_file_without_becoming_text(tmp_path):
    path = tmp_path / "dump.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "hello"}\n{"text": "world"}\n')
    assert list(prepare.iter_documents([str(path)])) == ["hello", "world"]


def test_a_byte_order_mark_starts_a_text_file_without_becoming_a_character(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\xef\xbb\xbfab\r\ncd")
    assert prepare.read_text(str(path)) == "".join(prepare.read_chunks(str(path), 2)) == "ab\ncd"
    path.write_bytes(b"\xef\xbb\xbfab\xffcd")
    with pytest.raises(prepare.PrepareError, match=r"byte 5 is 0xff"):  # counted in the file, the mark included
        prepare.read_text(str(path))


def test_an_input_that_cannot_be_read_is_named_as_such_and_the_dataset_stays(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("some words here")
    os.symlink(tmp_path / "gone.txt", tmp_path / "in" / "b.txt")  # a broken link, listed by the folder walk
    out = tmp_path / "data"
    out.mkdir()
    (out / "meta.json").write_text("earlier")
    result = run_script("data/prepare.py", "--input", str(tmp_path / "in"), "--out_dir", str(out), "--overwrite",
                        "--tokenizer", "char", "--workers", "1", cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip() == (f"error: cannot read {tmp_path / 'in' / 'b.txt'} (No such file or directory): fix "
                                     f"it or leave it out of --input; the dataset in {out} is unchanged")
    assert (out / "meta.json").read_text() == "earlier"


@pytest.mark.parametrize("where", ["data", "data/new", "data/new/train.bin.tmp"])
def test_an_error_on_the_out_dir_or_a_folder_above_it_is_a_write_failure(where):
    def job():
        raise PermissionError(13, "Permission denied", where)  # as os.makedirs or the folder's lock would raise
    with pytest.raises(SystemExit, match=r"^error: cannot write the dataset to data/new \(Permission denied\)"):
        prepare.run_cli(job, "data/new")


def test_a_prepare_into_a_folder_another_prepare_is_writing_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("some words here")
    out = tmp_path / "data"
    out.mkdir()
    (out / "meta.json").write_text("the other prepare's")
    with prepare.holding(str(out)):  # as a prepare running in another process holds it
        result = run_script("data/prepare.py", "--input", str(tmp_path / "a.txt"), "--out_dir", str(out),
                            "--overwrite", "--tokenizer", "char", "--workers", "1", cwd=str(tmp_path))
        assert result.returncode != 0
        assert result.stderr.strip() == (f"error: --out_dir {out} is being written by another prepare: wait for it to "
                                         "end, or choose another --out_dir")
        assert (out / "meta.json").read_text() == "the other prepare's"
    result = run_script("data/prepare.py", "--input", str(tmp_path / "a.txt"), "--out_dir", str(out), "--overwrite",
                        "--tokenizer", "char", "--workers", "1", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "meta.json").read_text())["chars"] == " dehmorsw"
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]  # the hold leaves no file behind
    # a log file gets whole lines, no "\r" (which run_script's text mode reads as a line break: a blank line)
    assert " tokens from " in result.stderr and all(result.stderr.splitlines()), result.stderr


def test_inputs_that_match_nothing_are_an_error(tmp_path):
    with pytest.raises(prepare.PrepareError, match="matches no"):
        prepare.list_files([str(tmp_path / "*.txt")])


def test_a_character_codec_encodes_the_separator_as_its_token_where_the_model_has_one():
    """data/prepare.py's character datasets end each document with the id after the characters, which decode
    writes as <|endoftext|>: encode reads it back as that id (as GPT-2's BPE does), when the model has the id."""
    from tokenizer import codec, encode_setting
    vocab = {"tokenizer": "char", "chars": "abc"}
    encode, decode = codec(vocab, 4)
    assert encode("<|endoftext|>ab<|endoftext|>c") == [3, 0, 1, 3, 2]
    assert decode([3, 0, 1, 3, 2]) == "<|endoftext|>ab<|endoftext|>c"
    with pytest.raises(UserError, match=r"the text has characters the dataset does not: \['<', '>', 'd'"):
        codec(vocab, 3)[0]("<|endoftext|>")  # nanoGPT's shakespeare_char: a model with no such id
    # the default prompt, a newline, in a dataset of one-line documents: said to be the default, with what to give
    with pytest.raises(UserError) as refused:
        encode_setting(encode, "start", "\n", default="\n")
    assert str(refused.value) == ("start: the text has characters the dataset does not: ['\\n']: write it with the "
                                  "characters the model was trained on (this is the default start, '\\n': give "
                                  "--start=TEXT, or --start='<|endoftext|>' to start where a document does)")
    # an alphabet that spells <|endoftext|> without the separator's id: its 13 characters are no document start
    spelled, _ = codec({"tokenizer": "char", "chars": "".join(sorted(set("<|endoftext|> abc")))}, 14)
    with pytest.raises(UserError, match=r"\(this is the default start, '\\n': give --start=TEXT\)$"):
        encode_setting(spelled, "start", "\n", default="\n")
    with pytest.raises(UserError, match=r"^start: the text has characters the dataset does not: \['x'\]: write it "
                                        r"with the characters the model was trained on$"):
        encode_setting(encode, "start", "x", default="\n")
    # --start='a\nb' typed in a shell: a backslash and an n, which a flag keeps as they are
    with pytest.raises(UserError, match=r"\(\\n in a flag is those two characters: for a newline give a Python "
                                        r"string, --start=\"'ROMEO:\\n'\"\)$"):
        encode_setting(encode, "start", "a\\nb", default="\n")


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_prepared_corpus_trains_and_samples(tmp_path, tokenizer):
    make_corpus(tmp_path / "corpus", n_docs=60)
    result = run_script("data/prepare.py", "--input", str(tmp_path / "corpus"), "--out_dir", str(tmp_path / "data"),
                        "--tokenizer", tokenizer, "--val_fraction", "0.2", "--shard_tokens", "2000", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    args = ["--dataset=" + str(tmp_path / "data"), "--out_dir=" + str(tmp_path / "out"), "--device=cpu",
            "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
            "--gradient_accumulation_steps=1", "--max_iters=3", "--eval_interval=3", "--eval_iters=2",
            "--sample_interval=1", "--sample_tokens=50", "--sample_prompt=Document", "--bias=True"]
    train = run_script("train.py", *args, cwd=str(tmp_path))
    assert train.returncode == 0, train.stderr
    assert "uint16" in train.stdout and train.stdout.count("---- sample at iter") == 2
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    checkpoint = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    # characters exactly, as nanoGPT; GPT-2's 50257 padded to 50304, as nanoGPT pads it
    assert checkpoint["model_args"]["vocab_size"] == (meta["vocab_size"] if tokenizer == "char" else 50304)
    if tokenizer == "char":  # the documents' separator, as the model saw it: one token, which sampling writes back
        sample = run_script("sample.py", f"--out_dir={tmp_path / 'out'}", "--device=cpu",
                            "--start=<|endoftext|>Document", "--max_new_tokens=5", "--num_samples=1", cwd=str(tmp_path))
        assert sample.returncode == 0, sample.stderr
        assert sample.stdout.startswith("<|endoftext|>Document")
    if tokenizer == "gpt2":  # a model that would sample padding ids, which tiktoken cannot decode: neither sampler does
        model = GPT(GPTConfig(**checkpoint["model_args"]))
        model.load_state_dict(checkpoint["model"])
        favour_padding(model, 50257)
        torch.save({**checkpoint, "model": model.state_dict()}, tmp_path / "out" / "ckpt.pt")
        sample = run_script("sample.py", f"--out_dir={tmp_path / 'out'}", "--device=cpu", "--start=Document",
                            "--max_new_tokens=20", "--num_samples=1", cwd=str(tmp_path))
        assert sample.returncode == 0, sample.stderr
        again = run_script("train.py", *args, f"--init_from={tmp_path / 'out' / 'ckpt.pt'}",
                           f"--out_dir={tmp_path / 'again'}", "--max_iters=1", "--eval_interval=1", cwd=str(tmp_path))
        assert again.returncode == 0, again.stderr
        assert "---- sample at iter 0 ----" in again.stdout


def test_a_prepare_asked_not_to_replace_a_dataset_tells_one_from_other_files(tmp_path):
    """held_dataset: a meta.json or the token files a prepare writes are a dataset; a transformers export's
    pytorch_model.bin or notes are not, and another tool's meta.json, which a prepare would replace, is named."""
    folder = tmp_path / "d"
    assert prepare.held_dataset(str(folder)) is None  # not made yet
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"weights")
    (folder / "notes.txt").write_text("mine")
    assert prepare.held_dataset(str(folder)) is None
    (folder / "meta.json").write_text('{"model_type": "gpt2"}')
    assert prepare.held_dataset(str(folder)) == "a meta.json that is not a dataset's"
    (folder / "meta.json").unlink()
    for name in ("train_000.bin", "train_001.bin", "val_000.bin", "val_001.bin"):  # nanoGPT's layout, sharded
        (folder / name).write_bytes(b"\0\0")
    assert prepare.held_dataset(str(folder)) == "a dataset (token files train_000.bin, train_001.bin, val_000.bin, ...)"
    with pytest.raises(prepare.PrepareError, match=r"already holds a dataset \(char, [\d,]+ train tokens, vocab_size "
                                                   r"\d+, from words\): choose another --out_dir, or add --overwrite"):
        for overwrite in (True, False):  # the first writes it, the second is refused once it holds the folder
            prepare.prepare_corpus(["some words"] * 200, str(tmp_path / "e"), "char", " demorsw", workers=1,
                                   progress=False, source="words", overwrite=overwrite)
