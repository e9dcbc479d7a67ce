"""OpenAI's response bodies, written once: serve's answers (serve/) and the lines of an OpenAI Batch output
file (batch_files.py) are built here. (What batchinfer does with each request field is fields.py.)

Completions (`text_completion`), chat completions (`chat.completion`, streamed as `chat.completion.chunk`),
embedding lists and model objects, as https://platform.openai.com/docs/api-reference gives them; `logprobs` is always
null, as batchinfer returns none. No package imports.
"""

from __future__ import annotations


def usage(prompt: int, completion: int | None = None) -> dict:
    """Token counts; an embedding's have no completion."""
    if completion is None:
        return {"prompt_tokens": prompt, "total_tokens": prompt}
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def embedding_list(vectors: list, model: str, prompt_tokens: int) -> dict:
    """An embeddings answer: one `embedding` object per input, in order (vectors as lists, or base64 text)."""
    data = [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model, "usage": usage(prompt_tokens)}


def choice(chat: bool, text: str, finish_reason: str | None, delta: bool = False, first: bool = False, index: int = 0):
    """A completion's choice `index`: the assistant's message (chat; a streamed chunk's `delta`, which says
    the role in the stream's first chunk) or its text. finish_reason: stop | length, or None while a stream
    goes on."""
    if chat and delta:
        piece = {"delta": {"role": "assistant", "content": text} if first else {"content": text}}
    elif chat:
        piece = {"message": {"role": "assistant", "content": text}}
    else:
        piece = {"text": text}
    return {"index": index, **piece, "logprobs": None, "finish_reason": finish_reason}


def completion(chat: bool, key: str, created: int, model: str, choices: list, chunk: bool = False) -> dict:
    """A completion (or one streamed chunk of it) without its usage. key: what makes its id unique."""
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{key}",
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
    }


def model_object(model: str, created: int) -> dict:
    """A model as /v1/models lists it. created: when the server loaded it, in seconds since 1970."""
    return {"id": model, "object": "model", "created": created, "owned_by": "batchinfer"}
