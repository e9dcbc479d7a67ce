"""Writes the bad-input files next to this script: one kind of bad input per file, each with two
good rows around it. Rerun it to regenerate them: python tests/data/bad/make_bad_inputs.py"""

import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
GOOD = [
    {"id": "good-1", "text": "Ok lar... Joking wif u oni..."},
    {"id": "good-2", "text": "Free entry in 2 a wkly comp"},
]


def jsonl(name: str, *middle: bytes) -> None:
    lines = [json.dumps(GOOD[0]).encode(), *middle, json.dumps(GOOD[1]).encode()]
    (HERE / name).write_bytes(b"\n".join(lines) + b"\n")


def row(value) -> bytes:
    return json.dumps({"id": "bad", "text": value}).encode()


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def main() -> None:
    jsonl("null_text.jsonl", row(None))
    jsonl("empty_text.jsonl", row(""))
    jsonl("whitespace_text.jsonl", row(" \t\n\u00a0 "))
    jsonl("number_text.jsonl", row(42))
    jsonl("list_text.jsonl", row(["a", "list"]))
    jsonl("dict_text.jsonl", row({"a": "dict"}))
    jsonl("missing_key.jsonl", json.dumps({"id": "bad", "body": "no text key"}).encode())
    jsonl("malformed_json.jsonl", b'{"id": "bad", "text": "unclosed')
    jsonl("not_an_object.jsonl", b'["a", "json", "array"]')
    jsonl("bad_utf8.jsonl", b'{"id": "bad", "text": "caf\xe9 latin-1"}')
    jsonl("blank_line.jsonl", b"", b" \t ", b"\r")  # blank lines are no rows
    jsonl("too_long.jsonl", row("word " * 2000))
    (HERE / "crlf_and_bom.jsonl").write_bytes(
        b"\xef\xbb\xbf" + b"\r\n".join(json.dumps(r).encode() for r in GOOD) + b"\r\n"
    )
    table = pa.table(
        {"id": ["good-1", "bad-null", "bad-empty", "good-2"], "text": [GOOD[0]["text"], None, "", GOOD[1]["text"]]}
    )
    pq.write_table(table, HERE / "null_and_empty.parquet")
    pq.write_table(pa.table({"id": ["bad-1", "bad-2"], "text": [1, 2]}), HERE / "int_text_column.parquet")
    pq.write_table(pa.table({"id": ["bad-1"], "body": ["no text column"]}), HERE / "other_schema.parquet")
    whole = parquet_bytes(pa.table({"id": [r["id"] for r in GOOD], "text": [r["text"] for r in GOOD]}))
    (HERE / "truncated.parquet").write_bytes(whole[: len(whole) // 2])
    (HERE / "not_parquet.parquet").write_bytes(b"this is a text file with a .parquet name\n")
    packed = gzip.compress(b"\n".join(json.dumps(r).encode() for r in GOOD * 200) + b"\n")
    (HERE / "truncated.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    (HERE / "not_gzip.jsonl.gz").write_bytes(b'{"text": "plain text, not gzip"}\n')
    (HERE / "empty_file.jsonl").write_bytes(b"")


if __name__ == "__main__":
    main()
