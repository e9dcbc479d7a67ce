"""plan's measure of the rows left: the job's model loaded as a run loads it, a sample of rows from across the
job read and tokenized by the chunk task, and a part of that sample timed on the model, probe included. This
module loads torch and the model; commands/dryrun.py imports it only when a job has rows left to run."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..batching.cut import computed_tokens, cut_batches
from ..batching.probe import Slices, candidates, overhead, probe
from ..control import StopFlag
from ..execution.chunk_task import TaskInputs
from ..execution.driver import settle_budget
from ..execution.report import prefix_saved, reuses_prefix
from ..execution.run_rows import load_rows, run_rows
from ..heap import HeapGuard
from ..job.config import JobConfig
from ..job.plan import Work
from ..machine import LoadWindow, load_so_far, process_age
from ..runners.base import BatchLoop
from ..runners.prefix import admission, page_hits
from ..runners.protocol import BatchRunner, ChunkContext, ChunkInput, Generating, Tokens
from ..sources import Inputs, read_spec
from ..sources.prepare import Prepared

SAMPLED_CHUNKS = 40  # chunks the sample is read from: spread over the job, each read costs a shard's open and seek
# Tokens of the sample run on the model (the probe's slices, then the whole of them with its choice, its first
# batch a warm-up): a systematic part holding the sample's mix of lengths, so that plan's time does not grow
# with --sample. 8,192 (two batches of the shipped classifier's 4,096) rated it 1.2x slower than a run's loop;
# 24,576 gives five timed batches. Both passes: about 25 s for the shipped one-layer classifier on a 2-core
# AVX2 EPYC under load (OpenVINO f32, ~2,000 tokens/s).
TIMED_TOKENS = 24576
# ... and no more than the model computes in this many seconds at the rate of its warm-up (a first call's rate,
# never above the model's): a causal LM scoring labels on a CPU runs a few hundred tokens a second, so 24,576 tokens
# of it would keep plan busy for minutes.
TIMED_SECONDS = 8.0
# ... but never fewer rows than this: a batch's fixed cost (a call per layer, and on a busy CPU each call's wait for
# its threads) is spread over a run's hundreds of rows a batch. A causal LM scoring labels timed on 3 rows ran at a
# third of its rate on 16 or more (SmolLM2, 2-core AVX2 EPYC under load); 32, for batch_line's batches of 8 and 24.
MIN_TIMED_ROWS = 32
# A sample timed as batches this many times smaller than a run's batch, on a busy machine, is timed as two
# (batch_line): on a CPU that other processes share, a batch's fixed cost (each layer's call waiting for its
# threads) outweighs a small batch's work. SmolLM2 scoring labels beside two busy processes (2-core AVX2 EPYC): 16
# rows ran at 15-82 tokens/s where the run's batches of 256 ran at 80 to 110, and plans said 2 min 11 s to 11 min
# for runs of 1 min 49 s to 2 min 24 s; a line through batches of 8 and 24 rows put a 256-row batch within 18% of
# its time (four tries), where the rate of 16 rows was 34% to 2.7x slow. On a quiet machine the two rates agree
# (310 and 350 tokens/s), and a line through two batches of a second or less drew as much from noise (plans -16% to
# +54% of the run, against +1 to +9% at the timed rows' own rate).
SMALLER = 2
# A generation job's rows timed, in three passes over rows spread across the sample: the first on an engine that
# has run nothing yet (a run's first chunk pays its set-up), then two of different sizes, warm, through which a line
# gives a chunk's fixed time (its last steps, a few rows each) and a token's, prompt or generated (the steps before,
# full). 32 rows timed alone ran 30-45% below a 256-row chunk's rate, and a plan of 5,474 rows said 10 min 19 s for
# a 7 min 12 s run; the line through 16 and 48 rows gave a 256-row chunk within 4% (SmolLM2 on the OpenVINO
# engine, 2-core Zen 4 EPYC). The passes are timed in the process's CPU seconds, which other processes barely
# change (2-core AVX2 EPYC: beside CI's suite, load 3-4, 8.4-8.7, 4.3-5.0 and 11.8-14.0 s; quiet 7.4-10.7, 5.4-7.6
# and 12.6-15.7 s, where wall seconds were 2-3x apart), and made wall seconds at the share of the CPU the passes
# had together: a line through wall seconds tilted with each change of load between passes (89 s said beside
# that suite for a 58 s run).
GENERATED_PASSES = (16, 16, 48)
FEWEST_FITTED = 20  # fewer rows in the sample: one pass, its rate


def time_on_sample(
    job: JobConfig,
    inputs: Inputs,
    model_path: Path,
    chunks: list,
    earlier,
    summary: dict,
    aside: float,
    sample: int,
    timed: bool,
) -> dict:
    """The rest of plan's summary of a job with rows left (`summary`: what dryrun.estimate_job counted): the
    sample's tokens, the batches they cut into and (timed) the time for the rows left. `earlier`: what the
    folder holds of the job (dryrun.SoFar); `aside`: seconds of plan's own reading, which a run does not do."""
    rows = summary["rows"]
    budget, auto = settle_budget(job, earlier.tuning)
    spec = read_spec(job.input, job.columns, inputs.types)
    task = TaskInputs(job, model_path, inputs.shards, spec, None, budget).task(StopFlag())  # writes nothing: no writer
    runner = task.runner
    # What a run spends before its first batch: batchinfer's imports, discovery, the model's load; not a
    # conversion this process made (and the weights it was made from), which the run reads from the cache.
    converted = runner.load_seconds.get("convert", 0.0)
    started = {"startup_s": process_age() - aside - converted, "converted_s": converted}
    sampled = sample_tokens(task, chunks, sample)
    lengths, seen = sampled.lengths, sampled.seen
    summary["sampled_rows"] = seen
    if not len(lengths):
        return summary
    summary.update(token_figures(sampled, rows))
    if sampled.prefix is not None or reuses_prefix(job):  # label scoring: computed once per chunk
        summary["prefix"] = scaled_prefix(sampled.prefix, rows / max(seen, 1))
    if job.model.task == "generate":
        generating: Generating = runner  # a generate job's runner: its engine's cache pages, its completions
        page = generating.shared_page()
        if page:  # read from the engine's cache pages
            summary["prefix"] = estimate_prefix(sampled, page, rows, len(chunks), summary["tokens"])
        if timed:
            left = max(1, math.ceil(len(chunks) * summary["rows_left"] / max(rows, 1)))  # chunk pieces alike
            summary["estimate"] = time_generation(generating, job, budget, sampled, summary["rows_left"], left, started)
        return summary
    probing = auto and earlier.tuning is None
    if timed:
        summary["estimate"], key = estimate_time(
            runner, job, budget, sampled, probing, summary, earlier, started, chunks[0].rows
        )
        budget = replace(budget, max_tokens=key[0], strategy=key[1])
    batches = cut_batches(lengths, *budget.key, job.batching.max_rows, runner.device)
    padded = computed_tokens(lengths, batches, budget.strategy)
    summary["batching"] = {
        "max_tokens": budget.max_tokens,
        "strategy": budget.strategy,
        "batches": len(batches),
        "padding_efficiency": float(lengths.sum() / padded) if padded else 1.0,
        "source": "recorded" if earlier.tuning else ("probe" if probing and timed else "job"),
    }
    return summary


def token_figures(sampled: Sampled, rows: int) -> dict:
    """The sample's tokens per row, the job's tokens (its `rows`, the usable share of them) and the shares of
    items cut at max_length and of rows that would fail."""
    lengths, seen = sampled.lengths, sampled.seen
    share_ok = len(lengths) / max(seen, 1)
    return {
        "tokens_per_row": {
            "mean": float(lengths.mean()),
            "p50": int(np.percentile(lengths, 50)),
            "p95": int(np.percentile(lengths, 95)),
            "max": int(lengths.max()),
        },
        "tokens": int(lengths.mean() * rows * share_ok),
        "truncated_share": sampled.truncated / len(lengths),
        "error_share": sampled.errors / max(seen, 1),
    }


@dataclass
class Sampled:
    """Rows tokenized from across the job, as a run reads them."""

    items: list  # the items that would run, as the runner tokenized them
    lengths: np.ndarray  # tokens per item that would run (a prefix computed once not counted)
    truncated: int  # items cut at max_length
    errors: int  # rows that would go to _errors/
    seen: int  # rows read
    reading: float  # seconds spent reading, preparing and tokenizing
    prefix: dict | None  # what a prefix common to the sample saved it (Tokens.prefix_reused)
    chunk_texts: list[int]  # the sampled texts (items, for generation) of each chunk read, in order
    tables: list  # the sampled rows as read, a table per chunk (generation times their completions)


def sample_tokens(task, chunks: list, sample: int) -> Sampled:
    """About `sample` rows from the start of chunks spread over the job, read by the chunk task and tokenized
    together, as one chunk (a prefix that the job's prompts share is found on them as a chunk's run finds it)."""
    # SAMPLED_CHUNKS of them, more where chunks are too small to hold the sample
    spread = min(len(chunks), sample, max(SAMPLED_CHUNKS, -(-sample // max(chunks[0].rows, 1))))
    per_chunk = max(1, sample // spread)
    picks = np.linspace(0, len(chunks) - 1, num=spread).round().astype(int)
    texts, errors, seen, reading, chunk_texts, tables = [], 0, 0, 0.0, [], []
    for index in dict.fromkeys(picks.tolist()):
        chunk = chunks[index]
        offsets = list(range(min(per_chunk, chunk.rows)))
        loaded = task.load(Work(chunk, chunk.name, offsets))
        tables.append(loaded.table)
        owners = np.unique(loaded.tokens.owners()[loaded.index]).tolist()
        texts += [loaded.prepared.texts[t] for t in owners]
        chunk_texts.append(len(owners))
        errors += len(loaded.prepared.errors)
        seen += len(offsets)
        reading += loaded.seconds
        if seen >= sample:
            break
    task.close()
    tokens = task.runner.tokenize(texts)
    every = np.arange(len(tokens.ids))
    truncated = int(tokens.truncated.sum())
    prefix = tokens.prefix_reused(every)
    return Sampled(tokens.ids, tokens.lengths, truncated, errors, seen, reading, prefix, chunk_texts, tables)


def scaled_prefix(prefix: dict | None, scale: float) -> dict:
    """The report's `prefix` figures of a sample's (a record's shape), its rows and tokens scaled to the job's
    (`scale`: the job's rows per sampled row)."""
    figures = prefix_saved([prefix] if prefix else [])
    return {**figures, "rows": int(figures["rows"] * scale), "saved_tokens": int(figures["saved_tokens"] * scale)}


def estimate_prefix(sampled: Sampled, page: int, rows: int, chunks: int, tokens: int) -> dict:
    """What the engine's block sharing will save over the job, as the report's `prefix` says it: each sampled
    chunk's rows admitted as a run admits them; a chunk starts with an empty cache, so its first row reads
    nothing, and every other row what the sample's followers read on average (the sample as one chunk when it
    took one row a chunk). `tokens`: the job's prompt tokens."""
    ends = np.cumsum(sampled.chunk_texts).tolist()
    prompts = [sampled.items[start:end] for start, end in zip([0, *ends], ends)]
    groups = prompts if any(len(chunk) > 1 for chunk in prompts) else [sampled.items]
    hits = []
    for ids in groups:
        leaders, _, followers = admission(ids, page)
        hits.append(page_hits([ids[i] for i in leaders + followers], page))
    later = [h for chunk in hits for h in chunk[1:]]
    others = max(rows - chunks, 0)
    figures = {"tokens": 0, "rows": 0, "saved_tokens": 0, "prompt_tokens": tokens}
    if later:
        figures |= {
            "tokens": max(later),
            "rows": round(others * sum(1 for h in later if h) / len(later)),
            "saved_tokens": round(others * sum(later) / len(later)),
        }
    return prefix_saved([figures])


def estimate_time(
    runner: BatchRunner,
    job: JobConfig,
    budget,
    sampled: Sampled,
    probing: bool,
    summary: dict,
    earlier,
    started: dict,
    first_chunk_rows: int,
):
    """The time for the rows left: start-up, the probe where the run will probe, and the work at the model's rate
    on TIMED_TOKENS of the sample (or at the rate this job ran at here). Returns the estimate and the batching
    it was timed with."""
    lengths = sampled.lengths
    window = LoadWindow()
    warm = warm_up(runner, sampled.items, lengths, budget, probing)
    timed = Slices(lengths).take(min(TIMED_TOKENS, max(warm * TIMED_SECONDS, lengths.mean() * MIN_TIMED_ROWS)))
    items = [sampled.items[i] for i in timed.tolist()]
    measured = time_sample(runner, items, lengths[timed], budget, job, probing, lengths.mean() * first_chunk_rows)
    load = window.stop()
    tokens_left = lengths.mean() * summary["rows_left"] * len(lengths) / max(sampled.seen, 1)
    model_rate = measured["tokens_per_s"]
    read_rate = float(lengths.sum() / sampled.reading) if sampled.reading else float("inf")
    # Both executors read and tokenize the next chunk while the model runs this one (local: a loading thread;
    # Ray: a threaded actor with two chunks in flight), so a chunk costs the slower of the two; only the first
    # chunk's reading has nothing to hide behind. On a CPU the loading thread takes some of the model's cores:
    # that share is in the run's rate, not in plan's, whose reading (sparse rows, whole row groups decoded to
    # reach them) costs more per row than a run's.
    first_read = min(lengths.mean() * first_chunk_rows, tokens_left) / read_rate
    work = max(tokens_left / model_rate, tokens_left / read_rate) + first_read
    estimate = {
        "device": f"{runner.device} ({runner.backend}{' ' + runner.precision if runner.precision else ''})",
        "tokens_per_s": model_rate,
        "timed_tokens": measured["timed_tokens"],
        "run_batch_tokens": measured["run_batch_tokens"],
        "warmup_tokens": measured["warmup_tokens"],
        "read_tokens_per_s": read_rate,
        **started,
        "probe_s": measured["probe_s"] if probing and summary["rows_left"] else None,
        "work_s": work,
        "rate_from": "sample",
        "load": load,
    }
    # What this job ran at here, end to end, is better than a sample, once that run went past its first chunk
    # (which carries the probe, and a --limit run may hold no more).
    if earlier.rate and earlier.run_rows > job.chunk_rows and summary["rows_left"]:
        estimate.update(work_s=summary["rows_left"] / earlier.rate, rate_from="folder", rows_per_s=earlier.rate)
        estimate["folder_load"] = earlier.load
        estimate["folder_finished"] = earlier.finished
    estimate["seconds"] = (
        estimate["startup_s"] + (estimate["probe_s"] or 0.0) + estimate["work_s"] if summary["rows_left"] else 0.0
    )
    return estimate, measured["budget"]


def time_generation(
    runner: Generating, job: JobConfig, budget, sampled: Sampled, rows_left: int, chunks_left: int, started: dict
) -> dict:
    """The time for the rows left of a generation job, from completions the job's own engine writes for rows of
    the sample: a row's time is mostly its completion's, whose length only generating it tells. The rows, spread
    over the sample (so over the job), run as a run's chunks run them (runner.run_chunk: the same engine, settings
    and rows in flight) in GENERATED_PASSES: the work is a chunk's fixed time for each chunk left and a token's for
    each token left (the sample's prompts and the completions' mean length), the first chunk's as many times as
    long as the first pass, on a cold engine, ran past the line."""
    rows = pa.concat_tables(sampled.tables, promote_options="default")
    picked = np.unique(np.linspace(0, rows.num_rows - 1, num=min(sum(GENERATED_PASSES), rows.num_rows)).round())
    window = LoadWindow()
    # CPU seconds on a CPU; a GPU's work is none of the host's CPU seconds: wall seconds there
    clock = time.process_time if runner.device.type == "cpu" else time.perf_counter
    passes, completions, generated = [], [], 0
    for part in np.split(picked.astype(int), np.cumsum(pass_sizes(len(picked)))[:-1]):
        loaded = load_rows(job, runner, rows.take(pa.array(part)), cut_with=budget.key)
        t0, c0 = time.perf_counter(), clock()
        done = run_rows(runner, loaded, ChunkContext(job, budget, StopFlag(), HeapGuard(), lambda m: None))
        seconds = (clock() - c0, time.perf_counter() - t0)
        lengths = done.columns["completion_tokens"].to_numpy(zero_copy_only=False).astype(float)
        made = done.output.figures.get("generated_tokens")  # the engine's, past a stop string too
        made = lengths.sum() if made is None else made
        prompts = sum(len(ids) for ids in loaded.tokens.ids)
        passes.append((len(done.rows), prompts + made, *seconds))
        completions.append(lengths)
        generated += made
    lengths = np.concatenate(completions)
    ran = max(sum(p[0] for p in passes), 1)
    per_row = float(sampled.lengths.mean()) + generated / ran  # tokens a row: its prompt and what it generates
    work = generation_work(passes, per_row, rows_left, chunks_left)
    described = runner.engine.described
    estimate = {
        "device": f"{runner.device} ({described['name']}, {described.get('precision') or 'f32'})",
        "rows_per_s": rows_left / max(work, 1e-9),  # plan times a generation job only with rows left
        "timed_rows": ran,
        "timed_passes": len(passes),
        "generated_tokens_per_row": generated / ran,
        # the standard error of the mean completion, as a share of it: the time goes with the tokens generated
        "uncertainty": float(lengths.std() / np.sqrt(len(lengths)) / lengths.mean()) if lengths.sum() else 0.0,
        **started,
        "probe_s": None,
        "work_s": work,
        "rate_from": "completions",
        "load": window.stop(),
    }
    estimate["seconds"] = started["startup_s"] + estimate["work_s"] if rows_left else 0.0
    return estimate


def generation_work(passes: list[tuple[int, float, float, float]], per_row: float, rows: int, chunks: int) -> float:
    """The wall seconds of `rows` rows of `per_row` tokens in `chunks` chunks, from GENERATED_PASSES of (rows,
    tokens, CPU seconds (wall seconds on a GPU), wall seconds): a chunk's fixed time and a token's fitted on the
    CPU seconds (fitted_costs), the first chunk's times the cold factor, made wall seconds at the share of the CPU
    the passes had together. One pass (a small sample): its rate."""
    cpu = sum(p[2] for p in passes)
    if len(passes) == 3:
        cold, chunk_s, token_s = fitted_costs([p[:3] for p in passes])
        first = chunk_s + token_s * per_row * rows / chunks  # a chunk's seconds, warm
        work = (cold - 1) * first + chunk_s * chunks + token_s * per_row * rows
    else:
        work = rows * cpu / max(passes[0][0], 1)
    return work * sum(p[3] for p in passes) / max(cpu, 1e-9)


def pass_sizes(rows: int) -> tuple[int, ...]:
    """GENERATED_PASSES for `rows` sampled rows: as given, or scaled down; one pass below FEWEST_FITTED."""
    if rows < FEWEST_FITTED:
        return (rows,)
    if rows >= sum(GENERATED_PASSES):
        return GENERATED_PASSES
    first = rows * GENERATED_PASSES[0] // sum(GENERATED_PASSES)
    return first, first, rows - 2 * first


def fitted_costs(passes: list[tuple[int, float, float]]) -> tuple[float, float, float]:
    """(how many times as long the first pass ran as the line says, a chunk's fixed seconds, a token's seconds)
    from three passes of (rows, tokens, seconds): a line through the two warm ones; where noise tilts it (no
    positive cost a token, or a negative one a chunk), their mean seconds a token and no fixed part. A cold
    engine's pass is slower by a factor, not a sum: 16 rows and a run's 100-row first chunk both took 1.55x the
    line (its kernels made for each new shape), and a 256-row first chunk about 1.5x."""
    (_, t1, s1), (_, t2, s2) = passes[1], passes[2]
    chunk_s, token_s = line((t1, s1), (t2, s2)) or (0.0, (s1 + s2) / max(t1 + t2, 1.0))
    _, t0, s0 = passes[0]
    return max(1.0, s0 / max(chunk_s + token_s * t0, 1e-9)), chunk_s, token_s


def line(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float] | None:
    """(fixed seconds, seconds a token) through two (tokens, seconds) points; None where noise tilts it (no
    positive cost a token, or a negative fixed part)."""
    (t1, s1), (t2, s2) = a, b
    per_token = (s2 - s1) / (t2 - t1) if t2 > t1 else 0.0
    fixed = s1 - per_token * t1
    return (fixed, per_token) if per_token > 0 and fixed >= 0 else None


def busy() -> bool:
    """Whether other processes took CPU since batchinfer was imported (the model's load, the sample's reading):
    what makes a CPU batch's fixed cost large (SMALLER)."""
    load = load_so_far()
    return load is not None and load.busy()


def batch_line(run, rows: np.ndarray, lengths: np.ndarray, strategy: str, run_batch: float) -> float:
    """The model's tokens/s at a run's batch of `run_batch` tokens (a large one: its rows alike in length), from
    `rows` (positions into `lengths`) run as two batches, every fourth of them by length and the rest: a line
    through their (tokens computed, seconds) gives a batch's fixed seconds and a token's. Where noise tilts it (no
    positive cost a token, or a negative one a batch), the two batches' own rate."""
    ordered = rows[np.argsort(lengths[rows], kind="stable")]
    parts = (ordered[::4], np.delete(ordered, np.s_[::4]))
    points = [(float(computed_tokens(lengths, [part], strategy)), run([part], strategy)) for part in parts]
    fitted = line(*points)
    if fitted is None:
        return float(lengths[rows].sum() / max(points[0][1] + points[1][1], 1e-9))
    fixed, per_token = fitted
    return float(run_batch / (fixed + per_token * run_batch))


def warm_up(runner: BatchRunner, ids: list, lengths: np.ndarray, budget, probing: bool) -> float:
    """Each backend's precision settled as a run settles it, the backend a run would take where no probe chooses,
    and a first batch of up to 8 of the sample's items run (first-call allocations, kernel choice): its tokens/s."""
    runner.settle_precisions()  # each backend's precision, checked as a run checks it
    if not probing:  # the backend a run would take: the recorded one, or the default
        runner.keep(next(iter(runner.backends)))
    first = Slices(lengths).take_rows(8)
    runner.lay_out(budget.strategy)
    t0 = time.perf_counter()
    runner.run([ids[i] for i in first.tolist()])
    return float(lengths[first].sum() / max(time.perf_counter() - t0, 1e-9))


def sample_loop(runner: BatchRunner, ids: list, lengths: np.ndarray, budget, job: JobConfig) -> BatchLoop:
    """The sample's items (`ids`, of `lengths` tokens) as a chunk for the run's own batch loop (runners/base.py):
    each batch split and retried on failure, the heap trimmed between batches, as in a run."""
    every = np.arange(len(ids))
    tokens = Tokens(ids, lengths, np.zeros(len(ids), dtype=bool))
    prepared = Prepared([None] * len(ids), every, {})  # what a failed item's error is kept in (none is read)
    loaded = ChunkInput(
        table=pa.table({}), prepared=prepared, tokens=tokens, index=every, batches=[], cut_with=budget.key
    )
    return BatchLoop(runner, loaded, ChunkContext(job, budget, StopFlag(), HeapGuard(), lambda message: None))


def time_sample(
    runner: BatchRunner, ids: list, lengths: np.ndarray, budget, job: JobConfig, probing: bool, first_chunk: float
) -> dict:
    """The model's rate on the sample's items (`ids`, of `lengths` tokens; a prefix they share computed once, as
    a run computes it), cut as the run would cut them. probing: first run the run's own probe on the sample, as the
    run does on its first chunk, then time the sample with its choice, its first batch a warm-up not counted;
    probe_s is what the probe adds to the work it does (the settings that lose), on the slices a first chunk of
    `first_chunk` tokens gives it (a bounded probe, the runner's probe_share, that share of them). warm_up has run."""
    rows, backends, share = job.batching.max_rows, runner.candidates(), runner.probe_share
    settings = (job.batching.max_tokens, job.batching.strategy)
    run = sample_loop(runner, ids, lengths, budget, job).run  # as a run's chunk runs its batches

    key, tuning = budget.key, None
    if probing:
        tuning, _ = probe(lengths, run, *settings, rows, runner.device, backends, share)
        runner.keep(tuning.backend)
        key = (tuning.max_tokens, tuning.strategy)
    # The whole sample with the choice (the probe's slices are small, and what it left over smaller still). Its
    # first batch warms the chosen setting up and is not counted: a run warms up once, in its first chunk. A
    # sample of one batch is timed whole: warm_up's batch, and the probe's slices where it probed, warmed it up.
    batches = cut_batches(lengths, *key, rows, runner.device)
    timed = batches
    if len(batches) > 1:
        run(batches[:1], key[1])
        timed = batches[1:]
    counted = int(sum(lengths[b].sum() for b in timed))
    run_batch = min(key[0], first_chunk, rows * float(lengths.mean()))  # the tokens of a run's batch
    together = np.concatenate(timed)
    if len(together) >= 8 and run_batch > SMALLER * counted and runner.device.type == "cpu" and busy():
        rate = batch_line(run, together, lengths, key[1], run_batch)
    else:
        rate, run_batch = float(counted / max(run(timed, key[1]), 1e-9)), None
    probe_s = 0.0
    if tuning is not None:  # what the run's probe of its first chunk adds: its losing slices, cut as that chunk's
        _, slice_tokens = candidates(int(first_chunk), *settings, runner.device, backends, share)
        probe_s = overhead(tuning, rate, slice_tokens)
    return {
        "tokens_per_s": rate,
        "run_batch_tokens": run_batch,  # the batch the rate is at, where the timed rows ran as two (batch_line)
        "timed_tokens": counted,
        "warmup_tokens": int(lengths[batches[0]].sum()) if len(batches) > 1 else 0,
        "probe_s": probe_s,
        "budget": key,
    }
