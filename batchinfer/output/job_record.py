"""The job record (_batchinfer.json): the job's id, the fingerprint of its inputs and model, the command that
resumes it, the other files it writes here, its extent (chunks and rows) and what a batching probe chose.
Written first; the job's id in it is what proves every other file in the folder is batchinfer's."""

from __future__ import annotations

import json
import re
import time
import uuid

from ..errors import OutputError
from ..storage import join
from .failures import writing
from .layout import FORMAT, JOB, dumps, tmp_prefix


def read_job(folder, path) -> dict | None:
    """The folder's job; None when it has no job record. A job record that is not batchinfer's is refused."""
    raw = folder.read(JOB)
    if raw is None:
        return None
    try:
        job = json.loads(raw)
        if job.get("batchinfer") != FORMAT or not re.fullmatch(r"[0-9a-f]{32}", job.get("job_id", "")):
            raise ValueError("not a batchinfer job record")
        return job
    except (ValueError, AttributeError) as exc:
        raise OutputError(
            f"{join(str(path), JOB)} is damaged ({str(exc)[:100]}), so batchinfer cannot tell which "
            "files in the folder are its own",
            "write to a new folder with --output NEW_FOLDER",
        ) from exc


def create_job(folder, path, fields: dict) -> dict:
    """A new job in an empty folder, created only if no other run created one at the same moment. Its temporary
    file, as every later one, carries the job's id."""
    job_id = uuid.uuid4().hex
    job = {
        "batchinfer": FORMAT,
        "job_id": job_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **fields,
        "tuning": None,
    }
    if not writing(path, lambda: folder.create(JOB, dumps(job), tmp=tmp_prefix(job_id))):
        raise OutputError(
            f"another batchinfer run started a job in {path} at the same moment",
            "let one run use the folder; rerun the same command to resume its job",
        )
    return job


def save_job(folder, path, job: dict) -> dict:
    writing(path, lambda: folder.write(JOB, dumps(job), tmp=tmp_prefix(job["job_id"])))
    return job
