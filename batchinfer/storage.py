"""Files by path or URI: the filesystem behind an input or output path, and an output folder with the
few operations the commit protocol needs (whole-file writes, create-if-absent, listing, delete).

Local folders write through a temporary file, fsync and rename, so a file is either whole under its
final name or absent. No package imports.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


def is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> Path:
    return Path(path.removeprefix("file://")).expanduser()


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path."""
    return pafs.LocalFileSystem(), str(local_path(path).resolve())


def same_or_inside(inner: str, outer: str) -> bool:
    """Whether local path `inner` is `outer` or lies below it."""
    inner_path, outer_path = local_path(inner).resolve(), local_path(outer).resolve()
    return inner_path == outer_path or outer_path in inner_path.parents


class LocalFolder:
    """An output folder on a local disk. Names are relative, with / between parts."""

    def __init__(self, path: str):
        self.path = local_path(path)
        self.tmp_prefix = ".tmp-"

    def __str__(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        return self.path.exists()

    def make(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def list(self) -> dict[str, int]:
        """Every file below the folder: relative name -> size."""
        found = {}
        for root, dirs, files in os.walk(self.path):
            dirs.sort()
            for name in files:
                full = Path(root) / name
                try:
                    found[full.relative_to(self.path).as_posix()] = full.stat().st_size
                except FileNotFoundError:  # removed while listing
                    continue
        return found

    def folders(self) -> list[str]:
        """Relative names of the folders below, deepest first."""
        return [Path(root).relative_to(self.path).as_posix() for root, _, _ in os.walk(self.path, topdown=False)
                if Path(root) != self.path]

    def read(self, name: str) -> bytes | None:
        try:
            return (self.path / name).read_bytes()
        except FileNotFoundError:
            return None

    def mtime(self, name: str) -> float | None:
        try:
            return (self.path / name).stat().st_mtime
        except FileNotFoundError:
            return None

    def parquet_metadata(self, name: str) -> pq.FileMetaData | None:
        """The footer of a Parquet file, or None when it is not one (or not whole)."""
        try:
            return pq.read_metadata(self.path / name)
        except (OSError, pa.ArrowException):
            return None

    def write(self, name: str, data: bytes) -> None:
        self._atomic(name, lambda f: f.write(data))

    def write_with(self, name: str, fill) -> None:
        """Write `name` whole from fill(binary file), for content too large to hold in memory."""
        self._atomic(name, fill)

    def write_table(self, name: str, table: pa.Table, compression: str | None) -> None:
        self._atomic(name, lambda f: pq.write_table(table, f, compression=compression))

    def create(self, name: str, data: bytes) -> bool:
        """Write `name` only if it does not exist, content and all at once; False if it existed."""
        target = self.path / name
        tmp = self._write_tmp(target, lambda f: f.write(data))
        try:
            os.link(tmp, target)  # fails if target exists: no window in which it is there but empty
            _fsync_dir(target.parent)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)

    def remove_folder(self, name: str) -> None:
        try:
            (self.path / name).rmdir()
        except OSError:  # not empty or gone: leave it
            pass

    def _atomic(self, name: str, write) -> None:
        target = self.path / name
        tmp = self._write_tmp(target, write)
        try:
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _write_tmp(self, target: Path, write) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{self.tmp_prefix}{target.name}")
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_disk_full(exc: OSError) -> bool:
    return exc.errno == errno.ENOSPC
