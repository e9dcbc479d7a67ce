"""serve's request bodies: the OpenAI ones are openai_compat/requests.py's models, which read batch lines too
(the same fields, ranges and list cap); here the checks that turn a body that is valid JSON but not a valid
request into one 400 naming what is wrong, and what a completion request is read into (Asked)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..constrained.spec import Constraint
from ..errors import shorten
from ..job.config import GenerationConfig
from ..messages import is_blank
from ..openai_compat.requests import CompletionRequest, EmbeddingsRequest, GenerationSettings, Texts


class BadInput(Exception):
    """A request body that is valid JSON but not a valid request; the message names what is wrong."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # every field is judged by openai_compat.fields.FIELDS: done, or refused
    model: str | None = None


class EmbeddingsBody(EmbeddingsRequest):
    encoding_format: Literal["float", "base64"] = "float"  # a batch line's is float alone (fields.FIELDS)

    def texts(self) -> list[str]:
        return texts_of(self.input, "input")


class ClassifyBody(_Body):
    input: Texts

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


def include_usage(body: GenerationSettings) -> bool:
    """Whether a streamed answer ends with a usage chunk (stream_options.include_usage, as OpenAI's)."""
    options = body.stream_options
    if options is None:
        return False
    if not body.stream:
        raise BadInput("stream_options: only with stream: true")
    for key, value in options.items():
        if key == "include_usage" and not isinstance(value, bool):
            raise BadInput(f"stream_options.include_usage must be true or false, not {shorten(value, 40)}")
        if key not in ("include_usage", "include_obfuscation"):  # obfuscation pads events: nothing to pad here
            raise BadInput(f"unsupported: stream_options.{key} (not a field of stream_options); leave it out")
    return bool(options.get("include_usage"))


class CompletionBody(CompletionRequest):
    def prompts(self) -> list[str]:
        if isinstance(self.prompt, str) and is_blank(self.prompt):
            raise BadInput("prompt: empty, or only whitespace")
        return texts_of(self.prompt, "prompt")


def texts_of(value: str | list[str], where: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value  # a list holds one text at least (requests.Texts)
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
    settings: GenerationConfig  # its decoding: its own temperature, top_p and seed over the job's
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
