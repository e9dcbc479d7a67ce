"""`batchinfer plan`: what a job will do before a night is committed to it, and nothing written.

Counts every shard's rows, tokenizes a sample of rows spread over the chunks, cuts the sample's
batches as the run would, times them on this machine, and says how the output folder stands.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from .config import JobConfig
from .control import StopFlag
from .driver import settle_budget
from .models import model_identity, read_config, resolve_model_path
from .plan import Work, fingerprint, plan_chunks
from .prepare import prepare_rows
from .sink import OutputDir
from .sources import READ_ERRORS, Inputs, discover_shards, open_reader, read_spec
from .tune import plan


def sample_problems(job: JobConfig, inputs: Inputs, rows: int = 200) -> tuple[int, Counter, dict[str, str]]:
    """Read the first `rows` rows and prepare them as a run would, without the model: how many were read,
    how many of them would go to _errors/ by reason, and one message per reason. Catches a job whose
    every row fails (a text column that holds numbers, a template over the wrong column) before a night."""
    spec = read_spec(job.input, job.columns, inputs.types)
    seen, reasons, examples = 0, Counter(), {}
    for shard in inputs.shards:
        if seen >= rows:
            break
        take = min(rows - seen, shard.num_rows)
        if not take:
            continue  # an empty shard: look at the next
        reader = open_reader(shard, spec)
        try:
            block = reader.read(0, take)
        except READ_ERRORS:
            continue  # the run reports an unreadable shard in its own words
        finally:
            reader.close()
        for reason, message in prepare_rows(job, block.table, block.bad_rows).errors.values():
            reasons[reason] += 1
            examples.setdefault(reason, f"{shard.name}: {message}")
        seen += take
    return seen, reasons, examples


def plan_job(job: JobConfig, sample: int = 2000, timed: bool = True) -> dict:
    inputs = discover_shards(job.input, job.columns, output=job.output.path)
    model_path = resolve_model_path(job.model.path)
    read_config(job.model, model_path)
    shards = inputs.shards
    chunks = plan_chunks([s.num_rows for s in shards], job.chunk_rows)
    rows = sum(s.num_rows for s in shards)
    folder = OutputDir(job.output.path, job.output.compression, job.output.storage_options).describe(
        fingerprint(job, model_identity(model_path), shards), len(chunks)
    )
    sampled = sample_problems(job, inputs)
    summary = {
        "sample_check": sampled,
        "shards": len(shards),
        "skipped_shards": len(inputs.bad),
        "rows": rows,
        "chunks": len(chunks),
        "output": folder,
    }

    from .task import TaskInputs

    budget, _ = settle_budget(job, None)
    spec = read_spec(job.input, job.columns, inputs.types)
    task = TaskInputs(job, model_path, shards, spec, None, budget).task(StopFlag())  # writes nothing: no writer
    runner = task.runner
    per_chunk = max(1, sample // len(chunks))
    picks = np.linspace(0, len(chunks) - 1, num=min(len(chunks), sample)).round().astype(int)
    lengths, truncated, errors, seen = [], 0, 0, 0
    for index in dict.fromkeys(picks.tolist()):
        chunk = chunks[index]
        offsets = list(range(min(per_chunk, chunk.rows)))
        loaded = task.load(Work(chunk, chunk.name, offsets))
        lengths.extend(loaded.tokens.lengths[loaded.index].tolist())
        truncated += int(loaded.tokens.truncated[loaded.index].sum())
        errors += len(loaded.prepared.errors)
        seen += len(offsets)
        if seen >= sample:
            break
    task.close()
    lengths = np.array(lengths, dtype=np.int64)
    summary["sampled_rows"] = seen
    if not len(lengths):
        return summary
    share_ok = len(lengths) / max(seen, 1)
    summary.update(
        {
            "tokens_per_row": {
                "mean": float(lengths.mean()),
                "p50": int(np.percentile(lengths, 50)),
                "p95": int(np.percentile(lengths, 95)),
                "max": int(lengths.max()),
            },
            "tokens": int(lengths.mean() * rows * share_ok),
            "truncated_share": truncated / len(lengths),
            "error_share": errors / max(seen, 1),
        }
    )
    if job.model.task == "generate":
        return summary
    batches = plan(lengths, *budget.key, job.batching.max_rows, runner.device)
    padded = sum(int(lengths[b].max()) * len(b) for b in batches)
    summary["batching"] = {
        "max_tokens": budget.max_tokens,
        "strategy": budget.strategy,
        "batches": len(batches),
        "padding_efficiency": float(lengths.sum() / padded) if padded else 1.0,
    }
    if timed:
        runner.settle_default()  # the backend and precision a run would most likely take
        ids = [[runner.pad_id] * int(n) for n in lengths]
        runner.packed = budget.strategy == "packed"
        runner.run(ids[:8])  # warm-up
        started = time.perf_counter()
        for batch in batches:
            runner.run([ids[i] for i in batch.tolist()])
        seconds = time.perf_counter() - started
        summary["estimate"] = {
            "device": f"{runner.device} ({runner.backend}{' ' + runner.precision if runner.precision else ''})",
            "tokens_per_s": float(lengths.sum() / seconds),
            "seconds": summary["tokens"] / (lengths.sum() / seconds),
        }
    return summary
