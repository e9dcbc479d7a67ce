"""task: classify — label, label_id and score per row (scores: every class probability)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from .base import EncoderRunner, fixed_size_list, head_labels, rows_of


class ClassifyRunner(EncoderRunner):
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
        logits = torch.as_tensor(out).float()  # [b, num_labels]
        return list((logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)).cpu().numpy())

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
