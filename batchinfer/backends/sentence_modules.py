"""A sentence-transformers model read from its files (modules.json and each module's config), without torch:
what runs after the encoder (Pooling in every mode, Dense, LayerNorm, Normalize, in the order modules.json
gives) and what its Transformer module says about tokenizing (max_seq_length, do_lower_case). A module
batchinfer does not run as sentence-transformers runs it is refused, naming it. runners/sentence_head.py
runs the steps in torch (and inside a converted OpenVINO graph)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from ..cache import file_digest
from ..errors import ModelError

RUN = ("Transformer", "Pooling", "Dense", "LayerNorm", "Normalize")
# sentence-transformers' order of the legacy pooling_mode_* flags, which is the order of the concatenation.
_LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
MODES = tuple(_LEGACY_MODES.values())
# The Transformer module's settings files, in the order sentence-transformers tries them.
_TRANSFORMER_CONFIGS = [
    f"sentence_{name}_config.json"
    for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
]
# Transformer keys that change nothing here: hub and loading options, and settings read only with a task
# (query or document) that batchinfer never passes.
_NEUTRAL_KEYS = {
    "max_seq_length",
    "do_lower_case",
    "model_args",
    "model_kwargs",
    "config_args",
    "config_kwargs",
    "tokenizer_args",
    "processor_kwargs",
    "backend",
    "unpad_inputs",
    "query_length",
    "document_length",
    "query_expansion",
    "tokenizer_name_or_path",
}
_HUB_KEYS = {"revision", "token", "cache_dir", "local_files_only", "trust_remote_code", "use_fast"}
_SENTENCE = "sentence_embedding"
_SAVE_AGAIN = "save the model again with sentence-transformers 3 or later (SentenceTransformer(path).save(new_folder))"
_REFUSED_FIX = (
    "run the model with sentence-transformers itself, or use one whose modules.json holds only Transformer, "
    "Pooling, Dense, LayerNorm and Normalize"
)


@dataclass(frozen=True)
class Pooling:
    modes: tuple[str, ...] = ("mean",)  # concatenated in this order
    include_prompt: bool = True  # false: the default prompt's tokens are left out (refused: see _prompt)


@dataclass(frozen=True)
class Dense:
    folder: str
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a torch.nn module class, by its import path
    residual: bool


@dataclass(frozen=True)
class LayerNorm:
    folder: str
    dimension: int


@dataclass(frozen=True)
class Normalize:
    pass


Step = Union[Pooling, Dense, LayerNorm, Normalize]


@dataclass(frozen=True)
class SentenceModel:
    """What runs after the encoder, and the Transformer module's tokenizing settings. A folder without
    modules.json is a plain transformers model: mean pooling, as sentence-transformers pools one."""

    steps: tuple[Step, ...] = (Pooling(),)
    max_seq_length: int | None = None  # the model's own cap on tokens per text (None: the positions')
    lower_case: bool = False  # do_lower_case: lowercase before the tokenizer's own normalizer
    prompt: str = ""  # config_sentence_transformers.json's default prompt, put before every text

    def width(self, hidden: int) -> int:
        """The length of a row's vector, from the encoder's hidden size."""
        for step in reversed(self.steps):
            if isinstance(step, Dense):
                return step.out_features
            if isinstance(step, Pooling):
                return hidden * len(step.modes)
        return hidden

    def key(self, path: Path) -> str:
        """What the steps compute, their weights' digests included (a converted graph holds them)."""
        digest = hashlib.sha256(repr(self.steps).encode())
        for step in self.steps:
            if isinstance(step, (Dense, LayerNorm)):
                digest.update(file_digest(weights_of(path, step)).encode())
        return digest.hexdigest()[:16]


def sentence_model(path: Path) -> SentenceModel:
    """The model in `path` as sentence-transformers loads it; ModelError naming a module it cannot run."""
    modules_file = path / "modules.json"
    if not modules_file.exists():
        return SentenceModel()
    modules = _read(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelError(f"{modules_file} is not a list of modules", _SAVE_AGAIN)
    names = [_class_name(m, modules_file) for m in modules]
    first = modules[0] if modules else {}
    if names[:1] != ["Transformer"] or first.get("path", "") != "":
        raise ModelError(
            f"{modules_file}: the first module must be a Transformer saved in the model's own folder, "
            f"not {first.get('type', 'nothing')} in '{first.get('path', '')}'",
            _SAVE_AGAIN + ", which keeps the Transformer in the folder itself",
        )
    max_seq_length, lower_case = _transformer(path)
    steps: list[Step] = []
    for module, name in zip(modules[1:], names[1:]):
        folder = str(module.get("path", ""))
        config = _read(path / folder / "config.json") if (path / folder / "config.json").exists() else {}
        where = f"{modules_file}: module {module.get('name', folder)} ({name}, in '{folder}')"
        try:
            steps.append(_step(name, config, folder, where, after_pooling=bool(steps)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{where}: its config.json lacks or mistypes {exc}", _SAVE_AGAIN) from exc
        if isinstance(steps[-1], (Dense, LayerNorm)) and not weights_of(path, steps[-1]).exists():
            raise ModelError(f"{where} has no model.safetensors", _SAVE_AGAIN)
    if not steps:
        raise ModelError(f"{modules_file} has no Pooling module: it gives no sentence embedding", _REFUSED_FIX)
    if sum(isinstance(step, Pooling) for step in steps) > 1:
        raise ModelError(f"{modules_file} has more than one Pooling module", _REFUSED_FIX)
    return SentenceModel(tuple(steps), max_seq_length, lower_case, _prompt(path, steps[0]))


def _step(name: str, config: dict, folder: str, where: str, after_pooling: bool) -> Step:
    if name == "Pooling":
        return _pooling(config, where)
    if name == "Transformer":
        raise ModelError(f"{where} is a second Transformer", _REFUSED_FIX)
    if not after_pooling:
        raise ModelError(f"{where} comes before the Pooling module, on token embeddings", _REFUSED_FIX)
    if name == "LayerNorm":
        return LayerNorm(folder, int(config["dimension"]))
    _names_sentence(config, where, ("module_input_name", "module_output_name"))
    return _dense(config, folder, where) if name == "Dense" else Normalize()


def result_files(path: Path) -> list[Path]:
    """The sentence-transformers files beside the model's own that shape its results: each module folder's
    config and weights (a Dense head), and config_sentence_transformers.json where it names a default prompt."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        inside = [Path(m["path"]) for m in modules if isinstance(m, dict) and m.get("path")]
        folders = [path / folder for folder in inside if not folder.is_absolute() and ".." not in folder.parts]
        prompts = path / "config_sentence_transformers.json"
        prompted = prompts.exists() and json.loads(prompts.read_text()).get("default_prompt_name") is not None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []
    files = sorted(file for folder in folders if folder.is_dir() for file in folder.iterdir() if file.is_file())
    return [*files, *([prompts] if prompted else [])]


def weights_of(path: Path, step: Dense | LayerNorm) -> Path:
    return path / step.folder / "model.safetensors"


def _class_name(module: dict, modules_file: Path) -> str:
    kind = str(module.get("type", ""))
    name = kind.rsplit(".", 1)[-1]
    if not kind.startswith("sentence_transformers.") or name not in RUN:  # 6.x paths or the older `models`
        raise ModelError(
            f"{modules_file}: module {module.get('name', '?')} is {kind or 'of no type'}, "
            "which batchinfer does not run (it runs Transformer, Pooling, Dense, LayerNorm and Normalize)",
            _REFUSED_FIX,
        )
    return name


def _transformer(path: Path) -> tuple[int | None, bool]:
    """The Transformer module's (max_seq_length, do_lower_case), as sentence-transformers settles them: its
    config's tokenizer model_max_length, else its max_seq_length, else the tokenizer's model_max_length
    capped at the model's positions; sentence-transformers caps no explicit setting at the positions, but
    batchinfer does (position_limit), as a longer text would not run at all."""
    found = next((path / name for name in _TRANSFORMER_CONFIGS if (path / name).exists()), None)
    config = _read(found) if found else {}
    where = f"{found} (sentence-transformers' Transformer module)"
    unknown = sorted(set(config) - _NEUTRAL_KEYS - {"transformer_task", "modality_config", "module_output_name"})
    if config.get("processing_kwargs"):
        unknown.append("processing_kwargs")
    if unknown:
        raise ModelError(f"{where} sets {', '.join(unknown)}, which batchinfer does not apply", _REFUSED_FIX)
    if config.get("transformer_task", "feature-extraction") != "feature-extraction":
        raise ModelError(f"{where}: transformer_task {config['transformer_task']} is not an encoder", _REFUSED_FIX)
    modality = config.get("modality_config", {"text": {"method": "forward", "method_output_name": "last_hidden_state"}})
    if modality != {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}:
        raise ModelError(f"{where}: modality_config {modality} reads more than text", _REFUSED_FIX)
    tokenizer = config.get("processor_kwargs") or config.get("tokenizer_args") or {}
    if not isinstance(tokenizer, dict) or set(tokenizer) - _HUB_KEYS - {"model_max_length"}:
        raise ModelError(f"{where}: tokenizer settings {tokenizer} are not applied by batchinfer", _REFUSED_FIX)
    if tokenizer.get("model_max_length") is not None:
        return int(tokenizer["model_max_length"]), bool(config.get("do_lower_case"))
    if config.get("max_seq_length") is not None:
        return int(config["max_seq_length"]), bool(config.get("do_lower_case"))
    saved = (
        _read(path / "tokenizer_config.json").get("model_max_length")
        if (path / "tokenizer_config.json").exists()
        else None
    )
    positions = (
        _read(path / "config.json").get("max_position_embeddings", -1) if (path / "config.json").exists() else -1
    )
    caps = [int(cap) for cap in (saved, positions) if isinstance(cap, (int, float)) and cap > 0]
    return (min(caps) if caps else None), bool(config.get("do_lower_case"))


def _prompt(path: Path, pooling: Pooling) -> str:
    """The prompt encode() puts before every text: config_sentence_transformers.json's default_prompt_name's."""
    file = path / "config_sentence_transformers.json"
    config = _read(file) if file.exists() else {}
    name = config.get("default_prompt_name")
    if name is None:
        return ""
    prompts = config.get("prompts") or {}
    if name not in prompts:
        raise ModelError(f"{file}: default_prompt_name {name} is not one of its prompts", _SAVE_AGAIN)
    if prompts[name] and not pooling.include_prompt:
        raise ModelError(
            f"{file}: the default prompt is to be left out of pooling (include_prompt: false), "
            "which batchinfer does not do",
            "run the model with sentence-transformers itself",
        )
    return str(prompts[name])


def _pooling(config: dict, where: str) -> Pooling:
    mode = config.get("pooling_mode")
    if mode is None:  # the legacy flags: each one set, in their order; none set is mean
        mode = [name for key, name in _LEGACY_MODES.items() if config.get(key)] or ["mean"]
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    if not modes or any(m not in MODES for m in modes):
        raise ModelError(f"{where}: pooling mode {mode} is not one of {', '.join(MODES)}", _REFUSED_FIX)
    return Pooling(modes, bool(config.get("include_prompt", True)))


def _dense(config: dict, folder: str, where: str) -> Dense:
    activation = str(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if not activation.startswith("torch.nn."):
        raise ModelError(
            f"{where}: activation function {activation} is not a torch.nn module",
            "sentence-transformers itself replaces it by Tanh unless trusted; " + _REFUSED_FIX,
        )
    return Dense(
        folder,
        int(config["in_features"]),
        int(config["out_features"]),
        bool(config.get("bias", True)),
        activation,
        bool(config.get("use_residual", False)),
    )


def _names_sentence(config: dict, where: str, keys: tuple[str, ...]) -> None:
    """A module after pooling reads and writes the sentence embedding; one on another feature is refused."""
    for key in keys:
        if config.get(key) not in (None, _SENTENCE):
            raise ModelError(f"{where}: {key} is {config[key]}, not {_SENTENCE}", _REFUSED_FIX)


def _read(file: Path):
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {file}: {exc}", _SAVE_AGAIN) from exc
