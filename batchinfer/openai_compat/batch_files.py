"""OpenAI Batch API files: request lines in, response lines out, run on your own hardware.

A request line is {custom_id, method, url, body} (https://platform.openai.com/docs/guides/batch);
url is /v1/chat/completions, /v1/completions or /v1/embeddings. Each line becomes one row:

    custom_id | url | messages (chat) | prompt (completions, embeddings) | prompts (a list input or prompt)
    | max_tokens | temperature | top_p | seed | stop | response_format (JSON text)

A list is one row, so one chunk holds all of it, answered by one line as OpenAI answers: a vector per text
(runners/embed.py), or a choice per prompt with its index and the usage summed (runners/generate.py).

A line that is not a valid request becomes an error line; it never aborts the file. So does a line
asking for what batchinfer does not do (fields.FIELDS: logprobs, n > 1, tools, ...).
"""

from __future__ import annotations

import hashlib
import json
import time

import pyarrow as pa
from pydantic import ValidationError

from ..constrained.spec import response_format
from ..errors import InputError, shorten
from ..messages import message_problem
from ..reasons import Reason
from ..storage.lines import open_lines, parse_object, read_lines
from .fields import CHAT, COMPLETIONS, EMBEDDINGS, chat_messages, unsupported
from .requests import REQUESTS, GenerationSettings, describe, unicode_problem
from .shapes import choice, completion, embedding_list, usage

TASK_OF_URL = {CHAT: "generate", COMPLETIONS: "generate", EMBEDDINGS: "embed"}


def parse_request(record: dict) -> tuple[dict, tuple[str, str] | None]:
    """One request line (already JSON) → a flat row, or the reason it is not a valid request."""
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        given = "missing" if custom_id is None else f"not a non-empty string (got {shorten(custom_id, 60)})"
        return {}, (Reason.BAD_REQUEST, f"custom_id is {given}")
    row = {"custom_id": custom_id}
    url, body = record.get("url"), record.get("body")
    if record.get("method", "POST") != "POST":
        return row, (Reason.BAD_REQUEST, f"method {record.get('method')!r} is not POST")
    if url not in TASK_OF_URL:
        return row, (Reason.BAD_REQUEST, f"url {url!r} is not one of {', '.join(TASK_OF_URL)}")
    if not isinstance(body, dict):
        return row, (Reason.BAD_REQUEST, "body is missing or not an object")
    row["url"] = url
    try:
        request = REQUESTS[url].model_validate(body)  # the models serve reads its bodies with
    except ValidationError as exc:
        return row, (Reason.BAD_REQUEST, describe(exc.errors(), "body."))
    if problem := unicode_problem(body, "body"):
        return row, (Reason.BAD_UTF8, problem)
    if isinstance(request, GenerationSettings):
        row |= {
            "max_tokens": request.limit(),
            "temperature": request.temperature,
            "top_p": request.top_p,
            "seed": request.seed,
            "stop": request.stop,
        }
    if problem := unsupported(url, body, "batch"):
        return row, problem
    if url == CHAT:
        row["messages"], problem = chat_messages(request.messages, "body.messages")
        if problem := problem or message_problem(row["messages"], "body.messages"):
            kept = (Reason.UNSUPPORTED, Reason.EMPTY_TEXT)  # a blank chat is empty_text, as a blank prompt is
            return row, problem if problem[0] in kept else (Reason.BAD_REQUEST, problem[1])
    else:
        texts = request.input if url == EMBEDDINGS else request.prompt
        row |= {"prompts": texts} if isinstance(texts, list) and len(texts) > 1 else {"prompt": _one(texts)}
    row["response_format"], problem = response_format_column(body)
    return row, problem


def _one(texts: str | list[str]) -> str:
    return texts[0] if isinstance(texts, list) else texts


def response_format_column(body: dict) -> tuple[str | None, tuple[str, str] | None]:
    """body.response_format → the request row's response_format (compact JSON; None for plain text), or
    why the request is refused. Only completions are constrained; a stop string could cut the output."""
    value = body.get("response_format")
    constraint, problem = response_format(value, "body.response_format")
    if problem:
        return None, (Reason.BAD_REQUEST, problem)
    if constraint is None:
        return None, None
    if body.get("stop"):
        return None, (Reason.BAD_REQUEST, "body.stop: a stop string could cut the response_format output; remove stop")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False), None


def _stable_id(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


CREATED = "_created"  # a result table's column (output/formats.py): when its row's chunk was committed


def response_lines(table: pa.Table, model: str, task: str) -> list[str]:
    """Result rows → OpenAI batch output lines (chat.completion, text_completion or embedding list). A
    completion's `created` is when its chunk was committed (CREATED), so writing the file again from the same
    parts writes the same lines; now where the table does not say."""
    now = int(time.time())
    lines = []
    for row in table.to_pylist():
        created = int(row[CREATED]) if row.get(CREATED) is not None else now
        request_id = _stable_id(row["custom_id"], model)
        if task == "embed":
            vectors = row["embedding"]
            if vectors and not isinstance(vectors[0], list):  # a part written before list inputs: one vector
                vectors = [vectors]
            body = embedding_list(vectors, model, row["prompt_tokens"])
        else:
            chat = row["url"] == CHAT
            texts, reasons = row["text"], row["finish_reason"]
            if not isinstance(texts, list):  # a part written before list prompts: one choice
                texts, reasons = [texts], [reasons]
            choices = [choice(chat, t, r, index=i) for i, (t, r) in enumerate(zip(texts, reasons))]
            body = completion(chat, request_id, created, model, choices)
            body["usage"] = usage(row["prompt_tokens"], row["completion_tokens"])
        response = {"status_code": 200, "request_id": request_id, "body": body}
        lines.append(
            json.dumps(
                {"id": f"batch_req_{request_id}", "custom_id": row["custom_id"], "response": response, "error": None},
                ensure_ascii=False,
            )
        )
    return lines


def error_lines(errors: pa.Table, model: str) -> list[str]:
    """Error rows → OpenAI batch error lines: {id, custom_id, response: null, error: {code, message}}."""
    lines = []
    for row in errors.to_pylist():
        custom_id, message = row["id"], row["message"]  # without a custom_id, the message names the line
        # By the request's line, not its custom_id: a duplicate_id line shares its custom_id with a response.
        key = _stable_id("error", row["source"], str(row["row"]), model)
        lines.append(
            json.dumps(
                {
                    "id": f"batch_req_{key}",
                    "custom_id": custom_id,
                    "response": None,
                    "error": {"code": row["reason"], "message": message},
                },
                ensure_ascii=False,
            )
        )
    return lines


def task_of_requests(path) -> str:
    """The task a request file needs, from the url of its first valid line."""
    if path.is_dir():
        example = next(iter(sorted(path.glob("*.jsonl"))), path / "requests.jsonl")
        raise InputError(
            f"{path} is a folder; openai-batch takes one OpenAI Batch API request file (.jsonl)",
            f"give one file, e.g. {example}; to run every request file of the folder, run a job file with "
            f"input.path: {path}, input.format: openai and output.format: openai (batchinfer run JOB.yaml; "
            "docs/openai-batch.md)",
        )
    if not path.is_file():
        raise InputError(f"request file {path} does not exist", "give the path of an OpenAI Batch API .jsonl file")
    with open_lines(str(path)) as stream:
        for line in read_lines(stream, 8 << 20):
            record, _ = parse_object(line, 8 << 20)
            url = record.get("url") if record else None
            if url in TASK_OF_URL:
                return TASK_OF_URL[url]
    raise InputError(
        f"{path} holds no request line with a url of {', '.join(TASK_OF_URL)}",
        "give a file of OpenAI Batch API requests: {custom_id, method, url, body} per line",
    )
