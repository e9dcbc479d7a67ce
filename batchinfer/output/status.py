"""An output folder read without changing it: what `status`, `validate`, `plan` and `export` say of it."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..batching.budget import ProbeChoice
from ..errors import OutputError
from ..job.plan import Chunk, cuts_of, describe_changes
from ..storage import open_folder, refuse_location
from .checkpoint import read_report
from .failures import display_path, reach_error
from .job_record import probe_choice
from .layout import DONE, JOB, LEGACY, REPORT, SKIPPED, SUCCESS
from .lock import live_holder
from .ownership import refuse_foreign, refuse_foreign_folder
from .parts import in_input_order, read_table
from .records import ChunkRecord, Committed, committed_parts
from .scan import Scan, read_footers, scan
from .verify import damaged, lost_chunks, unsealed

NEW_FOLDER = "a new folder"  # what describe_folder says of a folder that holds no job yet


class FolderStatus:
    """The job in a folder and its finished chunks, as they stand; reading only."""

    def __init__(self, path, folder, found: Scan):
        self.path, self.folder, self.found = path, folder, found

    @classmethod
    def read(cls, path: str | Path, options: dict | None = None) -> FolderStatus | None:
        """None when the folder holds no batchinfer job; a damaged job record or marker raises."""
        folder = open_folder(str(path), options)
        found = scan(folder, display_path(path), footers=False)
        found.refuse_damaged(display_path(path))
        return cls(display_path(path), folder, found) if found.job is not None else None

    @classmethod
    def of_run(cls, path: str | Path, options: dict | None = None) -> FolderStatus:
        """read(), refusing a path where there is no job: nothing there (a folder or bucket that does not
        exist), or something that is not a batchinfer run. A folder with neither a job record nor markers is
        not listed: `status /` walked the whole disk (and stopped at the first folder it could not read)."""
        shown, folder = display_path(path), open_folder(str(path), options)
        ours = folder.read(JOB) is not None or open_folder(f"{str(path).rstrip('/')}/{DONE}", options).exists()
        state = cls.read(path, options) if ours else None
        if state is not None:
            return state
        if not folder.exists():
            what = "bucket or prefix" if isinstance(shown, str) else "folder"
            raise OutputError(
                f"{shown} does not exist (no such {what})", "check the path or URL: give a job's output.path"
            )
        legacy = folder.read(LEGACY) is not None
        raise OutputError(
            f"{shown} holds no batchinfer run (no {JOB})"
            + (f"; its {LEGACY} was written by an earlier batchinfer, which this one cannot resume" if legacy else ""),
            "give the output.path of a job",
        )

    @property
    def job(self) -> dict:
        return self.found.job

    @property
    def done(self) -> dict[str, ChunkRecord]:
        return self.found.done

    @functools.cached_property
    def committed(self) -> dict[str, Committed]:
        """The part files the finished chunks committed (records.committed_parts)."""
        return committed_parts(self.done)

    @property
    def command(self) -> str:
        return self.job.get("command", "")

    @property
    def fingerprint(self) -> dict:
        return self.job.get("fingerprint", {})

    @property
    def tuning(self) -> ProbeChoice | None:
        return probe_choice(self.job)

    @property
    def extent(self) -> dict:
        """The job's totals: chunks and rows (job_chunks, job_rows and limit after a --limit run)."""
        return self.job.get("plan", {})

    def chunks_done(self, lost: dict[str, str]) -> tuple[list[ChunkRecord], int | None]:
        """What status, validate and plan count: the finished chunks whose parts are whole (each piece of a chunk
        an earlier --limit cut short counts; a retry pass is its chunk's), and the job's chunks as its last run
        planned them (the whole job's after a --limit run; None in a job record that holds no plan)."""
        finished = [r for name, r in self.done.items() if not r.retry_of and name not in lost]
        return finished, self.extent.get("job_chunks", self.extent.get("chunks"))

    def lost(self, digests: bool = True) -> dict[str, str]:
        """Finished chunks whose part files are not as committed (see lost_chunks); reads footers, and, with
        `digests`, every sealed part whole."""
        listing = self.found.listing  # the footers only where the read left them out
        footers = self.found.footers or read_footers(self.folder, listing)
        return lost_chunks(self.folder, self.done, listing, footers, self.job["job_id"], digests)

    def unsealed(self) -> int:
        """Committed parts whose markers hold no seal (written before parts were sealed): checked by footer alone."""
        return unsealed(self.done)

    def stray_markers(self) -> list[str]:
        return self.found.stray_markers()

    def stray_parts(self) -> list[str]:
        return self.found.stray_parts()

    def skipped_shards(self) -> list[str]:
        """The shards the last run left out (input.on_bad_shard: skip), as _report.json lists them."""
        table = read_table(self.folder, SKIPPED)
        return table.column("source").to_pylist() if table is not None else []

    def succeeded(self) -> bool:
        """Whether the folder has its _SUCCESS (every chunk done when the last run ended) and still a marker
        for each of the job's chunks: one removed since leaves the _SUCCESS over its part."""
        planned = self.extent.get("job_chunks", self.extent.get("chunks"))
        finished = sum(1 for r in self.done.values() if not r.retry_of)
        return self.folder.read(SUCCESS) is not None and (planned is None or finished >= planned)

    def report(self) -> dict | None:
        return read_report(self.folder)

    def report_damaged(self) -> bool:
        """A _report.json that is not JSON: batchinfer cannot tell it is its own, so a run refuses it."""
        raw = self.folder.read(REPORT)
        if raw is None:
            return False
        try:
            json.loads(raw)
        except ValueError:
            return True
        return False

    def holder(self) -> dict | None:
        """The live run holding the folder, if any."""
        return live_holder(self.folder)

    def updated(self) -> float:
        """When the job last changed: its job record, or its latest commit."""
        return max([self.folder.mtime(JOB) or 0.0] + [r.finished or 0.0 for r in self.done.values()])

    def parts(self, errors: bool = False) -> list[str]:
        """Names of the result (or error) part files the finished chunks committed, in input order: never a
        file that only sits at a part's name (see lost() for whether each is there and whole)."""
        return in_input_order(self.committed, errors)

    def read_part(self, name: str) -> tuple[pa.Table | None, str | None]:
        """A committed part's rows, and what is wrong with its bytes (they are not those its chunk sealed, or
        gone) if anything: the check of lost(), made on the very bytes read."""
        raw = self.folder.read(name)
        digest = hashlib.sha256(raw).hexdigest() if raw is not None else None
        problem = damaged(name, self.committed[name].seal, digest)
        return (None, problem) if problem else (pq.read_table(pa.BufferReader(raw)), None)


def describe_folder(
    path: str | Path, options: dict | None, fingerprint: dict, plan: Callable[[dict[str, set[int]]], list[Chunk]]
) -> tuple[str, FolderStatus | None, list[Chunk]]:
    """What a run of the job with `fingerprint` would find in the folder, without changing anything; raises
    the errors a run would raise (foreign files, a damaged job record). Also the folder's status when it holds
    this very job (None for a new folder or another job), read in the same pass, and the job's chunks as that
    run plans them: `plan` given where the folder's finished pieces cut them (job.plan.cuts_of), so that a chunk
    an earlier --limit cut short is planned in its pieces. The chunks done are counted as status counts them."""
    shown = display_path(path)
    refuse_location(str(shown), ())
    folder = open_folder(str(path), options)
    try:
        refuse_foreign_folder(folder, shown)
        found = scan(folder, shown)
    except OSError as exc:
        raise reach_error(shown, exc, "read output folder") from exc
    if not found.job:
        return NEW_FOLDER, None, plan({})
    refuse_foreign(folder, shown, found)
    found.refuse_damaged(shown)
    changed = describe_changes(found.job["fingerprint"], fingerprint)
    changed.pop("limit", None)
    lost = lost_chunks(folder, found.done, found.listing, found.footers, found.job["job_id"])
    status = FolderStatus(shown, folder, found)
    finished, total = status.chunks_done(lost)
    if changed and found.done:
        other = (
            f"holds {len(finished)} finished chunk(s) of a different job ({'; '.join(changed.values())}): the run "
            "will refuse; write to a new folder with --output NEW_FOLDER, or delete them with --restart"
        )
        return other, None, plan({})
    chunks = plan(cuts_of({name: r.rows for name, r in found.done.items() if not r.retry_of}))
    state = None if changed else status
    # the recorded total is this job's only where it is this job (a changed one with nothing done is taken over)
    count = f"{len(finished)}/{total if total is not None and not changed else len(chunks)} chunks done"
    if {c.name for c in chunks} <= {r.chunk for r in finished}:  # every chunk the run plans: nothing to run
        limit = fingerprint.get("limit")
        if limit is None or status.succeeded():
            return f"holds this job, complete: {count}; a run has nothing left to do", state, chunks
        return f"holds this job: {count}; a run with --limit {limit:,} has nothing left to do", state, chunks
    again = f"; {len(lost)} finished chunk(s) lost a part file and run again" if lost else ""
    return f"holds this job: {count}; the run resumes{again}", state, chunks
