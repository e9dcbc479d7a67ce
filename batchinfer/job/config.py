"""The job file: typed, documented, strict. Every field's description is the job-file reference (docs/job-file.md)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal, Union, get_args

import yaml
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from ..constrained.spec import GrammarLimits, response_format
from ..errors import ConfigError, shorten
from ..openai_compat.requests import unicode_problem
from .tasks import TASKS
from .templates import bare_columns, fields_of, template_fields

# Columns every output row gets; user columns (id, keep) must not collide with them.
KEY_COLUMNS = ("source", "row")
TASK_COLUMNS = {name: spec.columns for name, spec in TASKS.items()}
BYTES = TypeAdapter(ByteSize)  # generation.max_memory: 2147483648, 512MB, 4GB, 2GiB


class Section(BaseModel):
    # Numbers are StrictInt and StrictFloat: YAML's `true` (or `--set generation.seed=true`) is no seed 1.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data):
        """A lone surrogate (\\ud800 in YAML or JSON) reaches no tokenizer: a stop string holding one never
        matches, a label holding one is never scored."""
        if isinstance(data, dict) and (problem := unicode_problem(data)):
            raise ValueError(problem)
        return data


class InputConfig(Section):
    path: str = Field(
        description="A file, a folder or a glob of shards: .parquet, .jsonl, .csv, .tsv (JSONL and CSV also .gz), or "
        "a folder saved by `datasets.Dataset.save_to_disk` (pip install 'batchinfer[hf]'). Relative paths are "
        "taken from the current directory. "
        "A folder is read with every folder below it, leaving out names that start with _ or . (_SUCCESS, "
        ".hidden, _errors/, as Spark and pyarrow do). URLs too: "
        "s3://bucket/reviews/, gs://bucket/reviews/*.parquet, or any fsspec URL. A link is a shard named by its own "
        "path (and its own extension, so a Hugging Face hub snapshot folder works as it is), read through; a link "
        "to a folder is read as that folder, unless it leads back to a folder it lies in, and refused where the "
        "folder is listed under its own name too (its rows would be read twice)."
    )
    text: str | None = Field(
        default=None,
        description='The text to run: a column of text, or a template over columns such as "{title}. {body}" '
        "(a template also writes numbers, booleans and dates as text). Write {{ and }} for literal braces. "
        "Give text or messages.",
    )
    messages: str | None = Field(
        default=None,
        description="task generate: a column of chat messages ([{role, content}, ...]; a content may be OpenAI's "
        "list of text parts, joined with newlines), formatted with the tokenizer's chat template. Give text or "
        "messages.",
    )
    id: str | None = Field(
        default=None,
        description="Optional id column copied to the output. Every row also gets the stable key (source, row).",
    )
    keep: Union[list[str], dict[str, str]] = Field(
        default_factory=list,
        description="Columns copied unchanged to the output: a list, or a mapping {input column: output name} "
        "to rename one that clashes with a result column, e.g. {label: gold_label}.",
    )
    on_bad_shard: Literal["fail", "skip"] = Field(
        default="fail",
        description="A shard that cannot be read (truncated, corrupt, another schema): fail names it and stops; "
        "skip leaves it out, lists it in _report.json and _errors/ (reason bad_shard) and goes on.",
    )
    format: Literal["auto", "parquet", "jsonl", "csv", "hf", "openai"] = Field(
        default="auto",
        description="Shard format; auto decides by file extension (.parquet, .jsonl, .ndjson, .csv, .tsv, each also "
        ".gz but Parquet; a folder with dataset_info.json is hf). csv: comma-separated with a header line (tab for "
        ".tsv names). openai: "
        "OpenAI Batch API request lines {custom_id, method, url, body}; text, messages and id then come from them.",
    )
    text_pair: str | None = Field(
        default=None,
        description="task score: the second text of each pair (a column or a template), e.g. the document a "
        "query in input.text is scored against. A row missing either side goes to _errors/.",
    )
    max_line_bytes: StrictInt = Field(
        default=8 << 20,
        ge=1024,
        description="JSONL: the longest line read, in bytes. A longer line is skipped without being read whole and "
        "goes to _errors/ as too_long; raise this for records with very long texts.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="For s3:// and gs:// paths: arguments of pyarrow.fs.S3FileSystem or GcsFileSystem (e.g. "
        "{endpoint_override: http://127.0.0.1:9000, region: eu-west-1}); for other URLs, of the fsspec filesystem. "
        "Empty: credentials and endpoint from the standard environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
        "AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS, ...), which keeps secrets out of job files.",
    )

    @field_validator("path")
    @classmethod
    def _path_named(cls, value: str) -> str:
        return named(value, "a file, a folder or a glob of shards")

    @field_validator("keep", mode="before")  # before: one line naming the key, not one per type of the union
    @classmethod
    def _keep_shape(cls, value):
        columns = [*value, *value.values()] if isinstance(value, dict) else value
        if isinstance(columns, list) and all(isinstance(column, str) for column in columns):
            return value
        named = value.strip("[]{} ") if isinstance(value, str) else ""  # '[label' from a --set missing its ]
        example = f"[{named}]" if named else "[label]"
        raise ValueError(
            f"write a list of columns such as {example}, or a mapping {{column: output name}} such as "
            "{label: gold_label}"
        )

    @field_validator("text", "text_pair")
    @classmethod
    def _template_parses(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must name a column or be a template such as '{title}. {body}'")
        if value is not None:
            template_fields(value)
        return value

    @model_validator(mode="after")
    def _text_or_messages(self) -> "InputConfig":
        if self.format == "openai":
            if self.text is not None or self.messages is not None or self.id is not None:
                raise ValueError("with format openai, text, messages and id come from the request lines; remove them")
        elif (self.text is None) == (self.messages is None):
            raise ValueError("give either text (a column or template) or messages (a column of chat messages)")
        return self

    @property
    def text_columns(self) -> list[str]:
        """Columns whose values must be strings."""
        specs = [t for t in (self.text, self.text_pair) if t is not None]
        return fields_of(specs)

    @property
    def templated_columns(self) -> list[str]:
        """Text columns used only inside templates, where numbers and booleans are written as text."""
        specs = [t for t in (self.text, self.text_pair) if t is not None]
        bare = bare_columns(specs)
        return [c for c in self.text_columns if c not in bare]

    @property
    def id_column(self) -> str | None:
        return "custom_id" if self.format == "openai" else self.id

    @property
    def columns(self) -> list[str]:
        """Every input column the job names, in a stable order (an OpenAI source reads its request columns too)."""
        if self.format == "openai":
            return list(self.kept)
        source = self.text_columns or [self.messages]
        wanted = source + ([self.id] if self.id else []) + list(self.kept)
        return list(dict.fromkeys(wanted))

    @property
    def kept(self) -> dict[str, str]:
        """Kept columns as {input name: output name}; OpenAI requests keep their url."""
        kept = dict(self.keep) if isinstance(self.keep, dict) else {name: name for name in self.keep}
        return {"url": "url", **kept} if self.format == "openai" else kept


class ModelConfig(Section):
    path: str = Field(
        description="A local model folder (relative paths start at the current directory), pkg:<module> for a "
        "model shipped inside an installed Python package (the package's get_model_path(), or its model/ folder), "
        "or hf:<namespace/name> for a Hugging Face hub model, downloaded once to the hub's cache: the only form "
        "that reaches the network. A folder that is not there is an error, never a download."
    )
    task: Literal[tuple(TASKS)] = Field(  # type: ignore[valid-type]
        description=" ".join(f"{name}: {spec.summary}." for name, spec in TASKS.items())
    )
    labels: list[str] = Field(
        default_factory=list,
        description="task zero-shot: the candidate labels, e.g. [billing, shipping, refund]; every row is scored "
        "against each. task classify with a causal LM: the labels scored by their likelihood after each row's "
        "prompt (label scoring, see the Tasks page), written as the label would follow the prompt.",
    )
    label_norm: Literal["none", "tokens", "chars"] = Field(
        default="none",
        description="task classify with model.labels: none: a label's score is the sum of its tokens' "
        "log-probabilities (lm-evaluation-harness's acc); tokens: that sum divided by its token count; chars: "
        "divided by its length in characters (lm-evaluation-harness's acc_norm). Longer labels lose less this way.",
    )
    label_prompt: Literal["shared", "repeated"] = Field(
        default="shared",
        description="task classify with model.labels: shared: a row's prompt runs once and all its labels attend "
        "to it through one attention mask; repeated: one sequence per label with the prompt repeated (the naive "
        "baseline, for benchmarks). Both give the same scores.",
    )
    hypothesis_template: str = Field(
        default="This example is {}.",
        description="task zero-shot: the hypothesis each label is put in, {} standing for the label (as "
        "transformers' zero-shot pipeline).",
    )
    multi_label: bool = Field(
        default=False,
        description="task zero-shot: false: the labels' scores sum to 1 (one label per row); true: each label is "
        "scored on its own (entailment against contradiction).",
    )
    max_length: StrictInt = Field(default=256, ge=2, description="Tokens per row, special tokens included.")
    truncation: Union[bool, Literal["error"]] = Field(
        default=True,
        description="true: cut rows longer than max_length and flag them in the `truncated` column. "
        "error: send them to _errors/ with reason too_long instead (always with input.format openai, whose "
        "response lines cannot flag a cut; serve's OpenAI routes answer such a text with a 400 as well).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="auto: on a GPU bfloat16 where it is supported, else float16; on a CPU with the OpenVINO "
        "backend bfloat16 where the CPU runs it natively (avx512_bf16 or AMX), checked once per job against "
        "float32 on a sample of rows (embeddings cosine >= 0.9999, labels equal; float32 when the check fails), "
        "else float32; torch on a CPU: float32. The choice is recorded in the output folder.",
    )
    backend: Literal["auto", "torch", "openvino"] = Field(
        default="auto",
        description="The kernels that run an encoder task (every task but generate). openvino: the model "
        'converted once with OpenVINO (CPU; pip install -e ".[cpu]"), cached per model under '
        "$BATCHINFER_CACHE (default ~/.cache/batchinfer). torch: transformers on torch (CPU or GPU; the only "
        "one for batching.strategy: packed and model.quantize). auto: on a CPU with openvino installed, the "
        "probe measures both on the first chunk and keeps the faster (openvino unless torch is clearly "
        "faster; where one ran the model at 1.1x the other's speed or more on this CPU before, only that one is "
        "loaded); torch elsewhere. The choice is recorded in the output folder and reused on resume.",
    )
    device: str = Field(default="auto", description="auto (a GPU when there is one), cpu, cuda or cuda:N.")
    quantize: Literal["none", "int8"] = Field(
        default="none",
        description="int8: dynamic int8 quantization of the linear layers, CPU only: about 1.5x faster on CPUs with "
        "VNNI, but lossy (MiniLM embeddings: cosine to fp32 0.971 mean, 0.83 worst). Measure before you use it.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Run Python code shipped with the model. Only for models you trust."
    )
    allow_pickle: bool = Field(
        default=False,
        description="Load pickle weights (pytorch_model.bin) when a model has no safetensors. Unpickling can run "
        "code: only for models you trust.",
    )
    chat_template: str | None = Field(
        default=None,
        description="task generate (or classify with model.labels): the chat template that formats chat messages "
        "(input.messages, OpenAI /v1/chat/completions requests) in place of the tokenizer's own. A base model has "
        "none, and its chat requests are refused (error rows with reason bad_request) until this is set. A Jinja "
        "template inline, such as '{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:', "
        "or the path of a file holding one (relative to the current directory). Its text is part of the job's "
        "fingerprint: a changed template is a changed job.",
    )

    chat: bool = Field(
        default=True,
        description="task generate, or classify with model.labels, on input.text: each row's text goes to the model "
        "as the user's message of a chat, through the chat template (model.chat_template, else the tokenizer's), "
        "as an instruct model was trained to read it; a model without a chat template gets the text as written. "
        "false: the text as written, with the tokenizer's special tokens, whatever the model (a base model's "
        "completion prompt, a prompt you formatted yourself).",
    )
    system_prompt: str | None = Field(
        default=None,
        description="With model.chat, on a model with a chat template: a system message before each row's user "
        "message, e.g. 'You summarize text messages in one sentence.' A model without a chat template (nor "
        "model.chat_template) refuses it before the job starts. Part of the job's fingerprint.",
    )

    @field_validator("chat_template")
    @classmethod
    def _chat_template_given(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("empty; give a Jinja template, or the path of a .jinja file")
        return value

    @field_validator("truncation")
    @classmethod
    def _truncation_value(cls, value):
        if value is False:
            raise ValueError("write true (cut and flag long rows) or error (send them to _errors/)")
        return value

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", value):
            raise ValueError(f"'{value}' is not a device; write auto, cpu, cuda or cuda:N")
        return value


class BatchingConfig(Section):
    max_tokens: Union[StrictInt, Literal["auto"]] = Field(
        default="auto",
        description="Tokens per batch: rows x longest row when padded, real tokens when packed. auto: a short probe "
        "on the first chunk's rows times candidate sizes and keeps the fastest (CPU) or the largest that fits in "
        "memory (GPU); the choice is recorded in the output folder and reused on resume.",
    )
    strategy: Literal["auto", "padded", "packed"] = Field(
        default="auto",
        description="padded: rows padded to the longest in their batch. packed: rows laid end to end, so linear "
        "layers compute no padding (encoders whose attention goes through transformers' attention interface, "
        "such as BERT). auto: the faster of the two on this machine, measured by the same probe.",
    )
    max_rows: StrictInt = Field(default=256, ge=1, description="Rows per batch, whatever their length.")
    chunk_rows: Union[StrictInt, Literal["auto"]] = Field(
        default="auto",
        description="Rows per chunk: the unit of sorting, checkpointing and output files. Larger chunks sort "
        "better; smaller ones lose less work to a crash or Ctrl-C. auto: 4096, or 256 for generate, whose rows "
        "take far longer. Changing it means starting over.",
    )

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens_value(cls, value):
        return count_or_auto(value, "tokens such as 8192")

    @field_validator("chunk_rows", mode="before")
    @classmethod
    def _chunk_rows_value(cls, value):
        return count_or_auto(value, "rows such as 4096")


GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a smaller temperature is decoded greedily
TOP_P_LEAST = 1.1754943508222875e-38  # float32's smallest normal number (numpy.finfo(numpy.float32).tiny)


class GenerationConfig(Section):
    engine: Literal["auto", "transformers", "openvino", "static", "vllm"] = Field(
        default="auto",
        description="auto: on a CPU openvino where openvino-genai is installed and the model converts, else "
        "transformers; on a GPU vllm where installed, else transformers or static, whichever generates faster on "
        "the job's first rows (recorded in the output folder); the report's engine entry says which, and why. "
        "openvino: OpenVINO GenAI's continuous "
        "batching on the CPU (paged attention, prefix caching), the model converted once per model identity "
        "and cached under $BATCHINFER_CACHE; f32, or bf16 with a u8 KV cache where the CPU runs bf16 and "
        "model.dtype is auto, after it agreed with f32 on the job's first rows (model.dtype: float32 keeps "
        "f32); constrained rows run on transformers' engine. transformers: continuous batching with a paged KV "
        "cache (CPU and GPU). vllm: vllm.LLM on a GPU (pip install batchinfer[vllm]). static: padded "
        "model.generate batches in input order, a baseline.",
    )
    max_new_tokens: StrictInt = Field(default=256, ge=1, le=(1 << 63) - 1, description="Most tokens generated per row.")
    max_new_tokens_column: str | None = Field(
        default=None,
        description="A column whose whole-number value overrides max_new_tokens for its row (empty or blank: the "
        "default; 12, '12' and '12.0' are 12; anything else: the row goes to _errors/ as bad_max_new_tokens). "
        "Prompt plus completion never run past "
        "the model's context.",
    )
    temperature: StrictFloat = Field(
        default=0.0,
        ge=0.0,
        allow_inf_nan=False,
        description=f"0 is greedy decoding; above 0 samples (below {GREEDY_BELOW:g}: greedy, as vLLM reads it).",
    )
    top_p: StrictFloat = Field(
        default=1.0,
        gt=0.0,
        allow_inf_nan=False,
        le=1.0,
        description="Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p.",
    )
    top_k: StrictInt = Field(default=0, ge=0, description="Sample among the k likeliest tokens; 0 means no limit.")
    seed: StrictInt = Field(
        default=0,
        ge=0,
        le=(1 << 63) - 1,  # what every engine takes (openai_compat/requests.py SEED): OpenVINO's is unsigned
        description="Seed of the sampler, for repeatable sampling: a whole number from 0 to 2**63-1.",
    )
    stop: list[str] = Field(
        default_factory=list,
        description='Strings that end a completion, e.g. ["\\n\\n"]; '
        "the text is cut before them and finish_reason is stop.",
    )
    response_format: dict[str, Any] | None = Field(
        default=None,
        description="Constrained output, as OpenAI's response_format: {type: json_object} (a JSON object), or "
        "{type: json_schema, json_schema: {name: ..., schema: {...}}} (JSON that follows the schema). Every "
        "completion is then complete and valid, or its row goes to _errors/ (reason length when max_new_tokens "
        "cut it). Needs xgrammar (pip install 'batchinfer[llm]'); vllm uses its structured outputs.",
    )
    choices: list[str] | None = Field(
        default=None,
        description="Constrained output: the completion is exactly one of these strings, e.g. [ham, spam] "
        "(null: none; --set generation.choices=null clears a job file's). "
        "(To score every choice instead of generating one, see model.labels with model.task: classify.)",
    )
    regex: str | None = Field(
        default=None,
        description="Constrained output: the completion matches this regular expression whole, e.g. "
        "'\\d{4}-\\d{2}-\\d{2}'.",
    )
    grammar_seconds: StrictFloat = Field(
        default=10.0,
        gt=0,
        description="Constrained output: the longest xgrammar may take to compile one constraint (a schema, choices "
        "or a regex; each distinct one is compiled once). Past it the constraint is refused as too slow: the job "
        "stops before it starts, an OpenAI Batch request is a bad_request error line, serve answers 400.",
    )
    grammar_max_bytes: StrictInt = Field(
        default=256 << 10,
        ge=1,
        description="Constrained output: the largest constraint, in bytes of its text (the schema or choices as "
        "JSON, the regex); a larger one is refused at once, as one that compiles too slowly is.",
    )
    grammar_max_depth: StrictInt = Field(
        default=64,
        ge=1,
        description="Constrained output: how deep a JSON schema may nest (its objects and lists); compile time grows "
        "fast with depth (400 levels of objects took 22 s), so a deeper one is refused at once.",
    )
    grammar_max_choices: StrictInt = Field(
        default=5000,
        ge=1,
        description="Constrained output: the most values a constraint may choose between (choices, or a schema's "
        "enum values together); compile time and memory grow fast with them (20,000: 80 s and 100 MB), so more are "
        "refused at once.",
    )
    max_memory: Union[Literal["auto"], ByteSize] = Field(
        default="auto",
        description="engines transformers and openvino: the most memory the KV cache may take, in bytes or as "
        "512MB, 4GB, 2GiB. The cache is sized for the job (batching.max_rows prompts in flight, each prompt plus "
        "max_new_tokens), up to this. auto: a quarter of the free memory on CPU, half the free GPU memory on a GPU "
        "(engine openvino: its cache grows as the rows in flight need).",
    )
    engine_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Passed to the engine: for transformers, ContinuousBatchingConfig fields such as num_blocks, "
        "page_size (32 here: rows' shared prefix is reused in whole pages), allow_block_sharing (false: no prefix "
        "reuse), max_batch_tokens, max_requests_per_batch; for openvino, openvino_genai.SchedulerConfig fields "
        "(max_num_batched_tokens, tokens a step; cache_size in GB; enable_prefix_caching; max_num_seqs, only with "
        "dynamic_split_fuse: false) and OpenVINO properties "
        "in upper case (KV_CACHE_PRECISION); for vllm, vllm.LLM arguments (enable_prefix_caching is on).",
    )

    @property
    def grammar_limits(self) -> GrammarLimits:
        return GrammarLimits(
            self.grammar_seconds, self.grammar_max_bytes, self.grammar_max_depth, self.grammar_max_choices
        )

    @field_validator("temperature")
    @classmethod
    def _greedy_when_tiny(cls, value: float) -> float:
        # logits divided by a temperature as small as 1e-40 overflow float32: NaN probabilities, and the
        # engine's pick is then the vocabulary's last token, every step
        return 0.0 if value < GREEDY_BELOW else value

    @field_validator("top_p")
    @classmethod
    def _float32_top_p(cls, value: float) -> float:
        # engines read top_p as a float32, where 1e-300 is 0 (OpenVINO GenAI then refuses the whole pass); any
        # top_p this small keeps the likeliest token alone, as float32's smallest normal number does
        return max(value, TOP_P_LEAST)

    @field_validator("choices")
    @classmethod
    def _some_choice(cls, value: list[str] | None) -> list[str] | None:
        if value == []:  # given and empty: the completion ran unconstrained, as if the key were not there
            raise ValueError("is empty: list the strings the completion may be, e.g. [ham, spam], or remove it")
        return value

    @field_validator("stop")
    @classmethod
    def _stops_named(cls, value: list[str]) -> list[str]:
        if any(not stop for stop in value):  # an empty stop string was left out without a word
            raise ValueError("holds an empty string, which ends nothing: remove it")
        return value

    @field_validator("response_format")
    @classmethod
    def _response_format_shape(cls, value):
        problem = response_format(value, "response_format")[1]
        if problem:
            raise ValueError(problem.removeprefix("response_format").lstrip(". ") or problem)
        return value

    @model_validator(mode="after")
    def _one_constraint(self) -> "GenerationConfig":
        asked = [k for k in ("response_format", "choices", "regex") if getattr(self, k)]
        if len(asked) > 1:
            raise ValueError(f"generation: give one of response_format, choices and regex, not {' and '.join(asked)}")
        if self.choices and (len(set(self.choices)) < len(self.choices) or any(not c for c in self.choices)):
            raise ValueError(f"generation.choices: each choice once and not empty (got {shorten(self.choices)})")
        if self.regex == "":
            raise ValueError("generation.regex: empty; give a pattern such as '(yes|no)'")
        if asked and self.stop:
            raise ValueError(
                f"generation.stop: a stop string could cut the {asked[0]} output short; remove stop (the "
                "constrained output ends where it is complete)"
            )
        return self

    @field_validator("max_memory", mode="before")  # before: one line naming the key, not one per type tried
    @classmethod
    def _memory_size(cls, value):
        if value == "auto":
            return value
        try:  # pydantic's ByteSize reads the units: 512MB and 4GB in powers of 1000, 2GiB in powers of 1024
            size = BYTES.validate_python(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else 0
        except ValidationError:
            size = 0
        if size > 0:
            return size
        raise ValueError("write a size such as 2GB, 512MB or 2147483648 (bytes), or auto")


class OutputConfig(Section):
    path: str = Field(
        description="The output folder, local or a URL such as s3://bucket/out/: part files, _errors/, "
        "_done/ (completion markers), _batchinfer.json (the job), _report.json. It must be empty, new, "
        "or this job's."
    )

    @field_validator("path")
    @classmethod
    def _path_named(cls, value: str) -> str:
        return named(value, "the output folder")

    scores: bool = Field(
        default=False,
        description="classify: add `scores`, every class probability. score: add "
        "`scores`, every output of a multi-output head (after the activation).",
    )
    aggregation: Literal["none", "simple", "first", "average", "max"] = Field(
        default="simple",
        description="task token-classify: how tokens become entities, as transformers' token-classification "
        "pipeline's aggregation_strategy: none (every token), simple (B-/I- tags grouped), first, average, max "
        "(a word's tokens agree on its label by their first, mean or highest scores).",
    )
    format: Literal["parquet", "jsonl", "openai"] = Field(
        default="parquet",
        description="parquet: part files of result columns. jsonl: the same, and when the job is complete "
        "_results.jsonl in the output folder holds every result row as a JSON line, in input order (the _ keeps "
        "Parquet readers of the folder off it). openai: OpenAI "
        "Batch API response lines; when the job is complete, output.jsonl and errors.jsonl hold them all.",
    )
    compression: Literal["zstd", "snappy", "gzip", "none"] = Field(
        default="zstd", description="Parquet compression codec of the part files."
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="For an s3:// or gs:// output.path: as input.storage_options. Empty: the standard environment.",
    )


class RuntimeConfig(Section):
    executor: Literal["local", "ray"] = Field(
        default="local",
        description="local: this process, reading the next chunk while the model runs. ray: one long-lived worker "
        "(a Ray actor holding the model) per GPU or CPU slot, fed chunks by this process, which alone commits them "
        '(pip install -e ".[ray]").',
    )
    workers: Union[StrictInt, Literal["auto"]] = Field(
        default="auto",
        description="executor ray: how many workers. auto: as many as the cluster's nodes hold, one per "
        "gpus_per_worker GPUs on a cluster with GPUs, else one per cpus_per_worker CPUs.",
    )
    gpus_per_worker: StrictFloat = Field(
        default=1.0, ge=0, description="executor ray: GPUs each worker holds when the cluster has GPUs (0 on CPUs)."
    )
    cpus_per_worker: StrictFloat = Field(
        default=1.0, gt=0, description="executor ray: CPU cores each worker holds; its torch threads follow."
    )
    ray_address: str | None = Field(
        default=None,
        description="executor ray: the cluster to join, e.g. ray://head:10001. Default: the running cluster "
        "(RAY_ADDRESS, or one started with `ray start`), else a local one started for the job.",
    )

    @field_validator("workers", mode="before")
    @classmethod
    def _workers_value(cls, value):
        return count_or_auto(value, "workers such as 2")


class ServeConfig(Section):
    model_name: str | None = Field(
        default=None,
        description="batchinfer serve: the model id clients send and the server names (/v1/models, each answer's "
        "model). Default: the model folder's name, a hub model's id (namespace/name), or pkg:<module> as written. "
        "Requests may also name the "
        "model by its model.path or by one of serve.model_aliases; a request naming another model is answered 404 "
        "(OpenAI's model_not_found), and one naming no model is answered by this one.",
    )
    model_aliases: list[str] = Field(
        default_factory=list,
        description="batchinfer serve: other model ids requests may send for this model, e.g. [gpt-4o-mini] for "
        "clients written for another service; GET /v1/models/{alias} finds it, and /v1/models lists the served name "
        "alone.",
    )

    @field_validator("model_name")
    @classmethod
    def _name_named(cls, value: str | None) -> str | None:
        return value if value is None else named(value, "the model id, or leave the key out for the default")

    max_wait_ms: StrictFloat = Field(
        default=5.0,
        ge=0,
        description="batchinfer serve: how long the oldest queued row may wait for others to fill a batch. A batch "
        "runs once its rows reach batching.max_tokens or the oldest has waited this long; 0 runs whatever is queued.",
    )
    p99_ms: StrictFloat | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,  # .inf is no target: leave the key out
        description="batchinfer serve: a latency target, in milliseconds, for the 99th percentile of admitted "
        "requests: for embed, classify and score the whole request, for generate the time to its first token. The "
        "server sizes each batch (tokens, rows) and its wait (at most max_wait_ms) from the latencies it measures, "
        "and answers a request predicted to be answered later than this 429 at once, with Retry-After, instead of "
        "queueing it. Pick about 3x the latency of a lone request (docs/serve.md). Default: none, the fixed window "
        "(batching.max_tokens, max_wait_ms).",
    )
    max_queue_tokens: StrictInt = Field(
        default=262144,
        ge=1,
        description="batchinfer serve: tokens that may be queued or running, for every task. An encoder request "
        "holds its texts' tokens until they are answered; a generation request holds its prompt tokens plus the most "
        "it may generate (max_tokens, else generation.max_new_tokens) until its last answer is out. A request that "
        "can never fit is answered 413 (split it); one that does not fit beside what is held now, 429 with "
        "Retry-After, never queued without bound. Until a request is tokenized, each of its texts counts as its "
        "characters (at most model.max_length tokens).",
    )
    max_body_bytes: StrictInt = Field(
        default=4 << 20,
        ge=1,
        description="batchinfer serve: the largest request body, in bytes (4 MiB). A larger one is answered 413 before "
        "it is read whole or parsed, whether it gives its Content-Length or comes chunked.",
    )
    read_timeout_s: StrictFloat = Field(
        default=30.0,
        gt=0,
        description="batchinfer serve: the longest a request body may pause, in seconds: a body of which nothing more "
        "comes for this long (a chunked body that never ends) is answered 408 and its connection closed, so that it "
        "holds nothing and a stopping server waits for it no longer than this. A body that goes on coming is bounded "
        "by max_body_bytes.",
    )


class JobConfig(Section):
    input: InputConfig = Field(description="Where the rows come from.")
    model: ModelConfig = Field(description="Which model runs, and how.")
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="How rows are grouped.")
    generation: GenerationConfig = Field(
        default_factory=GenerationConfig, description="task generate: decoding settings and the engine."
    )
    output: OutputConfig = Field(description="Where results go.")
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig,
        description="Who runs the chunks: this process or a Ray cluster. Results do not depend on it.",
    )
    serve: ServeConfig = Field(
        default_factory=ServeConfig,
        description="batchinfer serve: how online requests are batched (the server takes model, batching, "
        "generation and this section from a job file).",
    )

    @property
    def columns(self) -> list[str]:
        """Every input column the job names (an OpenAI source adds the request columns it reads)."""
        extra = [self.max_new_tokens_column] if self.max_new_tokens_column else []
        return list(dict.fromkeys(self.input.columns + extra))

    @property
    def chunk_rows(self) -> int:
        """batching.chunk_rows, with auto settled for the task."""
        if self.batching.chunk_rows != "auto":
            return self.batching.chunk_rows
        return 256 if self.model.task == "generate" else 4096

    @property
    def max_new_tokens_column(self) -> str | None:
        return "max_tokens" if self.input.format == "openai" else self.generation.max_new_tokens_column

    @model_validator(mode="after")
    def _consistent(self) -> "JobConfig":
        self._fits_the_task()
        self._fits_the_model_fields()
        self._no_column_clash()
        if self.input.format == "openai" and self.model.truncation is True:
            raise ValueError(
                "model.truncation: true would answer a cut prompt, and an OpenAI response line cannot say so; remove "
                "it (input.format openai sends longer requests to the errors file), or raise model.max_length"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _openai_inputs_whole(cls, data):
        """An OpenAI response line cannot say that its prompt was cut (a run's `truncated` column does): with
        input.format openai, model.truncation is error unless set, and requests longer than model.max_length
        become too_long error lines, as OpenAI's own Batch API refuses them."""
        if not isinstance(data, dict):
            return data
        source, model = data.get("input"), data.get("model")
        openai = (source.get("format") if isinstance(source, dict) else getattr(source, "format", None)) == "openai"
        if openai and isinstance(model, dict) and "truncation" not in model:
            return {**data, "model": {**model, "truncation": "error"}}
        if openai and isinstance(model, ModelConfig) and "truncation" not in model.model_fields_set:
            return {**data, "model": model.model_copy(update={"truncation": "error"})}
        return data

    def _fits_the_task(self) -> None:
        """Every section and key the job sets is one its task reads."""
        if self.input.messages and self.model.task != "generate":
            raise ValueError("input.messages: chat messages are for model.task: generate; use input.text")
        if self.model.task != "generate" and "generation" in self.model_fields_set:
            raise ValueError("generation: only for model.task: generate; remove the section")
        pairs = TASKS[self.model.task].pairs
        if pairs != (self.input.text_pair is not None):
            raise ValueError(
                f"input.text_pair: task {self.model.task} scores pairs: give input.text and input.text_pair"
                if pairs
                else "input.text_pair: only for tasks on pairs (model.task: score); remove it"
            )
        if self.model.task == "zero-shot" and not self.model.labels:
            raise ValueError("model.labels: task zero-shot needs the candidate labels, e.g. labels: [billing, refund]")
        if self.model.labels and self.model.task not in ("zero-shot", "classify"):
            raise ValueError(
                "model.labels: only for model.task zero-shot (an NLI model) or classify (a causal LM); remove it"
            )
        if self.model.chat_template is not None and not (
            self.model.task == "generate" or (self.model.task == "classify" and self.model.labels)
        ):
            raise ValueError(
                "model.chat_template: only for model.task generate, or classify with model.labels; remove it"
            )
        chat_keys = {"chat", "system_prompt"} & self.model.model_fields_set
        if chat_keys and not (
            self.input.text and (self.model.task == "generate" or (self.model.task == "classify" and self.model.labels))
        ):
            raise ValueError(
                f"model.{sorted(chat_keys)[0]}: only for input.text with model.task generate, or classify with "
                "model.labels (input.messages are a chat already); remove it"
            )
        if self.model.system_prompt is not None and not self.model.chat:
            raise ValueError("model.system_prompt: only with model.chat: true (the default); remove one of them")
        for key in ("label_norm", "label_prompt"):
            if key in self.model.model_fields_set and not (self.model.task == "classify" and self.model.labels):
                raise ValueError(f"model.{key}: only for model.task: classify with model.labels; remove it")

    def _fits_the_model_fields(self) -> None:
        """Labels, scores and the hypothesis template are usable as written."""
        labels = self.model.labels
        if any(not label.strip() for label in labels) or len(set(labels)) < len(labels):
            raise ValueError(
                f"model.labels: each label once and with text (got {shorten(labels)}); "
                "scores and the chosen label would be ambiguous"
            )
        if self.output.scores and self.model.task not in ("classify", "score"):
            raise ValueError(
                f"output.scores: only for model.task classify or score, not {self.model.task}"
                + ("; zero-shot always writes scores" if self.model.task == "zero-shot" else "")
                + "; remove it"
            )
        try:
            self.model.hypothesis_template.format("label")
            placed = "{}" in self.model.hypothesis_template
        except (KeyError, IndexError, ValueError):
            placed = False
        if not placed:
            raise ValueError(
                "model.hypothesis_template: write one {} where the label goes and no other braces, "
                "e.g. 'This text is about {}.'"
            )

    def _no_column_clash(self) -> None:
        """The output's format fits the input's, and no kept input column takes a result column's name."""
        if self.output.format == "openai" and self.input.format != "openai":
            raise ValueError("output.format openai writes responses to OpenAI batch requests: set input.format: openai")
        reserved = set(KEY_COLUMNS) | set(TASK_COLUMNS[self.model.task])
        if self.input.format == "openai":
            reserved -= {"text"}  # the request's prompt is read into its own column
        if self.input.id in reserved:  # the id is written under its own name: only another column can be it
            raise ValueError(
                f"input.id: column '{self.input.id}' clashes with a result column of task {self.model.task} "
                f"({', '.join(sorted(reserved))}); leave input.id out and keep the column under another name: "
                f"keep: {{{self.input.id}: {self.input.id}_in}}"
            )
        for column, name in self.input.kept.items():
            if name in reserved:
                raise ValueError(
                    f"input.keep: column '{column}' would be written as '{name}', a result column of task "
                    f"{self.model.task} ({', '.join(sorted(reserved))}); keep it under another name: keep: "
                    f"{{{column}: {column}_in}}"
                )
        # two columns written under one name: one of them would be lost (the id's own values, too)
        taken = {self.input.id: "input.id"} if self.input.id else {}
        for column, name in self.input.kept.items():
            if name in taken and column != self.input.id:
                raise ValueError(
                    f"input.keep: '{column}' and {taken[name]} would both be written as column '{name}', and one "
                    f"lost; keep '{column}' under another name, e.g. keep: {{{column}: {column}_kept}}"
                )
            taken[name] = f"'{column}'"


def named(value: str, what: str) -> str:
    """A name or path key's value, refused when blank: an empty input.path read the current folder and all
    below it; an empty serve.model_name was left for the default."""
    if not value.strip():
        raise ValueError(f"is empty: name {what}")
    return value


def count_or_auto(value, example: str):
    """A whole number of at least 1, or "auto"."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"write a whole number of {example}, or auto")


# --- loading -------------------------------------------------------------------------------------------------


class UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping, which it keeps the last of: `input: {text:
    text, text: "{text}"}` ran the template and validated ok, the first value lost unseen."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge key's (<<) values may be overridden: YAML says so
            if (key_node.tag, key_node.value) in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"the key {key_node.value!r} is given twice",
                    key_node.start_mark,
                )  # fmt: skip
            seen.add((key_node.tag, key_node.value))
        return super().construct_mapping(node, deep)


def load_job(path: str | Path, overrides: list[str] | None = None) -> JobConfig:
    """Read a job file, apply `--set key=value` overrides, validate. Raises ConfigError with one line per problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"job file {path} {'is a folder' if path.is_dir() else 'does not exist'}",
            "give the path of a YAML job file, e.g. jobs/quickstart.yaml",
        )
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeys)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}", "fix the YAML syntax at the line shown") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text", "save the job file as UTF-8") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must be a mapping with input, model, batching and output sections"
            + (" (it is empty)" if data is None else f" (it holds a {type(data).__name__})"),
            "start from a shipped job such as jobs/quickstart.yaml, or see `batchinfer schema`",
        )
    return validate_with_overrides(data, overrides or [], str(path))


def validate_with_overrides(data: dict, overrides: list[str], origin: str) -> JobConfig:
    """`data` with `--set key=value` overrides applied, validated; a problem with an overridden key is blamed on
    its --set, not on `origin`."""
    return validate_job(data, origin, [apply_override(data, item) for item in overrides])


def apply_override(data: dict, item: str) -> str:
    """Set `a.b.c=value` in a nested dict; the value is parsed as YAML (so 8192 is an int, true a bool).
    Returns the key, `a.b.c`."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r} is not key=value", "write e.g. --set batching.max_tokens=8192")
    parts = key.strip().split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"--set {key}: {'.'.join(parts[: depth + 1])} is not a section",
                f"set {'.'.join(parts[: depth + 1])} itself, e.g. --set {'.'.join(parts[: depth + 1])}=VALUE; "
                "`batchinfer schema` lists every key",
            )
        node = child
    try:
        node[parts[-1]] = yaml.load(raw, Loader=UniqueKeys) if raw.strip() else raw
    except yaml.constructor.ConstructorError as exc:
        if "given twice" not in str(exc.problem):
            node[parts[-1]] = raw  # as any value that is not YAML: the text itself
        else:  # a value that is YAML, with a key lost: never the text itself
            raise ConfigError(f"--set {key}: {exc.problem} in {raw!r}", "give each key once") from None
    except yaml.YAMLError:
        node[parts[-1]] = raw
    return ".".join(parts)


def validate_job(data: dict, origin: str = "job", overridden: list[str] = ()) -> JobConfig:
    """overridden: the keys that --set gave, whose problems name --set."""
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        lines, by_set = [], 0
        for err in exc.errors():
            key = _error_key(err)
            if any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in overridden):
                lines.append(f"--set {format_error(err)}")
                by_set += 1
            else:
                lines.append(format_error(err))
        what = f"--set on {origin} is not valid" if by_set == len(lines) else f"{origin} is not a valid job"
        raise ConfigError(
            f"{what}:\n" + "\n".join(f"  {line}" for line in lines),
            ("fix the --set value; " if by_set else "") + "see `batchinfer schema` or docs/job-file.md",
        ) from None


def _error_key(err: dict) -> str:
    return ".".join(_error_loc(err)) or "job"


def _error_loc(err: dict) -> list[str]:
    return [str(part) for part in err["loc"] if not str(part).startswith(("function-after", "literal"))]


def format_error(err: dict) -> str:
    """One pydantic error as `key: what is wrong; what to write instead`."""
    loc = _error_loc(err)
    key = _error_key(err)
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = list(_section_fields(loc[:-1]))
        close = difflib.get_close_matches(loc[-1], allowed, n=1)
        suggestion = f"did you mean '{close[0]}'? " if close else ""
        return f"{key}: unknown key; {suggestion}valid keys here: {', '.join(allowed)}"
    if kind == "missing":
        return f"{key}: required; {_describe(loc)}"
    message = err["msg"].removeprefix("Value error, ")
    if kind == "value_error" and not loc:
        return message
    got = err.get("input")
    shown = "" if isinstance(got, dict) else f" (got {shorten(got)})"
    if kind == "string_type" and isinstance(got, dict):  # YAML reads an unquoted {title} as a mapping
        shown = '; quote a template in YAML, e.g. text: "{title}. {body}" (or --set \'input.text="{title}"\')'
    return f"{key}: {message}{shown}"


def _section_fields(loc: list[str]) -> dict[str, Any]:
    model: type[BaseModel] = JobConfig
    for part in loc:
        annotation = model.model_fields[part].annotation
        model = next(a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel))
    return model.model_fields


def _describe(loc: list[str]) -> str:
    try:
        field = _section_fields(loc[:-1])[loc[-1]]
    except (KeyError, StopIteration):
        return "add it"
    return field.description or "add it"


def reference_markdown() -> str:
    """The job-file reference (docs/job-file.md), generated from the models so the two cannot drift."""
    out = []
    for section, field in JobConfig.model_fields.items():
        model = field.annotation
        out.append(f"### `{section}` — {field.description}\n")
        out.append("| key | default | meaning |\n|---|---|---|")
        for name, sub in model.model_fields.items():
            default = "required" if sub.is_required() else _yaml_value(sub.get_default(call_default_factory=True))
            out.append(f"| `{section}.{name}` | {default} | {sub.description} |")
        out.append("")
    return "\n".join(out)


def _yaml_value(value: Any) -> str:
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"
