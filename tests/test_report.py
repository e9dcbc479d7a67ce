"""The report from chunk records: pure, no model."""

from collections import Counter

from batchinfer.execution.report import build_report
from batchinfer.job.config import validate_job
from batchinfer.job.plan import plan_chunks
from batchinfer.output.records import ChunkRecord


def _record(chunk, rows, ok, errors=None, **extra):
    tokens = {"tokens": rows * 10, "padded_tokens": rows * 12}
    return ChunkRecord(chunk, rows, ok, errors or {}, truncated=0, model_seconds=1.0, **tokens, **extra)


def test_totals_count_a_retry_once_and_rates_cover_this_run_only():
    job = validate_job(
        {
            "input": {"path": "d", "text": "t"},
            "model": {"path": "m", "task": "embed"},
            "batching": {"chunk_rows": 100},
            "output": {"path": "o"},
        }
    )
    chunks = plan_chunks([200, 50], 100)
    done = {
        "00000-00000": _record("00000-00000", 100, 97, {"too_long": 3}),
        "00000-00001": _record("00000-00001", 100, 100),
        "00000-00000-r1": _record("00000-00000-r1", 3, 2, {"too_long": 1}, retry_of="00000-00000"),
    }
    run = Counter(rows=103, tokens=1030, busy=4.0, loop=8.0)
    report = build_report(
        job,
        chunks,
        done,
        run,
        9.5,
        "cpu",
        {"ray-0": Counter(rows=60), "ray-1": Counter(rows=43)},
    )
    assert (report["complete"], report["chunks_done"], report["chunks_total"]) == (False, 2, 3)
    assert report["rows"] == 200 and report["rows_ok"] == 199
    assert report["errors_by_reason"] == {"too_long": 1}  # the retry's errors replace the chunk's
    assert report["tokens"] == 2030 and report["padding_efficiency"] == round(2030 / 2436, 4)
    # one rate: rows over the run's wall seconds; the loop's own is the compute rate, named so
    assert report["run"]["rows_per_s"] == round(103 / 9.5, 1) and report["run"]["tokens_per_s"] == round(1030 / 9.5, 1)
    assert report["run"]["compute"] == {"seconds": 8.0, "rows_per_s": round(103 / 8.0, 1), "tokens_per_s": 128.8}
    assert report["run"]["model_busy"] == 0.25  # 2 workers
    assert report["run"]["workers"]["ray-0"] == {"chunks": 0, "rows": 60, "compute_rows_per_s": 7.5}
