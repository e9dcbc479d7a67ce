"""A benchmark mix of real English texts from ../shared/data: short, medium and long rows together.

| set | share | what | length |
|---|---|---|---|
| sst2 | 30% | movie review phrases and sentences | 4-270 chars, median 41 |
| mpqa | 15% | opinion phrases | median 14 chars |
| tweeteval | 25% | tweets | median ~90 chars |
| ag_news | 20% | news title + description | median ~231 chars |
| bbc_news | 10% | full news articles (truncated by max_length) | median ~2,080 chars |

Rows are drawn with a fixed seed (with replacement past a set's size), so every run and every
peer sees the same rows in the same order.

../shared/data is this project's copy of the sets and does not ship with the repository. Without it the
scripts say so in one line and run on the shipped SMS messages (examples/sms_spam), so every command
works; their figures are then not the README's.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SHARES = {"sst2": 0.30, "mpqa": 0.15, "tweeteval": 0.25, "ag_news": 0.20, "bbc_news": 0.10}
SHIPPED = Path(__file__).resolve().parents[1] / "sms_spam"
SOURCES = (
    "SST-2 (GLUE, gluebenchmark.com), MPQA (mpqa.cs.pitt.edu), TweetEval (github.com/cardiffnlp/tweeteval), "
    "AG News (Zhang et al. 2015), BBC News (Greene and Cunningham 2006), TREC questions (cogcomp.seas.upenn.edu)"
)


def shared_or_shipped(data: Path, needs: list[str], fallback: bool = True) -> bool:
    """True when `data` holds the sets in `needs`; else one line on stderr, and False (the caller runs on the
    shipped SMS messages) or, with fallback=False, exit 2."""
    missing = [name for name in needs if not (data / name).is_dir()]
    if not missing:
        return True
    where = f"{Path(sys.argv[0]).name}: no {', '.join(missing)} in {data} (give --shared DIR; the sets: {SOURCES})"
    if not fallback:
        sys.exit(f"{where}; these inputs must be the real sets")
    print(
        f"{where}: running on the 5,574 shipped SMS messages instead, so the figures are not the README's",
        file=sys.stderr,
    )
    return False


def shipped_texts() -> list[str]:
    return [t for p in sorted(SHIPPED.glob("*.parquet")) for t in pq.read_table(p).column("text").to_pylist()]


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_sets(data: Path, fallback: bool = True) -> dict[str, list[str]]:
    if not shared_or_shipped(data, list(SHARES), fallback):
        return {name: shipped_texts() for name in SHARES}
    with open(data / "sst2" / "train.tsv", encoding="utf-8") as f:
        sst2 = [row[0].strip() for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][1:]
    with open(data / "ag_news" / "test.csv", encoding="utf-8") as f:
        ag = [f"{title}. {body}".replace("\\", " ") for _, title, body in csv.reader(f)]
    with open(data / "bbc_news" / "bbc_news.jsonl", encoding="utf-8") as f:
        bbc = [json.loads(line)["text"] for line in f]
    tweets = [
        t for task in ("emoji", "hate", "offensive") for t in _lines(data / "tweeteval" / task / "train_text.txt")
    ]
    mpqa = _lines(data / "mpqa" / "mpqa.pos") + _lines(data / "mpqa" / "mpqa.neg")
    return {"sst2": sst2, "mpqa": mpqa, "tweeteval": tweets, "ag_news": ag, "bbc_news": bbc}


def build_mix(data: Path, rows: int, seed: int = 0, fallback: bool = True) -> pa.Table:
    sets = load_sets(data, fallback)
    rng = np.random.default_rng(seed)
    names = list(SHARES)
    picks = rng.choice(len(names), size=rows, p=[SHARES[n] for n in names])
    texts, origin = [], []
    for k in picks.tolist():
        pool = sets[names[k]]
        texts.append(pool[int(rng.integers(len(pool)))])
        origin.append(names[k])
    return pa.table({"id": pa.array(np.arange(rows)), "set": origin, "text": texts})


def write_shards(table: pa.Table, folder: Path, shard_rows: int = 5000) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k, start in enumerate(range(0, table.num_rows, shard_rows)):
        pq.write_table(table.slice(start, shard_rows), folder / f"mix-{k:05d}.parquet")
    return folder
