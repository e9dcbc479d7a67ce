"""task classify with model.labels: a causal LM scores labels by likelihood, as a direct transformers
computation does, with and without a chat template, shared prompt or repeated, and resumes after a kill."""

import json
import os
import shutil
from functools import partial

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import EXAMPLES, Crash, CrashAfterChunks
from helpers import make_job as _job
from helpers import read_output as _read

from batchinfer.backends import causal_scores
from batchinfer.commands.dryrun import estimate_job
from batchinfer.commands.show import plan_lines
from batchinfer.errors import ConfigError, ModelError
from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job
from batchinfer.output.records import ChunkRecord
from batchinfer.runners import make_runner, prefix

LABELS = ["ham", "spam", "not sure"]


def _prompt_ids(tokenizer, text: str) -> list[int]:
    """A row's whole prompt as transformers tokenizes it: through the chat template where there is one."""
    if tokenizer.chat_template:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return tokenizer.encode(rendered, add_special_tokens=False)
    return tokenizer.encode(text)


def _direct_logprobs(model_path, texts: list[str], labels: list[str]) -> np.ndarray:
    """[rows, labels] sums of the label tokens' log-probabilities, one plain forward per (row, label)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    out = np.zeros((len(texts), len(labels)))
    for i, text in enumerate(texts):
        prompt = _prompt_ids(tokenizer, text)
        for k, label in enumerate(labels):
            ids = tokenizer.encode(label, add_special_tokens=False)
            with torch.no_grad():
                logprobs = model(torch.tensor([prompt + ids])).logits[0].double().log_softmax(-1)
            out[i, k] = sum(logprobs[len(prompt) - 1 + j, t].item() for j, t in enumerate(ids))
    return out


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_llama_plain"])
@pytest.mark.parametrize("prompt", ["shared", "repeated"])
def test_label_scores_equal_a_direct_transformers_computation(sms_parquet, sms_table, tmp_path, request, model, prompt):
    path = request.getfixturevalue(model)
    job = _job(
        sms_parquet,
        path,
        tmp_path / "out",
        task="classify",
        model__labels=LABELS,
        model__label_prompt=prompt,
        output__scores=True,
        batching__chunk_rows=200,
        batching__max_tokens=2048,
    )
    job.input.path = str(sms_parquet / "part-0.parquet")
    run_job(job)
    table = _read(tmp_path / "out")
    texts = sms_table.column("text").to_pylist()[:200]
    picked = np.arange(0, 200, 9)  # 23 rows of every length, compared one by one
    direct = _direct_logprobs(path, [texts[i] for i in picked], LABELS)
    scores = np.array(table.column("scores").to_pylist(), dtype=np.float64)[picked]
    # the softmax of the sums: log-ratios to the first label are the sums' differences
    assert np.allclose(np.log(scores[:, 1:]) - np.log(scores[:, :1]), direct[:, 1:] - direct[:, :1], atol=1e-4)
    expected = np.exp(direct - direct.max(1, keepdims=True))
    assert np.allclose(scores, expected / expected.sum(1, keepdims=True), atol=1e-4)
    assert table.column("label").to_pylist() == [LABELS[i] for i in table.column("label_id").to_pylist()]
    assert [table.column("label").to_pylist()[i] for i in picked] == [LABELS[i] for i in direct.argmax(1)]
    assert np.allclose(table.column("score").to_numpy(), np.array(table.column("scores").to_pylist()).max(1))
    field = pq.read_schema(next((tmp_path / "out").glob("part-*.parquet"))).field("scores")
    assert json.loads(field.metadata[b"labels"]) == LABELS  # the names of the scores, next to them


INSTRUCTION = (
    "Sort each text message into ham, spam or not sure. Ham is a message between friends, family or colleagues; "
    "spam sells something, offers a prize or asks you to call a number.\n\nMessage: {text}\nAnswer:"
)


@pytest.mark.parametrize(
    ("model", "prompt"),
    [("tiny_llama", "shared"), ("tiny_llama_plain", "shared"), ("tiny_llama", "repeated"), ("tiny_gpt2", "shared")],
)
def test_a_shared_instruction_runs_once_and_scores_as_a_direct_computation(
    sms_table, tmp_path, request, monkeypatch, model, prompt
):
    from transformers import AutoTokenizer

    path = request.getfixturevalue(model)
    prefills = []
    prefill = causal_scores.PrefixCache.prefill
    monkeypatch.setattr(
        causal_scores.PrefixCache, "prefill", lambda self, ids: prefills.append(ids) or prefill(self, ids)
    )
    pq.write_table(sms_table.slice(0, 60), tmp_path / "sms.parquet")
    scoring = dict(input__text=INSTRUCTION, model__labels=LABELS, model__label_prompt=prompt, model__max_length=512)
    output = dict(output__scores=True, batching__chunk_rows=30, batching__max_tokens=1024)  # two chunks of batches
    report = run_job(_job(tmp_path / "sms.parquet", path, tmp_path / "out", "classify", **scoring, **output))
    table = _read(tmp_path / "out")
    texts = [INSTRUCTION.format(text=t) for t in sms_table.column("text").to_pylist()[:60]]
    picked = np.arange(0, 60, 7)
    direct = _direct_logprobs(path, [texts[i] for i in picked], LABELS)
    expected = np.exp(direct - direct.max(1, keepdims=True))
    scores = np.array(table.column("scores").to_pylist(), dtype=np.float64)[picked]
    assert np.allclose(scores, expected / expected.sum(1, keepdims=True), atol=1e-4)
    assert table.column("label").to_pylist()[::7] == [LABELS[i] for i in direct.argmax(1)]
    assert report["batching"]["precision"] == "f32"  # what ran is said, on torch as on OpenVINO
    # the prefix: the prompts' common token start (the chat preamble and the instruction), prefilled once for
    # both chunks, never counted in what the batches computed
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [_prompt_ids(tokenizer, t) for t in texts]
    shared = len(os.path.commonprefix(prompts))
    fed = sum(len(tokenizer.encode(label, add_special_tokens=False)) - 1 for label in LABELS)
    per_row = len(LABELS) if prompt == "repeated" else 1
    whole = sum(len(p) * per_row + fed for p in prompts)
    assert shared > len(INSTRUCTION) // 8 and prefills == [tuple(prompts[0][:shared])]
    saved = 60 * per_row * shared
    assert report["prefix"] == {
        "tokens": shared,
        "rows": 60,
        "saved_tokens": saved,
        "saved_share": round(saved / whole, 4),
    }
    assert report["tokens"] == whole - saved
    markers = [json.loads(p.read_text()) for p in sorted((tmp_path / "out" / "_done").glob("*.json"))]
    records = [ChunkRecord.from_marker(marker).prefix for marker in markers]
    assert [{k: v for k, v in r.items() if k != "prompt_tokens"} for r in records] == [
        {"tokens": shared, "rows": 30, "saved_tokens": saved // 2}
    ] * 2
    # each record's prompt tokens in full (computed and saved), the base of the share for either task
    assert sum(r["prompt_tokens"] for r in records) == whole
    halves = (prompts[:30], prompts[30:])  # the markers in chunk order
    assert [r["prompt_tokens"] for r in records] == [sum(len(p) * per_row + fed for p in half) for half in halves]


def test_rows_after_other_prefixes_or_none_share_a_batch(sms_table, tiny_llama, tmp_path, monkeypatch):
    """Serve batches items of several requests: each prefix's items run against its own cache, and a row cut
    from the left (it lost the prefix's start) runs whole, in the same batch."""
    common = dict(task="classify", model__labels=LABELS, model__max_length=256)
    runner = make_runner(_job(tmp_path / "x.parquet", tiny_llama, tmp_path / "out", **common), tiny_llama)
    texts = sms_table.column("text").to_pylist()
    longest = max(texts, key=len)
    first = [INSTRUCTION.format(text=t) for t in [*texts[:5], longest]]
    other = ["Is this message spam? Think it over before you answer.\n\n" + t for t in texts[5:9]]
    a, b = runner.tokenize(first), runner.tokenize(other)
    assert a.prefix.used.tolist() == [True] * 5 + [False] and a.truncated.tolist() == [False] * 5 + [True]
    assert b.prefix.used.all() and b.prefix.tokens != a.prefix.tokens
    together = np.array(runner.run(a.ids + b.ids))
    monkeypatch.setattr(prefix, "MIN_PREFIX_TOKENS", 1 << 30)
    whole = runner.tokenize(first + other)
    assert whole.prefix is None
    assert np.allclose(together, np.array(runner.run(whole.ids)), atol=1e-5)


def test_plan_counts_the_shared_prefix_once(sms_table, tiny_llama, tmp_path):
    pq.write_table(sms_table.slice(0, 80), tmp_path / "sms.parquet")
    common = dict(task="classify", input__text=INSTRUCTION, model__labels=LABELS, model__max_length=512)
    job = _job(tmp_path / "sms.parquet", tiny_llama, tmp_path / "out", batching__chunk_rows=40, **common)
    summary = estimate_job(job, sample=80)
    plan = summary["prefix"]
    assert plan["tokens"] > len(INSTRUCTION) // 8 and plan["rows"] == 80 and plan["saved_share"] > 0.5
    assert summary["tokens"] < 80 * plan["tokens"]  # what the rows compute, the prefix not in it
    assert summary["estimate"]["tokens_per_s"] > 0
    assert any(line.startswith(f"prefix   {plan['tokens']} tokens") for line in plan_lines(job, summary))


def test_length_normalised_scores_divide_each_sum(sms_parquet, sms_table, tiny_llama, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    direct = _direct_logprobs(tiny_llama, sms_table.column("text").to_pylist()[:10], LABELS)
    sizes = {
        "tokens": np.array([len(tokenizer.encode(label, add_special_tokens=False)) for label in LABELS]),
        "chars": np.array([len(label) for label in LABELS]),
    }
    for norm, size in sizes.items():
        job = _job(
            sms_parquet, tiny_llama, tmp_path / norm, task="classify", model__labels=LABELS, model__label_norm=norm
        )
        job.output.scores = True
        job.input.path = str(sms_parquet / "part-0.parquet")
        run_job(job)
        scores = np.array(_read(tmp_path / norm).column("scores").to_pylist(), dtype=np.float64)[:10]
        expected = np.exp(direct / size - (direct / size).max(1, keepdims=True))
        assert np.allclose(scores, expected / expected.sum(1, keepdims=True), atol=1e-4)
    assert sizes["tokens"].tolist() != sizes["chars"].tolist()


def test_resume_after_a_kill_equals_an_uninterrupted_run(sms_parquet, sms_table, tiny_llama, tmp_path):
    common = dict(task="classify", model__labels=LABELS, output__scores=True)
    run_job(_job(sms_parquet, tiny_llama, tmp_path / "whole", **common))
    job = _job(sms_parquet, tiny_llama, tmp_path / "out", **common)
    with pytest.raises(Crash):
        run_job(job, progress=CrashAfterChunks(2))
    report = run_job(job)
    assert report["complete"] and report["run"]["rows"] == 400
    resumed, whole = _read(tmp_path / "out"), _read(tmp_path / "whole")
    assert resumed.column("sms_id").to_pylist() == sms_table.column("sms_id").to_pylist()[:600]
    assert resumed.column("label").to_pylist() == whole.column("label").to_pylist()
    assert np.array_equal(np.array(resumed.column("scores").to_pylist()), np.array(whole.column("scores").to_pylist()))


def test_scores_of_every_task_carry_their_names(sms_parquet, tiny_classify, tiny_nli, tiny_cross_encoder, tmp_path):
    run_job(_job(sms_parquet, tiny_classify, tmp_path / "classify", task="classify", output__scores=True))
    run_job(_job(sms_parquet, tiny_nli, tmp_path / "zero", task="zero-shot", model__labels=["billing", "refund"]))
    pairs = {"path": str(EXAMPLES / "pairs" / "sms-pairs.parquet"), "text": "query", "text_pair": "message"}
    run_job(
        validate_job(
            {
                "input": pairs,
                "model": {"path": str(tiny_cross_encoder), "task": "score"},
                "output": {"path": str(tmp_path / "score"), "scores": True},
            }
        )
    )
    for folder, names in (
        ("classify", ["negative", "neutral", "positive"]),
        ("zero", ["billing", "refund"]),
        ("score", ["LABEL_0"]),
    ):
        field = pq.read_schema(next((tmp_path / folder).glob("part-*.parquet"))).field("scores")
        assert json.loads(field.metadata[b"labels"]) == names


def test_label_scoring_settings_are_checked(sms_parquet, tiny_llama, tiny_classify, tmp_path):
    with pytest.raises(ConfigError, match="model.label_norm: only for model.task: classify with model.labels"):
        _job(sms_parquet, tiny_classify, tmp_path / "a", task="classify", model__label_norm="tokens")
    with pytest.raises(ConfigError, match="model.labels: only for model.task zero-shot"):
        _job(sms_parquet, tiny_llama, tmp_path / "b", task="embed", model__labels=LABELS)
    with pytest.raises(ModelError, match="needs a causal language model"):
        run_job(_job(sms_parquet, tiny_classify, tmp_path / "c", task="classify", model__labels=LABELS))
    with pytest.raises(ModelError, match="needs a sequence-classification head") as caught:
        run_job(_job(sms_parquet, tiny_llama, tmp_path / "d", task="classify"))
    assert "give model.labels" in caught.value.hint
    long = ["ham", "a label of many words, more tokens than max_length"]
    with pytest.raises(ModelError, match="leaves no room for a prompt"):
        run_job(_job(sms_parquet, tiny_llama, tmp_path / "e", task="classify", model__labels=long, model__max_length=8))
    assert (
        validate_job(
            {
                "input": {"path": "x", "text": "text"},
                "model": {"path": "m", "task": "classify", "labels": LABELS, "label_norm": "chars"},
                "output": {"path": "o"},
            }
        ).model.label_norm
        == "chars"
    )


def test_serve_classify_scores_labels_as_the_offline_job(sms_parquet, sms_table, tiny_llama, tmp_path):
    pytest.importorskip("fastapi")
    import asyncio

    import httpx

    from batchinfer.serve import create_app

    job = _job(sms_parquet, tiny_llama, tmp_path / "out", task="classify", model__labels=LABELS)
    job.input.path = str(sms_parquet / "part-0.parquet")
    run_job(job)
    offline = _read(tmp_path / "out")
    texts = sms_table.column("text").to_pylist()[:12]

    async def go():
        app = create_app(job, tiny_llama)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://b", timeout=60) as client:
                return (await client.post("/classify", json={"input": texts})).json()

    answer = asyncio.run(go())
    assert [row["label"] for row in answer["data"]] == offline.column("label").to_pylist()[:12]
    assert np.allclose([row["score"] for row in answer["data"]], offline.column("score").to_numpy()[:12], atol=1e-5)


def test_labels_that_are_no_tokens_or_past_the_models_context_are_refused_with_a_fix_that_works(
    sms_parquet, tiny_llama, tmp_path
):
    """A soft hyphen, a zero-width space or a byte-order mark passes str.strip but is no token: named with
    its index. Labels that alone fill the model's context get no max_length fix above the model's limit."""
    from tokenizers import Tokenizer, normalizers

    cleaning = tmp_path / "cleaning"  # a tokenizer that drops format characters, as BERT's normalizer does
    shutil.copytree(tiny_llama, cleaning)
    tokenizer = Tokenizer.from_file(str(cleaning / "tokenizer.json"))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, lowercase=False)
    tokenizer.save(str(cleaning / "tokenizer.json"))
    invisible = ["ham", "\u00ad", "spam", "\u200b\ufeff"]
    with pytest.raises(ConfigError, match=r"label 1 \('\\xad'\), 3 \('\\u200b\\ufeff'\) is no token"):
        run_job(_job(sms_parquet, cleaning, tmp_path / "a", task="classify", model__labels=invisible))
    job = partial(_job, sms_parquet, tiny_llama, task="classify")
    many = [f"label number {k} of very many" for k in range(400)]  # each 6+ tokens past its first
    with pytest.raises(ModelError, match="and the model reads at most 2048 tokens") as refused:
        run_job(job(tmp_path / "b", model__labels=many, model__max_length=2048))
    assert "raise model.max_length" not in refused.value.hint
    assert "use fewer or shorter labels, or model.label_prompt: repeated" in refused.value.hint
    with pytest.raises(ModelError, match="leaves no room") as refused:
        run_job(job(tmp_path / "c", model__labels=["ham", "a label of many words, more tokens"], model__max_length=8))
    assert "raise model.max_length above" in refused.value.hint and "this model reads up to 2048" in refused.value.hint


# A label-scoring job as the shipped one is, its batching left to the probe.
_instructed = partial(
    _job,
    task="classify",
    input__text=INSTRUCTION,
    model__labels=LABELS,
    model__max_length=512,
    batching__max_tokens="auto",
)


def test_a_300_row_trial_is_not_spent_probing_budgets_that_would_cut_it_alike(sms_parquet, tiny_llama, tmp_path):
    """The shipped job's first chunk is a whole --limit trial: its probe may run at most PROBE_SHARE of the chunk in
    its slices, and slices that small fit one batch of every candidate budget, which would cut them alike. With
    one backend and one strategy (label scoring pads every batch) nothing is left to compare: no row is probed, the
    default is kept, and the record says why."""
    from batchinfer.batching.probe import DEFAULT_BUDGET, PROBE_SHARE

    job = _instructed(sms_parquet, tiny_llama, tmp_path / "out", batching__chunk_rows="auto", batching__strategy="auto")
    report = run_job(job, limit=300)
    probe = report["batching"]["probe"]
    assert report["run"]["rows"] == 300
    assert probe["rows"] == 0 and probe["seconds"] < PROBE_SHARE * report["run"]["seconds"]
    assert probe["max_tokens"] == DEFAULT_BUDGET and probe["strategy"] == "padded" and not probe["tokens_per_s"]
    assert any(f"would fit one batch of every candidate, {DEFAULT_BUDGET} kept" in n for n in probe["notes"])


def test_plan_times_no_more_of_the_sample_than_the_model_runs_in_timed_seconds(
    sms_table, tiny_llama, tmp_path, monkeypatch
):
    """plan times a causal LM's label scoring for TIMED_SECONDS at its warm-up's rate, not TIMED_TOKENS: on a CPU
    that runs it at a few hundred tokens a second 8,192 tokens took minutes. A stand-in budget of a millisecond
    leaves a few tokens, and the estimate still comes from them."""
    from batchinfer.commands import sample_timing

    monkeypatch.setattr(sample_timing, "TIMED_SECONDS", 0.001)
    pq.write_table(sms_table.slice(0, 200), tmp_path / "sms.parquet")
    job = _instructed(tmp_path / "sms.parquet", tiny_llama, tmp_path / "out")
    summary = estimate_job(job, sample=200)
    estimate = summary["estimate"]
    assert 0 < estimate["timed_tokens"] < sample_timing.TIMED_TOKENS // 4
    # ... yet never fewer than MIN_TIMED_ROWS rows: a batch of three ran at a third of a run's rate
    least = summary["tokens_per_row"]["mean"] * sample_timing.MIN_TIMED_ROWS
    assert estimate["timed_tokens"] + estimate["warmup_tokens"] >= 0.8 * least
    assert estimate["tokens_per_s"] > 0 and estimate["seconds"] > estimate["startup_s"]
