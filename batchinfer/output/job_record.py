"""The job record (_batchinfer.json): the job's id, the fingerprint of its inputs and model, the command that
resumes it, the other files it writes here, its extent (chunks and rows) and what a batching probe chose.
Written first; the job's id in it is what proves every other file in the folder is batchinfer's."""

from __future__ import annotations

import json
import shlex
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..batching.budget import ProbeChoice
from ..errors import Elsewhere, OutputError
from ..storage import join
from .failures import damage, writing
from .layout import FORMAT, JOB, dumps, tmp_prefix
from .records import Tally


class Extent(BaseModel):
    """The job record's `plan`: the chunks and rows this run covers; with --limit also the whole job's."""

    model_config = ConfigDict(extra="allow", strict=True)
    chunks: Tally | None = None
    rows: Tally | None = None
    job_chunks: Tally | None = None
    job_rows: Tally | None = None
    limit: Tally | None = None


class JobRecord(BaseModel):
    """_batchinfer.json as it is read back: every field of the type batchinfer writes, or the folder is damaged.
    Keys it does not know are kept (a later batchinfer may add some)."""

    model_config = ConfigDict(extra="allow", strict=True)
    batchinfer: Literal[FORMAT]
    job_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    created: str = ""
    fingerprint: dict[str, Any]
    command: str = ""
    files: list[str] = []
    plan: Extent = Extent()
    tuning: ProbeChoice | None = None


def read_job(folder, path) -> dict | None:
    """The folder's job; None when it has no job record. A job record that is not batchinfer's, or not of the
    types batchinfer writes, is refused as damaged."""
    raw = folder.read(JOB)
    if raw is None:
        return None
    try:
        job = json.loads(raw)
    except ValueError as exc:
        problem = f"not JSON ({str(exc)[:100]})"
    else:
        try:
            JobRecord.model_validate(job)
            return job
        except ValidationError as exc:
            problem = damage(exc)
    raise Elsewhere(
        f"damaged: {join(str(path), JOB)}: {problem}; so batchinfer cannot tell which files in the folder are its own",
        "; move this one away if its results are not needed",
    )


def probe_choice(job: dict) -> ProbeChoice | None:
    """What a batching probe chose for a job (its record's `tuning`, checked by read_job), if one ran."""
    tuning = job.get("tuning")
    return ProbeChoice.model_validate(tuning) if tuning else None


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


def without_limit(command: str) -> str:
    """A saved run command without its --limit N: the command that continues a limited job to its end."""
    words, kept = shlex.split(command), []
    for i, word in enumerate(words):
        if word == "--limit" or word.startswith("--limit=") or (i and words[i - 1] == "--limit"):
            continue
        kept.append(word)
    return shlex.join(kept)
