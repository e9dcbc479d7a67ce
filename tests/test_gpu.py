"""The GPU paths, on a CUDA machine: `pytest -m gpu` (examples/bench/gpu.sh runs it). Skipped without CUDA.

bf16 (what dtype: auto picks on a GPU) against fp32 on MiniLM; the memory-based budget of the probe;
a real CUDA out-of-memory split and retried; packed batches (varlen flash attention in bf16) against
padded; kill -9 and resume through the CLI; continuous batching against model.generate.

MiniLM is the real all-MiniLM-L6-v2 (the package's, or the fp16 copy gpu.sh carries, through
$BATCHINFER_MINILM), or random weights of its shape where only its tokenizer travelled.
"""

import random
import signal
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from helpers import EXAMPLES, run_cli, run_until, write_job
from helpers import make_job as _job
from helpers import prompt_table as _prompts
from helpers import read_output as _read
from helpers import vectors as _vectors

import batchinfer.backends.packing
from batchinfer.backends.models import pick_dtype
from batchinfer.batching.probe import GPU_MEMORY_SHARE, GPU_PROBE_TOKENS
from batchinfer.execution.driver import run_job
from batchinfer.job.config import load_job, validate_job

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")
LONG_ROWS = 4096


_cuda_job = partial(_job, model__device="cuda")


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _save_with_tokenizer(model, folder, tokenizer_from):
    from transformers import AutoTokenizer

    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def minilm_cls(tmp_path_factory, minilm_path):
    """MiniLM's body with a random 4-class head drawn wide, so the classes of most rows are far
    enough apart that bf16 rounding cannot swap them."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_path, num_labels=4, dtype=torch.float32)
    torch.nn.init.normal_(model.classifier.weight, std=1.0)
    return _save_with_tokenizer(model, tmp_path_factory.mktemp("minilm-cls"), minilm_path)


@pytest.fixture(scope="module")
def base_cls(tmp_path_factory, minilm_path):
    """A BERT-base-sized (12 x 768) random classifier: ten times MiniLM's activations per token."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, num_labels=4
    )
    return _save_with_tokenizer(
        BertForSequenceClassification(config).eval(), tmp_path_factory.mktemp("base-cls"), minilm_path
    )


@pytest.fixture(scope="module")
def long_rows(tmp_path_factory, sms_table):
    """4,096 rows of 30 to 60 SMS messages each, cut at max_length 512: batches are cut by the token
    budget, not by max_rows."""
    texts = sms_table.column("text").to_pylist()
    rng = random.Random(0)
    rows = [" ".join(rng.choices(texts, k=rng.randint(30, 60))) for _ in range(LONG_ROWS)]
    path = tmp_path_factory.mktemp("long") / "long.parquet"
    pq.write_table(pa.table({"sms_id": np.arange(LONG_ROWS), "text": rows, "label": ["ham"] * LONG_ROWS}), path)
    return path


_long_job = partial(_cuda_job, model__max_length=512, batching__chunk_rows=LONG_ROWS, batching__max_rows=LONG_ROWS)


def test_bf16_agrees_with_fp32(sms_parquet, minilm_path, minilm_cls, tmp_path):
    assert pick_dtype("auto", CUDA) == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    for dtype in ("auto", "float32"):
        run_job(_cuda_job(sms_parquet, minilm_path, tmp_path / f"embed-{dtype}", model__dtype=dtype))
        run_job(
            _cuda_job(
                sms_parquet, minilm_cls, tmp_path / f"cls-{dtype}", "classify", model__dtype=dtype, output__scores=True
            )
        )
    low, full = (_vectors(_read(tmp_path / f"embed-{d}"), "embedding") for d in ("auto", "float32"))
    cosine = _cosine(low, full)
    print(f"bf16 vs fp32 embeddings: cosine mean {cosine.mean():.6f}, min {cosine.min():.6f}")
    assert cosine.min() >= 0.999
    low, full = (_vectors(_read(tmp_path / f"cls-{d}"), "scores") for d in ("auto", "float32"))
    top_two = np.sort(full, axis=1)[:, -2:]
    clear = top_two[:, 1] - top_two[:, 0] > 0.01  # a near tie may go either way in bf16
    agree = low.argmax(1) == full.argmax(1)
    print(f"bf16 vs fp32 labels: {agree.mean():.4f} agree; {(~clear).sum()} near ties of {len(agree)} rows")
    assert agree[clear].all() and clear.mean() > 0.9


def test_budget_probe_picks_a_budget_that_runs_without_oom(long_rows, base_cls, tmp_path):
    free_before = torch.cuda.mem_get_info(CUDA)[0]
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    report = run_job(
        _long_job(
            long_rows, base_cls, tmp_path / "out", "classify", batching__max_tokens="auto", batching__strategy="auto"
        )
    )
    peak = torch.cuda.max_memory_allocated() - before
    batching = report["batching"]
    print(f"probe: {batching}; peak {peak / 2**30:.1f} GiB of {free_before / 2**30:.1f} GiB free")
    assert report["complete"] and report["rows_ok"] == LONG_ROWS and report["rows_error"] == 0
    assert "max_tokens_lowered" not in report
    measured = batching["probe"]["tokens_per_s"]
    assert batching["max_tokens"] >= GPU_PROBE_TOKENS and f"padded@{GPU_PROBE_TOKENS}" in measured
    assert f"packed@{batching['max_tokens']}" in measured  # auto weighed packed (varlen) against padded
    assert peak < (GPU_MEMORY_SHARE + 0.25) * free_before  # the scaled-up probe measurement held


def test_a_real_cuda_out_of_memory_is_split_and_retried(long_rows, minilm_path, tmp_path):
    run_job(_long_job(long_rows, minilm_path, tmp_path / "fits", model__dtype="float32"))
    torch.cuda.empty_cache()
    # The allocator refuses past the model and 1 GiB, as a small GPU would: a real torch.OutOfMemoryError
    # from CUDA's caching allocator, which no budget the probe picks on a 100+ GiB GPU runs into.
    limit = torch.cuda.memory_allocated() + (1 << 30)
    torch.cuda.set_per_process_memory_fraction(limit / torch.cuda.get_device_properties(CUDA).total_memory)
    try:
        report = run_job(
            _long_job(long_rows, minilm_path, tmp_path / "oom", model__dtype="float32", batching__max_tokens=1 << 21)
        )  # a whole 2M-token chunk in one batch
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    print(report.get("max_tokens_lowered"))
    assert report["max_tokens_lowered"][0].startswith("out of memory at ")
    assert "max_tokens 2097152 -> " in report["max_tokens_lowered"][0]
    assert report["complete"] and report["rows_ok"] == LONG_ROWS and report["rows_error"] == 0
    split, whole = _read(tmp_path / "oom"), _read(tmp_path / "fits")
    assert split.column("sms_id").to_pylist() == whole.column("sms_id").to_pylist()
    assert np.abs(_vectors(split, "embedding") - _vectors(whole, "embedding")).max() < 1e-4


def test_packed_equals_padded_on_cuda(sms_parquet, minilm_path, tmp_path, monkeypatch):
    """fp32: to 1e-5 (packed fp32 re-pads: flash attention has no fp32 kernel). bf16, packed through
    the varlen kernel: every row within 1e-3 of padded in cosine distance, and no further from fp32
    than padded bf16 is (a max-abs bound of 1e-3 would fail on bf16 rounding alone: packed and padded
    differ by up to 2.6e-3 on a CPU, where both run the same attention)."""
    calls = []
    kernel = batchinfer.backends.packing._varlen_attn()
    if kernel is not None:
        counted = lambda *a, **k: calls.append(1) or kernel(*a, **k)  # noqa: E731
        monkeypatch.setattr(batchinfer.backends.packing, "_varlen_attn", lambda: counted)
    flash_gpu = torch.cuda.get_device_capability(CUDA) >= (8, 0)
    torch_version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if torch_version >= (2, 10) and flash_gpu:
        assert kernel is not None, "torch >= 2.10 on an sm80+ GPU should offer torch.nn.attention.varlen.varlen_attn"
    out = {}
    for dtype in ("float32", "bfloat16"):
        for strategy in ("padded", "packed"):
            calls.clear()
            report = run_job(
                _cuda_job(
                    sms_parquet,
                    minilm_path,
                    tmp_path / f"{dtype}-{strategy}",
                    model__dtype=dtype,
                    batching__strategy=strategy,
                )
            )
            assert report["rows_ok"] == 600
            out[dtype, strategy] = _vectors(_read(tmp_path / f"{dtype}-{strategy}"), "embedding")
            assert bool(calls) == (kernel is not None and flash_gpu and dtype == "bfloat16" and strategy == "packed")
    assert np.abs(out["float32", "packed"] - out["float32", "padded"]).max() < 1e-5
    packed, padded, full = out["bfloat16", "packed"], out["bfloat16", "padded"], out["float32", "padded"]
    print(
        f"bf16 packed vs padded: max abs {np.abs(packed - padded).max():.2e}, "
        f"cosine min {_cosine(packed, padded).min():.6f}"
    )
    assert (1 - _cosine(packed, padded)).max() < 1e-3
    assert np.abs(packed - full).max() <= 2 * np.abs(padded - full).max() + 1e-4


def _parts(out) -> list:
    return sorted(out.glob("part-*.parquet"))


def test_kill_9_then_resume_on_cuda(tmp_path, minilm_path):
    """All 5,574 SMS messages in chunks of 200, killed twice mid-run; the same command then finishes
    with every id once and embeddings bit-equal to an uninterrupted run (batching pinned)."""
    out = tmp_path / "out"
    job = write_job(
        tmp_path,
        input={"path": str(EXAMPLES / "sms_spam"), "text": "text", "id": "sms_id"},
        model={"path": str(minilm_path), "task": "embed", "device": "cuda", "max_length": 128},
        batching={"chunk_rows": 200, "max_rows": 4, "max_tokens": 16384, "strategy": "padded"},
        output={"path": str(out)},
    )
    run_job(load_job(job, [f"output.path={tmp_path / 'reference'}"]))
    command = ["run", str(job), "-q"]
    rng = random.Random(16)
    for _ in range(2):
        target = len(_parts(out)) + rng.randint(1, 4)
        stopped = run_until(
            command,
            lambda _, target=target: len(_parts(out)) >= target,
            delay=rng.uniform(0, 0.05),  # somewhere inside a chunk
            timeout=180,
        )
        assert stopped.returncode == -signal.SIGKILL, stopped.output[-2000:]  # killed mid-run, not finished
        for part in _parts(out):
            pq.read_metadata(part)  # no part is visible half-written
    finished = run_cli(command)
    assert finished.returncode == 0, finished.stderr[-2000:]
    resumed = ds.dataset(str(out), format="parquet").to_table()
    whole = ds.dataset(str(tmp_path / "reference"), format="parquet").to_table()
    assert resumed.column("sms_id").to_pylist() == whole.column("sms_id").to_pylist()  # every id once, in order
    assert np.array_equal(_vectors(resumed, "embedding"), _vectors(whole, "embedding"))


@pytest.mark.parametrize("engine", ["transformers", "static"])
def test_greedy_generation_equals_model_generate_on_cuda(sms_table, tiny_llama, tmp_path, engine):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    table = _prompts(sms_table)
    pq.write_table(table, tmp_path / "prompts.parquet")
    report = run_job(
        validate_job(
            {
                "input": {"path": str(tmp_path / "prompts.parquet"), "text": "text", "id": "id"},
                "model": {
                    "path": str(tiny_llama),
                    "task": "generate",
                    "max_length": 128,
                    "device": "cuda",
                    "dtype": "float32",
                },
                "batching": {"max_rows": 8},
                "generation": {"engine": engine, "max_new_tokens": 16, "max_new_tokens_column": "budget"},
                "output": {"path": str(tmp_path / "out")},
            }
        )
    )
    assert report["rows_ok"] == table.num_rows and report["device"].startswith("cuda")
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).to(CUDA).eval()
    eos = model.generation_config.eos_token_id
    for row in ds.dataset(str(tmp_path / "out"), format="parquet").to_table().to_pylist():
        i = int(row["id"][1:])
        prompt = tokenizer(table.column("text")[i].as_py())["input_ids"]
        limit = table.column("budget")[i].as_py() or 16
        ids = torch.tensor([prompt], device=CUDA)
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=limit, do_sample=False)[
            0, len(prompt) :
        ].tolist()
        expected = generated[: generated.index(eos)] if eos in generated else generated
        assert row["text"] == tokenizer.decode(expected, skip_special_tokens=True), f"row {i}"
