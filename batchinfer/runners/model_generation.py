"""The model's own generation settings (its generation_config.json) as transformers' `generate` applies them, and
which engine honours which. A model may ship a repetition penalty (Qwen2.5-Instruct: 1.05), a minimum length,
suppressed tokens...: an engine that dropped one would write other text than the model's library, silently. So
every field that changes what `generate` computes is honoured by the engine that runs the job, or the job goes to
one that honours it (engine auto, with a note) or is refused (an engine named in the job file), naming the field.

The job's own decoding settings (generation.temperature, top_p, top_k, seed) replace the model's where the job
sets any of the first three; where it sets none, a model whose generation_config samples is sampled with its own
temperature, top_p and top_k, as `generate` does (`model_sampling`; the job's seed keeps it repeatable). The rest
is the model's, as here.

transformers' continuous batching drops the processors that read a row's tokens so far (the repetition penalty,
minimum lengths) or hands them the step's last tokens only (n-gram bans, bad words); continuous.History applies them as
`generate` does, each request with its own prompt and tokens."""

from __future__ import annotations

import copy
import json
from pathlib import Path

# Logits processors over a row's tokens so far (prompt and completion) or its length, before the sampling warpers.
HISTORY = (
    "repetition_penalty",
    "encoder_repetition_penalty",  # a decoder-only model's "encoder" ids are its prompt
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "sequence_bias",
    "min_length",
    "min_new_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "remove_invalid_values",
)
# Warpers transformers adds when sampling, after temperature, top-k and top-p (a row at a time, no history).
WARPERS = ("min_p", "typical_p", "top_h", "epsilon_cutoff", "eta_cutoff")
# Decoding that is no longer one row's token after token: beams, guidance (a second forward pass), a watermark
# (after the warpers, over the row's last tokens). Only model.generate itself runs them.
SEARCH = ("num_beams", "num_beam_groups", "diversity_penalty", "penalty_alpha", "dola_layers", "guidance_scale")
SEARCH_AFTER = ("watermarking_config",)
BEAMS_ONLY = ("length_penalty", "early_stopping", "low_memory")  # read by beam search alone
# What no engine here gives as generate does: stop strings are kept in generate's text and cut from batchinfer's
# (set generation.stop instead), max_time stops by the clock, token healing re-tokenizes the prompt, and
# batchinfer writes one completion per row.
NOWHERE = ("stop_strings", "max_time", "token_healing", "num_return_sequences", "constraints", "force_words_ids")

# What changes with the batch in model.generate: padding counted as prompt (min_length, the encoder-side penalties
# and n-grams over the padded prompt) or the batch's longest budget taken as every row's (beam search, forced_eos).
# The static engine runs rows one at a time when the model sets one of these.
BATCH_BOUND = (
    "min_length",
    "encoder_repetition_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "forced_eos_token_id",
    "num_beams",
    "guidance_scale",
)

# What each engine honours of them. The static engine is model.generate itself. The OpenVINO engine's mapping is in
# openvino_engine.config; the transformers engine's history processors are continuous.History's.
HONOURED = {
    "static": (*HISTORY, *WARPERS, *SEARCH, *SEARCH_AFTER, *BEAMS_ONLY),
    "transformers": (*HISTORY, *WARPERS),
    "openvino": ("repetition_penalty", "min_new_tokens", "min_length"),
    "vllm": (),
}
# Values with which a field changes nothing (transformers' own defaults aside).
_NO_OP = {"guidance_scale": 1.0, "remove_invalid_values": False, "suppress_tokens": [], "begin_suppress_tokens": []}


def model_settings(generation_config) -> dict[str, object]:
    """The fields of the model's GenerationConfig (transformers') that change what `generate` computes: those set to
    other than transformers' defaults (pure). Beam-search fields count only where the model searches with beams."""
    from transformers import GenerationConfig

    defaults = {**GenerationConfig._get_default_generation_params(), **_NO_OP}
    beams = (getattr(generation_config, "num_beams", None) or 1) > 1
    fields = (*HISTORY, *WARPERS, *SEARCH, *SEARCH_AFTER, *NOWHERE, *(BEAMS_ONLY if beams else ()))
    found = {}
    for name in fields:
        value = getattr(generation_config, name, None)
        if value is not None and value != defaults.get(name) and value not in ([], {}):
            found[name] = value
    return found


def unhonoured(generation_config, engine: str) -> list[str]:
    """The fields the model's generation_config sets that `engine` does not apply as `generate` does (pure)."""
    return [name for name in model_settings(generation_config) if name not in HONOURED[engine]]


def generation_problem(generation_config, engine: str) -> str | None:
    """Why `engine` would not decode as transformers' generate does with the model's generation_config, or None."""
    left = unhonoured(generation_config, engine)
    return refusal(left, generation_config, engine) if left else None


def from_folder(path):
    """The GenerationConfig (transformers') in a model folder; an empty one where it has none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json: generate applies transformers' defaults
        return GenerationConfig()


def batch_bound(generation_config) -> list[str]:
    """The fields the model sets whose effect in a padded model.generate batch differs from the row's alone."""
    return [name for name in model_settings(generation_config) if name in BATCH_BOUND]


def refusal(fields: list[str], generation_config, engine: str) -> str:
    """What a report note or an error says of the fields `engine` leaves out."""
    said = ", ".join(f"{name} {getattr(generation_config, name)!r}" for name in fields)
    return f"the model's generation_config.json sets {said}, which the {engine} engine does not apply as generate does"


def history_config(generation_config):
    """(the config the continuous-batching manager is built with: the history fields cleared, as its own processors
    drop or misread them; the config History builds each request's processors from: theirs alone, greedy)."""
    shared, own = copy.deepcopy(generation_config), copy.deepcopy(generation_config)
    for name in HISTORY:
        setattr(shared, name, None)
    own.do_sample, own.watermarking_config, own.renormalize_logits, own.guidance_scale = False, None, False, None
    return shared, own


def needs_history(generation_config) -> bool:
    return any(name in HISTORY for name in model_settings(generation_config))


SAMPLING = ("temperature", "top_p", "top_k")


def taken_from_model(gen, samples: bool) -> list[str]:
    """Which of temperature, top_p and top_k a job's generation settings `gen` take from a model whose
    generation_config samples (`samples`: its do_sample): those the job leaves unset, none where it decodes greedily
    (temperature: 0)."""
    asked = gen.model_fields_set & set(SAMPLING)
    if not samples or ("temperature" in asked and gen.temperature == 0):
        return []
    return [key for key in SAMPLING if key not in asked]


def samples(path: Path) -> bool:
    """Whether the model folder's generation_config.json says do_sample, as GenerationConfig.from_pretrained reads it
    (False without the file or the key), without importing transformers: status and plan of a finished job never
    do. A file that is not JSON is False too: loading the model refuses it, naming it."""
    try:
        found = json.loads((Path(path) / "generation_config.json").read_text())
    except (FileNotFoundError, ValueError):
        return False
    return bool(isinstance(found, dict) and found.get("do_sample", False))


def model_sampling(gen, generation_config) -> tuple[object, str | None]:
    """The job's generation settings `gen`, with the model's own sampling where its generation_config samples
    (do_sample) and the job does not decode greedily (temperature: 0): each of temperature, top_p and top_k the job
    leaves unset is the model's, as transformers' generate merges what it is given into the model's
    generation_config. A job that set top_p alone decoded greedily (its temperature's default, 0) where generate
    samples with the model's temperature and top_k, and one that set temperature alone dropped the model's top_p and
    top_k. Also the note saying what came from the model, or None."""
    asked = gen.model_fields_set & set(SAMPLING)
    if not taken_from_model(gen, getattr(generation_config, "do_sample", False)):
        idle = [f"{k} {getattr(gen, k)}" for k in ("top_p", "top_k") if k in asked and getattr(gen, k) not in (1.0, 0)]
        if gen.temperature == 0 and idle:  # generate warns of these, and decodes greedily as here
            greedy = "temperature 0" if "temperature" in asked else "temperature 0, the default"
            return gen, (
                f"generation.{' and '.join(idle)} change nothing: the job decodes greedily ({greedy}); set "
                "generation.temperature above 0 to sample"
            )
        return gen, None
    own = {
        "temperature": generation_config.temperature if generation_config.temperature is not None else 1.0,
        "top_p": generation_config.top_p if generation_config.top_p is not None else 1.0,
        "top_k": generation_config.top_k or 0,
    }
    ours = {k: own[k] for k in taken_from_model(gen, True)}
    said = ", ".join(f"{k} {v}" for k, v in ours.items())
    unset = "which the job does not set" if asked else "the job setting none of generation.temperature, top_p, top_k"
    note = (
        f"sampled with the model's generation_config's {said} (do_sample; seed {gen.seed}), {unset}, as generate "
        "does; generation.temperature: 0 decodes greedily"
    )
    return gen.model_copy(update=ours), note
