"""One class per output.format: the files each writes beside the Parquet parts (declared in the job record
when the folder is opened, so they are provably the job's), and what it writes once the job is complete.
The Parquet parts stay the checkpoint in every format."""

from __future__ import annotations

import functools
import json
import math

import pyarrow as pa

from ..openai_compat.batch_files import CREATED, error_lines, response_lines
from .failures import writing
from .layout import tmp_prefix
from .parts import part_names, read_table, tables_in_input_order

RESULTS_JSONL = "_results.jsonl"  # the _ keeps Parquet readers of the folder off it
EXPORTED = "exported.json"  # the files `openai-batch -o` wrote outside the folder, with their digests


class DeclaredFiles:
    """Writes the job's other files (those its job record declares), each whole."""

    def __init__(self, folder, path, job: dict, committed: dict[str, float | None] | None = None):
        self.folder, self.path, self.declared = folder, path, job.get("files", [])
        self.tmp = tmp_prefix(job["job_id"])
        self.committed = committed or {}  # part file -> when its pass was committed (its marker's `finished`)

    def write(self, name: str, fill) -> None:
        """`name`, written by fill(binary file)."""
        if name not in self.declared:
            raise ValueError(f"{name} is not among the files this job declared")
        writing(self.path, lambda: self.folder.write_with(name, fill, tmp=self.tmp))

    def write_lines(self, name: str, convert, errors: bool = False, stamped: bool = False) -> int:
        """`name`, from every result (or error) part in input order: each part's table → lines by
        `convert`. stamped: each table has a CREATED column, when its rows' pass was committed (null where
        unknown). Returns the lines written."""
        count = 0

        def fill(f) -> None:
            nonlocal count
            read = self._stamped if stamped else functools.partial(read_table, self.folder)
            for table in tables_in_input_order(part_names(self.folder, errors=errors), read):
                lines = convert(table)
                f.write("".join(line + "\n" for line in lines).encode())
                count += len(lines)

        self.write(name, fill)
        return count

    def _stamped(self, part: str) -> pa.Table:
        table = read_table(self.folder, part)
        when = pa.scalar(self.committed.get(part), pa.float64())
        return table.append_column(CREATED, pa.repeat(when, table.num_rows))


class ParquetOutput:
    """The part files alone."""

    files: tuple[str, ...] = ()
    describing: tuple[str, ...] = ()  # of `files`, those that hold the folder's rows (written whole at the end)

    def finish(self, files: DeclaredFiles) -> dict:
        return {}


class JsonlOutput:
    """The parts, and every result row as one JSON line in _results.jsonl."""

    files = describing = (RESULTS_JSONL,)

    def finish(self, files: DeclaredFiles) -> dict:
        return {RESULTS_JSONL: files.write_lines(RESULTS_JSONL, json_lines)}


class OpenAIOutput:
    """The parts, and output.jsonl and errors.jsonl: what OpenAI's batch output_file and error_file hold."""

    describing = ("output.jsonl", "errors.jsonl")
    files = (*describing, EXPORTED)

    def __init__(self, model: str, task: str):
        self.model, self.task = model, task

    def finish(self, files: DeclaredFiles) -> dict:
        """Returns the lines written to each file, as the report's `openai`."""
        return {
            "openai": {
                "output.jsonl": files.write_lines(
                    "output.jsonl", lambda t: response_lines(t, self.model, self.task), stamped=True
                ),
                "errors.jsonl": files.write_lines("errors.jsonl", lambda t: error_lines(t, self.model), errors=True),
            }
        }


def output_format(job) -> ParquetOutput | JsonlOutput | OpenAIOutput:
    """The format object of a job's output.format."""
    if job.output.format == "openai":
        return OpenAIOutput(job.model.path, job.model.task)
    return JsonlOutput() if job.output.format == "jsonl" else ParquetOutput()


def json_lines(table) -> list[str]:
    """Result rows as JSON lines (embeddings and scores as arrays)."""
    return [json_line(row) for row in table.to_pylist()]


def json_line(row: dict) -> str:
    """A row as strict JSON, which has no NaN or infinity: a kept column's are written null (Python's json wrote
    NaN, which jq, JavaScript and Spark refuse); a model's never reach a file (runners/recovery.py)."""
    try:
        return json.dumps(row, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:  # a float that JSON cannot hold
        return json.dumps(finite_or_null(row), ensure_ascii=False, default=str)


def finite_or_null(value):
    """`value` (a row, or anything in one) with each NaN or infinity made None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


# every name a format writes of the folder's rows: a run that adds rows makes any of them stale (Checkpoint.commit)
DESCRIBING = frozenset(name for kind in (ParquetOutput, JsonlOutput, OpenAIOutput) for name in kind.describing)
