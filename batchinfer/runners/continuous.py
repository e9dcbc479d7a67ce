"""The continuous-batching engine: transformers' ContinuousBatchingManager (paged KV cache). Sequences are
admitted and retired at every decoding step, so short completions never wait for long ones, and KV-cache
memory, not a fixed batch size, bounds how many run at once. Offline runs a pass per chunk; serve keeps one
running and adds each request to it."""

from __future__ import annotations

import copy
import importlib.util
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..constrained.sampling import RequestHook, SeededSampling, sampling_warpers
from ..constrained.spec import Constraint
from ..errors import ConfigError, ModelError
from ..job.config import GenerationConfig
from .engine import PassOutput, PassRows, Registered, by_sampling, generation_config, passes_by, with_note
from .kv_cache import (
    cache_blocks,
    engine_options,
    kv_bytes_per_block,
    memory_budget,
    sequences_in_flight,
    sized_by_user,
)
from .model_generation import history_config, needs_history
from .prefix import admission

# ContinuousBatchingConfig's sizes: whole numbers of at least 1
SIZES = frozenset({"num_blocks", "page_size", "max_batch_tokens", "max_requests_per_batch"})
# Cache page (tokens) when rows may share a prefix: the engine shares whole pages, so transformers' default of 256
# shares nothing of a prompt shorter than 257 tokens.
SHARED_PAGE = 32


class History(RequestHook):
    """transformers' continuous-batching hook for the model's history processors (HISTORY): each request gets the
    processors `generate` builds for it alone (its prompt's length, its own max_length), and each step they see its
    whole sequence (prompt and completion, [1, tokens]), as in `generate`. Installed first, with the grammar masks,
    before temperature, top-k and top-p: generate's order."""

    def __init__(self, model, generation_config):
        self.model, self.config = model, generation_config
        eos = generation_config.eos_token_id
        self.eos = None if eos is None else torch.tensor(eos if isinstance(eos, list) else [eos])
        self.requests: dict[str, object] = {}  # request id -> its LogitsProcessorList
        self.step: list[tuple[object, torch.Tensor]] = []  # per row of the step: its processors, its tokens

    def processors(self, state):
        """`generate`'s processors for this request alone, as `generate` builds them for a one-row batch."""
        if state.request_id not in self.requests:
            # a request the engine re-queued carries what it had generated in its prompt
            prompt = state.initial_tokens[: state._true_initial_tokens or len(state.initial_tokens)]
            config = copy.copy(self.config)
            config.max_length = len(prompt) + (state.max_new_tokens or 0)  # forced_eos_token_id's last position
            config._eos_token_tensor = self.eos
            self.requests[state.request_id] = self.model._get_logits_processor(
                config, len(prompt), encoder_input_ids=torch.tensor([prompt]), device=self.model.device
            )
        return self.requests[state.request_id]

    def drop(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        self.step = []
        for future in requests_with_new_token:
            state = future.state
            self.step.append((self.processors(state), torch.tensor([state.initial_tokens + state.generated_tokens])))
        return torch.arange(len(self.step), dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        # scores: [rows, vocab], one row per request that gets a token this step, in prepare_tensor_args' order
        for row, (processors, tokens) in enumerate(self.step[: scores.size(0)]):
            scores[row : row + 1] = processors(tokens.to(scores.device), scores[row : row + 1])
        return scores


@dataclass
class Session:
    """A continuous-batching manager, not yet started, its grammar masks (None: no request is constrained) and the
    model's history processors (None: its generation_config sets none)."""

    manager: object
    masks: object | None
    history: History | None = None


class ContinuousEngine(Registered):
    name = "transformers"
    pads = False

    @classmethod
    def over(cls, gen, model, device, pad_id: int, eos: set[int], grammars: Callable) -> ContinuousEngine:
        """generation.engine's engine over a loaded model (engine.ENGINES)."""
        return cls(model, device, gen.engine_options, pad_id, grammars)

    def __init__(self, model, device: torch.device, options: dict, pad_id: int, grammars: Callable):
        for key in SIZES & set(options):  # transformers checks them in its generation thread, failing every row
            if not isinstance(options[key], int) or isinstance(options[key], bool) or options[key] < 1:
                raise ConfigError(
                    f"generation.engine_options.{key}: {options[key]!r} is no size",
                    f"give {key} a whole number of at least 1, or remove it",
                )
        self.model, self.device, self.options, self.pad_id = model, device, options, pad_id
        self.grammars = grammars  # () -> grammar.Grammars, built on first use
        self.described: dict = {"name": self.name}
        self.shared_page = options.get("page_size", SHARED_PAGE) if options.get("allow_block_sharing", True) else None

    def config(self, gen: GenerationConfig, lengths: list[int], concurrency: int, constrained: bool, seeded: bool):
        """transformers' ContinuousBatchingConfig for requests of `lengths` tokens (prompt plus new tokens),
        `concurrency` of them in flight: the KV cache sized from them, unless engine_options size it.
        `constrained`: a processor reads each step's tokens on the host; `seeded`: one draws on the host."""
        from transformers import ContinuousBatchingConfig

        cpu = self.device.type == "cpu"
        options = engine_options(self.options, concurrency, self.shared_page, cpu, constrained, seeded)
        if not sized_by_user(options):
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

    def session(
        self,
        gen: GenerationConfig,
        lengths: list[int],
        concurrency: int,
        max_new_tokens: int,
        constrained: bool,
        seeded: bool = False,
    ) -> Session:
        """A manager for requests of `lengths` tokens, with grammar masks installed when `constrained`, and the
        model's history processors when its generation_config sets any (History)."""
        config, history = generation_config(self.model, gen, max_new_tokens, self.pad_id), None
        if needs_history(config):
            config, own = history_config(config)
            history = History(self.model, own)
        stepwise = constrained or history is not None
        manager = self.model.init_continuous_batching(
            generation_config=config,
            continuous_batching_config=self.config(gen, lengths, concurrency, stepwise, seeded or stepwise),
        )
        masks = None
        if constrained:
            from ..constrained.grammar import ContinuousMasks

            masks = ContinuousMasks(self.grammars())
            masks.install(manager, first=True)  # masks before temperature, top-k and top-p
        if history is not None:
            history.install(manager, first=True)  # before the masks, as generate puts its own before the caller's
        return Session(manager, masks, history)

    def run(self, rows: PassRows, max_rows: int, check: Callable[[], None]) -> PassOutput:
        """One engine pass (its rows share temperature and top_p); when it samples, each row draws with its
        own seed (constrained/sampling.py)."""
        settings, prompts, max_new, constraints = rows.settings, rows.prompts, rows.max_new, rows.constraints
        gen = settings[0]
        lengths = [len(p) + m for p, m in zip(prompts, max_new)]
        concurrency = min(
            len(prompts), gen.engine_options.get("max_requests_per_batch") or self.in_flight(gen, lengths, max_rows)
        )
        sampled = gen.temperature > 0
        started = time.perf_counter()
        session = self.session(
            gen, lengths, concurrency, max(max_new), any(c is not None for c in constraints), sampled
        )
        hits = count_prefix_hits(session.manager)
        sampler = SeededSampling() if sampled else None
        if sampler is not None:
            sampler.install(session.manager)
        admitted = _Rows(session, sampler, prompts, max_new, constraints, [s.seed for s in settings])
        results = admitted.run(self.shared_page, check)
        raw, first = [], []
        for i in range(len(prompts)):
            result = results.get(f"row-{i}")
            if result is None:
                raw.append(([], "the continuous batching engine stopped before this row finished"))
                continue
            raw.append((result.generated_tokens, result.error))
            if result.timestamps:
                first.append(result.timestamps[0] - started)
        return PassOutput(raw, first, [hits.get(f"row-{i}", 0) for i in range(len(prompts))])

    def in_flight(self, gen: GenerationConfig, lengths: list[int], max_rows: int) -> int:
        """Sequences in flight where engine_options do not say: on a GPU as many as the KV cache's share of free
        memory holds (generation.max_memory), on a CPU batching.max_rows."""
        if self.device.type != "cuda":
            return max_rows
        per_token = kv_bytes_per_block(self.model.config, self.model.dtype, 1)
        return sequences_in_flight(memory_budget(gen.max_memory, self.device), per_token, sum(lengths) / len(lengths))

    def passes(self, settings: list[GenerationConfig], skip=()) -> list[list[int]]:
        return passes_by(settings, by_sampling, skip)

    def note(self, note: str) -> None:
        """Say in the report why this engine runs the job (engine auto's fallback)."""
        self.described = with_note(self.described, note)

    def serve(self, gen: GenerationConfig, max_rows: int, max_length: int) -> ContinuousServing:
        """One manager running for the server's life; grammar masks installed when xgrammar is there, so any
        request may bring a response_format. The manager decodes greedily; a request that samples (its own
        settings, else the job's) draws its tokens with its own generator through transformers' warpers for
        its settings (SeededSampling), so its text depends on its seed alone, not on the requests beside it.
        CUDA graphs asked for in engine_options replay one sampler for all: every request decodes as `gen`."""
        constrained = importlib.util.find_spec("xgrammar") is not None
        greedy = gen.model_copy(update={"temperature": 0.0})
        plain = generation_config(self.model, greedy, gen.max_new_tokens, self.pad_id)

        def warpers(settings: GenerationConfig):
            sampled = generation_config(self.model, settings, gen.max_new_tokens, self.pad_id)
            return sampling_warpers(self.model, plain, sampled)

        fixed = None
        if self.options.get("use_cuda_graph"):
            fixed = "generation.engine_options.use_cuda_graph replays one captured sampler for every request"
        elif warpers(gen.model_copy(update={"temperature": 0.5})) is None:
            fixed = "the model's generation_config puts a processor (a watermark) after the sampling warpers"
        if fixed:
            session = self.session(gen, [max_length] * max_rows, max_rows, gen.max_new_tokens, constrained)
            session.manager.start()
            return ContinuousServing(session, None, fixed)
        session = self.session(greedy, [max_length] * max_rows, max_rows, gen.max_new_tokens, constrained, True)
        sampler = SeededSampling()
        sampler.install(session.manager)
        session.manager.start()
        return ContinuousServing(session, (sampler, warpers), None)


class ContinuousServing:
    """transformers' manager running for serve: requests join its batch at the next step, each with its own
    decoding settings (`sampling`: the manager's SeededSampling and the warpers for a request's settings),
    unless `fixed` says why they are the server's."""

    def __init__(self, session: Session, sampling: tuple | None, fixed: str | None):
        self.manager, self.masks, self.history = session.manager, session.masks, session.history
        self.constrained = self.masks is not None
        self.sampling, self.fixed = sampling, fixed

    def listen(self, request_id: str, constraint: Constraint | None, deliver: Callable) -> None:
        self.manager.register_result_handler(request_id, deliver)  # called on this event loop
        if constraint is not None:
            self.masks.add(request_id, constraint)

    def add(self, request_id: str, ids: list[int], max_new: int, settings: GenerationConfig) -> bool:
        if self.sampling is not None and settings.temperature > 0:
            sampler, warpers = self.sampling
            sampler.add(request_id, settings.seed, warpers(settings))
        added = self.manager.add_request(ids, request_id=request_id, max_new_tokens=max_new, streaming=True)
        return added is not None

    def cancel(self, request_id: str) -> None:
        self.manager.cancel_request(request_id)

    def forget(self, request_id: str) -> None:
        if self.masks is not None:
            self.masks.drop(request_id)
        if self.history is not None:
            self.history.drop(request_id)
        if self.sampling is not None:
            self.sampling[0].drop(request_id)

    def problem(self) -> str | None:
        if self.manager.is_running():
            return None
        fatal = self.manager.background_thread_status.fatal_error
        return f"the generation engine has stopped ({fatal})" if fatal else "the generation engine has stopped"

    def stop(self) -> None:
        self.manager.stop(block=True, timeout=60)  # flush: what is running finishes


class _Rows:
    """One pass's rows, added to a manager: each with its constraint and seed, in the admission order that
    lets rows sharing a first page read it from the cache (prefix.admission)."""

    def __init__(self, session: Session, sampler, prompts, max_new, constraints, seeds):
        self.session, self.sampler = session, sampler
        self.prompts, self.max_new, self.constraints, self.seeds = prompts, max_new, constraints, seeds

    def add(self, i: int, streaming: bool) -> None:
        if self.constraints[i] is not None:
            self.session.masks.add(f"row-{i}", self.constraints[i])
        if self.sampler is not None:  # its own generator, whatever order the rows are admitted in
            self.sampler.add(f"row-{i}", self.seeds[i])
        self.session.manager.add_request(
            self.prompts[i],
            request_id=f"row-{i}",
            max_new_tokens=self.max_new[i],
            record_timestamps=True,
            streaming=streaming,
        )

    def run(self, page: int | None, check: Callable[[], None]) -> dict:
        """request id -> its finished result. Rows that share a first page wait until one of them is
        prefilled: admitted together, each would compute it."""
        manager, results = self.session.manager, {}
        leaders, waited, followers = admission(self.prompts, page) if page else (range(len(self.prompts)), set(), [])
        manager.start()
        stopped = True
        try:
            for i in leaders:
                self.add(i, streaming=i in waited)  # a waited-for leader streams: its first output says it is cached
            prefilling = {f"row-{i}" for i in waited}
            while len(results) < len(self.prompts):
                check()
                result = manager.get_result(timeout=0.1)
                if result is not None:
                    prefilling.discard(result.request_id)
                    if result.is_finished():
                        results[result.request_id] = result
                elif not manager.is_running():
                    break
                if followers and not prefilling:
                    for i in followers:
                        self.add(i, streaming=False)
                    followers = []
            stopped = False
        finally:  # on Ctrl-C drop the requests in flight at once, instead of finishing them (tens of seconds)
            manager.stop(block=True, timeout=1 if stopped else None, hard_stop=stopped)
            manager.destroy()
        return results


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
