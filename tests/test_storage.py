"""Object stores: a job from s3:// to s3:// through a real S3 API (moto's server on 127.0.0.1), with the
same output, resume and refusals as on local disk."""

import io
import json
import os
import time
from functools import partial

import numpy as np
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from helpers import make_job, run_cli, run_until, write_job
from typer.testing import CliRunner

from batchinfer.cli import app
from batchinfer.errors import InputError, OutputError
from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job
from batchinfer.storage import glob_regex

runner = CliRunner()


def _upload(client, bucket, sms_table):
    """Two Parquet shards and a JSONL shard, 300 real messages."""
    for k in range(2):
        buffer = io.BytesIO()
        pq.write_table(sms_table.slice(k * 100, 100), buffer, row_group_size=32)
        client.put_object(Bucket=bucket, Key=f"reviews/part-{k}.parquet", Body=buffer.getvalue())
    lines = "".join(json.dumps(r) + "\n" for r in sms_table.slice(200, 100).select(["sms_id", "text"]).to_pylist())
    client.put_object(Bucket=bucket, Key="reviews/more.jsonl", Body=lines.encode())
    client.put_object(Bucket=bucket, Key="reviews/README.txt", Body=b"not a shard")


_job = partial(make_job, raw=True, input__keep=None, model__max_length=64, batching__chunk_rows=40)


def _s3fs():
    return pafs.FileSystem.from_uri("s3://x")[0]


def _table(uri):
    return ds.dataset(uri.removeprefix("s3://"), filesystem=_s3fs(), format="parquet").to_table()


def test_s3_to_s3_equals_a_local_run_and_is_read_from_the_bucket(s3, sms_table, tiny_embed, tmp_path):
    import duckdb

    bucket, client = s3
    _upload(client, bucket, sms_table)
    report = run_job(validate_job(_job(f"s3://{bucket}/reviews/", tiny_embed, f"s3://{bucket}/out/")))
    assert report["complete"] and report["rows"] == report["rows_ok"] == 300
    local = tmp_path / "in"
    local.mkdir()
    for key in ("reviews/part-0.parquet", "reviews/part-1.parquet", "reviews/more.jsonl"):
        (local / key.split("/")[1]).write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    run_job(validate_job(_job(str(local), tiny_embed, str(tmp_path / "out"))))
    remote, here = _table(f"s3://{bucket}/out"), ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    ids = sms_table.column("sms_id").to_pylist()
    assert remote.column("sms_id").to_pylist() == here.column("sms_id").to_pylist() == ids[200:300] + ids[:200]
    assert np.array_equal(
        np.array(remote.column("embedding").to_pylist()), np.array(here.column("embedding").to_pylist())
    )
    dataset = ds.dataset(f"s3://{bucket}/out/")  # noqa: F841 - docs/scale-out.md's form (AWS_ENDPOINT_URL); DuckDB scans it
    assert duckdb.sql("SELECT count(DISTINCT sms_id) FROM dataset").fetchall() == [(300,)]
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert "out/_SUCCESS" in keys and "out/_batchinfer.json" in keys and not any(".tmp" in k for k in keys)
    result = runner.invoke(app, ["status", f"s3://{bucket}/out"])
    assert result.exit_code == 0 and "9/9 done (complete)" in result.output


def test_a_glob_over_a_bucket_prefix(s3, sms_table, tiny_embed):
    bucket, client = s3
    _upload(client, bucket, sms_table)
    report = run_job(validate_job(_job(f"s3://{bucket}/reviews/part-*.parquet", tiny_embed, f"s3://{bucket}/out")))
    assert report["rows"] == 200 and {s for s in _table(f"s3://{bucket}/out").column("source").to_pylist()} == {
        "part-0.parquet",
        "part-1.parquet",
    }


def test_glob_patterns_match_like_the_shell():
    assert glob_regex("b/reviews/*.parquet").fullmatch("b/reviews/a.parquet")
    assert not glob_regex("b/reviews/*.parquet").fullmatch("b/reviews/x/a.parquet")
    assert glob_regex("b/**/*.jsonl").fullmatch("b/x/y/a.jsonl") and glob_regex("b/**/*.jsonl").fullmatch("b/a.jsonl")
    assert glob_regex("b/part-[0-1].parquet").fullmatch("b/part-1.parquet")


def test_kill_9_on_s3_then_the_same_command_resumes(s3, sms_table, tiny_embed, tmp_path):
    bucket, client = s3
    _upload(client, bucket, sms_table)
    job = write_job(
        tmp_path,
        **_job(
            f"s3://{bucket}/reviews/",
            tiny_embed,
            f"s3://{bucket}/out",
            batching={"chunk_rows": 20, "max_rows": 2, "max_tokens": 16384, "strategy": "padded"},
        ),
    )
    command = ["run", str(job), "-q"]

    def markers():
        listing = client.list_objects_v2(Bucket=bucket, Prefix="out/_done/")
        return len(listing.get("Contents", []))

    stopped = run_until(command, lambda _: markers() >= 3)
    killed_at = markers()
    assert 3 <= killed_at < 15, stopped.output  # the kill landed mid-run
    finished = run_cli(command)
    assert finished.returncode == 0, finished.stderr
    ids = _table(f"s3://{bucket}/out").column("sms_id").to_pylist()
    expected = sms_table.column("sms_id").to_pylist()
    assert ids == expected[200:300] + expected[:200]  # each once, in input order (more.jsonl sorts first)


def test_missing_bucket_and_bad_credentials_are_one_clear_message(s3, sms_table, tiny_embed, monkeypatch, tmp_path):
    bucket, client = s3
    _upload(client, bucket, sms_table)
    with pytest.raises(InputError) as info:
        run_job(validate_job(_job("s3://no-such-bucket-here/reviews/", tiny_embed, f"s3://{bucket}/out")))
    assert "the bucket does not exist" in info.value.message and "no-such-bucket-here" in info.value.message
    with pytest.raises(OutputError) as info:
        run_job(validate_job(_job(f"s3://{bucket}/reviews/", tiny_embed, "s3://no-such-bucket-here/out")))
    assert "the bucket does not exist" in info.value.message
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    result = runner.invoke(
        app,
        ["run", str(write_job(tmp_path, **_job(f"s3://{bucket}/reviews/", tiny_embed, f"s3://{bucket}/out"))), "-q"],
    )
    assert result.exit_code == 1 and "access denied" in result.output and "AWS_SECRET_ACCESS_KEY" in result.output
    assert "Traceback" not in result.output


def test_a_second_driver_on_the_same_s3_output_is_refused(s3, sms_table, tiny_embed):
    from batchinfer.output.checkpoint import Checkpoint

    bucket, client = s3
    _upload(client, bucket, sms_table)
    with Checkpoint.open(f"s3://{bucket}/out") as first:
        first.start({"input.path": "x"}, restart=False)
        with pytest.raises(OutputError, match=f"in use by another batchinfer run \\(pid {os.getpid()}\\)"):
            run_job(validate_job(_job(f"s3://{bucket}/reviews/", tiny_embed, f"s3://{bucket}/out")))
        # A lock from another machine is held while its heartbeat is fresh, and taken over once stale.
        lock = json.loads(client.get_object(Bucket=bucket, Key="out/_lock")["Body"].read())
        client.put_object(Bucket=bucket, Key="out/_lock", Body=json.dumps({**lock, "host": "elsewhere"}).encode())
        with pytest.raises(OutputError, match="host elsewhere"):
            Checkpoint.open(f"s3://{bucket}/out")
        client.put_object(
            Bucket=bucket,
            Key="out/_lock",
            Body=json.dumps({**lock, "host": "elsewhere", "heartbeat": time.time() - 3600}).encode(),
        )
        with Checkpoint.open(f"s3://{bucket}/out") as taken:
            taken.start({"input.path": "x"}, restart=False)


def test_foreign_objects_in_an_s3_output_are_refused_untouched(s3):
    from batchinfer.output.checkpoint import Checkpoint

    bucket, client = s3
    client.put_object(Bucket=bucket, Key="out/part-00000-0a1b.snappy.parquet", Body=b"PAR1...")
    client.put_object(Bucket=bucket, Key="out/_SUCCESS", Body=b"")
    with pytest.raises(OutputError, match="holds no batchinfer job"):
        Checkpoint.open(f"s3://{bucket}/out")
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert keys == {"out/part-00000-0a1b.snappy.parquet", "out/_SUCCESS"}


def test_gcs_gives_up_within_a_minute_and_says_why(monkeypatch):
    from datetime import timedelta

    from batchinfer import storage
    from batchinfer.storage import filesystem, reach_problem

    fs, inner = filesystem("gs://bucket/reviews/", {"retry_time_limit": 2})  # seconds, as a job file gives them
    assert isinstance(fs, pafs.GcsFileSystem) and inner == "bucket/reviews"
    made = []
    monkeypatch.setattr(storage.pafs, "GcsFileSystem", lambda **options: made.append(options))
    filesystem("gs://bucket/reviews/")
    filesystem("gs://bucket/reviews/", {"retry_time_limit": 5})
    assert [m["retry_time_limit"] for m in made] == [timedelta(seconds=30), timedelta(seconds=5)]  # not 15 minutes
    problem = reach_problem(OSError("Retry policy exhausted ... Could not create a OAuth2 access token to ..."))
    assert problem and "credentials" in problem[0] and "GOOGLE_APPLICATION_CREDENTIALS" in problem[1]


def test_two_concurrent_creates_of_one_object_let_exactly_one_win(s3, monkeypatch):
    """Create-if-absent on S3: two writers that both find the object absent and write at once; exactly one
    is told it won, and the object holds that one's content. pyarrow sends no conditional write, so this is
    the write-wait-read fallback, which holds while each writer takes under SETTLE from its check to its
    write: on this shared machine, under load, one run in seven took longer than the default 1 s and both
    writers won, so the test gives them 5 s."""
    import threading

    from batchinfer.storage import ObjectFolder

    monkeypatch.setattr(ObjectFolder, "SETTLE", 5.0)
    bucket, client = s3
    folders = [ObjectFolder(f"s3://{bucket}/out") for _ in range(2)]
    start, won = threading.Barrier(2), {}

    def create(k):
        start.wait()
        won[k] = folders[k].create("_lock", f"writer {k}".encode())

    threads = [threading.Thread(target=create, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won.values()) == [False, True]
    winner = next(k for k, value in won.items() if value)
    assert client.get_object(Bucket=bucket, Key="out/_lock")["Body"].read() == f"writer {winner}".encode()
    assert folders[0].create("_lock", b"late") is False


@pytest.mark.parametrize("pattern", ["", "**/*.jsonl", "*.jsonl", "*/*"])
def test_local_and_s3_discovery_find_the_same_shards_in_the_same_order(s3, tmp_path, pattern):
    """One tree on disk and in a bucket: a folder (hidden and _ parts left out, a folder holding another
    job's output left out, its files in the order of their parts: a/ before a-b) and globs (a wildcard
    does not match a hidden name) give the same shards, in the same order, wherever the tree lies."""
    from batchinfer.job.config import InputConfig
    from batchinfer.sources import discover_shards

    bucket, client = s3
    line = json.dumps({"text": "hello there"}) + "\n"
    tree = {
        "a/x.jsonl": line,
        "a-b.jsonl": line,
        "a.jsonl": line,
        "b/c/d.jsonl": line,
        ".hidden.jsonl": line,
        "_logs/e.jsonl": line,
        "a/.cache/f.jsonl": line,
        "old/_batchinfer.json": "{}",
        "old/part.jsonl": line,
        "README.txt": "not a shard",
    }
    for name, text in tree.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
        client.put_object(Bucket=bucket, Key=f"tree/{name}", Body=text.encode())

    def names(path):
        return [shard.name for shard in discover_shards(InputConfig(path=path, text="text")).shards]

    local = names(str(tmp_path / pattern) if pattern else str(tmp_path))
    assert local == names(f"s3://{bucket}/tree/{pattern}" if pattern else f"s3://{bucket}/tree")
    assert ".hidden.jsonl" not in local and "old/part.jsonl" not in local and local
