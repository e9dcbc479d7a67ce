"""A sentence-transformers model runs every module as SentenceTransformer.encode runs it, on torch and on
OpenVINO, or is refused naming the module. Each model is a tiny BERT saved by sentence-transformers itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_job, read_output, vectors

from batchinfer.backends.models import read_config
from batchinfer.errors import ModelError
from batchinfer.execution.driver import run_job

# name -> (pooling mode, modules after pooling, Transformer settings); each one main ran wrong or refused.
CASES = {
    "max": ("max", [], {}),
    "mean_sqrt_len_tokens": ("mean_sqrt_len_tokens", [], {}),
    "weightedmean": ("weightedmean", ["normalize"], {}),
    "cls_mean_max": (["cls", "mean", "max"], [], {}),
    "cls_dense_tanh": ("cls", ["dense"], {}),
    "lasttoken_dense_gelu_layernorm": ("lasttoken", ["dense_gelu", "layer_norm", "normalize"], {}),
    "mean_dense_residual": ("mean", ["dense_residual"], {}),
    "max_seq_length": ("mean", [], {"max_seq_length": 12}),
    "truncation_left": ("mean", [], {"max_seq_length": 12, "truncation_side": "left"}),
    "do_lower_case": ("mean", [], {"do_lower_case": True}),
    "default_prompt": (
        "cls",
        [],
        {"prompts": {"query": "query: "}, "default_prompt_name": "query"},
    ),  # a cased tokenizer, lowercased as older saves say
}


@pytest.fixture(scope="session")
def texts(sms_table) -> list[str]:
    """Short and long rows (the long ones pass any max_seq_length above)."""
    texts = sms_table.column("text").to_pylist()[:30]
    return [*texts, " ".join(texts[:6]), "Ok lar... Joking wif u oni... " * 8]


@pytest.fixture(scope="session")
def tiny_bert_folder(tmp_path_factory) -> Path:
    from conftest import _save, _tiny_bert
    from transformers import BertModel

    return _save(_tiny_bert(BertModel), tmp_path_factory.mktemp("tiny-bert"))


def _save_sentence_model(base: Path, folder: Path, mode, after: list[str], settings: dict) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import LayerNorm, Pooling

    torch.manual_seed(1)
    transformer = Transformer(str(base), max_seq_length=settings.get("max_seq_length"))
    if "truncation_side" in settings:
        transformer.tokenizer.truncation_side = settings["truncation_side"]
    width = 32 * (len(mode) if isinstance(mode, list) else 1)
    modules = [transformer, Pooling(32, pooling_mode=mode)]
    for name in after:
        if name.startswith("dense"):
            out = width if name == "dense_residual" else 8
            activation = torch.nn.GELU() if name == "dense_gelu" else torch.nn.Tanh()
            modules.append(Dense(width, out, activation_function=activation, use_residual=name == "dense_residual"))
            torch.nn.init.normal_(modules[-1].linear.weight, std=0.5)
            width = out
        elif name == "layer_norm":
            modules.append(LayerNorm(width))
            torch.nn.init.normal_(modules[-1].norm.weight)
            torch.nn.init.normal_(modules[-1].norm.bias)
        else:
            modules.append(Normalize())
    prompts = {key: settings[key] for key in ("prompts", "default_prompt_name") if key in settings}
    SentenceTransformer(modules=modules, device="cpu", **prompts).save(str(folder))
    if settings.get("do_lower_case"):  # sentence-transformers 6 keeps do_lower_case when it reads it, not on save
        _edit_json(folder / "sentence_bert_config.json", do_lower_case=True)
        _edit_json(folder / "tokenizer_config.json", do_lower_case=False)
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        tokenizer["normalizer"]["lowercase"] = False
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def _edit_json(file: Path, **changes) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


@pytest.fixture(scope="session")
def sentence_models(tiny_bert_folder, tmp_path_factory) -> dict[str, Path]:
    """Each case's model, saved once a session."""
    root = tmp_path_factory.mktemp("sentence-models")
    return {name: _save_sentence_model(tiny_bert_folder, root / name, *case) for name, case in CASES.items()}


def _encode(model: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model), device="cpu").encode(texts, batch_size=8, convert_to_numpy=True)


def _run(model: Path, texts: list[str], out: Path, backend: str, **overrides) -> tuple[pa.Table, dict]:
    data = out.parent / f"{out.name}.parquet"
    pq.write_table(pa.table({"sms_id": list(range(len(texts))), "text": texts}), data)
    job = make_job(data, model, out, input__keep=None, model__backend=backend, model__max_length=512, **overrides)
    run_job(job)
    table = read_output(out).sort_by("sms_id")
    return table, json.loads((out / "_report.json").read_text())


def _assert_agree(ours: np.ndarray, theirs: np.ndarray, report: dict) -> None:
    """Within the precision the run reports: f32 to 1e-4 of the vectors' scale; bf16 (a CPU that runs it
    natively, checked against f32 at cosine >= 0.9999 before it ran) per row in direction and length."""
    assert ours.shape == theirs.shape
    if report["batching"].get("precision") != "bf16":
        assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
        return
    norms = np.linalg.norm(ours, axis=1), np.linalg.norm(theirs, axis=1)
    assert ((ours * theirs).sum(1) / norms[0] / norms[1]).min() >= 0.999
    assert np.allclose(norms[0], norms[1], rtol=2e-2)


@pytest.mark.parametrize("backend", ["torch", "openvino"])
@pytest.mark.parametrize("case", list(CASES))
def test_embeddings_are_what_sentence_transformers_encodes(sentence_models, texts, tmp_path, case, backend):
    model = sentence_models[case]
    table, report = _run(model, texts, tmp_path / "out", backend)
    _assert_agree(vectors(table, "embedding"), _encode(model, texts), report)
    if "max_seq_length" in CASES[case][2]:  # cut at the model's 12 tokens, not model.max_length's 128, and flagged
        from transformers import AutoTokenizer

        longer = [len(ids) > 12 for ids in AutoTokenizer.from_pretrained(model)(texts)["input_ids"]]
        assert table.column("truncated").to_pylist() == longer and any(longer)


def _add_cnn(model: Path) -> None:
    modules = json.loads((model / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_CNN", "type": "sentence_transformers.models.CNN"})
    (model / "modules.json").write_text(json.dumps(modules))


def _custom_first(model: Path) -> None:
    modules = json.loads((model / "modules.json").read_text())
    modules[0]["type"] = "sentence_transformers.models.Router"
    (model / "modules.json").write_text(json.dumps(modules))


def _untrusted_activation(model: Path) -> None:
    _edit_json(model / "2_Dense" / "config.json", activation_function="my_package.Swish")


REFUSED = {
    "cnn": ("max", _add_cnn, r"module 2 is sentence_transformers.models.CNN, which batchinfer does not run"),
    "router": ("max", _custom_first, r"module 0 is sentence_transformers.models.Router, which batchinfer does not"),
    "activation": ("cls_dense_tanh", _untrusted_activation, r"activation function my_package.Swish is not a torch"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_module_batchinfer_does_not_run_is_refused_naming_it(sentence_models, tmp_path, case):
    """At start (validate, run: before the output folder is touched), with the module and the fix."""
    from batchinfer.job.config import ModelConfig

    base, edit, message = REFUSED[case]
    model = tmp_path / "model"
    shutil.copytree(sentence_models[base], model)
    edit(model)
    with pytest.raises(ModelError, match=message) as info:
        read_config(ModelConfig(path=str(model), task="embed"), model)
    assert "sentence-transformers" in info.value.hint


def test_the_identity_covers_a_dense_heads_weights_and_the_default_prompt(sentence_models, tmp_path):
    """A resume never mixes vectors of two heads or two prompts (the identity is in the job's fingerprint)."""
    from batchinfer.backends.models import model_identity

    dense, prompted = tmp_path / "dense", tmp_path / "prompted"
    shutil.copytree(sentence_models["cls_dense_tanh"], dense)
    shutil.copytree(sentence_models["default_prompt"], prompted)
    before = model_identity(dense), model_identity(prompted)
    weights = bytearray((dense / "2_Dense" / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (dense / "2_Dense" / "model.safetensors").write_bytes(bytes(weights))
    _edit_json(prompted / "config_sentence_transformers.json", prompts={"query": "passage: "})
    assert model_identity(dense) != before[0] and model_identity(prompted) != before[1]
