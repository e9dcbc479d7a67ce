"""The vLLM engine: `vllm.LLM` on a GPU, for the same job file and the same output columns; every row
with its own settings in one pass, and its prefix caching reusing what rows share."""

from __future__ import annotations

import importlib.util
import json
from typing import Callable

import torch

from ..constrained.spec import Constraint
from ..errors import ConfigError, ModelError
from ..job.config import GenerationConfig
from .engine import PassOutput, PassRows, Registered, cannot_serve, one_pass, passes_by, with_note

VLLM_BLOCK = 16  # vLLM's default cache block (tokens)


class VllmEngine(Registered):
    name = "vllm"
    pads = False
    described = {"name": "vllm"}

    @classmethod
    def unfit(cls, job, model_path, auto: bool) -> str | None:
        """Where vLLM would not decode as generate does with the model's generation_config (read from its folder:
        vllm.LLM has none); for engine auto, also where vLLM is not its choice (auto_problem)."""
        from .model_generation import from_folder, generation_problem

        if auto and (why := auto_problem(job.generation)):
            return why
        problem = generation_problem(from_folder(model_path), cls.name)
        return f"vllm would not decode as generate does: {problem}" if problem and auto else problem

    @classmethod
    def load(cls, job, model_path) -> tuple:
        """vllm.LLM, its tokenizer (the job's chat template set on it) and the GPU."""
        from ..job.templates import chat_template

        llm = load_vllm(model_path, job.generation.engine_options)
        tokenizer = llm.get_tokenizer()
        if job.model.chat_template is not None:
            tokenizer.chat_template = chat_template(job.model.chat_template)
        return tokenizer, llm, torch.device("cuda")

    @classmethod
    def build(cls, runner, job, model_path) -> VllmEngine:
        """Over vllm.LLM (unfit read its generation_config); its report entry says vLLM's own precision."""
        built = cls.over(runner.gen, runner.model, runner.device, runner.pad_id, runner.eos, lambda: runner.grammars)
        if runner.gen.engine == "auto":
            built.note("engine auto on a GPU: vllm (vllm is installed)")
        return built

    @classmethod
    def named_error(cls, problem: str) -> ConfigError:
        return ConfigError(problem, "set generation.engine: auto, transformers or static")

    @classmethod
    def passed_over(cls, problem: str, instead: str) -> str:
        return f"engine auto on a GPU: not vllm, as {problem}"

    @classmethod
    def over(cls, gen, model, device, pad_id: int, eos: set[int], grammars: Callable) -> VllmEngine:
        """generation.engine's engine over a loaded model (engine.ENGINES)."""
        return cls(model, gen.engine_options, eos)

    def __init__(self, llm, options: dict, eos: set[int]):
        self.llm, self.eos = llm, eos
        self.shared_page = options.get("block_size", VLLM_BLOCK) if options.get("enable_prefix_caching", True) else None

    def passes(self, settings: list[GenerationConfig], skip=()) -> list[list[int]]:
        return passes_by(settings, one_pass, skip)

    def note(self, note: str) -> None:
        self.described = with_note(self.described, note)

    def run(self, rows: PassRows, max_rows: int, check: Callable[[], None]) -> PassOutput:
        """One pass: vLLM takes each row's own settings (its seed, stop strings, temperature) and schedules
        the rows itself (max_rows does not apply)."""
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
            for gen, m, c in zip(rows.settings, rows.max_new, rows.constraints)
        ]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in rows.prompts], params, use_tqdm=False)
        hits = [getattr(o, "num_cached_tokens", None) or 0 for o in outputs]  # prefix caching's, per request
        return PassOutput([(self.tokens(o.outputs[0]), None) for o in outputs], [], hits)

    def serve(self, gen, max_rows: int, max_length: int):
        raise cannot_serve(self.name)  # vllm.LLM runs whole passes; its own server is `vllm serve`

    def tokens(self, output) -> list[int]:
        """A vLLM completion's tokens, ending in an end token when vLLM says it stopped (finish_reason stop),
        so that finish reads stop, not length, whether or not vLLM kept that token."""
        tokens = list(output.token_ids)
        if output.finish_reason == "stop" and self.eos and not (tokens and tokens[-1] in self.eos):
            tokens.append(min(self.eos))
        return tokens


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


def auto_problem(gen: GenerationConfig) -> str | None:
    """Why engine auto on a CUDA GPU does not run vLLM, in the report's words, for the generation section `gen`, or
    None. vLLM takes its own engine_options, so a job that gives any keeps to the probe between transformers'
    continuous batching and static batches (engine_probe.py)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install 'batchinfer[vllm]')"
    if gen.engine_options:
        return "generation.engine_options are set, and name one engine's fields: set engine: vllm for vLLM"
    return None


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
