"""A completion request's settings as one pydantic model, checked against the ranges OpenAI documents
(https://platform.openai.com/docs/api-reference/chat/create): OpenAI Batch lines (batch_files.py) and
serve's bodies (serve/bodies.py) are both read by it, so both refuse the same values in the same words,
`temperature: must be a number from 0 to 2 (got 5)`. The fields it does not declare are judged by
fields.FIELDS (done, or refused by name).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from ..errors import shorten
from .fields import CHAT, COMPLETIONS

INT64 = 1 << 63  # a seed is stored in an int64 column, and torch and vLLM take no more


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


class GenerationSettings(BaseModel):
    """What a /v1/completions body may set, range-checked; strict: "0.5" is not a number, true not 1."""

    model_config = ConfigDict(extra="allow", strict=True)  # other fields: fields.FIELDS

    model: str | None = None
    max_tokens: Count = None
    temperature: Annotated[float | None, _range(0, 2)] = None
    top_p: Annotated[float | None, _range(0, 1, low_open=True)] = None
    seed: Annotated[int | None, _range(-INT64, INT64 - 1, kind="a whole number")] = None
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


SETTINGS: dict[str, type[GenerationSettings]] = {CHAT: ChatSettings, COMPLETIONS: GenerationSettings}


def describe(errors: list[dict], prefix: str = "") -> str:
    """Validation errors as `field[index]: what is wrong (got ...)`, each field's path after `prefix`
    (body. in a batch line), without pydantic's union branch names or FastAPI's leading `body`."""
    if any(e["type"] == "json_invalid" for e in errors):
        return "the body is not valid JSON; send one JSON object (Content-Type: application/json)"
    locs = [[p for p in e["loc"] if p != "body"] for e in errors]
    lists = {loc[0] for loc in locs if len(loc) > 1 and str(loc[1]).startswith("list[")}
    problems = []
    for e, loc in zip(errors, locs):
        if not loc:  # the body itself: null, a list, text
            problems.append(f"the body must be a JSON object (got {shorten(e.get('input'), 60)})")
            continue
        branch = len(loc) > 1 and isinstance(loc[1], str) and (loc[1] in ("str", "int") or "[" in loc[1])
        if branch and loc[1] == "str" and loc[0] in lists:
            continue  # the list branch says more
        parts = [loc[0]] + loc[2 if branch else 1 :]
        where = prefix + str(parts[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[1:])
        got = "" if e["type"] == "missing" else f" (got {shorten(e.get('input'), 60)})"
        problems.append(f"{where}: {e['msg'].lower()}{got}")
    return "; ".join(problems[:5])
