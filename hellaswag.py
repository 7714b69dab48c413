"""
HellaSwag, scored completion-style as llm.c and build-nanogpt score it: each item is a context and four
endings; the model reads context + ending, and its cross-entropy over the ending's tokens alone picks its
answer. acc takes the ending with the lowest summed loss, acc_norm the lowest mean loss per token (the
figure usually quoted: GPT-2 124M 0.2955, GPT-2 XL 0.4893 on the 10,042 validation items).

The data is the official validation jsonl (fields ctx, endings, label), downloaded once into
data/hellaswag/, or a file the caller names.
"""
import json
import os
import urllib.request

import torch
import torch.distributed as dist
from torch.nn import functional as F

from common import UserError, atomic_write, stop_agreed

VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
DEFAULT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hellaswag", "hellaswag_val.jsonl")


def find_data(path: str, setting: str) -> str:
    """The jsonl to score: path when given, else data/hellaswag/'s copy, downloaded there first if need be;
    setting: the script's setting that gives path, for the errors."""
    if path:
        if not os.path.isfile(path):
            raise UserError(f"HellaSwag file {path} not found: give --{setting}=PATH of hellaswag_val.jsonl")
        return path
    if not os.path.isfile(DEFAULT_PATH):
        try:
            with urllib.request.urlopen(VAL_URL, timeout=60) as response:
                body = response.read()
            os.makedirs(os.path.dirname(DEFAULT_PATH), exist_ok=True)
            with atomic_write(DEFAULT_PATH, "wb", shared=True) as f:
                f.write(body)
        except OSError as e:  # offline, refused, or the folder cannot be written
            raise UserError(f"HellaSwag's validation set is not at {DEFAULT_PATH} and cannot be downloaded "
                            f"({e.__class__.__name__}): download {VAL_URL} to that path, or pass "
                            f"--{setting}=PATH") from e
    return DEFAULT_PATH


def read_examples(path: str) -> list[dict]:
    """The items of a HellaSwag jsonl, each checked: ctx a non-empty string, endings four strings, label 0 to 3
    (an int, or a string as in the Hugging Face dataset's copy)."""
    examples = []
    with open(path, "rb") as f:  # bytes, so that a line that is not UTF-8 is an error naming it
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line.decode("utf-8-sig" if n == 1 else "utf-8"))  # a byte order mark may start it
                ok = (isinstance(item["ctx"], str) and item["ctx"] != "" and isinstance(item["endings"], list)
                      and len(item["endings"]) == 4 and all(isinstance(e, str) for e in item["endings"])
                      and item["label"] in (0, 1, 2, 3, "0", "1", "2", "3")  # a string as Hugging Face's copy has it
                      and type(item["label"]) in (int, str))  # not true or 1.0, which equal 1
                # an empty ctx would leave an ending's first token unscored
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
                ok = False
            if not ok:
                raise UserError(f"{path} line {n} is not a HellaSwag item (ctx: non-empty text, endings: 4 texts, "
                                "label: 0-3)")
            examples.append({"ctx": item["ctx"], "endings": item["endings"], "label": int(item["label"])})
    if not examples:
        raise UserError(f"{path} holds no HellaSwag items")
    return examples


def render(example: dict, encode, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The four rows context + ending as tokens (4, T), zero-padded on the right, and a mask (4, T) that is 1 on
    the ending's tokens. Endings are encoded with their leading space, as they follow the context in text.
    A row longer than block_size + 1 loses its own context tokens from the left, each row as far as it must (an
    ending longer than that keeps its last tokens)."""
    context = encode(example["ctx"])
    endings = [encode(" " + ending) for ending in example["endings"]]
    rows = [(context + ending)[-(block_size + 1):] for ending in endings]
    width = max(len(row) for row in rows)
    tokens, mask = torch.zeros(4, width, dtype=torch.long), torch.zeros(4, width)
    for i, (row, ending) in enumerate(zip(rows, endings)):
        tokens[i, :len(row)] = torch.tensor(row)
        mask[i, len(row) - min(len(ending), len(row)):len(row)] = 1
    return tokens, mask


def check_encodable(examples: list[dict], encode):
    """A UserError, before any scoring, when the model's vocabulary cannot encode an item (a character model
    meets characters its dataset lacks)."""
    for i, example in enumerate(examples):
        try:
            for text in (example["ctx"], *example["endings"]):
                encode(text)
        except UserError as e:
            raise UserError(f"HellaSwag item {i} cannot be encoded with this model's vocabulary ({e}): HellaSwag "
                            "needs a model with GPT-2's tokenizer") from None


@torch.no_grad()
def ending_losses(model, tokens: torch.Tensor, mask: torch.Tensor, ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed and mean cross-entropy of each row's ending tokens, (4,) each."""
    x, y, m = tokens[:, :-1], tokens[:, 1:], mask[:, 1:]  # the loss of token t+1 is read at position t
    with ctx:
        logits, _ = model(x, all_logits=True)
    losses = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    summed = (losses * m).sum(1)
    return summed, summed / m.sum(1)


@torch.no_grad()
def score(model, examples: list[dict], encode, device: str, ctx, rank: int = 0, world_size: int = 1,
          progress=None, progress_every: int = 1000, stop=None) -> dict | None:
    """acc and acc_norm of model on examples (checked with check_encodable first). Each rank scores every
    world_size-th item and the counts are summed across ranks. progress(done, total, acc_norm) is called every
    progress_every items of this rank. stop: a function asked between items (see stop_agreed): when it says so,
    the scoring is dropped and None returned, on every rank."""
    was_training = model.training
    model.eval()
    try:
        counts = torch.zeros(3, dtype=torch.long, device=device)  # items, right by summed loss, right by mean loss
        for n in range(-(-len(examples) // world_size)):  # as many on every rank, for the stop checks' all-reduces
            if stop is not None and stop_agreed(stop, n, world_size, device):
                return None
            i = rank + n * world_size
            if i >= len(examples):
                continue
            tokens, mask = render(examples[i], encode, model.config.block_size)
            summed, mean = ending_losses(model, tokens.to(device), mask.to(device), ctx)
            label = examples[i]["label"]
            counts += torch.stack([torch.tensor(1, device=device), summed.argmin() == label, mean.argmin() == label])
            if progress is not None and (n + 1) % progress_every == 0:
                items, _, right_norm = counts.tolist()
                progress((n + 1) * world_size, len(examples), right_norm / items)
        if world_size > 1:
            dist.all_reduce(counts)
    finally:
        model.train(was_training)
    items, right, right_norm = counts.tolist()
    return {"items": items, "acc": right / items, "acc_norm": right_norm / items}
