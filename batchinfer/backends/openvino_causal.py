"""A causal LM converted for OpenVINO GenAI's ContinuousBatchingPipeline, once per model identity, in the cache
the encoders' conversions share (openvino.py: the same key, lock, staging folder and manifest).

The conversion is OpenVINO's own, on the transformers model as installed: `openvino.convert_model` traces one
decoding step (input_ids, attention_mask, position_ids and each layer's past keys and values → logits and the
present keys and values), then the graph is made stateful as optimum-intel's exporter makes it
(optimum/exporters/openvino/stateful.py): a `beam_idx` input gathers the cache rows, and
`apply_make_stateful_transformation` turns the cache inputs and outputs into state the model keeps. That is the
shape GenAI's pipeline reads: it swaps each ScaledDotProductAttention for paged attention when it loads it. The
tokenizer pair is openvino_tokenizers' conversion of the same transformers tokenizer (the pipeline loads it;
batchinfer tokenizes and decodes with transformers' own, and hands the pipeline token ids).

No exporter package is involved (optimum-intel pins transformers below the installed one and pulls a CUDA torch
through torchvision): only openvino, openvino-tokenizers and the transformers and torch already here.

A warm run (the conversion cached) loads no weights into transformers (`warm`): the runner reads the model's
config and tokenizer as a cold run does, and its generation config as the cold run's model had it (written
beside the conversion); the weights load only if rows go to the transformers engine.
"""

from __future__ import annotations

import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from . import openvino

FORMAT = 2  # bump when what is converted changes
# Architectures traced and checked here (tests/test_openvino_engine.py on a tiny Llama; SmolLM2 in the benchmark):
# a plain growing cache per layer, rotary positions from position_ids, attention through torch's SDPA.
CONVERTIBLE = ("llama", "mistral", "qwen2", "qwen3", "granite", "olmo", "olmo2")


def problem(config) -> str | None:
    """Why OpenVINO GenAI cannot run this model as converted here (what it is), or None."""
    kind = getattr(config, "model_type", None)
    if kind not in CONVERTIBLE:
        return f"the conversion for OpenVINO GenAI is checked on {', '.join(CONVERTIBLE)} models, not {kind}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "a sliding-window attention model (its cache is not one plain cache per layer)"
    return None


def conversion(identity: str) -> dict:
    """What a cached causal-LM conversion is of: the model identity and the library versions (as installed)."""
    from importlib.metadata import version

    return {
        "format": FORMAT,
        "model": identity,
        "class": "AutoModelForCausalLM",
        "for": "openvino_genai",
        "openvino": version("openvino"),
        "openvino_tokenizers": version("openvino-tokenizers"),
        "transformers": version("transformers"),
        "torch": version("torch"),
    }


def warm_entry(cfg, identity: str) -> Path | None:
    """The cached conversion a generate job on the CPU runs from without its weights (warm), or None where it
    is not cached or the job is not one the OpenVINO engine may run in f32 (then the weights are needed)."""
    from .models import device_type

    if device_type(cfg.device) != "cpu" or cfg.quantize != "none" or cfg.dtype not in ("auto", "float32"):
        return None
    return openvino.hit(conversion(identity))


def warm(cfg, path: Path, entry: Path):
    """(tokenizer, model, device) for a generate job whose conversion is cached at `entry` (warm_entry), the
    model a DeferredModel: its config and generation config without its weights."""
    import torch
    import transformers

    from .models import check_head, check_model_folder, load_model, load_tokenizer, quiet_libraries

    quiet_libraries()
    check_model_folder(path, cfg.allow_pickle)
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    check_head(config, cfg, path)
    generation_config = transformers.GenerationConfig.from_pretrained(entry)
    model = DeferredModel(config, generation_config, lambda: load_model(cfg, path)[1])
    return load_tokenizer(cfg, path), model, torch.device("cpu")


class DeferredModel:
    """A causal LM whose weights load when first asked for anything but its config and generation config (a warm
    OpenVINO run needs them only for rows the transformers engine runs). Every other attribute is the loaded
    model's."""

    def __init__(self, config, generation_config, load):
        self.config, self.generation_config = config, generation_config
        self._load = load
        self._model = None

    def __getattr__(self, name: str):  # only for what __init__ did not set
        if name.startswith("__") or name in ("_load", "_model"):  # copy and pickle ask before __init__ ran
            raise AttributeError(name)
        if self._model is None:
            self._model = self._load()
        return getattr(self._model, name)


def converted(identity: str, model_path: Path, f32_model: Callable, tokenizer) -> tuple[Path, dict]:
    """The cache folder holding the model (f32_model(): the float32 transformers causal LM loaded from model_path;
    called on a miss only) and `tokenizer` converted for GenAI, converting them now on a miss; and the seconds that
    took. The conversion is of the float32 weights whatever the job runs in: bf16 is a compile-time hint."""
    return openvino.cached(conversion(identity), lambda folder: _export(f32_model(), tokenizer, model_path, folder))


def _export(model, tokenizer, model_path: Path, folder: Path) -> None:
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on data-dependent branches
        graph = _stateful(model)
        ov.save_model(graph, folder / "openvino_model.xml", compress_to_fp16=False)
        encoder, decoder = convert_tokenizer(tokenizer, with_detokenizer=True)
    ov.save_model(encoder, folder / "openvino_tokenizer.xml")
    ov.save_model(decoder, folder / "openvino_detokenizer.xml")
    shutil.copy(model_path / "config.json", folder / "config.json")
    model.generation_config.save_pretrained(folder)  # as the model has it: what a warm run reads (`warm`)


def _stateful(model):
    """The model's decoding step as a stateful OpenVINO model, with the inputs and outputs GenAI expects."""
    import numpy as np
    import openvino as ov
    import torch
    from openvino import opset13
    from openvino._offline_transformations import apply_make_stateful_transformation

    config = model.config
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    # batch 2, 3 cached tokens, 4 new ones, one padded position: every branch the step takes in general is traced
    batch, past, new = 2, 3, 4
    mask = torch.ones(batch, past + new, dtype=torch.long)
    mask[0, 0] = 0
    example = (
        torch.ones(batch, new, dtype=torch.long),
        mask,
        torch.arange(past, past + new).expand(batch, new),
        *[torch.zeros(batch, heads, past, head_dim) for _ in range(2 * layers)],
    )
    kv = [f"{i}.{part}" for i in range(layers) for part in ("key", "value")]
    inputs = ["input_ids", "attention_mask", "position_ids", *[f"past_key_values.{n}" for n in kv]]
    outputs = ["logits", *[f"present.{n}" for n in kv]]
    with torch.no_grad(), _mask_always_built():
        graph = ov.convert_model(_step(model), example_input=example)
    for port, name in [*zip(graph.inputs, inputs), *zip(graph.outputs, outputs)]:
        port.get_tensor().set_names({name})
    # beam_idx: [batch] rows of the cache each new row continues (fuse_cache_reorder in optimum-intel)
    ids = graph.input("input_ids")
    rows = ov.PartialShape([ids.get_partial_shape()[0]])
    beam_idx = opset13.parameter(name="beam_idx", dtype=ov.Type.i32, shape=rows)
    beam_idx.output(0).get_tensor().add_names({"beam_idx"})
    graph.add_parameters([beam_idx])
    for name in inputs[3:]:
        port = graph.input(name)
        consumers = port.get_target_inputs()
        gathered = opset13.gather(port, beam_idx, opset13.constant(0))
        for consumer in consumers:
            consumer.replace_source_output(gathered.output(0))
    graph.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(graph, dict(zip(inputs[3:], outputs[1:])))
    # each state starts as zeros of [batch, heads, 0, head_dim] (build_state_initializer in optimum-intel)
    batch = opset13.gather(opset13.shape_of(ids, output_type="i64"), opset13.constant([0]), opset13.constant(0))
    for op in graph.get_ops():
        if op.get_type_name() == "ReadValue":
            dims = [d.min_length for d in op.get_output_partial_shape(0)]
            shape = [batch, *[opset13.constant(np.array([d], dtype=np.int64)) for d in dims[1:]]]
            zero = opset13.constant(0.0, dtype=op.get_output_element_type(0))
            op.set_arguments([opset13.broadcast(zero, opset13.concat(shape, axis=0))])
    graph.validate_nodes_and_infer_types()
    return graph


def _step(model):
    """`model`'s decoding step as a torch module (defined here: torch is imported only on a cache miss)."""
    import torch
    from transformers import DynamicCache

    class Step(torch.nn.Module):
        """One decoding step with the cache as flat tensors: (ids, mask, positions, k0, v0, k1, …) → (logits,
        k0, v0, …), the keys and values [batch, heads, positions, head_dim]."""

        def __init__(self):
            super().__init__()
            self.model = model  # a submodule: the tracer takes its weights as parameters

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=self.model.config)
            for i, layer in enumerate(cache.layers):
                # set, not update(): update concatenates to an empty 1-d tensor, which OpenVINO cannot trace
                layer.lazy_initialization(past[2 * i], past[2 * i + 1])
                layer.keys, layer.values = past[2 * i], past[2 * i + 1]
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])

    return Step()


@contextmanager
def _mask_always_built():
    """transformers skips the attention mask where it sees none padded and lets SDPA be causal by itself; traced,
    that choice would be fixed for every input. Build the mask always while tracing (as optimum-intel does)."""
    from transformers import masking_utils

    skip = masking_utils._ignore_causal_mask_sdpa
    masking_utils._ignore_causal_mask_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        masking_utils._ignore_causal_mask_sdpa = skip
