import copy
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import check_docs_section

from batchinfer.errors import ConfigError
from batchinfer.job.config import (
    JobConfig,
    UniqueKeys,
    apply_override,
    load_job,
    reference_markdown,
    template_fields,
    validate_job,
    validate_with_overrides,
)

ROOT = Path(__file__).resolve().parent.parent
GOOD = {"input": {"path": "d", "text": "text"}, "model": {"path": "m", "task": "embed"}, "output": {"path": "o"}}


def _error(data) -> str:
    with pytest.raises(ConfigError) as info:
        validate_job(data)
    return info.value.message


@pytest.mark.parametrize("job", sorted((ROOT / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_job_validates(job):
    loaded = load_job(job)
    # what the file says is what runs: written back out and read again, the same job (no key dropped or defaulted
    # differently on the way)
    assert validate_job(loaded.model_dump(mode="json", exclude_unset=True)) == loaded


@pytest.mark.parametrize("job", sorted((ROOT / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_job_finds_its_input_and_model(job, monkeypatch):
    from typer.testing import CliRunner

    from batchinfer.cli import app

    monkeypatch.chdir(ROOT)  # the docs run them from the repository root
    path = load_job(job).model.path
    if path.startswith("models/") and not (ROOT / path).exists():
        pytest.skip(f"{path} is made by the command in the job's comments (the next test checks it is there)")
    result = CliRunner().invoke(app, ["validate", str(job.relative_to(ROOT))])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("job", sorted((ROOT / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_job_runs_offline_as_written(job):
    """No hub id (unreachable offline) and no engine pinned to the slow one on a CPU; a model the checkout does not
    ship is the SmolLM2 conversion under models/, whose command the job's comments give."""
    config, text = load_job(job), job.read_text()
    path = config.model.path
    assert path.startswith(("pkg:", "examples/", "models/")), path
    if path.startswith("models/"):
        assert f"python examples/models/convert_smollm2.py {path.rstrip('/')}" in text, job.name
    assert "engine: transformers" not in text and "Qwen/" not in text, job.name


def test_the_shipped_llm_jobs_summarize_and_extract_with_an_instruct_model_on_the_default_engine():
    summarize, extract = (load_job(ROOT / "jobs" / f"{name}-sms.yaml") for name in ("summarize", "extract"))
    for config in (summarize, extract):
        assert config.model.task == "generate" and config.input.text and config.model.chat
        assert config.model.path == "models/smollm2-135m-instruct" and config.generation.engine == "auto"
    assert summarize.model.system_prompt and extract.generation.response_format["type"] == "json_schema"


def test_job_file_reference_is_generated_from_the_models():
    """Regenerate with: BATCHINFER_UPDATE_DOCS=1 python -m pytest tests/test_config.py"""
    check_docs_section("job-file.md", "reference", reference_markdown())


def test_unknown_key_names_key_and_suggests():
    message = _error({**GOOD, "input": {"path": "d", "text": "t", "colum": "x"}})
    assert "input.colum: unknown key" in message
    assert "valid keys here: path, text, messages, id, keep, on_bad_shard, format" in message


def test_unknown_section_suggests():
    message = _error({**GOOD, "batchng": {}})
    assert "batchng: unknown key; did you mean 'batching'?" in message


def test_wrong_type_and_bad_value():
    message = _error({**GOOD, "batching": {"max_tokens": "lots"}, "model": {"path": "m", "task": "embedd"}})
    assert "batching.max_tokens: write a whole number of tokens such as 8192, or auto (got 'lots')" in message
    assert message.count("batching.max_tokens") == 1
    assert (
        "model.task: Input should be 'embed', 'classify', 'score', 'token-classify', 'zero-shot' or 'generate' "
        "(got 'embedd')"
    ) in message


@pytest.mark.parametrize(
    "section, key, given, said",
    [
        ("generation", "seed", True, "generation.seed: Input should be a valid integer (got True)"),
        ("batching", "max_rows", True, "batching.max_rows: Input should be a valid integer (got True)"),
        ("generation", "temperature", False, "generation.temperature: Input should be a valid number (got False)"),
        ("generation", "stop", ["ok", "a\ud800"], "generation.stop[1]: not valid Unicode (surrogates not allowed"),
        ("model", "system_prompt", "be \udcff brief", "model.system_prompt: not valid Unicode"),
        ("serve", "p99_ms", float("inf"), "serve.p99_ms: Input should be a finite number (got inf)"),
    ],
)
def test_a_boolean_for_a_number_or_a_lone_surrogate_is_refused_by_key(section, key, given, said):
    """YAML's true was seed 1 and false temperature 0 (pydantic reads a bool as a number); a lone surrogate (\\ud800
    in YAML or JSON) was a stop string no text ever holds. Both are the key's error now."""
    job = {**GOOD, "model": {"path": "m", "task": "generate"}, section: {key: given}}
    if section == "model":
        job["model"] = {**job["model"], key: given}
    assert said in _error(job)


def test_missing_key_says_what_to_write():
    message = _error({"input": {"text": "t"}, "model": {"path": "m", "task": "embed"}, "output": {"path": "o"}})
    assert "input.path: required; A file, a folder or a glob of shards" in message
    message = _error({"input": {"path": "d"}, "model": {"path": "m", "task": "embed"}, "output": {"path": "o"}})
    assert "input: give either text (a column or template) or messages (a column of chat messages)" in message


def test_bad_device_and_limits():
    assert "model.device: Value error" not in _error({**GOOD, "model": {**GOOD["model"], "device": "gpu"}})
    assert "write auto, cpu, cuda or cuda:N" in _error({**GOOD, "model": {**GOOD["model"], "device": "gpu"}})
    assert "batching.max_rows: Input should be greater than or equal to 1" in _error(
        {**GOOD, "batching": {"max_rows": 0}}
    )


def test_generation_settings_no_engine_takes_are_refused_by_name():
    """A seed OpenVINO GenAI cannot take (its rng_seed is unsigned) or an infinite temperature was passed to the
    engine, which failed inside the run."""
    generate = {**GOOD, "model": {"path": "m", "task": "generate"}}
    assert "generation.seed: Input should be greater than or equal to 0" in _error(
        {**generate, "generation": {"seed": -1}}
    )
    assert "generation.seed: Input should be less than or equal to" in _error(
        {**generate, "generation": {"seed": 2**63}}
    )
    assert "generation.temperature: Input should be a finite number" in _error(
        {**generate, "generation": {"temperature": float("inf")}}
    )
    assert validate_job({**generate, "generation": {"seed": 2**63 - 1}}).generation.seed == 2**63 - 1


def test_keep_column_clashing_with_output_is_refused():
    message = _error({**GOOD, "input": {"path": "d", "text": "t", "keep": ["embedding"]}})
    assert "input.keep: column 'embedding' would be written as 'embedding', a result column" in message
    assert "keep: {embedding: embedding_in}" in message
    # the hint renames the input's column, which keep may; it named the result column as if it were one
    message = _error({**GOOD, "input": {"path": "d", "text": "t", "keep": {"label": "embedding"}}})
    assert "column 'label' would be written as 'embedding'" in message and "keep: {label: label_in}" in message
    message = _error({**GOOD, "input": {"path": "d", "text": "t", "id": "embedding"}})
    assert "input.id: column 'embedding' clashes" in message  # keep cannot rename an id: no keep rename of it
    assert "leave input.id out and keep the column under another name: keep: {embedding: embedding_in}" in message
    renamed = {**GOOD, "input": {"path": "d", "text": "t", "keep": {"embedding": "old_embedding"}}}
    assert validate_job(renamed).input.kept == {"embedding": "old_embedding"}


def test_two_columns_kept_under_one_name_or_the_ids_are_refused_not_one_silently_dropped():
    clash = _error({**GOOD, "input": {"path": "d", "text": "t", "keep": {"title": "meta", "lang": "meta"}}})
    assert "input.keep: 'lang' and 'title' would both be written as column 'meta'" in clash
    assert "keep: {lang: lang_kept}" in clash
    onto_id = _error({**GOOD, "input": {"path": "d", "text": "t", "id": "id", "keep": {"title": "id"}}})
    assert "input.keep: 'title' and input.id would both be written as column 'id'" in onto_id
    kept_id_too = {**GOOD, "input": {"path": "d", "text": "t", "id": "id", "keep": ["id", "title"]}}
    assert validate_job(kept_id_too).input.kept == {"id": "id", "title": "title"}


def test_templates():
    assert template_fields("text") == ["text"]
    assert template_fields("{title}. {body} {title}") == ["title", "body"]
    assert template_fields("{{literal}} {x}") == ["x"]
    assert "does not parse" in _error({**GOOD, "input": {"path": "d", "text": "{title"}})
    assert "names no column" in _error({**GOOD, "input": {"path": "d", "text": "{{just braces}}"}})
    assert JobConfig.model_validate(
        {**GOOD, "input": {"path": "d", "text": "{a}: {b}", "keep": ["a"]}}
    ).input.columns == ["a", "b"]


def test_set_overrides_parse_yaml_values(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(GOOD))
    config = load_job(job, ["batching.max_tokens=8192", "model.allow_pickle=true", "input.keep=[a, b]"])
    assert config.batching.max_tokens == 8192 and config.model.allow_pickle is True and config.input.keep == ["a", "b"]
    with pytest.raises(ConfigError, match="batching.max_tokns: unknown key; did you mean 'max_tokens'"):
        load_job(job, ["batching.max_tokns=1"])


def test_a_bad_set_names_set_not_the_file(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(GOOD))
    with pytest.raises(ConfigError) as info:
        load_job(job, ["batching.max_token=4096", "model.dtype=f8"])
    assert info.value.message.startswith(f"--set on {job} is not valid:")
    assert "--set batching.max_token: unknown key; did you mean 'max_tokens'" in info.value.message
    assert "--set model.dtype: " in info.value.message and "fix the --set value" in info.value.hint
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**GOOD, "batching": {"max_tokns": 1}}))
    with pytest.raises(ConfigError) as info:  # the file's own problem is the file's, beside a --set's
        load_job(bad, ["model.dtype=f8"])
    lines = info.value.message.splitlines()
    assert lines[0] == f"{bad} is not a valid job:" and any(line.startswith("  --set model.dtype: ") for line in lines)
    assert any(line.startswith("  batching.max_tokns: unknown key") for line in lines)
    with pytest.raises(ConfigError, match="is not key=value"):
        load_job(job, ["batching.max_tokens"])


def test_job_file_problems(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_job(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("input: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_job(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_job(bad)
    bad.write_text("!!python/object/apply:os.system ['echo unsafe']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_job(bad)  # safe_load refuses to run code
    # a key given twice: YAML's loaders keep the last, and the first was lost unseen
    bad.write_text('input:\n  path: d\n  text: text\n  text: "{text}"\nmodel: {path: m}\noutput: {path: o}\n')
    with pytest.raises(ConfigError, match=r"the key 'text' is given twice\n  in .*, line 4, column 3"):
        load_job(bad)
    # ... in a --set value too, which would have been its text, a mapping where one is expected
    with pytest.raises(ConfigError, match=r"--set input: the key 'text' is given twice in '\{text: a, text: b\}'"):
        load_job(ROOT / "jobs" / "quickstart.yaml", ["input={text: a, text: b}"])
    # a merge key's values may be overridden, as YAML says
    bad.write_text(
        "d: &d {task: embed, max_length: 64}\ninput: {path: d, text: t}\nmodel: {<<: *d, path: m, max_length: 32}\n"
    )
    assert yaml.load(bad.read_text(), Loader=UniqueKeys)["model"] == {
        "task": "embed",
        "max_length": 32,
        "path": "m",
    }


def test_messages_do_not_echo_an_expanded_job_file(tmp_path):
    """A small "billion laughs" file expands to gigabytes of repr; the error stays a few lines."""
    lol = ["a: &a [" + ", ".join(["lol"] * 10) + "]"]
    for level in "bcdefgh":
        previous = chr(ord(level) - 1)
        lol.append(f"{level}: &{level} [" + ", ".join([f"*{previous}"] * 10) + "]")
    lol.append("input: {path: data, text: *h}\nmodel: {path: m, task: embed}\noutput: {path: out}")
    (tmp_path / "job.yaml").write_text("\n".join(lol))
    with pytest.raises(ConfigError) as info:
        load_job(tmp_path / "job.yaml")
    assert "input.text" in info.value.message and len(info.value.message) < 2000


def test_job_file_mistakes_each_say_the_fix(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    for path, said in [(tmp_path / "empty.yaml", "(it is empty)"), (tmp_path, "is a folder")]:
        with pytest.raises(ConfigError, match=re.escape(said)) as caught:
            load_job(path)
        assert caught.value.hint
    with pytest.raises(ConfigError, match="model.task is not a section") as caught:
        apply_override({"model": {"task": "embed"}}, "model.task.x=1")
    assert "--set model.task=VALUE" in caught.value.hint


def test_settings_that_would_give_ambiguous_or_ignored_output_are_refused():
    zero_shot = {**GOOD, "model": {"path": "m", "task": "zero-shot", "labels": ["spam", "spam", ""]}}
    assert "model.labels: each label once and with text" in _error(zero_shot)
    ner = {**GOOD, "model": {"path": "m", "task": "token-classify"}, "output": {"path": "o", "scores": True}}
    assert "output.scores: only for model.task classify or score, not token-classify" in _error(ner)
    unquoted = {**GOOD, "input": {"path": "d", "text": {"title": None}}}  # what YAML makes of text: {title}
    assert 'quote a template in YAML, e.g. text: "{title}. {body}"' in _error(unquoted)


def test_the_shipped_classifier_is_small_and_labels_messages_it_never_saw():
    import batchinfer

    model = ROOT / "examples" / "models" / "sms-spam-minilm"
    assert sum(f.stat().st_size for f in model.iterdir()) < 12e6  # a few MB in the repository
    held_out = pq.read_table(ROOT / "examples" / "sms_spam" / "sms-00001.parquet").slice(0, 400)  # not trained on
    table = batchinfer.infer(
        held_out.select(["text", "label"]).rename_columns(["text", "gold"]), model=str(model), task="classify"
    )
    labels, gold = table.column("label").to_pylist(), table.column("gold").to_pylist()
    assert set(labels) == {"ham", "spam"} and sum(a == b for a, b in zip(labels, gold)) / len(gold) >= 0.97


@pytest.mark.parametrize(
    "given, size", [("512MB", 512 * 10**6), ("4GB", 4 * 10**9), ("2GiB", 2 * 2**30), ("2 G", 2 * 10**9), (2048, 2048)]
)
def test_max_memory_is_read_into_bytes_by_the_config(given, size):
    job = validate_job({**GOOD, "model": {"path": "m", "task": "generate"}, "generation": {"max_memory": given}})
    assert job.generation.max_memory == size  # pydantic's ByteSize: the units as it reads them


@pytest.mark.parametrize("given", [None, 1.5, True, [1], "lots", 0])
def test_a_max_memory_that_is_no_size_is_one_line_naming_the_key(given):
    job = {**GOOD, "model": {"path": "m", "task": "generate"}, "generation": {"max_memory": given}}
    message = _error(job)
    assert message.count("generation.max_memory") == 1, message  # not one line per type tried (.int, .str)
    assert f"generation.max_memory: write a size such as 2GB, 512MB or 2147483648 (bytes), or auto (got {given!r})" in (
        message
    )


def test_keep_that_is_no_list_says_how_to_write_one():
    """One line naming the key with a list to copy, not one per type of the union in pydantic's words."""
    message = _error({**GOOD, "input": {"path": "d", "text": "t", "keep": "dataset"}})
    assert "input.keep: write a list of columns such as [dataset], or a mapping" in message
    assert "list[str]" not in message and "dict[str,str]" not in message and "Input should be" not in message
    with pytest.raises(ConfigError) as info:
        validate_with_overrides(copy.deepcopy(GOOD), ["input.keep=dataset"], "job.yaml")
    assert info.value.message.count("input.keep") == 1 and "--set input.keep: write a list" in info.value.message
    assert "list[str]" not in _error({**GOOD, "input": {"path": "d", "text": "t", "keep": [1]}})
    unclosed = _error({**GOOD, "input": {"path": "d", "text": "t", "keep": "[label"}})  # a --set short of its ]
    assert "such as [label], or" in unclosed and "[[label]" not in unclosed


def test_the_chat_keys_belong_to_text_prompts_of_a_causal_lm():
    gen = {"input": {"path": "d", "text": "t"}, "model": {"path": "m", "task": "generate"}, "output": {"path": "o"}}
    assert validate_job({**gen, "model": {**gen["model"], "system_prompt": "Be brief."}}).model.system_prompt
    embed = {"input": {"path": "d", "text": "t"}, "model": {"path": "m", "task": "embed", "chat": False}}
    message = _error({**embed, "output": {"path": "o"}})
    assert "model.chat: only for input.text with model.task generate" in message
    message = _error({**gen, "model": {**gen["model"], "chat": False, "system_prompt": "Be brief."}})
    assert "model.system_prompt: only with model.chat: true" in message


def test_a_blank_path_or_served_name_is_refused_not_read_as_the_current_folder_or_left_out():
    for blank in ("", "  "):
        assert "input.path: is empty: name a file, a folder or a glob" in _error(
            {**GOOD, "input": {"path": blank, "text": "t"}}
        )
        assert "output.path: is empty: name the output folder" in _error({**GOOD, "output": {"path": blank}})
        assert "serve.model_name: is empty: name the model id" in _error({**GOOD, "serve": {"model_name": blank}})


def test_an_empty_choices_list_or_stop_string_is_refused_not_run_as_if_absent():
    generate = {**GOOD, "model": {"path": "m", "task": "generate"}}
    assert "generation.choices: is empty: list the strings" in _error({**generate, "generation": {"choices": []}})
    assert "generation.stop: holds an empty string" in _error({**generate, "generation": {"stop": ["\n", ""]}})
    assert validate_job({**generate, "generation": {"stop": ["\n"]}}).generation.stop == ["\n"]
    assert validate_job({**generate, "generation": {"choices": ["ham", "spam"]}}).generation.choices == ["ham", "spam"]
