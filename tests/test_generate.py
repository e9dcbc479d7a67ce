"""task: generate. Greedy decoding must give, for every row and every engine that runs here, the
text `model.generate` gives for that row alone."""

import json
import signal
import sys
import time
from functools import partial

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from helpers import EXAMPLES, generate_job, run_until, write_job
from helpers import generate_alone as _alone
from helpers import prompt_table as _prompts

from batchinfer.errors import ConfigError, ModelError
from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job
from batchinfer.output.records import ChunkRecord

_job = partial(generate_job, generation__engine="transformers")


@pytest.mark.parametrize("engine", ["transformers", "static"])
@pytest.mark.parametrize("model", ["tiny_llama", "tiny_gpt2"])
def test_greedy_equals_model_generate_row_by_row(sms_table, tmp_path, request, engine, model):
    from transformers import AutoTokenizer

    model_path = request.getfixturevalue(model)
    table = _prompts(sms_table)
    pq.write_table(table, tmp_path / "prompts.parquet")
    report = run_job(_job(tmp_path / "prompts.parquet", model_path, tmp_path / "out", generation__engine=engine))
    out = ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    assert out.column("id").to_pylist() == table.column("id").to_pylist()
    assert out.column_names[-5:] == ["text", "finish_reason", "prompt_tokens", "completion_tokens", "truncated"]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    for row in out.to_pylist():
        i = int(row["id"][1:])
        prompt = tokenizer(table.column("text")[i].as_py())["input_ids"]
        limit = table.column("budget")[i].as_py() or 16
        expected = _alone(model_path, prompt, limit)
        assert row["text"] == tokenizer.decode(expected, skip_special_tokens=True), f"row {i}"
        assert row["prompt_tokens"] == len(prompt) and row["completion_tokens"] == len(expected)
        assert row["finish_reason"] == ("length" if len(expected) == limit else "stop")
    assert report["rows_ok"] == 24 and report["generated_tokens"] > 0


def test_chat_messages_use_the_chat_template(tmp_path, tiny_llama):
    from transformers import AutoTokenizer

    messages = [
        [{"role": "user", "content": "Free entry in 2 a wkly comp?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ok lar"}],
        None,
        "not a list",
        # OpenAI's text parts, as a batch file's request may send them: joined with newlines, as there
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [_part("Ok"), _part("lar")]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": m}) + "\n" for i, m in enumerate(messages)))
    job = validate_job(
        {
            "input": {"path": str(path), "messages": "messages", "id": "id"},
            "model": {"path": str(tiny_llama), "task": "generate"},
            "generation": {"max_new_tokens": 8},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    report = run_job(job)
    assert report["errors_by_reason"] == {"null_text": 1, "not_text": 1, "unsupported": 1}
    rows = ds.dataset(str(tmp_path / "out"), format="parquet").to_table().to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    joined = [messages[1][0], {"role": "user", "content": "Ok\nlar"}]
    for row, chat in ((rows[1], messages[1]), (rows[2], joined)):
        prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        expected = _alone(tiny_llama, tokenizer(prompt, add_special_tokens=False)["input_ids"], 8)
        assert row["text"] == tokenizer.decode(expected, skip_special_tokens=True)
        assert row["prompt_tokens"] == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def _part(text: str) -> dict:
    return {"type": "text", "text": text}


def test_a_text_template_on_a_chat_model_is_the_users_message_after_the_system_prompt(
    sms_table, tmp_path, tiny_llama, tiny_llama_plain
):
    """input.text on an instruct model: each row goes through the chat template as the user's turn (after
    model.system_prompt), as label scoring sends it, not as raw text the model was never trained to continue; a
    model without a template gets the text as written."""
    from transformers import AutoTokenizer

    table = _prompts(sms_table, 4).drop_columns(["budget"])
    pq.write_table(table, tmp_path / "p.parquet")
    system = "You summarize text messages in one sentence."
    job = partial(_job, tmp_path / "p.parquet", model__chat=None, generation__max_new_tokens_column=None)
    assert run_job(job(tiny_llama, tmp_path / "chat", model__system_prompt=system))["rows_ok"] == 4
    assert run_job(job(tiny_llama_plain, tmp_path / "plain"))["rows_ok"] == 4
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)

    def as_chat(text):
        turns = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        return tokenizer(
            tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )["input_ids"]

    for name, prompt_of in (("chat", as_chat), ("plain", lambda text: tokenizer(text)["input_ids"])):
        rows = ds.dataset(str(tmp_path / name), format="parquet").to_table().to_pylist()
        for row, text in zip(rows, table.column("text").to_pylist()):
            prompt = prompt_of(text)
            assert row["prompt_tokens"] == len(prompt), (name, row)
            assert row["text"] == tokenizer.decode(_alone(tiny_llama, prompt, 16), skip_special_tokens=True), name


def test_stop_strings_cut_the_text(sms_table, tmp_path, tiny_llama):
    table = _prompts(sms_table, 6)
    pq.write_table(table, tmp_path / "p.parquet")
    run_job(_job(tmp_path / "p.parquet", tiny_llama, tmp_path / "plain"))
    plain = ds.dataset(str(tmp_path / "plain"), format="parquet").to_table().column("text").to_pylist()
    stop = next(t[2:4] for t in plain if len(t) > 4)  # a string that occurs inside a completion
    run_job(_job(tmp_path / "p.parquet", tiny_llama, tmp_path / "stopped", generation__stop=[stop]))
    out = ds.dataset(str(tmp_path / "stopped"), format="parquet").to_table().to_pylist()
    for before, row in zip(plain, out):
        if stop in before:
            assert row["text"] == before[: before.index(stop)] and row["finish_reason"] == "stop"
        else:
            assert row["text"] == before


def test_sampling_is_repeatable_with_a_seed(sms_table, tmp_path, tiny_llama):
    pq.write_table(_prompts(sms_table, 6), tmp_path / "p.parquet")
    texts = []
    for k in range(2):
        run_job(
            _job(
                tmp_path / "p.parquet",
                tiny_llama,
                tmp_path / f"s{k}",
                generation={"temperature": 1.0, "top_p": 0.9, "seed": 7},
            )
        )
        texts.append(ds.dataset(str(tmp_path / f"s{k}"), format="parquet").to_table().column("text").to_pylist())
    assert texts[0] == texts[1]


def test_generate_errors_are_clear(tmp_path, tiny_embed, tiny_llama, sms_table):
    pq.write_table(_prompts(sms_table, 2), tmp_path / "p.parquet")
    with pytest.raises(ModelError, match="needs a causal language model"):
        run_job(_job(tmp_path / "p.parquet", tiny_embed, tmp_path / "out"))
    with pytest.raises(ModelError, match="needs vLLM|needs a CUDA GPU"):
        run_job(_job(tmp_path / "p.parquet", tiny_llama, tmp_path / "out2", generation__engine="vllm"))
    with pytest.raises(ConfigError, match="generation: only for model.task: generate"):
        validate_job(
            {
                "input": {"path": "x", "text": "t"},
                "model": {"path": "m", "task": "embed"},
                "generation": {"max_new_tokens": 3},
                "output": {"path": "o"},
            }
        )
    with pytest.raises(ModelError, match="engine_options"):
        run_job(
            _job(
                tmp_path / "p.parquet", tiny_llama, tmp_path / "out3", generation__engine_options={"no_such_option": 1}
            )
        )
    # transformers checks sizes in its generation thread: every row failed, 'check model.device' the advice
    with pytest.raises(ConfigError, match="generation.engine_options.max_batch_tokens: -5 is no size"):
        run_job(
            _job(
                tmp_path / "p.parquet",
                tiny_llama,
                tmp_path / "out4",
                generation__engine="transformers",
                generation__engine_options={"max_batch_tokens": -5},
            )
        )


def test_the_kv_cache_is_sized_from_the_job_not_the_machine():
    from batchinfer.runners.kv_cache import cache_blocks, kv_bytes_per_block

    # 300 prompts of 40 tokens with 32 new: one 256-token page each; 64 in flight.
    assert cache_blocks([72] * 300, 256, 64, 1000, 10**9) == 64
    assert cache_blocks([72] * 300, 256, 64, 1000, 20_000) == 20  # capped by max_memory
    assert cache_blocks([600, 72, 72], 256, 64, 1000, 1000) == 3  # never fewer than the longest request needs
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    assert kv_bytes_per_block(config, torch.float32, 256) == 2 * 2 * 2 * 16 * 256 * 4


def test_engine_options_fill_what_batchinfer_sets_and_keep_what_the_job_sets():
    from batchinfer.runners.kv_cache import engine_options, sized_by_user

    job = {"page_size": 64, "use_cuda_graph": True}
    options = engine_options(job, 8, 32, cpu=True, constrained=True, seeded=True)
    assert options == {
        "page_size": 64,
        "use_cuda_graph": True,
        "use_async_batching": False,  # masks need each step's tokens first
        "max_requests_per_batch": 8,
        "max_batch_tokens": 1024,
    }
    assert job == {"page_size": 64, "use_cuda_graph": True}  # the job's own options are not changed
    assert engine_options({}, 4, None, cpu=False, constrained=False, seeded=False) == {
        "max_requests_per_batch": 4,
        "page_size": 256,
    }
    assert not sized_by_user(options) and sized_by_user({"num_blocks": 9})
    assert sized_by_user({"max_memory_percent": 0.5})


def test_ctrl_c_stops_generation_within_seconds_and_keeps_finished_chunks(tmp_path, sms_table, tiny_llama):
    pq.write_table(pa.table({"text": sms_table.column("text").to_pylist()[:2000]}), tmp_path / "prompts.parquet")
    job = write_job(
        tmp_path,
        input={"path": str(tmp_path / "prompts.parquet"), "text": "text"},
        model={"path": str(tiny_llama), "task": "generate", "max_length": 64},
        batching={"chunk_rows": 32},
        generation={"max_new_tokens": 64},
        output={"path": str(tmp_path / "out")},
    )
    stopped = run_until(
        ["run", str(job), "--progress", "lines"],
        lambda _: any((tmp_path / "out" / "_done").glob("*.json")),
        signal.SIGINT,
        delay=0.5,  # inside the next chunk's generation
    )
    output, waited = stopped.output, stopped.seconds
    assert stopped.returncode == 130 and "stopped on SIGINT" in output, output
    assert waited < 5, f"took {waited:.1f} s to stop"
    assert "Traceback" not in output and "Batch processor" not in output and "WARNING" not in output.upper()
    assert list((tmp_path / "out" / "_done").glob("*.json"))


def _tokens(model_path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)(text)["input_ids"]


def test_each_rows_own_limit_is_checked_and_never_runs_past_the_context(tmp_path, tiny_llama):
    rows = [
        {"id": "ok", "text": "hello there", "budget": 3},
        {"id": "as-text", "text": "hello there", "budget": "5"},  # the column is text for the whole job
        {"id": "default", "text": "hello there", "budget": None},
        {"id": "negative", "text": "hello there", "budget": -5},
        {"id": "word", "text": "hello there", "budget": "x"},
        {"id": "absurd", "text": "hello there", "budget": 10**11},
    ]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = run_job(_job(tmp_path / "prompts.jsonl", tiny_llama, tmp_path / "out"))
    out = {r["id"]: r for r in ds.dataset(str(tmp_path / "out")).to_table().to_pylist()}
    prompt = out["ok"]["prompt_tokens"]
    for key, limit in (("ok", 3), ("as-text", 5), ("default", 16)):
        expected = _alone(tiny_llama, _tokens(tiny_llama, "hello there"), limit)
        assert out[key]["completion_tokens"] == len(expected), key
    context = json.loads((tiny_llama / "config.json").read_text())["max_position_embeddings"]
    assert prompt + out["absurd"]["completion_tokens"] <= context  # 10**11 sized a cache no machine has
    assert report["errors_by_reason"] == {"bad_max_new_tokens": 2}
    errors = ds.dataset(str(tmp_path / "out" / "_errors")).to_table().to_pylist()
    assert {e["id"] for e in errors} == {"negative", "word"} and "'x': give a whole number" in str(errors)


def test_finish_cuts_at_the_limit_at_eos_and_at_a_stop_string(tmp_path, tiny_llama):
    from batchinfer.runners import make_runner

    runner = make_runner(_job(tmp_path / "unused.parquet", tiny_llama, tmp_path / "out"), tiny_llama)
    ids = runner.tokenizer.encode("ok lar joking wif u oni", add_special_tokens=False)
    eos = min(runner.eos)
    assert runner.finish(ids, len(ids), []) == (ids, runner.tokenizer.decode(ids), "length")
    assert runner.finish(ids[:2] + [eos] + ids[2:], len(ids) + 1, []) == (
        ids[:2],
        runner.tokenizer.decode(ids[:2]),
        "stop",
    )
    assert runner.finish(ids, 3, [])[::2] == (ids[:3], "length")
    tokens, text, reason = runner.finish(ids, len(ids), ["joking"])
    assert (text, reason) == ("ok lar ", "stop") and tokens == runner.tokenizer.encode(text, add_special_tokens=False)


def test_generation_config_decodes_greedily_at_temperature_zero(tmp_path, tiny_llama):
    from batchinfer.runners import make_runner

    job = _job(tmp_path / "unused.parquet", tiny_llama, tmp_path / "out")
    from batchinfer.runners.engine import generation_config

    runner = make_runner(job, tiny_llama)
    greedy = generation_config(runner.model, job.generation, 5, runner.pad_id)
    assert (greedy.max_new_tokens, greedy.do_sample, greedy.temperature, greedy.top_k) == (5, False, None, None)
    sampled = generation_config(
        runner.model, job.generation.model_copy(update={"temperature": 0.7, "top_k": 0}), 9, runner.pad_id
    )
    assert (sampled.max_new_tokens, sampled.do_sample, sampled.temperature, sampled.top_k) == (9, True, 0.7, None)
    assert sampled.pad_token_id == runner.pad_id


def test_rows_that_share_an_instruction_read_it_from_the_cache_and_get_the_same_text(sms_table, tmp_path, tiny_llama):
    from transformers import AutoTokenizer

    from batchinfer.commands.dryrun import estimate_job
    from batchinfer.runners.continuous import SHARED_PAGE
    from batchinfer.runners.prefix import admission, page_hits

    instruction = "Reply to this text message as a friend would, in one short sentence, and never mention money. " * 3
    table = _prompts(sms_table, 8)
    table = table.set_column(1, "text", pa.array([instruction + t for t in table.column("text").to_pylist()]))
    pq.write_table(table, tmp_path / "p.parquet")
    report = run_job(_job(tmp_path / "p.parquet", tiny_llama, tmp_path / "out", model__max_length=512))
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    prompts = [tokenizer(t)["input_ids"] for t in table.column("text").to_pylist()]
    leaders, _, followers = admission(prompts, SHARED_PAGE)
    expected = page_hits([prompts[i] for i in leaders + followers], SHARED_PAGE)
    shared = len(tokenizer(instruction)["input_ids"]) // SHARED_PAGE * SHARED_PAGE
    assert (len(leaders), len(followers)) == (1, 7) and shared >= 2 * SHARED_PAGE
    assert report["prefix"] == {
        "tokens": max(expected),
        "rows": 7,  # every row but the one prefilled first
        "saved_tokens": sum(expected),
        # of the prompt tokens in full: a generation record's tokens count every prompt token, cached or not
        "saved_share": round(sum(expected) / report["tokens"], 4),
    }
    marker = json.loads(next((tmp_path / "out" / "_done").glob("*.json")).read_text())
    assert ChunkRecord.from_marker(marker).prefix == {
        "tokens": max(expected),
        "rows": 7,
        "saved_tokens": sum(expected),
        "prompt_tokens": sum(map(len, prompts)),  # label scoring's records have the same shape
    }
    assert min(h for h in expected if h) >= shared
    for row in ds.dataset(str(tmp_path / "out"), format="parquet").to_table().to_pylist():
        i = int(row["id"][1:])
        limit = table.column("budget")[i].as_py() or 16
        assert row["text"] == tokenizer.decode(_alone(tiny_llama, prompts[i], limit), skip_special_tokens=True)
    planned = estimate_job(_job(tmp_path / "p.parquet", tiny_llama, tmp_path / "plan", model__max_length=512))
    assert planned["prefix"] == report["prefix"]  # one chunk, every row sampled: the estimate is what ran


def test_rows_the_chat_template_refuses_are_error_rows_and_the_others_run(tmp_path, tiny_llama):
    """A template may raise on a row (Gemma's on a system message, Mistral's on roles out of turn): that row goes
    to _errors/ as bad_chat, naming the template and what it said, and the job's other rows run. It failed the
    whole job with an internal error, no row written."""
    sys.path.insert(0, str(EXAMPLES / "models"))
    from make_tiny_causal import CHAT_TEMPLATE

    no_system = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    (tmp_path / "chat.jinja").write_text(no_system + CHAT_TEMPLATE)
    messages = [[{"role": "user", "content": "Ok lar"}], [{"role": "system", "content": "Be brief."}]] * 3
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": m}) + "\n" for i, m in enumerate(messages)))
    job = {
        "input": {"path": str(path), "messages": "messages", "id": "id"},
        "model": {"path": str(tiny_llama), "task": "generate", "chat_template": str(tmp_path / "chat.jinja")},
        "generation": {"max_new_tokens": 4, "engine": "transformers"},
        "output": {"path": str(tmp_path / "out")},
    }
    report = run_job(validate_job(job))
    assert report["rows_ok"] == 3 and report["errors_by_reason"] == {"bad_chat": 3}
    errors = pq.read_table(tmp_path / "out" / "_errors").to_pylist()
    assert sorted(e["id"] for e in errors) == ["1", "3", "5"]
    assert errors[0]["message"] == (
        "the model's chat template refuses these messages: TemplateError: System role not supported; check the "
        "messages, or model.chat_template"
    )
    # a text template with a system prompt: every row would be refused, so the job stops before a row runs
    text_job = {
        **job,
        "input": {"path": str(tmp_path / "p.jsonl"), "text": "{q}"},
        "output": {"path": str(tmp_path / "t")},
    }
    (tmp_path / "p.jsonl").write_text('{"q": "Ok lar"}\n')
    text_job["model"] = {**job["model"], "system_prompt": "Be brief."}
    with pytest.raises(ConfigError, match="refuses a system message then a user's message, as every row would be") as e:
        run_job(validate_job(text_job))
    assert e.value.hint.startswith("remove model.system_prompt")
    text_job["model"].pop("system_prompt")  # as the hint says: the same folder then runs, nothing to restart
    assert run_job(validate_job(text_job))["rows_ok"] == 1


def test_a_messages_job_on_a_model_without_a_chat_template_is_refused_before_it_starts(tmp_path, tiny_llama_plain):
    sys.path.insert(0, str(EXAMPLES / "models"))
    from make_tiny_causal import CHAT_TEMPLATE

    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"id": 0, "messages": [{"role": "user", "content": "Ok lar"}]}) + "\n")
    job = {
        "input": {"path": str(path), "messages": "messages", "id": "id"},
        "model": {"path": str(tiny_llama_plain), "task": "generate"},
        "generation": {"max_new_tokens": 4},
        "output": {"path": str(tmp_path / "out")},
    }
    with pytest.raises(ModelError, match="input.messages \\('messages'\\): chat messages need a chat template") as e:
        run_job(validate_job(job))
    assert "model.chat_template" in e.value.hint and not (tmp_path / "out").exists()
    (tmp_path / "chat.jinja").write_text(CHAT_TEMPLATE)
    job["model"]["chat_template"] = str(tmp_path / "chat.jinja")
    run_job(validate_job(job))
    assert ds.dataset(str(tmp_path / "out")).to_table().column("completion_tokens").to_pylist()[0] > 0


@pytest.mark.parametrize("task", ["generate", "classify"])
def test_a_system_prompt_on_a_model_without_a_chat_template_is_refused_before_it_starts(
    sms_table, tmp_path, tiny_llama_plain, task
):
    """A base model has no chat template to hold model.system_prompt: the rows would run without it, in silence."""
    pq.write_table(_prompts(sms_table, 2).drop_columns(["budget"]), tmp_path / "p.parquet")
    labels = {"labels": ["yes", "no"]} if task == "classify" else {}
    job = {
        "input": {"path": str(tmp_path / "p.parquet"), "text": "text", "id": "id"},
        "model": {"path": str(tiny_llama_plain), "task": task, "system_prompt": "Be brief.", **labels},
        "output": {"path": str(tmp_path / "out")},
    }
    with pytest.raises(ModelError, match="model.system_prompt: .* has no chat template") as e:
        run_job(validate_job(job))
    assert "input.text" in e.value.hint and "model.chat_template" in e.value.hint
    assert not (tmp_path / "out").exists()


def test_model_chat_template_is_checked_and_its_text_is_in_the_fingerprint(tmp_path):
    from batchinfer.job.plan import fingerprint

    (tmp_path / "chat.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    sections = {
        "input": {"path": "x", "messages": "m"},
        "model": {"path": "m", "task": "generate", "chat_template": str(tmp_path / "chat.jinja")},
        "output": {"path": "o"},
    }
    before = fingerprint(validate_job(sections), "hash", {})
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}{{ m['role'] }}{% endfor %}")
    after = fingerprint(validate_job(sections), "hash", {})
    assert before["model.chat_template"] != after["model.chat_template"]  # a changed file is a changed job
    assert "model.chat_template" not in fingerprint(
        validate_job({**sections, "model": {"path": "m", "task": "generate"}}), "hash", {}
    )
    for given, said in (
        (str(tmp_path / "none.jinja"), "is neither a Jinja template nor a file"),
        ("{% for m in messages %}", "the template does not parse"),
    ):
        sections["model"]["chat_template"] = given
        with pytest.raises(ConfigError, match=said):
            fingerprint(validate_job(sections), "hash", {})
    with pytest.raises(ConfigError, match="model.chat_template: only for model.task generate"):
        validate_job(
            {
                **sections,
                "input": {"path": "x", "text": "t"},
                "model": {"path": "m", "task": "embed", "chat_template": "{{ x }}"},
            }
        )


def test_engine_passes_part_rows_only_by_what_the_engine_cannot_take_per_row():
    from batchinfer.job.config import GenerationConfig
    from batchinfer.runners.engine import engine_class
    from batchinfer.runners.openvino_engine import OpenVINOEngine

    greedy = [GenerationConfig(seed=i, stop=[str(i)], top_p=0.5 + i / 10) for i in range(3)]
    hot = [GenerationConfig(temperature=0.8, seed=i) for i in range(3)] + [GenerationConfig(temperature=0.5)]
    rows = greedy + hot
    # each engine's own grouping (a method that reads none of the engine's state)
    transformers, static, vllm = (engine_class(name).passes for name in ("transformers", "static", "vllm"))
    assert transformers(None, rows) == [[0, 1, 2], [3, 4, 5], [6]]
    assert static(None, rows) == [[0, 1, 2], [3], [4], [5], [6]]
    assert vllm(None, rows) == OpenVINOEngine.passes(None, rows) == [list(range(7))]
    assert transformers(None, rows, skip={1, 6}) == [[0, 2], [3, 4, 5]]


def test_a_rows_own_settings_are_checked_as_the_job_files_are(tmp_path, tiny_llama):
    from batchinfer.runners import make_runner

    pytest.importorskip("xgrammar")
    runner = make_runner(
        _job(tmp_path / "unused.parquet", tiny_llama, tmp_path / "out", generation__regex="(yes|no)"), tiny_llama
    )
    gen, problem = runner.row_config({"temperature": 0.5, "seed": 3, "top_p": None})
    assert problem is None and (gen.temperature, gen.seed, gen.top_p, gen.regex) == (0.5, 3, 1.0, "(yes|no)")
    assert runner.row_config({"stop": None}) == (runner.gen, None)
    gen, problem = runner.row_config({"stop": ["\n"]})  # was copied past the checks, and could cut the regex output
    assert (
        gen is runner.gen and problem[0] == "bad_request" and "a stop string could cut the regex output" in problem[1]
    )


def test_a_lower_max_memory_resumes_the_job_and_a_changed_temperature_is_refused_by_name(
    tmp_path, sms_table, tiny_llama
):
    """Lowering generation.max_memory is what a user does after an out-of-memory: the same job, resumed. A
    setting that changes results refuses, naming the one key (not the whole generation section)."""
    from batchinfer.errors import ResumeError

    pq.write_table(_prompts(sms_table, 6), tmp_path / "p.parquet")
    job = partial(_job, tmp_path / "p.parquet", tiny_llama, tmp_path / "out", batching__chunk_rows=2)
    first = run_job(job(generation__max_memory="1GB"), limit=2)
    assert first["rows_ok"] == 2
    resumed = run_job(job(generation__max_memory="64MB"))
    assert resumed["complete"] and resumed["rows_ok"] == 6 and resumed["run"]["rows"] == 4
    with pytest.raises(ResumeError) as refused:
        run_job(job(generation__max_memory="64MB", generation__temperature=0.5, generation__seed=1))
    assert "generation.temperature: 0.0 -> 0.5" in refused.value.message
    assert "generation.seed: 0 -> 1" in refused.value.message and "max_new_tokens" not in refused.value.message


def test_the_first_plan_of_a_model_leaves_its_conversion_out_of_the_start_up_a_run_will_take(
    sms_table, tmp_path, tiny_llama, monkeypatch
):
    """The first plan of a model converts it for OpenVINO (and loads the weights it converts from), which the run
    then reads from the cache: counted in the start-up, the estimate of SmolLM2's 100 rows was 37 s where the run
    took 22 s. Plan now leaves that out, says so, and the run's report counts it where a run converts."""
    pytest.importorskip("openvino_genai")
    from typer.testing import CliRunner

    from batchinfer.backends import openvino_causal
    from batchinfer.cli import app
    from batchinfer.commands import sample_timing
    from batchinfer.commands.dryrun import estimate_job
    from batchinfer.runners.generate import GenerateRunner

    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))  # a cold cache: this plan converts
    export = openvino_causal._export
    monkeypatch.setattr(openvino_causal, "_export", lambda *a: (time.sleep(2.0), export(*a))[1])
    monkeypatch.setattr(sample_timing, "process_age", lambda: 100.0)  # the process's age when the model is loaded
    pq.write_table(_prompts(sms_table, 20), tmp_path / "p.parquet")
    raw = _job(tmp_path / "p.parquet", tiny_llama, tmp_path / "out", generation__engine="openvino", raw=True)
    cold = estimate_job(validate_job(raw))["estimate"]
    assert cold["converted_s"] > 2.0 and cold["startup_s"] <= 100.0 - cold["converted_s"]
    warm = estimate_job(validate_job(raw))["estimate"]  # read from the cache: nothing left out
    assert warm["converted_s"] == 0.0 and cold["startup_s"] < warm["startup_s"] < 100.0
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache2"))
    said = " ".join(CliRunner().invoke(app, ["plan", str(write_job(tmp_path, raw))]).output.split())
    assert "it spent converting the model for OpenVINO, which a run reads back)" in said
    runner = GenerateRunner.load(validate_job(raw), tiny_llama)  # cache2 holds it now: a run converts nothing
    assert "convert" not in runner.load_seconds


def test_a_generation_plan_fits_a_chunks_fixed_time_and_a_tokens_on_recorded_passes():
    """Passes recorded on SmolLM2, OpenVINO engine, 2-core Zen 4 EPYC: (rows, prompt and generated tokens,
    seconds) of 16 rows cold, then 16 and 48 warm; a 256-row chunk of 21,480 tokens then ran in 19.27 s. At the
    rate of the rows timed alone the plan said 1.4x the run; the line says the chunk within 5%, and the cold pass
    ran 1.55x it (a run's first 100-row chunk: 1.5x)."""
    from batchinfer.commands.sample_timing import fitted_costs, pass_sizes

    cold, chunk_s, token_s = fitted_costs([(16, 1678, 3.55), (16, 1386, 2.05), (48, 4036, 4.22)])
    assert chunk_s + token_s * 21480 == pytest.approx(19.27, rel=0.05)
    assert cold == pytest.approx(1.55, abs=0.05)
    # noise that tilts the line (the larger pass faster): no fixed part, the passes' mean cost a token
    assert fitted_costs([(16, 1678, 3.0), (16, 1386, 2.0), (48, 4036, 1.9)])[1:] == (0.0, pytest.approx(3.9 / 5422))
    assert pass_sizes(500) == (16, 16, 48) and pass_sizes(40) == (8, 8, 24) and pass_sizes(12) == (12,)


def test_a_generation_plan_fits_cpu_seconds_so_a_load_that_comes_between_passes_does_not_tilt_its_line():
    """Passes recorded beside CI's suite (load 3-4; SmolLM2, OpenVINO engine, 2-core AVX2 EPYC): (rows, tokens, CPU
    seconds, wall seconds); the --limit 100 run beside it (88 tokens a row, one chunk) computed for 68.0 s. Other
    processes take wall seconds, not CPU seconds: a line through wall seconds took a load that came between
    passes for a token's cost (the plan said 89 s for a 58 s run). The line goes through CPU seconds, and the work
    is made wall seconds at the share of the CPU the passes had together."""
    from batchinfer.commands.sample_timing import generation_work

    passes = [(16, 1520, 8.68, 13.45), (16, 1328, 5.01, 8.17), (48, 4064, 13.98, 21.06)]
    work = generation_work(passes, 88.0, 100, 1)
    assert work == pytest.approx(68.0, rel=0.1)
    later = [*passes[:2], (48, 4064, 13.98, 2 * 21.06)]  # the load doubled for the last pass alone
    for rows, chunks in ((100, 1), (5574, 22)):
        share = sum(p[3] for p in later) / sum(p[3] for p in passes)  # 1.49
        assert generation_work(later, 88.0, rows, chunks) == pytest.approx(
            share * generation_work(passes, 88.0, rows, chunks)
        )
    assert generation_work([(12, 900, 4.0, 6.0)], 75.0, 30, 1) == pytest.approx(30 * 6.0 / 12)  # one pass: its rate


@pytest.mark.parametrize("engine", ["transformers", "openvino"])
def test_plan_of_a_generation_job_times_completions_of_the_sample_on_the_jobs_engine(
    sms_table, tmp_path, tiny_llama, engine
):
    """plan gave a generation job no time at all: a row's time is its completion's, which only generating it tells.
    It now runs the completions of rows spread over the sample, on the job's own engine as the run's first chunk
    runs them, and gives the time at that rate; the CLI says so. Nothing is written."""
    if engine == "openvino":
        pytest.importorskip("openvino_genai")
    from typer.testing import CliRunner

    from batchinfer.cli import app
    from batchinfer.commands.dryrun import estimate_job
    from batchinfer.commands.sample_timing import GENERATED_PASSES

    pq.write_table(_prompts(sms_table, 40), tmp_path / "p.parquet")
    raw = _job(tmp_path / "p.parquet", tiny_llama, tmp_path / "out", generation__engine=engine, raw=True)
    planned = estimate_job(validate_job(raw))
    e = planned["estimate"]
    assert e["rate_from"] == "completions" and e["timed_rows"] == min(sum(GENERATED_PASSES), 40)
    assert e["timed_passes"] == 3  # 8, 8 and 24 of the 40: a set-up, and a line through the two warm ones
    assert e["rows_per_s"] > 0 and e["work_s"] == pytest.approx(40 / e["rows_per_s"])
    assert e["seconds"] == pytest.approx(e["startup_s"] + e["work_s"])
    assert 0 < e["generated_tokens_per_row"] <= 16 and engine in e["device"]
    assert 0 <= e["uncertainty"] < 1  # the completions' spread, said with the time
    said = " ".join(CliRunner().invoke(app, ["plan", str(write_job(tmp_path, raw))]).output.split())
    assert f"(the completions of {e['timed_rows']} rows of the sample, run as a run's chunks run them in three" in said
    assert f"known to ±{e['uncertainty']:.0%})" in said
    assert not (tmp_path / "out").exists()
