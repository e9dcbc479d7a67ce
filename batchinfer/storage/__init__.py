"""Files by path or URI: the filesystem behind an input or output path, and an output folder with the
few operations the commit protocol needs (whole-file writes, create-if-absent, listing, delete).

Local folders write through a temporary file, fsync and rename, so a file is either whole under its
final name or absent; the writer names its temporary files (`tmp`, a prefix that says whose they are).
Imports only the leaves cache and errors.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import json
import os
import posixpath
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import IO, Callable, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..cache import cache_root
from ..errors import ConfigError, InputError, OutputError


def is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> Path:
    return Path(path.removeprefix("file://")).expanduser()


GCS_RETRY_SECONDS = 30


def filesystem(path: str, options: dict | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI: s3:// and gs:// through pyarrow's own
    clients (credentials and endpoint from the standard environment, or `options`: the arguments of
    pyarrow.fs.S3FileSystem / GcsFileSystem), any other scheme through fsspec."""
    if not is_uri(path):
        return pafs.LocalFileSystem(), str(local_path(path).resolve())
    scheme, _, rest = path.partition("://")
    rest = rest.rstrip("/")
    if scheme in ("gs", "gcs"):
        # pyarrow's client retries for 15 minutes by default, so a machine without credentials or network
        # would sit silent that long; half a minute of retries still rides out a blip.
        options = {"retry_time_limit": GCS_RETRY_SECONDS, **(options or {})}
        if isinstance(options["retry_time_limit"], (int, float)):
            options["retry_time_limit"] = timedelta(seconds=options["retry_time_limit"])
        return pafs.GcsFileSystem(**options), rest
    if scheme == "s3" and options:
        return pafs.S3FileSystem(**options), rest
    if scheme in ("s3", "hdfs"):
        fs, inner = pafs.FileSystem.from_uri(path)
        return fs, inner.rstrip("/")
    import fsspec

    try:
        return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(scheme, **(options or {})))), rest
    except (ValueError, ImportError) as exc:  # a scheme fsspec does not know, or whose package is missing
        raise ConfigError(
            f"{path}: no filesystem for the scheme {scheme}:// ({str(exc)[:200]})",
            "use a local path, s3:// or gs://, or install the fsspec package for that scheme (e.g. adlfs for az://)",
        ) from None


def as_given(path: str) -> str:
    """A local path made absolute with the folders above it resolved but not its last part: a link is named by
    its own name, not its target's (a Hugging Face snapshot's train-00000.parquet, not the blob it points to)."""
    absolute = local_path(path).absolute()
    if absolute.name in ("", ".", ".."):
        return str(absolute.resolve())
    return str(absolute.parent.resolve() / absolute.name)


def join(base: str, *names: str) -> str:
    return "/".join([base.rstrip("/"), *names])


_FILESYSTEMS: dict[tuple, pafs.FileSystem] = {}


def input_filesystem(path: str, options: dict | None = None) -> tuple[pafs.FileSystem, str]:
    """filesystem(), with one client per scheme, bucket and options for all the shards of a job."""
    if not is_uri(path):
        return filesystem(path)
    scheme, _, rest = path.partition("://")
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "GOOGLE_", "GCS_")))
    key = (scheme, rest.split("/", 1)[0], json.dumps(options or {}, sort_keys=True), tuple(environment))
    if key not in _FILESYSTEMS:
        _FILESYSTEMS[key] = filesystem(f"{scheme}://{rest.split('/', 1)[0]}", options)[0]
    return _FILESYSTEMS[key], _inner(path)


def find(
    path: str,
    options: dict | None = None,
    *,
    hidden: tuple[str, ...] = ("_", "."),
    output: str | None = None,
    markers: tuple[str, ...] = (),
) -> list[tuple[str, bool]]:
    """What a path names, local or remote, through one listing (pyarrow.fs on a store): a file, the matches of a glob,
    or everything below a folder whose path below it has no part starting with one of `hidden`; [] when
    nothing is there. Globs match as the shell's do (glob_regex). A glob's matches come in the order of
    their paths, a folder's in the order of their parts (a/b before a-c), as glob.glob and Path.rglob give
    them. Folders come with the files on a local disk (a saved dataset is a folder). Left out: what lies
    in the folder `output`, and what lies in a folder below the root (the path, or a glob's folder before
    its first wildcard) that holds one of `markers`. On a local disk, links are followed but never resolved:
    a file is named by its path below `path` as the user sees it (two links to one file are two paths), and a
    link to a folder is listed as that folder, unless it leads back to a folder it lies in (a loop); one the
    listing also reaches under another name is refused (refuse_twice_listed). Returns
    (the path: absolute on a local disk, a URL on a store; whether it is a file). Raises FileNotFoundError
    when the bucket does not exist."""
    fs, inner = input_filesystem(path, options)
    remote = is_uri(path)
    root, found = _listed(fs, path, inner if remote else as_given(path), options, hidden)
    if not found and remote and fs.get_file_info(root.split("/", 1)[0]).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"the bucket {root.split('/', 1)[0]} does not exist")
    own = input_filesystem(output)[1] if output and is_uri(output) == remote else None
    marked: dict[str, bool] = {}

    def left_out(found: str) -> bool:
        where = found if remote else os.path.realpath(found)  # a link into the output folder leads inside it
        if own and (where == own or where.startswith(own + "/")):
            return True
        folder = posixpath.dirname(found)
        while markers and folder.startswith(root.rstrip("/") + "/"):
            if folder not in marked:
                infos = fs.get_file_info([f"{folder}/{marker}" for marker in markers])
                marked[folder] = any(info.type == pafs.FileType.File for info in infos)
            if marked[folder]:
                return True
            folder = posixpath.dirname(folder)
        return False

    scheme = path.partition("://")[0]
    listed = [
        (f"{scheme}://{i.path}" if remote else i.path, i.type == pafs.FileType.File)
        for i in found
        if (i.type == pafs.FileType.File or not remote) and not left_out(i.path)
    ]
    if not remote:
        refuse_twice_listed(path, [name for name, is_file in listed if is_file])
    return listed


def refuse_twice_listed(path: str, files: list[str]) -> None:
    """A link to a folder the listing also reaches under its own name (data/latest -> 2024-06-01, or two folders
    linking to each other) lists each of its files twice, and its rows would be read twice: refused, naming
    both. A file is its folder's real path and its own name: two links to one file (a hub snapshot's names for
    its blobs) are two files."""
    seen: dict[tuple[str, str], str] = {}
    real = functools.cache(os.path.realpath)  # once a folder, not once a file: a folder may hold 100,000 shards
    for name in files:
        entry = (real(os.path.dirname(name)), os.path.basename(name))
        if (first := seen.setdefault(entry, name)) != name:
            raise InputError(
                f"input.path: {path} lists {first} and {name}, one file reached through a link to a folder: its "
                "rows would be read twice",
                "point input.path at one of the folders, or write a glob that matches one of them, or remove the link",
            )


def _listed(fs, path: str, inner: str, options: dict | None, hidden: tuple[str, ...]) -> tuple[str, list]:
    """find's listing: the root it starts from, and what lies there in find's order (before what it leaves out)."""
    base = glob_base(path)
    if base != path:  # a glob: list below the folder before its first wildcard, as deep as the pattern goes
        root = input_filesystem(base, options)[1] if is_uri(path) else as_given(base or ".")
        rest = path[len(base) :]
        regex = glob_regex(join(root, rest))
        recursive = "/" in rest or "**" in rest
        return root, sorted((i for i in _listing(fs, root, recursive) if regex.fullmatch(i.path)), key=lambda i: i.path)
    info = fs.get_file_info(inner)
    if info.type != pafs.FileType.Directory:
        return inner, [info] if info.type == pafs.FileType.File else []
    listed = (i for i in _listing(fs, inner, True) if not _hidden(i.path, inner, hidden))
    return inner, sorted(listed, key=lambda info: info.path.split("/"))


def _listing(fs: pafs.FileSystem, root: str, recursive: bool) -> list[pafs.FileInfo]:
    if isinstance(fs, pafs.LocalFileSystem):
        return _local_listing(root, recursive)
    return fs.get_file_info(pafs.FileSelector(root, recursive=recursive, allow_not_found=True))


def _local_listing(root: str, recursive: bool) -> list[pafs.FileInfo]:
    """_listing on a local disk, with links under their own paths: a link to a folder is followed unless it
    leads to a folder it lies in (a loop, whose files are listed already; pyarrow's listing would go round it
    until its paths grew too long), and a dangling link is left out, as pyarrow leaves it out."""
    found: list[pafs.FileInfo] = []
    above = {root: {_folder_identity(root)}}  # folder -> the identities of it and of every folder it lies in
    for folder, folders, files in os.walk(root, onerror=_unless_gone, followlinks=True):
        chain = above.pop(folder)
        for name in list(folders):
            path = os.path.join(folder, name)
            identity = _folder_identity(path)
            if identity is None or identity in chain:
                folders.remove(name)
                continue
            above[path] = chain | {identity}
            found.append(pafs.FileInfo(path, type=pafs.FileType.Directory))
        if not recursive:
            folders.clear()
        paths = (os.path.join(folder, name) for name in files)
        found += [pafs.FileInfo(path, type=pafs.FileType.File) for path in paths if os.path.isfile(path)]
    return found


def _folder_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:  # removed while listing
        return None
    return st.st_dev, st.st_ino


def _unless_gone(exc: OSError) -> None:
    """os.walk's onerror: a folder removed while listing (or a glob's folder that is no folder) holds nothing;
    any other error (permission denied) is raised, as pyarrow's listing raises it."""
    if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        raise exc


def _hidden(path: str, root: str, prefixes: tuple[str, ...]) -> bool:
    """Whether a part of path below root starts with one of prefixes."""
    return any(part.startswith(prefixes) for part in path[len(root.rstrip("/")) + 1 :].split("/"))


def glob_regex(pattern: str) -> re.Pattern:
    """A glob as a regex over whole paths, as the shell (and glob.glob) match: * and ? stay within a folder,
    ** crosses folders, and a wildcard at the start of a name does not match a name that starts with a dot."""
    visible = r"(?!\.)"  # a wildcard that starts a name skips hidden names
    out, i = [], 0
    while i < len(pattern):
        starts_name = visible if i == 0 or pattern[i - 1] == "/" else ""
        if pattern.startswith("**/", i):
            out.append(f"(?:{visible}[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(f"(?:{visible}[^/]*(?:/|$))*")
            i += 2
        elif pattern[i] in "*?":
            out.append(starts_name + ("[^/]*" if pattern[i] == "*" else "[^/]"))
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            out.append(starts_name + "[" + pattern[i + 1 : end].replace("!", "^", 1) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def reach_problem(exc: BaseException) -> tuple[str, str] | None:
    """A storage error in words, with the fix: a missing bucket, refused credentials; else None."""
    text = str(exc)
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text or ("bucket" in text and "does not exist" in text):
        return "the bucket does not exist", "create the bucket, or fix the path"
    if "Could not create a OAuth2 access token" in text:
        return (
            "no Google Cloud credentials were found (or the auth server cannot be reached)",
            "set GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`, or give the "
            "job's storage_options",
        )
    if any(
        code in text
        for code in (
            "ACCESS_DENIED",
            "INVALID_ACCESS_KEY",
            "SIGNATURE_DOES_NOT_MATCH",
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "403",
        )
    ):
        return (
            f"access denied ({text[:160]})",
            "check the credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "(or GOOGLE_APPLICATION_CREDENTIALS), or the job's storage_options",
        )
    return None


def _inner(uri: str) -> str:
    """The path inside its filesystem of an s3://bucket/key style URI: bucket/key."""
    return uri.partition("://")[2].rstrip("/")


def open_binary(path: str, options: dict | None = None) -> IO[bytes]:
    """A file's bytes, read sequentially and buffered (readline works), local or remote."""
    if not is_uri(path):
        return open(local_path(path), "rb")
    return io.BufferedReader(open_stream(path, options), buffer_size=1 << 20)


def open_stream(path: str, options: dict | None = None) -> pa.NativeFile:
    """A file's bytes, read sequentially, local or remote, as a pyarrow stream: a pyarrow reader that reads
    ahead on its own threads reads it without calling back into Python (see sources/csv.py)."""
    fs, inner = input_filesystem(path, options)
    return fs.open_input_stream(inner, compression=None)


def modified(path: str, options: dict | None = None) -> float | None:
    """A file's modification time (seconds), local or remote; None when the store gives none."""
    if not is_uri(path):
        return local_path(path).stat().st_mtime
    fs, inner = input_filesystem(path, options)
    info = fs.get_file_info(inner)
    return info.mtime.timestamp() if info.mtime else None


def open_random(path: str, options: dict | None = None) -> pa.NativeFile:
    """A file opened for reads at any offset (a Parquet footer, its row groups), local or remote, as a
    pyarrow file (its reads release the GIL)."""
    fs, inner = input_filesystem(path, options)
    return fs.open_input_file(inner)


# Keys of an object's info (fsspec clients: s3fs, gcsfs, adlfs, ...) that change with every new version.
VERSION_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation", "content_md5", "blob_id")


def file_stamp(path: str, options: dict | None = None) -> dict[str, str]:
    """What tells a file's version apart without reading it: its size and modification time, with its
    inode on a local disk (a file renamed over it is another file) or its ETag, version or generation
    where the object store's client gives one; for a local folder (a saved dataset), all of that for
    every file in it. Raises FileNotFoundError when the file is gone."""
    if not is_uri(path):
        target = local_path(path)
        if target.is_dir():
            digest = hashlib.blake2b(digest_size=16)
            for file in sorted(f for f in target.rglob("*") if f.is_file()):
                digest.update(f"{file.relative_to(target)}:{_local_stamp(file)}\n".encode())
            return {"files": digest.hexdigest()}
        size, modified_ns, inode = _local_stamp(target).split(":", 2)
        return {"size": size, "modified": modified_ns, "file": inode}
    fs, inner = input_filesystem(path, options)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    stamp = {"size": str(info.size), "modified": str(info.mtime_ns or "")}
    store = getattr(getattr(fs, "handler", None), "fs", None)  # an fsspec client behind pyarrow
    if store is not None:
        details = store.info(inner)
        stamp.update({key.lower(): str(details[key]) for key in VERSION_KEYS if details.get(key)})
    return stamp


def _local_stamp(path: Path) -> str:
    # No device number: Ray workers on other machines see a shared mount under another one.
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def same_or_inside(inner: str, outer: str) -> bool:
    """Whether local path `inner` is `outer` or lies below it."""
    inner_path, outer_path = local_path(inner).resolve(), local_path(outer).resolve()
    return inner_path == outer_path or outer_path in inner_path.parents


JOB_RECORD = "_batchinfer.json"  # the job record at the top of every batchinfer output folder (not the YAML job file)


def refuse_location(output: str, inputs: tuple[str, ...]) -> None:
    """/, the home folder, a folder holding the input or batchinfer's cache and a folder inside another job's
    output are never output folders (the other job would take the new one for files it did not write). Here, not
    in output/, because discovery asks it before any output folder exists: sources depend on storage, not output/."""
    resolved = None if is_uri(output) else local_path(output).resolve()
    if resolved is not None and resolved in (Path(resolved.anchor), Path.home().resolve()):
        what = "the root folder" if resolved == Path(resolved.anchor) else "your home folder"
        raise OutputError(f"output.path {output} is {what}", "give the job a folder of its own, e.g. out/my-job")
    for path in inputs:
        if (
            path.rstrip("/") == output.rstrip("/")
            or path.startswith(output.rstrip("/") + "/")
            or (resolved is not None and not is_uri(path) and same_or_inside(path, output))
        ):
            raise OutputError(
                f"output.path {output} holds the input {path}",
                "write the output to a folder of its own, outside the input",
            )
    if resolved is not None and resolved.exists() and not resolved.is_dir():
        raise OutputError(
            f"output.path {output} is a file; batchinfer writes a folder there", "choose a new folder for output.path"
        )
    # Refused, not ignored: Parquet readers of the folder would take the cache's files for parts.
    if resolved is not None and same_or_inside(str(cache_root()), str(resolved)):
        raise OutputError(
            f"batchinfer's cache {cache_root()} ($BATCHINFER_CACHE) lies inside output.path {output}, where its files "
            "would be taken for files this job did not write",
            "set BATCHINFER_CACHE to a folder outside the output, e.g. ~/.cache/batchinfer",
        )
    for parent in resolved.parents if resolved is not None else ():
        if (parent / JOB_RECORD).is_file():
            raise OutputError(
                f"output.path {output} lies inside {parent}, the output folder of another batchinfer job",
                f"write to a folder outside {parent}, e.g. {parent.parent / resolved.name}",
            )


def glob_base(pattern: str) -> str:
    """The folder part of a path before its first wildcard: data/*/x.parquet → data/ (the path itself
    when it has none)."""
    wildcard = [pattern.index(ch) for ch in "*?[" if ch in pattern]
    return pattern[: pattern.rfind("/", 0, min(wildcard)) + 1] if wildcard else pattern


TMP = ".tmp-"  # the prefix of temporary files no job owns (a file written beside a user's own)
BLOCK = 1 << 20  # bytes read at a time by a digest


def sha256(stream: IO[bytes]) -> str:
    """The sha256 of what `stream` holds, read a block at a time: a file's digest in constant memory
    (hashlib lets go of the GIL over each block, so digests of several files run in parallel threads)."""
    digest = hashlib.sha256()
    while block := stream.read(BLOCK):
        digest.update(block)
    return digest.hexdigest()


class Folder(Protocol):
    """An output folder (LocalFolder, ObjectFolder): names are relative, with / between parts; every write
    leaves the file whole under its name or absent. `tmp` is the prefix of the temporary files a local
    write goes through: it names the writer (layout.tmp_prefix: the job), so a leftover is provably its."""

    def exists(self) -> bool: ...
    def make(self) -> None: ...
    def list(self) -> dict[str, int]: ...  # every file below: name -> size
    def folders(self) -> list[str]: ...  # folders below, deepest first (an object store has none)
    def read(self, name: str) -> bytes | None: ...
    def mtime(self, name: str) -> float | None: ...
    def parquet_metadata(self, name: str) -> pq.FileMetaData | None: ...
    def digest(self, name: str) -> str | None: ...  # sha256 of the file's bytes, streamed; None: no such file
    def write(self, name: str, data: bytes, *, tmp: str) -> None: ...
    def write_with(self, name: str, fill: Callable[[IO[bytes]], object], *, tmp: str) -> None: ...
    def create(self, name: str, data: bytes, *, tmp: str) -> bool: ...  # False: it existed
    def create_with(self, name: str, fill: Callable[[IO[bytes]], object], *, tmp: str) -> bool: ...
    def delete(self, name: str) -> None: ...
    def remove_folder(self, name: str) -> None: ...


class LocalFolder:
    """An output folder on a local disk (Folder)."""

    def __init__(self, path: str):
        self.path = local_path(path)

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
        return [
            Path(root).relative_to(self.path).as_posix()
            for root, _, _ in os.walk(self.path, topdown=False)
            if Path(root) != self.path
        ]

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

    def digest(self, name: str) -> str | None:
        try:
            with open(self.path / name, "rb") as f:
                return sha256(f)
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes, *, tmp: str) -> None:
        self._atomic(name, lambda f: f.write(data), tmp)

    def write_with(self, name: str, fill, *, tmp: str) -> None:
        """Write `name` whole from fill(binary file), for content too large to hold in memory."""
        self._atomic(name, fill, tmp)

    def create(self, name: str, data: bytes, *, tmp: str) -> bool:
        """Write `name` only if it does not exist, content and all at once; False if it existed."""
        return self.create_with(name, lambda f: f.write(data), tmp=tmp)

    def create_with(self, name: str, fill, *, tmp: str) -> bool:
        """create(), with the content written by fill(binary file)."""
        target = self.path / name
        written = self._write_tmp(target, fill, tmp)
        try:
            os.link(written, target)  # fails if target exists: no window in which it is there but empty
            _fsync_dir(target.parent)
            return True
        except FileExistsError:
            return False
        finally:
            written.unlink(missing_ok=True)

    def temps_of(self, name: str, *, tmp: str) -> list[str]:
        """The temporary files of `name` with the prefix `tmp` (as _write_tmp names them), such as those
        a writer killed mid-write left: its own, and no other file."""
        target = self.path / name
        own = re.compile(re.escape(tmp) + r"[0-9a-f]{8}-" + re.escape(target.name))
        found = target.parent.iterdir() if target.parent.is_dir() else ()
        mine = [p for p in found if own.fullmatch(p.name) and p.is_file() and not p.is_symlink()]
        return [p.relative_to(self.path).as_posix() for p in mine]

    def delete(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)

    def remove_folder(self, name: str) -> None:
        try:
            (self.path / name).rmdir()
        except OSError:  # not empty or gone: leave it
            pass

    def _atomic(self, name: str, write, prefix: str) -> None:
        target = self.path / name
        tmp = self._write_tmp(target, write, prefix)
        try:
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _write_tmp(self, target: Path, write, prefix: str) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        # The prefix says whose file it is; the random part keeps two writers of one file apart.
        tmp = target.with_name(f"{prefix}{uuid.uuid4().hex[:8]}-{target.name}")
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp


class ObjectFolder:
    """An output folder on an object store (s3://, gs://, ...), through pyarrow.fs (Folder). An object store
    has no rename and no append, so every file is uploaded whole in one request, from memory or from a local
    temporary file: it exists complete or not at all, and nothing temporary is written here (`tmp` is unused).
    Create-if-absent is write, wait, read back (see create: the stores' conditional write is out of reach)."""

    SETTLE = 1.0  # seconds between writing a create-if-absent object and reading it back

    def __init__(self, uri: str, options: dict | None = None):
        self.uri = uri.rstrip("/")
        self.options = options or {}
        self.fs, self.base = filesystem(uri, options)

    def __str__(self) -> str:
        return self.uri

    def __reduce__(self):  # filesystems reconnect in the process that unpickles them
        return type(self), (self.uri, self.options)

    def _path(self, name: str) -> str:
        return join(self.base, name)

    def exists(self) -> bool:
        return bool(self.list())

    def make(self) -> None:
        bucket = self.base.split("/", 1)[0]
        if self.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"the bucket {bucket} does not exist")

    def list(self) -> dict[str, int]:
        selector = pafs.FileSelector(self.base, recursive=True, allow_not_found=True)
        prefix = self.base.rstrip("/") + "/"
        return {
            info.path[len(prefix) :]: info.size
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.File and info.path.startswith(prefix)
        }

    def folders(self) -> list[str]:
        return []

    def read(self, name: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self._path(name)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def mtime(self, name: str) -> float | None:
        info = self.fs.get_file_info(self._path(name))
        return info.mtime.timestamp() if info.mtime else None

    def parquet_metadata(self, name: str) -> pq.FileMetaData | None:
        """The footer alone: a ranged read of the object's end, not the object."""
        try:
            return pq.read_metadata(self._path(name), filesystem=self.fs)
        except (OSError, pa.ArrowException):
            return None

    def digest(self, name: str) -> str | None:
        """Streamed as it downloads: the object is never held whole."""
        try:
            with self.fs.open_input_stream(self._path(name)) as f:
                return sha256(f)
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes, *, tmp: str = "") -> None:
        with self.fs.open_output_stream(self._path(name)) as f:
            f.write(data)

    def write_with(self, name: str, fill, *, tmp: str = "") -> None:
        import tempfile

        with tempfile.NamedTemporaryFile(prefix="batchinfer-") as tmp:
            fill(tmp)
            tmp.flush()
            pafs.copy_files(
                tmp.name, self._path(name), source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs
            )

    def create(self, name: str, data: bytes, *, tmp: str = "") -> bool:
        """Write `name` only if it does not exist; False if it did or another writer won the race.
        Two writers that both found it absent both write; the one whose content is read back after
        SETTLE seconds won (a writer takes well under SETTLE from its check to its write).

        S3 and GCS have a conditional write (PUT with `If-None-Match: *`, `ifGenerationMatch=0`) that would
        make this one request with no window, but pyarrow's clients do not send it: pyarrow 26's
        open_output_stream takes only a few object headers as metadata (ACL, Cache-Control, Content-Type and
        the like) and drops other keys, so a write with If-None-Match overwrites (checked against moto's
        server, which refuses the same PUT from boto3 with PreconditionFailed). fsspec's
        pipe_file(mode="create") is the interface, but no client that implements it on the store is
        installed (s3fs, gcsfs), and its default is this same check-then-write. Hence the write, wait, read."""
        if self.read(name) is not None:
            return False
        self.write(name, data)
        time.sleep(self.SETTLE)
        return self.read(name) == data

    def create_with(self, name: str, fill, *, tmp: str = "") -> bool:
        """create(), with the content written by fill(binary file): held in memory, as create's is."""
        buffer = io.BytesIO()
        fill(buffer)
        return self.create(name, buffer.getvalue())

    def delete(self, name: str) -> None:
        try:
            self.fs.delete_file(self._path(name))
        except FileNotFoundError:
            pass

    def remove_folder(self, name: str) -> None:
        pass


def open_folder(path: str, options: dict | None = None) -> Folder:
    """The output folder at a local path or a URI."""
    return ObjectFolder(path, options) if is_uri(path) else LocalFolder(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_disk_full(exc: OSError) -> bool:
    return exc.errno == errno.ENOSPC
