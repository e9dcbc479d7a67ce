"""Part files: each chunk's results (and error rows) written whole under their final names, carrying the
job's id and the pass that wrote them in the footer, and sealed (size, sha256) for the chunk's marker; read
back in input order."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .failures import writing
from .layout import CHUNK_KEY, ERRORS, ID_KEY, PART, error_part_name, part_name, tmp_prefix
from .records import Seal


class PartWriter:
    """Writes a chunk's part files, each whole under its final name and carrying the job's id; picklable,
    holds no lock (a Ray worker writes with it)."""

    def __init__(self, folder, compression: str | None, job_id: str):
        self.folder, self.compression, self.job_id = folder, compression, job_id

    def write_chunk(self, chunk_name: str, results: pa.Table, errors: pa.Table | None) -> dict[str, Seal]:
        """The pass's part files, written; returns each one's seal, for its marker."""
        files = {}
        if errors is not None and errors.num_rows:
            files[error_part_name(chunk_name)] = self.write_table(error_part_name(chunk_name), errors, chunk_name)
        if results.num_rows:  # a chunk of error rows only has no part file; its marker records it
            files[part_name(chunk_name)] = self.write_table(part_name(chunk_name), results, chunk_name)
        return files

    def write_table(self, name: str, table: pa.Table, chunk_name: str | None = None) -> Seal:
        """`table` as Parquet at `name`, its footer naming the job (and `chunk_name`, the pass that wrote it).
        Serialized in memory first: the bytes written are the bytes sealed."""
        marks = {ID_KEY: self.job_id.encode(), **({CHUNK_KEY: chunk_name.encode()} if chunk_name else {})}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **marks})
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer, compression=self.compression)
        data = buffer.getvalue().to_pybytes()
        writing(self.folder, lambda: self.folder.write(name, data, tmp=tmp_prefix(self.job_id)))
        return Seal(len(data), hashlib.sha256(data).hexdigest())


def part_names(folder, errors: bool = False) -> list[str]:
    """Names of the result (or error) part files, in input order."""
    return in_input_order([n for n in folder.list() if PART.fullmatch(n)], errors)


def in_input_order(names, errors: bool = False) -> list[str]:
    """The result (or error) part files among `names`, in input order."""
    return sorted((n for n in names if n.startswith(ERRORS) == errors), key=lambda n: n.rsplit("/", 1)[-1])


def tables_in_input_order(names: list[str], read: Callable[[str], pa.Table]) -> Iterator[pa.Table]:
    """The rows of part files `names` (in input order, as in_input_order gives them), a table per chunk, in input
    order. A chunk's retry passes (-rN) hold rows from among its own (its trial pieces, _P, rows after them), so
    a chunk of more than one part is merged by row: by name, a retry's rows would come before the chunk's."""
    for _, group in itertools.groupby(names, key=_chunk):
        tables = [read(name) for name in group]
        yield tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="default").sort_by("row")


def _chunk(name: str) -> str:
    """The chunk (SSSSS-CCCCC) a part file's pass belongs to: its own, a trial piece's (_P) or a retry's (-rN)."""
    return PART.fullmatch(name).group(1)[: len("SSSSS-CCCCC")]


def read_table(folder, name: str) -> pa.Table | None:
    raw = folder.read(name)
    return pq.read_table(pa.BufferReader(raw)) if raw is not None else None
