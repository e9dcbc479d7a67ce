"""Find a model (folder, hub id, pkg:<module>), identify it, and load it on a device."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import pickle
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError

from ..cache import file_digest
from ..control import library_logs_shown
from ..errors import ConfigError, ModelError
from ..job.config import ModelConfig
from ..job.plan import IDENTITY
from ..job.tasks import model_spec
from ..job.templates import chat_template, no_chat_template
from .folder import TOKENIZER_FILES
from .folder import read_config as read_json
from .sentence_modules import result_files, sentence_model

if TYPE_CHECKING:  # imported where a model loads on it: a warm OpenVINO run never imports torch
    import torch

# Device nodes a GPU's driver makes (NVIDIA, ROCm, WSL's): without one, torch finds no GPU either.
GPU_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


HUB = "hf:"  # model.path hf:namespace/name: the one form that reaches the network (the Hugging Face hub)


def resolve_model_path(spec: str) -> Path:
    """The local folder behind model.path: a folder, pkg:<module>, or hf:<namespace/name>, fetched from the
    Hugging Face hub (or its cache). Only hf: reaches the network: a folder that is not there is an error,
    even when its name could be a hub id (a mistyped models/all-MiniLM-L6-v2 is not a download)."""
    if spec.startswith("pkg:"):
        return _package_model(spec[4:])
    if spec.startswith(HUB):
        return _hub_snapshot(spec[len(HUB) :])
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"model.path {spec} is a file", "point model.path at the folder holding config.json")
        return path.resolve()
    hub = f"; to download the hub model {spec}, write model.path: {HUB}{spec}" if _hub_id(spec) else ""
    raise ConfigError(f"model.path {spec}: no folder at {path.absolute()}", _NO_FOLDER + hub)


_NO_FOLDER = (
    "check model.path: relative paths start at the current directory; a model you train or convert yourself "
    "must be saved there first"
)


def _hub_id(spec: str) -> bool:
    """Whether `spec` reads as a hub model's id: `namespace/name` as huggingface_hub's validate_repo_id allows
    it, and not under a folder that is here (`models/spam-classifier` beside a models/ folder is a path). A
    path starts with . / or ~, or has another number of slashes."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if spec.startswith((".", "/", "~")) or spec.count("/") != 1 or Path(spec).parent.is_dir():
        return False
    try:
        validate_repo_id(spec)
    except HFValidationError:
        return False
    return True


def _package_model(module_name: str) -> Path:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name and not f"{module_name}.".startswith(f"{exc.name}."):  # it is there; what it imports is not
            raise ModelError(
                f"model.path pkg:{module_name}: the package is installed, but importing it failed ({exc})",
                "install what it needs (see the package's own documentation), or give the model folder itself",
            ) from exc
        close = _installed_model_packages(module_name)
        raise ModelError(
            f"model.path pkg:{module_name}: no Python package '{module_name}' is installed",
            f"did you mean {' or '.join(f'pkg:{name}' for name in close)}? (installed, and ships a model)"
            if close
            else "pkg: names an installed package that ships a model folder; install the one you mean as its "
            "documentation says, or give the model folder itself",
        ) from exc
    getter = getattr(module, "get_model_path", None)
    path = Path(getter()) if callable(getter) else Path(module.__file__).parent / "model"
    if not path.is_dir():
        raise ModelError(
            f"package '{module_name}' ships no model folder (looked at {path})",
            "use a package with get_model_path(), or give the folder itself",
        )
    return path.resolve()


def _installed_model_packages(name: str) -> list[str]:
    """Installed top-level modules whose names are close to `name` and that ship a model (a `model` folder or
    a get_model_path function), found without importing them: never a name that is not installed here."""
    close = difflib.get_close_matches(name, importlib.metadata.packages_distributions(), n=5, cutoff=0.6)
    found = []
    for candidate in close:
        try:
            spec = importlib.util.find_spec(candidate)
        except (ImportError, ValueError):
            continue
        folder = Path(next(iter(spec.submodule_search_locations or []), "")) if spec else None
        init = folder / "__init__.py" if folder else None
        if folder and ((folder / "model").is_dir() or (init.is_file() and "def get_model_path" in init.read_text())):
            found.append(candidate)
    return found[:3]


def _hub_snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ConfigError(
            f"model.path {HUB}{repo_id}: {repo_id!r} is not a hub model id ({exc})",
            f"write {HUB}namespace/name, e.g. {HUB}sentence-transformers/all-MiniLM-L6-v2",
        ) from None
    try:
        return Path(
            snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "1_Pooling/*"])
        )
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise ModelError(
            f"model.path {HUB}{repo_id}: the hub model {repo_id} could not be fetched ({type(exc).__name__})",
            f"on an offline machine: download it elsewhere (hf download {repo_id} --local-dir DIR), copy DIR here, "
            "and set model.path to DIR",
        ) from exc


def check_model_folder(path: Path, allow_pickle: bool = False) -> None:
    """Name what is missing and list what is there, before transformers gives a less helpful error."""
    present = sorted(p.name for p in path.iterdir())
    missing = []
    if not (path / "config.json").exists():
        missing.append("config.json")
    pickles = sorted(p.name for p in path.glob("*.bin") if "model" in p.name)
    if not any(path.glob("*.safetensors")):
        if pickles and not allow_pickle:
            raise ModelError(
                f"model folder {path} has only pickle weights ({', '.join(pickles)}), and unpickling can run code",
                "convert them to safetensors (model.save_pretrained(dir)), or set model.allow_pickle: true if you "
                "trust where the model came from",
            )
        if not pickles:
            missing.append("*.safetensors weights")
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        missing.append("tokenizer files (tokenizer.json)")
    if missing:
        raise ModelError(
            f"model folder {path} is incomplete: missing {', '.join(missing)}; "
            f"it holds: {', '.join(present) or 'nothing'}",
            "point model.path at a folder saved with save_pretrained (model and tokenizer), with safetensors weights",
        )


# Small files that change what the model computes: a new tokenizer splits the same text differently.
_RESULT_FILES = (
    "config.json",
    "modules.json",
    "1_Pooling/config.json",
    "sentence_bert_config.json",
    "generation_config.json",
    *TOKENIZER_FILES,
    "chat_template.jinja",
    "chat_template.json",
)


def model_identity(path: Path) -> str:
    """A hash of everything in a model folder that shapes its results — config, tokenizer, generation
    defaults, modeling code and every byte of the weights — so a resumed job can tell the model changed, and
    a conversion cached for it is never served to another. Each weight file's digest is remembered
    (cache.file_digest), so only the first start after a change reads the weights."""
    digest = hashlib.sha256()
    code = sorted(p.name for p in path.glob("*.py"))  # a model's own modeling code (trust_remote_code)
    for name in [*_RESULT_FILES, *code]:
        if (path / name).exists():
            digest.update(name.encode() + (path / name).read_bytes())
    for weights in sorted([*path.glob("*.safetensors"), *path.glob("*model*.bin")]):
        digest.update(f"{weights.name}:{file_digest(weights)}".encode())
    for file in result_files(path):  # a sentence-transformers Dense head's weights, its default prompt
        if (name := file.relative_to(path).as_posix()) not in _RESULT_FILES:
            digest.update(f"{name}:{file_digest(file)}".encode())
    return IDENTITY + digest.hexdigest()[:24]


def check_head(config, cfg: ModelConfig, path: Path) -> None:
    """The model has the head its task needs (read from config.json and, to embed, the sentence-transformers
    modules: no weights are loaded)."""
    task, spec = cfg.task, model_spec(cfg.task, cfg.labels)
    if task == "embed":
        sentence_model(path)  # refuses a module it cannot run
    found = ", ".join(config.architectures or [config.model_type])
    if spec.head and not any(part in a for a in config.architectures or [] for part in spec.head):
        raise ModelError(f"task {task} needs {spec.needs}, but {path} is a {found}", spec.head_fix)
    if task == "zero-shot" and not any(str(label).lower().startswith("entail") for label in config.label2id):
        raise ModelError(
            f"task zero-shot needs an NLI model, whose labels name entailment; {path} has "
            f"{', '.join(map(str, config.label2id)) or 'none'}",
            spec.head_fix,
        )


def position_limit(config) -> int:
    """Longest input the model's position embeddings allow (1 << 30: no limit the config names)."""
    limit = _positions(config) or 1 << 30
    # RoBERTa-family models offset positions by padding_idx + 1.
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        limit -= 2
    return limit


def _positions(config) -> int | None:
    # n_positions: GPT-2's name, which transformers' config maps to max_position_embeddings (not JSON read alone)
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def check_max_length(config, cfg: ModelConfig) -> None:
    """model.max_length, where the job sets it, fits the positions the model reads (a prompt to generate from
    leaves room for one new token). Left unset, it is cut to them (runners/base.py, generate.py)."""
    limit = position_limit(config) - (cfg.task == "generate")
    if "max_length" not in cfg.model_fields_set or cfg.max_length <= limit:
        return
    room = " and one new token" if cfg.task == "generate" else ""
    raise ConfigError(
        f"model.max_length {cfg.max_length} is more than {cfg.path} reads: {limit} tokens "
        f"(config.json: max_position_embeddings {_positions(config)}{room})",
        f"set model.max_length: {limit} or less (or remove it: the default, "
        f"{ModelConfig.model_fields['max_length'].default}, is cut to the model's limit)",
    )


def read_config(cfg: ModelConfig, path: Path):
    """The model's config.json, checked against the task, without loading any weight; read as JSON (importing
    transformers' config classes imports torch) unless the model brings its own config class."""
    check_model_folder(path, cfg.allow_pickle)
    if not cfg.trust_remote_code:
        config = read_json(path)
        check_head(config, cfg, path)
        check_max_length(config, cfg)
        return config
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"cannot read the model config in {path}: {exc}", "check that the folder was saved with save_pretrained"
        ) from exc
    check_head(config, cfg, path)
    check_max_length(config, cfg)
    return config


def checked_model_path(cfg: ModelConfig, messages: str | None) -> Path:
    """model.path resolved, and checked to do the task: a model without the task's head, or a chat job (messages:
    input.messages) whose model has no chat template, fails here, before any row is read or output written."""
    path = resolve_model_path(cfg.path)
    read_config(cfg, path)
    check_chat_template(cfg, path, messages)
    return path


def check_chat_template(cfg: ModelConfig, path: Path, messages: str | None) -> None:
    """Before the output folder is touched: model.chat_template reads and parses, and a job of chat messages
    (input.messages, the column `messages`) or with model.system_prompt has a template to format them, its own or
    the model's (without one, a system prompt would be dropped in silence)."""
    if chat_template(cfg.chat_template) or not (messages or cfg.system_prompt is not None):
        return
    config = path / "tokenizer_config.json"
    inline = config.exists() and json.loads(config.read_text()).get("chat_template")
    if inline or (path / "chat_template.jinja").exists() or (path / "chat_template.json").exists():
        return
    if messages:
        raise ModelError(*no_chat_template(f"input.messages ('{messages}')"))
    raise ModelError(
        f"model.system_prompt: {path} has no chat template to put a system message in (a base model): each row "
        "would go to the model as written, without it",
        "remove model.system_prompt and write the instruction into input.text, or set model.chat_template to a "
        "Jinja template (inline or a .jinja file)",
    )


def quiet_libraries() -> None:
    """No third-party progress bars, warnings or errors in a run's output (continuous batching logs psutil
    notes on every run, at error level); `--debug` shows them."""
    import logging

    import transformers

    transformers.utils.logging.disable_progress_bar()
    if library_logs_shown():
        return
    transformers.utils.logging.set_verbosity_error()
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)


def device_type(name: str) -> str:
    """The kind of device model.device names ("cpu", "cuda", ...), asking torch only where a GPU may be there."""
    if name == "auto" and not any(Path(node).exists() for node in GPU_NODES):
        return "cpu"
    return name.split(":")[0] if name != "auto" else pick_device(name).type


def pick_device(name: str) -> torch.device:
    import torch  # here, not at the top: plan and validate find and identify a model without torch (seconds)

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"model.device is {name}, but no CUDA GPU is visible", "set model.device: cpu (or auto)")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    import torch

    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_model(cfg: ModelConfig, path: Path):
    """(tokenizer, model, device) for the task; raises ModelError with what to do."""
    import torch
    import transformers

    quiet_libraries()
    check_model_folder(path, cfg.allow_pickle)
    use_safetensors = any(path.glob("*.safetensors"))
    if not use_safetensors:
        warnings.warn(
            f"loading pickle weights from {path} (model.allow_pickle: true): unpickling can run code "
            "from the file; convert the model to safetensors when you can",
            stacklevel=2,
        )
    device = pick_device(cfg.device)
    dtype = pick_dtype(cfg.dtype, device)
    with _loading(path):  # a config.json transformers cannot place (no model_type, say) is the folder's fault
        config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    check_head(config, cfg, path)
    auto_class = model_spec(cfg.task, cfg.labels).auto_class
    tokenizer = load_tokenizer(cfg, path)
    with _loading(path):
        # Attention as the model's class defines it by default: sdpa where it has it, else its own (Gemma2's
        # soft-capping and BLOOM's ALiBi have no sdpa path, and transformers refuses sdpa for them).
        model, loaded = getattr(transformers, auto_class).from_pretrained(
            path,
            dtype=dtype,
            use_safetensors=use_safetensors,
            trust_remote_code=cfg.trust_remote_code,
            output_loading_info=True,
        )
    check_weights(loaded["missing_keys"], auto_class, cfg.task, path)
    if cfg.quantize == "int8":
        if device.type != "cpu":
            raise ModelError(
                "model.quantize: int8 is dynamic quantization for CPUs",
                "set model.device: cpu, or remove model.quantize",
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization announces its move to torchao
            # Per-channel weight scales: cosine to fp32 0.965 (mean) on MiniLM, against 0.92 per-tensor.
            qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear: qconfig}, dtype=torch.qint8)
    return tokenizer, model.to(device).eval(), device


def check_weights(missing, auto_class: str, task: str, path: Path) -> None:
    """Refuse a model whose weights files lack tensors the task computes with (transformers' `missing_keys`):
    transformers starts them at random, so results would mean nothing and two runs (or a run and its resume)
    would disagree. A classifier saved without its head, a folder with a layer's tensors missing, a config.json
    naming another architecture than the weights were saved from. To embed (AutoModel), a pooler is not
    computed with (rows are pooled from the hidden states), and checkpoints of masked-LM models have none."""
    needed = sorted(key for key in missing if not (auto_class == "AutoModel" and ".pooler." in f".{key}"))
    if needed:
        more = f" and {len(needed) - 5} more" if len(needed) > 5 else ""
        raise ModelError(
            f"the weights in {path} hold no {', '.join(needed[:5])}{more}, which task {task} computes with: "
            "transformers would start them at random, and every run would give other results",
            "point model.path at the folder the model was saved to whole (save_pretrained), with the head its "
            "task needs; check that config.json's model_type and architectures are the ones the weights were "
            "saved from",
        )


def load_tokenizer(cfg: ModelConfig, path: Path):
    """transformers' fast tokenizer for the model, with model.chat_template in place of its own where set."""
    from transformers import AutoTokenizer

    with _loading(path):
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(
            f"{path} has no fast tokenizer (tokenizer.json)", "save the tokenizer with a tokenizers backend"
        )
    if cfg.chat_template is not None:
        tokenizer.chat_template = chat_template(cfg.chat_template)
    return tokenizer


@contextmanager
def _loading(path: Path):
    """transformers' errors on reading a model folder, as ModelErrors saying what to check."""
    try:
        yield
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, SafetensorError) as exc:
        # RuntimeError: shapes that do not fit the config; the others: missing, truncated or corrupt files
        raise ModelError(
            f"cannot load the model in {path}: {type(exc).__name__}: {exc}",
            "check that the folder was saved whole with save_pretrained (a weights file may be truncated)",
        ) from exc
    except ValueError as exc:  # transformers refuses what the folder asks (a setting, an architecture)
        raise ModelError(
            f"transformers refuses the model in {path}: {exc}",
            "check its config.json against the transformers version installed (pip show transformers)",
        ) from exc
