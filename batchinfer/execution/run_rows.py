"""The one way from rows to results: a pyarrow Table of input rows → each row's result columns, or why it did not
run. A chunk of a job (chunk_task.py), rows held in memory (api.infer) and a served request's texts
(serve/services.py) all go through it; none writes a file here.

`load_rows` does everything up to the model (prepare, per-row settings, tokenize, cut into batches) and
`run_rows` the model and the accounting, so that a caller can load the next rows while these compute.
`RowRun` runs successive tables (a job's chunks, infer()'s slices) with the batching carried from one to the
next, and `name_scores` names a result table's `scores` as a part file holds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import pyarrow as pa

from ..batching.budget import Batching
from ..control import StopFlag
from ..errors import ModelError
from ..heap import HeapGuard
from ..job.config import JobConfig
from ..reasons import Reason
from ..runners.protocol import ChunkContext, ChunkInput, ChunkOutput, Runner
from ..sources.prepare import prepare_rows

SCORE_LABELS = "labels"  # the key of the `scores` field's metadata that names its entries


@dataclass
class RowResults:
    """What the model made of a table's rows."""

    rows: np.ndarray  # the rows that ran, as positions in the table, ascending
    columns: dict[str, pa.Array]  # the task's result columns, one entry per row of `rows`
    truncated: np.ndarray  # [len(rows)] bool: a row with any item cut at model.max_length
    errors: dict[int, tuple[str, str]]  # every other row: position -> (reason, message)
    output: ChunkOutput  # the runner's figures (time, padded tokens, a probe's choice, the budget it ended with)


def load_rows(
    job: JobConfig,
    runner: Runner,
    table: pa.Table,
    bad_rows: dict[int, tuple[str, str]] | None = None,
    cut_with: tuple[int, str] | None = None,
    check: Callable[[], None] = lambda: None,
) -> ChunkInput:
    """`table`'s rows read as the job reads its input, tokenized by the runner, and cut into batches under the
    Batching.key `cut_with` (None: not cut, for a caller that batches the items itself). `bad_rows`: rows the
    reader could not read; `check` is called between the steps and may raise to stop (Ctrl-C)."""
    prepared = prepare_rows(job, table, bad_rows or {})
    settings = runner.row_settings(job, table, prepared)
    check()
    tokens = runner.tokenize(prepared.texts)
    check()
    owners = tokens.owners()
    if job.model.truncation == "error":
        for i in np.flatnonzero(tokens.truncated).tolist():
            prepared.errors[int(prepared.rows[owners[i]])] = (
                Reason.TOO_LONG,
                f"text is longer than max_length={runner.max_length} tokens",
            )
    # the items of rows with no error so far (a row whose text was too long loses all its items)
    failed = np.isin(prepared.rows[owners], np.fromiter(prepared.errors, dtype=np.int64, count=len(prepared.errors)))
    index = np.flatnonzero(~failed) if len(owners) else np.zeros(0, dtype=np.int64)
    batches = runner.cut(tokens.lengths[index], cut_with, job.batching.max_rows) if cut_with else []
    return ChunkInput(
        table=table,
        prepared=prepared,
        tokens=tokens,
        index=index,
        batches=batches,
        cut_with=cut_with or (0, ""),
        row_settings=settings,
    )


def run_rows(runner: Runner, loaded: ChunkInput, ctx: ChunkContext, name: str = "rows") -> RowResults:
    """Loaded rows through the model; rows that fail join loaded.prepared.errors. A model that fails on every
    row (more than one) stops with a ModelError naming `name`: no problem of single rows."""
    out = runner.run_chunk(loaded, ctx)
    prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
    owners = tokens.owners()
    sent = np.unique(owners[index])  # the rows (positions in the texts) that went to the model
    failed = [prepared.errors.get(int(prepared.rows[t]), ("", "")) for t in np.setdiff1d(sent, out.kept)]
    model_errors = [message for reason, message in failed if reason == Reason.MODEL_ERROR]
    if len(sent) > 1 and len(model_errors) == len(sent):
        raise ModelError(
            f"the model failed on every row of {name}: {model_errors[0]}",
            "this is no problem of single rows; check model.device, model.dtype and the model folder",
        )
    cut = np.zeros(len(prepared.texts), dtype=bool)
    np.logical_or.at(cut, owners, tokens.truncated)  # a row is cut when any of its items is
    return RowResults(prepared.rows[out.kept], out.columns, cut[out.kept], prepared.errors, out)


class RowRun:
    """A runner over successive tables of rows: each is cut and run with the batching the last one ended with
    (a probe's choice, a budget lowered after an out-of-memory error)."""

    def __init__(self, job: JobConfig, runner: Runner, budget: Batching, stop: StopFlag, heap: HeapGuard):
        self.job, self.runner, self.budget, self.stop, self.heap = job, runner, budget, stop, heap

    def adopt(self, max_tokens: int, strategy: str) -> None:
        """Cut the next rows with a probe's choice made elsewhere (another worker's first chunk)."""
        self.budget = replace(self.budget, max_tokens=max_tokens, strategy=strategy)

    def load(self, table: pa.Table, bad_rows: dict[int, tuple[str, str]] | None = None) -> ChunkInput:
        return load_rows(self.job, self.runner, table, bad_rows, self.budget.key, self.stop.check)

    def run(
        self,
        loaded: ChunkInput,
        name: str,
        probe: bool = False,
        log: Callable[[str], None] = lambda message: None,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> RowResults:
        """`loaded` through the model (run_rows), settling batching: auto on it first where `probe`."""
        ctx = ChunkContext(self.job, self.budget, self.stop, self.heap, log, probe)
        if on_batch:
            ctx.on_batch = on_batch
        done = run_rows(self.runner, loaded, ctx, name)
        self.budget = done.output.budget or self.budget  # the next rows are cut with what these ended with
        return done


def name_scores(table: pa.Table, runner: Runner) -> pa.Table:
    """The `scores` column with what each of its entries stands for in its field's metadata: {labels:
    JSON list}, read with pyarrow.parquet.read_schema(part).field("scores").metadata."""
    labels = runner.score_labels
    if labels is None or "scores" not in table.column_names:
        return table
    i = table.schema.get_field_index("scores")
    field = table.schema.field(i).with_metadata({SCORE_LABELS: json.dumps(labels, ensure_ascii=False)})
    return table.set_column(i, field, table.column(i))
