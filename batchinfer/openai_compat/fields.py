"""Every field of OpenAI's request bodies and what batchinfer does with it: one table, read by OpenAI Batch
files (batch_files.py) and by serve's endpoints (serve/).

A field is implemented (read and honoured), or taken only at a value that changes nothing (its default,
or a field such as user or metadata that never changes an answer). Any other value, and any field the
table does not hold, makes the request an error that names the field, `unsupported: logprobs`: what a
caller asks for is done or refused, never dropped. Chat content given as a list of parts is read when
every part is text. No package imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..messages import message_problem
from ..reasons import Problem, Reason

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
CLASSIFY, SCORE = "/classify", "/score"  # batchinfer's own endpoints (serve)
GENERATE = (CHAT, COMPLETIONS)
OPENAI = (CHAT, COMPLETIONS, EMBEDDINGS)
SURFACES = ("batch", "serve")


def _unset(value) -> bool:
    return value is None


def _any(value) -> bool:
    return True


def _empty(value) -> bool:
    return value is None or value in ([], {})


def _at(*values) -> Callable[[Any], bool]:
    """Null, or one of `values` of the same type (so that logprobs 0 is not taken for false)."""
    return lambda value: value is None or any(type(value) is type(v) and value == v for v in values)


@dataclass(frozen=True)
class Field:
    urls: tuple[str, ...]  # the endpoints whose bodies hold it
    done: tuple[str, ...] = ()  # the surfaces (batch, serve) that implement it
    neutral: Callable[[Any], bool] = _unset  # the values that change nothing, taken everywhere
    lacks: str = ""  # what batchinfer lacks, for the message


FIELDS: dict[str, Field] = {
    # implemented: a batch file's lines are answered by --model whatever they name (a file written for OpenAI
    # names OpenAI's models); serve answers the ids it serves and refuses another (404 model_not_found)
    "model": Field((*OPENAI, CLASSIFY, SCORE), SURFACES, _any),
    "messages": Field((CHAT,), SURFACES),
    "prompt": Field((COMPLETIONS,), SURFACES),
    "input": Field((EMBEDDINGS, CLASSIFY), SURFACES),
    "pairs": Field((SCORE,), ("serve",)),
    "query": Field((SCORE,), ("serve",)),
    "documents": Field((SCORE,), ("serve",)),
    "max_tokens": Field(GENERATE, SURFACES),
    "max_completion_tokens": Field((CHAT,), SURFACES),
    "stop": Field(GENERATE, SURFACES),
    "temperature": Field(GENERATE, SURFACES),
    "top_p": Field(GENERATE, SURFACES),
    "seed": Field(GENERATE, SURFACES),
    "response_format": Field(GENERATE, SURFACES),  # constrained output (constrained/spec.py)
    "stream": Field(GENERATE, ("serve",), _at(False), "a batch file's responses are written whole"),
    "stream_options": Field(GENERATE, ("serve",), _unset, "a batch file's responses are not streamed"),
    "encoding_format": Field((EMBEDDINGS,), ("serve",), _at("float"), "batch output holds lists of floats"),
    # changes nothing
    "user": Field((*OPENAI, CLASSIFY, SCORE), neutral=_any),
    "metadata": Field(OPENAI, neutral=_any),
    "store": Field((CHAT,), neutral=_any),
    "service_tier": Field(GENERATE, neutral=_any),
    "safety_identifier": Field((CHAT,), neutral=_any),
    "prompt_cache_key": Field((CHAT,), neutral=_any),
    "parallel_tool_calls": Field((CHAT,), neutral=_any),  # there are no tools to call
    # not implemented: taken at their default only
    "n": Field(GENERATE, neutral=_at(1), lacks="one completion per request; send one request per completion"),
    "best_of": Field((COMPLETIONS,), neutral=_at(1), lacks="one completion per request"),
    "logprobs": Field(GENERATE, neutral=_at(False), lacks="no log-probabilities are returned"),
    "top_logprobs": Field((CHAT,), neutral=_at(0), lacks="no log-probabilities are returned"),
    "echo": Field((COMPLETIONS,), neutral=_at(False), lacks="the prompt is not echoed"),
    "suffix": Field((COMPLETIONS,), neutral=_at(""), lacks="no text is inserted before a suffix"),
    "presence_penalty": Field(GENERATE, neutral=_at(0, 0.0), lacks="no repetition penalties"),
    "frequency_penalty": Field(GENERATE, neutral=_at(0, 0.0), lacks="no repetition penalties"),
    "logit_bias": Field(GENERATE, neutral=_empty, lacks="no logit biases"),
    "tools": Field((CHAT,), neutral=_empty, lacks="no tool calls"),
    "tool_choice": Field((CHAT,), neutral=_at("none"), lacks="no tool calls"),
    "functions": Field((CHAT,), neutral=_empty, lacks="no function calls"),
    "function_call": Field((CHAT,), neutral=_at("none"), lacks="no function calls"),
    "modalities": Field((CHAT,), neutral=lambda v: v is None or v == ["text"], lacks="text out only"),
    "audio": Field((CHAT,), lacks="text out only"),
    "prediction": Field((CHAT,), lacks="no predicted outputs"),
    "reasoning_effort": Field((CHAT,), lacks="no reasoning settings"),
    "verbosity": Field((CHAT,), lacks="no verbosity setting"),
    "web_search_options": Field((CHAT,), lacks="no web search"),
    "dimensions": Field((EMBEDDINGS,), lacks="embeddings keep the model's size"),
}

# The fields of one chat message besides role and content: what an assistant message an SDK sends back
# holds (taken when empty), and what would change the answer.
MESSAGE_FIELDS: dict[str, Field] = {
    "name": Field((CHAT,), lacks="participant names are not given to the model"),
    "tool_call_id": Field((CHAT,), lacks="no tool calls"),
    "tool_calls": Field((CHAT,), neutral=_empty, lacks="no tool calls"),
    "function_call": Field((CHAT,), lacks="no function calls"),
    "refusal": Field((CHAT,), lacks="no refusals"),
    "audio": Field((CHAT,), lacks="text only"),
    "annotations": Field((CHAT,), neutral=_empty, lacks="no annotations"),
}


def unsupported(url: str, body: dict, surface: str) -> Problem | None:
    """The first field of a request body to `url` that `surface` (batch or serve) neither implements nor
    gets at a value that changes nothing, as (Reason.UNSUPPORTED, "unsupported: NAME (why)"); else None."""
    for name, value in body.items():
        field = FIELDS.get(name)
        if field is None or url not in field.urls:
            known = f"a field of {', '.join(field.urls)}, not of {url}" if field else f"not a field of {url}"
            return _unsupported(f"{name} ({known}); leave it out")
        if surface not in field.done and not field.neutral(value):
            return _unsupported(f"{name} ({field.lacks}); leave it out or give it its default")
    return None


ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # what OpenAI's chat API takes


def chat_messages(messages, where: str, request: bool = True) -> tuple[Any, Problem | None]:
    """Chat messages with each content as text: a list of text parts is joined with newlines (as vLLM
    reads it); another kind of part, or (in an OpenAI `request`) a message field that would change the answer or a
    role OpenAI's API does not take, is refused by name. A job's messages column (not a `request`) keeps its
    messages' other keys and roles, which the model's chat template reads or ignores. Anything else is returned as
    it came, for messages.message_problem to judge."""
    if not isinstance(messages, list):
        return messages, None
    read = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return messages, None
        extra = {k: v for k, v in message.items() if k not in ("role", "content")} if request else {}
        for name, value in extra.items():
            field = MESSAGE_FIELDS.get(name)
            if field is None:
                return messages, _unsupported(f"{where}[{i}].{name} (not a field of a chat message); leave it out")
            if not field.neutral(value):
                return messages, _unsupported(f"{where}[{i}].{name} ({field.lacks}); leave it out")
        role = message.get("role")
        if request and isinstance(role, str) and role not in ROLES:  # the model's template would write it as given
            return messages, (
                Reason.BAD_REQUEST,
                f"{where}[{i}].role: {role!r} is no role of an OpenAI chat message; use one of {', '.join(ROLES)}",
            )
        content = message.get("content")
        if isinstance(content, list):
            content, problem = _text_parts(content, f"{where}[{i}].content", request)
            if problem:
                return messages, problem
        read.append(
            {**message, "content": content} if not request else {"role": message.get("role"), "content": content}
        )
    return read, None


def read_messages(messages, where: str) -> tuple[Any, Problem | None]:
    """A job's chat row (at `where`, its messages column) as the template reads it, each content given as text
    parts joined as an OpenAI request's are, and why it is no chat (messages.message_problem), or None. Parts
    were not_text there, and taken in a batch file's request."""
    read, problem = chat_messages(messages, where, request=False)
    return read, problem or message_problem(read, where)


def _unsupported(what: str) -> Problem:
    return (Reason.UNSUPPORTED, f"unsupported: {what}")


def _text_parts(parts: list, where: str, request: bool = True) -> tuple[str | None, Problem | None]:
    """Text parts joined with newlines. A job's column (not a `request`) read from Parquet gives each part every
    field of the column's struct, None where the part has none ({type: text, text: hi, image_url: None})."""
    texts = []
    for k, part in enumerate(parts):
        if not request and isinstance(part, dict):
            part = {key: value for key, value in part.items() if value is not None}
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            shown = f"of type {kind}" if isinstance(kind, str) else "that is not a {type, text} object"
            return None, _unsupported(f"{where}[{k}] is a content part {shown}; batchinfer reads text parts only")
        if not isinstance(part.get("text"), str):
            return None, (Reason.NOT_TEXT, f"{where}[{k}].text must be text")
        if set(part) - {"type", "text"}:
            name = sorted(set(part) - {"type", "text"})[0]
            return None, _unsupported(f"{where}[{k}].{name} (not a field of a text part); leave it out")
        texts.append(part["text"])
    if not texts:
        return None, (Reason.EMPTY_TEXT, f"{where} holds no part")
    return "\n".join(texts), None
