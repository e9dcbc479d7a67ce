import gzip
import json
from dataclasses import replace
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchinfer.errors import InputError
from batchinfer.job.config import InputConfig
from batchinfer.sources import (
    READ_ERRORS,
    describe_read_error,
    discover_shards,
    open_reader,
    read_spec,
    shard_contents,
)
from batchinfer.sources.openai import REQUEST_COLUMNS

ROWS = [{"id": i, "text": f"message number {i}", "label": i % 2} for i in range(50)]


def _jsonl(path, rows, opener=open):
    with opener(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def _read_all(cfg: InputConfig) -> list[dict]:
    rows = []
    inputs = discover_shards(cfg)
    shards, types = inputs.shards, inputs.types
    for shard in shards:
        reader = open_reader(shard, read_spec(cfg, types=types))
        for start in range(0, shard.num_rows, 7):  # odd ranges: cross row groups and line boundaries
            rows += reader.read(start, min(start + 7, shard.num_rows)).table.to_pylist()
        reader.close()
    return rows


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "jsonl.gz", "hf", "glob", "folder"])
def test_every_format_reads_every_row_in_order(tmp_path, kind):
    if kind == "parquet":
        path = tmp_path / "a.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=10)
    elif kind == "jsonl":
        path = _jsonl(tmp_path / "a.jsonl", ROWS)
    elif kind == "jsonl.gz":
        path = _jsonl(tmp_path / "a.jsonl.gz", ROWS, gzip.open)
    elif kind == "hf":
        import datasets

        path = tmp_path / "saved"
        datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    else:
        pq.write_table(pa.Table.from_pylist(ROWS[:20]), tmp_path / "s0.parquet")
        _jsonl(tmp_path / "s1.jsonl", ROWS[20:35])
        _jsonl(tmp_path / "s2.jsonl.gz", ROWS[35:], gzip.open)
        (tmp_path / "notes.txt").write_text("ignored")
        path = tmp_path / "s*" if kind == "glob" else tmp_path
    cfg = InputConfig(path=str(path), text="text", id="id", keep=["label"])
    assert _read_all(cfg) == ROWS


def test_jsonl_reader_reopens_for_an_earlier_range(tmp_path):
    cfg = InputConfig(path=str(_jsonl(tmp_path / "a.jsonl.gz", ROWS, gzip.open)), text="text")
    shard = discover_shards(cfg)[0][0]
    reader = open_reader(shard, read_spec(cfg))
    assert reader.read(40, 42).table.column("text").to_pylist() == ["message number 40", "message number 41"]
    assert reader.read(3, 4).table.column("text").to_pylist() == ["message number 3"]


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        discover_shards(InputConfig(path=str(tmp_path / "nope"), text="t"))
    (tmp_path / "readme.md").write_text("x")
    with pytest.raises(InputError, match=r"holds no .parquet.*found: .md"):
        discover_shards(InputConfig(path=str(tmp_path), text="t"))
    with pytest.raises(InputError, match="the glob"):
        discover_shards(InputConfig(path=str(tmp_path / "*.parquet"), text="t"))


def test_missing_column_names_the_key_and_lists_what_exists(tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    with pytest.raises(InputError, match=r"^input.text: no column 'body' in the input; a.parquet has id, text, label$"):
        discover_shards(InputConfig(path=str(tmp_path / "a.parquet"), text="{text} {body}"))
    _jsonl(tmp_path / "b.jsonl", ROWS)
    with pytest.raises(InputError, match=r"^input.text: no column 'txt' in the input; b.jsonl has id, text, label$"):
        discover_shards(InputConfig(path=str(tmp_path / "b.jsonl"), text="txt"))
    with pytest.raises(InputError, match=r"^input.text: no columns 'head', 'tail' in the input; a.parquet has"):
        discover_shards(InputConfig(path=str(tmp_path / "a.parquet"), text="{head} {tail}"))


def test_an_empty_partition_without_columns_is_left_out_and_an_input_of_nothing_else_says_so(tmp_path):
    """Some writers leave an empty partition as a file of no rows and no columns: it failed the job as a shard
    without the job's columns ('it has: ' and nothing after)."""
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    pq.write_table(pa.table({}), tmp_path / "b.parquet")
    inputs = discover_shards(InputConfig(path=str(tmp_path), text="text", id="id"))
    assert [s.name for s in inputs.shards] == ["a.parquet"] and not inputs.bad
    (tmp_path / "a.parquet").unlink()
    pq.write_table(pa.table({}), tmp_path / "c.parquet")
    with pytest.raises(InputError, match="^the input holds no rows: its 2 shards are empty files without columns"):
        discover_shards(InputConfig(path=str(tmp_path), text="text", id="id"))
    with pytest.raises(InputError, match=r"\(b.parquet has no columns\)"):
        discover_shards(InputConfig(path=str(tmp_path / "b.parquet"), text="text", id="id"))


def test_a_column_the_job_reads_twice_under_one_name_is_the_shards_problem_not_an_internal_error(tmp_path):
    (tmp_path / "a.csv").write_text("id,text,text\n1,a,b\n")
    pq.write_table(pa.table([["1"], ["a"], ["b"]], names=["id", "text", "text"]), tmp_path / "b.parquet")
    for name in ("a.csv", "b.parquet"):
        with pytest.raises(InputError, match=f"^shard .*/{name} has column 'text' more than once") as info:
            discover_shards(InputConfig(path=str(tmp_path / name), text="text", id="id"))
        assert "rename the repeated column" in info.value.hint
    (tmp_path / "c.csv").write_text("id,text,note,note\n1,a,x,y\n")  # a column the job does not read may repeat
    assert discover_shards(InputConfig(path=str(tmp_path / "c.csv"), text="text", id="id")).shards[0].num_rows == 1


@pytest.mark.parametrize("on_bad_shard", ["fail", "skip"])
def test_a_column_no_shard_has_is_one_problem_of_the_job_not_one_per_shard(tmp_path, on_bad_shard):
    for i in range(10):
        pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / f"s{i}.parquet")
    cfg = partial(InputConfig, path=str(tmp_path), on_bad_shard=on_bad_shard)
    with pytest.raises(InputError) as info:
        discover_shards(cfg(text="body", id="id"))
    assert info.value.message == "input.text: no column 'body' in the input; the 10 shards have id, text, label"
    assert info.value.hint == "name an existing column in input.text"  # not on_bad_shard: skip, which skips all
    with pytest.raises(InputError) as info:
        discover_shards(cfg(text="{title} {text}", id="rid", keep={"lab": "gold", "label": "label"}))
    assert info.value.message.splitlines() == [
        "the job names columns the input does not have (the 10 shards have id, text, label):",
        "  input.text: 'title'",
        "  input.id: 'rid'",
        "  input.keep: 'lab'",
    ]
    pq.write_table(pa.Table.from_pylist([{"id": 1, "body": "x"}]), tmp_path / "s9.parquet")  # a mix of schemas
    if on_bad_shard == "skip":
        assert len(discover_shards(cfg(text="body", id="id")).bad) == 9
        return
    with pytest.raises(InputError, match=r"^9 shards cannot be used:\n  column 'body' not found in s0.parquet"):
        discover_shards(cfg(text="body", id="id"))


# --- input identity ---------------------------------------------------------------------------------------------


def _digest(path, **input_extra):
    return discover_shards(InputConfig(path=str(path), text="text", **input_extra)).shards[0].digest


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "jsonl.gz", "hf"])
def test_a_rewrite_with_the_same_name_and_row_count_changes_the_digest(tmp_path, kind):
    rows = [dict(r) for r in ROWS]
    changed = [dict(r) for r in ROWS]
    changed[25]["text"] = "message number 2X"  # same length: the same file size for JSONL
    path = tmp_path / f"a.{kind}"

    def write(data):
        if kind == "parquet":
            pq.write_table(pa.Table.from_pylist(data), path)
        elif kind == "hf":
            import datasets

            datasets.Dataset.from_list(data).save_to_disk(str(path))
        else:
            _jsonl(path, data, gzip.open if kind.endswith(".gz") else open)

    write(rows)
    before = _digest(path)
    write(rows)
    assert _digest(path) == before  # the same content, written again: the same identity
    write(changed)
    assert _digest(path) != before


# --- output never read back as input ----------------------------------------------------------------------------


def test_discovery_skips_the_output_folder_and_other_batchinfer_outputs_below_the_input(tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    for name in ("out", "older-run"):
        (tmp_path / name).mkdir()
        pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / name / "part-00000-00000.parquet")
    (tmp_path / "older-run" / "_batchinfer.json").write_text("{}")
    for path in (tmp_path, tmp_path / "*.parquet", tmp_path / "**" / "*.parquet"):
        shards = discover_shards(InputConfig(path=str(path), text="text"), output=str(tmp_path / "out")).shards
        assert [s.name for s in shards] == ["a.parquet"]
    # A batchinfer output named as the input itself is read: one job feeds the next.
    chained = discover_shards(InputConfig(path=str(tmp_path / "older-run"), text="text")).shards
    assert [s.name for s in chained] == ["part-00000-00000.parquet"]


# --- hostile lines and ids ---------------------------------------------------------------------------------------

HOSTILE = [
    (b'{"id": "h1", "text": ' + b"[" * 5000 + b"]" * 5000 + b"}", "h1", "bad_json"),
    (b'{"id": "h2", "text": "lone \\ud800 surrogate"}', "h2", "bad_utf8"),
    (b'{"id": "h3", "text": "ok", "label": "\\udfff"}', "h3", "bad_utf8"),
    (b'{"id": "h4", "text": "' + b"long " * 5000 + b'"}', "h4", "too_long"),
    (b'{"id": "h5", "text": "fine", "label": ' + b"[" * 30 + b"]" * 30 + b"}", "h5", "bad_json"),
    (b'{"id": 6, "text": ["not", "text"]}', "6", "not_text"),
    (b'{"id": "h7", "text": "caf\xe9"}', "h7", "bad_utf8"),
]


def test_hostile_lines_cost_one_row_each_and_keep_their_ids(tmp_path, tiny_embed):
    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    good = [json.dumps({"id": f"g{i}", "text": f"good row {i}", "label": i}).encode() for i in range(20)]
    lines = [line for pair in zip(good, [h[0] for h in HOSTILE] + [b""] * 20) for line in pair if line]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rows.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    job = validate_job(
        {
            "input": {
                "path": str(tmp_path / "in"),
                "text": "text",
                "id": "id",
                "keep": ["label"],
                "max_line_bytes": 16384,
            },
            "model": {"path": str(tiny_embed), "task": "embed", "max_length": 32},
            "batching": {"chunk_rows": 8},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    report = run_job(job)  # on_bad_shard: fail, and still nothing stops
    assert report["complete"] and report["rows"] == 27 and report["rows_ok"] == 20
    errors = pq.read_table(tmp_path / "out" / "_errors").to_pylist()
    assert sorted(((e["id"], e["reason"]) for e in errors), key=str) == sorted(((h[1], h[2]) for h in HOSTILE), key=str)
    results = pq.read_table(tmp_path / "out")
    assert results.column("id").to_pylist() == [f"g{i}" for i in range(20)]


def test_mixed_id_types_are_kept_as_their_text_with_one_schema(tmp_path, tiny_embed):
    import pyarrow.dataset as ds

    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    ids = [f"h{i:06d}" if i % 7 else i for i in range(40)]  # strings, and an integer every 7th line
    rows = [{"id": v, "text": f"text {i}", "score": (None if i < 10 else i / 2)} for i, v in enumerate(ids)]
    _jsonl(tmp_path / "rows.jsonl", rows)
    job = validate_job(
        {
            "input": {"path": str(tmp_path / "rows.jsonl"), "text": "text", "id": "id", "keep": ["score"]},
            "model": {"path": str(tiny_embed), "task": "embed", "max_length": 32},
            "batching": {"chunk_rows": 10},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    run_job(job)
    parts = sorted((tmp_path / "out").glob("part-*.parquet"))
    schemas = {str(pq.read_schema(p).remove_metadata()) for p in parts}
    assert len(parts) == 4 and len(schemas) == 1  # the all-null score chunk too
    table = ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    assert table.column("id").to_pylist() == [str(v) for v in ids]  # "h000001" without quotes, 7 as "7"
    assert table.schema.field("score").type == pa.float64()


def test_jsonl_ids_that_are_numbers_are_written_as_their_value(tmp_path):
    # As docs/output.md says: a JSON number id is its value (1.50 is 1.5), a string id is its exact text.
    (tmp_path / "a.jsonl").write_text('{"id": 1.50, "t": "a"}\n{"id": 1e3, "t": "b"}\n{"id": 2, "t": "c"}\n')
    (tmp_path / "b.jsonl").write_text('{"id": "a", "t": "d"}\n{"id": 1.50, "t": "e"}\n{"id": "1.50", "t": "f"}\n')
    for name, ids in (("a.jsonl", ["1.5", "1000.0", "2"]), ("b.jsonl", ["a", "1.5", "1.50"])):
        assert [r["id"] for r in _read_all(InputConfig(path=str(tmp_path / name), text="t", id="id"))] == ids


def test_parquet_shards_that_disagree_on_the_id_type_give_text_ids(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "text": ["a", "b"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": ["x", "y"], "text": ["c", "d"]}), tmp_path / "b.parquet")
    cfg = InputConfig(path=str(tmp_path), text="text", id="id")
    assert discover_shards(cfg).types == {"id": pa.string()}
    assert [r["id"] for r in _read_all(cfg)] == ["1", "2", "x", "y"]


# --- CSV ---------------------------------------------------------------------------------------------------------


def _csv(path, rows, delimiter=","):
    import csv

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("name", ["a.jsonl", "a.csv"])
def test_a_shard_that_shrinks_during_the_run_is_a_read_error_not_a_crash(tmp_path, name):
    path = _jsonl(tmp_path / name, ROWS) if name.endswith("jsonl") else _csv(tmp_path / name, ROWS)
    cfg = InputConfig(path=str(path), text="text")
    shard = discover_shards(cfg).shards[0]
    size = path.stat().st_size
    path.write_text("\n".join(path.read_text().splitlines()[:20]) + "\n")  # cut short under the job
    with pytest.raises(READ_ERRORS) as caught:
        open_reader(shard, read_spec(cfg)).read(0, 10)  # its stamp tells before a row is read
    assert describe_read_error(caught.value).startswith(
        f"the file changed while the job ran: its size went from {size:,} to {path.stat().st_size:,} bytes"
    )
    # Where no stamp tells (a store that gives no size), the stream running out early does.
    reader = open_reader(replace(shard, stamp=()), read_spec(cfg))
    assert reader.read(0, 10).table.num_rows == 10
    with pytest.raises(READ_ERRORS) as caught:
        reader.read(10, 50)
    assert describe_read_error(caught.value) == "the file now ends early: it held 50 rows when the job started"


@pytest.mark.parametrize("name", ["a.csv", "a.tsv", "a.csv.gz"])
def test_csv_reads_every_row_in_order_with_kept_types(tmp_path, name):
    rows = [{**r, "text": r["text"] + (',\n "quoted"' if r["id"] == 7 else "")} for r in ROWS]
    _csv(tmp_path / name, rows, "\t" if ".tsv" in name else ",")
    cfg = InputConfig(path=str(tmp_path / name), text="text", id="id", keep=["label"])
    inputs = discover_shards(cfg)
    assert inputs.types == {"id": pa.string(), "label": pa.int64()}  # ids as their text; numbers stay numbers
    assert _read_all(cfg) == [{**r, "id": str(r["id"])} for r in rows]


def test_a_kept_csv_column_is_a_number_only_where_every_field_is_written_back_as_it_stands(tmp_path):
    """zip 01234 came out as 1234 and price 1.50 as 1.5: a column is read as numbers only where no field of any
    shard would change, else as the text of its fields (b.csv's zip 7 then comes out as "7")."""
    fields = {
        "zip": ["01234", "02345", "00000"],
        "price": ["1.50", "2", "3.25"],
        "odd": ["1e3", "+5", "0x10"],
        "count": ["7", "", "-12"],
        "amount": ["1.5", "2.0", "-3"],
    }
    lines = ["text," + ",".join(fields)] + [f"t{i}," + ",".join(f[i] for f in fields.values()) for i in range(3)]
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.csv").write_text("text,zip,price,odd,count,amount\nu,7,1,1,8,4\n")  # numbers alone, here
    cfg = InputConfig(path=str(tmp_path / "*.csv"), text="text", keep=list(fields))
    assert discover_shards(cfg).types == {
        "zip": pa.string(),
        "price": pa.string(),
        "odd": pa.string(),
        "count": pa.int64(),
        "amount": pa.float64(),
    }
    rows = _read_all(cfg)
    assert {name: [r[name] for r in rows[:3]] for name in ("zip", "price", "odd")} == {
        name: fields[name] for name in ("zip", "price", "odd")
    }
    assert [r["count"] for r in rows] == [7, None, -12, 8] and [r["amount"] for r in rows] == [1.5, 2.0, -3.0, 4.0]
    assert [r["zip"] for r in rows[3:]] == ["7"]


def test_csv_records_with_the_wrong_field_count_are_error_rows(tmp_path, tiny_embed):
    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    lines = ["id,text,label", "1,first,0", "2,second,1,extra", "3,third", '4,"a, quoted",1', "5,,0", "6,sixth,x"]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rows.csv").write_text("\n".join(lines) + "\n")
    job = validate_job(
        {
            "input": {"path": str(tmp_path / "in"), "text": "text", "id": "id", "keep": ["label"]},
            "model": {"path": str(tiny_embed), "task": "embed"},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    report = run_job(job)
    assert (
        report["rows"] == 6 and report["rows_ok"] == 3 and report["errors_by_reason"] == {"bad_csv": 2, "empty_text": 1}
    )
    errors = pq.read_table(tmp_path / "out" / "_errors").to_pylist()
    # A bad record keeps its place and its id: no row after it shifts.
    assert sorted((e["row"], e["id"], e["reason"], e["message"][:8]) for e in errors) == [
        (1, "2", "bad_csv", "4 fields"),
        (2, "3", "bad_csv", "2 fields"),
        (4, "5", "empty_text", "text is "),
    ]
    out = pq.read_table(tmp_path / "out")
    assert out.column("id").to_pylist() == ["1", "4", "6"] and out.column("row").to_pylist() == [0, 3, 5]
    assert out.column("label").to_pylist() == ["0", "1", "x"]


def test_csv_rows_are_record_places_with_bad_records_counted_across_parser_blocks(tmp_path):
    # ~2.5 MB: several of the parser's 1 MB blocks, bad records on both sides of their edges and last.
    bad = set(range(0, 40_000, 997)) | {39_999}
    lines = ["id,text"] + [f"{i},{'bad,' if i in bad else ''}row {i:05d} {'x' * 40}" for i in range(40_000)]
    lines[3] = '2,"a quoted\nfield over two lines"'  # one record, two lines
    (tmp_path / "a.csv").write_text("\n\n".join(lines[:5]) + "\n" + "\n".join(lines[5:]) + "\n")  # blank lines too
    cfg = InputConfig(path=str(tmp_path / "a.csv"), text="text", id="id")
    inputs = discover_shards(cfg)
    shard = inputs.shards[0]
    assert shard.num_rows == 40_000
    reader = open_reader(shard, read_spec(cfg, types=inputs.types))
    ids, errors = [], {}
    for start in range(0, 40_000, 7_001):
        block = reader.read(start, min(start + 7_001, 40_000))
        ids += block.table.column("id").to_pylist()
        errors |= {start + offset: problem for offset, problem in block.bad_rows.items()}
    reader.close()
    assert ids == [str(i) for i in range(40_000)]
    assert sorted(errors) == sorted(bad) and {reason for reason, _ in errors.values()} == {"bad_csv"}
    assert errors[997][1] == f"3 fields where the header has 2: '997,bad,row 00997 {'x' * 40}'"


CSV_QUOTES = [
    ('id,text\n1,"a ""quoted"" word"\n2,b\n', None),
    ('id,text\n1,a 5" screen\n2,b\n', None),  # a quote inside a field is text
    ('id,text\n1,"closed"then text"\n2,b\n', None),  # so is one after a closing quote
    ('id,text\n1,"two\r\nlines"\n2,""\n', None),
    ('id,text\n1,"x"', None),
    ('id,text\n1,"x"""', None),
    ('\ufeff"id","text"\n1,b\n', None),
    ('id,text\n1,"x"\n2,"y\n3,z\n', 3),
    ('id,text\n1,"a""\n2,b\n', 2),  # "" is a quote: the field is still open
    ('id,text\n1,"x""""\n', 2),  # two quotes as text, and no closing one
    ('id,text\n1,"x"""""\n', None),  # two quotes as text, then the closing one
    ('id,text\n1,x\r"open\n', 2),
    ('"id,text\n1,x\n', 1),
]


@pytest.mark.parametrize("text,line", CSV_QUOTES)
def test_a_quoted_field_open_at_the_end_is_found_whatever_the_block_edges(text, line):
    from batchinfer.sources.csv import _QuoteScan

    data = text.encode()
    for size in (1, 2, 3, len(data)):
        scan = _QuoteScan(",")
        for i in range(0, len(data), size):
            scan.feed(data[i : i + size])
        scan.feed(b"")
        assert scan.open_line == line, size


def test_a_quote_left_open_mid_file_is_refused_naming_its_row_never_merging_records(tmp_path):
    """pyarrow reads `id0049,"unterminated` up to the next quote as one field (id0050's record folded into it,
    a row gone, no error); a field meant to span lines closes before a delimiter or a line end, so it reads."""
    lines = ["id,text", *(f"id{i:04d},message number {i}" for i in range(300))]
    lines[50], lines[51] = 'id0049,"unterminated quote', 'id0050,"a quoted message"'
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    legit = ['1,"two lines\n2,that look like a record"', '3,"say ""hi"", twice\r\nover lines"', '4,5" screen']
    legit += ['5,"a"b', '6,"a space\nafter the quote" ', '7,"a ""quote""\nclosed ""well"""']
    (tmp_path / "b.csv").write_bytes(("id,text\r\n" + "\r\n".join(legit) + "\r\n").encode())
    with pytest.raises(InputError) as info:
        discover_shards(InputConfig(path=str(tmp_path), text="text", id="id"))
    assert "a.csv has a quote left open in row 49 (the record on line 51)" in info.value.message
    assert "runs on to line 52" in info.value.message and "b.csv" not in info.value.message
    assert info.value.hint.startswith("close the quote in the record on line 51") and "on_bad_shard" in info.value.hint
    cfg = InputConfig(path=str(tmp_path / "b.csv"), text="text", id="id")
    assert [r["text"] for r in _read_all(cfg)] == [
        "two lines\n2,that look like a record",
        'say "hi", twice\r\nover lines',
        '5" screen',
        "ab",
        "a space\nafter the quote ",
        'a "quote"\nclosed "well"',
    ]


def test_a_csv_that_ends_inside_a_quoted_field_is_refused_naming_the_line(tmp_path):
    (tmp_path / "a.csv").write_text('id,text\n1,ok\n2,too,many,fields\n3,third\n4,"unterminated\n5,x\n6,y\n')
    _csv(tmp_path / "b.csv", ROWS[:3])
    with pytest.raises(InputError) as info:
        discover_shards(InputConfig(path=str(tmp_path), text="text", id="id"))
    assert "a.csv ends inside a quoted field that opens on line 5 (row 3)" in info.value.message
    assert info.value.hint.startswith("close the quote on line 5") and "on_bad_shard: skip" in info.value.hint
    inputs = discover_shards(InputConfig(path=str(tmp_path), text="text", id="id", on_bad_shard="skip"))
    assert [s.name for s in inputs.shards] == ["b.csv"] and [b.name for b in inputs.bad] == ["a.csv"]


@pytest.mark.parametrize("name", ["empty.csv", "empty.tsv", "empty.jsonl"])
def test_an_empty_file_is_a_shard_of_no_rows(tmp_path, name):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(b"")
    _csv(tmp_path / "in" / "full.csv", ROWS[:5])
    cfg = InputConfig(path=str(tmp_path / "in"), text="text", id="id")
    inputs = discover_shards(cfg)
    assert {s.name: s.num_rows for s in inputs.shards} == {name: 0, "full.csv": 5} and inputs.bad == []
    assert [r["id"] for r in _read_all(cfg)] == ["0", "1", "2", "3", "4"]
    (tmp_path / "in" / "full.csv").unlink()
    # A byte-order mark and blank lines: no header either, and no JSONL row (a blank line is none).
    (tmp_path / "in" / name).write_bytes(b"\xef\xbb\xbf\n\r\n")
    assert [s.num_rows for s in discover_shards(cfg).shards] == [0]


@pytest.mark.parametrize("name, header", [("a.csv", b"id,text"), ("a.tsv", b"\xef\xbb\xbfid\ttext")])
def test_a_header_alone_is_a_shard_of_no_rows_and_a_quote_left_open_in_it_is_refused_by_line(tmp_path, name, header):
    (tmp_path / name).write_bytes(header)  # pyarrow: "Empty CSV file or block: cannot infer number of columns"
    inputs = discover_shards(InputConfig(path=str(tmp_path / name), text="text", id="id"))
    assert [s.num_rows for s in inputs.shards] == [0] and inputs.bad == []
    with pytest.raises(InputError) as info:
        discover_shards(InputConfig(path=str(tmp_path / name), text="body", id="id"))
    assert "body" in info.value.message
    (tmp_path / name).write_bytes(header.replace(b"text", b'"text') + b"\n1\ta\n")  # the header's quote left open
    with pytest.raises(InputError) as info:
        discover_shards(InputConfig(path=str(tmp_path / name), text="text", id="id"))
    assert "ends inside a quoted field that opens on line 1 (the header)" in info.value.message


def test_a_file_of_unknown_extension_says_so_and_names_the_formats(tmp_path):
    (tmp_path / "rows.txt").write_text("hello\n")
    with pytest.raises(InputError) as info:
        discover_shards(InputConfig(path=str(tmp_path / "rows.txt"), text="t"))
    assert "the file" in info.value.message and "extension" in info.value.message and "csv" in info.value.hint


def test_a_same_length_edit_anywhere_in_a_small_file_changes_its_identity(monkeypatch):
    import io

    import batchinfer.sources.file_identity as file_identity
    from batchinfer.sources.file_identity import content_digest

    data = bytearray(b"PAR1" + bytes(range(256)) * 40 + b"\x10\x00\x00\x00PAR1")
    edited = bytearray(data)
    edited[5000] ^= 1  # a byte in the middle, far from the footer
    assert content_digest(io.BytesIO(data)) != content_digest(io.BytesIO(edited))
    monkeypatch.setattr(file_identity, "FULL_HASH_BYTES", 100)  # a large file: footer, size and modification time
    assert content_digest(io.BytesIO(data), 1.0) == content_digest(io.BytesIO(edited), 1.0)
    assert content_digest(io.BytesIO(data), 1.0) != content_digest(io.BytesIO(data), 2.0)


def test_ids_never_round_and_an_empty_column_does_not_decide_the_type(tmp_path):
    big = 1234567890123456789
    pq.write_table(pa.table({"id": [big, 2], "text": ["a", "b"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3.0, None], "text": ["c", "d"]}), tmp_path / "b.parquet")  # pandas' int with a gap
    cfg = InputConfig(path=str(tmp_path / "*.parquet"), text="text", id="id")
    assert discover_shards(cfg).types == {"id": pa.string()}
    assert [r["id"] for r in _read_all(cfg)] == [str(big), "2", "3", None]
    _jsonl(tmp_path / "c.jsonl", [{"text": "x", "n": None}, {"text": "y"}])
    _jsonl(tmp_path / "d.jsonl", [{"text": "z", "n": 4}])
    cfg = InputConfig(path=str(tmp_path / "*.jsonl"), text="text", keep=["n"])
    assert discover_shards(cfg).types == {"n": pa.int64()}
    assert [r["n"] for r in _read_all(cfg)] == [None, None, 4]


def test_a_csv_field_that_is_not_utf8_costs_its_row_only(tmp_path):
    rows = b"id,text\n1,fine\n2,caf\xe9 au lait\n3,also fine\n"
    (tmp_path / "a.csv").write_bytes(rows)
    cfg = InputConfig(path=str(tmp_path / "a.csv"), text="text", id="id")
    shard = discover_shards(cfg).shards[0]
    block = open_reader(shard, read_spec(cfg, types=discover_shards(cfg).types)).read(0, 3)
    assert block.table.column("text").to_pylist() == ["fine", None, "also fine"]
    assert block.bad_rows == {1: ("bad_utf8", "field 'text' is not UTF-8: invalid continuation byte at byte 3")}


def test_python_exits_only_once_the_handlers_of_csv_readers_are_let_go(tmp_path):
    """pyarrow reads a CSV ahead on threads of its own, and a reader dropped early (a record it refused, a
    range read) can be released there, after its read: the release of its invalid-row handler takes the GIL,
    and while Python exits that ends the thread and aborts the process (pyarrow 24: 'terminate called without
    an active exception', 1 validate in 30 beside two busy processes). Exit waits until every handler is let
    go; here a thread that Python does not wait for holds one for half a second."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import pathlib, threading, time
        from batchinfer.sources import csv

        handler = csv._handler(lambda row: "skip")

        def hold(held=[handler]):
            time.sleep(0.5)
            pathlib.Path({str(tmp_path / "let go")!r}).touch()
            held.clear()

        threading.Thread(target=hold, daemon=True).start()
        del handler
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "let go").exists()


# --- a shard that changes while the job runs ----------------------------------------------------------------------

WRITERS = {
    "a.parquet": lambda path, rows: pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=16),
    "a.jsonl": lambda path, rows: _jsonl(path, rows),
    "a.csv": lambda path, rows: _csv(path, rows),
}


@pytest.mark.parametrize("how", ["renamed over", "rewritten in place"])
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_shard_changed_after_its_first_chunks_returns_no_row_of_the_new_file(tmp_path, name, how):
    """Same name, same row count, same byte length: the reader kept open must not serve a single row of
    the new version after the rows of the old (the probe found 12,288 old and 27,712 new rows in one
    'complete' result)."""
    import os

    path = tmp_path / name
    WRITERS[name](path, ROWS)
    os.utime(path, ns=(1_600_000_000 * 10**9,) * 2)  # written long before the job
    cfg = InputConfig(path=str(path), text="text", id="id")
    inputs = discover_shards(cfg)
    reader = open_reader(inputs.shards[0], read_spec(cfg, types=inputs.types))
    assert reader.read(0, 10).table.column("text").to_pylist() == [r["text"] for r in ROWS[:10]]
    changed = [{**r, "text": r["text"].upper()} for r in ROWS]
    if how == "renamed over":
        WRITERS[name](tmp_path / f"new-{name}", changed)
        os.replace(tmp_path / f"new-{name}", path)
    else:
        with open(path, "r+b") as f:  # the same inode, the same length, other bytes
            f.write(path.read_bytes().replace(b"message", b"MESSAGE"))
    with pytest.raises(READ_ERRORS) as caught:
        reader.read(10, 20)
    assert describe_read_error(caught.value).startswith("the file changed while the job ran: ")
    assert "another file was put in its place" in str(caught.value) or how == "rewritten in place"
    with pytest.raises(READ_ERRORS):  # a fresh reader of the old shard refuses too
        open_reader(inputs.shards[0], read_spec(cfg, types=inputs.types)).read(10, 20)


def test_a_parquet_footer_that_changed_is_refused_when_the_file_is_opened(tmp_path):
    """An object store may give no ETag and a modification time to the second only: the footer read at
    open still tells another version of the same size."""
    path = tmp_path / "a.parquet"
    WRITERS["a.parquet"](path, ROWS)
    cfg = InputConfig(path=str(path), text="text")
    shard = discover_shards(cfg).shards[0]
    stamp = tuple((k, "0" * 32 if k == "footer" else v) for k, v in shard.stamp)
    with pytest.raises(READ_ERRORS, match="its Parquet footer changed"):
        open_reader(replace(shard, stamp=stamp), read_spec(cfg)).read(0, 10)


def test_a_parquet_shard_is_opened_once_for_all_its_chunks(tmp_path, monkeypatch):
    import batchinfer.sources.parquet as parquet

    path = tmp_path / "a.parquet"
    WRITERS["a.parquet"](path, ROWS)
    opened = []
    real = parquet.open_random
    monkeypatch.setattr(parquet, "open_random", lambda *a: opened.append(a) or real(*a))
    cfg = InputConfig(path=str(path), text="text", id="id")
    assert [r["id"] for r in _read_all(cfg)] == [r["id"] for r in ROWS]
    assert len(opened) == 2  # once at discovery, once for the reader of every chunk


def test_one_big_row_group_reads_as_fast_and_as_small_as_many_small_ones():
    """pandas and pyarrow write up to a million rows in one row group: reading it chunk by chunk must cost
    what small row groups cost, in time and in peak memory (the benchmark, small: each file read in two
    processes of its own, taking turns with the other file's, the fastest of three reads in each)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "bench" / "rowgroups.py"
    sizes = [
        "--rows",
        "60000",
        "--text-bytes",
        "2000",
        "--chunk",
        "2000",
        "--group",
        "2000",
        "--passes",
        "3",
        "--rounds",
        "2",
    ]
    run = subprocess.run([sys.executable, str(script), *sizes, "--json"], capture_output=True, text=True, check=True)
    found = json.loads(run.stdout)
    assert found["one"]["rows"] == found["small"]["rows"] == 60_000
    assert found["one"]["seconds"] <= 1.3 * found["small"]["seconds"] + 0.05, found
    assert found["one"]["peak_mb"] <= 1.3 * found["small"]["peak_mb"], found


# No typed column: rows counted by blocks; an id or a kept column: line by line, to find their types.
@pytest.mark.parametrize("typed", [{}, {"id": "id", "keep": ["label"]}])
def test_blank_jsonl_lines_are_skipped_and_rows_count_the_lines_that_are_not(tmp_path, typed):
    lines = [json.dumps(r) for r in ROWS[:10]]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines[:3] + ["", "  \t"] + lines[3:7] + ["\r", ""] + lines[7:]) + "\n\n")
    cfg = InputConfig(path=str(path), text="text", **typed)
    assert discover_shards(cfg).shards[0].num_rows == 10
    assert [r["text"] for r in _read_all(cfg)] == [r["text"] for r in ROWS[:10]]  # no error row, none shifted


def test_blank_lines_of_an_openai_file_are_skipped_and_a_repeat_names_its_line(tmp_path):
    request = '{{"custom_id": "{}", "method": "POST", "url": "/v1/embeddings", "body": {{"input": "hi"}}}}'
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(["", request.format("a"), "  ", request.format("b"), "", request.format("a")]) + "\n")
    cfg = InputConfig(path=str(path), format="openai")
    shard = discover_shards(cfg).shards[0]
    assert shard.num_rows == 3 and shard.repeats == (
        (2, "custom_id 'a' repeats line 2 of requests.jsonl; only the first request runs"),
    )
    block = open_reader(shard, read_spec(cfg)).read(0, 3)
    assert block.table.column("custom_id").to_pylist() == ["a", "b", "a"]
    assert {row: reason for row, (reason, _) in block.bad_rows.items()} == {2: "duplicate_id"}


def test_a_saved_dataset_with_a_damaged_state_file_is_a_bad_shard_not_an_internal_error(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS[:5]).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "saved" / "state.json").write_text('{"_data_files": [')
    with pytest.raises(InputError) as info:  # the only shard: no readable one is left
        discover_shards(InputConfig(path=str(tmp_path / "saved"), text="text", id="id", on_bad_shard="skip"))
    assert "saved cannot be read: its state.json or dataset_info.json is not JSON" in info.value.message


def test_the_openai_source_says_which_request_columns_it_reads_and_the_job_names_what_it_keeps():
    """The job file knows nothing of OpenAI's request lines: the source adds their columns, in front."""
    cfg = InputConfig(path="requests.jsonl", format="openai", keep=["meta"])
    assert cfg.columns == ["url", "meta"]
    assert read_spec(cfg, [*cfg.columns, "limit"]).columns == (*REQUEST_COLUMNS, "meta", "limit")


@pytest.mark.parametrize("role", ["id", "keep"])
def test_a_column_whose_types_do_not_combine_names_the_key_it_is_read_for(tmp_path, role):
    """An id of a list type in one shard and text in another cannot be one column; the fix named the key the
    column is read for (it said "leave it out of input.keep" of an input.id)."""
    from batchinfer.sources.column_types import job_type

    found = {"a.parquet": pa.list_(pa.int64()), "b.csv": pa.string()}
    with pytest.raises(InputError) as info:
        job_type("ref", found, is_id=role == "id")
    assert "column 'ref' has types that do not combine across shards" in info.value.message
    fix = "or name another column as input.id" if role == "id" else "or leave it out of input.keep"
    assert info.value.hint == f"give every shard the same type for 'ref', {fix}"


@pytest.mark.parametrize("case", ["parquet read as jsonl", "utf-16"])
def test_a_binary_or_utf16_file_read_as_json_lines_is_a_bad_shard_not_a_shard_of_error_rows(tmp_path, case):
    """Every line of it was an error row (bad_utf8, bad_json), and the run 'completed'."""
    if case == "utf-16":
        (tmp_path / "a.jsonl").write_bytes('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n'.encode("utf-16"))
    else:
        pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.jsonl")
    for typed in ({}, {"id": "id"}):  # the typed pass reads every line; the other only the first lines
        with pytest.raises(InputError, match="it is not JSON Lines: its first line holds NUL bytes"):
            discover_shards(InputConfig(path=str(tmp_path / "a.jsonl"), text="text", **typed))
    (tmp_path / "b.jsonl").write_bytes(b'{"id": 1, "text": "a"}\n{"id": 2, "te\x00xt": \n')  # one bad line: one row
    assert discover_shards(InputConfig(path=str(tmp_path / "b.jsonl"), text="text", id="id")).shards[0].num_rows == 2


# --- links ---------------------------------------------------------------------------------------------------------


def _hub_snapshot(tmp_path, names=("train-00000.parquet", "train-00001.parquet")):
    """The Hugging Face hub cache's layout: snapshot files that are relative links to one extension-less blob."""
    (tmp_path / "blobs").mkdir()
    (tmp_path / "snap" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "blobs" / "3f9a1c")
    for name in names:
        (tmp_path / "snap" / "data" / name).symlink_to("../../blobs/3f9a1c")
    return tmp_path / "snap"


def test_a_link_is_a_shard_named_and_judged_by_its_own_path_and_read_through(tmp_path):
    """Two links to one extension-less blob are two parquet shards under their own names (not one name twice, nor
    refused for the blob's name); a link into another folder and a link given as input.path keep theirs too."""
    snapshot = _hub_snapshot(tmp_path)
    shards = discover_shards(InputConfig(path=str(snapshot), text="text")).shards
    assert [(s.name, s.format) for s in shards] == [
        ("train-00000.parquet", "parquet"),
        ("train-00001.parquet", "parquet"),
    ]
    assert _read_all(InputConfig(path=str(snapshot), text="text", id="id", keep=["label"])) == ROWS + ROWS
    (tmp_path / "elsewhere").mkdir()
    _jsonl(tmp_path / "elsewhere" / "d.jsonl", ROWS[:5])
    (snapshot / "data" / "more.jsonl").symlink_to(tmp_path / "elsewhere" / "d.jsonl")
    names = [s.name for s in discover_shards(InputConfig(path=str(snapshot / "data"), text="text")).shards]
    assert names == ["more.jsonl", "train-00000.parquet", "train-00001.parquet"]
    alone = discover_shards(InputConfig(path=str(snapshot / "data" / "train-00001.parquet"), text="text")).shards
    assert [(s.name, s.path) for s in alone] == [
        ("train-00001.parquet", str(snapshot / "data" / "train-00001.parquet"))
    ]


def test_a_link_to_a_folder_is_followed_and_a_loop_is_not_gone_round(tmp_path):
    (tmp_path / "in" / "a").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    _jsonl(tmp_path / "in" / "a" / "x.jsonl", ROWS[:3])
    _jsonl(tmp_path / "shared" / "y.jsonl", ROWS[3:5])
    (tmp_path / "in" / "more").symlink_to(tmp_path / "shared")
    (tmp_path / "in" / "a" / "again").symlink_to("..")  # a loop: in/a/again/a/again/...
    (tmp_path / "in" / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")  # dangling: not a shard
    for path in (tmp_path / "in", tmp_path / "in" / "**" / "*.jsonl"):
        names = [s.name for s in discover_shards(InputConfig(path=str(path), text="text")).shards]
        assert names == ["a/x.jsonl", "more/y.jsonl"]  # a/again/ leads back to in/: listed once, above


@pytest.mark.parametrize("layout", ["latest", "crossed"])
def test_a_folder_the_listing_reaches_twice_through_a_link_is_refused_naming_both(tmp_path, layout):
    """data/latest -> 2024-06-01 beside it (or two folders linking to each other) listed each shard twice, and a
    run read its rows twice. A glob that matches one of them reads it once."""
    data = tmp_path / "data"
    (data / "2024-06-01").mkdir(parents=True)
    _jsonl(data / "2024-06-01" / "x.jsonl", ROWS[:3])
    if layout == "latest":
        (data / "latest").symlink_to("2024-06-01")
        twice = [data / "2024-06-01" / "x.jsonl", data / "latest" / "x.jsonl"]
    else:
        (data / "b").mkdir()
        _jsonl(data / "b" / "y.jsonl", ROWS[3:5])
        (data / "2024-06-01" / "to-b").symlink_to("../b")
        (data / "b" / "back").symlink_to("../2024-06-01")
        twice = [data / "2024-06-01" / "x.jsonl", data / "b" / "back" / "x.jsonl"]
    with pytest.raises(InputError, match=f"lists {twice[0]} and {twice[1]}, one file reached through a link") as e:
        discover_shards(InputConfig(path=str(data), text="text"))
    assert "glob that matches one of them" in e.value.hint
    glob = discover_shards(InputConfig(path=str(data / "2024-*" / "*.jsonl"), text="text")).shards
    assert [s.path for s in glob] == [str(data / "2024-06-01" / "x.jsonl")]


def test_a_link_pointed_at_another_file_or_whose_file_changed_is_another_shard(tmp_path):
    """Resume compares each shard's rows and digest, and a reader its stamp: both see through the link."""
    snapshot = _hub_snapshot(tmp_path, names=("train.parquet",))
    link = snapshot / "data" / "train.parquet"
    cfg = InputConfig(path=str(snapshot), text="text", id="id")
    before = discover_shards(cfg)
    changed = [{**r, "text": r["text"].upper()} for r in ROWS]
    pq.write_table(pa.Table.from_pylist(changed), tmp_path / "blobs" / "b7e2d0")
    link.unlink()
    link.symlink_to("../../blobs/b7e2d0")
    after = discover_shards(cfg).shards
    assert [s.name for s in after] == [s.name for s in before.shards]
    assert shard_contents(after) != shard_contents(before.shards)
    with pytest.raises(READ_ERRORS, match="another file was put in its place"):
        open_reader(before.shards[0], read_spec(cfg, types=before.types)).read(0, 10)
    pq.write_table(pa.Table.from_pylist(ROWS[:10]), tmp_path / "blobs" / "b7e2d0")  # the target itself rewritten
    assert shard_contents(discover_shards(cfg).shards) != shard_contents(after)


def test_two_links_to_one_file_give_each_row_once_per_shard_into_an_output_inside_the_input(tmp_path, tiny_embed):
    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    snapshot = _hub_snapshot(tmp_path)
    job = validate_job(
        {
            "input": {"path": str(snapshot), "text": "text", "id": "id"},
            "model": {"path": str(tiny_embed), "task": "embed", "max_length": 32},
            "batching": {"chunk_rows": 16},
            "output": {"path": str(snapshot / "out")},
        }
    )
    assert run_job(job)["rows_ok"] == 2 * len(ROWS)
    table = pq.read_table(snapshot / "out", columns=["source", "row"]).to_pylist()
    assert sorted((r["source"], r["row"]) for r in table) == [
        (name, row) for name in ("train-00000.parquet", "train-00001.parquet") for row in range(len(ROWS))
    ]
    shards = json.loads((snapshot / "out" / "_batchinfer.json").read_text())["fingerprint"]["input.shards"]
    assert sorted(shards) == ["train-00000.parquet", "train-00001.parquet"]
    assert run_job(job)["rows_ok"] == 2 * len(ROWS)  # the same job again: nothing new, the output read back not
