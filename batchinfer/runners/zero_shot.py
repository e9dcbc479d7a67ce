"""task: zero-shot — labels from the job file, scored by an NLI model, as transformers'
zero-shot-classification pipeline scores them.

Every (row, label) pair is one premise-hypothesis item ("This example is {label}."), sorted and batched
by token count with every other item; a row's items come back together for its scores: the entailment
logits softmaxed over the labels, or with model.multi_label each label's entailment against
contradiction on its own."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import ModelError
from .base import EncoderRunner, fixed_size_list, tokens_of
from .protocol import Tokens


class ZeroShotRunner(EncoderRunner):
    pairs = True

    def __init__(self, tokenizer, backend, device, job, model_path=None):
        super().__init__(tokenizer, backend, device, job)
        self.tokenizer.enable_truncation(self.max_length, strategy="only_first")  # never cut the hypothesis
        self.labels = list(job.model.labels)
        self.score_labels = self.labels
        self.hypotheses = [job.model.hypothesis_template.format(label) for label in self.labels]
        self.multi_label = job.model.multi_label or len(self.labels) == 1
        # Counted alone: a pair encoding would fail to truncate, rather than say so.
        specials = self.tokenizer.num_special_tokens_to_add(True)
        longest = specials + max(len(self.tokenizer.encode(h, add_special_tokens=False).ids) for h in self.hypotheses)
        if longest >= self.max_length:
            raise ModelError(
                f"model.max_length {self.max_length} leaves no room for the text beside a hypothesis of {longest} "
                f"tokens ({self.hypotheses[0]!r}, ...)",
                f"raise model.max_length above {longest}, or shorten model.hypothesis_template",
            )
        self.entailment = next(
            i for label, i in backend.config.label2id.items() if str(label).lower().startswith("entail")
        )
        self.contradiction = -1 if self.entailment == 0 else 0

    def tokenize(self, texts: list[str]) -> Tokens:
        pairs = [(text, hypothesis) for text in texts for hypothesis in self.hypotheses]
        owner = np.repeat(np.arange(len(texts)), len(self.labels))
        return tokens_of(self.encode(pairs), owner, pairs=True)

    def head(self, out, batch) -> list:
        return list(out)  # logits in, [b] x [classes] out

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        logits = np.array(results, dtype=np.float32).reshape(
            len(results), len(self.labels), -1
        )  # [rows, labels, classes]
        if self.multi_label:
            pair = logits[..., [self.contradiction, self.entailment]]
            scores = np.exp(pair) / np.exp(pair).sum(-1, keepdims=True)
            scores = scores[..., 1]
        else:
            entail = logits[..., self.entailment]
            scores = np.exp(entail) / np.exp(entail).sum(-1, keepdims=True)
        best = scores.argmax(axis=1) if len(results) else np.zeros(0, dtype=np.int64)
        return {
            "label": pa.array([self.labels[i] for i in best.tolist()], pa.string()),
            "score": pa.array(scores.max(axis=1).astype(np.float32) if len(results) else [], pa.float32()),
            "scores": fixed_size_list(scores.reshape(len(results), len(self.labels))),
        }
