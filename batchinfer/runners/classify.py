"""task: classify — label, label_id and score per row (scores: every class probability)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .base import EncoderRunner, fixed_size_list, head_labels, rows_of, sigmoid, softmax


class ClassifyRunner(EncoderRunner):
    numpy_head = True

    def __init__(self, tokenizer, backend, device, job, model_path=None):
        super().__init__(tokenizer, backend, device, job)
        config = backend.config
        self.width = config.num_labels
        self.score_labels = head_labels(config)
        self.labels = pa.array(self.score_labels)
        # As transformers' text-classification pipeline: sigmoid for multi-label or single-logit heads.
        self.sigmoid = config.problem_type == "multi_label_classification" or self.width == 1
        self.scores = job.output.scores

    def head(self, out, batch) -> list:
        return list(sigmoid(out) if self.sigmoid else softmax(out))  # logits [b, num_labels] in

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        results = rows_of(results).reshape(len(results), self.width)
        label_id = results.argmax(axis=1).astype(np.int32)
        columns = {
            "label": self.labels.take(pa.array(label_id)),
            "label_id": pa.array(label_id),
            "score": pa.array(results.max(axis=1).astype(np.float32)),
        }
        if self.scores:
            columns["scores"] = fixed_size_list(results)
        return columns
