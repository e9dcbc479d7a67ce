"""A finished chunk's record as its completion marker holds it, and what a chunk task hands the driver.

Only the record is persisted: the batching a worker ended with, a probe's choice and the notes for the
run's log travel beside it (ChunkResult) and never reach a marker."""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, NamedTuple

from pydantic import Field, StrictFloat, StrictInt, StrictStr, TypeAdapter

from ..batching.budget import Batching, ProbeChoice
from .layout import error_part_name, part_name

_OMITTED_WHEN_EMPTY = (
    "retry_of",
    "carried",
    "generated_tokens",
    "first_token_seconds",
    "max_tokens_lowered",
    "finished",
    "run_started",
    "prefix",
    "engine",
    "files",
)


# A marker's fields as read back (ChunkRecord.from_marker): of the type batchinfer writes, counts never negative.
Tally = Annotated[StrictInt, Field(ge=0)]
Seconds = Annotated[StrictFloat, Field(ge=0)]


@dataclass(frozen=True)
class Seal:
    """A part file as its pass wrote it: what a later read compares it with (size first, then the digest)."""

    size: Tally  # bytes
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]  # of the file's bytes


@dataclass(frozen=True)
class ChunkRecord:
    """One pass over a chunk (or a retry pass over its error rows): what it counted and how long it took."""

    chunk: StrictStr  # its name: SSSSS-CCCCC, or SSSSS-CCCCC-rN for the Nth retry pass
    rows: Tally  # rows it covered
    ok: Tally  # rows in its part file
    errors: dict[StrictStr, Tally]  # rows in its error file, by reason
    retry_of: StrictStr | None = None  # a retry pass: the chunk whose error rows it ran again
    # a retry pass: the error rows it kept in its error file without running them (their reason lies in the
    # input, not RETRYABLE): in `errors`, not in `rows`. None: none, or a marker of a batchinfer that did not
    # count them (scan.py: _carried_of_earlier_retry)
    carried: Tally | None = None
    truncated: Tally = 0
    # label scoring: the tokens the model computed for its rows, a shared prefix's once-computed ones not counted;
    # generate: every prompt token (those the engine read from its cache are in `prefix`)
    tokens: Tally = 0
    padded_tokens: Tally = 0
    model_seconds: Seconds = 0.0
    generated_tokens: Tally | None = None  # generate
    first_token_seconds: Seconds | None = None  # generate: the median over the chunk's rows
    seconds: Seconds = 0.0
    worker: StrictStr = "local"
    max_tokens_lowered: list[StrictStr] = field(default_factory=list)  # out-of-memory notes of this pass
    # a prompt prefix that the pass's rows share, computed once (label scoring) or read from the engine's cache
    # (generate): {tokens: its length (generate: the most one row read), rows: those that reused it,
    # saved_tokens: the prompt tokens not computed again for them, prompt_tokens: the prompt tokens its rows had
    # in full, the saved ones included}
    prefix: dict[StrictStr, Tally] | None = None
    finished: Seconds | None = None  # when it was committed (time.time())
    # when the run that committed it started (time.time()): a job's seconds are its runs', each from its start
    # to its last commit, whatever stopped it
    run_started: Seconds | None = None
    # generate: the engine that ran it {name, precision, notes, precision_check} (runners/engine.py: described)
    engine: dict | None = None
    # the part files it wrote (its result part, its error file), each sealed; None: a marker written before
    # parts were sealed, whose parts are checked by their footers alone
    files: dict[StrictStr, Seal] | None = None

    @property
    def base(self) -> str:
        """The chunk this pass belongs to."""
        return self.retry_of or self.chunk

    def marker(self, job_id: str) -> dict:
        """The marker's content: the job's id, then every field that holds something."""
        kept = {k: v for k, v in asdict(self).items() if not (k in _OMITTED_WHEN_EMPTY and v in (None, []))}
        return {"job_id": job_id, **kept}

    @classmethod
    def from_marker(cls, content: dict) -> ChunkRecord:
        """A marker's record, every field of the type batchinfer writes (pydantic's ValidationError if not: the
        marker is damaged). Keys it does not know are dropped: markers written before ChunkRecord also carried
        the worker's batching (`budget`)."""
        record = _marker_reader().validate_python(content)
        if record.prefix is not None and "prompt_tokens" not in record.prefix:
            # written by label scoring before prompt_tokens: its `tokens` are those computed, the prefix not in them
            full = record.tokens + record.prefix.get("saved_tokens", 0)
            record = replace(record, prefix={**record.prefix, "prompt_tokens": full})
        return record

    def committed(self, when: float, run_started: float | None) -> ChunkRecord:
        return replace(self, finished=when, run_started=run_started)


@functools.cache
def _marker_reader() -> TypeAdapter:
    return TypeAdapter(ChunkRecord)


@dataclass
class ChunkResult:
    """What a chunk task hands the driver: the record to commit and, never persisted, the batching the
    worker ended the chunk with, what a probe chose on it and notes for the run's log."""

    record: ChunkRecord
    budget: Batching  # the worker's after this chunk
    tuning: ProbeChoice | None = None
    notes: list[str] = field(default_factory=list)


def current_errors(done: dict[str, ChunkRecord]) -> dict[str, str]:
    """For each chunk, the name of the pass whose error file is current: the chunk's, or its latest retry."""
    current = {}
    for name, record in done.items():  # marker order: a retry comes after what it retries
        current[record.retry_of or name] = name
    return current


def error_counts(done: dict[str, ChunkRecord]) -> Counter:
    """The rows in the folder's current error files, by reason."""
    counts: Counter = Counter()
    for name in current_errors(done).values():
        counts.update(done[name].errors)
    return counts


class Committed(NamedTuple):
    """A part file that a finished pass committed, and what it must hold."""

    chunk: str  # the chunk it belongs to
    written_by: str  # the pass that wrote it, which its footer names
    rows: int | None  # None: an error file (rows not checked: batchinfer 0.2 kept bad CSV records apart)
    seal: Seal | None  # None: committed by a batchinfer that sealed no part


def committed_parts(done: dict[str, ChunkRecord]) -> dict[str, Committed]:
    """The part files the finished chunks committed, by name. Each pass with results has its part; the latest
    pass of a chunk with error rows has its error file."""
    current = set(current_errors(done).values())
    parts = {}
    for name, record in done.items():
        seals = record.files or {}
        if record.ok:
            part = part_name(name)
            parts[part] = Committed(record.base, name, record.ok, seals.get(part))
        if name in current and sum(record.errors.values()):
            part = error_part_name(name)
            parts[part] = Committed(record.base, name, None, seals.get(part))
    return parts
