"""
Tiny Shakespeare in GPT-2 BPE tokens, for finetuning GPT-2 (config/finetune_shakespeare.py): writes
train.bin and val.bin (uint16; the first 90% / last 10% of the text) and meta.json next to this file,
or into --out_dir. The text comes from the same places as data/shakespeare_char/prepare.py (its input.txt
too, after this folder's), and the
encoding from tokenizer.py, which also works offline (see --gpt2_tiktoken there).

    python data/shakespeare/prepare.py [--input PATH] [--out_dir DIR] [--gpt2_tiktoken PATH] [--overwrite]

A dataset already in --out_dir is replaced only with --overwrite, except in this folder (see
data/shakespeare_char/prepare.py).
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root
from data.prepare import refuse_to_replace, run_cli, write_dataset  # noqa: E402
from common import ArgumentParser, UserError, start_script  # noqa: E402
from data.tinyshakespeare import CHAR_DIR, describe_text, load_text  # noqa: E402
from tokenizer import EOT, gpt2_encoding  # noqa: E402

TEXT_FOLDERS = [HERE, CHAR_DIR]  # where input.txt is looked for: this folder's, then the char dataset's (one copy serves both)


def prepare(text: str, out_dir: str, rank_file: str | None = None, source: str = "text given to prepare()",
            overwrite: bool = True) -> dict:
    """Encode the first 90% and the last 10% of text with GPT-2's BPE; write the splits and meta.json (refusing an
    out_dir that holds a dataset, unless overwrite)."""
    enc = gpt2_encoding(rank_file)
    if len(text) < 1000:
        raise UserError(f"the text has {len(text)} characters: a GPT-2 dataset of it needs at least 1,000")
    n = int(len(text) * 0.9)
    parts = {split: np.array(enc.encode_ordinary(part), dtype=np.uint16) for split, part in (("train", text[:n]),
                                                                                            ("val", text[n:]))}
    meta = {"tokenizer": "gpt2", "vocab_size": EOT + 1, "dtype": "uint16", "eot_token": EOT,
            "max_token_id": max(int(ids.max()) for ids in parts.values()), "source": describe_text(text, source)}
    return {**meta, "splits": write_dataset(out_dir, parts, meta, overwrite=overwrite)}


if __name__ == "__main__":
    start_script()
    parser = ArgumentParser(__doc__)
    parser.add_argument("--input", help="a text file to use instead of tiny Shakespeare")
    parser.add_argument("--out_dir", default=HERE, help="where to write train.bin, val.bin and meta.json")
    parser.add_argument("--gpt2_tiktoken", help="GPT-2's rank file (gpt2.tiktoken), for machines without network")
    parser.add_argument("--overwrite", action="store_true", help="replace the dataset that --out_dir holds")
    args = parser.parse_args()
    overwrite = args.overwrite or os.path.realpath(args.out_dir) == os.path.realpath(HERE)

    def job():
        if not overwrite:  # here, before a download, and again once the folder is held
            refuse_to_replace(args.out_dir)
        text, source = load_text(args.input, TEXT_FOLDERS)
        return prepare(text, args.out_dir, args.gpt2_tiktoken, source, overwrite)
    meta = run_cli(job, args.out_dir)
    print(meta["source"])
    print(f"train {meta['splits']['train']['tokens']:,} tokens, val {meta['splits']['val']['tokens']:,} tokens "
          f"-> {args.out_dir}")
