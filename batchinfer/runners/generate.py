"""task: generate — a completion per row, with continuous batching by default.

Engines:
- transformers: transformers' own ContinuousBatchingManager (paged KV cache). Sequences are admitted
  and retired at every decoding step, so short completions never wait for long ones, and KV-cache
  memory, not a fixed batch size, bounds how many run at once.
- static: padded `model.generate` batches in input order; the baseline benchmarks compare against.
- vllm: `vllm.LLM` on a GPU, for the same job file and the same output columns.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import torch
from pydantic import ValidationError

from ..batching import padding_stats
from ..config import GenerationConfig
from ..constrain import Constraint, job_constraint, response_format
from ..errors import ConfigError, ModelError
from ..prepare import Prepared, row_limits
from ..reasons import Reason
from ..sampling import SeededSampling
from ..templates import chat_template, no_chat_template
from .base import encode_capped
from .prefix import admission, page_figures
from .protocol import ChunkContext, ChunkInput, ChunkOutput, Tokens

CPU_BATCH_TOKENS = 1024
# Cache page (tokens) when rows may share a prefix: the engine shares whole pages, so transformers' default of 256
# shares nothing of a prompt shorter than 257 tokens. vLLM's default block is 16.
SHARED_PAGE = 32
VLLM_BLOCK = 16


@dataclass
class Completions:
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
        """The runner for `job`: transformers' model, or vllm.LLM for generation.engine: vllm."""
        if job.generation.engine == "vllm":
            llm = load_vllm(model_path, job.generation.engine_options)
            tokenizer, model, device = llm.get_tokenizer(), llm, torch.device("cuda")
            if job.model.chat_template is not None:
                tokenizer.chat_template = chat_template(job.model.chat_template)
        else:
            from ..models import load_model

            if job.model.backend == "openvino":
                from ..backends import candidates

                candidates(job.model, "cpu")  # says why not
            tokenizer, model, device = load_model(job.model, model_path)
        return cls(tokenizer, model, device, job.model.max_length, job.generation)

    def __init__(self, tokenizer, model, device: torch.device, max_length: int, gen: GenerationConfig):
        self.tokenizer = tokenizer
        self.model = model
        self.device = device
        self.gen = gen
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
        self._grammars = None
        self._configs: dict[str, tuple] = {}  # a row's own settings (JSON) -> row_config's answer
        self.constraint = job_constraint(gen)  # every row's, unless an OpenAI request brings its own
        if self.constraint is not None:
            from ..grammar import Uncompilable

            try:
                self.grammars.compile(self.constraint)
            except Uncompilable as exc:
                hint = "simplify it, or see xgrammar's documentation for what it supports"
                raise ConfigError(str(exc), hint) from None

    @property
    def grammars(self):
        """xgrammar's compiler for this tokenizer, built on first use (grammar.py)."""
        if self._grammars is None:
            from ..grammar import Grammars

            config = getattr(self.model, "config", None)
            vocab = config.get_text_config().vocab_size if config is not None else len(self.tokenizer)
            self._grammars = Grammars(
                self.tokenizer, max(vocab, len(self.tokenizer)), self.eos, self.gen.grammar_limits
            )
        return self._grammars

    # --- prompts ---------------------------------------------------------------------------------------------

    def chat_problem(self, where: str) -> str | None:
        """Why chat messages at `where` cannot be formatted for this model (it has no chat template), or None."""
        return None if self.tokenizer.chat_template else "; ".join(no_chat_template(where))

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
        if chats:  # the template writes its own special tokens
            templated = [
                self.tokenizer.apply_chat_template(texts[i], add_generation_prompt=True, tokenize=False) for i in chats
            ]
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
        request when the model has no chat template."""
        if problem := self.chat_problem("body.messages"):
            for offset, text in zip(prepared.rows.tolist(), prepared.texts):
                if not isinstance(text, str):
                    prepared.errors.setdefault(offset, (Reason.BAD_REQUEST, problem))
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
        overrides = None
        owners = tokens.owners()  # the text (row) of each item: a list prompt's items share one
        if job.input.format == "openai":
            take = pa.array(prepared.rows[owners[index]], pa.int64())
            columns = {
                c: loaded.table.column(c).take(take).to_pylist() for c in ("temperature", "top_p", "seed", "stop")
            }
            overrides = [dict(zip(columns, values)) for values in zip(*columns.values())]
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
        kept = Completions(
            [completions.ids[i] for i in keep],
            [completions.text[i] for i in keep],
            [completions.finish_reason[i] for i in keep],
        )
        first = sorted(completions.first_token_seconds)
        lengths = tokens.lengths[index]
        # what the engine's shared pages saved, in the shape label scoring's records have (runners/prefix.py)
        prefix = page_figures(completions.prefix_hits, int(lengths.sum())) if self.shared_page() else None
        # Continuous batching computes no padding; static batches pad to their longest prompt.
        padded = padding_stats(lengths, loaded.batches)[1] if job.generation.engine == "static" else int(lengths.sum())
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
            },
        )

    def row_constraints(self, loaded, index: np.ndarray) -> list:
        """Per position in `index`: its constraint (an OpenAI request's response_format, else the job's),
        None when free, or (reason, message) when its response_format cannot be compiled."""
        if "response_format" not in loaded.table.column_names:
            return [self.constraint] * len(index)
        from ..grammar import Uncompilable

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
    ) -> Completions:
        """Completions in input order. `overrides` holds per-row decoding settings (temperature, top_p,
        seed, stop: an OpenAI request's own), checked as the job file's are (a row they fail is an error);
        rows share engine passes as far as the engine allows (engine_passes).
        `constraints`: per row, the grammar its output must follow (None: free); a constrained row whose
        output is not complete and valid fails (reason length when max_new_tokens cut it).
        `check` is called while waiting and may raise to stop (Ctrl-C)."""
        constraints = constraints or [None] * len(prompts)
        self.check, self.max_rows = check, batch_rows
        out = Completions([], [], [], prefix_hits=[0] * len(prompts))
        settings = []
        for position, override in enumerate(overrides or [{}] * len(prompts)):
            gen, problem = self.row_config(override)
            settings.append(gen)
            if problem:
                out.failed[position] = problem
        raw: list = [([], None)] * len(prompts)
        for positions in engine_passes(settings, self.gen.engine, skip=out.failed):
            gen = settings[positions[0]]  # what the pass shares; each row's seed and stop are its own
            rows = [pick(values, positions) for values in (prompts, max_new, constraints)]
            hits = [0] * len(positions)  # static batches share no cache
            if gen.engine == "static":
                results, first = self._static(gen, rows[0], rows[1], in_order(len(positions), batch_rows), rows[2])
            elif gen.engine == "vllm":
                results, first, hits = self._vllm(pick(settings, positions), *rows)
            else:
                results, first, hits = self._continuous(gen, *rows, [s.seed for s in pick(settings, positions)])
            out.first_token_seconds += first
            for p, result, hit in zip(positions, results, hits):
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
        key = json.dumps(asked, sort_keys=True)
        if key not in self._configs:
            try:
                self._configs[key] = (GenerationConfig.model_validate(self.gen.model_dump() | asked), None)
            except ValidationError as exc:
                said = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
                self._configs[key] = (self.gen, (Reason.BAD_REQUEST, said))
        return self._configs[key]

    def incomplete(
        self, constraint: Constraint, ids: list[int], text: str, reason: str, limit: int
    ) -> tuple[str, str] | None:
        """Why a constrained completion is no answer ((reason, message)), or None when it is whole and valid."""
        if reason == "length":  # the finish reason
            return (
                Reason.LENGTH,
                f"max_new_tokens ({limit}) cut the output before it was {constraint.describe()}; raise "
                "max_new_tokens (an OpenAI request's max_tokens)",
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

    def generation_config(self, gen: GenerationConfig, max_new_tokens: int):
        """transformers' GenerationConfig for decoding with `gen`'s settings, up to max_new_tokens."""
        config = copy.deepcopy(self.model.generation_config)
        config.max_new_tokens = max_new_tokens
        config.do_sample = gen.temperature > 0
        if config.do_sample:
            config.temperature, config.top_p, config.top_k = gen.temperature, gen.top_p, gen.top_k or None
        else:
            config.temperature, config.top_p, config.top_k = None, None, None
        config.pad_token_id = self.pad_id
        return config

    def engine_config(
        self,
        gen: GenerationConfig,
        lengths: list[int],
        concurrency: int,
        constrained: bool = False,
        seeded: bool = False,
    ):
        """transformers' ContinuousBatchingConfig for requests of `lengths` tokens (prompt plus new tokens),
        `concurrency` of them in flight: the KV cache sized from them, unless engine_options size it.
        `constrained`: grammar masks run, which need each step's tokens before the next step is prepared.
        `seeded`: each request draws with its own generator (sampling.py), on the host at every step, which a
        captured CUDA graph would not repeat."""
        from transformers import ContinuousBatchingConfig

        options = dict(gen.engine_options)
        if constrained:
            options["use_async_batching"] = False
        if seeded:
            options.setdefault("use_cuda_graph", False)
        options.setdefault("max_requests_per_batch", concurrency)
        options.setdefault("page_size", self.shared_page() or 256)
        if self.device.type == "cpu":
            # On CPU each step builds a dense mask of batch tokens x cache tokens: 8,192 (the default) x 65,536
            # took 2.9 GB for the tiny example job; 1,024 takes 0.8 GB and runs 1.9x faster.
            options.setdefault("max_batch_tokens", CPU_BATCH_TOKENS)
        if "num_blocks" not in options and "max_memory_percent" not in options:
            page = options["page_size"]
            options["num_blocks"] = cache_blocks(
                lengths,
                page,
                options["max_requests_per_batch"],
                kv_bytes_per_block(self.model.config, self.model.dtype, page),
                memory_budget(gen.max_memory, self.device),
            )
        try:
            return ContinuousBatchingConfig(seed=gen.seed, **options)
        except TypeError as exc:
            raise ModelError(
                f"generation.engine_options: {exc}",
                "use fields of transformers.ContinuousBatchingConfig, e.g. num_blocks, max_batch_tokens",
            ) from exc

    def shared_page(self) -> int | None:
        """The cache page (tokens) in which the engine shares rows' common prefixes; None when it shares none."""
        options = self.gen.engine_options
        if self.gen.engine == "vllm":
            return options.get("block_size", VLLM_BLOCK) if options.get("enable_prefix_caching", True) else None
        if self.gen.engine == "static" or not options.get("allow_block_sharing", True):
            return None
        return options.get("page_size", SHARED_PAGE)

    def _continuous(
        self, gen: GenerationConfig, prompts: list[list[int]], max_new: list[int], constraints: list, seeds: list[int]
    ):
        """One engine pass; when `gen` samples, each row draws with its own seed (sampling.py)."""
        concurrency = min(len(prompts), gen.engine_options.get("max_requests_per_batch") or self.max_rows)
        constrained, sampled = any(c is not None for c in constraints), gen.temperature > 0
        lengths = [len(p) + m for p, m in zip(prompts, max_new)]
        cb_config = self.engine_config(gen, lengths, concurrency, constrained, sampled)
        started = time.perf_counter()
        results = {}
        manager = self.model.init_continuous_batching(
            generation_config=self.generation_config(gen, max(max_new)), continuous_batching_config=cb_config
        )
        masks = self.masks(manager) if constrained else None
        hits = count_prefix_hits(manager)
        page = self.shared_page()
        # Rows that share a first page wait until one of them is prefilled: admitted together, each would compute it.
        leaders, waited, followers = admission(prompts, page) if page else (range(len(prompts)), set(), [])
        sampler = SeededSampling() if sampled else None
        if sampler is not None:
            sampler.install(manager)

        def add(i: int) -> None:
            if constraints[i] is not None:
                masks.add(f"row-{i}", constraints[i])
            if sampler is not None:  # its own generator, whatever order the rows are admitted in
                sampler.add(f"row-{i}", seeds[i])
            # a waited-for leader streams: its first output says its pages are in the cache
            manager.add_request(
                prompts[i],
                request_id=f"row-{i}",
                max_new_tokens=max_new[i],
                record_timestamps=True,
                streaming=i in waited,
            )

        manager.start()
        stopped = True
        try:
            for i in leaders:
                add(i)
            prefilling = {f"row-{i}" for i in waited}
            while len(results) < len(prompts):
                self.check()
                result = manager.get_result(timeout=0.1)
                if result is not None:
                    prefilling.discard(result.request_id)
                    if result.is_finished():
                        results[result.request_id] = result
                elif not manager.is_running():
                    break
                if followers and not prefilling:
                    for i in followers:
                        add(i)
                    followers = []
            stopped = False
        finally:  # on Ctrl-C drop the requests in flight at once, instead of finishing them (tens of seconds)
            manager.stop(block=True, timeout=1 if stopped else None, hard_stop=stopped)
            manager.destroy()
        raw, first = [], []
        for i in range(len(prompts)):
            result = results.get(f"row-{i}")
            if result is None:
                raw.append(([], "the continuous batching engine stopped before this row finished"))
                continue
            raw.append((result.generated_tokens, result.error))
            if result.timestamps:
                first.append(result.timestamps[0] - started)
        return raw, first, [hits.get(f"row-{i}", 0) for i in range(len(prompts))]

    def masks(self, manager):
        """Grammar masks, one state per request, installed in a continuous-batching manager before it starts."""
        from ..grammar import ContinuousMasks

        masks = ContinuousMasks(self.grammars)
        masks.install(manager, first=True)  # masks before temperature, top-k and top-p
        return masks

    @torch.inference_mode()
    def _static(
        self,
        gen: GenerationConfig,
        prompts: list[list[int]],
        max_new: list[int],
        batches: list[np.ndarray],
        constraints: list,
    ):
        raw: list = [None] * len(prompts)
        first = []
        started = time.perf_counter()
        if gen.temperature > 0:
            torch.manual_seed(gen.seed)
        for batch in batches:
            self.check()
            rows = [prompts[i] for i in batch.tolist()]
            longest = max(len(r) for r in rows)
            input_ids = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for k, row in enumerate(rows):  # left padding: every row's next token lands in the last column
                input_ids[k, longest - len(row) :] = torch.tensor(row)
                mask[k, longest - len(row) :] = 1
            limit = max(max_new[i] for i in batch.tolist())
            asked = [constraints[i] for i in batch.tolist()]
            processors = None
            if any(c is not None for c in asked):
                from transformers import LogitsProcessorList

                from ..grammar import StaticMasks

                processors = LogitsProcessorList([StaticMasks(self.grammars, asked)])
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=self.generation_config(gen, limit),
                logits_processor=processors,
            )
            first.extend([time.perf_counter() - started] * len(rows))  # a static batch returns all at once
            for k, i in enumerate(batch.tolist()):
                raw[i] = (out[k, longest:].tolist(), None)
        return raw, first

    def _vllm(self, settings: list[GenerationConfig], prompts: list[list[int]], max_new: list[int], constraints: list):
        """One pass: vLLM takes each row's own settings (its seed, stop strings, temperature)."""
        from vllm import SamplingParams  # checked importable when the runner was built

        params = [
            SamplingParams(
                max_tokens=m,
                temperature=gen.temperature,
                top_p=gen.top_p,
                top_k=gen.top_k or -1,
                seed=gen.seed,
                stop=gen.stop or None,
                skip_special_tokens=True,
                **vllm_structured(c),
            )
            for gen, m, c in zip(settings, max_new, constraints)
        ]
        outputs = self.model.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        hits = [getattr(o, "num_cached_tokens", None) or 0 for o in outputs]  # prefix caching's, per request
        return [(self._vllm_tokens(o.outputs[0]), None) for o in outputs], [], hits

    def _vllm_tokens(self, output) -> list[int]:
        """A vLLM completion's tokens, ending in an end token when vLLM says it stopped (finish_reason stop),
        so that finish reads stop, not length, whether or not vLLM kept that token."""
        tokens = list(output.token_ids)
        if output.finish_reason == "stop" and self.eos and not (tokens and tokens[-1] in self.eos):
            tokens.append(min(self.eos))
        return tokens

    # --- output ----------------------------------------------------------------------------------------------

    def columns(
        self, completions: Completions, prompt_lengths: np.ndarray, owners: np.ndarray, choices: bool
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


def count_prefix_hits(manager) -> dict[str, int]:
    """request id -> the prompt tokens its paged cache found cached (shared blocks) instead of computing them,
    filled while `manager` runs: the cache is built in the manager's thread, so its prefix search is wrapped
    as it is built."""
    hits: dict[str, int] = {}
    create = manager._create_batch_processor

    def created():
        processor = create()
        search = processor.cache.search_prefix_match

        def counted(request_id: str, prompt_ids: list[int]) -> int:
            hits[request_id] = found = search(request_id, prompt_ids)
            return found

        processor.cache.search_prefix_match = counted
        return processor

    manager._create_batch_processor = created
    return hits


def engine_passes(settings: list[GenerationConfig], engine: str, skip=()) -> list[list[int]]:
    """Row positions (but those in `skip`) grouped into the engine passes their settings need. vllm: one
    pass, every row with its own settings. transformers: one per (temperature, top_p), a row's seed being
    its own inside the pass (sampling.py). static, the baseline: seeds one generator per batch, so sampled
    rows also part by seed. Greedy rows share one pass whatever their seed or top_p (neither changes a
    greedy completion), and stop strings never part rows: each row's are cut from its own text."""
    passes: dict[tuple, list[int]] = {}
    for position, gen in enumerate(settings):
        if position in skip:
            continue
        if engine == "vllm":
            key: tuple = ()
        elif gen.temperature == 0:
            key = ("greedy",)
        else:
            key = (gen.temperature, gen.top_p) + ((gen.seed,) if engine == "static" else ())
        passes.setdefault(key, []).append(position)
    return list(passes.values())


def pick(values: list, positions: list[int]) -> list:
    return [values[p] for p in positions]


def in_order(count: int, rows: int) -> list[np.ndarray]:
    """Positions 0..count-1 in batches of `rows`, in order."""
    return [np.arange(i, min(i + rows, count)) for i in range(0, count, rows)]


def vllm_structured(constraint: Constraint | None) -> dict:
    """SamplingParams arguments that make vLLM follow `constraint`: structured_outputs (vLLM 0.10.2 and
    later), else guided_decoding (earlier releases), with the same fields. Its outputs are checked
    against the grammar afterwards like every engine's."""
    if constraint is None:
        return {}
    fields = {
        "json_schema": lambda: {"json": json.loads(constraint.spec)},
        "json_object": lambda: {"json_object": True},
        "choices": lambda: {"choice": json.loads(constraint.spec)},
        "regex": lambda: {"regex": constraint.spec},
    }[constraint.kind]()
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(**fields)}
    return {"structured_outputs": StructuredOutputsParams(**fields)}


def load_vllm(path, engine_options: dict):
    """vllm.LLM for a model folder, or a message saying what is missing."""
    try:
        from vllm import LLM
    except ImportError as exc:
        raise ModelError(
            "generation.engine vllm needs vLLM, which is not installed",
            "pip install 'batchinfer[vllm]' on a machine with a CUDA GPU, or use engine: transformers",
        ) from exc
    if not torch.cuda.is_available():
        raise ModelError(
            "generation.engine vllm needs a CUDA GPU, and none is visible",
            "use generation.engine: transformers, which runs on CPU and GPU",
        )
    # rows that share a prefix (an instruction, a chat template's preamble) read its cached blocks
    return LLM(model=str(path), **{"enable_prefix_caching": True, **engine_options})


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


def cache_blocks(lengths: list[int], page: int, concurrency: int, bytes_per_block: int, budget: int) -> int:
    """KV-cache blocks (of `page` tokens, every layer) for one chunk: enough for its `concurrency` longest
    requests (prompt plus max new tokens) at once, at most what `budget` bytes hold, and never fewer
    than its longest request needs. The cache is sized from the job, not from the machine."""
    pages = sorted((-(-n // page) for n in lengths), reverse=True) or [1]
    return max(pages[0], min(sum(pages[:concurrency]), budget // max(bytes_per_block, 1)))


def kv_bytes_per_block(config, dtype: torch.dtype, page: int) -> int:
    """Bytes of one cache block: keys and values of `page` tokens in every layer."""
    config = getattr(config, "get_text_config", lambda: config)()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * page * torch.empty((), dtype=dtype).element_size()


def memory_budget(max_memory, device: torch.device) -> int:
    """generation.max_memory in bytes; auto: a quarter of the free memory on CPU, half the free GPU memory."""
    from ..config import parse_size

    if max_memory != "auto":
        return parse_size(max_memory)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return _available_ram() // 4


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
