"""What goes wrong with an output folder, in words a user can act on: unreachable, unwritable, foreign."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from ..errors import OutputError, shorten
from ..storage import is_disk_full, is_uri, reach_problem


def display_path(path: str | Path) -> str | Path:
    """The folder as messages show it."""
    return str(path).rstrip("/") if is_uri(str(path)) else Path(path)


def reach_error(path, exc: OSError, doing: str, hint: str = "choose a writable output.path") -> OutputError:
    """An output folder that cannot be reached or created, in words: a missing bucket, bad credentials."""
    problem = reach_problem(exc)
    if problem:
        return OutputError(f"cannot {doing} {path}: {problem[0]}", problem[1].replace("the path", "output.path"))
    return OutputError(f"cannot {doing} {path}: {exc.strerror or str(exc)[:300]}", hint)


def write_error(path, exc: OSError) -> OutputError:
    if is_disk_full(exc):
        return OutputError(f"the disk holding {path} is full", "free space, then rerun the same command to resume")
    return OutputError(
        f"cannot write in {path}: {exc.strerror or exc}", "check the folder's permissions, then rerun to resume"
    )


def writing(path, action):
    """action(), with a storage error said as write_error."""
    try:
        return action()
    except OSError as exc:
        raise write_error(path, exc) from exc


def foreign_error(path, names: list[str], what: str) -> OutputError:
    shown = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return OutputError(
        f"output folder {path} {what}: {shown}",
        "choose an empty or new output.path (--output DIR); batchinfer never deletes files it did "
        "not write, so move them away yourself if the folder must be reused",
    )


def damage(exc: ValidationError) -> str:
    """What a job record or marker holds that batchinfer never writes, field by field: `rows: input should be
    greater than or equal to 0 (got -5)`."""
    problems = []
    for e in exc.errors()[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "the file"
        got = "" if e["type"] == "missing" else f" (got {shorten(e.get('input'), 60)})"
        problems.append(f"{where}: {e['msg'][0].lower()}{e['msg'][1:]}{got}")
    return "; ".join(problems)
