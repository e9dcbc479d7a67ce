"""How big a model is, from its config and its weight files' headers, without loading a weight: what `plan`
and a run's summary say, so a throughput figure is read against the model that gave it."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")


def model_size(path: Path) -> dict:
    """{"class", "layers", "width", "parameters", "bytes"} of the model folder `path`; a figure the folder does
    not tell is left out. Read as JSON, not through transformers, which imports torch (seconds that plan of a
    finished job and a run's summary need not spend). parameters: counted from the safetensors headers (a
    pickled checkpoint gives its bytes only)."""
    config = _read_json(path / "config.json")
    size: dict = {"class": (config.get("architectures") or [config.get("model_type", "model")])[0]}
    for name, keys in (("layers", _LAYER_KEYS), ("width", _WIDTH_KEYS)):
        value = next((config[k] for k in keys if isinstance(config.get(k), int)), None)
        if value is not None:
            size[name] = value
    weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    if weights:
        size["bytes"] = sum(p.stat().st_size for p in weights)
    counted = [_safetensors_parameters(p) for p in weights if p.suffix == ".safetensors"]
    if counted and None not in counted:
        size["parameters"] = sum(counted)
    return size


def describe_size(size: dict) -> str:
    """'BertForSequenceClassification, 1 layer of width 384, 3.2M parameters (6.4 MB)'."""
    words = [size["class"]]
    if "layers" in size:
        words.append(f"{size['layers']} layer{'s' * (size['layers'] != 1)}" + _of_width(size))
    if "parameters" in size:
        weights = f" ({_mb(size['bytes'])})" if "bytes" in size else ""
        words.append(f"{_count(size['parameters'])} parameters{weights}")
    elif "bytes" in size:
        words.append(f"{_mb(size['bytes'])} of weights")
    return ", ".join(words)


def _of_width(size: dict) -> str:
    return f" of width {size['width']}" if "width" in size else ""


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def _mb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # the model's loader names what is wrong with its config
    return found if isinstance(found, dict) else {}


def _safetensors_parameters(path: Path) -> int | None:
    """The number of values in a safetensors file, from its JSON header (8-byte length, then the header)."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return None
    return sum(math.prod(entry.get("shape", [])) for name, entry in header.items() if name != "__metadata__")
