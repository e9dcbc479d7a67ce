"""The generation engines' one protocol: a pass of token prompts in, each row's generated tokens out; and for
serve, requests added one by one to a running batch (Serving).

Four engines implement it: continuous batching (continuous.py, transformers' paged KV cache), OpenVINO GenAI's
continuous batching on a CPU (openvino_engine.py), static `model.generate` batches (static.py, the baseline) and
vLLM (vllm_engine.py). The generate runner cuts rows, text and finish reasons around them; serve reaches
generation only through `Engine.serve`.

Engines are chosen, as TEI picks its backend, once and never by name: generation.engine names a class in ENGINES (or
auto tries AUTO_FIRST's, then AUTO_AFTER's), and GenerateRunner asks that class (Registered) why it cannot run the
job, how it loads its model and how it builds over it; a new engine is one module and one line in ENGINES."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..constrained.spec import Constraint
from ..errors import ConfigError
from ..job.config import GenerationConfig


@dataclass
class PassRows:
    """One engine pass's rows, every list in their order."""

    settings: list[GenerationConfig]  # each row's own (seed, stop: its own; the pass shares the rest)
    prompts: list[list[int]]  # token ids
    max_new: list[int]
    constraints: list[Constraint | None]  # the grammar a row's output must follow; None: free


@dataclass
class PassOutput:
    """What one engine pass gives back, per row of the pass in its order."""

    raw: list[tuple[list[int], str | None]]  # (generated tokens, the engine's error message or None)
    first_token_seconds: list[float] = field(default_factory=list)  # rows that report it, in any order
    prefix_hits: list[int] | None = None  # prompt tokens read from the engine's cache; None: it shares none


@dataclass
class Streamed:
    """What a served request has generated so far (the shape of transformers' GenerationOutput that serve reads)."""

    generated_tokens: list[int]
    finished: bool = False
    error: str | None = None

    def is_finished(self) -> bool:
        return self.finished


class Serving(Protocol):
    """An engine's running batch, taking requests as they come (serve). Request ids are the caller's."""

    constrained: bool  # takes a constraint per request (listen's); False: a constrained request is refused
    # why every request decodes with the server's settings (None: add takes each request's own temperature,
    # top_p and seed, a seed giving the same text whatever runs beside it)
    fixed: str | None

    def listen(self, request_id: str, constraint: Constraint | None, deliver: Callable) -> None:
        """Before add: deliver(output) gets the request's outputs (Streamed's shape, each holding every token so
        far) on the calling event loop, the last one finished; `constraint` holds its output to a grammar."""

    def add(self, request_id: str, ids: list[int], max_new: int, settings: GenerationConfig) -> bool:
        """Admit a listened-for request, decoded with `settings` (blocks while the engine's input queue is full;
        raises queue.Full when it stays full). False: the engine takes no new requests."""

    def cancel(self, request_id: str) -> None:
        """Stop a request (its client left); what it holds is freed."""

    def forget(self, request_id: str) -> None:
        """Drop what listen kept for a request that has ended."""

    def problem(self) -> str | None:
        """Why the engine serves no more (it stopped), or None."""

    def stop(self) -> None:
        """Finish what is running, then stop."""


class Engine(Protocol):
    name: str  # the generation.engine it is: transformers, openvino, static, vllm
    shared_page: int | None  # the cache page (tokens) in which rows' common prefixes are shared; None: none
    pads: bool  # computes padding (static batches pad to their longest prompt); False: every token is a row's
    # the report's entry for it: {"name", "precision", "notes", "precision_check"}, each where it applies
    described: dict

    def run(self, rows: PassRows, max_rows: int, check: Callable[[], None]) -> PassOutput:
        """One pass over rows whose settings the engine can take together (passes), at most max_rows
        at once where the engine does not schedule them itself; `check` is called while waiting and may
        raise to stop (Ctrl-C)."""
        ...

    def passes(self, settings: list[GenerationConfig], skip=()) -> list[list[int]]:
        """Row positions (but those in `skip`) grouped into the passes their settings need (passes_by)."""
        ...

    def note(self, note: str) -> None:
        """Add `note` to the report's entry for it (described["notes"]): why this engine runs the job."""
        ...

    def serve(self, gen: GenerationConfig, max_rows: int, max_length: int) -> Serving:
        """A running batch for serve: `gen`'s decoding for what a request does not set, max_rows in flight, each
        up to max_length tokens (prompt and completion); raises BadInput-like errors where the engine cannot serve."""
        ...


def with_note(described: dict, note: str) -> dict:
    """An engine's report entry with `note` added to its notes, as a new dict (a class's entry is shared)."""
    return {**described, "notes": [*described.get("notes", []), note]}


def cannot_serve(engine: str) -> ConfigError:
    """The error for an engine that runs whole passes only."""
    return ConfigError(
        f"serve runs a batch that requests join as they come; generation.engine {engine} runs whole passes only",
        "set generation.engine: auto (openvino on a CPU, else transformers), openvino or transformers",
    )


def generation_config(model, gen: GenerationConfig, max_new_tokens: int, pad_id: int):
    """transformers' GenerationConfig for decoding with `gen`'s settings, up to max_new_tokens."""
    config = copy.deepcopy(model.generation_config)
    config.max_new_tokens = max_new_tokens
    config.do_sample = gen.temperature > 0
    if config.do_sample:
        config.temperature, config.top_p, config.top_k = gen.temperature, gen.top_p, gen.top_k or None
    else:
        config.temperature, config.top_p, config.top_k = None, None, None
    config.pad_token_id = pad_id
    return config


def passes_by(settings: list[GenerationConfig], key: Callable[[GenerationConfig], tuple], skip=()) -> list[list[int]]:
    """Row positions (but those in `skip`) grouped into passes by `key` (an engine's `passes`), in first-seen order."""
    passes: dict[tuple, list[int]] = {}
    for position, gen in enumerate(settings):
        if position not in skip:
            passes.setdefault(key(gen), []).append(position)
    return list(passes.values())


def one_pass(gen: GenerationConfig) -> tuple:
    """An engine that takes every row's settings per request (vLLM, OpenVINO GenAI): one pass."""
    return ()


def by_sampling(gen: GenerationConfig) -> tuple:
    """transformers' continuous batching: a pass per (temperature, top_p), a row's seed being its own inside the
    pass (constrained/sampling.py). Greedy rows share one pass whatever their seed or top_p (neither changes a
    greedy completion), and stop strings never part rows: each row's are cut from its own text."""
    return ("greedy",) if gen.temperature == 0 else (gen.temperature, gen.top_p)


def by_seed(gen: GenerationConfig) -> tuple:
    """Static batches, the baseline, seed one generator per batch: sampled rows also part by seed."""
    return by_sampling(gen) + ((gen.seed,) if gen.temperature else ())


class Unfit(Exception):
    """Why an engine cannot run the job (Registered.build): engine auto notes it and tries the next, a named engine is
    refused (Registered.named_error)."""


class Registered:
    """What GenerateRunner.load asks of an engine class in ENGINES before there is an engine: these defaults are an
    engine's over the model transformers loads (continuous.py, static.py, a new engine's, with its classmethod
    `over(gen, model, device, pad_id, eos, grammars)`); vllm_engine.py and openvino_engine.py say their own."""

    name: str

    @classmethod
    def unfit(cls, job, model_path, auto: bool) -> str | None:
        """Why it cannot run the job, known before the model loads, or None; `auto`: engine auto asks (before an
        engine it may pass over)."""
        return None

    @classmethod
    def load(cls, job, model_path) -> tuple:
        """(tokenizer, model, device) it runs: transformers' model."""
        from ..backends import candidates
        from ..backends.models import load_model

        candidates(job.model, "cpu")  # a model.backend named in the job file: says why it runs no generate job
        return load_model(job.model, model_path)

    @classmethod
    def over(cls, gen: GenerationConfig, model, device, pad_id: int, eos: set[int], grammars: Callable) -> Engine:
        """The engine over a loaded model (build's), `grammars` building xgrammar's compiler on first use."""
        raise NotImplementedError

    @classmethod
    def build(cls, runner, job, model_path) -> Engine:
        """The engine over the runner's loaded model, in its precision (its report entry says which); raises Unfit
        where it would not apply all of the model's generation_config (model_generation) as generate does."""
        from .model_generation import generation_problem

        if problem := generation_problem(runner.model.generation_config, cls.name):
            raise Unfit(problem)
        built = cls.over(runner.gen, runner.model, runner.device, runner.pad_id, runner.eos, lambda: runner.grammars)
        built.described = {**built.described, "precision": runner.precision}
        return built

    @classmethod
    def named_error(cls, problem: str) -> ConfigError:
        """The error for a job that names it where it cannot run (unfit, build's Unfit)."""
        hint = "set generation.engine: static (model.generate), or edit the model's generation_config.json"
        return ConfigError(problem, hint)

    @classmethod
    def passed_over(cls, problem: str, instead: str) -> str:
        """engine auto's note where it cannot run the job, and `instead` is auto's next."""
        return f"engine auto: {instead}, not {cls.name}: {problem}"


# generation.engine -> "module:Class" (relative to this package, or absolute) of a Registered engine class, imported
# when a job runs it, as runners.RUNNERS: transformers' continuous batching imports torch's compiler (seconds).
ENGINES = {
    "transformers": ".continuous:ContinuousEngine",
    "openvino": ".openvino_engine:OpenVINOEngine",
    "static": ".static:StaticEngine",
    "vllm": ".vllm_engine:VllmEngine",
}
# generation.engine auto: the engine it tries first on each device type (models.device_type; None: any other), where
# it can run the job; else those over the loaded model, in AUTO_AFTER's order, the first that applies all of the
# model's generation_config (on a CUDA GPU, the faster of the two, measured: engine_probe.py).
AUTO_FIRST = {"cuda": "vllm", None: "openvino"}
AUTO_AFTER = ("transformers", "static")


def engine_class(name: str) -> type[Registered]:
    """The engine class registered as generation.engine `name`."""
    import importlib

    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module, __package__), cls)
