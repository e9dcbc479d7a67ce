"""A committed part is checked against the digest its marker holds: a part damaged, swapped or cut after its
chunk finished is named by `status`, refused by `export` and redone by the next run, which then holds what an
uninterrupted run holds."""

import json
import shutil

import pyarrow.parquet as pq
import pytest
from helpers import make_job, read_output, write_job
from typer.testing import CliRunner

from batchinfer.cli import app
from batchinfer.output.layout import ID_KEY

runner = CliRunner()
DAMAGED = "part-00001-00000.parquet"  # the chunk every attack below damages


def _zero_embedding_bytes(out):
    """200 bytes zeroed inside the embedding column's data: size, footer and row count stay as they were."""
    path = out / DAMAGED
    group = pq.read_metadata(path).row_group(0)
    (column,) = [c for c in map(group.column, range(group.num_columns)) if c.path_in_schema.startswith("embedding")]
    start = (column.dictionary_page_offset or column.data_page_offset) + column.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[start : start + 200] = bytes(200)
    path.write_bytes(bytes(data))
    assert path.stat().st_size == len(data) and pq.read_table(path).num_rows == 100  # reads as whole


def _swap_in_another_chunks_part(out):
    """The next chunk's part, whole and this job's, copied over this one's (both hold 100 rows)."""
    shutil.copyfile(out / "part-00001-00001.parquet", out / DAMAGED)


def _cut_from_the_middle(out):
    path = out / DAMAGED
    data = path.read_bytes()
    middle = len(data) // 2
    path.write_bytes(data[:middle] + data[middle + 200 :])


def _cut_short(out):
    path = out / DAMAGED
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


ATTACKS = {
    "zeroed": _zero_embedding_bytes,
    "swapped": _swap_in_another_chunks_part,
    "cut-from-middle": _cut_from_the_middle,
    "cut-short": _cut_short,
}


def _markers(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "_done").glob("*.json"))}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_damaged_part_is_named_refused_by_export_and_redone_by_the_next_run(
    tmp_path, sms_parquet, tiny_embed, attack
):
    out = tmp_path / "out"
    # compression none: zeroed bytes decode as zeros rather than failing the decompressor, the quiet case
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, out, raw=True, output__compression="none"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    uninterrupted, markers = read_output(out), _markers(out)
    ATTACKS[attack](out)

    status = runner.invoke(app, ["status", str(out)])
    said = " ".join(status.output.split())
    assert DAMAGED in said and "chunk 00001-00000" in said and "(complete)" not in said, status.output
    assert "chunks 5/6 done" in said and "the next run redoes it" in said

    target = tmp_path / "all.parquet"
    exported = runner.invoke(app, ["export", str(out), "-o", str(target)])
    said = " ".join(exported.output.split())
    assert exported.exit_code == 1 and DAMAGED in said and f"batchinfer run {job}" in said, exported.output
    assert str(target) not in said.split("fix:")[0]  # the folder is to blame, not -o
    assert not target.exists()

    again = runner.invoke(app, ["run", str(job)])
    assert again.exit_code == 0 and f"{DAMAGED}" in again.output and "runs again" in again.output, again.output
    after = _markers(out)
    assert {n: b for n, b in after.items() if n != "00001-00000.json"} == {
        n: b for n, b in markers.items() if n != "00001-00000.json"
    }  # the other chunks were not run again
    assert after["00001-00000.json"] != markers["00001-00000.json"]
    assert read_output(out).equals(uninterrupted)  # each row once, as an uninterrupted run left them
    assert "(complete)" in runner.invoke(app, ["status", str(out)]).output
    assert runner.invoke(app, ["export", str(out), "-o", str(target)]).exit_code == 0
    assert pq.read_table(target).column("embedding").equals(uninterrupted.column("embedding"))


def test_a_marker_records_its_parts_size_and_digest_and_the_footer_its_chunk(tmp_path, sms_parquet, tiny_embed):
    import hashlib

    out = tmp_path / "out"
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, out, raw=True))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    marker = json.loads((out / "_done" / "00001-00000.json").read_text())
    data = (out / DAMAGED).read_bytes()
    assert marker["files"] == {DAMAGED: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    footer = pq.read_metadata(out / DAMAGED).metadata
    assert footer[b"batchinfer.chunk"] == b"00001-00000" and ID_KEY in footer


def test_a_part_changed_in_place_on_s3_is_named_and_redone(tmp_path, sms_parquet, tiny_embed, s3):
    """The same check through an object store: the digest streamed from the bucket."""
    bucket, client = s3
    out = f"s3://{bucket}/out"
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, out, raw=True, output__compression="none"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    key = f"out/{DAMAGED}"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    middle = len(data) // 2
    data[middle : middle + 200] = bytes(200)
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    status = runner.invoke(app, ["status", out])
    said = " ".join(status.output.split())
    assert f"{DAMAGED} does not hold the bytes its chunk committed" in said and "(complete)" not in said, said
    again = runner.invoke(app, ["run", str(job)])
    assert again.exit_code == 0 and "chunk 00001-00000 runs again" in again.output, again.output
    assert "6/6 done (complete)" in runner.invoke(app, ["status", out]).output


def test_markers_without_seals_are_checked_by_footer_and_said_so(tmp_path, sms_parquet, tiny_embed):
    """Markers written before parts were sealed (no `files`): the folder stays complete and resumes, its parts
    checked by listing and footer alone, and status says so; a part cut short is still redone."""
    out = tmp_path / "out"
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, out, raw=True))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    for marker in (out / "_done").glob("*.json"):
        content = json.loads(marker.read_text())
        content.pop("files")
        marker.write_text(json.dumps(content))
    status = " ".join(runner.invoke(app, ["status", str(out)]).output.split())
    assert "6/6 done (complete)" in status and "checked 6 part(s) by their footers alone" in status, status
    _cut_short(out)
    status = " ".join(runner.invoke(app, ["status", str(out)]).output.split())
    assert f"chunk 00001-00000: {DAMAGED} is not a whole Parquet file" in status and "(complete)" not in status
    again = runner.invoke(app, ["run", str(job)])
    assert again.exit_code == 0 and "chunk 00001-00000 runs again" in again.output, again.output
    status = " ".join(runner.invoke(app, ["status", str(out)]).output.split())
    assert "6/6 done (complete)" in status and "checked 5 part(s) by their footers alone" in status, status


def test_a_part_no_marker_names_is_named_by_status_and_removed_by_the_next_run(tmp_path, sms_parquet, tiny_embed):
    """A copy of a committed part under another chunk's name doubles its rows for any reader of the folder: status
    names it and does not say complete; the next run removes it (it is this job's) and the folder reads as before."""
    import shutil

    out = tmp_path / "out"
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, out, raw=True))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    uninterrupted = read_output(out)
    shutil.copy(out / "part-00000-00001.parquet", out / "part-00000-00009.parquet")
    said = " ".join(runner.invoke(app, ["status", str(out)]).output.split())
    assert "stray part-00000-00009.parquet" in said and "(complete)" not in said, said
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    assert not (out / "part-00000-00009.parquet").exists() and read_output(out).equals(uninterrupted)
    assert "(complete)" in runner.invoke(app, ["status", str(out)]).output
