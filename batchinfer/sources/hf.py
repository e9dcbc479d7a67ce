"""Folders written by `datasets.Dataset.save_to_disk`: memory-mapped Arrow, read by row range."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import InputError
from ..storage import is_uri
from .file_identity import ShardUnreadable, content_digest
from .shards import ReadSpec, Shard, ShardInfo, TableReader

MARKERS = ("dataset_info.json", "state.json")


class HfFormat:
    suffixes = ()  # a folder, recognised by its MARKERS

    def inspect(self, path: str, spec: ReadSpec) -> ShardInfo:
        if is_uri(path):
            raise InputError(
                f"{path} is a saved dataset on an object store, which batchinfer reads from local folders only",
                "copy the folder to local disk, or write the dataset as Parquet "
                "(dataset.to_parquet) and point input.path at that",
            )
        dataset = load(path)
        schema = dataset.data.schema
        types = {c: schema.field(c).type for c in spec.typed if c in schema.names}
        return ShardInfo(len(dataset), folder_digest(Path(path)), dataset.column_names, types)

    def reader(self, shard: Shard, spec: ReadSpec) -> TableReader:
        columns = list(spec.columns)
        return TableReader(
            lambda start, stop: load(shard.path).data.table.select(columns).slice(start, stop - start), spec
        )


def folder_digest(path: Path) -> str:
    """state.json (which holds the dataset's own fingerprint), dataset_info.json, and each data file's
    bytes (its size and modification time when large)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in MARKERS:
        if (path / name).exists():
            digest.update((path / name).read_bytes())
    state = _json(path / "state.json") if (path / "state.json").exists() else {}
    for entry in state.get("_data_files", []) if isinstance(state, dict) else ():
        file = path / entry.get("filename", "")
        if file.is_file():
            size = file.stat().st_size
            digest.update(f"{file.name}:{size}".encode())
            with open(file, "rb") as f:
                digest.update(content_digest(f, file.stat().st_mtime).encode())  # all of it when small
    return digest.hexdigest()


_CACHE: dict[str, object] = {}


def _datasets():
    """The datasets package, an extra (it brings pandas, dill and multiprocess) that only this format needs."""
    try:
        import datasets
    except ImportError as exc:
        raise InputError(
            f"reading a folder saved with datasets.save_to_disk needs the datasets package, which is not "
            f"installed ({exc})",
            "pip install 'batchinfer[hf]', or write the dataset as Parquet (dataset.to_parquet) and point "
            "input.path at that",
        ) from exc
    return datasets


def _json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except ValueError as exc:  # not JSON, or not UTF-8: the folder is damaged
        raise ShardUnreadable(f"its {path.name} is not JSON: {exc}") from exc


def load(path: str):
    if path not in _CACHE:
        datasets = _datasets()
        try:
            loaded = datasets.load_from_disk(path)
        except json.JSONDecodeError as exc:  # datasets reads state.json and dataset_info.json
            raise ShardUnreadable(f"its state.json or dataset_info.json is not JSON: {exc}") from exc
        if isinstance(loaded, datasets.DatasetDict):
            raise InputError(
                f"{path} holds a DatasetDict with splits {', '.join(loaded)}",
                f"point input.path at one split, e.g. {path}/{next(iter(loaded))}",
            )
        _CACHE[path] = loaded
    return _CACHE[path]
