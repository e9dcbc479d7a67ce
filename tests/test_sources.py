import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchinfer.config import InputConfig
from batchinfer.errors import InputError
from batchinfer.sources import ShardReader, discover_shards

ROWS = [{"id": i, "text": f"message number {i}", "label": i % 2} for i in range(50)]


def _jsonl(path, rows, opener=open):
    with opener(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def _read_all(cfg: InputConfig) -> list[dict]:
    rows = []
    for shard in discover_shards(cfg)[0]:
        reader = ShardReader(shard, cfg.columns, ["text"])
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
    reader = ShardReader(shard, ["text"], ["text"])
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


def test_missing_column_lists_what_exists(tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    with pytest.raises(InputError, match=r"column 'body' not found in a.parquet; it has: id, text, label"):
        discover_shards(InputConfig(path=str(tmp_path / "a.parquet"), text="{text} {body}"))
    _jsonl(tmp_path / "b.jsonl", ROWS)
    with pytest.raises(InputError, match=r"column 'txt' not found in b.jsonl; it has: id, text, label"):
        discover_shards(InputConfig(path=str(tmp_path / "b.jsonl"), text="txt"))
