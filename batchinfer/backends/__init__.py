"""Backends: the kernels below an encoder task. torch (CPU and CUDA; packed batches) loads through
models.load_model; OpenVINO (CPU) converts that model once per model identity (openvino.py).

A loaded backend is a `Backend` (base.py: forward on a Batch, whether it packs, its precisions; torch.py,
openvino.py; LOADERS registers more). `candidates` says which backends a job may run on here, the default first;
`precisions` which inference precisions a backend may use, the default first; `load_encoders` loads them. Which
one runs is settled by the probe on the first chunk (runners/base.py) and recorded in the output folder like the
batching choice.

A warm run on OpenVINO alone of a runner whose head reads numpy (embed: pooled inside the graph) imports
neither torch nor transformers: the config comes from config.json, the tokenizer transformers built on the first
run and the graph from the cache (folder.py, openvino.py). torch and transformers' modeling code are most of a
start's seconds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from ..batching.budget import ProbeChoice
from ..errors import ConfigError, ModelError, ResumeError
from ..job.config import ModelConfig
from ..machine import load_so_far
from . import folder, openvino
from .base import Backend

# Backends beyond the two built in, by name: a loader (model config, model folder, output) -> (tokenizer, Backend,
# device), where output is what the runner's task reads (runners/base.py converted_output). A new backend's module
# defines its Backend class and loader, and its name goes here and into model.backend's choices (job/config.py);
# candidates offers it where model.backend names it, and load_encoders calls its loader (tests/test_backend_interface.py
# runs a whole job on a fake one registered so).
LOADERS: dict[str, Callable[[ModelConfig, Path, tuple[str, Callable | None]], tuple[object, Backend, object]]] = {}


def candidates(cfg: ModelConfig, device: str, packed: bool = False) -> list[str]:
    """The backends this job may run on, on this machine (device: its type, models.device_type), the default
    first; packed: batching.strategy is pinned to packed, a torch path."""
    if cfg.backend in LOADERS:
        return [cfg.backend]
    if cfg.backend == "torch":
        return ["torch"]
    problem = openvino_problem(cfg, device) or (
        ("runs padded batches only", "set batching.strategy: padded (or auto), or model.backend: torch")
        if packed
        else None
    )
    if cfg.backend == "openvino":
        if problem:
            raise ConfigError(f"model.backend: openvino {problem[0]}", problem[1])
        return ["openvino"]
    return ["torch"] if problem else ["openvino", "torch"]


def openvino_problem(cfg: ModelConfig, device: str) -> tuple[str, str] | None:
    """Why this job cannot run on OpenVINO here (what, and the fix), or None."""
    if cfg.task == "generate":
        return "runs encoder tasks, not generate", "remove model.backend (auto), or set it to torch"
    if cfg.task == "classify" and cfg.labels:
        return "runs encoder models, not a causal LM scoring labels", "remove model.backend (auto), or set it to torch"
    if device != "cpu":
        return f"runs on the CPU, but model.device is {device}", "set model.device: cpu, or model.backend: torch"
    if cfg.quantize != "none":
        return "does not run model.quantize: int8 (a torch path)", "remove model.quantize, or set model.backend: torch"
    if not openvino.available():
        return "needs the openvino package", 'pip install -e ".[cpu]" (or pip install openvino)'
    return None


def precisions(cfg: ModelConfig, backend: str) -> list[str]:
    """The inference precisions `backend` may use, the default first; torch: the dtype it loads the model in.

    dtype auto on OpenVINO: bf16 first on a CPU that runs it natively, checked against f32 on a sample."""
    if backend != "openvino":
        from .models import device_type

        return [torch_precision(cfg.dtype, device_type(cfg.device))]
    if cfg.dtype != "auto":
        return [openvino.PRECISIONS[cfg.dtype]]
    return ["bf16", "f32"] if openvino.bf16_supported() else ["f32"]


def torch_precision(dtype: str, device: str) -> str:
    """The precision torch runs a model in (models.pick_dtype's choice for model.dtype `dtype` on `device`), by
    name: f32, bf16 or f16. Asks torch only on a GPU."""
    if dtype != "auto":
        return openvino.PRECISIONS[dtype]
    if device != "cuda":
        return "f32"
    import torch

    return "bf16" if torch.cuda.is_bf16_supported() else "f16"


def precision_note(cfg: ModelConfig, backend: str | None, precision: str | None) -> str | None:
    """Why an OpenVINO job with dtype auto runs f32 without a bf16 check (for the report), or None."""
    if backend != "openvino" or cfg.dtype != "auto" or precision != "f32" or len(precisions(cfg, backend)) > 1:
        return None
    return f"f32: {why_no_bf16()}" + (", so bf16 was not tried" if openvino.bf16_turned_off() else "")


def why_no_bf16() -> str:
    """Why OpenVINO does not offer bf16 here (bf16_supported is false)."""
    if openvino.bf16_turned_off():
        return "BATCHINFER_NO_BF16 is set"
    return "this CPU has no native bf16 (avx512_bf16 or AMX), as OpenVINO reports it"


def refuse_a_mixed_resume(job, recorded: ProbeChoice | None) -> None:
    """Refuse to go on, in another precision, with a job whose first chunks ran in bf16 (`recorded`: the probe's
    choice in the output folder) where this run cannot take bf16: on a CPU without native bf16, under
    BATCHINFER_NO_BF16, or with model.backend moved off OpenVINO. A resume never mixes two precisions' results."""
    from .models import device_type

    if recorded is None or recorded.precision in (None, "f32"):
        return
    backend, precision = recorded.backend, recorded.precision
    names = candidates(job.model, device_type(job.model.device), job.batching.strategy == "packed")
    if backend in names and precision in precisions(job.model, backend):
        return
    why = f"model.backend is {job.model.backend}" if backend not in names else why_no_bf16()
    raise ResumeError(
        f"the output folder's first chunks ran on {backend} in {precision} (its _batchinfer.json says so), and "
        f"this run cannot ({why}); a resume never mixes the results of two precisions",
        "resume it on a CPU with native bf16 (lscpu | grep -o 'avx512_bf16\\|amx_bf16' names it), without "
        "BATCHINFER_NO_BF16 and with model.backend auto or openvino; or run it again whole with --restart",
    )


def backend_is_open(job) -> bool:
    """Whether the probe has a backend or a precision to choose for this job on this machine."""
    from .models import device_type

    names = candidates(job.model, device_type(job.model.device), job.batching.strategy == "packed")
    return len(names) > 1 or any(len(precisions(job.model, name)) > 1 for name in names)


def load_encoders(
    cfg: ModelConfig,
    path: Path,
    names: list[str],
    auto_class: str,
    pairs: bool,
    output: tuple[str, Callable | None],
    numpy_head: bool = False,
):
    """(tokenizer, {name: Backend}, device, load) with the backends of `names` loaded; load: the seconds that
    loading, converting and compiling took (the report's start-up figures) and notes. output: what the converted
    model returns (runners/base.py converted_output).

    Where one backend ran this model at CLEAR_WIN times the other's speed on this CPU before, the other is not
    loaded: the probe would only confirm it, at the cost of loading torch (its modeling code and the weights)
    or compiling the OpenVINO model.
    Under model.backend auto, an OpenVINO model that cannot be had (its cache unreadable, unwritable or full; a
    precision it cannot compile) leaves torch to run the job, with a note that says why.
    numpy_head: the runner's head reads numpy, so OpenVINO alone runs without torch; its config is then read from
    config.json, and its tokenizer is the one transformers built on an earlier run, kept beside the conversion
    (folder.py), where the folder has tokenizer.json and no code of its own."""
    from .models import load_model, model_identity, pick_device

    if names[0] in LOADERS:
        return _load_registered(cfg, path, names[0], output)
    t0 = time.perf_counter()
    models, load = {}, {}
    tokenizer = torch_model = of = None
    plain = numpy_head and not cfg.trust_remote_code and (path / "tokenizer.json").exists()
    if "openvino" in names:
        config, plain = _openvino_config(cfg, path, plain)
        of = openvino.conversion(model_identity(path), auto_class, output[0], _input_names(auto_class, config, pairs))
        names, of = _known_faster(names, of, load)
    if "torch" in names:
        tokenizer, torch_model, device = load_model(cfg, path)
        models["torch"] = torch_model
        load["torch_load"] = round(time.perf_counter() - t0, 3)
    else:
        # The CPU (candidates); named without torch where the runner's head needs none.
        device = openvino.OpenVINOBackend.device if plain else pick_device(cfg.device)
    if of is not None:

        def f32_model():  # only on a cache miss: the weights the conversion reads
            import torch

            if torch_model is not None and torch_model.dtype == torch.float32:
                return torch_model
            return load_model(cfg.model_copy(update={"dtype": "float32"}), path)[1]

        converted = _openvino_model(cfg, config, of, (f32_model, output[1]), load)
        if converted is None:
            names = ["torch"]
            if torch_model is None:
                tokenizer, models["torch"], device = load_model(cfg, path)
        else:
            models["openvino"] = converted
        tokenizer = _tokenizer(cfg, path, converted if plain else None, tokenizer)
    load["load"] = round(time.perf_counter() - t0, 3)
    backends = {name: _torch(models[name], device, output) if name == "torch" else models[name] for name in names}
    return tokenizer, backends, device, load


def _torch(model, device, output: tuple[str, Callable | None]) -> Backend:
    from .torch import TorchBackend  # torch: imported where it runs (a warm OpenVINO start does without)

    return TorchBackend(model, device, output)


def _load_registered(cfg: ModelConfig, path: Path, name: str, output: tuple[str, Callable | None]):
    """load_encoders' answer for a backend of LOADERS."""
    t0 = time.perf_counter()
    tokenizer, backend, device = LOADERS[name](cfg, path, output)
    return tokenizer, {backend.name: backend}, device, {"load": round(time.perf_counter() - t0, 3)}


def _openvino_config(cfg: ModelConfig, path: Path, plain: bool) -> tuple[object, bool]:
    """The model's config for its conversion, and whether it was read as JSON alone (plain: the runner's head
    reads numpy and the folder's files suffice) rather than through transformers."""
    config = folder.read_config(path) if plain else None
    if hasattr(config, "hidden_size"):
        return config, plain
    # none read, or a width transformers maps from another name
    import transformers

    return transformers.AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code), False


def _known_faster(names: list[str], of: dict, load: dict) -> tuple[list[str], dict | None]:
    """The backends to load and the conversion to load (None: none) where one backend ran this model at
    CLEAR_WIN times the other's speed on this CPU before, under a load comparable to this run's and within
    openvino.MAX_AGE: that one alone, with a note in `load` saying why and under what load it was measured; else
    both, with a note saying why a kept choice is timed again."""
    if "torch" not in names:
        return names, of
    known, note = openvino.known_faster(of, load_so_far())
    if not known:
        if note:
            load["note"] = note
        return names, of
    winner, times = known
    faster, slower = ("OpenVINO", "torch") if winner == "openvino" else ("torch", "OpenVINO")
    load["note"] = f"{slower} not loaded: {faster} ran this model at {times:.1f}x its speed on this CPU before ({note})"
    return [winner], of if winner == "openvino" else None


def _openvino_model(cfg: ModelConfig, config, of: dict, torch_model: tuple[Callable, Callable | None], load: dict):
    """The conversion `of` compiled (openvino.load; torch_model: the model's loader and the head), its seconds in
    `load`; None under model.backend auto where it cannot be had, with a note in `load` saying why."""
    try:
        model = openvino.load(config, of, precisions(cfg, "openvino"), *torch_model)
    except ModelError as exc:
        if cfg.backend != "auto":
            raise
        load["note"] = f"OpenVINO not used, torch runs the job: {exc.message} ({exc.hint})"
        return None
    load.update(model.seconds, conversion_check=model.check)
    return model


def _tokenizer(cfg: ModelConfig, path: Path, converted: openvino.OpenVINOBackend | None, tokenizer):
    """The run's tokenizer: transformers' (`tokenizer`, loaded with torch, or built now), or the one kept beside
    `converted` (an OpenVINO model a warm run may use) where it is current, so a warm run tokenizes as a cold
    one by construction; transformers' is kept there for the next warm run."""
    saved = openvino.saved_tokenizer(converted) if converted else None
    if tokenizer is None:
        tokenizer = folder.read_tokenizer(saved, path) or _transformers_tokenizer(cfg, path)
    if converted and not folder.is_current(saved, path):
        openvino.save_tokenizer(converted, folder.tokenizer_record(tokenizer, path))
    return tokenizer


def _transformers_tokenizer(cfg: ModelConfig, path: Path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)


def _input_names(auto_class: str, config, pairs: bool) -> tuple[str, ...]:
    """ids and mask, and token type ids where the task sends pairs and the model has a token type
    embedding (single texts get zeros inside the graph, as transformers fills them in)."""
    takes_types = pairs and getattr(config, "type_vocab_size", 0) > 1
    return ("input_ids", "attention_mask", *(("token_type_ids",) if takes_types else ()))
