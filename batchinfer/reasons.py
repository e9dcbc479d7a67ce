"""Why a row is in _errors/: every reason code, what it means, and whether --retry-errors runs it again.

Error rows carry these codes in their `reason` column, and `_report.json`, the summary and `status` count
them. The table of reasons in docs/troubleshooting.md is generated from REASONS, so the two cannot drift."""

from __future__ import annotations

from dataclasses import dataclass

# A problem is why one row (or one request line) cannot be used: (reason code, message), the reason one of
# Reason's codes and the message the row's error names. (A setting's problem, as "what, and its fix", is
# an error with a hint instead: errors.py.)
Problem = tuple[str, str]


@dataclass(frozen=True)
class Meaning:
    meaning: str
    # What --retry-errors may change (model.max_length, truncation, dtype) can cure it: a retry runs the row
    # again. The others lie in the input itself and would only fail again.
    retryable: bool = False


REASONS: dict[str, Meaning] = {}


def _reason(code: str, meaning: str, retryable: bool = False) -> str:
    REASONS[code] = Meaning(meaning, retryable)
    return code


class Reason:
    """The reason codes, as plain strings (they are written to Parquet and JSON as they are)."""

    NULL_TEXT = _reason("null_text", "the text is null, or its field or column is missing")
    EMPTY_TEXT = _reason("empty_text", "the text is empty, or only whitespace, invisible or control characters")
    NOT_TEXT = _reason("not_text", "a number, list or object where text belongs")
    BAD_JSON = _reason("bad_json", "a JSONL line that is not a JSON object, or a field that does not fit its column")
    BAD_UTF8 = _reason("bad_utf8", "bytes that are not UTF-8, or a lone UTF-16 surrogate")
    BAD_CSV = _reason("bad_csv", "a CSV record with more or fewer fields than the header")
    BAD_SHARD = _reason("bad_shard", "a shard that cannot be read, or that broke or changed under the run")
    TOO_LONG = _reason(
        "too_long",
        "longer than model.max_length with model.truncation: error, or a line over input.max_line_bytes",
        retryable=True,
    )
    OOM = _reason("oom", "one row alone ran out of memory", retryable=True)
    MODEL_ERROR = _reason("model_error", "the model failed on this row", retryable=True)
    BAD_REQUEST = _reason("bad_request", "an OpenAI request that is not valid, or a constraint that cannot compile")
    UNSUPPORTED = _reason("unsupported", "an OpenAI request field batchinfer does not implement")
    DUPLICATE_ID = _reason(
        "duplicate_id", "an OpenAI request whose custom_id an earlier line used: only the first request runs"
    )
    BAD_CHAT = _reason(
        "bad_chat", "chat messages the model's chat template refuses (a role it does not take, or out of its order)"
    )
    BAD_MAX_NEW_TOKENS = _reason("bad_max_new_tokens", "a row's max_new_tokens that is not a whole number >= 1")
    LENGTH = _reason("length", "max_new_tokens cut a constrained output before it was complete")
    INVALID_OUTPUT = _reason("invalid_output", "a constrained output that does not follow its grammar")


RETRYABLE = frozenset(code for code, reason in REASONS.items() if reason.retryable)


def reasons_markdown() -> str:
    """The table of reasons in docs/troubleshooting.md."""
    rows = [f"| `{code}` | {r.meaning} | {'yes' if r.retryable else 'no'} |" for code, r in REASONS.items()]
    return "\n".join(["| reason | meaning | `--retry-errors` runs it again |", "|---|---|---|", *rows])
