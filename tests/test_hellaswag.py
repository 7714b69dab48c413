"""HellaSwag scoring (hellaswag.py, eval.py) against answers worked out by hand for a model whose every
prediction is known: a unigram model, whose next-character distribution is the same whatever it reads."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from common import UserError
from conftest import ROOT, read_metrics, run_script, tiny_args
from eval import RESULT_KEYS, check_out_file
from hellaswag import ending_losses, read_examples, render, score
from model import GPT, GPTConfig
from tokenizer import codec

ITEMS = [  # endings of different lengths and letters, so the summed and the mean loss disagree on some items
    {"ctx": "the cat", "endings": ["sat", "ab", "a", "bbbbbb"], "label": 1},
    {"ctx": "a dog", "endings": ["aaaaaaaa", "b", "cab", "ba"], "label": 0},
    {"ctx": "then", "endings": ["cc", "aaaa", "c", "bab"], "label": 3},
    {"ctx": "so", "endings": ["abc", "aaaaaaaaaa", "cba", "ccc"], "label": 1},
]
CHARS = "".join(sorted({c for item in ITEMS for text in (item["ctx"], *item["endings"]) for c in " " + text}))
LOGITS = {"a": 2.0, "b": 0.5, "c": -1.0, " ": 1.0}  # the unigram's logits; every other character gets 0


def unigram_model() -> GPT:
    """Every weight zero except the final norm's bias and the (tied) embedding's first column: the last hidden
    state is then e_0 at every position, whatever the input, and the logits are that column."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=16, vocab_size=len(CHARS), bias=True))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        for i, c in enumerate(CHARS):
            model.transformer.wte.weight[i, 0] = LOGITS.get(c, 0.0)
    return model.eval()


def hand_losses(ending: str) -> tuple[float, float]:
    """The summed and mean loss of " " + ending under the unigram, from its logits alone."""
    log_z = math.log(sum(math.exp(LOGITS.get(c, 0.0)) for c in CHARS))
    losses = [log_z - LOGITS.get(c, 0.0) for c in " " + ending]
    return sum(losses), sum(losses) / len(losses)


def hand_answer(items=ITEMS) -> dict:
    right = right_norm = 0
    for item in items:
        summed, mean = zip(*(hand_losses(e) for e in item["endings"]))
        right += summed.index(min(summed)) == item["label"]
        right_norm += mean.index(min(mean)) == item["label"]
    return {"items": len(items), "acc": right / len(items), "acc_norm": right_norm / len(items)}


def test_the_hand_answer_tells_the_two_scores_apart():
    answer = hand_answer()
    assert answer["acc"] != answer["acc_norm"]  # else a mix-up of sum and mean would pass unseen


def test_ending_losses_are_the_hand_computed_ones():
    model, (encode, _) = unigram_model(), codec({"chars": CHARS})
    for item in ITEMS:
        tokens, mask = render(item, encode, 16)
        summed, mean = ending_losses(model, tokens, mask, torch.autocast("cpu", enabled=False))
        expected = [hand_losses(e) for e in item["endings"]]
        assert summed.tolist() == pytest.approx([s for s, _ in expected], abs=1e-5)
        assert mean.tolist() == pytest.approx([m for _, m in expected], abs=1e-5)


def test_score_gives_the_hand_computed_accuracies():
    encode, _ = codec({"chars": CHARS})
    result = score(unigram_model(), ITEMS, encode, "cpu", torch.autocast("cpu", enabled=False))
    assert result == pytest.approx(hand_answer())


def test_a_stop_drops_the_scoring_and_leaves_the_model_training():
    """train.py scores HellaSwag inside its evaluation: a stop signal then drops it between items."""
    encode, _ = codec({"chars": CHARS})
    model, ctx = unigram_model().train(), torch.autocast("cpu", enabled=False)
    asked = []  # a stop asked for before the third item
    assert score(model, ITEMS, encode, "cpu", ctx, stop=lambda: asked.append(1) or len(asked) > 2) is None
    assert len(asked) == 3 and model.training
    assert score(model, ITEMS, encode, "cpu", ctx, stop=lambda: False) == pytest.approx(hand_answer())


def test_rows_past_block_size_lose_context_from_the_left():
    encode, _ = codec({"chars": CHARS})
    item = {"ctx": "abcabcabcabc", "endings": ["a", "bb", "ccc", "a"], "label": 0}
    tokens, mask = render(item, encode, 8)
    assert tokens.shape == mask.shape == (4, 9)
    assert mask.sum(1).tolist() == [2, 3, 4, 2]  # every ending kept whole, with its space
    assert tokens[2].tolist() == encode("bcabc ccc")  # the last 5 of 12 context characters, then the ending
    assert tokens[0].tolist() == encode("cabcabc a")  # a short ending keeps more of the context, not padding
    long = {"ctx": "abc", "endings": ["a", "abcabcabcabc", "b", "c"], "label": 0}  # one ending past the context
    tokens, mask = render(long, encode, 8)
    assert mask.sum(1).tolist() == [2, 9, 2, 2]  # the long one keeps its last 9; no row is left without its ending
    assert tokens[0].tolist()[:5] == encode("abc a") and tokens[1].tolist() == encode("abcabcabc")
    summed, mean = ending_losses(unigram_model(), tokens, mask, torch.autocast("cpu", enabled=False))
    assert torch.isfinite(mean).all() and (summed > 0).all()


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(item) + "\n" for item in items)


@pytest.mark.parametrize("line,problem", [('{"ctx": "a", "endings": ["a", "b"], "label": 0}', "endings"),
                                          ('{"ctx": "a", "endings": ["a", "b", "c", "d"], "label": 4}', "label"),
                                          ('{"ctx": "a", "endings": ["a", "b", "c", "d"], "label": true}', "bool"),
                                          ('{"ctx": "a", "endings": ["a", "b", "c", "d"], "label": 1.0}', "float"),
                                          ('{"ctx": "", "endings": ["a", "b", "c", "d"], "label": 0}', "empty ctx"),
                                          ("not json", "json"),
                                          ('{"ctx": "caf\xe9", "endings": ["a", "b", "c", "d"], "label": 0}', "latin-1")])
def test_a_malformed_item_is_one_error_naming_its_line(tmp_path, line, problem):
    path = tmp_path / "h.jsonl"
    path.write_bytes((json.dumps(ITEMS[0]) + "\n").encode() + line.encode("latin-1") + b"\n")
    with pytest.raises(UserError, match=r"h.jsonl line 2 is not a HellaSwag item"):
        read_examples(str(path))


def test_labels_given_as_strings_read_as_ints(tmp_path):
    """Hugging Face's copy of HellaSwag stores the label as a string ("3"); a jsonl written from it scores the same."""
    ints, strings = tmp_path / "ints.jsonl", tmp_path / "strings.jsonl"
    write_jsonl(ints, ITEMS)
    write_jsonl(strings, [{**item, "label": str(item["label"])} for item in ITEMS])
    assert read_examples(str(strings)) == read_examples(str(ints))
    write_jsonl(strings, [{**ITEMS[0], "label": "4"}])
    with pytest.raises(UserError, match=r"strings.jsonl line 1 is not a HellaSwag item"):
        read_examples(str(strings))


def test_a_byte_order_mark_starts_a_hellaswag_file_without_breaking_its_first_item(tmp_path):
    """Editors on Windows and some exports start UTF-8 with a byte order mark; later lines have none."""
    plain, marked = tmp_path / "plain.jsonl", tmp_path / "marked.jsonl"
    write_jsonl(plain, ITEMS)
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_examples(str(marked)) == read_examples(str(plain))


def save_unigram_checkpoint(path: str):
    """unigram_model as a checkpoint that eval.py reads with --init_from=PATH, its characters kept in it."""
    model = unigram_model()
    torch.save({"model": model.state_dict(), "model_args": {k: getattr(model.config, k) for k in
                ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")},
                "vocabulary": {"tokenizer": "char", "chars": CHARS}}, path)


@pytest.mark.slow
@pytest.mark.parametrize("procs,limit", [(0, 0), (2, 0), (0, 3), (2, 3)])  # 3 items: one rank scores one fewer
def test_eval_py_scores_a_checkpoint_alone_and_over_two_ranks(tmp_path, procs, limit):
    data, ckpt, out = str(tmp_path / "h.jsonl"), str(tmp_path / "unigram.pt"), str(tmp_path / "result.json")
    write_jsonl(data, ITEMS)
    save_unigram_checkpoint(ckpt)
    result = run_script("eval.py", f"--init_from={ckpt}", f"--hellaswag={data}", "--device=cpu", f"--out_file={out}",
                        f"--limit={limit}", cwd=str(tmp_path), torchrun_procs=procs)
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        written = json.load(f)
    answer = hand_answer(ITEMS[:limit or None])
    assert {k: v for k, v in written.items() if k in ("items", "acc", "acc_norm")} == pytest.approx(answer)
    assert set(written) == RESULT_KEYS  # what check_out_file takes for an earlier result, so a re-run may replace it
    assert f"acc_norm {answer['acc_norm']:.4f} over {answer['items']} items" in result.stdout


def test_out_file_replaces_only_an_earlier_result_of_eval_py(tmp_path):
    earlier, summary, torn = tmp_path / "earlier.json", tmp_path / "summary.json", tmp_path / "torn.json"
    earlier.write_text(json.dumps({"model": "gpt2", **hand_answer(), "dtype": "float32"}))
    summary.write_text(json.dumps({"model": "gpt2", "acc_norm": 0.3, "best_val_loss": 3.1}))
    torn.write_text('{"model": "gp')
    check_out_file(str(earlier))
    check_out_file(str(tmp_path / "new.json"))
    for other in (summary, torn):
        with pytest.raises(UserError, match="choose another out_file, or remove that file"):
            check_out_file(str(other))


def test_a_missing_hellaswag_file_is_one_error(tmp_path):
    result = run_script("eval.py", "--init_from=gpt2", f"--hellaswag={tmp_path}/nope.jsonl", "--device=cpu",
                        cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip() == (f"error: HellaSwag file {tmp_path}/nope.jsonl not found: give --hellaswag=PATH of "
                                     "hellaswag_val.jsonl")


SHAKESPEARE_ITEMS = [  # characters that tiny Shakespeare has, so a character model can score them
    {"ctx": "ROMEO: What, shall this speech be spoke", "endings": ["for our excuse?", "at dawn", "no", "so be it"], "label": 0},
    {"ctx": "KING RICHARD II: A lunatic lean-witted", "endings": ["fool,", "king of men", "x", "and more"], "label": 0},
    {"ctx": "First Citizen: We are accounted", "endings": ["poor citizens", "rich", "kings", "zzz"], "label": 0},
]


@pytest.mark.slow
def test_hellaswag_during_training_is_logged_and_matches_eval_py(char_data, tmp_path):
    data, out = str(tmp_path / "h.jsonl"), str(tmp_path / "out")
    write_jsonl(data, SHAKESPEARE_ITEMS)
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=8, eval_interval=4, hellaswag_interval=2,
                                               hellaswag_file=data), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    scored = {int(r["iter"]): float(r["hellaswag"]) for r in read_metrics(out) if r["hellaswag"]}
    assert sorted(scored) == [4]  # the 2nd eval of iter 0, 4, 8
    result = run_script("train.py", *tiny_args(char_data, out, max_iters=12, eval_interval=4, hellaswag_interval=1,
                                               hellaswag_file=data, hellaswag_items=2, init_from="resume"),
                        cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    scored = {int(r["iter"]): float(r["hellaswag"]) for r in read_metrics(out) if r["hellaswag"]}
    assert sorted(scored) == [4, 12] and f"hellaswag acc_norm {scored[12]:.4f}" in result.stdout
    evaluated = run_script("eval.py", f"--out_dir={out}", f"--hellaswag={data}", "--device=cpu", "--limit=2",
                           f"--out_file={tmp_path}/e.json", cwd=str(tmp_path))
    assert evaluated.returncode == 0, evaluated.stderr
    with open(tmp_path / "e.json") as f:  # the checkpoint written at that eval, over the same 2 items
        assert json.load(f)["acc_norm"] == pytest.approx(scored[12])
    assert scored[12] in (0.0, 0.5, 1.0)  # 2 items, where 3 would give thirds


@pytest.mark.slow
def test_a_stop_signal_during_hellaswag_scoring_in_training_drops_the_evaluation(char_data, tmp_path):
    """Scoring all 10,042 items takes minutes, past the grace a scheduler gives after its SIGTERM."""
    data, out = str(tmp_path / "h.jsonl"), str(tmp_path / "out")
    # tens of seconds of scoring at iter 0: the tiny model scores an item in under a millisecond here, so the
    # 3,000 items this test once wrote were at times all scored before the stop came, which then fell at iter 4
    write_jsonl(data, SHAKESPEARE_ITEMS * 20000)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *tiny_args(
        char_data, out, max_iters=8, eval_interval=4, hellaswag_interval=1, hellaswag_file=data)], cwd=str(tmp_path),
        env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    while not os.path.exists(os.path.join(out, "run.json")):  # written just before the first evaluation
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(1)  # its losses take milliseconds; the scoring goes on
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "stopped by signal during the evaluation at iter 0 (dropped); resume with --init_from=resume" in stdout
    assert not os.path.exists(os.path.join(out, "metrics.csv"))  # neither the losses nor the score logged
    saved = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert saved["iter_num"] == 0 and not saved["evaluated"]  # the resume scores it again


def test_items_a_character_model_cannot_encode_stop_training_before_it_starts(char_data, tmp_path):
    data = str(tmp_path / "h.jsonl")
    write_jsonl(data, [dict(SHAKESPEARE_ITEMS[0], ctx="50 €")])
    result = run_script("train.py", *tiny_args(char_data, str(tmp_path / "out"), hellaswag_interval=1,
                                               hellaswag_file=data), cwd=str(tmp_path))
    assert result.returncode != 0 and "error: HellaSwag item 0 cannot be encoded" in result.stderr
    assert not os.path.exists(tmp_path / "out" / "metrics.csv")


@pytest.mark.slow
def test_an_out_file_that_cannot_be_written_after_the_scoring_leaves_the_result_printed_and_one_error_line(tmp_path):
    """The disk fills while the items are scored (an hour for a large model): the result was lost in a traceback.
    Here the write fails as a full disk's would, its temporary file's name taken by a folder once scoring is under
    way (10,000 items: 8 s here, so the first progress line comes long before the end)."""
    import subprocess
    import sys

    from conftest import ROOT
    data, ckpt, out = str(tmp_path / "h.jsonl"), str(tmp_path / "unigram.pt"), str(tmp_path / "result.json")
    write_jsonl(data, ITEMS * 2500)
    save_unigram_checkpoint(ckpt)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "eval.py"), f"--init_from={ckpt}", f"--hellaswag={data}",
                             "--device=cpu", f"--out_file={out}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(tmp_path), env={**os.environ, "OMP_NUM_THREADS": "1"})
    first = proc.stdout.readline()
    assert first.startswith("hellaswag 1,000/10,000 items"), first + proc.communicate(timeout=120)[1]
    os.makedirs(out + ".tmp")
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1 and not os.path.exists(out)
    answer = hand_answer(ITEMS)
    assert f"acc_norm {answer['acc_norm']:.4f} over 10,000 items" in stdout
    assert stderr == (f"error: out_file {out}: cannot write it (Is a directory): the result is the line above; free "
                      "space on that disk, or name another out_file next time\n")


@pytest.mark.slow
def test_eval_py_piped_into_a_reader_that_stops_keeps_its_result_and_ends_quietly(tmp_path):
    """`eval.py ... | head -1`: the pipe closes after the first line, and the next print fails (EPIPE). The
    result file is written before the result line, and the broken pipe ends the script without a traceback. (A
    progress line, every 1,000 items, that fails leaves the scoring to go on: checked by hand with 1,004 items, 39 s
    here, too long for the suite.)"""
    import subprocess
    import sys

    from conftest import ROOT
    data, ckpt, out = str(tmp_path / "h.jsonl"), str(tmp_path / "unigram.pt"), str(tmp_path / "result.json")
    write_jsonl(data, ITEMS)
    save_unigram_checkpoint(ckpt)
    read_end, write_end = os.pipe()
    os.close(read_end)  # a reader that has gone already
    result = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), f"--init_from={ckpt}",
                             f"--hellaswag={data}", "--device=cpu", f"--out_file={out}"], stdout=write_end,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path), timeout=120)
    os.close(write_end)
    assert result.returncode == 1 and result.stderr == "", result.stderr
    with open(out) as f:
        assert json.load(f)["items"] == len(ITEMS)
