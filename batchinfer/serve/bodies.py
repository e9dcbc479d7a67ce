"""serve's request bodies: the OpenAI ones are openai_compat/requests.py's models, which read batch lines too
(the same fields, ranges and list cap), with what serve alone takes (stream_options); here the checks that turn
a body that is valid JSON but not a valid request into one 400 naming what is wrong (pydantic's, in the models,
said by requests.describe; the texts' own, where a list's item is named), and what a completion request is read
into (Asked)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..constrained.spec import Constraint
from ..job.config import GenerationConfig
from ..messages import is_blank
from ..openai_compat.requests import MAX_INPUTS, ChatRequest, CompletionRequest, EmbeddingsRequest, Texts
from ..reasons import Reason


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


def _filled(text: str) -> str:
    if is_blank(text):
        raise PydanticCustomError("blank", "empty, or only whitespace, invisible or control characters")
    return text


def _pair_filled(pair: tuple[str, str]) -> tuple[str, str]:
    if any(is_blank(side) for side in pair):
        raise PydanticCustomError("blank_pair", "both texts must hold something to read")
    return pair


def _listed(items: list) -> list:
    if not items:
        raise PydanticCustomError("empty_list", "empty; give one at least")
    if len(items) > MAX_INPUTS:  # as a list of texts to embed or classify
        raise PydanticCustomError(
            "too_many_texts",
            "{count} items, more than the {most} one request may hold; split it",
            {"count": f"{len(items):,}", "most": f"{MAX_INPUTS:,}"},
        )
    return items


Filled = Annotated[str, AfterValidator(_filled)]
TextPair = Annotated[tuple[str, str], AfterValidator(_pair_filled)]


class ScoreBody(_Body):
    """/score: pairs: [[text, text_pair], ...], or a query and the documents to score beside it."""

    pairs: Annotated[list[TextPair], AfterValidator(_listed)] | None = None
    query: Filled | None = None
    documents: Annotated[list[Filled], AfterValidator(_listed)] | None = None

    @model_validator(mode="after")
    def _one_way(self) -> ScoreBody:
        if self.pairs is not None and (self.query is not None or self.documents is not None):
            raise PydanticCustomError("body", "give pairs, or query and documents, not both")
        if self.pairs is None and (self.query is None or self.documents is None):
            raise PydanticCustomError("body", "give pairs: [[text, text_pair], ...], or query and documents")
        return self

    def texts(self) -> list[tuple[str, str]]:
        """The (text, text_pair) pairs to score: the pairs given, or the query beside each document."""
        if self.pairs is not None:
            return [tuple(p) for p in self.pairs]
        return [(self.query, doc) for doc in self.documents]


def _an_object(value):
    if value is not None and not isinstance(value, dict):
        raise PydanticCustomError("stream_options", 'must be an object, such as {"include_usage": true}')
    return value


def _true_or_false(value):
    if not isinstance(value, bool):
        raise PydanticCustomError("bool", "must be true or false")
    return value


class StreamOptions(BaseModel):
    """stream_options, as OpenAI's: include_usage ends a streamed answer with a usage chunk; include_obfuscation
    pads events against a length side channel, and there is nothing to pad here (taken, not used)."""

    model_config = ConfigDict(extra="allow")  # refused below by name, with the fields it has
    include_usage: Annotated[Any, AfterValidator(_true_or_false)] = False
    include_obfuscation: Any = None

    @model_validator(mode="after")
    def _known(self) -> StreamOptions:
        for key in self.model_extra or {}:
            raise PydanticCustomError(
                Reason.UNSUPPORTED,
                "{key} is not one of its fields (include_usage, include_obfuscation); leave it out",
                {"key": key},
            )
        return self


class StreamedBody(BaseModel):
    """stream and stream_options, as serve reads a completion body (a batch line refuses stream_options by
    name: fields.FIELDS)."""

    stream: bool = False
    stream_options: Annotated[StreamOptions | None, BeforeValidator(_an_object)] = None

    @field_validator("stream_options")
    @classmethod
    def _streamed(cls, options: StreamOptions | None, info) -> StreamOptions | None:
        if options is not None and not info.data.get("stream", False):  # `stream` comes first (GenerationSettings)
            raise PydanticCustomError("not_streamed", "only with stream: true")
        return options

    @property
    def include_usage(self) -> bool:
        """Whether a streamed answer ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(StreamedBody, CompletionRequest):
    def prompts(self) -> list[str]:
        if isinstance(self.prompt, str) and is_blank(self.prompt):
            raise BadInput("prompt: empty, or only whitespace")
        return texts_of(self.prompt, "prompt")


class ChatBody(StreamedBody, ChatRequest):
    """A /v1/chat/completions body; its messages are read by fields.chat_messages."""


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
