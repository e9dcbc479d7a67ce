"""A model folder read without transformers, for a warm run on OpenVINO (whose graph is cached): the Rust
tokenizer from tokenizer.json and config.json's fields as attributes. Importing transformers' tokenizer and
config classes imports torch, which costs such a run most of its start."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from ..errors import ModelError


def read_tokenizer(path: Path) -> SimpleNamespace:
    """What a runner reads of transformers' fast tokenizer: `backend_tokenizer` (tokenizers.Tokenizer, from
    tokenizer.json) and `pad_token_id` (the pad token tokenizer_config.json or special_tokens_map.json
    names, else tokenizer.json's padding id, else None) and `truncation_side` (tokenizer_config.json's)."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot parse
        raise ModelError(
            f"cannot read {path / 'tokenizer.json'}: {exc}", "save the tokenizer with a tokenizers backend"
        ) from exc
    pad = None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        pad = pad or _json(path / name).get("pad_token")
    if isinstance(pad, dict):  # {"content": "[PAD]", ...}
        pad = pad.get("content")
    pad_id = tokenizer.token_to_id(pad) if isinstance(pad, str) else None
    if pad_id is None and tokenizer.padding:
        pad_id = tokenizer.padding.get("pad_id")
    side = _json(path / "tokenizer_config.json").get("truncation_side", "right")  # transformers' default: right
    return SimpleNamespace(backend_tokenizer=tokenizer, pad_token_id=pad_id, truncation_side=side)


def read_config(path: Path) -> SimpleNamespace:
    """config.json's fields as attributes, with transformers' defaults for those a check reads of any model
    (architectures, model_type, label2id); enough for an embed runner (hidden_size, max_position_embeddings,
    type_vocab_size) and for models.check_head."""
    return SimpleNamespace(**{"architectures": None, "model_type": "", "label2id": {}, **_json(path / "config.json")})


def _json(file: Path) -> dict:
    try:
        found = json.loads(file.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {file}: {exc}", "check that the folder was saved with save_pretrained") from exc
    return found if isinstance(found, dict) else {}
