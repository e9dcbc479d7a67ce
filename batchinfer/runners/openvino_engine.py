"""The OpenVINO GenAI engine: `openvino_genai.ContinuousBatchingPipeline` on a CPU (paged attention, continuous
batching, prefix caching, a GenerationConfig per request) over the model converted once and cached
(backends/openvino_causal.py). Token ids in, token ids out: batchinfer tokenizes, decodes and cuts at stop
strings with transformers' own tokenizer, as for every engine.

Precision: f32 (compute and KV cache), which gives the transformers engine's greedy text, unless model.dtype is
bfloat16 on a CPU that runs bf16 natively (bf16 compute, with the u8 KV cache that OpenVINO takes by default there;
engine_options.KV_CACHE_PRECISION sets another). The choice is a function of the job and the
CPU alone (`precision`), so `run`, `openai-batch`, `infer()` and `serve` take the same one for a model on a machine,
and every run into a folder takes its first run's. dtype auto does not try bf16: on a Zen 4 EPYC bf16's first 8
greedy tokens equalled f32's on 75% of rows, so whole completions (what a job writes) would differ on more.
In bf16, constrained rows run on the transformers engine (in bf16 too), offline as in serve, so that a request's
answer is the same through either.

Constrained rows (choices, regex, a JSON schema) run here too, on the pipeline's structured output: the grammar text
batchinfer's own masks compile (constrained/grammar.py's `ebnf`) over the same token bytes (checked once against the
pipeline's tokenizer), each distinct grammar first tried alone on the pipeline, whose xgrammar is its own build.
Where one of these fails, that grammar's rows run on the transformers continuous-batching engine over the same
model (`fallback`), with a note saying why. Every constrained output is checked whole afterwards either way
(generate.py). serve sends constrained requests to the fallback engine: a grammar the pipeline refused would fail
every request stepped with it."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import itertools
import re
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

import numpy as np

from ..constrained.spec import Constraint
from ..errors import ConfigError, ModelError
from ..job.config import GenerationConfig
from .engine import PassOutput, PassRows, Registered, Streamed, Unfit, by_sampling, one_pass, passes_by

F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
BF16 = {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "u8"}  # OpenVINO's own default on bf16 CPUs
# xgrammar's EBNF text, a string literal or a character class (kept as they are) or an unbounded repeat `{n, -1}`
_LITERAL_OR_REPEAT = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{(\d+), -1\}')


def available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("openvino_genai", "openvino_tokenizers"))


def precision(dtype: str) -> str:
    """The precision the engine runs model.dtype `dtype` in on this CPU: f32 for auto and float32, bf16 for
    bfloat16 (GenerateRunner moves a bfloat16 job to the transformers engine where the CPU has no native bf16)."""
    if dtype in ("auto", "float32"):
        return "f32"
    if dtype == "bfloat16":
        return "bf16"
    raise ConfigError(
        f"generation.engine openvino runs float32 or bfloat16, not model.dtype {dtype}",
        "set model.dtype: auto, float32 or bfloat16, or generation.engine: transformers",
    )


def bf16_problem(dtype: str) -> str | None:
    """Why the engine cannot run model.dtype `dtype` here (bfloat16 on a CPU without native bf16), or None."""
    from ..backends.openvino import bf16_supported

    if dtype == "bfloat16" and not bf16_supported():
        from ..backends import why_no_bf16

        return f"model.dtype bfloat16 needs a CPU with native bf16, and {why_no_bf16()}"
    return None


def job_problem(job, runner) -> str | None:
    """Why the engine cannot run this job here (`runner`: the GenerateRunner over the loaded model), or None."""
    from ..backends import openvino_causal
    from .model_generation import generation_problem

    if runner.device.type != "cpu":
        return f"it runs on the CPU, and the model is on {runner.device.type}"
    if not available():
        return "openvino-genai is not installed (pip install 'batchinfer[cpu]')"
    if job.model.quantize != "none":
        return "model.quantize: int8 is a torch path"
    if job.model.dtype not in ("auto", "float32", "bfloat16"):
        return f"it runs float32 or bfloat16, not model.dtype {job.model.dtype}"
    if problem := bf16_problem(job.model.dtype):
        return problem
    return openvino_causal.problem(runner.model.config) or generation_problem(
        runner.model.generation_config, OpenVINOEngine.name
    )


def check_scheduling(options: dict, max_length: int) -> None:
    """Refuse engine_options that the pipeline's scheduling would ignore or fail every row on, before anything is
    converted or compiled. Its default scheduling (dynamic_split_fuse) fills each step with max_num_batched_tokens
    of decoding rows and prompt pieces, as many rows in flight as that and the KV cache allow; max_num_seqs bounds
    only its vLLM-like scheduling. Set alone it changed nothing (batchinfer set it to 32 and a chunk of 256 SMS
    summaries ran 100 rows at once); with dynamic_split_fuse: false, 32 in flight took that chunk 46.5 s instead of
    35.2 s (SmolLM2-135M, 2-core AVX2 EPYC, docs/benchmarks.md "Rows in flight on the OpenVINO engine"). That
    scheduling runs each prompt in one step, and asserts steps of at least max_num_seqs tokens: steps shorter than
    a prompt (`max_length`, a row's most) or than max_num_seqs failed every row of the chunk."""
    import openvino_genai

    split = options.get("dynamic_split_fuse", True)
    if not isinstance(split, bool):
        raise ConfigError(
            f"generation.engine_options.dynamic_split_fuse: {split!r} is no value of it", "give true or false"
        )
    if "max_num_seqs" in options and split:
        raise ConfigError(
            "generation.engine_options.max_num_seqs bounds OpenVINO GenAI's rows in flight only with "
            "dynamic_split_fuse: false; its default scheduling fills each step with max_num_batched_tokens "
            "tokens of as many rows as the KV cache holds, and would ignore it",
            "remove max_num_seqs, or add dynamic_split_fuse: false (each prompt then runs in one step: give "
            f"max_num_batched_tokens at least {max_length:,})",
        )
    default = openvino_genai.SchedulerConfig()
    tokens = options.get("max_num_batched_tokens", default.max_num_batched_tokens)
    seqs = options.get("max_num_seqs", default.max_num_seqs)
    if split or not (isinstance(tokens, int) and isinstance(seqs, int)):
        return  # a value of another type: pipeline() names it as pybind refuses it
    least = max(max_length, seqs)
    if tokens < least:
        given = f"{tokens:,}" if "max_num_batched_tokens" in options else f"{tokens:,}, the pipeline's default"
        what = "a prompt a row may have" if least == max_length else "max_num_seqs"
        raise ConfigError(
            f"generation.engine_options: with dynamic_split_fuse: false each prompt runs in one step, and "
            f"max_num_batched_tokens ({given}) is below {what} ({least:,} tokens): the pipeline would fail every "
            "row of the chunk",
            f"set max_num_batched_tokens to at least {least:,}, or remove dynamic_split_fuse and max_num_seqs",
        )


# One pipeline constructed at a time in a process. GenAI's Python binding sets OPENVINO_TOKENIZERS_PATH_GENAI (where
# libopenvino_tokenizers.so lies) for the length of a construction only (unset before and after one, read with
# libc's getenv): a construction that ends while another is under way unsets it for that one, which then failed
# "Failed to load shared object .../openvino_genai/libopenvino_tokenizers.so". Seen once in CI's suite under the
# avx512_bf16 stand-in, where the early compile (f32) did not match the job's bf16 and build compiled its own
# beside it.
CONSTRUCTING = threading.Lock()


def pipeline(folder: Path, precision: str, gen: GenerationConfig):
    """A ContinuousBatchingPipeline over the conversion in `folder`, compiled in `precision`; gen.engine_options:
    SchedulerConfig fields, and OpenVINO properties (upper-case keys, e.g. KV_CACHE_PRECISION)."""
    import openvino_genai

    options = gen.engine_options  # checked by check_scheduling before the model converts
    scheduler = openvino_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = True
    if gen.max_memory != "auto":  # the KV cache's GB; auto: the pipeline grows it as the rows in flight need
        scheduler.cache_size = max(1, int(gen.max_memory) >> 30)
    properties = dict(F32 if precision == "f32" else BF16)
    for key, value in options.items():
        if key.isupper():
            properties[key] = value
        elif hasattr(scheduler, key):
            try:
                setattr(scheduler, key, value)
            except TypeError:  # pybind's words: "incompatible function arguments", the field unnamed
                kind = type(getattr(scheduler, key)).__name__
                raise ConfigError(
                    f"generation.engine_options.{key}: {value!r} is no value of SchedulerConfig.{key} ({kind})",
                    f"give {key} a {'whole number of at least 0' if kind == 'int' else kind}, or remove it",
                ) from None
        else:
            raise ConfigError(
                f"generation.engine_options: {key} is no field of openvino_genai.SchedulerConfig",
                "use SchedulerConfig fields (cache_size, max_num_batched_tokens, enable_prefix_caching, "
                "dynamic_split_fuse, max_num_seqs with dynamic_split_fuse: false) or OpenVINO properties in upper "
                "case",
            )
    try:
        with CONSTRUCTING:
            return openvino_genai.ContinuousBatchingPipeline(str(folder), scheduler, "CPU", properties)
    except RuntimeError as exc:
        # a property of the job's that OpenVINO refuses names itself in the error: it is the job's to fix, not the
        # cached model's (whose blame invited deleting the cache)
        said = str(exc)  # the longest key first: PERFORMANCE_HINT_NUM_REQUESTS is not PERFORMANCE_HINT
        named = [k for k in sorted(options, key=len, reverse=True) if k.isupper() and re.search(rf"\b{k}\b", said)]
        if named:
            lines = said.strip().splitlines()
            detail = next((line for line in lines if named[0] in line), lines[-1] if lines else "").strip()
            raise ConfigError(
                f"generation.engine_options.{named[0]}: OpenVINO refuses {named[0]}={options[named[0]]!r} ({detail})",
                f"check {named[0]}'s name and value against OpenVINO's CPU device properties, or remove it",
            ) from None
        raise ModelError(f"OpenVINO GenAI cannot load the converted model {folder}: {exc}") from exc


class EarlyPipeline:
    """A pipeline compiling on a thread of its own while the job's config and tokenizer load (the compile
    releases the GIL): OpenVINOEngine.load starts it where the conversion is cached, build takes it where it was
    compiled from what build would compile (else it is dropped and build compiles its own). It hid the whole
    compile, 1.7 s of the 5.2 s a SmolLM2 engine took to start after transformers' imports (2-core AVX2 EPYC)."""

    def __init__(self):
        self.key: tuple | None = None
        self.future: Future | None = None

    @staticmethod
    def _key(folder: Path, precision: str, gen: GenerationConfig) -> tuple:
        return str(folder), precision, repr(sorted(gen.engine_options.items())), gen.max_memory

    def start(self, folder: Path, precision: str, gen: GenerationConfig) -> None:
        future: Future = Future()

        def compile_() -> None:
            try:
                future.set_result(pipeline(folder, precision, gen))
            except BaseException as exc:  # noqa: BLE001 - handed to take(), which raises it where build would
                future.set_exception(exc)

        self.key, self.future = self._key(folder, precision, gen), future
        threading.Thread(target=compile_, name="batchinfer-compile", daemon=True).start()

    def take(self, folder: Path, precision: str, gen: GenerationConfig):
        """The pipeline started for these settings (waiting for its compile), or None."""
        future, started = self.future, self.key
        self.key = self.future = None
        if future is None:
            return None
        if started != self._key(folder, precision, gen):  # not what build compiles: it finishes, unused
            return None
        return future.result()


early = EarlyPipeline()  # one engine loads at a time: GenerateRunner.load runs load, then build


class OpenVINOEngine(Registered):
    name = "openvino"
    pads = False
    shared_page = None  # its prefix cache is its own: the rows' shared pages are not counted here

    @classmethod
    def load(cls, job, model_path) -> tuple:
        """transformers' model; where its conversion is cached, one without its weights (openvino_causal.warm),
        the pipeline compiling meanwhile (early)."""
        from ..backends import candidates, openvino_causal
        from ..backends.models import load_model, model_identity

        candidates(job.model, "cpu")  # a model.backend named in the job file: says why it runs no generate job
        entry = openvino_causal.warm_entry(job.model, model_identity(model_path)) if available() else None
        if entry is None:
            return load_model(job.model, model_path)
        early.start(entry, "f32", job.generation)  # warm_entry: a job in f32
        return openvino_causal.warm(job.model, model_path, entry)

    @classmethod
    def build(cls, runner, job, model_path) -> OpenVINOEngine:
        """The engine over the model converted once and cached; raises Unfit where it cannot run the job here
        (job_problem) or the model does not convert. Rows whose grammar cannot run here go to the runner's
        model_engine."""
        from ..backends import openvino_causal
        from ..backends.models import model_identity
        from ..backends.openvino import bf16_supported

        if problem := job_problem(job, runner):
            raise Unfit(problem)
        check_scheduling(runner.gen.engine_options, runner.max_length)
        f32_model, identity = runner.f32_model(job, model_path), model_identity(model_path)
        try:
            folder, seconds = openvino_causal.converted(identity, model_path, f32_model, runner.tokenizer)
        except (ModelError, RuntimeError, ValueError, TypeError) as exc:  # the cache's, the tracer's, OpenVINO's
            raise Unfit(f"the model did not convert for OpenVINO GenAI ({type(exc).__name__}: {exc})") from None
        runner.load_seconds.update(seconds)  # {"convert": s} where this process converted it: a later one reads it
        fallback = lambda: runner.model_engine(job, model_path)  # noqa: E731
        pipe = early.take(folder, precision(job.model.dtype), runner.gen)
        built = cls(folder, runner.gen, precision(job.model.dtype), runner.eos, fallback, lambda: runner.grammars, pipe)
        if job.model.dtype == "auto" and bf16_supported():
            built.note("f32: bf16 changes generated text; model.dtype: bfloat16 runs it in bf16")
        return built

    @classmethod
    def named_error(cls, problem: str) -> ConfigError:
        return ConfigError(f"generation.engine openvino: {problem}", "set generation.engine: auto (or transformers)")

    def __init__(
        self,
        folder: Path,
        gen: GenerationConfig,
        precision: str,
        eos: set[int],
        fallback,
        grammars: Callable,
        pipe=None,
    ):
        self.folder, self.gen, self.eos, self.precision = folder, gen, eos, precision
        self.fallback = fallback  # () -> the transformers engine, for rows whose grammar cannot run here
        self.grammars = grammars  # () -> grammar.Grammars, built on first use
        self.notes: list[str] = []
        self.ids = itertools.count()  # request ids: the pipeline keeps a grammar state per id
        self.structures: dict[Constraint, object | None] = {}  # a grammar -> its StructuredOutputConfig, or None
        self.pipe = pipe or pipeline(folder, precision, gen)  # pipe: one compiled already (early)

    @property
    def described(self) -> dict:
        kv = self.gen.engine_options.get(
            "KV_CACHE_PRECISION", (F32 if self.precision == "f32" else BF16)["KV_CACHE_PRECISION"]
        )
        described = {"name": self.name, "precision": self.precision, "kv_cache": kv}
        return described | ({"notes": self.notes} if self.notes else {})

    # --- a pass ----------------------------------------------------------------------------------------------

    def run(self, rows: PassRows, max_rows: int, check: Callable[[], None]) -> PassOutput:
        """One pass, every row with its own settings and grammar; rows whose grammar cannot run here
        (`structured`) on the fallback engine."""
        here = [c is None or self.structured(c) is not None for c in rows.constraints]
        own = [i for i, ok in enumerate(here) if ok]
        bound = [i for i, ok in enumerate(here) if not ok]
        raw: list = [None] * len(rows.prompts)
        configs = [self.config(rows, i) for i in own]
        done, first = self.generate([rows.prompts[i] for i in own], configs, check)
        for i, result in zip(own, done):
            raw[i] = result
        if strays := self.strays(rows, own, done):
            self.note(
                f"{len(strays)} constrained rows ran again on the transformers engine: the pipeline's xgrammar (its "
                f"own build) let through tokens batchinfer's masks refuse, first {strays[0][1]}"
            )
            bound = sorted(bound + [i for i, _ in strays])
        if bound:
            for group in passes_by([rows.settings[i] for i in bound], by_sampling):
                positions = [bound[g] for g in group]
                sub = PassRows(*[[values[p] for p in positions] for values in vars(rows).values()])
                out = self.fallback().run(sub, max_rows, check)
                for p, result in zip(positions, out.raw):
                    raw[p] = result
                first += out.first_token_seconds
        return PassOutput(raw, first)

    def config(self, rows: PassRows, i: int, max_new: int | None = None):
        """openvino_genai.GenerationConfig for row i: its own decoding settings, the model's eos tokens."""
        import openvino_genai

        gen, config = rows.settings[i], openvino_genai.GenerationConfig()
        config.max_new_tokens = max_new or rows.max_new[i]
        config.stop_token_ids = set(self.eos)
        if self.eos:
            config.eos_token_id = min(self.eos)
        # the model's own settings that GenAI applies as transformers does (model_generation.HONOURED; checked
        # against model.generate in tests/test_generate.py): its repetition penalty over prompt and completion,
        # and end tokens held back until min_new_tokens, or min_length counting the prompt
        model = self.model_defaults
        config.repetition_penalty = model.repetition_penalty or 1.0
        config.min_new_tokens = max(model.min_new_tokens or 0, (model.min_length or 0) - len(rows.prompts[i]))
        if gen.temperature > 0:
            config.do_sample = True
            config.temperature, config.top_p = gen.temperature, gen.top_p
            config.top_k = gen.top_k or 0
            config.rng_seed = gen.seed
        else:
            config.do_sample = False
        if rows.constraints[i] is not None and (structure := self.structured(rows.constraints[i])) is not None:
            config.structured_output_config = structure
        return config

    @functools.cached_property
    def model_defaults(self):
        """The model's GenerationConfig (transformers'), as saved beside its conversion."""
        from .model_generation import from_folder

        return from_folder(self.folder)

    def passes(self, settings: list[GenerationConfig], skip=()) -> list[list[int]]:
        return passes_by(settings, one_pass, skip)

    def note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    # --- constrained rows ------------------------------------------------------------------------------------

    def structured(self, constraint: Constraint):
        """The pipeline's StructuredOutputConfig for `constraint`, or None (with a note saying why) where it
        would not give batchinfer's own masks: the same grammar text over the same token bytes, taken by the
        pipeline's xgrammar. Settled once per distinct grammar."""
        if constraint not in self.structures:
            import openvino_genai

            from ..constrained.grammar import ebnf

            structure = openvino_genai.StructuredOutputConfig()
            structure.grammar = portable(ebnf(constraint))
            problem = self.bf16_constrained or self.vocabulary_problem or self.refused(structure)
            self.structures[constraint] = None if problem else structure
            if problem:
                self.note(f"rows constrained by {constraint.where} run on the transformers engine: {problem}")
        return self.structures[constraint]

    def strays(self, rows: PassRows, own: list[int], done: list) -> list[tuple[int, str]]:
        """The constrained rows of `own` whose tokens batchinfer's masks refuse somewhere, each with what was
        refused. The pipeline's masks come from its own xgrammar build; a greedy row whose every token
        batchinfer's masks allow is the transformers engine's, and the others are run there again."""
        strays = []
        for i, (tokens, error) in zip(own, done):
            if rows.constraints[i] is None or error:
                continue
            at = self.grammars().refused_at(rows.constraints[i], tokens)
            if at is not None:
                vocabulary = self.grammars().vocabulary
                token = vocabulary[tokens[at]] if tokens[at] < len(vocabulary) else b"?"
                after = b"".join(vocabulary[t] for t in tokens[:at] if t < len(vocabulary))
                strays.append((i, f"token {tokens[at]} ({token!r}) after {after[-40:]!r} in rows constrained by "
                                  f"{rows.constraints[i].where}"))  # fmt: skip
        return strays

    @property
    def bf16_constrained(self) -> str | None:
        """Why constrained rows leave the pipeline in bf16, or None in f32: serve sends constrained requests to the
        transformers engine, so a job does too, and both give the same answers."""
        return "the engine runs bf16, and in bf16 they run where serve's do" if self.precision == "bf16" else None

    @functools.cached_property
    def vocabulary_problem(self) -> str | None:
        """Why the pipeline's tokenizer would let the grammar see other tokens than batchinfer's masks do (its
        bytes per token id differ from xgrammar's reading of the transformers tokenizer), or None."""
        ours = self.grammars().vocabulary
        theirs = [b""] * len(ours)
        for token, i in self.pipe.get_tokenizer().get_vocab().items():
            if i >= len(theirs):
                return f"the converted tokenizer has token {i}, past the model's {len(ours)} tokens"
            theirs[i] = token
        apart = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
        if apart:
            i = apart[0]
            return (
                f"the converted tokenizer reads {len(apart)} of {len(ours)} tokens otherwise than transformers' "
                f"(token {i}: {theirs[i]!r}, not {ours[i]!r})"
            )
        return None

    def refused(self, structure) -> str | None:
        """What the pipeline's xgrammar says of `structure`'s grammar, tried alone (one token after a one-token
        prompt), or None when it takes it. A grammar it refuses fails the step that meets it, and every request
        stepped with it, until that request is cancelled."""
        import openvino as ov
        import openvino_genai

        from ..constrained.grammar import xgrammar_message

        config = openvino_genai.GenerationConfig()
        config.max_new_tokens, config.do_sample = 1, False
        config.stop_token_ids = set(self.eos)
        config.structured_output_config = structure
        start = ov.Tensor(np.asarray([[min(self.eos, default=0)]], dtype=np.int64))
        handle = self.pipe.add_request(next(self.ids), start, config)
        try:
            while self.pipe.has_non_finished_requests():
                self.pipe.step()
        except RuntimeError as exc:
            drain(self.pipe, [handle])
            return f"OpenVINO GenAI's xgrammar refuses the grammar ({xgrammar_message(exc)})"
        return None

    def generate(
        self, prompts: list[list[int]], configs: list, check: Callable[[], None]
    ) -> tuple[list[tuple[list[int], str | None]], list[float]]:
        """(tokens, None) per prompt, ending in an end token where the pipeline says it stopped at one; and each
        row's seconds to its first token. Stepped here, so that `check` (Ctrl-C) is asked between steps."""
        import openvino as ov
        import openvino_genai

        pipeline, started = self.pipe, time.perf_counter()
        handles: list = []
        try:
            for p, c in zip(prompts, configs):
                handles.append(pipeline.add_request(next(self.ids), ov.Tensor(np.asarray([p], dtype=np.int64)), c))
            first: dict[int, float] = {}
            while pipeline.has_non_finished_requests():
                check()
                pipeline.step()
                for i, handle in enumerate(handles):
                    if i not in first and handle.can_read():
                        first[i] = time.perf_counter() - started
            outputs = [handle.read_all()[0] for handle in handles]
        except RuntimeError as exc:
            drain(pipeline, handles)
            return [([], f"OpenVINO GenAI: {exc}")] * len(prompts), []
        stop = openvino_genai.GenerationFinishReason.STOP
        return [(self.ended(list(o.generated_ids), o.finish_reason == stop), None) for o in outputs], list(
            first.values()
        )

    def ended(self, tokens: list[int], stopped: bool) -> list[int]:
        """The completion ending in an end token when the engine stopped at one, whether or not it kept it."""
        if stopped and self.eos and not (tokens and tokens[-1] in self.eos):
            tokens.append(min(self.eos))
        return tokens

    # --- serve -----------------------------------------------------------------------------------------------

    def serve(self, gen: GenerationConfig, max_rows: int, max_length: int) -> OpenVINOServing:
        return OpenVINOServing(self, gen, lambda: self.fallback().serve(gen, max_rows, max_length))


def drain(pipeline, handles: list) -> None:
    """Cancel `handles` after a failed step and step the pipeline clear: a request whose step failed stays queued,
    failing every later step, until it is cancelled."""
    for handle in handles:
        handle.cancel()
    try:
        while pipeline.has_non_finished_requests():
            pipeline.step()
    except RuntimeError:
        pass  # a pipeline that fails again fails the next requests with its message


def portable(grammar: str) -> str:
    """xgrammar's EBNF text as the xgrammar built into OpenVINO GenAI reads it: the unbounded repeat `rule{n, -1}`
    that xgrammar 0.2 prints is spelled `rule{n,}`; string literals and character classes are kept as they are."""
    return _LITERAL_OR_REPEAT.sub(lambda m: f"{{{m[1]},}}" if m[1] is not None else m[0], grammar)


class OpenVINOServing:
    """The pipeline stepped by a thread of its own: requests added as they come, each one's new tokens handed to
    its listener on the event loop after every step. A constrained request goes to the transformers engine's
    running batch (grammar masks), started at the first one."""

    def __init__(self, engine: OpenVINOEngine, gen: GenerationConfig, fallback: Callable):
        self.engine, self.gen = engine, gen
        self.start_fallback = fallback
        self.fallback = None  # the transformers engine's Serving, once a constrained request came
        self.routed: set[str] = set()  # request ids on the fallback
        self.constrained = importlib.util.find_spec("xgrammar") is not None
        self.fixed = None  # each request brings its own GenerationConfig
        self.pipeline = engine.pipe
        self.ids = itertools.count()
        self.lock = threading.Lock()  # add_request from the server's threads, step from this one
        self.listeners: dict[str, tuple[Callable, asyncio.AbstractEventLoop]] = {}
        self.handles: dict[str, tuple[object, list[int]]] = {}  # request id -> (its handle, its tokens so far)
        self.failed: str | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="openvino-genai", daemon=True)
        self.thread.start()

    def listen(self, request_id: str, constraint, deliver: Callable) -> None:
        if constraint is None:
            self.listeners[request_id] = (deliver, asyncio.get_running_loop())
            return
        with self.lock:
            self.fallback = self.fallback or self.start_fallback()
        self.routed.add(request_id)
        self.fallback.listen(request_id, constraint, deliver)

    def add(self, request_id: str, ids: list[int], max_new: int, settings: GenerationConfig) -> bool:
        import openvino as ov

        if request_id in self.routed:
            return self.fallback.add(request_id, ids, max_new, settings)
        if self.problem() or self.stopping.is_set():
            return False
        rows = PassRows([settings], [ids], [max_new], [None])  # a GenerationConfig per request (its rng_seed)
        with self.lock:
            handle = self.pipeline.add_request(
                next(self.ids), ov.Tensor(np.asarray([ids], dtype=np.int64)), self.engine.config(rows, 0)
            )
            self.handles[request_id] = (handle, [])
        return True

    def cancel(self, request_id: str) -> None:
        if request_id in self.routed:
            return self.fallback.cancel(request_id)
        with self.lock:
            handle = self.handles.pop(request_id, (None,))[0]
            if handle is not None:
                handle.cancel()
        self.listeners.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        if request_id in self.routed:
            self.routed.discard(request_id)
            self.fallback.forget(request_id)
        self.listeners.pop(request_id, None)

    def loop(self) -> None:
        import openvino_genai

        running = openvino_genai.GenerationStatus.RUNNING
        stop = openvino_genai.GenerationFinishReason.STOP
        try:
            while not (self.stopping.is_set() and not self.handles):
                with self.lock:
                    busy = self.pipeline.has_non_finished_requests()
                    if busy:
                        self.pipeline.step()
                    handles = list(self.handles.items())
                if not busy:
                    time.sleep(0.005)
                for request_id, (handle, tokens) in handles:
                    stopped, before = False, len(tokens)
                    while handle.can_read():
                        for output in handle.read().values():
                            tokens += list(output.generated_ids)
                            stopped = stopped or output.finish_reason == stop
                    finished = handle.get_status() != running
                    if finished:
                        self.engine.ended(tokens, stopped)
                        with self.lock:
                            self.handles.pop(request_id, None)
                    if finished or len(tokens) > before:
                        self.deliver(request_id, Streamed(list(tokens), finished))
        except RuntimeError as exc:
            self.failed = str(exc)

    def deliver(self, request_id: str, output: Streamed) -> None:
        listener = self.listeners.get(request_id)
        if listener is not None:
            deliver, loop = listener
            loop.call_soon_threadsafe(deliver, output)

    def problem(self) -> str | None:
        if self.failed:
            return f"the generation engine has stopped ({self.failed})"
        if not self.thread.is_alive():
            return "the generation engine has stopped"
        return self.fallback.problem() if self.fallback is not None else None

    def stop(self) -> None:
        self.stopping.set()
        if self.fallback is not None:
            self.fallback.stop()
        self.thread.join(timeout=60)
