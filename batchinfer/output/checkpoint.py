"""The checkpoint: an output folder held by one run. Opening it takes the lock and reads the folder once
(refusing what is not the job's); `start` settles which job it holds, checks every marker against the
part files it committed and clears leftovers; `commit` then marks chunks done, one by one, and `finish`
writes the format's files, the report and _SUCCESS."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from ..batching.budget import ProbeChoice
from ..errors import OtherJobError, OutputError, ResumeError
from ..job.plan import cuts_of, describe_changes
from ..reasons import Reason
from ..storage import open_folder, refuse_location
from .failures import display_path, reach_error, writing
from .formats import DESCRIBING, DeclaredFiles
from .job_record import create_job, probe_choice, save_job, without_limit
from .layout import (
    BAD_RECORDS,
    ERROR_SCHEMA,
    ERRORS,
    JOB,
    LOCK,
    MARKER,
    PART,
    REPORT,
    SKIPPED,
    SUCCESS,
    dumps,
    error_part_name,
    marker_name,
    part_name,
    tmp_prefix,
)
from .lock import FolderLock
from .ownership import refuse_foreign, refuse_foreign_folder
from .parts import PartWriter, read_table
from .records import ChunkRecord, committed_parts, current_errors
from .scan import Scan, scan
from .verify import lost_chunks


class Checkpoint:
    def __init__(
        self, path: str | Path, compression: str = "zstd", options: dict | None = None, started: float | None = None
    ):
        self.path = display_path(path)
        self.folder = open_folder(str(path), options)
        self.compression = None if compression == "none" else compression
        self.lock = FolderLock(self.folder, self.path, started)
        self.job: dict = {}
        self.done: dict[str, ChunkRecord] = {}  # finished passes by name, in marker order; changed only here
        self.notes: list[str] = []  # what start() found and mended, for the run's log
        self.described = True  # the files describing the folder's rows (formats.DESCRIBING) hold them all
        self._found: Scan | None = None

    @classmethod
    def open(
        cls,
        path: str | Path,
        compression: str = "zstd",
        options: dict | None = None,
        inputs: tuple[str, ...] = (),
        started: float | None = None,
    ) -> Checkpoint:
        """Lock the folder and read it, refusing it if it holds anything that is not batchinfer's job.
        `inputs`: the job's input files, which the folder must not hold; `started`: when the run began
        (time.time(), by default now), which `status` measures the run's rate from."""
        checkpoint = cls(path, compression, options, started)
        refuse_location(str(checkpoint.path), inputs)
        if "://" not in str(path) and Path(path).is_symlink() and not Path(path).exists():  # mkdir: "File exists"
            raise OutputError(
                f"output.path {checkpoint.path} is a link to {os.readlink(path)}, which does not exist",
                "create the folder the link points to, or give another output.path",
            )
        try:
            refuse_foreign_folder(checkpoint.folder, checkpoint.path)
            checkpoint.folder.make()
        except OSError as exc:
            raise reach_error(checkpoint.path, exc, "create output folder") from exc
        checkpoint.lock.acquire()
        try:
            checkpoint._found = scan(checkpoint.folder, checkpoint.path)
            refuse_foreign(checkpoint.folder, checkpoint.path, checkpoint._found)
        except BaseException:
            checkpoint.close()
            raise
        return checkpoint

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def job_id(self) -> str:
        return self.job["job_id"]

    def _put(self, name: str, data: bytes) -> None:
        """`name` written whole, through a temporary file that names this job (layout.tmp_prefix)."""
        writing(self.path, lambda: self.folder.write(name, data, tmp=tmp_prefix(self.job_id)))

    @property
    def command(self) -> str:
        return self.job.get("command", "")

    @property
    def tuning(self) -> ProbeChoice | None:
        """What a batching probe chose for this folder's job, if one ran."""
        return probe_choice(self.job)

    def cuts(self) -> dict[str, set[int]]:
        """Where this folder's finished chunks and pieces begin and end inside their chunks (job.plan.cuts_of), so
        that the plan keeps a chunk an earlier --limit cut short in its pieces. Asked before start()."""
        return cuts_of({name: r.rows for name, r in self._found.done.items() if not r.retry_of})

    @property
    def holds_a_job(self) -> bool:
        """The folder holds a job already (asked before start())."""
        return self._found.job is not None

    def covering_limit(self, limit: int | None) -> int | None:
        """--limit never narrows what this folder's job already covers: a folder that holds the first 1,000
        rows (or all of them) stays so after `--limit 10`, which then has nothing left to do. A job that
        committed nothing covers nothing. Asked before start(), of the folder as open() read it."""
        found = self._found
        held = found.job["fingerprint"].get("limit", 0) if found.job and found.done else 0
        if limit is None or held is None:
            return None
        return max(limit, held)

    def start(
        self,
        fingerprint: dict,
        restart: bool,
        command: str = "",
        may_change: frozenset = frozenset(),
        files: tuple[str, ...] = (),
        extent: dict | None = None,
        planned: dict[str, int] | None = None,
    ) -> None:
        """Settle the job this folder holds: a new one (an empty folder, or --restart), or the one it holds
        if its fingerprint matches; then mend what the last run left (lost parts, leftovers).

        Keys in `may_change` may differ from the recorded job (--retry-errors after raising max_length);
        the new values are recorded for the runs that follow. `files`: other names this job writes here;
        `extent`: totals (chunks, rows) that `batchinfer status` shows; `planned`: this run's chunks and
        their rows: a finished chunk an earlier --limit cut short runs again in full."""
        found, self._found = self._found, None
        if not restart:
            found.refuse_damaged(self.path)
        if restart and found.job:
            _clear(self.folder, found.listing)
        if restart or not found.job:
            fields = {"fingerprint": fingerprint, "command": command, "files": list(files), "plan": extent or {}}
            self.job = create_job(self.folder, self.path, fields)
            return
        self._take_up(found, fingerprint, command, may_change, files, extent or {})
        lost = lost_chunks(self.folder, self.done, found.listing, found.footers, self.job_id)
        for chunk, problem in lost.items():
            self.notes.append(f"{problem}: chunk {chunk} runs again")
        self.forget(list(lost))  # every file at their part names is this job's (checked at open: ownership.py)
        _remove_leftovers(self.folder, found.listing, self.done)
        planned = planned or {}
        self.forget([n for n, r in self.done.items() if not r.retry_of and n in planned and r.rows < planned[n]])

    def _take_up(
        self, found: Scan, fingerprint: dict, command: str, may_change: frozenset, files: tuple[str, ...], extent: dict
    ) -> None:
        """Hold the job the folder holds, if `fingerprint` may continue it (else refuse), recording what
        changed and the files it declares now."""
        job, done = found.job, found.done
        self.job, self.done = job, dict(done)
        changed = describe_changes(job["fingerprint"], fingerprint)
        # --retry-errors with changed settings: only the error rows may run with them, so every chunk has run first
        retrying = bool(done) and bool(set(changed) - {"limit"}) and set(changed) <= may_change
        finished = sum(1 for record in done.values() if not record.retry_of)
        if retrying and finished < extent.get("chunks", 0):
            settings = "; ".join(v for k, v in changed.items() if k != "limit")
            raise ResumeError(
                f"{self.path}: --retry-errors would run the {extent['chunks'] - finished:,} chunk(s) of this job not "
                f"run yet with changed settings ({settings}), beside the {finished:,} run with the old ones",
                f"finish the job with its own settings first ({without_limit(job.get('command') or 'its command')}), "
                "then retry its errors with the new ones",
            )
        if changed and (not done or set(changed) <= may_change):
            # Nothing done yet (a run that failed before its first chunk), or only what --retry-errors may
            # change: no result of the old settings can mix with the new ones.
            fresh = {"fingerprint": fingerprint, "plan": extent, "command": command or self.command}
            self._save({**job, **fresh, **({} if done else {"tuning": None})})
        elif changed:
            changed.pop("limit", None)  # any limit may continue a job; only the other changes refuse it
            raise OtherJobError(
                f"{self.path} holds results of a different job ({'; '.join(changed.values())})",
                # the folder's results are another job's: keeping them comes first, deleting them second
                ", which keeps them; or, to delete them and run this job here, --restart",
            )
        if set(files) - set(self.job.get("files", [])):  # declared before it is ever written
            self._save({**self.job, "files": sorted(set(self.job.get("files", [])) | set(files))})

    # --- during the run ----------------------------------------------------------------------------------------

    def writer(self) -> PartWriter:
        """What a chunk task needs to write its part files here; picklable, holds no lock."""
        return PartWriter(self.folder, self.compression, self.job_id)

    def write_skipped_shards(self, skipped: list[tuple[str, str]]) -> None:
        """The shards left out (input.on_bad_shard: skip; their rows were never read), one error row each,
        written once per run. Each item: (source, message)."""
        self.folder.delete(BAD_RECORDS)  # bad CSV records now travel with their chunks
        if not skipped:
            self.folder.delete(SKIPPED)
            return
        names, messages = zip(*skipped)
        rows = {
            "id": pa.nulls(len(names), pa.string()),
            "source": list(names),
            "row": pa.nulls(len(names), pa.int64()),
            "reason": [Reason.BAD_SHARD] * len(names),
            "message": list(messages),
        }
        self.writer().write_table(SKIPPED, pa.table(rows, schema=ERROR_SCHEMA))

    def error_files(self) -> Iterator[tuple[str, pa.Table]]:
        """Each chunk with error rows, and the rows of its current error file (its latest pass's)."""
        for chunk, latest in current_errors(self.done).items():
            errors = read_table(self.folder, error_part_name(latest))
            if errors is not None:
                yield chunk, errors

    def commit(self, record: ChunkRecord, tuning: ProbeChoice | None = None) -> None:
        """Record a probe's choice, then the chunk's marker: the chunk is done once this returns. After a
        retry pass, the error file it replaced goes (after the marker: a crash between the two is mended
        on the next open)."""
        self.lock.check()
        if tuning:
            self._save({**self.job, "tuning": tuning.record()})
        replaced = current_errors(self.done).get(record.retry_of) if record.retry_of else None
        if self.described:
            self._undescribe()
        record = record.committed(round(time.time(), 3), round(self.lock.started, 3))
        self._put(marker_name(record.chunk), dumps(record.marker(self.job_id)))
        self.done[record.chunk] = record
        if replaced:
            self.folder.delete(error_part_name(replaced))

    def forget(self, chunks: list[str]) -> None:
        """Un-commit chunks (a chunk cut short by --limit, before it runs in full): each marker first,
        then the part files, so a crash on the way leaves the chunk to run again."""
        for chunk in chunks:
            passes = [chunk] + [name for name, r in self.done.items() if r.retry_of == chunk]
            for name in passes:
                self.folder.delete(marker_name(name))
                self.done.pop(name, None)
            for name in passes:
                self.folder.delete(part_name(name))
                self.folder.delete(error_part_name(name))

    def _undescribe(self) -> None:
        """Before this run's first chunk is done: the files an earlier run wrote of the folder's rows as they
        were (a --limit trial's _results.jsonl, a format since changed) go, since they no longer hold every row;
        finish writes the job's format's again once the job is complete. Only names this job's record declared,
        which batchinfer writes, and no other."""
        listing = self.folder.list()
        for name in sorted(set(DESCRIBING) & set(self.job.get("files", ()))):
            if name in listing:
                self.folder.delete(name)
        self.described = False

    # --- the end -----------------------------------------------------------------------------------------------

    def finish(self, report: dict, output_format, final: bool, idle: bool) -> dict:
        """Write what the run ends with and return the report: a complete job gets the format's files, and,
        when `final` (no --limit), _SUCCESS. A committed part deleted while the job ran keeps the job
        incomplete (_SUCCESS is never written over missing rows) and raises once the report is written.
        idle: this run had nothing to do (see _write_report)."""
        listing = self.folder.list()  # one listing: cheap at the end of every run
        missing = [name for name in committed_parts(self.done) if name not in listing]
        report["complete"] = report["complete"] and not missing
        if report["complete"]:
            # each part's commit time: a rerun that writes the files again writes the same `created`
            committed = {part_name(name): record.finished for name, record in self.done.items()}
            report.update(output_format.finish(DeclaredFiles(self.folder, self.path, self.job, committed)))
        self._write_report(report, success=report["complete"] and final, idle=idle)
        if missing:
            raise OutputError(
                f"{', '.join(missing[:3])}{' and more' if len(missing) > 3 else ''} of finished chunks vanished "
                f"from {self.path} while the job ran",
                "rerun the same command: batchinfer runs those chunks again",
            )
        return report

    def _write_report(self, report: dict, success: bool, idle: bool) -> None:
        """idle: this run had nothing to do, so the report keeps the figures (`run`, `device`) of the last
        run that did the work, with totals brought up to date."""
        old = read_report(self.folder) if idle else None
        if old and isinstance(old.get("run"), dict):
            report = {**report, "run": old["run"], "device": old.get("device", report["device"])}
        self._put(REPORT, dumps({"job_id": self.job_id, **report}, indent=2))
        if success:
            self._put(SUCCESS, dumps({"job_id": self.job_id}))

    def close(self) -> None:
        """Let go of the folder (the lock), whatever happened."""
        self.lock.release()

    def _save(self, job: dict) -> None:
        self.job = save_job(self.folder, self.path, job)


def _clear(folder, listing: dict[str, int]) -> None:
    """--restart: remove this job's files. Markers go first and the job record last, so a crash on the
    way leaves a folder that still holds one consistent job."""
    for name in sorted(listing, key=lambda n: (not MARKER.fullmatch(n), n == JOB, n)):
        if name != LOCK:
            folder.delete(name)
    for inner in folder.folders():
        folder.remove_folder(inner)


def _remove_leftovers(folder, listing: dict[str, int], done: dict[str, ChunkRecord]) -> None:
    """Delete temporary files, parts of chunks that have no marker, and error files a retry replaced."""
    current = set(current_errors(done).values())
    for name in listing:
        part = PART.fullmatch(name)
        stale_part = part and (part.group(1) not in done or (name.startswith(ERRORS) and part.group(1) not in current))
        if stale_part or name.rsplit("/", 1)[-1].startswith(".tmp-") or name == SUCCESS:
            folder.delete(name)


def read_report(folder) -> dict | None:
    try:
        report = json.loads(folder.read(REPORT) or b"null")
    except ValueError:
        return None
    return report if isinstance(report, dict) else None
