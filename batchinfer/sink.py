"""The output folder: part files, completion markers, the job file, the lock and the report.

    part-SSSSS-CCCCC.parquet          results of chunk C of shard S (lexical order = input order)
    _errors/part-SSSSS-CCCCC.parquet  rows that could not run, each with a reason
    _errors/skipped-shards.parquet    shards left out (input.on_bad_shard: skip)
    _done/SSSSS-CCCCC.json            completion marker: the chunk's record
    _batchinfer.json                  the job: its id, fingerprint and the batching a probe chose
    _lock                             the run holding the folder
    _report.json, _SUCCESS            totals of the last run; _SUCCESS once every chunk is done

Commit protocol: a chunk is done when its marker exists. Its part files are written whole under their
final names first (a temporary file, fsync, rename), then the marker. After a crash, a part without a
marker is a leftover of the chunk in flight and is removed when the next run opens the folder; nothing
is ever appended, so there is no torn line to mend. Every open checks each marker against the part files
it committed (present, this job's id in the footer, its rows): a chunk whose part went missing runs again,
and _SUCCESS is written only over every committed part.

Ownership: every file carries the job's id (in the Parquet footer, in the JSON, or in a temporary
file's name), so batchinfer deletes or overwrites only what it can prove it wrote. A folder holding
anything else is refused before any change, and so are /, the home folder and the input itself.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import OutputError, ResumeError
from .plan import describe_changes
from .reasons import Reason
from .storage import JOB_FILE, is_disk_full, is_uri, join, open_folder, reach_problem, refuse_location

JOB = JOB_FILE
DONE = "_done"
ERRORS = "_errors"
REPORT = "_report.json"
SUCCESS = "_SUCCESS"
LOCK = "_lock"
SKIPPED = f"{ERRORS}/skipped-shards.parquet"
BAD_RECORDS = f"{ERRORS}/bad-records.parquet"  # batchinfer 0.2's bad CSV records: still ours, removed on sight
LEGACY = "_manifest.jsonl"  # batchinfer 0.1's appended manifest
FORMAT = 2
HEARTBEAT = 15.0  # seconds between rewrites of the lock while a run holds it
LOCK_STALE = 120.0  # a lock from another host not rewritten for this long belongs to a dead run
TAKEOVER_SETTLE = 1.0  # seconds between taking over a dead run's lock and reading it back
READS_AT_ONCE = 16  # markers and part footers read at once when a run opens the folder
ID_KEY = b"batchinfer.job_id"
ERROR_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("row", pa.int64()),
        ("reason", pa.string()),
        ("message", pa.string()),
    ]
)
_PART = re.compile(rf"(?:{ERRORS}/)?part-(\d{{5}}-\d{{5}}(?:-r\d+)?)\.parquet")
_MARKER = re.compile(rf"{DONE}/(\d{{5}}-\d{{5}}(?:-r\d+)?)\.json")
_CREATING = re.compile(r"\.tmp-(?:[0-9a-f]{12}-[0-9a-f]{8}-_batchinfer\.json|lock-[0-9a-f]{32}-[0-9a-f]{8}-_lock)")


class OutputDir:
    def __init__(self, path: str | Path, compression: str = "zstd", options: dict | None = None):
        self.path = str(path).rstrip("/") if is_uri(str(path)) else Path(path)  # shown in messages
        self.folder = open_folder(str(path), options)
        self.compression = None if compression == "none" else compression
        self.run_id = uuid.uuid4().hex
        self.started = time.time()
        self.job: dict = {}
        self.notes: list[str] = []  # what open() found and mended, for the run's log
        self._locked = False

    @property
    def job_id(self) -> str:
        return self.job["job_id"]

    @property
    def command(self) -> str:
        return self.job.get("command", "")

    def fingerprint(self) -> dict:
        return self.job.get("fingerprint", {})

    def tuning(self) -> dict | None:
        """What a batching probe chose for this folder's job, if one ran."""
        return self.job.get("tuning")

    def covering_limit(self, limit: int | None) -> int | None:
        """--limit never narrows what this folder's job already covers: a folder that holds the first 1,000
        rows (or all of them) stays so after `--limit 10`, which then has nothing left to do. A job that
        committed nothing covers nothing; a folder that cannot be read is reported by open()."""
        try:
            job = self._read_job()
            covered = job is not None and bool(self._read_markers(job, self.folder.list()))
        except OSError:
            return limit
        held = job["fingerprint"].get("limit", 0) if covered else 0
        if limit is None or held is None:
            return None
        return max(limit, held)

    # --- opening ---------------------------------------------------------------------------------------------

    def open(
        self,
        fingerprint: dict,
        restart: bool,
        command: str = "",
        may_change: frozenset = frozenset(),
        inputs: tuple[str, ...] = (),
        files: tuple[str, ...] = (),
        plan: dict | None = None,
    ) -> dict[str, dict]:
        """Lock the folder, check it holds this job (or nothing), clear leftovers; return finished chunks.

        Keys in `may_change` may differ from the recorded job (--retry-errors after raising max_length);
        the new values are recorded for the runs that follow. `files`: other names this job writes here;
        `plan`: totals (chunks, rows) that `batchinfer status` shows."""
        refuse_location(str(self.path), inputs)
        try:
            self._refuse_foreign_folder()
            self.folder.make()
        except OSError as exc:
            raise reach_error(self.path, exc, "create output folder") from exc
        self._lock()
        try:
            return self._open(fingerprint, restart, command, may_change, files, plan or {})
        except BaseException:
            self.unlock()
            raise

    def describe(self, fingerprint: dict, chunks_total: int) -> str:
        """What a run of the job with `fingerprint` would find here, without changing anything; raises the
        errors a run would raise (foreign files, a damaged job file)."""
        refuse_location(str(self.path), ())
        try:
            self._refuse_foreign_folder()
            job = self._read_job()
            listing = self.folder.list() if job else {}
        except OSError as exc:
            raise reach_error(self.path, exc, "read output folder") from exc
        if not job:
            return "a new folder" if not listing else "an empty folder"
        done = self._read_markers(job, listing)
        footers = self._footers(listing)
        self._refuse_foreign(job, listing, done, footers)
        changed = describe_changes(job["fingerprint"], fingerprint)
        changed.pop("limit", None)
        lost = lost_chunks(done, listing, footers, job["job_id"])
        chunks = sum(1 for name, r in done.items() if "retry_of" not in r and name not in lost)
        again = f"; {len(lost)} finished chunk(s) lost a part file and run again" if lost else ""
        if changed and done:
            return (
                f"holds {chunks} finished chunk(s) of a different job ({'; '.join(changed.values())}): the run "
                "will refuse; add --restart to discard them, or --output NEW_FOLDER"
            )
        if chunks >= chunks_total:
            return f"holds this job, complete: {chunks}/{chunks_total} chunks done; a run has nothing left to do"
        return f"holds this job: {chunks}/{chunks_total} chunks done; the run resumes{again}"

    def _open(
        self, fingerprint: dict, restart: bool, command: str, may_change: frozenset, files: tuple[str, ...], plan: dict
    ) -> dict[str, dict]:
        job = self._read_job()
        listing = self.folder.list()
        done = self._read_markers(job, listing) if job else {}
        footers = self._footers(listing) if job else {}
        self._refuse_foreign(job, listing, done, footers)
        if restart and job:
            self._clear(listing, done)
            job, done, listing = None, {}, {}
        if not job:
            self._create_job({"fingerprint": fingerprint, "command": command, "files": list(files), "plan": plan})
            return {}
        self.job = job
        self.folder.tmp_prefix = f".tmp-{self.job_id[:12]}-"
        changed = describe_changes(self.fingerprint(), fingerprint)
        if changed and (not done or set(changed) <= may_change):
            # Nothing done yet (a run that failed before its first chunk), or only what --retry-errors may
            # change: no result of the old settings can mix with the new ones.
            self._save_job(
                {
                    **job,
                    "fingerprint": fingerprint,
                    "plan": plan,
                    "command": command or self.command,
                    **({} if done else {"tuning": None}),
                }
            )
        elif changed:
            changed.pop("limit", None)  # any limit may continue a job; only the other changes refuse it
            raise ResumeError(
                f"{self.path} holds results of a different job ({'; '.join(changed.values())})",
                "rerun with --restart to discard them and start over, or --output NEW_FOLDER to keep them",
            )
        if set(files) - set(self.job.get("files", [])):  # declared before it is ever written
            self._save_job({**self.job, "files": sorted(set(self.job.get("files", [])) | set(files))})
        lost = lost_chunks(done, listing, footers, self.job_id)
        for chunk, problem in lost.items():
            self.notes.append(f"{problem}: chunk {chunk} runs again")
        self.forget(list(lost), done)  # every file at their part names is this job's (checked above)
        self._remove_leftovers(listing, done)
        return done

    def _create_job(self, fields: dict) -> None:
        job_id = uuid.uuid4().hex
        self.folder.tmp_prefix = f".tmp-{job_id[:12]}-"
        job = {
            "batchinfer": FORMAT,
            "job_id": job_id,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **fields,
            "tuning": None,
        }
        if not self._write(lambda: self.folder.create(JOB, _dumps(job))):
            raise OutputError(
                f"another batchinfer run started a job in {self.path} at the same moment",
                "let one run use the folder; rerun the same command to resume its job",
            )
        self.job = job

    def _read_job(self) -> dict | None:
        raw = self.folder.read(JOB)
        if raw is None:
            return None
        try:
            job = json.loads(raw)
            if job.get("batchinfer") != FORMAT or not re.fullmatch(r"[0-9a-f]{32}", job.get("job_id", "")):
                raise ValueError("not a batchinfer job file")
            return job
        except (ValueError, AttributeError) as exc:
            raise OutputError(
                f"{join(str(self.path), JOB)} is damaged ({str(exc)[:100]}), so batchinfer cannot tell which "
                "files in the folder are its own",
                "write to a new folder with --output NEW_FOLDER",
            ) from exc

    def _read_markers(self, job: dict, listing: dict[str, int]) -> dict[str, dict]:
        """Finished chunks by name, in order (a retry after what it retries)."""
        done = {}
        names = sorted((n for n in listing if _MARKER.fullmatch(n)), key=_marker_order)
        for name, raw in self._read_each(self.folder.read, names).items():
            try:
                record = json.loads(raw or b"")
            except ValueError:
                continue  # not ours: reported as foreign
            if isinstance(record, dict) and record.get("job_id") == job["job_id"]:
                done[_MARKER.fullmatch(name).group(1)] = record
        return done

    # --- ownership -------------------------------------------------------------------------------------------

    def _refuse_foreign_folder(self) -> None:
        """Before writing anything: a folder with files but no batchinfer job is not ours."""
        if not self.folder.exists() or self.folder.read(JOB) is not None:
            return
        if isinstance(self.path, Path) and not self.path.is_dir():
            raise OutputError(f"output.path {self.path} is a file", "choose a folder for output.path")
        listing = self.folder.list()
        if LEGACY in listing:
            raise OutputError(
                f"{self.path} was written by an earlier batchinfer (it has {LEGACY}), whose checkpoints cannot "
                "show that the input is unchanged, so it cannot be resumed",
                "write to a new folder with --output NEW_FOLDER; delete the old one yourself when you no longer "
                "need its results",
            )
        foreign = [n for n in listing if n != LOCK and not _CREATING.fullmatch(n)]
        if foreign:
            raise _foreign_error(self.path, foreign, "holds no batchinfer job")

    def _refuse_foreign(self, job: dict | None, listing: dict[str, int], done: dict[str, dict], footers: dict) -> None:
        foreign = [name for name in listing if not self._owned(name, job, done, footers)]
        if foreign:
            raise _foreign_error(self.path, foreign, "holds files that are not this job's")

    def _footers(self, listing: dict[str, int]) -> dict[str, pq.FileMetaData | None]:
        """The footer of every Parquet file batchinfer may have written here (None: not Parquet, or not
        whole): the footer alone, not the file."""
        names = [n for n in listing if _PART.fullmatch(n) or n in (SKIPPED, BAD_RECORDS)]
        return self._read_each(self.folder.parquet_metadata, names)

    @staticmethod
    def _read_each(read, names: list[str]) -> dict:
        """name -> read(name), in the order given, READS_AT_ONCE at a time: each one small request, so the
        markers and footers of thousands of chunks on an object store take seconds, not minutes."""
        with ThreadPoolExecutor(max_workers=READS_AT_ONCE, thread_name_prefix="batchinfer-read") as pool:
            return dict(zip(names, pool.map(read, names)))

    def _owned(self, name: str, job: dict | None, done: dict[str, dict], footers: dict) -> bool:
        if name in (JOB, LOCK) or _CREATING.fullmatch(name):
            return True
        if not job:
            return False
        job_id = job["job_id"]
        base = name.rsplit("/", 1)[-1]
        if base.startswith(f".tmp-{job_id[:12]}-") or name in job.get("files", []):
            return True
        marker = _MARKER.fullmatch(name)
        if marker and marker.group(1) in done:  # read already: it carries this job's id
            return True
        if name in (REPORT, SUCCESS) or marker:
            try:
                return json.loads(self.folder.read(name) or b"{}").get("job_id") == job_id
            except (ValueError, AttributeError):
                return False
        if name in footers:  # a part (even one a marker names) is ours only if its footer says so
            return has_id(footers[name], job_id)
        return False

    def _clear(self, listing: dict[str, int], done: dict[str, dict]) -> None:
        """--restart: remove this job's files. Markers go first and the job file last, so a crash on the
        way leaves a folder that still holds one consistent job."""
        names = sorted(listing, key=lambda n: (not _MARKER.fullmatch(n), n == JOB, n))
        for name in names:
            if name != LOCK:
                self.folder.delete(name)
        for folder in self.folder.folders():
            self.folder.remove_folder(folder)

    def _remove_leftovers(self, listing: dict[str, int], done: dict[str, dict]) -> None:
        """Delete temporary files, parts of chunks that have no marker, and error files a retry replaced."""
        current = set(current_errors(done).values())
        for name in listing:
            part = _PART.fullmatch(name)
            stale_part = part and (
                part.group(1) not in done or (name.startswith(ERRORS) and part.group(1) not in current)
            )
            if stale_part or name.rsplit("/", 1)[-1].startswith(".tmp-") or name == SUCCESS:
                self.folder.delete(name)

    # --- lock ------------------------------------------------------------------------------------------------

    def _lock(self) -> None:
        saved_prefix = self.folder.tmp_prefix
        self.folder.tmp_prefix = f".tmp-lock-{self.run_id}-"
        try:
            if not self._write(lambda: self.folder.create(LOCK, self._lock_content())):
                self._take_over()
        finally:
            self.folder.tmp_prefix = saved_prefix
        self._locked = True
        self._heartbeat = _Heartbeat(self)

    def _take_over(self) -> None:
        """The lock exists: refuse while its run lives; else replace it, wait, and read it back, so that of
        two runs taking over the same dead lock at once only the one whose lock stays goes on."""
        holder = self.holder()
        if holder:
            raise OutputError(
                f"output folder {self.path} is in use by another batchinfer run (pid {holder['pid']}) on "
                f"host {holder['host']}",
                "wait for it to finish, stop it, or choose another output.path",
            )
        if read_lock(self.folder.read(LOCK)) is None and self.folder.read(LOCK) is not None:
            raise OutputError(
                f"{join(str(self.path), LOCK)} is not a batchinfer lock",
                "choose another output.path; batchinfer does not remove files it did not write",
            )
        content = self._lock_content()
        self._write(lambda: self.folder.write(LOCK, content))  # left by a run that died: take it over
        time.sleep(TAKEOVER_SETTLE)
        if (read_lock(self.folder.read(LOCK)) or {}).get("run_id") != self.run_id:
            holder = read_lock(self.folder.read(LOCK)) or {"pid": "?", "host": "?"}
            raise OutputError(
                f"output folder {self.path} was just taken over by another batchinfer run (pid {holder['pid']}) "
                f"on host {holder['host']}",
                "let that run finish; it resumes this job",
            )

    def _lock_content(self) -> bytes:
        return _dumps(
            {
                "run_id": self.run_id,
                "pid": os.getpid(),
                "process": process_identity(),
                "host": socket.gethostname(),
                "started": round(self.started, 3),  # for `status`: the rate of the run since it began
                "heartbeat": round(time.time(), 3),
            }
        )

    def check_lock(self) -> None:
        """Before a commit: the folder is still this run's (a run that stalled past LOCK_STALE may have
        lost it to another, which must then be the only one committing)."""
        lock = read_lock(self.folder.read(LOCK)) or {"pid": "?", "host": "?"}
        if lock.get("run_id") != self.run_id:
            raise OutputError(
                f"another batchinfer run took over {self.path} (pid {lock['pid']} on host {lock['host']}) "
                "while this one stalled",
                "let that run finish; it resumes this job",
            )

    def unlock(self) -> None:
        if getattr(self, "_heartbeat", None):
            self._heartbeat.stop()
        if self._locked and (read_lock(self.folder.read(LOCK)) or {}).get("run_id") == self.run_id:
            self.folder.delete(LOCK)
        self._locked = False

    def holder(self) -> dict | None:
        """The live run holding the folder, if any. On this host a run is alive while its process is;
        elsewhere while its heartbeat is younger than LOCK_STALE."""
        lock = read_lock(self.folder.read(LOCK))
        if lock is None or lock.get("run_id") == self.run_id:
            return None
        if lock["host"] == socket.gethostname():
            return lock if _alive(lock["pid"], lock.get("process")) else None
        beat = lock.get("heartbeat") or self.folder.mtime(LOCK) or 0
        return lock if time.time() - beat < LOCK_STALE else None

    # --- writing ---------------------------------------------------------------------------------------------

    def writer(self) -> "PartWriter":
        """What a chunk task needs to write its part files here; picklable, holds no lock."""
        return PartWriter(self.folder, self.compression, self.job_id)

    def write_chunk(self, chunk_name: str, results: pa.Table, errors: pa.Table | None) -> None:
        self.writer().write_chunk(chunk_name, results, errors)

    def write_skipped_shards(self, skipped: list[tuple[str, str]]) -> None:
        """The shards left out (input.on_bad_shard: skip; their rows were never read), one error row each,
        written once per run. Each item: (source, message)."""
        self.folder.delete(BAD_RECORDS)  # bad CSV records now travel with their chunks
        if not skipped:
            self.folder.delete(SKIPPED)
            return
        names, messages = zip(*skipped)
        self._write_table(
            SKIPPED,
            pa.table(
                {
                    "id": pa.nulls(len(names), pa.string()),
                    "source": list(names),
                    "row": pa.nulls(len(names), pa.int64()),
                    "reason": [Reason.BAD_SHARD] * len(names),
                    "message": list(messages),
                },
                schema=ERROR_SCHEMA,
            ),
        )

    def commit(self, record: dict) -> None:
        """The chunk is done once this returns."""
        marker = {"job_id": self.job_id, **record, "finished": round(time.time(), 3)}
        self._write(lambda: self.folder.write(f"{DONE}/{record['chunk']}.json", _dumps(marker)))

    def record_tuning(self, tuning: dict) -> None:
        self._save_job({**self.job, "tuning": tuning})

    def error_rows(self, name: str) -> pa.Table | None:
        return self.read_table(f"{ERRORS}/part-{name}.parquet")

    def read_table(self, name: str) -> pa.Table | None:
        raw = self.folder.read(name)
        return pq.read_table(pa.BufferReader(raw)) if raw is not None else None

    def parts(self, errors: bool = False) -> list[str]:
        """Names of the result (or error) part files, in input order."""
        found = [n for n in self.folder.list() if _PART.fullmatch(n) and n.startswith(ERRORS) == errors]
        return sorted(found, key=lambda n: n.rsplit("/", 1)[-1])

    def forget(self, chunks: list[str], done: dict[str, dict]) -> None:
        """Un-commit chunks (a chunk cut short by --limit, before it runs in full): each marker first,
        then the part files, so a crash on the way leaves the chunk to run again."""
        for chunk in chunks:
            passes = [chunk] + [name for name, r in done.items() if r.get("retry_of") == chunk]
            for name in passes:
                self.folder.delete(f"{DONE}/{name}.json")
                done.pop(name, None)
            for name in passes:
                self.folder.delete(f"part-{name}.parquet")
                self.folder.delete(f"{ERRORS}/part-{name}.parquet")

    def missing(self, done: dict[str, dict]) -> list[str]:
        """Committed part files the folder no longer lists (one listing: cheap at the end of every run)."""
        listing = self.folder.list()
        return [name for name in committed_parts(done) if name not in listing]

    def lost(self, done: dict[str, dict]) -> dict[str, str]:
        """Finished chunks whose part files are missing or not this job's (see lost_chunks); reads footers."""
        listing = self.folder.list()
        return lost_chunks(done, listing, self._footers(listing), self.job_id)

    def drop_errors(self, name: str) -> None:
        self.folder.delete(f"{ERRORS}/part-{name}.parquet")

    def write_file(self, name: str, fill) -> None:
        """One of the job's other files (named when the folder was opened), written by fill(binary file)."""
        if name not in self.job.get("files", []):
            raise ValueError(f"{name} is not among the files this job declared")
        self._write(lambda: self.folder.write_with(name, fill))

    def write_lines(self, name: str, convert, errors: bool = False) -> int:
        """One of the job's other files, from every result (or error) part in input order: each part's
        table → lines by `convert`. Returns the lines written."""
        count = 0

        def fill(f) -> None:
            nonlocal count
            for part in self.parts(errors=errors):
                lines = convert(self.read_table(part))
                f.write("".join(line + "\n" for line in lines).encode())
                count += len(lines)

        self.write_file(name, fill)
        return count

    def write_report(self, report: dict, success: bool, idle: bool = False) -> None:
        """idle: this run had nothing to do, so the report keeps the figures (`run`, `device`) of the last
        run that did the work, with totals brought up to date."""
        old = self.read_report() if idle else None
        if old and isinstance(old.get("run"), dict):
            report = {**report, "run": old["run"], "device": old.get("device", report["device"])}
        self._write(lambda: self.folder.write(REPORT, _dumps({"job_id": self.job_id, **report}, indent=2)))
        if success:
            self._write(lambda: self.folder.write(SUCCESS, _dumps({"job_id": self.job_id})))

    def read_report(self) -> dict | None:
        try:
            report = json.loads(self.folder.read(REPORT) or b"null")
        except ValueError:
            return None
        return report if isinstance(report, dict) else None

    def _save_job(self, job: dict) -> None:
        self._write(lambda: self.folder.write(JOB, _dumps(job)))
        self.job = job

    def _write_table(self, name: str, table: pa.Table) -> None:
        self.writer().write_table(name, table)

    def _write(self, action):
        try:
            return action()
        except OSError as exc:
            raise _write_error(self.path, exc) from exc


class PartWriter:
    """Writes a chunk's part files, each whole under its final name and carrying the job's id."""

    def __init__(self, folder, compression: str | None, job_id: str):
        self.folder, self.compression, self.job_id = folder, compression, job_id

    def write_chunk(self, chunk_name: str, results: pa.Table, errors: pa.Table | None) -> None:
        name = f"part-{chunk_name}.parquet"
        if errors is not None and errors.num_rows:
            self.write_table(f"{ERRORS}/{name}", errors)
        if results.num_rows:  # a chunk of error rows only has no part file; its marker records it
            self.write_table(name, results)

    def write_table(self, name: str, table: pa.Table) -> None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), ID_KEY: self.job_id.encode()})
        try:
            self.folder.write_table(name, table, self.compression)
        except OSError as exc:
            raise _write_error(self.folder, exc) from exc


class _Heartbeat:
    """Rewrites the lock every HEARTBEAT seconds while the run holds it, so runs on other machines can
    tell a live holder from a dead one; notes it if another run has taken the lock meanwhile."""

    def __init__(self, out: OutputDir):
        self.out, self.lost = out, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="batchinfer-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            try:
                lock = read_lock(self.out.folder.read(LOCK))
                if lock is None or lock.get("run_id") != self.out.run_id:
                    self.lost = lock or {"pid": "?", "host": "?"}
                    return
                self.out.folder.write(LOCK, self.out._lock_content())
            except OSError:
                continue  # a passing storage error: try again at the next beat

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HEARTBEAT)


# --- reading a folder without changing it -----------------------------------------------------------------------


def read_state(path: str | Path, options: dict | None = None) -> tuple[OutputDir, dict[str, dict]] | None:
    """The job and finished chunks of an output folder, read only; None when it holds no batchinfer job."""
    out = OutputDir(path, options=options)
    job = out._read_job()
    if job is None:
        return None
    out.job = job
    return out, out._read_markers(job, out.folder.list())


def skipped_shards(out: OutputDir) -> list[str]:
    """The shards the last run left out (input.on_bad_shard: skip), as _report.json lists them."""
    table = out.read_table(SKIPPED)
    return table.column("source").to_pylist() if table is not None else []


def stray_markers(out: OutputDir, done: dict[str, dict]) -> list[str]:
    """Completion markers that are damaged or not this job's: a run refuses the folder over them."""
    return [n for n in out.folder.list() if (m := _MARKER.fullmatch(n)) and m.group(1) not in done]


def has_id(metadata: pq.FileMetaData | None, job_id: str) -> bool:
    """Whether a Parquet footer carries this job's id: the only proof that batchinfer wrote the file."""
    return metadata is not None and (metadata.metadata or {}).get(ID_KEY) == job_id.encode()


def committed_parts(done: dict[str, dict]) -> dict[str, tuple[str, int | None]]:
    """The part files the finished chunks committed: name -> (chunk, rows). Each pass with results has its
    part; the latest pass of a chunk with error rows has its error file (rows not checked: batchinfer 0.2
    kept bad CSV records apart)."""
    current = set(current_errors(done).values())
    parts = {}
    for name, record in done.items():
        chunk = record.get("retry_of", name)
        if record.get("ok"):
            parts[f"part-{name}.parquet"] = (chunk, record["ok"])
        if name in current and sum(record.get("errors", {}).values()):
            parts[f"{ERRORS}/part-{name}.parquet"] = (chunk, None)
    return parts


def lost_chunks(done: dict[str, dict], listing: dict[str, int], footers: dict, job_id: str) -> dict[str, str]:
    """Finished chunks whose rows are not all there: a committed part file missing, not this job's, or not
    holding the rows its marker counts. Chunk -> what is wrong, first problem only."""
    lost: dict[str, str] = {}
    for name, (chunk, rows) in committed_parts(done).items():
        if name not in listing:
            problem = f"{name} is missing"
        elif not has_id(footers.get(name), job_id):
            problem = f"{name} is not this job's file"
        elif rows is not None and footers[name].num_rows != rows:
            problem = f"{name} holds {footers[name].num_rows:,} rows where its chunk committed {rows:,}"
        else:
            continue
        lost.setdefault(chunk, problem)
    return lost


def read_lock(raw: bytes | None) -> dict | None:
    """A lock's content: JSON, or a bare pid as batchinfer 0.1 wrote it."""
    if raw is None:
        return None
    text = raw.decode("utf-8", errors="replace").strip()
    if text.isdigit():
        return {"pid": int(text), "host": socket.gethostname(), "run_id": ""}
    try:
        lock = json.loads(text)
    except ValueError:
        return None
    return lock if isinstance(lock, dict) and isinstance(lock.get("pid"), int) and "host" in lock else None


def current_errors(done: dict[str, dict]) -> dict[str, str]:
    """For each chunk, the name of the pass whose error file is current: the chunk's, or its latest retry."""
    current = {}
    for name, record in done.items():  # marker order: a retry comes after what it retries
        current[record.get("retry_of", name)] = name
    return current


def _foreign_error(path: Path, names: list[str], what: str) -> OutputError:
    shown = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return OutputError(
        f"output folder {path} {what}: {shown}",
        "choose an empty or new output.path (--output DIR); batchinfer never deletes files it did "
        "not write, so move them away yourself if the folder must be reused",
    )


def _marker_order(name: str) -> tuple[str, int]:
    chunk = _MARKER.fullmatch(name).group(1)
    base, _, generation = chunk.partition("-r")
    return base, int(generation or 0)


def _dumps(value: dict, indent: int | None = None) -> bytes:
    return (json.dumps(value, indent=indent) + "\n").encode()


def reach_error(path, exc: OSError, doing: str, hint: str = "choose a writable output.path") -> OutputError:
    """An output folder that cannot be reached or created, in words: a missing bucket, bad credentials."""
    problem = reach_problem(exc)
    if problem:
        return OutputError(f"cannot {doing} {path}: {problem[0]}", problem[1].replace("the path", "output.path"))
    return OutputError(f"cannot {doing} {path}: {exc.strerror or str(exc)[:300]}", hint)


def _write_error(path: Path, exc: OSError) -> OutputError:
    if is_disk_full(exc):
        return OutputError(f"the disk holding {path} is full", "free space, then rerun the same command to resume")
    return OutputError(
        f"cannot write in {path}: {exc.strerror or exc}", "check the folder's permissions, then rerun to resume"
    )


def _alive(pid: int, process: str | None = None) -> bool:
    """Whether the process that wrote a lock still runs: its pid is in use, by that same process (the
    same boot and start time, where the lock recorded them: a restarted container reuses pids)."""
    if process is not None and process != process_identity(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_identity(pid: int | None = None) -> str | None:
    """The boot and the start time of a process (Linux), which a reused pid does not share; None elsewhere."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
        return f"{boot}:{stat.rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return None
