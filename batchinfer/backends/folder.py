"""A model folder read without transformers, for a warm run on OpenVINO (whose graph is cached): config.json's
fields as attributes, and the tokenizer transformers built from the folder on an earlier run, kept beside the
conversion. Importing transformers' tokenizer and config classes imports torch, which costs such a run most of
its start.

The tokenizer is never tokenizer.json read as it is: transformers rebuilds the normalizer, pre-tokenizer and
special tokens of a model's tokenizer class (BertTokenizer, RobertaTokenizer, XLMRobertaTokenizer, ...) from
the class and tokenizer_config.json (do_lower_case, add_prefix_space, tokenize_chinese_chars, extra special
tokens), so a raw read splits text differently. `tokenizer_record` serializes what transformers built, with the
digests of the files it was built from and transformers' version; `read_tokenizer` gives it back only while both
are the same, so the warm tokenizer is the cold one by construction.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

from ..cache import file_digest
from ..errors import ModelError

# The files AutoTokenizer builds a tokenizer from, besides config.json (its class, where these name none).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# What a runner reads of a transformers tokenizer besides its Rust tokenizer: the pad id, and what decides
# truncation and padding.
TOKENIZER_SETTINGS = ("pad_token_id", "model_max_length", "truncation_side", "padding_side")


def tokenizer_record(tokenizer, path: Path) -> dict:
    """transformers' fast tokenizer of the model folder `path`, as JSON: its Rust tokenizer as transformers built
    it, the settings a runner reads, and what it was built from (the files' digests, transformers' version)."""
    return {
        "files": _tokenizer_files(path),
        "transformers": version("transformers"),
        "tokenizer": tokenizer.backend_tokenizer.to_str(),
        "settings": {name: getattr(tokenizer, name, None) for name in TOKENIZER_SETTINGS},
    }


def is_current(record: dict | None, path: Path) -> bool:
    """`record` (tokenizer_record's) was built from the tokenizer files `path` holds now, by this transformers."""
    return (
        isinstance(record, dict)
        and record.get("transformers") == version("transformers")
        and record.get("files") == _tokenizer_files(path)
        and isinstance(record.get("tokenizer"), str)
        and isinstance(record.get("settings"), dict)
    )


def read_tokenizer(record: dict | None, path: Path) -> SimpleNamespace | None:
    """What a runner reads of transformers' fast tokenizer (`backend_tokenizer`, a tokenizers.Tokenizer, and
    TOKENIZER_SETTINGS), from `record` where it is current for `path`; else None (transformers builds it)."""
    from tokenizers import Tokenizer

    if not is_current(record, path):
        return None
    try:
        backend = Tokenizer.from_str(record["tokenizer"])
    except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception for JSON it cannot parse: build it again
        return None
    settings = {name: record["settings"].get(name) for name in TOKENIZER_SETTINGS}
    return SimpleNamespace(backend_tokenizer=backend, **settings)


def _tokenizer_files(path: Path) -> dict[str, str]:
    names = ("config.json", *TOKENIZER_FILES)  # config.json: the tokenizer class, where the others name none
    return {name: file_digest(path / name) for name in names if (path / name).is_file()}


def read_config(path: Path) -> SimpleNamespace:
    """config.json's fields as attributes, with transformers' defaults for those a check reads of any model
    (architectures, model_type, label2id); enough for an embed runner (hidden_size, max_position_embeddings,
    type_vocab_size), for a classify or score runner's head (id2label with int keys and num_labels, as
    transformers' PretrainedConfig makes them; problem_type) and for models.check_head."""
    fields = {
        "architectures": None,
        "model_type": "",
        "label2id": {},
        "problem_type": None,
        **_json(path / "config.json"),
    }
    id2label = {int(i): label for i, label in (fields.get("id2label") or {}).items()}  # JSON's keys are text
    fields["num_labels"] = len(id2label) or fields.get("num_labels", 2)
    fields["id2label"] = id2label or {i: f"LABEL_{i}" for i in range(fields["num_labels"])}
    return SimpleNamespace(**fields)


def _json(file: Path) -> dict:
    try:
        found = json.loads(file.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {file}: {exc}", "check that the folder was saved with save_pretrained") from exc
    return found if isinstance(found, dict) else {}
