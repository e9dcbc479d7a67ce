"""task: score — cross-encoders and rerankers on (text, text_pair): a score per pair, as
sentence-transformers' CrossEncoder.predict gives it. Pairs are one item each, so they sort and batch
by their joint token count like any row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .base import EncoderRunner, fixed_size_list, head_labels, rows_of, sigmoid, softmax, tokens_of
from .protocol import Tokens

# CrossEncoder's activation, by the class name its config stores (sentence_transformers.activation_fn).
ACTIVATIONS = {
    "Sigmoid": sigmoid,
    "Identity": lambda x: x,
    "Tanh": np.tanh,
    "Softmax": softmax,
}


class ScoreRunner(EncoderRunner):
    pairs = True
    numpy_head = True
    agreement = "close"

    def __init__(self, tokenizer, backend, device, job, model_path=None):
        super().__init__(tokenizer, backend, device, job)
        self.width = backend.config.num_labels
        self.score_labels = head_labels(backend.config)
        self.activation = activation(backend.config)
        self.scores = job.output.scores

    def tokenize(self, texts: list) -> Tokens:  # (text, text_pair) tuples, cut longest first
        return tokens_of(self.encode(texts), pairs=True)

    def sample_inputs(self) -> list:
        texts = super().sample_inputs()
        return list(zip(texts, texts[1:] + texts[:1]))

    def head(self, out, batch) -> list:
        return list(self.activation(out))  # logits in, [b] x [outputs] out

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        values = rows_of(results).reshape(len(results), self.width)
        columns = {"score": pa.array(values.max(axis=1).astype(np.float32))}  # one output: that output
        if self.scores:
            columns["scores"] = fixed_size_list(values)
        return columns


def activation(config):
    """CrossEncoder's default: the activation the model's config names, else sigmoid for one output and
    none for several."""
    named = (getattr(config, "sentence_transformers", None) or {}).get("activation_fn") or ""
    chosen = ACTIVATIONS.get(named.rsplit(".", 1)[-1])
    if chosen is not None:
        return chosen
    return sigmoid if config.num_labels == 1 else ACTIVATIONS["Identity"]
