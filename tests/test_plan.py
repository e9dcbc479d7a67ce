"""Chunk planning and the job fingerprint: pure functions, no model."""

from functools import partial

from helpers import make_job

from batchinfer.plan import describe_changes, fingerprint, plan_chunks
from batchinfer.sources import Shard


def test_chunks_follow_shards_and_the_limit_cuts_the_last_one_short():
    chunks = plan_chunks([5, 3], chunk_rows=2)
    assert [(c.shard, c.index, c.start, c.stop) for c in chunks] == [
        (0, 0, 0, 2),
        (0, 1, 2, 4),
        (0, 2, 4, 5),
        (1, 0, 0, 2),
        (1, 1, 2, 3),
    ]
    assert [c.name for c in chunks[:2]] == ["00000-00000", "00000-00001"]
    limited = plan_chunks([5, 3], chunk_rows=2, limit=6)
    assert [(c.shard, c.start, c.stop) for c in limited] == [(0, 0, 2), (0, 2, 4), (0, 4, 5), (1, 0, 1)]
    assert [c.name for c in limited] == [c.name for c in chunks[:4]]  # the same names: a full run continues it
    assert plan_chunks([5], chunk_rows=2, limit=0) == [] and plan_chunks([], chunk_rows=2) == []


# The smallest job: the defaults of every key not named
_job = partial(
    make_job,
    "d",
    "m",
    "o",
    input__text="t",
    input__id=None,
    input__keep=None,
    model__max_length=None,
    model__backend=None,
    batching=None,
)


def test_the_fingerprint_names_what_changed_in_words():
    shards = [
        Shard("/d/a.parquet", "a.parquet", "parquet", 10, "aaa"),
        Shard("/d/b.jsonl", "b.jsonl", "jsonl", 4, "bbb"),
    ]
    old = fingerprint(_job(), "hash1", shards)
    assert describe_changes(old, fingerprint(_job(), "hash1", shards)) == {}
    rewritten = [
        shards[0],
        Shard("/d/b.jsonl", "b.jsonl", "jsonl", 4, "ccc"),
        Shard("/d/c.csv", "c.csv", "csv", 1, "d"),
    ]
    changes = describe_changes(old, fingerprint(_job(model__max_length=64), "hash2", rewritten))
    assert changes["input.shards"] == "input: b.jsonl changed since this folder's first run; c.csv added"
    assert changes["model.max_length"] == "model.max_length: 256 -> 64"
    assert changes["model.hash"] == "model.hash: 'hash1' -> 'hash2'"
    gone = describe_changes(old, fingerprint(_job(), "hash1", shards[:1]))
    assert gone == {"input.shards": "input: b.jsonl gone"}


def test_batching_and_the_device_are_not_in_the_fingerprint():
    base = fingerprint(_job(), "h", [])
    assert describe_changes(base, fingerprint(_job(model__device="cpu"), "h", [])) == {}
    assert not any(key.startswith("batching.max") or key.startswith("runtime") for key in base)
