"""task: generate — a completion per row, by the configured engine (engine.py: continuous batching by
default, static batches as the baseline, vLLM on a GPU). The runner owns what is the task's: prompts and
their tokens, each row's own settings and constraint, the completion cut at eos and stop strings, the
constrained output checked, the result columns."""

from __future__ import annotations

import copy
import functools
import json
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import torch
from pydantic import ValidationError

from ..batching.budget import ProbeChoice
from ..batching.cut import computed_tokens
from ..constrained.spec import Constraint, job_constraint, response_format
from ..errors import ConfigError, ModelError
from ..job.config import GenerationConfig
from ..job.templates import no_chat_template
from ..messages import check_user_turn, render_chat, user_turn
from ..reasons import Reason
from ..sources.prepare import Prepared, row_limits
from . import model_generation
from .base import encode_capped
from .engine import AUTO_AFTER, AUTO_FIRST, Engine, PassRows, Registered, Unfit, engine_class
from .engine_probe import CONTINUOUS, MEASURED_ON, STATIC, FasterEngine
from .prefix import page_figures
from .protocol import ChunkContext, ChunkInput, ChunkOutput, Tokens
from .static import StaticEngine, in_order


@dataclass
class Generated:
    ids: list[list[int]]  # generated tokens per row, eos and anything after a stop string removed
    text: list[str]
    finish_reason: list[str]  # stop | length
    failed: dict[int, tuple[str, str]] = field(default_factory=dict)  # position -> (reason, message)
    first_token_seconds: list[float] = field(default_factory=list)
    prefix_hits: list[int] = field(default_factory=list)  # per row: prompt tokens read from the cache, not computed


class GenerateRunner:
    """Prompts → token ids (chat template for messages) → completions, by the configured engine."""

    score_labels = None

    @classmethod
    def load(cls, job, model_path, budget=None):
        """The runner for `job`: the model its engine runs (transformers', vllm.LLM; the engine class's `load`), and
        the engine: generation.engine's, or engine auto's (engine.AUTO_FIRST, AUTO_AFTER). `budget`: a recorded
        probe's choice (engine auto on a GPU: its engine, as Batching.backend)."""
        from ..backends.models import device_type

        device = device_type(job.model.device)
        recorded = budget.backend if budget is not None else None
        first, passed = first_engine(job, model_path, device, recorded)
        started = time.perf_counter()
        tokenizer, model, torch_device = (first or engine_class(AUTO_AFTER[0])).load(job, model_path)
        loaded = time.perf_counter() - started
        own = getattr(model, "generation_config", None) or model_generation.from_folder(model_path)  # vllm.LLM: none
        gen, sampled = model_generation.model_sampling(job.generation, own)
        if job.model.chat and job.input.text and tokenizer.chat_template:  # each row's text: the user's turn
            check_user_turn(tokenizer, job.model.system_prompt)
        runner = cls(tokenizer, model, torch_device, job.model.max_length, gen, precision_of(job, torch_device))
        runner.engine = runner.settle(first, passed, job, model_path, device, recorded)
        if "convert" in runner.load_seconds:  # the weights were loaded for the conversion: a later run reads neither
            runner.load_seconds["convert"] = round(runner.load_seconds["convert"] + loaded, 3)
        if sampled:
            runner.engine.note(sampled)
        return runner

    def __init__(
        self, tokenizer, model, device: torch.device, max_length: int, gen: GenerationConfig, precision: str = "f32"
    ):
        self.tokenizer = tokenizer
        self.model = model
        self.device = device
        self.gen = gen
        self.precision = precision  # the loaded model's, by name (the torch engines run in it)
        self.load_seconds: dict = {}  # the report's startup steps: the engine's conversion, where it made one
        # Positions the model knows; vllm.LLM keeps its own (max_model_len).
        self.context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        # A prompt leaves room for at least one new token inside the context.
        self.max_length = min(max_length, self.context - 1) if self.context else max_length
        # Keep the end of an over-long prompt: that is where the question is.
        self.backend = copy.deepcopy(tokenizer.backend_tokenizer)
        self.backend.enable_truncation(self.max_length, direction="left")
        self.backend.no_padding()
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None) or tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos), 0)
        self.engine: Engine | None = None  # load settles it (settle)
        self._model_engine: Engine | None = None  # model_engine's, once built
        self.probed: FasterEngine | None = None  # engine auto on a GPU without vLLM (measured)
        self._configs: dict[str, tuple] = {}  # a row's own settings (JSON) -> row_config's answer
        self.constraint = job_constraint(gen)  # every row's, unless an OpenAI request brings its own
        if self.constraint is not None:
            from ..constrained.grammar import UNCOMPILABLE, Uncompilable

            try:
                self.grammars.compile(self.constraint)
            except Uncompilable as exc:
                raise ConfigError(str(exc), UNCOMPILABLE) from None

    @functools.cached_property
    def grammars(self):
        """xgrammar's compiler for this tokenizer, built on first use (constrained/grammar.py)."""
        from ..constrained.grammar import Grammars

        config = getattr(self.model, "config", None)
        vocab = config.get_text_config().vocab_size if config is not None else len(self.tokenizer)
        return Grammars(self.tokenizer, max(vocab, len(self.tokenizer)), self.eos, self.gen.grammar_limits)

    def settle(
        self, first: type[Registered] | None, passed: list[str], job, model_path, device: str, recorded
    ) -> Engine:
        """The engine that runs the job: `first`'s (first_engine) where it can run it (an engine named in the job
        file, else refused); else engine auto's over the loaded model (model_engine; on a CUDA GPU the faster of
        two, measured), with notes saying why auto passed over what it did (`passed`)."""
        if first is not None:
            try:
                return first.build(self, job, model_path)
            except Unfit as exc:
                if self.gen.engine != "auto":
                    raise first.named_error(str(exc)) from None
                passed = [first.passed_over(str(exc), AUTO_AFTER[0])]
        if device == MEASURED_ON:
            engine = self.measured(job, model_path, recorded)
        else:
            engine = self.model_engine(job, model_path)
        for note in passed:
            engine.note(note)
        return engine

    def model_engine(self, job, model_path) -> Engine:
        """Engine auto's engine over the loaded model, built on first use (a run on OpenVINO GenAI imports
        transformers' continuous batching, seconds, only if rows go to it): the first in engine.AUTO_AFTER that
        applies all of the model's generation_config (model_generation), with a note saying why of each passed
        over; for generation.engine openvino (its rows that cannot run there come here), the first or an error."""
        if self._model_engine is not None:
            return self._model_engine
        names = AUTO_AFTER if self.gen.engine == "auto" else AUTO_AFTER[:1]
        unfit: list[tuple[type[Registered], str]] = []  # (engine class, why), of those passed over
        for name in names:
            candidate = engine_class(name)
            try:
                built = candidate.build(self, job, model_path)
            except Unfit as exc:
                unfit.append((candidate, str(exc)))
                continue
            for (engine, problem), instead in zip(unfit, names[1:]):
                built.note(engine.passed_over(problem, instead))
            self._model_engine = built
            return built
        engine, problem = unfit[0]
        raise engine.named_error(problem)  # the first's problem: what a fix starts with

    def in_precision(self, described: dict) -> dict:
        """An engine's report entry saying the precision the loaded model runs in."""
        return {**described, "precision": self.precision}

    def shared_page(self) -> int | None:
        """The cache page (tokens) in which the engine shares rows' common prefixes; None when it shares none."""
        return self.engine.shared_page

    def f32_model(self, job, model_path) -> Callable:
        """() -> the model in float32, for a conversion: the loaded one, or (model.dtype bfloat16) a float32 load."""
        if self.precision == "f32":
            return lambda: self.model
        from ..backends.models import load_model

        return lambda: load_model(job.model.model_copy(update={"dtype": "float32"}), model_path)[1]

    def measured(self, job, model_path, recorded: str | None) -> Engine:
        """engine auto on a CUDA GPU without vLLM (engine_probe.py): whichever of continuous batching and static
        batches the first rows measure faster (`recorded`: what an earlier run of the job chose)."""
        static = StaticEngine(self.model, self.device, self.pad_id, lambda: self.grammars)
        static.described = self.in_precision(static.described)
        self.probed = FasterEngine({CONTINUOUS: self.model_engine(job, model_path), STATIC: static}, recorded)
        return self.probed

    @property
    def backends(self) -> tuple[str, ...]:
        """The engines another worker's probe may choose for this one (ChunkTask.take)."""
        return tuple(self.probed.engines) if self.probed else ()

    def keep(self, backend: str, precision: str | None = None) -> None:
        """Run the engine named `backend` (a probe records its engine as the backend), as another worker's probe
        chose."""
        self.probed.keep(backend, "engine auto on a GPU: as another worker's probe chose")

    def tuning(self, budget) -> ProbeChoice | None:
        """engine auto on a GPU, in the chunk that probed: its choice as the output folder records a probe's
        (backend: the engine), so that a resumed run and the other workers keep it; else None."""
        probed = self.probed.settled() if self.probed else None
        if probed is None:
            return None
        engine = {"backend": probed["engine"], "engine_probe": probed["tokens_per_s"]}
        return ProbeChoice(max_tokens=budget.max_tokens, strategy=budget.strategy, **engine)

    # --- prompts ---------------------------------------------------------------------------------------------

    def chat_problem(self, where: str) -> str | None:
        """Why chat messages at `where` cannot be formatted for this model (it has no chat template), or None."""
        return None if self.tokenizer.chat_template else "; ".join(no_chat_template(where))

    def chat_refused(self, messages: list) -> str | None:
        """Why the model's chat template refuses `messages` (messages.render_chat: it raised on them, which failed
        the whole job), or None."""
        refused = render_chat(self.tokenizer, messages)[1]
        return f"the model's chat template refuses these messages: {refused}" if refused else None

    def tokenize(self, texts: list) -> Tokens:
        """Prompts: strings are encoded as they are; message lists go through the chat template first. An OpenAI
        completions request's list of prompts is an item each, owned by its row (one answer, a choice each)."""
        if not any(is_prompt_list(t) for t in texts):
            return self._tokenize(texts)
        items = [t if is_prompt_list(t) else [t] for t in texts]
        tokens = self._tokenize([item for row in items for item in row])
        tokens.owner = np.repeat(np.arange(len(items)), [len(row) for row in items])
        return tokens

    def _tokenize(self, texts: list) -> Tokens:
        encodings: list = [None] * len(texts)
        plain = [i for i, p in enumerate(texts) if isinstance(p, str)]
        chats = [i for i, p in enumerate(texts) if not isinstance(p, str)]
        for i, encoding in zip(
            plain,
            encode_capped(self.backend, [texts[i] for i in plain], self.max_length, from_end=True) if plain else [],
        ):
            encodings[i] = encoding
        if not self.tokenizer.chat_template:  # row_settings has failed these rows: they never run
            for i in chats:
                encodings[i] = self.backend.encode("", add_special_tokens=False)
            chats = []
        if chats:  # the template writes its own special tokens; one it refuses failed its row (chat_refused)
            templated = [render_chat(self.tokenizer, texts[i])[0] for i in chats]
            for i, encoding in zip(
                chats, encode_capped(self.backend, templated, self.max_length, from_end=True, add_special_tokens=False)
            ):
                encodings[i] = encoding
        ids = [e.ids for e in encodings]
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(ids))
        return Tokens(ids, lengths, truncated)

    def row_settings(self, job, table: pa.Table, prepared: Prepared) -> list[int | None] | None:
        """Each row's own max_new_tokens (job.max_new_tokens_column; an OpenAI request's max_tokens), None
        where it gives none; a row whose value is no limit fails with the reason why, and so does a chat
        request when the model has no chat template. A job's text rows (input.text) become the user's message of
        a chat here, where model.chat is on and the model has a template, as label scoring formats them (serve's
        /v1/completions prompts, which do not come through here, stay as written)."""
        if job.model.chat and job.input.text and self.tokenizer.chat_template:  # in place, as the errors below
            prepared.texts[:] = [user_turn(t, job.model.system_prompt) for t in prepared.texts]
        if problem := self.chat_problem("body.messages"):
            for offset, text in zip(prepared.rows.tolist(), prepared.texts):
                if not isinstance(text, str):
                    prepared.errors.setdefault(offset, (Reason.BAD_REQUEST, problem))
        else:  # a row the template refuses would be tokenized as nothing (render_chat): an error row instead
            for offset, text in zip(prepared.rows.tolist(), prepared.texts):
                if is_prompt_list(text) or isinstance(text, str) or offset in prepared.errors:
                    continue
                if refused := self.chat_refused(text):
                    where = "model.chat_template" if job.model.chat_template else "the model's chat template"
                    hint = " (and model.system_prompt)" if job.model.system_prompt is not None else ""
                    prepared.errors[offset] = (Reason.BAD_CHAT, f"{refused}; check the messages, or {where}{hint}")
        name = job.max_new_tokens_column
        if not name:
            return None
        limits, problems = row_limits(table.column(name).to_pylist(), name)
        for offset, problem in problems.items():
            prepared.errors.setdefault(offset, problem)
        return limits

    def cut(self, lengths: np.ndarray, budget: tuple[int, str], max_rows: int) -> list[np.ndarray]:
        """Input order, max_rows each: the static engine's baseline batches (the others schedule the chunk
        themselves, and the token budget does not apply)."""
        return in_order(len(lengths), max_rows)

    def packing_problem(self) -> None:
        return None  # batching.strategy is the encoders': the engines schedule generation themselves

    # --- a chunk ---------------------------------------------------------------------------------------------

    def run_chunk(self, loaded: ChunkInput, ctx: ChunkContext) -> ChunkOutput:
        """The whole chunk goes to the engine, which schedules it (continuous batching) → the result columns
        of the rows that ran, and its figures (generated tokens, median time to the first token)."""
        job = ctx.job
        prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
        ctx.stop.check()
        max_new = max_new_tokens(job, loaded, self.context)
        t0 = time.perf_counter()
        owners = tokens.owners()  # the text (row) of each item: a list prompt's items share one
        overrides = request_settings(loaded, index) if job.input.format == "openai" else None
        constraints = self.row_constraints(loaded, index)
        for position, (reason, message) in [(p, c) for p, c in enumerate(constraints) if isinstance(c, tuple)]:
            prepared.errors[int(prepared.rows[owners[index[position]]])] = (reason, message)
        usable = np.array([not isinstance(c, tuple) for c in constraints], dtype=bool)
        if not usable.all():
            index, constraints = index[usable], [c for c in constraints if not isinstance(c, tuple)]
            max_new = [m for m, ok in zip(max_new, usable.tolist()) if ok]
            overrides = [o for o, ok in zip(overrides, usable.tolist()) if ok] if overrides else None
        completions = self.generate(
            [tokens.ids[i] for i in index.tolist()],
            max_new,
            job.batching.max_rows,
            overrides,
            check=ctx.stop.check,
            constraints=constraints,
        )
        model_seconds = time.perf_counter() - t0
        ctx.stop.check()
        for position, problem in completions.failed.items():
            prepared.errors[int(prepared.rows[owners[index[position]]])] = problem
        # a row with a failed item fails whole: its other prompts are not answered alone
        ok = np.isin(owners[index], np.flatnonzero(~np.isin(prepared.rows, list(prepared.errors))))
        keep = np.flatnonzero(ok).tolist()
        kept = Generated(
            [completions.ids[i] for i in keep],
            [completions.text[i] for i in keep],
            [completions.finish_reason[i] for i in keep],
        )
        first = sorted(completions.first_token_seconds)
        lengths = tokens.lengths[index]
        # what the engine's shared pages saved, in the shape label scoring's records have (runners/prefix.py)
        prefix = page_figures(completions.prefix_hits, int(lengths.sum())) if self.shared_page() else None
        # Continuous batching computes no padding; static batches pad to their longest prompt.
        padded = computed_tokens(lengths, loaded.batches) if self.engine.pads else int(lengths.sum())
        rows, columns = self.columns(kept, tokens.lengths[index[ok]], owners[index[ok]], job.input.format == "openai")
        return ChunkOutput(
            columns,
            rows,
            round(model_seconds, 4),
            padded,
            {
                "generated_tokens": sum(len(i) for i in kept.ids),
                "first_token_seconds": round(first[len(first) // 2], 4) if first else None,
                **({"prefix": prefix} if prefix else {}),
                "engine": self.engine.described,
            },
            tuning=self.tuning(ctx.budget),
        )

    def row_constraints(self, loaded, index: np.ndarray) -> list:
        """Per position in `index`: its constraint (an OpenAI request's response_format, else the job's),
        None when free, or (reason, message) when its response_format cannot be compiled."""
        if "response_format" not in loaded.table.column_names:
            return [self.constraint] * len(index)
        from ..constrained.grammar import Uncompilable

        rows = loaded.prepared.rows[loaded.tokens.owners()[index]]
        asked = loaded.table.column("response_format").take(pa.array(rows, pa.int64()))
        out: list = []
        for text in asked.to_pylist():
            constraint = response_format(json.loads(text), "body.response_format")[0] if text else self.constraint
            try:
                if constraint is not None:
                    self.grammars.compile(constraint)
                out.append(constraint)
            except Uncompilable as exc:
                out.append((Reason.BAD_REQUEST, str(exc)))
            except ModelError as exc:  # xgrammar is not installed: this request fails, the others are answered
                out.append((Reason.UNSUPPORTED, f"body.response_format: {exc.message}; {exc.hint}"))
        return out

    # --- generation ------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        max_new: list[int],
        batch_rows: int,
        overrides: list[dict] | None = None,
        check: Callable[[], None] = lambda: None,
        constraints: list[Constraint | None] | None = None,
    ) -> Generated:
        """Completions in input order. `overrides` holds per-row decoding settings (temperature, top_p,
        seed, stop: an OpenAI request's own), checked as the job file's are (a row they fail is an error);
        rows share engine passes as far as the engine allows (Engine.passes).
        `constraints`: per row, the grammar its output must follow (None: free); a constrained row whose
        output is not complete and valid fails (reason length when max_new_tokens cut it).
        `check` is called while waiting and may raise to stop (Ctrl-C)."""
        constraints = constraints or [None] * len(prompts)
        out = Generated([], [], [], prefix_hits=[0] * len(prompts))
        settings = []
        for position, override in enumerate(overrides or [{}] * len(prompts)):
            gen, problem = self.row_config(override)
            settings.append(gen)
            if problem:
                out.failed[position] = problem
        raw: list = [([], None)] * len(prompts)
        for positions in self.engine.passes(settings, skip=out.failed):
            rows = PassRows(*[pick(values, positions) for values in (settings, prompts, max_new, constraints)])
            done = self.engine.run(rows, batch_rows, check)
            out.first_token_seconds += done.first_token_seconds
            for p, result, hit in zip(positions, done.raw, done.prefix_hits or [0] * len(positions)):
                raw[p], out.prefix_hits[p] = result, hit
        for position, (tokens, error) in enumerate(raw):
            if error:
                out.failed[position] = (Reason.MODEL_ERROR, error)
                tokens = []
            ids, text, reason = self.finish(tokens, max_new[position], settings[position].stop)
            if constraints[position] is not None and position not in out.failed:
                if problem := self.incomplete(constraints[position], ids, text, reason, max_new[position]):
                    out.failed[position] = problem
            out.ids.append(ids)
            out.text.append(text)
            out.finish_reason.append(reason)
        return out

    def row_config(self, override: dict) -> tuple[GenerationConfig, tuple[str, str] | None]:
        """The generation section with a row's own settings (None: the job's), validated as the job file
        is (not copied past the checks), or the job's section and why the row cannot have them."""
        asked = {k: v for k, v in override.items() if v is not None}
        if not asked:
            return self.gen, None
        key = json.dumps(asked)  # in order: a schema's key order is its output's
        if key not in self._configs:
            self._configs[key] = self.request_config(asked)
        return self._configs[key]

    def request_config(self, asked: dict) -> tuple[GenerationConfig, tuple[str, str] | None]:
        """row_config without its memo, for serve, whose requests' settings (a fresh seed each) do not repeat."""
        try:
            # what the job set, not its defaults: a default given again would be judged as given
            return GenerationConfig.model_validate(self.gen.model_dump(exclude_unset=True) | asked), None
        except ValidationError as exc:
            said = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            return self.gen, (Reason.BAD_REQUEST, said)

    def incomplete(
        self, constraint: Constraint, ids: list[int], text: str, reason: str, limit: int
    ) -> tuple[str, str] | None:
        """Why a constrained completion is no answer ((reason, message)), or None when it is whole and valid."""
        if reason == "length":  # the finish reason
            return (
                Reason.LENGTH,
                f"max_new_tokens ({limit}) cut the output before it was {constraint.describe()}; raise "
                "max_new_tokens (an OpenAI request's max_tokens): for a job, into a new output folder or with "
                "--restart, since --retry-errors keeps the job's generation settings",
            )
        if not self.grammars.complete(constraint, ids, text):
            return (Reason.INVALID_OUTPUT, f"the output is not {constraint.describe()} ({constraint.where})")
        return None

    def finish(self, tokens: list[int], limit: int, stop: list[str]) -> tuple[list[int], str, str]:
        """Generated tokens → (the completion's tokens, its text, why it ended: stop | length): cut at
        `limit` tokens, at eos and at the first stop string."""
        tokens = list(tokens[:limit])
        reason = "length"
        for i, token in enumerate(tokens):
            if token in self.eos:
                tokens, reason = tokens[:i], "stop"
                break
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cuts = [text.find(s) for s in stop if s and s in text]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
            tokens = self.tokenizer.encode(text, add_special_tokens=False) if text else []
        return tokens, text, reason

    # --- output ----------------------------------------------------------------------------------------------

    def columns(
        self, completions: Generated, prompt_lengths: np.ndarray, owners: np.ndarray, choices: bool
    ) -> tuple[np.ndarray, dict[str, pa.Array]]:
        """The kept items' completions (`owners`: each one's row, rows in order) → the rows that ran and their
        columns. choices (OpenAI requests): text and finish_reason list a choice per prompt, in order, and the
        token counts are the request's sums, as OpenAI answers a list prompt."""
        completion_tokens = np.array([len(i) for i in completions.ids], dtype=np.int64)
        if not choices:
            return owners, {
                "text": pa.array(completions.text, pa.string()),
                "finish_reason": pa.array(completions.finish_reason, pa.string()),
                "prompt_tokens": pa.array(prompt_lengths, pa.int32()),
                "completion_tokens": pa.array(completion_tokens, pa.int32()),
            }
        rows, starts = np.unique(owners, return_index=True)
        offsets = pa.array(np.append(starts, len(owners)).astype(np.int32))
        return rows, {
            "text": pa.ListArray.from_arrays(offsets, pa.array(completions.text, pa.string())),
            "finish_reason": pa.ListArray.from_arrays(offsets, pa.array(completions.finish_reason, pa.string())),
            "prompt_tokens": pa.array(np.add.reduceat(prompt_lengths, starts) if len(starts) else [], pa.int32()),
            "completion_tokens": pa.array(
                np.add.reduceat(completion_tokens, starts) if len(starts) else [], pa.int32()
            ),
        }


def is_prompt_list(prompt) -> bool:
    """A completions request's list of prompts (chat messages are a list of objects)."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], str)


def request_settings(loaded, index: np.ndarray) -> list[dict]:
    """Per position in `index`: its OpenAI request's own decoding settings (None where it gives none); a list
    prompt's items share their request's."""
    rows = loaded.prepared.rows[loaded.tokens.owners()[index]]
    take = pa.array(rows, pa.int64())
    columns = {c: loaded.table.column(c).take(take).to_pylist() for c in ("temperature", "top_p", "seed", "stop")}
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def max_new_tokens(job, loaded, context: int | None) -> list[int]:
    """Per row: its own limit (max_new_tokens_column, an OpenAI request's max_tokens) or the job's default,
    never past the model's context: prompt plus completion fit in `context` tokens, so an absurd limit
    (max_tokens 10**11) neither sizes the KV cache nor runs past the positions the model knows."""
    default = job.generation.max_new_tokens
    rows = loaded.prepared.rows[loaded.tokens.owners()[loaded.index]].tolist()
    limits = [(loaded.row_settings[r] if loaded.row_settings else None) or default for r in rows]
    if context is None:
        return limits
    prompts = loaded.tokens.lengths[loaded.index].tolist()
    return [max(1, min(limit, context - n)) for limit, n in zip(limits, prompts)]


def refuse_a_mixed_engine(recorded: dict, runner: GenerateRunner) -> None:
    """Refuse to go on with a generation job whose folder's chunks ran on another engine or in another precision
    than this run's (`recorded`: an earlier chunk record's `engine`): a folder holds one engine's answers."""
    from ..errors import ResumeError

    ours, theirs = runner.engine.described, recorded
    if ours["name"] == "auto" or (ours["name"], ours.get("precision")) == (theirs["name"], theirs.get("precision")):
        return  # auto: on a GPU, the engine probe, which a resume hands the first run's choice (use_cuda_auto)
    why = "; ".join(ours.get("notes", [])) or f"generation.engine is {runner.gen.engine}"
    raise ResumeError(
        f"the output folder's first chunks ran on the {theirs['name']} engine in {theirs.get('precision', 'f32')} "
        f"(their markers say so), and this run would run on {ours['name']} in {ours.get('precision', 'f32')} "
        f"({why}); a resume never mixes two engines' or precisions' answers",
        f"resume where {theirs['name']} in {theirs.get('precision', 'f32')} runs (for OpenVINO GenAI: openvino-genai "
        "installed, the model converting; for bf16 there: a CPU with native bf16, lscpu | grep -o "
        "'avx512_bf16\\|amx_bf16' names it, without BATCHINFER_NO_BF16), or run it again whole with --restart",
    )


def precision_of(job, device) -> str:
    """The precision the torch engines run the job's model in (models.pick_dtype's), by name."""
    from ..backends import torch_precision

    return torch_precision(job.model.dtype, device.type)


def first_engine(job, model_path, device: str, recorded) -> tuple[type[Registered] | None, list[str]]:
    """The engine class GenerateRunner.load loads the model for and tries first: generation.engine's (refused here
    where it cannot run the job, unfit), or engine auto's first on `device` (engine.AUTO_FIRST) where it may run the
    job (None: auto's over the loaded model, a resume on a GPU keeping its probe's `recorded` choice among them);
    and auto's note saying why where it passed one over."""
    if job.generation.engine != "auto":
        named = engine_class(job.generation.engine)
        if problem := named.unfit(job, model_path, auto=False):
            raise named.named_error(problem)
        return named, []
    if device == MEASURED_ON and recorded in (CONTINUOUS, STATIC):
        return None, []
    first = engine_class(AUTO_FIRST.get(device, AUTO_FIRST[None]))
    if problem := first.unfit(job, model_path, auto=True):
        return None, [first.passed_over(problem, AUTO_AFTER[0])]
    return first, []


def pick(values: list, positions: list[int]) -> list:
    return [values[p] for p in positions]
