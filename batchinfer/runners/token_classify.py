"""task: token-classify — entities per row (NER, PII), with character offsets into the row's text.

Tokens are classified in length-sorted batches like any task; each row's entities are then made by
transformers' own token-classification pipeline code (gather_pre_entities, aggregate), so every
aggregation strategy groups tokens exactly as `pipeline("token-classification")` does."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa

from .base import EncoderRunner, softmax

ENTITY = pa.struct(
    [("label", pa.string()), ("score", pa.float32()), ("start", pa.int32()), ("end", pa.int32()), ("text", pa.string())]
)


class TokenClassifyRunner(EncoderRunner):
    def __init__(self, tokenizer, backend, device, job, model_path=None):
        from transformers.pipelines.token_classification import AggregationStrategy, TokenClassificationPipeline

        super().__init__(tokenizer, backend, device, job)
        # Only the pipeline's grouping of tokens into entities is used (postprocess), which reads the model's
        # config and the tokenizer alone; built without __init__ so that any backend will do.
        self.pipeline = TokenClassificationPipeline.__new__(TokenClassificationPipeline)
        self.pipeline.model, self.pipeline.tokenizer = backend, tokenizer
        self.aggregation = AggregationStrategy(job.output.aggregation)

    def head(self, out, batch) -> list:
        return [
            out[i, :n] for i, n in enumerate(batch.lengths.tolist())
        ]  # logits [b, L, labels] in; each [tokens, labels]

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        rows = []
        with warnings.catch_warnings():  # the pipeline warns per row when a tokenizer does not mark words
            warnings.simplefilter("ignore")
            for items, text in zip(results, texts.tolist()):
                rows.append(self._entities(items[0], loaded.prepared.texts[text], loaded.tokens.encodings[text]))
        return {"entities": pa.array(rows, pa.list_(ENTITY))}

    def _entities(self, logits: np.ndarray, text: str, encoding) -> list[dict]:
        """A row's entities from its logits [tokens, labels] (float32): the pipeline's postprocess for one chunk,
        on numpy (its own takes torch tensors): softmax, gather_pre_entities, aggregate, "O" left out."""
        pre = self.pipeline.gather_pre_entities(
            text, encoding.ids, softmax(logits), encoding.offsets, encoding.special_tokens_mask, self.aggregation
        )
        grouped = self.pipeline.aggregate(pre, self.aggregation)
        found = [e for e in grouped if "O" not in (e.get("entity"), e.get("entity_group"))]
        return [
            {
                "label": e.get("entity_group", e.get("entity")),
                "score": float(e["score"]),
                "start": int(e["start"]),
                "end": int(e["end"]),
                "text": text[e["start"] : e["end"]],
            }
            for e in found
        ]
