"""What batchinfer may touch: only files it can prove it wrote (the job's id in the JSON, in the Parquet
footer or in a temporary file's name, or a committed part's name in one of its markers where what is there is
not a whole Parquet file). Anything else in the folder is refused before any change."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import Elsewhere, OutputError
from .failures import foreign_error
from .layout import CREATING, JOB, LEGACY, LOCK, MARKER, REPORT, SUCCESS, has_id, tmp_prefix
from .records import committed_parts
from .scan import Scan


def refuse_foreign_folder(folder, path) -> None:
    """Before writing anything: a folder with files but no batchinfer job is not ours."""
    if not folder.exists() or folder.read(JOB) is not None:
        return
    if isinstance(path, Path) and not path.is_dir():
        raise OutputError(f"output.path {path} is a file", "choose a folder for output.path")
    listing = folder.list()
    if LEGACY in listing:
        raise Elsewhere(
            f"{path} was written by an earlier batchinfer (it has {LEGACY}), whose checkpoints cannot "
            "show that the input is unchanged, so it cannot be resumed",
            "; delete the old one yourself when you no longer need its results",
        )
    foreign = [n for n in listing if n != LOCK and not CREATING.fullmatch(n)]
    if foreign:
        raise foreign_error(path, foreign, "holds no batchinfer job")


def refuse_foreign(folder, path, found: Scan) -> None:
    """A folder holding this job: refuse it if any file in it is not the job's."""
    committed = committed_parts(found.done)
    foreign = [name for name in found.listing if not _owned(folder, name, found, committed)]
    if foreign:
        raise foreign_error(path, foreign, "holds files that are not this job's")


def _owned(folder, name: str, found: Scan, committed: dict) -> bool:
    if name in (JOB, LOCK) or CREATING.fullmatch(name):
        return True
    if not found.job:
        return False
    job_id = found.job["job_id"]
    base = name.rsplit("/", 1)[-1]
    if base.startswith(tmp_prefix(job_id)) or name in found.job.get("files", []):
        return True
    marker = MARKER.fullmatch(name)
    if marker and marker.group(1) in found.done:  # read already: it carries this job's id
        return True
    if name in (REPORT, SUCCESS) or marker:
        try:
            return json.loads(folder.read(name) or b"{}").get("job_id") == job_id
        except (ValueError, AttributeError):
            return False
    if name in committed and found.footers.get(name) is None:
        # A file at a name this job's marker says it committed a part under, that is not a whole Parquet file:
        # the part batchinfer wrote, cut short or damaged since, so the run may replace it.
        return True
    if name in found.footers:  # a whole Parquet file (even where a marker names it) is ours if its footer says so
        return has_id(found.footers[name], job_id)
    return False
