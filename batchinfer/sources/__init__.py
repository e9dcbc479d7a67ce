"""Shards on disk → row ranges as Arrow tables, every unusable row named. Knows nothing of models.

One class per format: parquet.py, jsonl.py (and .jsonl.gz), csv.py (CSV and TSV, and gzipped), hf.py
(saved datasets), openai.py (OpenAI Batch API request lines). Discovery here expands input.path into
shards in a stable order, opens each once (row count, content digest, columns, value types) and fixes
the type of every id and kept column for the whole job. Each shard is stamped too (size, modification
time, inode or ETag), and every reader checks the stamp before and after each read, so a file changed
while the job runs stops its rows instead of mixing two versions.

Discovery never reads batchinfer's own output back: it skips the job's output folder and any folder
below the input that holds a batchinfer job (an output folder given as input.path itself is read, so
one job can feed the next).
"""

from __future__ import annotations

import posixpath
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from ..errors import InputError
from ..job.config import InputConfig
from ..job.templates import template_fields
from ..storage import (
    JOB_RECORD,
    as_given,
    file_stamp,
    find,
    glob_base,
    is_uri,
    local_path,
    reach_problem,
    refuse_location,
)
from .column_types import job_type
from .csv import CsvFormat
from .file_identity import READ_ERRORS, CheckedReader, describe_read_error
from .hf import MARKERS as HF_MARKERS
from .hf import HfFormat
from .jsonl import JsonlFormat
from .openai import REQUEST_COLUMNS, REQUEST_TYPES, OpenAIFormat, find_repeats
from .parquet import ParquetFormat
from .shards import BadShard, Reader, ReadSpec, RowBlock, Shard, ShardInfo, shard_contents

__all__ = [
    "READ_ERRORS",
    "BadShard",
    "Inputs",
    "ReadSpec",
    "RowBlock",
    "Shard",
    "describe_read_error",
    "discover_shards",
    "open_reader",
    "read_spec",
    "shard_contents",
]

FORMATS = {
    "parquet": ParquetFormat(),
    "jsonl": JsonlFormat(),
    "csv": CsvFormat(),
    "hf": HfFormat(),
    "openai": OpenAIFormat(),
}
# Files and folders batchinfer writes into an output folder: a folder holding one is its output.
JOB_MARKERS = (JOB_RECORD, "_manifest.jsonl")


class Inputs(NamedTuple):
    shards: list[Shard]
    bad: list[BadShard]
    types: dict[str, pa.DataType]  # the output type of every id and kept column, for the whole job


def read_spec(cfg: InputConfig, columns: list[str] | None = None, types: dict | None = None) -> ReadSpec:
    columns = list(columns or cfg.columns)
    if cfg.format == "openai":
        columns, types = list(dict.fromkeys(REQUEST_COLUMNS + columns)), REQUEST_TYPES
    return ReadSpec(
        tuple(columns),
        tuple(cfg.text_columns),
        tuple(cfg.templated_columns),
        (cfg.messages,) if cfg.messages else (),
        cfg.id_column,
        cfg.max_line_bytes,
        dict(types or {}),
        dict(cfg.storage_options),
    )


def open_reader(shard: Shard, spec: ReadSpec) -> Reader:
    """A reader of the shard's rows that refuses to return rows once its file changed (see CheckedReader)."""
    return CheckedReader(shard, spec, FORMATS[shard.format].reader(shard, spec))


def shard_format(path: str, declared: str = "auto", folder: bool | None = None) -> str | None:
    """The format of the shard at `path` (folder: whether it is a local folder, where the caller knows), or None."""
    if folder is None:
        folder = not is_uri(path) and Path(path).is_dir()
    if folder:
        return "hf" if any((Path(path) / m).exists() for m in HF_MARKERS) else None
    if declared != "auto":
        return declared
    name = path.lower()
    return next((fmt for fmt, f in FORMATS.items() for suffix in f.suffixes if name.endswith(suffix)), None)


def discover_shards(cfg: InputConfig, columns: list[str] | None = None, output: str | None = None) -> Inputs:
    """Expand input.path into shards in a stable order, with their row counts and identities.

    Every shard is opened and checked for the needed columns here, so a corrupt or foreign file
    stops the job before any work (on_bad_shard: fail) or is left out and reported (skip).
    """
    if output:  # before looking: discovery skips the output folder, so an input inside it would look empty
        refuse_location(output, (glob_base(cfg.path) or ".",))
    try:
        paths = _expand(cfg, output)
    except OSError as exc:  # the object store could not be listed: a missing bucket, refused credentials
        problem = reach_problem(exc) or (str(exc)[:300], "check input.path")
        raise InputError(
            f"cannot read input.path {cfg.path}: {problem[0]}", problem[1].replace("the path", "input.path")
        ) from exc
    root = posixpath.commonpath([posixpath.dirname(p) for p, _ in paths]) if len(paths) > 1 else None
    spec = read_spec(cfg, columns)
    shards, bad, infos, hints, lacking, empty = [], [], [], [], [], 0
    for path, fmt in paths:
        name = posixpath.relpath(path, root) if root else posixpath.basename(path.rstrip("/"))
        try:
            info, stamp = _inspect(path, fmt, spec)
        except InputError as exc:
            bad.append(BadShard(name, exc.message))
            hints.append(exc.hint)
            continue
        missing = [c for c in spec.columns if info.columns is not None and c not in info.columns]
        if missing and not info.rows and len(paths) > 1:  # an empty partition, as some writers leave: no rows
            empty += 1
            continue
        if missing:
            lacking.append(Lacking(name, missing, info.columns))
            bad.append(BadShard(name, lacking[-1].message))
            hints.append(LACKING_FIX)
            continue
        shards.append(Shard(path, name, fmt, info.rows, info.digest, stamp=stamp))
        infos.append(info)
    _refuse_unusable(cfg, len(paths), bad, hints, lacking, bool(shards), empty)
    if cfg.format == "openai":
        repeats = find_repeats([(s.name, info.keys) for s, info in zip(shards, infos)])
        shards = [replace(s, repeats=repeats.get(s.name, ())) for s in shards]
    types = {
        c: job_type(c, {s.name: i.types[c] for s, i in zip(shards, infos) if c in i.types}, c == spec.id_column)
        for c in spec.typed
        if any(c in i.types for i in infos)
    }
    return Inputs(shards, bad, types)


def _refuse_unusable(cfg: InputConfig, found: int, bad: list, hints: list, lacking: list, any_good: bool, empty: int):
    """Raise where the `found` shards cannot make the job: a column no shard has (the job's mistake), any bad
    shard under on_bad_shard: fail (every one at once, not one per attempt), or none good."""
    if lacking and len(lacking) == found:
        raise _no_such_column(cfg, lacking)
    if bad and cfg.on_bad_shard == "fail":
        raise InputError(
            bad[0].message
            if len(bad) == 1
            else f"{len(bad)} shards cannot be used:\n  " + "\n  ".join(b.message for b in bad),
            hints[0] + ("; or set input.on_bad_shard: skip to leave it out" if found > 1 else ""),
        )
    if not any_good and not bad:
        raise InputError(
            f"the input holds no rows: its {empty} shards are empty files without columns", "check input.path"
        )
    if not any_good:
        raise InputError(
            f"no readable shard: {bad[0].message}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
            "fix the input files or input.text / input.id / input.keep",
        )


def _inspect(path: str, fmt: str, spec: ReadSpec) -> tuple[ShardInfo, tuple[tuple[str, str], ...]]:
    """What a shard holds, and its stamp: taken before it is read, so a change while it is read is seen."""
    try:
        stamp = file_stamp(path, spec.options)
        info = FORMATS[fmt].inspect(path, spec)
    except READ_ERRORS as exc:
        problem = reach_problem(exc)
        if problem:
            raise InputError(f"shard {path} cannot be read: {problem[0]}", problem[1]) from exc
        raise InputError(
            f"shard {path} cannot be read: {describe_read_error(exc)}", "replace or remove the file"
        ) from exc
    twice = [c for c in spec.columns if info.columns is not None and info.columns.count(c) > 1]
    if twice:  # which of them holds the rows is the file's guess, not the job's
        raise InputError(
            f"shard {path} has {_columns(twice)} more than once, under the same name",
            "rename the repeated column in the file (the job reads it), or remove the shard",
        )
    return info, tuple(sorted({**stamp, **({"footer": info.footer} if info.footer else {})}.items()))


LACKING_FIX = "fix input.text, input.id or input.keep to name existing columns, or remove the shard of another schema"


class Lacking(NamedTuple):
    """A shard without a column the job reads."""

    shard: str
    missing: list[str]
    present: list[str]

    @property
    def message(self) -> str:
        held = f"it has: {', '.join(self.present)}" if self.present else "it has no columns"
        return f"{_columns(self.missing)} not found in {self.shard}; {held}"


def _no_such_column(cfg: InputConfig, lacking: list[Lacking]) -> InputError:
    """One problem, by job key, for the columns that every shard lacks; shards of different schemas, each
    lacking something else, are listed shard by shard."""
    everywhere = [c for c in lacking[0].missing if all(c in other.missing for other in lacking[1:])]
    if not everywhere:
        return InputError(
            f"{len(lacking)} shards cannot be used:\n  " + "\n  ".join(x.message for x in lacking), LACKING_FIX
        )
    present = ", ".join(dict.fromkeys(c for x in lacking for c in x.present)) or "no columns"
    where = f"{lacking[0].shard} has" if len(lacking) == 1 else f"the {len(lacking)} shards have"
    by_key: dict[str, list[str]] = {}
    for column in everywhere:
        by_key.setdefault(_key_naming(cfg, column), []).append(column)
    fix = f"name {'an existing column' if len(everywhere) == 1 else 'existing columns'} in {', '.join(by_key)}"
    if len(by_key) == 1:
        (key, names), *_ = by_key.items()
        return InputError(f"{key}: no {_columns(names)} in the input; {where} {present}", fix)
    lines = "".join(f"\n  {key}: {', '.join(repr(c) for c in names)}" for key, names in by_key.items())
    return InputError(f"the job names columns the input does not have ({where} {present}):{lines}", fix)


def _key_naming(cfg: InputConfig, column: str) -> str:
    """The job key that asks for `column`."""
    for key, spec in (("input.text", cfg.text), ("input.text_pair", cfg.text_pair)):
        if spec is not None and column in template_fields(spec):
            return key
    if column == cfg.messages:
        return "input.messages"
    if column == cfg.id_column:
        return "input.id"
    if column in cfg.kept:
        return "input.keep"
    return "generation.max_new_tokens_column"  # the one column a job reads outside input


def _columns(names: list[str]) -> str:
    return f"{'column' if len(names) == 1 else 'columns'} {', '.join(repr(c) for c in names)}"


def _expand(cfg: InputConfig, output: str | None) -> list[tuple[str, str]]:
    """input.path as the paths of its shards, each with its format, in a stable order: a saved dataset, a file, a
    glob or every file below a folder (local paths absolute, links not resolved: a shard is named and its format
    judged by its own path, its bytes read through the link; URLs as URLs), leaving out batchinfer output: the
    job's own folder and any folder below the input's root that holds a batchinfer job."""
    if shard_format(cfg.path) == "hf":
        return [(as_given(cfg.path), "hf")]
    found = find(cfg.path, cfg.storage_options, output=output, markers=JOB_MARKERS)
    remote, wildcard = is_uri(cfg.path), glob_base(cfg.path) != cfg.path
    formats = [(path, shard_format(path, cfg.format, folder=not remote and not is_file)) for path, is_file in found]
    shards = [(path, fmt) for path, fmt in formats if fmt]
    if shards:
        return shards
    if not found and not wildcard and remote:
        raise InputError(f"input.path {cfg.path} does not exist or holds no file", "check the URL")
    if not found and not wildcard and not local_path(cfg.path).is_dir():
        raise InputError(
            f"input.path {cfg.path} does not exist", "check the path; it is taken from the current directory"
        )
    if not wildcard and not remote and local_path(cfg.path).is_file():
        where = f"the file {cfg.path}, whose extension batchinfer does not know,"
    else:
        where = f"{'the glob' if wildcard else 'the folder'} {cfg.path}"
    _nothing_found(where, [posixpath.basename(path) for path, is_file in found if is_file])


def _nothing_found(where: str, names: list[str]) -> None:
    found = ", ".join(sorted({(Path(n).suffix or n) for n in names})[:8]) or "nothing"
    raise InputError(
        f"{where} holds no .parquet, .jsonl, .csv or .tsv file (or .gz of them) nor a saved dataset folder "
        f"(found: {found})",
        "point input.path at your shards, or set input.format (parquet, jsonl, csv) for files with another extension",
    )
