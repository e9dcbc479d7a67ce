"""One read of an output folder: its job record, its listing, the completion markers of its job and the
Parquet footers of the files batchinfer may have written, many small reads at once."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import pyarrow.parquet as pq
from pydantic import ValidationError

from ..errors import OutputError
from ..reasons import RETRYABLE
from ..storage import join
from .failures import damage
from .job_record import read_job
from .layout import BAD_RECORDS, MARKER, PART, SKIPPED, marker_order
from .records import ChunkRecord

READS_AT_ONCE = 16  # markers and part footers read at once when a run opens the folder


@dataclass
class Scan:
    job: dict | None  # None: the folder holds no batchinfer job
    listing: dict[str, int]  # every file: name -> size
    done: dict[str, ChunkRecord] = field(default_factory=dict)  # this job's finished passes, in marker order
    footers: dict[str, pq.FileMetaData | None] = field(default_factory=dict)
    damaged: dict[str, str] = field(default_factory=dict)  # this job's markers that hold what it never writes

    def refuse_damaged(self, path) -> None:
        """A marker of this job that is damaged: its chunk cannot count as done, nor run again beside it."""
        if not self.damaged:
            return
        (name, problem), more = next(iter(self.damaged.items())), len(self.damaged) - 1
        command = self.job.get("command") or "batchinfer run JOB.yaml"
        raise OutputError(
            f"damaged: {join(str(path), name)}: {problem}{f' (and {more} more damaged marker(s))' if more else ''}",
            f"rerun with --restart ({command} --restart) to start the job over, or move {name} out of the "
            "folder to run its chunk again",
        )

    def stray_markers(self) -> list[str]:
        """Completion markers that are damaged or not this job's: a run refuses the folder over them."""
        return [n for n in self.listing if (m := MARKER.fullmatch(n)) and m.group(1) not in self.done]

    def stray_parts(self) -> list[str]:
        """Part files that no completion marker of this job names (a chunk in flight when a run stopped, or a file
        put there): a Parquet reader of the folder reads their rows too; the next run removes this job's."""
        return [n for n in self.listing if (m := PART.fullmatch(n)) and m.group(1) not in self.done]


def scan(folder, path, footers: bool = True) -> Scan:
    """The folder as it stands; markers and footers only when it holds a job (a damaged job record raises).
    footers: read the footers too (what checks parts against markers, and ownership, need)."""
    job = read_job(folder, path)
    listing = folder.list()
    if job is None:
        return Scan(None, listing)
    done, damaged = read_markers(folder, job, listing)
    return Scan(job, listing, done, read_footers(folder, listing) if footers else {}, damaged)


def read_markers(folder, job: dict, listing: dict[str, int]) -> tuple[dict[str, ChunkRecord], dict[str, str]]:
    """This job's finished passes by name, in order (a retry after what it retries); and its markers that are
    damaged, by file name, with what is wrong in each."""
    done, damaged, latest = {}, {}, {}  # latest: each chunk's latest pass read so far
    names = sorted((n for n in listing if MARKER.fullmatch(n)), key=marker_order)
    for name, raw in read_each(folder.read, names).items():
        try:
            content = json.loads(raw or b"")
        except ValueError:
            continue  # not ours: reported as foreign
        if isinstance(content, dict) and content.get("job_id") == job["job_id"]:
            try:
                record = ChunkRecord.from_marker(content)
            except ValidationError as exc:
                damaged[name] = damage(exc)
                continue
            record = _carried_of_earlier_retry(record, latest.get(record.retry_of))
            if problem := _disagreement(MARKER.fullmatch(name).group(1), record):
                damaged[name] = problem
            else:
                done[record.chunk] = latest[record.base] = record
    return done, damaged


def _carried_of_earlier_retry(record: ChunkRecord, before: ChunkRecord | None) -> ChunkRecord:
    """A retry pass's marker as a batchinfer before `carried` wrote it: the error rows of the pass before it
    (`before`) that it kept without running them again (those not RETRYABLE) are in its `errors` and not in its
    `rows`. Read with `carried` filled in where those rows are exactly what its counts lack; else as it is."""
    if record.retry_of is None or record.carried is not None or before is None:
        return record
    kept = {reason: n for reason, n in before.errors.items() if reason not in RETRYABLE}
    carried = sum(kept.values())
    if carried and record.rows + carried == record.ok + sum(record.errors.values()):
        if all(record.errors.get(reason, 0) >= n for reason, n in kept.items()):
            return replace(record, carried=carried)
    return record


def _disagreement(chunk: str, record: ChunkRecord) -> str | None:
    """What a marker of this job holds that batchinfer never writes together: another chunk's record (a copy:
    its chunk would count twice, and the named one as done), or counts that do not add up (a retry pass's
    error rows kept without running them again are in its errors, not its rows)."""
    if record.chunk != chunk:
        return f"it holds the record of chunk {record.chunk}, not of {chunk} (its name): a copy, or edited"
    if record.rows + (record.carried or 0) != record.ok + sum(record.errors.values()):
        kept = f" and {record.carried:,} kept from the pass before" if record.carried else ""
        return (
            f"its counts do not add up: {record.rows:,} rows{kept}, but {record.ok:,} ok and "
            f"{sum(record.errors.values()):,} in error"
        )
    return None


def read_footers(folder, listing: dict[str, int]) -> dict[str, pq.FileMetaData | None]:
    """The footer of every Parquet file batchinfer may have written here (None: not Parquet, or not
    whole): the footer alone, not the file."""
    names = [n for n in listing if PART.fullmatch(n) or n in (SKIPPED, BAD_RECORDS)]
    return read_each(folder.parquet_metadata, names)


def read_each(read, names: list[str]) -> dict:
    """name -> read(name), in the order given, READS_AT_ONCE at a time: each one small request, so the
    markers and footers of thousands of chunks on an object store take seconds, not minutes."""
    with ThreadPoolExecutor(max_workers=READS_AT_ONCE, thread_name_prefix="batchinfer-read") as pool:
        return dict(zip(names, pool.map(read, names)))
