"""Totals of a job from its chunk records, and the rates of this run. Pure: no I/O."""

from __future__ import annotations

from collections import Counter

from ..job.config import JobConfig
from ..job.plan import Chunk
from ..job.tasks import LABEL_SCORING, model_spec
from ..output.records import ChunkRecord, current_errors


def build_report(
    job: JobConfig,
    chunks: list[Chunk],
    done: dict[str, ChunkRecord],
    run: Counter,
    seconds: float,
    device: str,
    workers: dict[str, Counter] | None = None,
) -> dict:
    """Totals over every finished chunk and retry; rates over this run (`run`) and every run of the job (`job`).

    Every rate is an amount over the wall seconds of what it names: `run`'s over the run's `seconds` (start-up
    included), `run.compute`'s over the processing loop alone, `job`'s over its runs' seconds.
    run: this run's rows, tokens, model-busy seconds, generated tokens and `loop` (seconds from the
    first chunk handed out to the last one committed); workers: the same per worker."""
    planned = {c.name for c in chunks}
    records = [r for r in done.values() if r.base in planned]  # a larger earlier run's aside
    chunk_records = [r for r in records if not r.retry_of]
    errors: Counter = Counter()
    for chunk, name in current_errors(done).items():
        if chunk in planned:
            errors.update(done[name].errors)
    tokens, padded = sum(r.tokens for r in records), sum(r.padded_tokens for r in records)
    loop = run.get("loop", 0.0)
    report = {
        "output": job.output.path,
        "task": job.model.task,
        "model": job.model.path,
        "device": device,
        "complete": len(chunk_records) == len(chunks),
        "chunks_done": len(chunk_records),
        "chunks_total": len(chunks),
        "rows": sum(r.rows for r in chunk_records),
        "rows_ok": sum(r.ok for r in records),
        "rows_error": sum(errors.values()),
        "errors_by_reason": dict(sorted(errors.items())),
        "truncated": sum(r.truncated for r in records),
        "tokens": tokens,
        "padding_efficiency": round(tokens / padded, 4) if padded else 1.0,
        "run": run_figures(run, seconds, len(workers or {})),
    }
    report["job"] = whole_job(records)
    if workers and set(workers) != {"local"}:
        report["run"]["workers"] = {
            name: {"chunks": w["chunks"], "rows": w["rows"], "compute_rows_per_s": _rate(w["rows"], loop)}
            for name, w in sorted(workers.items())
        }
    if reuses_prefix(job) or any(r.prefix for r in records):
        report["prefix"] = prefix_saved([r.prefix for r in records if r.prefix])
    if job.model.task == "generate":
        _generation(report, records, run.get("generated", 0), seconds, loop)
    return report


def run_figures(run: Counter, seconds: float, workers: int) -> dict:
    """This run's rows and seconds, its rates over those seconds, the same over its processing loop alone
    (`compute`: first chunk handed out to last committed, start-up left out), and how busy the model was."""
    loop, rows, tokens = run.get("loop", 0.0), run.get("rows", 0), run.get("tokens", 0)
    return {
        "rows": rows,
        "seconds": round(seconds, 3),
        "rows_per_s": _rate(rows, seconds),
        "tokens_per_s": _rate(tokens, seconds),
        "compute": {"seconds": round(loop, 3), "rows_per_s": _rate(rows, loop), "tokens_per_s": _rate(tokens, loop)},
        # of the workers' time: 1.0 when every worker computed from the first chunk to the last
        "model_busy": round(run.get("busy", 0.0) / loop / max(1, workers), 3) if loop else 0.0,
    }


def whole_job(records: list[ChunkRecord]) -> dict:
    """The job's rows, those the runs that committed its chunks ran (after a Ctrl-C and a resume, or a --limit
    trial and the rest; a row a --retry-errors pass ran again is one row still), and their seconds: each run's
    from its start (the folder opened) to its last commit, a retry pass's too."""
    last: dict[float, float] = {}
    timed = [r for r in records if r.run_started is not None and r.finished is not None]
    for record in timed:
        last[record.run_started] = max(last.get(record.run_started, 0.0), record.finished)
    rows = sum(r.rows for r in timed if not r.retry_of)
    seconds = sum(end - start for start, end in last.items())
    return {"runs": len(last), "rows": rows, "seconds": round(seconds, 3), "rows_per_s": _rate(rows, seconds)}


def _generation(report: dict, records: list[ChunkRecord], generated: int, seconds: float, loop: float) -> None:
    """A generate job's figures: generated tokens, this run's rates of them (over the run and over its processing
    loop), the median time to the first token, the engine."""
    first = sorted(r.first_token_seconds for r in records if r.first_token_seconds is not None)
    report["generated_tokens"] = sum(r.generated_tokens or 0 for r in records)
    report["run"]["generated_tokens_per_s"] = _rate(generated, seconds)
    report["run"]["compute"]["generated_tokens_per_s"] = _rate(generated, loop)
    report["run"]["time_to_first_token_s"] = first[len(first) // 2] if first else None
    if engines := engines_used(records):
        report["engine"] = engines


def engines_used(records: list[ChunkRecord]) -> dict | list[dict] | None:
    """The generation engine that ran the chunks (its name, precision, notes and checks); a list of each where
    runs of a resumed job differed; None where no record says."""
    engines = [r.engine for r in records if r.engine]
    distinct = [e for i, e in enumerate(engines) if e not in engines[:i]]
    return (distinct[0] if len(distinct) == 1 else distinct) or None


def reuses_prefix(job: JobConfig) -> bool:
    """Whether the job's task computes a prompt prefix that its rows share once (label scoring), so that its
    report says what that saved even when nothing was shared. (Generation's records carry `prefix` whenever
    the engine shares cache pages, runners/generate.py.)"""
    return model_spec(job.model.task, job.model.labels) is LABEL_SCORING


def prefix_saved(prefixes: list[dict]) -> dict:
    """What shared prompt prefixes saved, from records' (or a plan's sample's) `prefix` figures, for either task:
    the length most rows ran after, the rows that reused one, the prompt tokens not computed again, and their
    share of the prompt tokens the rows had in full (each figure's `prompt_tokens`, the saved ones included:
    label scoring's record `tokens` leave the prefix out, generation's count it, so neither is the base)."""
    lengths: Counter = Counter()
    for prefix in prefixes:
        lengths[prefix["tokens"]] += prefix["rows"]
    saved = sum(prefix["saved_tokens"] for prefix in prefixes)
    prompt = sum(prefix["prompt_tokens"] for prefix in prefixes)
    return {
        "tokens": lengths.most_common(1)[0][0] if lengths else 0,
        "rows": sum(lengths.values()),
        "saved_tokens": saved,
        "saved_share": round(saved / prompt, 4) if prompt else 0.0,
    }


def _rate(amount: float, seconds: float) -> float:
    return round(amount / seconds, 1) if seconds else 0.0
