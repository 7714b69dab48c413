"""
OpenWebText (8M web documents, about 9B GPT-2 tokens) for config/train_gpt2.py: writes train.bin
(about 17 GB), val.bin (about 8 MB) and meta.json next to this file, or into --out_dir.

    pip install datasets
    python data/openwebtext/prepare.py [--workers N] [--shard_tokens 1_000_000_000] [--out_dir DIR [--overwrite]]

Hugging Face `datasets` downloads the corpus (about 54 GB in its cache); tokenizing then goes through
data/prepare.py, the same streaming writer as any other corpus: 0.05% of the documents go to val,
chosen by a hash of their text. `datasets` 4 dropped loading scripts, which the original openwebtext
repository used, so the Hub's parquet conversion of it is read when the plain load is refused.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root
from common import ArgumentParser, start_script  # noqa: E402
from data.prepare import PrepareError, prepare_corpus, refuse_to_replace, run_cli  # noqa: E402

REPO = "Skylion007/openwebtext"


def openwebtext_texts(load_dataset, workers: int | None):
    """The texts of the openwebtext train split, through datasets' load_dataset, or a PrepareError saying why they
    are not to be had. A generator: the download starts at the first text taken, after prepare_corpus has checked
    its arguments and the output folder, which a 54 GB download should not have to wait for."""
    # the Hub keeps a parquet copy of script-based datasets under refs/convert/parquet
    for revision in (None, "refs/convert/parquet"):
        try:
            rows = load_dataset(REPO, split="train", num_proc=workers, revision=revision)
            break
        except RuntimeError as e:
            failure = e
            if revision is None and "scripts are no longer supported" in str(e):
                continue
        except (OSError, ValueError) as e:  # ConnectionError is an OSError
            failure = e
        raise PrepareError(f"could not fetch {REPO} from the Hugging Face Hub ({failure.__class__.__name__}: "
                           f"{failure}); without network access, download the corpus elsewhere as .parquet or .jsonl "
                           "and run data/prepare.py on it")
    for row in rows:
        yield row["text"]


if __name__ == "__main__":
    start_script()
    parser = ArgumentParser(__doc__)
    parser.add_argument("--out_dir", default=HERE, help="where to write the token files and meta.json")
    parser.add_argument("--workers", type=int, default=os.cpu_count() // 2 or 1, help="download and tokenizer processes")
    parser.add_argument("--shard_tokens", type=int, default=0, help="tokens per shard file; 0 writes one file per split")
    parser.add_argument("--gpt2_tiktoken", help="GPT-2's rank file (gpt2.tiktoken), for machines without tiktoken's host")
    parser.add_argument("--overwrite", action="store_true", help="replace the dataset that --out_dir holds (this "
                        "folder's own is replaced without it)")
    args = parser.parse_args()
    overwrite = args.overwrite or os.path.realpath(args.out_dir) == os.path.realpath(HERE)

    def job():
        if not overwrite:  # before a 54 GB download, and again once the folder is held
            refuse_to_replace(args.out_dir)
        try:
            from datasets import load_dataset
        except ImportError:
            raise PrepareError("openwebtext needs Hugging Face datasets: pip install datasets") from None
        texts = openwebtext_texts(load_dataset, args.workers or None)  # 0: datasets' own choice
        prepare_corpus(texts, args.out_dir, "gpt2", val_fraction=0.0005, seed=2357, workers=args.workers,
                       shard_tokens=args.shard_tokens, rank_file=args.gpt2_tiktoken, source=REPO, overwrite=overwrite)
    run_cli(job, args.out_dir)
