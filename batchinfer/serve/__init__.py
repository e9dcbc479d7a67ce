"""`batchinfer serve`: the job's runners behind HTTP, with online batching (pip install -e ".[serve]").

    POST /v1/embeddings        task embed     OpenAI's shape: {input: str | [str], encoding_format}
    POST /classify             task classify  {input: str | [str]} -> {data: [{label, label_id, score}]}
    POST /score                task score     {pairs: [[text, text_pair], ...]} or {query, documents}
    POST /v1/completions       task generate  OpenAI's shape, stream: true for server-sent events
    POST /v1/chat/completions  task generate  OpenAI's shape, stream: true for server-sent events
    GET  /health, /metrics     status, and Prometheus text (requests, rows, tokens, batches, waits, latency)

Encoder rows go through the Batcher (batcher.py); generation requests join the continuous-batching
engine's running batch at its next step. Results are the same as `batchinfer run` gives for the same
rows: the same runner, tokenizer and model.

Memory is spent only on what may run: a body past serve.max_body_bytes is answered 413 unread, a
request is held against the queue's bound before it is tokenized, texts are cut at a character bound
before tokenizing (runners.base.encode_capped), and memory freed after an answer goes back to the
system once it has piled up (heap.HeapGuard).

    routes.py       the app: each route checks its body, calls its service once, shapes the answer
    bodies.py       request bodies (pydantic) and their checks: a bad one is one 400 naming the problem
    services.py     the runner-backed services: encoder rows through the Batcher, prompts into the engine
    completions.py  completion answers, whole or as server-sent events
    batcher.py      online batching of encoder rows: one bounded queue, windows cut into batches
    latency.py      serve.p99_ms: batch budget and admission from measured latencies (pure)
    failures.py     what a request fails with, and the status and body each is answered with
    guard.py        the body-size bound and the memory hand-back around the app
    metrics.py      Prometheus metrics
OpenAI's response shapes are ../openai_compat/shapes.py, shared with OpenAI Batch output files.
"""

from .bodies import BadInput
from .routes import SERVED, create_app

__all__ = ["SERVED", "BadInput", "create_app"]
