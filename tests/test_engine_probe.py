"""generation.engine auto on a CUDA GPU (runners/engine_probe.py): vLLM where installed, else the faster of
continuous batching and static batches on the job's first rows, recorded so that a resume keeps it. The choice
is tested with stand-in engines on a stand-in clock, and the wiring on the CPU with the device said to be CUDA."""

import importlib.util
import json

import pyarrow.parquet as pq
import pytest
from helpers import generate_job
from helpers import prompt_table as _prompts

import batchinfer.backends.models
from batchinfer.execution.driver import run_job
from batchinfer.job.config import GenerationConfig
from batchinfer.runners import engine_probe
from batchinfer.runners.engine import PassOutput, PassRows
from batchinfer.runners.engine_probe import CONTINUOUS, STATIC, FasterEngine, faster, probe_split
from batchinfer.runners.kv_cache import MAX_IN_FLIGHT, sequences_in_flight
from batchinfer.runners.vllm_engine import auto_problem


def test_the_probe_splits_alternate_rows_a_static_batch_each_and_leaves_too_few_unmeasured():
    assert probe_split(256, 32) == (list(range(0, 64, 2)), list(range(1, 64, 2)))
    assert probe_split(40, 256) == (list(range(0, 20, 2)), list(range(1, 20, 2)))  # a quarter of the pass each
    assert probe_split(15, 32) == ([], [])


def test_continuous_batching_is_kept_only_where_it_measured_faster_than_static():
    assert faster({CONTINUOUS: 2.0, STATIC: 1.0}) == CONTINUOUS
    assert faster({CONTINUOUS: 1.0, STATIC: 1.0}) == STATIC
    assert faster({CONTINUOUS: 0.39, STATIC: 1.0}) == STATIC
    assert faster({}) == STATIC


def test_vllm_is_auto_s_choice_on_a_gpu_only_where_it_is_installed_and_no_engine_options_name_another(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert auto_problem(GenerationConfig()) == "vllm is not installed (pip install 'batchinfer[vllm]')"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else real(name))
    assert auto_problem(GenerationConfig()) is None
    assert "engine_options are set" in auto_problem(GenerationConfig(engine_options={"num_blocks": 64}))


def test_in_flight_sequences_are_sized_from_free_kv_memory():
    per_token = 2 * 8 * 8 * 64 * 2  # keys and values, 8 layers, 8 heads of 64, bf16: the 57M Llama's 16 KiB
    assert sequences_in_flight(70 * 2**30, per_token, 300) == MAX_IN_FLIGHT  # half an H200 holds ~15,000
    assert sequences_in_flight(2**30, per_token, 300) == 218
    assert sequences_in_flight(10, per_token, 300) == 1  # never none


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


class StandIn:
    """An engine that 'generates' each row's budget of tokens (the row's first prompt token, repeated) at `rate`
    tokens per second of the shared clock, and remembers the prompts it ran."""

    pads = False
    shared_page = None

    def __init__(self, name, rate, clock):
        self.name, self.rate, self.clock = name, rate, clock
        self.described = {"name": name}
        self.ran: list[int] = []

    def note(self, note):
        self.described = {**self.described, "notes": [*self.described.get("notes", []), note]}

    def run(self, rows, max_rows, check):
        self.ran += [p[0] for p, m in zip(rows.prompts, rows.max_new) if m > 2]  # not the two-token warm-up
        self.clock.now += sum(rows.max_new) / self.rate
        return PassOutput([([p[0]] * m, None) for p, m in zip(rows.prompts, rows.max_new)], [0.1] * len(rows.prompts))


def _rows(n):
    return PassRows([GenerationConfig()] * n, [[i, 7] for i in range(n)], [8 + i % 5 for i in range(n)], [None] * n)


@pytest.mark.parametrize(("continuous", "static", "kept"), [(3000.0, 1000.0, CONTINUOUS), (533.0, 1373.0, STATIC)])
def test_the_probe_keeps_the_faster_engine_and_computes_no_row_twice(monkeypatch, continuous, static, kept):
    clock = Clock()
    monkeypatch.setattr(engine_probe.time, "perf_counter", clock)
    engines = {CONTINUOUS: StandIn(CONTINUOUS, continuous, clock), STATIC: StandIn(STATIC, static, clock)}
    engine = FasterEngine(engines)
    assert engine.name == STATIC  # static's grouping of rows until the choice
    rows = _rows(100)
    out = engine.run(rows, 8, lambda: None)
    assert [tokens for tokens, _ in out.raw] == [[i] * m for i, m in zip(range(100), rows.max_new)]
    ran = engines[CONTINUOUS].ran + engines[STATIC].ran
    assert sorted(ran) == list(range(100))  # every row once: the slices' completions are the rows'
    assert engines[CONTINUOUS].ran[:8] == list(range(0, 16, 2)) and engines[STATIC].ran[:8] == list(range(1, 16, 2))
    assert engine.name == kept and engine.described["name"] == kept
    assert engine.described["probe"] == {CONTINUOUS: continuous, STATIC: static, "rows": 8}
    assert f"{continuous / static:.2f}x the tokens/s of static batches" in engine.described["notes"][-1]
    assert engine.settled() == {"engine": kept, "tokens_per_s": engine.described["probe"]}
    assert engine.settled() is None  # handed on once, by the chunk that measured it
    before = len(engines[kept].ran)
    engine.run(_rows(10), 8, lambda: None)  # the next pass: the kept engine alone, no probe
    assert len(engines[kept].ran) == before + 10


def test_a_recorded_choice_is_kept_without_a_probe():
    clock = Clock()
    engines = {CONTINUOUS: StandIn(CONTINUOUS, 1.0, clock), STATIC: StandIn(STATIC, 2.0, clock)}
    engine = FasterEngine(engines, recorded=CONTINUOUS)
    engine.run(_rows(40), 8, lambda: None)
    assert engines[CONTINUOUS].ran == list(range(40)) and engines[STATIC].ran == []
    assert engine.settled() is None and "first run chose" in engine.described["notes"][-1]


def test_engine_auto_on_a_gpu_probes_records_its_choice_and_a_resume_keeps_it(
    sms_table, tiny_llama, tmp_path, monkeypatch
):
    """The device said to be CUDA (the model stays on the CPU): the first chunk probes, _batchinfer.json records
    the engine, the report says why, and the run that finishes the job runs the same engine without measuring."""
    monkeypatch.setattr(batchinfer.backends.models, "device_type", lambda name: "cuda")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, real=importlib.util.find_spec: None if name == "vllm" else real(name)
    )
    pq.write_table(_prompts(sms_table, 48), tmp_path / "prompts.parquet")
    job = generate_job(
        tmp_path / "prompts.parquet", tiny_llama, tmp_path / "out", generation__engine="auto", batching__chunk_rows=24
    )
    first = run_job(job, limit=24)
    recorded = json.loads((tmp_path / "out" / "_batchinfer.json").read_text())["tuning"]
    assert recorded["backend"] in (CONTINUOUS, STATIC) and set(recorded["engine_probe"]) == {CONTINUOUS, STATIC, "rows"}
    assert first["engine"]["name"] == recorded["backend"] and first["engine"]["probe"] == recorded["engine_probe"]
    assert any(n.startswith("engine auto on a GPU: not vllm") for n in first["engine"]["notes"])
    whole = run_job(job)
    last = whole["engine"][-1] if isinstance(whole["engine"], list) else whole["engine"]
    assert last["name"] == recorded["backend"] and "first run chose" in last["notes"][-1] and "probe" not in last
    assert whole["rows_ok"] == 48
