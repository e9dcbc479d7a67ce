"""task: embed — one vector per row, as the model's sentence-transformers modules compute it (with
output.format openai, each row's prompt_tokens too). In an OpenAI Batch file a request may give a list of
texts: each is an item of its row, batched with every other item, and the row's vectors come back
together (in the chunk that holds the row, so none is lost or repeated on resume); that job's embedding
column holds a list of vectors per row."""

from __future__ import annotations

import functools
import json
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa

from ..backends.sentence_modules import SentenceModel, sentence_model
from .base import EncoderRunner, fixed_size_list, rows_of, tokens_of
from .protocol import Tokens

if TYPE_CHECKING:  # the modules' torch head runs in the torch backend, inside the graph on OpenVINO: no torch here
    import torch


class EmbedRunner(EncoderRunner):
    agreement = "cosine"
    numpy_head = True

    @classmethod
    def converted_output(cls, model_path: Path) -> tuple[str, Callable | None]:
        # The modules after the encoder run inside the converted graph: [b, width] leaves it instead of
        # [b, L, h] (MiniLM: 10% faster); the key names them and their weights.
        sentence = sentence_model(model_path)
        return f"pooled:{sentence.key(model_path)}", functools.partial(build_head, sentence, model_path)

    def __init__(self, tokenizer, backend, device, job, model_path: Path):
        super().__init__(tokenizer, backend, device, job)
        self.sentence = sentence_model(model_path)
        self.width = self.sentence.width(backend.config.hidden_size)
        # The model's own max_seq_length caps model.max_length (a longer row is cut and flagged truncated).
        self.truncate(min(self.max_length, self.sentence.max_seq_length or self.max_length))
        if self.sentence.lower_case:
            self.tokenizer = lower_cased(self.tokenizer)
        self.usage = job.output.format == "openai"  # OpenAI's embedding answers count each request's tokens
        self.lists = job.input.format == "openai"  # a request's input may be a list of texts

    def tokenize(self, texts: list) -> Tokens:
        prompt = self.sentence.prompt  # the model's default prompt, before each text as encode() puts it
        if not self.lists:
            return tokens_of(self.encode([prompt + text for text in texts]))
        items = [text if isinstance(text, list) else [text] for text in texts]
        owner = np.repeat(np.arange(len(items)), [len(texts) for texts in items])
        return tokens_of(self.encode([prompt + text for text in chain(*items)]), owner)

    def head(self, out, batch) -> list:
        # out: the modules' vectors, [b, width]: computed by build_head on torch, inside the graph on OpenVINO
        return list(out)  # [b] x [width]

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        if self.lists:  # [rows] x [texts] x [hidden]
            vectors = [np.asarray(v, np.float32).reshape(-1) for items in results for v in items]
            flat = fixed_size_list(np.stack(vectors) if vectors else np.zeros((0, self.width), np.float32))
            offsets = np.concatenate([[0], np.cumsum([len(items) for items in results])]).astype(np.int32)
            columns = {"embedding": pa.ListArray.from_arrays(pa.array(offsets), flat)}
        else:
            columns = {"embedding": fixed_size_list(rows_of(results).reshape(len(results), self.width))}
        if self.usage:  # a row's tokens: the sum of its texts'
            tokens = loaded.tokens
            per_row = np.bincount(tokens.owners(), weights=tokens.lengths, minlength=len(loaded.prepared.texts))
            columns["prompt_tokens"] = pa.array(per_row[texts].astype(np.int32), pa.int32())
        return columns


def build_head(sentence: SentenceModel, path: Path, device: str = "cpu") -> torch.nn.Module:
    """The torch module of (hidden [b, L, h], mask [b, L]) → [b, width] that the model's sentence-transformers
    modules make of the encoder's output."""
    from .sentence_head import sentence_head

    return sentence_head(sentence, path, device)


def lower_cased(tokenizer):
    """A copy of the Rust `tokenizer` that lowercases before its own normalizer, as sentence-transformers does
    for do_lower_case (its truncation settings kept)."""
    from tokenizers import Tokenizer

    state = json.loads(tokenizer.to_str())
    own = state.get("normalizer")
    if not own or own.get("type") != "Lowercase":
        state["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Lowercase"}, *([own] if own else [])]}
    return Tokenizer.from_str(json.dumps(state))
