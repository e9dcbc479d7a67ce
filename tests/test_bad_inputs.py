"""Every kind of bad input in tests/data/bad/: the job goes on, and every input row ends in exactly
one place, a part file or _errors/. Shards that cannot be read at all are skipped and listed, or
stop the job with a message naming them."""

import shutil
from functools import partial
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import make_job

from batchinfer.errors import InputError
from batchinfer.execution.driver import run_job

BAD = Path(__file__).resolve().parent / "data" / "bad"

# file -> (rows in the file, rows that succeed, error rows by reason)
ROW_KINDS = {
    "null_text.jsonl": (3, 2, {"null_text": 1}),
    "empty_text.jsonl": (3, 2, {"empty_text": 1}),
    "whitespace_text.jsonl": (3, 2, {"empty_text": 1}),
    "number_text.jsonl": (3, 2, {"not_text": 1}),
    "list_text.jsonl": (3, 2, {"not_text": 1}),
    "dict_text.jsonl": (3, 2, {"not_text": 1}),
    "missing_key.jsonl": (3, 2, {"null_text": 1}),
    "malformed_json.jsonl": (3, 2, {"bad_json": 1}),
    "not_an_object.jsonl": (3, 2, {"bad_json": 1}),
    "bad_utf8.jsonl": (3, 2, {"bad_utf8": 1}),
    "blank_line.jsonl": (2, 2, {}),  # blank lines are skipped, as most JSON Lines readers do
    "too_long.jsonl": (3, 2, {"too_long": 1}),
    "crlf_and_bom.jsonl": (2, 2, {}),
    "null_and_empty.parquet": (4, 2, {"null_text": 1, "empty_text": 1}),
    "int_text_column.parquet": (2, 0, {"not_text": 2}),
    "empty_file.jsonl": (0, 0, {}),
}
SHARD_KINDS = {
    "other_schema.parquet": "column 'text' not found in other_schema.parquet; it has: id, body",
    "truncated.parquet": "cannot be read",
    "not_parquet.parquet": "cannot be read",
    "truncated.jsonl.gz": "the file ends early (truncated gzip)",
    "not_gzip.jsonl.gz": "BadGzipFile",
}


# The user's defaults (batching and backend auto), max_length 64 with truncation: error, rows keyed "id"
_job = partial(
    make_job,
    input__id="id",
    input__keep=None,
    model__max_length=64,
    model__truncation="error",
    model__backend=None,
    batching=None,
)


def _count_errors(out: Path) -> dict:
    if not (out / "_errors").exists():
        return {}
    errors = ds.dataset(str(out / "_errors"), format="parquet").to_table()
    counts = {}
    for reason in errors.column("reason").to_pylist():
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def test_there_are_at_least_15_kinds():
    assert len(ROW_KINDS) + len(SHARD_KINDS) >= 15
    assert {p.name for p in BAD.iterdir() if p.name != "make_bad_inputs.py"} == set(ROW_KINDS) | set(SHARD_KINDS)


@pytest.mark.parametrize("name", sorted(ROW_KINDS))
def test_bad_rows_go_to_errors_and_every_row_is_accounted_for(tmp_path, tiny_embed, name):
    rows, ok, reasons = ROW_KINDS[name]
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(BAD / name, folder / name)
    report = run_job(_job(folder, tiny_embed, tmp_path / "out"))
    parts = list((tmp_path / "out").glob("part-*.parquet"))
    written = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
    errors = _count_errors(tmp_path / "out")
    assert (written, errors) == (ok, reasons)
    assert written + sum(errors.values()) == rows == report["rows"]
    assert report["errors_by_reason"] == reasons and report["complete"]


@pytest.mark.parametrize("name", sorted(SHARD_KINDS))
def test_unreadable_shard_fails_with_its_name_or_is_skipped_and_listed(tmp_path, tiny_embed, name):
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(BAD / name, folder / name)
    shutil.copy(BAD / "crlf_and_bom.jsonl", folder / "good.jsonl")
    with pytest.raises(InputError) as info:
        run_job(_job(folder, tiny_embed, tmp_path / "out"))
    assert name in info.value.message and SHARD_KINDS[name] in info.value.message
    assert "on_bad_shard: skip" in info.value.hint
    report = run_job(_job(folder, tiny_embed, tmp_path / "out", input__on_bad_shard="skip"))
    assert report["rows_ok"] == 2 and report["complete"]
    assert [s["source"] for s in report["skipped_shards"]] == [name]
    skipped = pq.read_table(tmp_path / "out" / "_errors" / "skipped-shards.parquet").to_pylist()
    assert [(s["source"], s["reason"]) for s in skipped] == [(name, "bad_shard")]


def test_shard_that_breaks_mid_read_accounts_every_row(tmp_path, tiny_embed, monkeypatch):
    """A shard whose metadata reads but whose rows do not: fail names the rows, skip records each of them."""
    import batchinfer.sources.parquet as sources

    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(BAD / "crlf_and_bom.jsonl", folder / "good.jsonl")
    shutil.copy(BAD / "null_and_empty.parquet", folder / "breaks.parquet")
    real_open = sources.ParquetReader._open

    def corrupt(self):
        if self.shard.path.endswith("breaks.parquet"):
            raise OSError("Corrupt snappy compressed data.")
        return real_open(self)

    monkeypatch.setattr(sources.ParquetReader, "_open", corrupt)
    with pytest.raises(InputError, match=r"rows 0-3 of breaks.parquet cannot be read: OSError: Corrupt snappy"):
        run_job(_job(folder, tiny_embed, tmp_path / "out"))
    report = run_job(_job(folder, tiny_embed, tmp_path / "out", input__on_bad_shard="skip"))
    assert report["rows"] == 6 and report["rows_ok"] == 2 and report["errors_by_reason"] == {"bad_shard": 4}


@pytest.mark.parametrize("where", ["discovery", "read"])
def test_a_defect_in_a_reader_stops_the_job_as_an_internal_error_and_skips_nothing(
    tmp_path, tiny_embed, monkeypatch, where
):
    """Only what says "this file is unreadable" may skip a shard: a KeyError or a plain ValueError out of a
    reader is a defect in the code, and skipping on it would drop a good file's rows with a note."""
    from typer.testing import CliRunner

    import batchinfer.sources.parquet as sources
    from batchinfer.cli import app

    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(BAD / "crlf_and_bom.jsonl", folder / "good.jsonl")
    shutil.copy(BAD / "null_and_empty.parquet", folder / "fine.parquet")
    owner, name = (sources.ParquetFormat, "inspect") if where == "discovery" else (sources.ParquetReader, "read")
    real = getattr(owner, name)

    def defect(self, *args):
        if "fine.parquet" in str(args[0] if where == "discovery" else self.shard.path):
            raise KeyError("text") if where == "discovery" else ValueError("a defect in the reader")
        return real(self, *args)

    monkeypatch.setattr(owner, name, defect)
    job = tmp_path / "job.yaml"
    config = _job(folder, tiny_embed, tmp_path / "out", input__on_bad_shard="skip")
    job.write_text(yaml.safe_dump(config.model_dump(exclude_defaults=True)))
    result = CliRunner().invoke(app, ["run", str(job), "-q"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "internal error:" in said, said
    assert ("KeyError: 'text'" if where == "discovery" else "ValueError: a defect in the reader") in said
    assert "skipped" not in said and not (tmp_path / "out" / "_SUCCESS").exists()
    assert not list((tmp_path / "out").glob("_errors/*"))  # no row of the good file noted as bad_shard


def test_every_bad_shard_is_named_at_once_and_a_skip_is_in_the_summary(tmp_path, tiny_embed):
    from typer.testing import CliRunner

    from batchinfer.cli import app

    folder = tmp_path / "in"
    folder.mkdir()
    kinds = sorted(SHARD_KINDS)[:2]
    for name in kinds:
        shutil.copy(BAD / name, folder / name)
    shutil.copy(BAD / "crlf_and_bom.jsonl", folder / "good.jsonl")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(_job(folder, tiny_embed, tmp_path / "out").model_dump(exclude_defaults=True)))
    result = CliRunner().invoke(app, ["validate", str(job)])
    assert result.exit_code == 1 and "2 shards cannot be used:" in result.output
    assert all(name in result.output and SHARD_KINDS[name] in result.output for name in kinds)
    result = CliRunner().invoke(app, ["run", str(job), "-q", "--set", "input.on_bad_shard=skip"])
    assert result.exit_code == 0, result.output
    summary = " ".join(result.output.split())  # the table wraps long cells
    assert "skipped 2 shard(s) (input.on_bad_shard: skip): " + ", ".join(kinds) in summary  # with -q too


def test_a_csv_record_of_the_wrong_width_and_not_utf8_is_named_without_a_traceback(tmp_path, tiny_embed):
    """pyarrow decodes such a record as UTF-8 before our handler sees it; Python printed that as 'Exception
    ignored' with a traceback, and the raw bytes went to the terminal. Not a row-level error (pyarrow stops the
    read there): the shard is named with the record, escaped."""
    import subprocess
    import sys

    from helpers import write_job

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_bytes(b"id,text\n1,caf\xe9 ok\n2,na\xefve,extra\x01\n3,fine\n")
    job = write_job(tmp_path, make_job(tmp_path / "in", tiny_embed, tmp_path / "out", raw=True))
    job_yaml = yaml.safe_load(job.read_text())
    job_yaml["input"] = {"path": str(tmp_path / "in"), "text": "text", "id": "id"}
    job.write_text(yaml.safe_dump(job_yaml))
    done = subprocess.run([sys.executable, "-m", "batchinfer", "validate", str(job)], capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert "a.csv cannot be read" in done.stderr and "Expected 2 columns, got 3" in done.stderr, done.stderr
    assert "extra\\x01" in done.stderr
