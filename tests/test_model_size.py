"""model_size: a model's class, layers and parameters from its config and weight headers, no weight loaded."""

from __future__ import annotations

import shutil

import pytest
import transformers
from safetensors.torch import load_file

from batchinfer.backends.model_size import describe_size, model_size


@pytest.mark.parametrize("fixture", ["tiny_embed", "tiny_classify", "tiny_llama"])
def test_the_size_is_what_the_folder_holds(request, fixture):
    path = request.getfixturevalue(fixture)
    config = transformers.AutoConfig.from_pretrained(path)
    size = model_size(path)
    weights = sorted(path.glob("*.safetensors"))
    assert size["class"] == config.architectures[0]
    assert size["layers"] == config.num_hidden_layers and size["width"] == config.hidden_size
    assert size["parameters"] == sum(t.numel() for w in weights for t in load_file(w).values())
    assert size["bytes"] == sum(w.stat().st_size for w in weights)


def test_a_pickled_checkpoint_gives_its_bytes_and_the_words_read_well(tiny_embed, tmp_path):
    folder = tmp_path / "pickled"
    shutil.copytree(tiny_embed, folder)
    next(folder.glob("*.safetensors")).rename(folder / "pytorch_model.bin")
    size = model_size(folder)
    assert "parameters" not in size and size["bytes"] == (folder / "pytorch_model.bin").stat().st_size
    assert describe_size(size).endswith(" MB of weights")
    one = {"class": "BertForSequenceClassification", "layers": 1, "width": 384, "parameters": 4_780_418}
    assert describe_size({**one, "bytes": 9_563_548}) == (
        "BertForSequenceClassification, 1 layer of width 384, 4.8M parameters (9.6 MB)"
    )
    assert describe_size({"class": "LlamaForCausalLM", "layers": 30, "parameters": 134_515_008}) == (
        "LlamaForCausalLM, 30 layers, 134.5M parameters"
    )
