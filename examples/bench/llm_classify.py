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
    nice -n 19 python examples/bench/llm_classify.py --rows 2000 --generate-rows 500   # on a busy CPU
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
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
    import torch
    from make_tiny_causal import make_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = make_tokenizer(folder, texts, vocab_size=16384)  # with tiny-llama's special tokens and chat template
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval().save_pretrained(folder)
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


def run(data: Path, model: Path, out: Path, **sections) -> tuple[float, pa.Table, int]:
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
    t0 = time.perf_counter()
    report = run_job(validate_job(job))
    seconds = time.perf_counter() - t0
    return report["run"]["rows"] / report["run"]["seconds"], ds.dataset(str(out)).to_table(), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000, help="rows for label scoring")
    parser.add_argument("--generate-rows", type=int, default=None, help="rows for the two generation runs")
    parser.add_argument("--naive-rows", type=int, default=None, help="rows for the naive label-scoring baseline")
    args = parser.parse_args()
    from make_tiny_causal import sms_texts

    work = Path(tempfile.mkdtemp(prefix="llm-classify-"))
    params = make_model(work / "model", sms_texts())
    print(f"random Llama, {params / 1e6:.1f}M parameters; labels {LABELS}")
    results = []

    def data(rows: int) -> Path:
        path = work / f"sms-{rows}.parquet"
        if not path.exists():
            pq.write_table(sms(rows), path)
        return path

    scoring = dict(input__text="prompt", model__task="classify", model__labels=LABELS)
    for name, rows, extra in (
        ("label scoring (prompt shared)", args.rows, {"model__label_prompt": "shared"}),
        ("label scoring, naive (prompt per label)", args.naive_rows or args.rows, {"model__label_prompt": "repeated"}),
    ):
        rate, table, _ = run(data(rows), work / "model", work / name.split()[-1].strip("()"), **scoring, **extra)
        valid = sum(label in LABELS for label in table.column("label").to_pylist()) / table.num_rows
        results.append((name, rows, rate, valid, table.column("label").to_pylist()))
    generating = dict(input__messages="messages", model__task="generate", generation__max_new_tokens=8)
    rows = args.generate_rows or args.rows
    for name, extra in (
        ("free generation, 8 tokens, parsed", {}),
        ("generation constrained to the labels (choices)", {"generation__choices": LABELS}),
    ):
        rate, table, _ = run(
            data(rows), work / "model", work / ("free" if not extra else "choices"), **generating, **extra
        )
        answers = [answer_of(t) if not extra else t for t in table.column("text").to_pylist()]
        valid = sum(a in LABELS for a in answers) / rows  # error rows count as invalid
        results.append((name, rows, rate, valid, None))
    shared, naive = results[0], results[1]
    n = min(shared[1], naive[1])
    same = sum(a == b for a, b in zip(shared[4][:n], naive[4][:n])) / n
    print("\n| method | rows | rows/s | valid label |\n|---|---|---|---|")
    for name, rows, rate, valid, _ in results:
        print(f"| {name} | {rows} | {rate:.1f} | {valid:.1%} |")
    print(f"\nshared against naive: the same label on {same:.1%} of {n} rows; {shared[2] / naive[2]:.2f}x the rows/s")


if __name__ == "__main__":
    main()
