"""A finished chunk's record as its completion marker holds it, and what a chunk task hands the driver.

Only the record is persisted: the batching a worker ended with, a probe's choice and the notes for the
run's log travel beside it (ChunkResult) and never reach a marker."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from ..control import Batching
from .layout import error_part_name, part_name

_OMITTED_WHEN_EMPTY = (
    "retry_of",
    "generated_tokens",
    "first_token_seconds",
    "max_tokens_lowered",
    "finished",
    "prefix",
    "engine",
)


@dataclass(frozen=True)
class ChunkRecord:
    """One pass over a chunk (or a retry pass over its error rows): what it counted and how long it took."""

    chunk: str  # its name: SSSSS-CCCCC, or SSSSS-CCCCC-rN for the Nth retry pass
    rows: int  # rows it covered
    ok: int  # rows in its part file
    errors: dict[str, int]  # rows in its error file, by reason
    retry_of: str | None = None  # a retry pass: the chunk whose error rows it ran again
    truncated: int = 0
    # label scoring: the tokens the model computed for its rows, a shared prefix's once-computed ones not counted;
    # generate: every prompt token (those the engine read from its cache are in `prefix`)
    tokens: int = 0
    padded_tokens: int = 0
    model_seconds: float = 0.0
    generated_tokens: int | None = None  # generate
    first_token_seconds: float | None = None  # generate: the median over the chunk's rows
    seconds: float = 0.0
    worker: str = "local"
    max_tokens_lowered: list[str] = field(default_factory=list)  # out-of-memory notes of this pass
    # a prompt prefix that the pass's rows share, computed once (label scoring) or read from the engine's cache
    # (generate): {tokens: its length (generate: the most one row read), rows: those that reused it,
    # saved_tokens: the prompt tokens not computed again for them, prompt_tokens: the prompt tokens its rows had
    # in full, the saved ones included}
    prefix: dict[str, int] | None = None
    finished: float | None = None  # when it was committed (time.time())
    # generate: the engine that ran it {name, precision, notes, precision_check} (runners/engine.py: described)
    engine: dict | None = None

    @property
    def base(self) -> str:
        """The chunk this pass belongs to."""
        return self.retry_of or self.chunk

    def marker(self, job_id: str) -> dict:
        """The marker's content: the job's id, then every field that holds something."""
        kept = {k: v for k, v in asdict(self).items() if not (k in _OMITTED_WHEN_EMPTY and v in (None, []))}
        return {"job_id": job_id, **kept}

    @classmethod
    def from_marker(cls, content: dict) -> ChunkRecord | None:
        """A marker's record; None when it lacks what every record holds (damaged). Keys it does not know
        are dropped: markers written before ChunkRecord also carried the worker's batching (`budget`)."""
        known = {f.name for f in fields(cls)}
        try:
            record = cls(**{k: v for k, v in content.items() if k in known})
        except TypeError:
            return None
        counts = (record.rows, record.ok, *record.errors.values()) if isinstance(record.errors, dict) else ("",)
        if record.prefix is not None:
            counts += tuple(record.prefix.values()) if isinstance(record.prefix, dict) else ("",)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
            return None  # well-formed JSON with the wrong types: as damaged as a marker cut short
        if record.prefix is not None and "prompt_tokens" not in record.prefix:
            # written by label scoring before prompt_tokens: its `tokens` are those computed, the prefix not in them
            full = record.tokens + record.prefix.get("saved_tokens", 0)
            record = replace(record, prefix={**record.prefix, "prompt_tokens": full})
        return record

    def committed(self, when: float) -> ChunkRecord:
        return replace(self, finished=when)


@dataclass
class ChunkResult:
    """What a chunk task hands the driver: the record to commit and, never persisted, the batching the
    worker ended the chunk with, what a probe chose on it and notes for the run's log."""

    record: ChunkRecord
    budget: Batching  # the worker's after this chunk
    tuning: dict | None = None
    notes: list[str] = field(default_factory=list)


def current_errors(done: dict[str, ChunkRecord]) -> dict[str, str]:
    """For each chunk, the name of the pass whose error file is current: the chunk's, or its latest retry."""
    current = {}
    for name, record in done.items():  # marker order: a retry comes after what it retries
        current[record.retry_of or name] = name
    return current


def committed_parts(done: dict[str, ChunkRecord]) -> dict[str, tuple[str, int | None]]:
    """The part files the finished chunks committed: name -> (chunk, rows). Each pass with results has its
    part; the latest pass of a chunk with error rows has its error file (rows not checked: batchinfer 0.2
    kept bad CSV records apart)."""
    current = set(current_errors(done).values())
    parts = {}
    for name, record in done.items():
        if record.ok:
            parts[part_name(name)] = (record.base, record.ok)
        if name in current and sum(record.errors.values()):
            parts[error_part_name(name)] = (record.base, None)
    return parts
