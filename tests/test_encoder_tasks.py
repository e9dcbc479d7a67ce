"""The encoder tasks beyond embed and classify: each agrees with the library users would otherwise
run (sentence-transformers' CrossEncoder, transformers' pipelines) and resumes after a crash."""

from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import Crash, CrashAfterChunks, make_job

from batchinfer.errors import ConfigError, ModelError
from batchinfer.execution.driver import run_job


def _pairs(sms_table, n=120):
    texts = sms_table.column("text").to_pylist()[:n]
    queries = [" ".join(t.split()[:4]) for t in reversed(texts)]  # short queries against long messages
    return pa.table({"pair_id": [f"p{i}" for i in range(n)], "query": queries, "message": texts})


_job = partial(
    make_job,
    input__id="pair_id",
    input__keep=None,
    batching__chunk_rows=40,
    batching__max_tokens=2048,
)


def _read(out):
    return ds.dataset(str(out), format="parquet").to_table()


def _texts(sms_table, tmp_path, n=120):
    rows = pa.table({"pair_id": [f"p{i}" for i in range(n)], "text": sms_table.column("text").to_pylist()[:n]})
    pq.write_table(rows, tmp_path / "rows.parquet")
    return rows


def test_score_agrees_with_cross_encoder_predict(sms_table, tiny_cross_encoder, tmp_path):
    from sentence_transformers import CrossEncoder

    pairs = _pairs(sms_table)
    pq.write_table(pairs, tmp_path / "pairs.parquet")
    report = run_job(
        _job(
            tmp_path / "pairs.parquet",
            tiny_cross_encoder,
            tmp_path / "out",
            "score",
            input={"text": "query", "text_pair": "message"},
        )
    )
    assert report["rows_ok"] == 120
    ours = _read(tmp_path / "out")
    theirs = CrossEncoder(str(tiny_cross_encoder), max_length=128, device="cpu").predict(
        list(zip(pairs.column("query").to_pylist(), pairs.column("message").to_pylist())), batch_size=16
    )
    assert ours.column("pair_id").to_pylist() == pairs.column("pair_id").to_pylist()
    assert np.abs(ours.column("score").to_numpy() - theirs).max() < 1e-5


def test_score_packed_equals_padded_and_a_missing_side_is_an_error_row(sms_table, tiny_cross_encoder, tmp_path):
    pairs = _pairs(sms_table).to_pylist()
    pairs[3]["message"], pairs[7]["query"] = None, "  "
    pq.write_table(pa.Table.from_pylist(pairs), tmp_path / "pairs.parquet")
    results = {}
    for strategy in ("padded", "packed"):
        report = run_job(
            _job(
                tmp_path / "pairs.parquet",
                tiny_cross_encoder,
                tmp_path / strategy,
                "score",
                input={"text": "query", "text_pair": "message"},
                batching={"strategy": strategy},
            )
        )
        assert report["errors_by_reason"] == {"null_text": 1, "empty_text": 1} and report["rows_ok"] == 118
        results[strategy] = _read(tmp_path / strategy).column("score").to_numpy()
    assert np.abs(results["packed"] - results["padded"]).max() < 1e-5


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "average", "max"])
def test_token_classify_agrees_with_the_pipeline(sms_table, tiny_ner, tmp_path, aggregation):
    from transformers import pipeline

    rows = _texts(sms_table, tmp_path, 60)
    run_job(
        _job(
            tmp_path / "rows.parquet", tiny_ner, tmp_path / "out", "token-classify", output={"aggregation": aggregation}
        )
    )
    ours = _read(tmp_path / "out").column("entities").to_pylist()
    ner = pipeline("token-classification", model=str(tiny_ner), aggregation_strategy=aggregation, device="cpu")
    texts = rows.column("text").to_pylist()
    for text, mine, expected in zip(texts, ours, ner(texts)):
        assert [(e["label"], e["start"], e["end"]) for e in mine] == [
            (e.get("entity_group", e.get("entity")), e["start"], e["end"]) for e in expected
        ]
        assert np.allclose([e["score"] for e in mine], [e["score"] for e in expected], atol=1e-5)
        assert all(e["text"] == text[e["start"] : e["end"]] for e in mine)
    assert sum(len(e) for e in ours) > 0


@pytest.mark.parametrize("multi_label", [False, True])
def test_zero_shot_agrees_with_the_pipeline(sms_table, tiny_nli, tmp_path, multi_label):
    from transformers import pipeline

    labels = ["prize offer", "personal chat", "business"]
    rows = _texts(sms_table, tmp_path, 40)
    report = run_job(
        _job(
            tmp_path / "rows.parquet",
            tiny_nli,
            tmp_path / "out",
            "zero-shot",
            model={"labels": labels, "hypothesis_template": "This message is about {}.", "multi_label": multi_label},
        )
    )
    assert report["rows_ok"] == 40 and report["tokens"] > 0
    ours = _read(tmp_path / "out")
    classifier = pipeline("zero-shot-classification", model=str(tiny_nli), device="cpu")
    for text, label, score, scores in zip(
        rows.column("text").to_pylist(), *(ours.column(c).to_pylist() for c in ("label", "score", "scores"))
    ):
        expected = classifier(
            text, candidate_labels=labels, hypothesis_template="This message is about {}.", multi_label=multi_label
        )
        by_label = dict(zip(expected["labels"], expected["scores"]))
        assert np.allclose(scores, [by_label[name] for name in labels], atol=1e-5)
        assert label == expected["labels"][0] and abs(score - expected["scores"][0]) < 1e-5


@pytest.mark.parametrize(
    "task,fixture,extra",
    [
        ("score", "tiny_cross_encoder", {"input": {"text": "query", "text_pair": "message"}}),
        ("token-classify", "tiny_ner", {}),
        ("zero-shot", "tiny_nli", {"model": {"labels": ["prize offer", "personal chat"]}}),
    ],
)
def test_each_task_resumes_after_a_crash_as_if_uninterrupted(sms_table, tmp_path, request, task, fixture, extra):
    model = request.getfixturevalue(fixture)
    data = tmp_path / "rows.parquet"
    pairs = _pairs(sms_table)
    pq.write_table(pairs.append_column("text", pairs.column("message")), data)
    run_job(_job(data, model, tmp_path / "whole", task, **extra))
    job = _job(data, model, tmp_path / "out", task, **extra)
    with pytest.raises(Crash):
        run_job(job, progress=CrashAfterChunks(1))
    report = run_job(job)
    assert report["complete"] and report["run"]["rows"] == 80
    resumed, whole = _read(tmp_path / "out"), _read(tmp_path / "whole")
    assert (
        resumed.column("pair_id").to_pylist()
        == whole.column("pair_id").to_pylist()
        == pairs.column("pair_id").to_pylist()
    )
    assert resumed.drop(["truncated"]).to_pylist() == whole.drop(["truncated"]).to_pylist()


@pytest.mark.parametrize(
    "task,extra,says",
    [
        ("token-classify", {}, "needs a token-classification head, but .* is a BertModel"),
        ("score", {"input": {"text": "query", "text_pair": "message"}}, "needs a sequence-classification head"),
        ("zero-shot", {"model": {"labels": ["a", "b"]}}, "needs a sequence-classification head"),
    ],
)
def test_a_model_without_the_task_head_is_named(sms_table, tiny_embed, tiny_classify, tmp_path, task, extra, says):
    pq.write_table(_pairs(sms_table).append_column("text", pa.array(["x"] * 120)), tmp_path / "rows.parquet")
    with pytest.raises(ModelError, match=says):
        run_job(_job(tmp_path / "rows.parquet", tiny_embed, tmp_path / "out", task, **extra))
    if task == "zero-shot":  # a classifier whose labels name no entailment is no NLI model
        with pytest.raises(ModelError, match="needs an NLI model, whose labels name entailment"):
            run_job(_job(tmp_path / "rows.parquet", tiny_classify, tmp_path / "out", task, **extra))


@pytest.mark.parametrize("template", ["About {label}.", "About {0} and {1}.", "No slot here.", "About {}}."])
def test_a_hypothesis_template_without_one_plain_slot_is_refused(tiny_nli, tmp_path, template):
    with pytest.raises(ConfigError, match="write one {} where the label goes"):
        _job(
            tmp_path / "rows.parquet",
            tiny_nli,
            tmp_path / "out",
            "zero-shot",
            model={"labels": ["a"], "hypothesis_template": template},
        )


def test_zero_shot_refuses_a_max_length_with_no_room_for_the_text(sms_table, tiny_nli, tmp_path):
    _texts(sms_table, tmp_path)
    job = _job(
        tmp_path / "rows.parquet",
        tiny_nli,
        tmp_path / "out",
        "zero-shot",
        model={"labels": ["a rather long label for a short model"], "max_length": 8},
    )
    with pytest.raises(ModelError, match="max_length 8 leaves no room for the text") as raised:
        run_job(job)
    assert "raise model.max_length above 11" in raised.value.hint
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.parquet"))
