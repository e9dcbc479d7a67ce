"""Classifying with a causal LM four ways, through `batchinfer run`, on real SMS messages and 3 labels:

- label scoring (task classify, model.labels): each label's log-likelihood as the start of the reply,
  prefill only, the prompt computed once per row for its labels (label_prompt: shared);
- the naive baseline of the same scores: one sequence per (row, label), the prompt repeated;
- free generation of up to 8 tokens, parsed (the first word, lower-cased, without punctuation);
- generation constrained to the labels (generation.choices, xgrammar masks in continuous batching).

Each prints rows/s and the share of rows whose answer is one of the labels. The model is a random
Llama of about 50M parameters with a byte-level BPE tokenizer trained here on the shipped SMS messages
(so its answers are noise: what is measured is cost and validity, not accuracy). Every prompt goes
through the same chat template.

    nice -n 19 python examples/bench/llm_classify.py --rows 2000
    nice -n 19 python examples/bench/llm_classify.py --rows 2000 --other-rows 500   # on a busy CPU
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "models"))
LABELS = ["spam", "personal", "business"]
QUESTION = "Is this text message spam, personal or business? Answer with one word.\n\n"


def make_model(folder: Path, texts: list[str]) -> int:
    """A random Llama of about 50M parameters (byte-level BPE of up to 16,384 tokens, 512 wide, 12 layers).
    Returns its parameter count."""
    from make_tiny_causal import make_tokenizer, save_random_causal

    tokenizer = make_tokenizer(folder, texts, vocab_size=16384)  # with tiny-llama's special tokens and chat template
    model = save_random_causal(
        folder,
        tokenizer,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    return sum(p.numel() for p in model.parameters())


def sms(rows: int) -> pa.Table:
    table = pa.concat_tables(pq.read_table(p) for p in sorted((ROOT / "examples" / "sms_spam").glob("*.parquet")))
    table = table.slice(0, rows)
    prompts = [QUESTION + text for text in table.column("text").to_pylist()]
    return table.append_column("prompt", pa.array(prompts)).append_column(
        "messages", pa.array([[{"role": "user", "content": p}] for p in prompts])
    )


def answer_of(text: str) -> str:
    words = re.findall(r"[a-z]+", text.lower())
    return words[0] if words else ""


def run(data: Path, model: Path, out: Path, **sections) -> tuple[float, int, pa.Table]:
    """One `batchinfer run` → (its seconds as the report counts them, without loading the model; rows; output)."""
    from batchinfer.config import validate_job
    from batchinfer.driver import run_job

    job = {
        "input": {"path": str(data), "id": "sms_id"},
        "model": {"path": str(model), "max_length": 512},
        "batching": {"max_tokens": 4096, "strategy": "padded"},
        "output": {"path": str(out)},
    }
    for key, value in sections.items():
        section, name = key.split("__")
        job.setdefault(section, {})[name] = value
    report = run_job(validate_job(job))
    return report["run"]["seconds"], report["run"]["rows"], ds.dataset(str(out)).to_table()


SCORING = dict(input__text="prompt", model__task="classify", model__labels=LABELS)
GENERATING = dict(input__messages="messages", model__task="generate", generation__max_new_tokens=8)
METHODS = {  # name: (job settings, the answers of its output table)
    "label scoring (prompt shared)": ({**SCORING, "model__label_prompt": "shared"}, lambda t: t.column("label")),
    "label scoring, naive (prompt per label)": (
        {**SCORING, "model__label_prompt": "repeated"},
        lambda t: t.column("label"),
    ),
    "free generation, 8 tokens, parsed": (GENERATING, lambda t: [answer_of(x) for x in t.column("text").to_pylist()]),
    "generation constrained to the labels (choices)": (
        {**GENERATING, "generation__choices": LABELS},
        lambda t: t.column("text"),
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000, help="rows for label scoring")
    parser.add_argument("--other-rows", type=int, default=None, help="rows for the three other methods (default all)")
    parser.add_argument("--rounds", type=int, default=4, help="the rows in this many slices, the methods taking turns")
    args = parser.parse_args()
    from make_tiny_causal import sms_texts

    work = Path(tempfile.mkdtemp(prefix="llm-classify-"))
    params = make_model(work / "model", sms_texts())
    print(f"random Llama, {params / 1e6:.1f}M parameters; labels {LABELS}")
    table = sms(args.rows)
    other = args.other_rows or args.rows
    seconds = {name: 0.0 for name in METHODS}
    rows = {name: 0 for name in METHODS}
    answers: dict[str, list] = {name: [] for name in METHODS}
    # the methods take turns on each slice, so that a machine whose speed drifts (a shared CPU) treats them alike
    for r in range(args.rounds):
        start, stop = r * args.rows // args.rounds, (r + 1) * args.rows // args.rounds
        for i, (name, (settings, read)) in enumerate(METHODS.items()):
            take = stop - start if name.startswith("label scoring (") else (stop - start) * other // args.rows
            path = work / f"slice-{r}-{take}.parquet"
            pq.write_table(table.slice(start, take), path)
            spent, done, out = run(path, work / "model", work / f"out-{r}-{i}", **settings)
            seconds[name] += spent
            rows[name] += take
            got = read(out)
            answers[name] += got.to_pylist() if hasattr(got, "to_pylist") else got
            answers[name] += [None] * (take - done)  # error rows: no answer
    print("\n| method | rows | rows/s | valid label |\n|---|---|---|---|")
    for name in METHODS:
        valid = sum(a in LABELS for a in answers[name]) / rows[name]
        print(f"| {name} | {rows[name]} | {rows[name] / seconds[name]:.1f} | {valid:.1%} |")
    shared, naive = (answers[name] for name in list(METHODS)[:2])
    rate = {name: rows[name] / seconds[name] for name in METHODS}
    first = list(METHODS)
    print(f"\nshared against naive: {rate[first[0]] / rate[first[1]]:.2f}x the rows/s", end="")
    if other == args.rows:
        print(f", the same label on {sum(a == b for a, b in zip(shared, naive)) / len(shared):.1%} of rows")
    print()


if __name__ == "__main__":
    main()
