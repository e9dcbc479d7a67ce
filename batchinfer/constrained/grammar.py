"""Constraints (constrained/spec.py) compiled with xgrammar for one tokenizer, and the masks that keep
generation inside them: one grammar state per request, in transformers' continuous batching (its
logits-processor hook) and in padded model.generate batches.

xgrammar rather than llguidance: on this project's CPUs it builds a tokenizer's view 4x faster
(162 ms against 638 ms for 32,000 tokens), masks a token in about 1 us against 13-52 us, applies the
mask with its own CPU kernel (llguidance's torch helper goes through torch.compile), and is vLLM's
default structured-output backend, so both engines constrain the same way
(examples/bench/grammar_engines.py measures both).

Every constrained output is checked once more, whole, against its grammar (allowing any JSON
whitespace, so vLLM's output is judged by the same rule): a completion is either complete and valid
or its row is an error, never invalid text reported as a success.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from concurrent.futures import Future

import torch
from transformers import LogitsProcessor

from ..errors import ConfigError, ModelError
from .sampling import RequestHook
from .spec import Constraint, GrammarLimits, job_constraint

CACHE_BYTES = 512 << 20  # compiled grammars xgrammar keeps per tokenizer (its cache drops the least recent past it)
TEXTS_CACHED = 256  # schemas' grammar text kept: xgrammar's cache starts after it (from_json_schema is not cached)
JSON_KINDS = ("json_schema", "json_object")
WHAT = {"json_schema": "schema", "json_object": "JSON grammar", "choices": "choices", "regex": "regex"}
_BOUNDED_CHAR, _JSON_CHAR = '[^\\"\\\\\\r\\n]', '[^\\0-\\x1f\\"\\\\]'  # EBNF character classes


class Uncompilable(Exception):
    """A constraint xgrammar cannot compile, or not within the limits; the message says what and where."""


def _xgrammar():
    try:
        import xgrammar
    except ImportError as exc:
        raise ModelError(
            "constrained output (response_format, choices, regex) needs xgrammar, which is not installed",
            "pip install 'batchinfer[llm]'",
        ) from exc
    return xgrammar


class Grammars:
    """Compiles constraints for one tokenizer and vocabulary within `limits`, each distinct one once: xgrammar
    keeps what it compiled (bounded in bytes), and a caller asking for one being compiled waits for that compile.

    A compile runs on a thread of its own (xgrammar lets go of the GIL: an event loop waiting on it goes on
    answering), so that a caller gives up on it after limits.seconds; the compile itself cannot be stopped, and
    its grammar is kept when it ends. The size limits bound how long that can be."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: set[int], limits: GrammarLimits):
        xgr = _xgrammar()
        self.xgr = xgr
        self.vocab_size = vocab_size
        self.stop_ids = sorted(stop_ids)
        self.limits = limits
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_ids)
        self.vocabulary: list[bytes] = info.decoded_vocab  # each token id's bytes, as the masks read them
        threads = max(1, min(8, torch.get_num_threads()))
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_limit_bytes=CACHE_BYTES)
        self._compiling: dict[tuple[Constraint, bool], Future] = {}
        self._lock = threading.Lock()

    def compile(self, constraint: Constraint, loose: bool = False):
        """The compiled grammar; `loose` allows any whitespace between JSON tokens (for checking outputs
        that another engine wrote). Raises Uncompilable naming constraint.where: xgrammar refused it, it is
        past the size limits, or it took longer than limits.seconds."""
        refuse_too_large(constraint, self.limits)
        key = (constraint, loose and constraint.kind in JSON_KINDS)
        with self._lock:
            compiling = self._compiling.get(key)
            if compiling is None:
                compiling = self._compiling[key] = Future()
                threading.Thread(
                    target=self._run, args=(key, compiling), name="batchinfer-grammar", daemon=True
                ).start()
        try:
            return compiling.result(timeout=self.limits.seconds)
        except TimeoutError:
            raise Uncompilable(
                f"{constraint.where}: xgrammar took longer than generation.grammar_seconds ({self.limits.seconds:g} s) "
                f"to compile this {WHAT[constraint.kind]}; simplify it"
            ) from None

    def _run(self, key: tuple[Constraint, bool], compiling: Future) -> None:
        try:
            compiling.set_result(self._compile(*key))
        except BaseException as exc:  # noqa: BLE001 - handed to every caller waiting on this compile
            compiling.set_exception(exc)
        finally:
            with self._lock:
                del self._compiling[key]

    def _compile(self, constraint: Constraint, loose: bool):
        text = grammar_text(constraint, loose)
        try:
            return self.compiler.compile_grammar(text)
        except XGRAMMAR_ERRORS as exc:
            raise cannot_compile(constraint, exc) from None

    def matcher(self, constraint: Constraint):
        return self.xgr.GrammarMatcher(self.compile(constraint))

    def bitmask(self, rows: int) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(rows, self.vocab_size)

    def complete(self, constraint: Constraint, tokens: list[int], text: str) -> bool:
        """Whether a completion (`tokens` without its end token, decoded as `text`) is whole and valid
        under `constraint`: by its grammar (the one it was generated under, else the one allowing any JSON
        whitespace), and JSON also by Python's json module and, where it is installed, jsonschema, so that
        no engine's slip passes as an answer."""
        try:
            whole = self._accepts(constraint, tokens, False) or (
                constraint.kind in JSON_KINDS and self._accepts(constraint, tokens, True)
            )
        except Uncompilable:  # the loose grammar past the limits: the output cannot be shown valid
            return False
        if not whole:
            return False
        if constraint.kind not in JSON_KINDS:
            return True
        try:
            value = json.loads(text)
        except ValueError:
            return False
        if constraint.kind == "json_object":
            return isinstance(value, dict)
        try:
            import jsonschema
        except ImportError:
            return True
        return jsonschema.Draft202012Validator(json.loads(constraint.spec)).is_valid(value)

    def refused_at(self, constraint: Constraint, tokens: list[int]) -> int | None:
        """The position of the first of `tokens` the masks do not allow after those before it, or None where all
        are allowed (an answer, or the start of one)."""
        matcher = self.matcher(constraint)
        return next((i for i, t in enumerate(tokens) if not matcher.accept_token(t)), None)

    def _accepts(self, constraint: Constraint, tokens: list[int], loose: bool) -> bool:
        matcher = self.xgr.GrammarMatcher(self.compile(constraint, loose))
        return all(matcher.accept_token(t) for t in tokens) and matcher.is_completed()

    def apply(self, scores: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Mask scores [n, vocab] in place: rows `rows` keep only the tokens their bitmask rows allow."""
        if rows:
            self.xgr.apply_token_bitmask_inplace(
                scores, bitmask.to(scores.device), vocab_size=min(self.vocab_size, scores.shape[-1]), indices=rows
            )


def ebnf(constraint: Constraint, loose: bool = False) -> str:
    """The grammar a constraint compiles to, as xgrammar's EBNF text: the one text every engine's masks follow."""
    kind, spec = constraint.kind, constraint.spec
    if kind in JSON_KINDS:
        return _json_grammar(spec if kind == "json_schema" else "", loose)
    if kind == "choices":
        return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in json.loads(spec))
    return str(_xgrammar().Grammar.from_regex(spec))


UNCOMPILABLE = "simplify it, or see xgrammar's documentation for what it supports"  # the fix for Uncompilable


def check_job_constraint(gen) -> None:
    """validate: the job's constraint (generation's response_format, choices or regex) refused as a run refuses it
    when it is past the limits or xgrammar cannot read it, without the model or its tokenizer. validate said ok
    to a regex '[a-' that every run then refused."""
    if (constraint := job_constraint(gen)) is None:
        return
    try:
        refuse_too_large(constraint, gen.grammar_limits)
        grammar_text(constraint)
    except Uncompilable as exc:
        raise ConfigError(str(exc), UNCOMPILABLE) from None


def refuse_too_large(constraint: Constraint, limits: GrammarLimits) -> None:
    if problem := limits.problem(constraint):
        raise Uncompilable(f"{constraint.where}: this {WHAT[constraint.kind]} is too large to compile: {problem}")


def grammar_text(constraint: Constraint, loose: bool = False) -> str:
    """ebnf(constraint), or Uncompilable naming constraint.where and what xgrammar said: a regex or schema it
    cannot read fails here, before any tokenizer (validate checks a job's constraint so, without the model)."""
    try:
        return ebnf(constraint, loose)
    except XGRAMMAR_ERRORS as exc:
        raise cannot_compile(constraint, exc) from None


XGRAMMAR_ERRORS = (RuntimeError, ValueError, TypeError)  # xgrammar raises RuntimeError for bad input


def cannot_compile(constraint: Constraint, exc: Exception) -> Uncompilable:
    return Uncompilable(
        f"{constraint.where}: xgrammar cannot compile this {WHAT[constraint.kind]}: {xgrammar_message(exc)}"
    )


def xgrammar_message(exc: Exception) -> str:
    """The first line of an error xgrammar raised, without its time and source line."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", first)


@functools.lru_cache(maxsize=TEXTS_CACHED)
def _json_grammar(schema: str, loose: bool) -> str:
    """A JSON schema (empty: any JSON object) as xgrammar's EBNF text, in one layout (", " and ": ": a small
    model cannot wander off into endless whitespace) unless `loose`."""
    xgr = _xgrammar()
    ebnf = str(xgr.Grammar.from_json_schema(schema or '{"type": "object"}', any_whitespace=loose, strict_mode=True))
    # xgrammar 0.2.9 lets raw control characters into strings with a min/maxLength, which JSON forbids: such
    # strings take the characters its plain strings take
    return ebnf.replace(_BOUNDED_CHAR, _JSON_CHAR)


class ContinuousMasks(RequestHook):
    """transformers' continuous-batching hook: before each step it is given the requests that will get
    a new token (prepare_tensor_args), in the order of the logits rows it then masks (__call__). Each
    constrained request has its matcher, advanced by the tokens generated since the last step."""

    def __init__(self, grammars: Grammars):
        self.grammars = grammars
        self.states: dict[str, list] = {}  # request id -> [matcher, tokens accepted]
        self.mask = grammars.bitmask(1)

    def add(self, request_id: str, constraint: Constraint) -> None:
        self.states[request_id] = [self.grammars.matcher(constraint), 0]

    def drop(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        rows = torch.full((len(requests_with_new_token),), -1, dtype=torch.int32)
        if len(requests_with_new_token) > self.mask.shape[0]:
            self.mask = self.grammars.bitmask(len(requests_with_new_token))
        for row, future in enumerate(requests_with_new_token):
            state = self.states.get(future.state.request_id)
            if state is None:
                continue
            matcher, accepted = state
            tokens = generated_tokens(future.state)
            for token in tokens[accepted:]:
                matcher.accept_token(token)  # a token it refuses leaves the matcher where it was: checked at the end
            state[1] = len(tokens)
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.mask, row)
                rows[row] = row
        return rows

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows = tensor_arg[: scores.size(0)]
        self.grammars.apply(scores, self.mask, rows[rows >= 0].tolist())
        return scores


def generated_tokens(state) -> list[int]:
    """A request's tokens so far; a request the engine re-queued under memory pressure carries the tokens
    it had generated in its prompt (as transformers' RequestState.to_generation_output reads them)."""
    if state._true_initial_tokens:
        return state.initial_tokens[state._true_initial_tokens :] + state.generated_tokens
    return state.generated_tokens


class StaticMasks(LogitsProcessor):
    """model.generate's hook for one padded batch: row i follows constraints[i] (None: free)."""

    def __init__(self, grammars: Grammars, constraints: list[Constraint | None]):
        self.grammars = grammars
        self.matchers = [grammars.matcher(c) if c is not None else None for c in constraints]
        self.mask = grammars.bitmask(len(constraints))
        self.prompt = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt is None:
            self.prompt = input_ids.shape[1]
        rows = []
        for row, matcher in enumerate(self.matchers):
            if matcher is None or matcher.is_terminated():
                continue
            if input_ids.shape[1] > self.prompt and not matcher.accept_token(int(input_ids[row, -1])):
                self.matchers[row] = None  # refused: the row is checked (and failed) at the end
                continue
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.mask, row)
                rows.append(row)
        self.grammars.apply(scores, self.mask, rows)
        return scores
