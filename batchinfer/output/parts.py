"""Part files: each chunk's results (and error rows) written whole under their final names, carrying the
job's id in the footer; read back in input order."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from .failures import writing
from .layout import ERRORS, ID_KEY, PART, error_part_name, part_name, tmp_prefix


class PartWriter:
    """Writes a chunk's part files, each whole under its final name and carrying the job's id; picklable,
    holds no lock (a Ray worker writes with it)."""

    def __init__(self, folder, compression: str | None, job_id: str):
        self.folder, self.compression, self.job_id = folder, compression, job_id

    def write_chunk(self, chunk_name: str, results: pa.Table, errors: pa.Table | None) -> None:
        if errors is not None and errors.num_rows:
            self.write_table(error_part_name(chunk_name), errors)
        if results.num_rows:  # a chunk of error rows only has no part file; its marker records it
            self.write_table(part_name(chunk_name), results)

    def write_table(self, name: str, table: pa.Table) -> None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), ID_KEY: self.job_id.encode()})
        writing(
            self.folder, lambda: self.folder.write_table(name, table, self.compression, tmp=tmp_prefix(self.job_id))
        )


def part_names(folder, errors: bool = False) -> list[str]:
    """Names of the result (or error) part files, in input order."""
    return in_input_order([n for n in folder.list() if PART.fullmatch(n)], errors)


def in_input_order(names, errors: bool = False) -> list[str]:
    """The result (or error) part files among `names`, in input order."""
    return sorted((n for n in names if n.startswith(ERRORS) == errors), key=lambda n: n.rsplit("/", 1)[-1])


def read_table(folder, name: str) -> pa.Table | None:
    raw = folder.read(name)
    return pq.read_table(pa.BufferReader(raw)) if raw is not None else None
