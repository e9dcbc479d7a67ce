"""The model's own generation_config.json (runners/model_generation.py): every field transformers' generate applies
is applied by the engine that runs the job, row for row as model.generate gives it, or the job moves (engine auto,
with a note naming the field) or is refused (an engine named in the job file)."""

import json
import shutil

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import generate_alone, generate_job, prompt_table

from batchinfer.errors import ConfigError, OtherJobError
from batchinfer.execution.driver import run_job


def _with_generation(folder, tiny_llama, **settings):
    """A copy of the tiny Llama whose generation_config.json also sets `settings`."""
    folder.mkdir()
    for path in tiny_llama.iterdir():
        shutil.copy(path, folder / path.name)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, **settings}))
    return folder


@pytest.fixture(scope="module")
def penalized(tmp_path_factory, tiny_llama):
    """The tiny Llama with a repetition penalty (Qwen2.5-Instruct ships 1.05) and a minimum of new tokens: both
    taken by every engine here."""
    folder = tmp_path_factory.mktemp("penalized") / "model"
    return _with_generation(folder, tiny_llama, repetition_penalty=1.3, min_new_tokens=6)


@pytest.fixture(scope="module")
def suppressing(tmp_path_factory, tiny_llama):
    """The penalized Llama that also suppresses tokens and bans repeated trigrams: not the OpenVINO engine's."""
    folder = tmp_path_factory.mktemp("suppressing") / "model"
    return _with_generation(
        folder, tiny_llama, repetition_penalty=1.3, min_new_tokens=6, suppress_tokens=[287, 430], no_repeat_ngram_size=3
    )


def _run(tmp_path, sms_table, model, name, **settings):
    """The job's report and its rows, on prompts whose budgets differ per row."""
    if not (tmp_path / "prompts.parquet").exists():
        pq.write_table(prompt_table(sms_table, 12), tmp_path / "prompts.parquet")
    job = generate_job(tmp_path / "prompts.parquet", model, tmp_path / name, model__dtype="float32", **settings)
    report = run_job(job)
    return report, ds.dataset(str(tmp_path / name), format="parquet").to_table().to_pylist()


def _as_model_generate(model, rows, sms_table) -> None:
    """Every row's text is what transformers' generate gives for it alone, the model's generation_config applied."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    table = prompt_table(sms_table, 12)
    for row in rows:
        i = int(row["id"][1:])
        prompt = tokenizer(table.column("text")[i].as_py())["input_ids"]
        expected = generate_alone(model, prompt, table.column("budget")[i].as_py() or 16)
        assert row["text"] == tokenizer.decode(expected, skip_special_tokens=True), f"row {i}"


def _plain_differs(model, tiny_llama, sms_table) -> None:
    """The settings change the text: a test that ignored them would fail."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = tokenizer(prompt_table(sms_table, 1).column("text")[0].as_py())["input_ids"]
    assert generate_alone(model, prompt, 16) != generate_alone(tiny_llama, prompt, 16)


@pytest.mark.parametrize("engine", ["transformers", "static"])
def test_the_models_generation_config_is_applied_row_by_row_as_model_generate_does(
    sms_table, tmp_path, tiny_llama, suppressing, engine
):
    _plain_differs(suppressing, tiny_llama, sms_table)
    report, rows = _run(tmp_path, sms_table, suppressing, engine, generation__engine=engine)
    assert report["rows_ok"] == 12 and report["engine"]["name"] == engine
    _as_model_generate(suppressing, rows, sms_table)
    assert all(r["completion_tokens"] >= 6 or r["finish_reason"] == "length" for r in rows)  # min_new_tokens


def test_the_openvino_engine_applies_the_models_repetition_penalty_and_min_new_tokens(
    sms_table, tmp_path, tiny_llama, penalized
):
    pytest.importorskip("openvino_genai")
    _plain_differs(penalized, tiny_llama, sms_table)
    report, rows = _run(tmp_path, sms_table, penalized, "openvino", generation__engine="openvino")
    assert (report["engine"]["name"], report["engine"]["precision"]) == ("openvino", "f32")  # on every CPU kind
    _as_model_generate(penalized, rows, sms_table)


def test_engine_auto_moves_to_an_engine_that_applies_the_models_settings_and_says_which(
    sms_table, tmp_path, tiny_llama, suppressing
):
    pytest.importorskip("openvino_genai")
    report, rows = _run(tmp_path, sms_table, suppressing, "auto")
    assert report["engine"]["name"] == "transformers"
    (note,) = report["engine"]["notes"]
    assert "suppress_tokens [287, 430]" in note and "no_repeat_ngram_size 3" in note and "openvino" in note
    _as_model_generate(suppressing, rows, sms_table)
    with pytest.raises(ConfigError, match="suppress_tokens"):
        _run(tmp_path, sms_table, suppressing, "pinned", generation__engine="openvino")


def test_beam_search_moves_auto_to_model_generate_and_refuses_the_continuous_engine(sms_table, tmp_path, tiny_llama):
    beams = _with_generation(tmp_path / "beams", tiny_llama, num_beams=3, length_penalty=0.5)
    report, rows = _run(tmp_path, sms_table, beams, "auto")
    assert report["engine"]["name"] == "static"
    assert any("num_beams 3" in note and "length_penalty 0.5" in note for note in report["engine"]["notes"])
    _as_model_generate(beams, rows, sms_table)
    for engine in ("transformers", "openvino"):
        with pytest.raises(ConfigError, match="num_beams 3"):
            _run(tmp_path, sms_table, beams, engine, generation__engine=engine)


def test_a_field_no_engine_applies_as_generate_does_refuses_the_job(sms_table, tmp_path, tiny_llama):
    stops = _with_generation(tmp_path / "stops", tiny_llama, stop_strings=["lar"])
    for engine in ("auto", "static"):
        with pytest.raises(ConfigError, match="stop_strings"):
            _run(tmp_path, sms_table, stops, engine, generation__engine=engine)


def test_model_settings_lists_what_changes_generate_and_no_transformers_default():
    from transformers import GenerationConfig

    from batchinfer.runners.model_generation import model_settings, unhonoured

    quiet = GenerationConfig(repetition_penalty=1.0, length_penalty=0.7, num_beams=1, suppress_tokens=[], top_k=20)
    assert model_settings(quiet) == {}  # length_penalty is beam search's; top_k is the job's (generation.top_k)
    qwen = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    assert model_settings(qwen) == {"repetition_penalty": 1.05}
    assert unhonoured(qwen, "openvino") == [] and unhonoured(qwen, "vllm") == ["repetition_penalty"]
    guided = GenerationConfig(guidance_scale=1.5, min_p=0.1)
    assert unhonoured(guided, "transformers") == ["guidance_scale"] and unhonoured(guided, "static") == []


def test_a_model_whose_generation_config_samples_is_sampled_unless_the_job_says_how_to_decode(
    sms_table, tmp_path, tiny_llama
):
    """transformers' generate samples a model whose generation_config says do_sample (Qwen2.5-Instruct: temperature
    0.7, top_p 0.8, top_k 20); a job that sets none of temperature, top_p, top_k does too, seeded, with a note; one
    that sets any decodes as it says."""
    sampling = _with_generation(tmp_path / "sampling", tiny_llama, do_sample=True, temperature=0.7, top_p=0.8, top_k=20)
    report, rows = _run(tmp_path, sms_table, sampling, "own", generation__engine="transformers")
    assert any(
        "generation_config's temperature 0.7, top_p 0.8, top_k 20 (do_sample; seed" in n
        for n in report["engine"]["notes"]
    )
    asked = dict(generation__temperature=0.7, generation__top_p=0.8, generation__top_k=20)
    _, said = _run(tmp_path, sms_table, sampling, "said", generation__engine="transformers", **asked)
    _, greedy = _run(
        tmp_path, sms_table, sampling, "greedy", generation__engine="transformers", generation__temperature=0
    )
    # a job that sets some of the three: the others are the model's, as generate merges them into its config
    report, alone = _run(
        tmp_path, sms_table, sampling, "t", generation__engine="transformers", generation__temperature=0.7
    )
    assert any("generation_config's top_p 0.8, top_k 20" in n for n in report["engine"]["notes"])
    report, nucleus = _run(tmp_path, sms_table, sampling, "p", generation__engine="transformers", generation__top_p=0.5)
    assert any("generation_config's temperature 0.7, top_k 20" in n for n in report["engine"]["notes"])
    asked = dict(generation__temperature=0.7, generation__top_p=0.5, generation__top_k=20)
    _, nucleus_said = _run(tmp_path, sms_table, sampling, "p-said", generation__engine="transformers", **asked)
    texts = {
        name: [r["text"] for r in sorted(got, key=lambda r: r["id"])]
        for name, got in (
            ("own", rows),
            ("said", said),
            ("greedy", greedy),
            ("alone", alone),
            ("nucleus", nucleus),
            ("nucleus_said", nucleus_said),
        )
    }
    assert texts["own"] == texts["said"] == texts["alone"] != texts["greedy"]
    assert texts["nucleus"] == texts["nucleus_said"] != texts["greedy"]
    # a model that does not sample, and a job that sets top_p alone: greedy, as generate, and a note says so
    report, _ = _run(tmp_path, sms_table, tiny_llama, "idle", generation__engine="transformers", generation__top_p=0.5)
    assert any("generation.top_p 0.5 change nothing: the job decodes greedily" in n for n in report["engine"]["notes"])


def test_a_folder_sampled_without_the_models_settings_is_not_resumed_with_them(sms_table, tmp_path, tiny_llama):
    """Before 2026-12-07 a job that set top_p alone on a model that samples decoded with the job's defaults for the
    others (greedily): its folder's fingerprint, which the model's settings now taken are not in, does not let a run
    add rows sampled with them. Jobs whose rows are decoded as before (setting none, all three, temperature 0, or on a
    model that does not sample) fingerprint as before."""
    from batchinfer.execution.job_plan import JobPlan
    from batchinfer.job.plan import SAMPLING_FROM_MODEL

    sampling = _with_generation(tmp_path / "sampling", tiny_llama, do_sample=True, temperature=0.7, top_p=0.8, top_k=20)
    _run(tmp_path, sms_table, sampling, "p", generation__engine="transformers", generation__top_p=0.5)
    record = tmp_path / "p" / "_batchinfer.json"
    written = json.loads(record.read_text())
    assert written["fingerprint"][SAMPLING_FROM_MODEL] == ["temperature", "top_k"]
    del written["fingerprint"][SAMPLING_FROM_MODEL]  # as batchinfer wrote it before
    record.write_text(json.dumps(written))
    with pytest.raises(OtherJobError) as refused:
        _run(tmp_path, sms_table, sampling, "p", generation__engine="transformers", generation__top_p=0.5)
    assert "sampled with the job's defaults for temperature, top_k" in str(refused.value), refused.value
    assert "before 2026-12-07" in str(refused.value)
    prompts = tmp_path / "prompts.parquet"
    for model, settings in (
        (sampling, {}),
        (sampling, dict(generation__temperature=0.7, generation__top_p=0.5, generation__top_k=20)),
        (sampling, dict(generation__temperature=0, generation__top_p=0.5)),
        (tiny_llama, dict(generation__top_p=0.5)),
    ):
        job = generate_job(prompts, model, tmp_path / "any", **settings)
        assert SAMPLING_FROM_MODEL not in JobPlan.open(job).fingerprint(), settings
