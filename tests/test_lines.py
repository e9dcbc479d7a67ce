"""JSON Lines read with limits: any single line, however hostile, is one row with one reason."""

import io
import json

import pytest

from batchinfer.storage.lines import (
    MAX_DEPTH,
    Oversized,
    count_lines,
    numbered_lines,
    parse_object,
    read_lines,
    sniff_field,
    too_deep,
)


class _Spy(io.BytesIO):
    """A stream that records the largest read asked of it."""

    largest = 0

    def readline(self, size=-1):
        self.largest = max(self.largest, size if size >= 0 else 1 << 62)
        return super().readline(size)


def test_an_over_long_line_is_skipped_without_being_read_whole():
    big = b'{"id": "h7", "text": "' + b"x" * (50 << 20) + b'"}'
    stream = _Spy(b'{"id": 1}\n' + big + b"\n" + b'{"id": 2}')
    lines = list(read_lines(stream, max_bytes=1 << 20))
    assert lines[0] == b'{"id": 1}' and lines[2] == b'{"id": 2}' and len(lines) == 3
    assert isinstance(lines[1], Oversized) and lines[1].size == len(big) and len(lines[1].head) <= 4096
    assert stream.largest <= (1 << 20) + 1  # never asked for the whole line
    record, problem = parse_object(lines[1], 1 << 20)
    assert record is None and problem[0] == "too_long" and f"{len(big):,} bytes" in problem[1]
    assert sniff_field(lines[1], "id") == "h7"


def test_line_endings_bom_and_a_last_line_without_newline():
    stream = io.BytesIO(b'\xef\xbb\xbf{"a": 1}\r\n\n{"b": 2}')
    assert list(read_lines(stream, 100)) == [b'{"a": 1}', b'{"b": 2}']  # the blank line is no row
    # A line exactly at the limit is whole; one byte more is over it.
    assert list(read_lines(io.BytesIO(b"x" * 10 + b"\n"), 10)) == [b"x" * 10]
    assert isinstance(list(read_lines(io.BytesIO(b"x" * 11), 10))[0], Oversized)


def test_blank_lines_are_no_rows_and_the_count_agrees_with_the_lines_read():
    """A line of JSON whitespace alone is skipped (pandas, DuckDB and vLLM's run_batch skip it too); each line
    read keeps its number in the file, and counting by blocks gives what reading line by line gives."""
    data = b'\xef\xbb\xbf\n{"a": 1}\r\n  \t\r\n\n{"b": 2}\n' + b" " * 40 + b'\n{"c": "x y"}\n\n \n{"d": 4}'
    assert list(numbered_lines(io.BytesIO(data), 30)) == [
        (2, b'{"a": 1}'),
        (5, b'{"b": 2}'),
        (7, b'{"c": "x y"}'),  # line 6: 40 spaces, over the limit and still blank
        (10, b'{"d": 4}'),
    ]
    for case in (data, data + b"\n", b"", b"\n \n", b" x", b"\xef\xbb\xbf", b"\xef\xbb\xbf \n{}"):
        rows = len(list(read_lines(io.BytesIO(case), 30)))
        assert all(count_lines(io.BytesIO(case), size) == rows for size in (1, 2, 3, 5, 1 << 20)), case


@pytest.mark.parametrize(
    "line,reason",
    [
        (b"[" * 100_000 + b"]" * 100_000, "bad_json"),  # would raise RecursionError inside json
        (b'{"t": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", "bad_json"),
        (b'{"text": "caf\xe9"}', "bad_utf8"),
        (b"[1, 2]", "bad_json"),
        (b"", "bad_json"),
        (b'{"text": "unterminated', "bad_json"),
        (b"NaN", "bad_json"),
    ],
)
def test_hostile_lines_give_a_reason_not_an_exception(line, reason):
    record, problem = parse_object(line, 1 << 20)
    assert record is None and problem[0] == reason and problem[1]


def test_brackets_inside_strings_do_not_count_as_nesting():
    line = json.dumps({"text": "[" * 500, "id": "x"}).encode()
    assert not too_deep(line) and parse_object(line, 1 << 20)[0] == {"text": "[" * 500, "id": "x"}
    assert too_deep(b"{" + b'"a": {' * MAX_DEPTH + b"}" * MAX_DEPTH + b"}")
    assert not too_deep(b"{" + b'"a": {' * (MAX_DEPTH - 1) + b"}" * (MAX_DEPTH - 1) + b"}")


def test_sniff_reads_a_top_level_id_before_the_damage_only():
    assert sniff_field(b'{"meta": {"id": 1}, "text": "a, \\" b", "id": 2, "x": [[[', "id") == 2
    assert sniff_field(b'{"id": "h1", "t": ' + b"[" * 5000, "id") == "h1"
    assert sniff_field(b'{"t": [[[[, "id": 3}', "id") is None  # inside the unclosed list, not top level
    assert sniff_field(b'{"text": "x", "id": true}', "id") is None  # not an id value
    assert sniff_field(b"[1, 2]", "id") is None and sniff_field(b'{"ids": 5}', "id") is None


@pytest.mark.parametrize(
    "value,found",
    [
        (b"01", None),  # not JSON: must not be read as 0, another row's id
        (b"-", None),
        (b"1.", None),
        (b".5", None),
        (b'"unterminated', None),
        (b"12abc", None),
        (b"1e5", 100000.0),
        (b"-0.5E-2 ", -0.005),
        (b'"a\\"b"', 'a"b'),
        (b'"h\\u00e9"', "h\u00e9"),
    ],
)
def test_a_sniffed_id_is_a_whole_json_value_or_nothing(value, found):
    for line in (b'{"id":' + value + b',"text":"f"', b'{"id": ' + value + b"}"):
        assert sniff_field(line + b" broken", "id") == found and type(sniff_field(line, "id")) is type(found)
