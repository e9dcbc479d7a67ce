"""The OpenAI request bodies as pydantic models, one per url, checked against the ranges OpenAI documents
(https://platform.openai.com/docs/api-reference/chat/create): OpenAI Batch lines (batch_files.py) and
serve's bodies (serve/bodies.py) are both read by them, as vLLM's run_batch reads lines with its HTTP
models, so both refuse the same values in the same words, `temperature: must be a number from 0 to 2 (got
5)`, and cap a list of texts at the same MAX_INPUTS. The fields they do not declare are judged by
fields.FIELDS (done, or refused by name).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict
from pydantic_core import PydanticCustomError

from ..errors import shorten
from .fields import CHAT, COMPLETIONS, EMBEDDINGS

INT64 = 1 << 63  # a seed or a count is stored in an int64 column
# A seed every engine takes as it is: OpenVINO GenAI's rng_seed is unsigned (size_t: a negative seed is its
# TypeError), torch's manual_seed takes -2**63 to 2**64-1, and the column holds no more than an int64.
SEED = (0, INT64 - 1)
MAX_INPUTS = 2048  # the texts (or prompts) one request may hold, as OpenAI caps an embeddings input


def _range(low: float, high: float | None = None, low_open: bool = False, kind: str = "a number") -> AfterValidator:
    """A finite value from `low` (excluded when low_open) to `high`; an error that says the whole range."""
    if low_open:
        bounds = f"above {low}" + (f" and at most {high}" if high is not None else "")
    else:
        bounds = f"at least {low}" if high is None else f"from {low} to {high}"
    allowed = f"{kind} {bounds}"

    def check(value):
        if value is None:
            return value
        finite = not isinstance(value, float) or math.isfinite(value)  # an int may be past any float: no float()
        if not (finite and (value > low if low_open else value >= low) and (high is None or value <= high)):
            raise PydanticCustomError("out_of_range", "must be {allowed}", {"allowed": allowed})
        return value

    return AfterValidator(check)


def _stops(value) -> list[str] | None:
    """stop: a string or a list of strings, read as a list (null: none given)."""
    if value is None or isinstance(value, str):
        return None if value is None else [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise PydanticCustomError("stop_type", "must be a string or a list of strings")


Count = Annotated[int | None, _range(1, INT64 - 1, kind="a whole number")]  # past the context: cut to it


def _no_token_ids(value):
    """OpenAI also takes token ids (a list of integers, or a list of such lists) where text goes; batchinfer
    tokenizes with the model's own tokenizer, so it takes text only."""
    if _int_list(value) or (isinstance(value, list) and value and all(map(_int_list, value))):
        raise PydanticCustomError(
            "token_ids", "token-id lists are not accepted; send the text itself, a string or a list of strings"
        )
    if not isinstance(value, (str, list)):
        raise PydanticCustomError("text_type", "must be a text or a list of texts, not {kind}", {"kind": _kind(value)})
    return value


def _kind(value) -> str:
    return {bool: "true or false", int: "a number", float: "a number", dict: "an object"}.get(type(value), "null")


def _int_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(map(_is_int, value))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _texts_count(value):
    """A list of texts is one request: at least one, at most MAX_INPUTS."""
    if isinstance(value, list) and not value:
        raise PydanticCustomError("empty_list", "an empty list; give a text or a list of texts")
    if isinstance(value, list) and len(value) > MAX_INPUTS:
        raise PydanticCustomError(
            "too_many_texts",
            "{count} texts, more than the {most} one request may hold; split it",
            {"count": f"{len(value):,}", "most": f"{MAX_INPUTS:,}"},
        )
    return value


# A text or a list of texts: `input` of embeddings and classify, `prompt` of completions.
Texts = Annotated[str | list[str], BeforeValidator(_no_token_ids), AfterValidator(_texts_count)]


class GenerationSettings(BaseModel):
    """What a /v1/completions body may set, range-checked; strict: "0.5" is not a number, true not 1."""

    model_config = ConfigDict(extra="allow", strict=True)  # other fields: fields.FIELDS

    model: str | None = None
    max_tokens: Count = None
    temperature: Annotated[float | None, _range(0, 2)] = None
    top_p: Annotated[float | None, _range(0, 1, low_open=True)] = None
    seed: Annotated[int | None, _range(*SEED, kind="a whole number")] = None
    stop: Annotated[Any, AfterValidator(_stops)] = None
    n: Count = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    def limit(self) -> int | None:
        """The most tokens the completion may have, None when the request leaves it to the job."""
        return self.max_tokens


class ChatSettings(GenerationSettings):
    """What a /v1/chat/completions body may set: max_completion_tokens too (OpenAI's newer name)."""

    max_completion_tokens: Count = None

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(GenerationSettings):
    """A /v1/completions body. A list of prompts: one choice per prompt, in order (choices[i].index)."""

    prompt: Texts


class ChatRequest(ChatSettings):
    """A /v1/chat/completions body; its messages are read by fields.chat_messages."""

    messages: list[dict[str, Any]]


class EmbeddingsRequest(BaseModel):
    """A /v1/embeddings body."""

    model_config = ConfigDict(extra="allow")  # other fields: fields.FIELDS
    input: Texts
    model: str | None = None
    encoding_format: str = "float"


REQUESTS: dict[str, type[BaseModel]] = {
    CHAT: ChatRequest,
    COMPLETIONS: CompletionRequest,
    EMBEDDINGS: EmbeddingsRequest,
}


def unicode_problem(value: Any, where: str = "", seen: set[int] | None = None) -> str | None:
    """JSON (or YAML) may carry a lone UTF-16 surrogate ("\\ud800"), which no tokenizer reads: where it is, or
    None. `seen`: the containers looked in already, each looked in once (YAML's aliases repeat one list)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{where}: not valid Unicode ({exc.reason} at character {exc.start})"
    elif isinstance(value, dict | list):
        seen = set() if seen is None else seen
        if id(value) in seen:
            return None
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            inner = f"{where}[{key}]" if isinstance(value, list) else f"{where}.{key}" if where else str(key)
            if problem := unicode_problem(item, inner, seen):
                return problem
    return None


def describe(errors: list[dict], prefix: str = "") -> str:
    """Validation errors as `field[index]: what is wrong (got ...)`, each field's path after `prefix`
    (body. in a batch line), without pydantic's union branch names or FastAPI's leading `body`."""
    if any(e["type"] == "json_invalid" for e in errors):
        return "the body is not valid JSON; send one JSON object (Content-Type: application/json)"
    locs = [[p for p in e["loc"] if p != "body"] for e in errors]
    lists = {loc[0] for loc in locs if len(loc) > 1 and str(loc[1]).startswith("list[")}
    problems = []
    for e, loc in zip(errors, locs):
        if not loc:  # the body itself: null, a list, text; or a check across its fields ("body": its message says it)
            body = e["type"] == "body"
            problems.append(e["msg"] if body else f"the body must be a JSON object (got {shorten(e.get('input'), 60)})")
            continue
        branch = len(loc) > 1 and isinstance(loc[1], str) and (loc[1] in ("str", "int") or "[" in loc[1])
        if branch and loc[1] == "str" and loc[0] in lists:
            continue  # the list branch says more
        parts = [loc[0]] + loc[2 if branch else 1 :]
        where = prefix + str(parts[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[1:])
        # a count of texts says what it got; a list of thousands shown in part would not
        got = "" if e["type"] in ("missing", "too_many_texts") else f" (got {shorten(e.get('input'), 60)})"
        problems.append(f"{where}: {e['msg'].lower()}{got}")
    return "; ".join(problems[:5])
