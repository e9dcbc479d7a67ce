"""serve's request bodies (pydantic), the checks that turn a body that is valid JSON but not a valid
request into one 400 naming what is wrong, and what a completion request is read into (Asked)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool

from ..constrain import Constraint
from ..errors import shorten
from ..messages import is_blank


class BadInput(Exception):
    """A request body that is valid JSON but not a valid request; the message names what is wrong."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # every field is judged by openai_api.FIELDS: done, or refused


class EmbeddingsBody(_Body):
    input: str | list[str]
    model: str | None = None
    encoding_format: str = "float"

    def texts(self) -> list[str]:
        if self.encoding_format not in ("float", "base64"):
            raise BadInput(f"encoding_format: {self.encoding_format!r} is not float or base64")
        return texts_of(self.input, "input")


class ClassifyBody(_Body):
    input: str | list[str]

    def texts(self) -> list[str]:
        return texts_of(self.input, "input")


class ScoreBody(_Body):
    pairs: list[tuple[str, str]] | None = None
    query: str | None = None
    documents: list[str] | None = None

    def texts(self) -> list[tuple[str, str]]:
        """The (text, text_pair) pairs to score: the pairs given, or the query beside each document."""
        if self.pairs is not None and (self.query is not None or self.documents is not None):
            raise BadInput("give pairs, or query and documents, not both")
        if self.pairs is not None:
            pairs, where = [tuple(p) for p in self.pairs], "pairs"
        elif self.query is not None and self.documents is not None:
            pairs, where = [(self.query, doc) for doc in self.documents], "documents"
        else:
            raise BadInput("give pairs: [[text, text_pair], ...], or query and documents")
        for i, pair in enumerate(pairs):
            if any(is_blank(side) for side in pair):
                raise BadInput(f"{where}[{i}]: both texts must hold something to read")
        if not pairs:
            raise BadInput(f"{where}: empty")
        return pairs


class _GenerationBody(_Body):
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    model: str | None = None
    response_format: dict[str, Any] | None = None

    def include_usage(self) -> bool:
        """Whether a streamed answer ends with a usage chunk (stream_options.include_usage, as OpenAI's)."""
        options = self.stream_options
        if options is None:
            return False
        if not self.stream:
            raise BadInput("stream_options: only with stream: true")
        for key, value in options.items():
            if key == "include_usage" and not isinstance(value, bool):
                raise BadInput(f"stream_options.include_usage must be true or false, not {shorten(value, 40)}")
            if key not in ("include_usage", "include_obfuscation"):  # obfuscation pads events: nothing to pad here
                raise BadInput(f"unsupported: stream_options.{key} (not a field of stream_options); leave it out")
        return bool(options.get("include_usage"))


class CompletionBody(_GenerationBody):
    prompt: str


class ChatBody(_GenerationBody):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None


def describe(errors: list[dict]) -> str:
    """Validation errors as `field[index]: what is wrong (got ...)`, without pydantic's union branch names."""
    if any(e["type"] == "json_invalid" for e in errors):
        return "the body is not valid JSON"
    lists = {e["loc"][1] for e in errors if len(e["loc"]) > 2 and str(e["loc"][2]).startswith("list[")}
    problems = []
    for e in errors:
        loc = [p for p in e["loc"] if p != "body"]
        if not loc:  # the body itself: null, a list, text
            problems.append(f"the body must be a JSON object (got {shorten(e.get('input'), 60)})")
            continue
        branch = len(loc) > 1 and isinstance(loc[1], str) and (loc[1] in ("str", "int") or "[" in loc[1])
        if branch and loc[1] == "str" and loc[0] in lists:
            continue  # the list branch says more
        parts = [loc[0]] + loc[2 if branch else 1 :]
        where = str(parts[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[1:])
        got = "" if e["type"] == "missing" else f" (got {shorten(e.get('input'), 60)})"
        problems.append(f"{where}: {e['msg'].lower()}{got}")
    return "; ".join(problems[:5])


def check_unicode(value: Any, where: str = "") -> None:
    """JSON may carry a lone UTF-16 surrogate ("\\ud800"), which no tokenizer reads: name where it is."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadInput(f"{where}: not valid Unicode ({exc.reason} at character {exc.start})") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_unicode(item, f"{where}[{i}]")


def texts_of(value: str | list[str], where: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise BadInput(f"{where}: empty; give a string or a list of strings")
    for i, text in enumerate(texts):
        if is_blank(text):
            raise BadInput(f"{where}[{i}]: empty, or only whitespace, invisible or control characters")
    return texts


@dataclass
class Asked:
    """One completion request, read and checked: what the engine runs and how the answer is shaped."""

    chat: bool
    ids: list[int]  # the prompt's tokens
    max_new: int
    stops: list[str]
    constraint: Constraint | None
    stream: bool  # answered as server-sent events
    include_usage: bool  # a streamed answer ends with a usage chunk
    started: float  # time.perf_counter() when the request came
    key: str = ""  # what makes the answer's id unique
    created: int = 0  # the answer's time, in seconds since 1970

    def __post_init__(self):
        self.key = self.key or uuid.uuid4().hex
        self.created = self.created or int(time.time())
