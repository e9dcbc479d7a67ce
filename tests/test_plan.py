"""Chunk planning and the job fingerprint: pure functions, no model."""

from functools import partial

from helpers import make_job

from batchinfer.job.plan import describe_changes, fingerprint, plan_chunks
from batchinfer.sources import Shard, shard_contents


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
    old = fingerprint(_job(), "sha256:1", shard_contents(shards))
    assert describe_changes(old, fingerprint(_job(), "sha256:1", shard_contents(shards))) == {}
    rewritten = [
        shards[0],
        Shard("/d/b.jsonl", "b.jsonl", "jsonl", 4, "ccc"),
        Shard("/d/c.csv", "c.csv", "csv", 1, "d"),
    ]
    changes = describe_changes(old, fingerprint(_job(model__max_length=64), "sha256:2", shard_contents(rewritten)))
    assert changes["input.shards"] == "input: b.jsonl changed since this folder's first run; c.csv added"
    assert changes["model.max_length"] == "model.max_length: 256 -> 64"
    assert changes["model.hash"] == "model.hash: 'sha256:1' -> 'sha256:2'"
    gone = describe_changes(old, fingerprint(_job(), "sha256:1", shard_contents(shards[:1])))
    assert gone == {"input.shards": "input: b.jsonl gone"}


def test_batching_and_the_device_are_not_in_the_fingerprint():
    base = fingerprint(_job(), "h", {})
    assert describe_changes(base, fingerprint(_job(model__device="cpu"), "h", {})) == {}
    assert not any(key.startswith("batching.max") or key.startswith("runtime") for key in base)


_generate = partial(_job, model__task="generate", model__path="m")


def test_settings_that_cannot_change_a_result_may_change_on_resume_and_those_that_can_may_not():
    """Lowering generation.max_memory after an out-of-memory, moving the input or the model, changing the
    engine's options: the same job. A result-changing key still refuses, and is named alone."""
    shards = shard_contents([Shard("/d/a.parquet", "a.parquet", "parquet", 10, "aaa")])
    base = fingerprint(_generate(generation={"max_memory": "4GB"}), "sha256:1", shards)
    same = [
        _generate(generation={"max_memory": "512MB"}),
        _generate(generation={"max_memory": "auto", "engine_options": {"num_blocks": 64}}),
        _generate(input__path="/moved/d", model__path="/moved/m", model__device="cpu"),
        _generate(batching={"max_tokens": 1024, "max_rows": 8, "strategy": "padded", "chunk_rows": "auto"}),
        _generate(runtime={"executor": "ray", "workers": 4}, output__compression="snappy"),
        _generate(generation={"max_memory": "4GB", "grammar_seconds": 60}),  # a busy machine's compile time
    ]
    for job in same:
        assert describe_changes(base, fingerprint(job, "sha256:1", shards)) == {}
    assert not {"generation.max_memory", "generation.grammar_seconds", "input.path", "model.path"} & set(base)
    changed = describe_changes(base, fingerprint(_generate(generation={"temperature": 0.7}), "sha256:1", shards))
    assert changed == {"generation.temperature": "generation.temperature: 0.0 -> 0.7"}
    for key, value in [("model__max_length", 64), ("model__dtype", "bfloat16"), ("batching__chunk_rows", 50)]:
        assert describe_changes(base, fingerprint(_generate(**{key: value}), "sha256:1", shards))
    # a JSONL line between the two limits: too_long in the chunks run before, a result in those after
    for key, value in [("input__max_line_bytes", 1 << 20), ("input__max_line_bytes", 1 << 24)]:
        assert describe_changes(base, fingerprint(_generate(**{key: value}), "sha256:1", shards))


def test_a_fingerprint_an_earlier_version_recorded_resumes_on_what_still_counts():
    """Earlier fingerprints held input.path, model.path and one `generation` dict with max_memory; a model
    hash without the sha256: prefix sampled large weights, and cannot vouch for the model."""
    from batchinfer.job.plan import IDENTITY

    shards = shard_contents([Shard("/d/a.parquet", "a.parquet", "parquet", 10, "aaa")])
    now = fingerprint(_generate(), IDENTITY + "1", shards)
    generation = {k.removeprefix("generation."): v for k, v in now.items() if k.startswith("generation.")}
    earlier = {k: v for k, v in now.items() if not k.startswith("generation.")}
    earlier.update({"input.path": "/old/d", "model.path": "/old/m", "generation": {**generation, "max_memory": "8GB"}})
    assert describe_changes(earlier, now) == {}
    hotter = {**earlier, "generation": {**earlier["generation"], "temperature": 1.0}}
    assert describe_changes(hotter, now) == {"generation.temperature": "generation.temperature: 1.0 -> 0.0"}
    sampled = describe_changes({**earlier, "model.hash": "0123456789abcdef"}, now)
    assert "earlier batchinfer, which hashed only samples" in sampled["model.hash"]


def test_a_chunk_a_limit_cut_is_planned_in_pieces_that_sort_in_input_order():
    from batchinfer.job.plan import cuts_of, plan_chunks

    trial = plan_chunks([250, 100], 100, limit=150)  # the second chunk cut at 50 rows
    assert [(c.name, c.start, c.stop) for c in trial] == [("00000-00000", 0, 100), ("00000-00001", 100, 150)]
    cuts = cuts_of({c.name: c.rows for c in trial})
    more = plan_chunks([250, 100], 100, limit=175, cuts=cuts)  # a larger trial: the piece after the cut, cut too
    assert [(c.name, c.start, c.stop) for c in more][1:] == [
        ("00000-00001", 100, 150),
        ("00000-00001_0000050", 150, 175),
    ]
    whole = plan_chunks([250, 100], 100, cuts=cuts_of({c.name: c.rows for c in more}))
    assert [(c.start, c.stop) for c in whole] == [(0, 100), (100, 150), (150, 175), (175, 200), (200, 250), (0, 100)]
    names = [f"part-{c.name}.parquet" for c in whole]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert plan_chunks([250, 100], 100) == plan_chunks([250, 100], 100, cuts={})  # no cut: the chunks of before
