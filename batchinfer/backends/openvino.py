"""The OpenVINO backend: an encoder converted once per model identity with `openvino.convert_model`, cached
on disk, and compiled for the CPU in f32 or bf16.

`OpenVINOBackend` is a Backend (base.py): forward takes a padded Batch and returns the one output a task reads,
the only tensor converted (the logits, the hidden states, or the pooled vectors an embedding model's modules make
inside the graph), as a numpy array. The conversion traces the transformers model on torch, once.

The cache (under cache.cache_root): one folder per key, holding model.xml, model.bin and a manifest written last
with both files' sizes and SHA-256, the backends' measured rates, and OpenVINO's compiled blobs (BLOBS). The
key covers the model identity (weights, config, tokenizer), what is converted and the library versions, so a
changed model never meets an old conversion; an entry whose files do not match its manifest is rebuilt, never
trusted; its files' digests come from the memo (cache.file_digest), so checking an entry reads it only once.
A file lock makes the workers of one machine (Ray actors) convert once between them; a staging folder whose
lock is free was left by a conversion that died, and is removed. A cache that cannot be read or written is a
ModelError naming the folder, and so is a model OpenVINO cannot convert (backend auto then runs torch).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import time
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from ..cache import cache_root, file_digest
from ..errors import ConfigError, ModelError
from ..machine import Load
from .base import Batch
from .precision import COSINE_FLOOR

FORMAT = 2  # bump when what is converted changes (2: no KV cache traced; checked against torch, tokenizer kept)
MANIFEST = "batchinfer.json"
RATES = "backends.json"  # each backend's measured tokens/s for this conversion, per CPU
BLOBS = "compiled"  # OpenVINO's model cache (CACHE_DIR): each precision compiled for this CPU, read back warm
TOKENIZER = "tokenizer.json"  # the tokenizer transformers built for the model (folder.tokenizer_record), for warm runs
# A causal LM for OpenVINO GenAI (openvino_causal.py): the stateful model, the tokenizer pair, its configs.
GENAI_FILES = tuple(f"openvino_{n}.{x}" for n in ("model", "tokenizer", "detokenizer") for x in ("xml", "bin"))
GENAI_FILES += ("config.json", "generation_config.json")
ENTRY_FILES = ("model.xml", "model.bin", *GENAI_FILES, MANIFEST, RATES, BLOBS, TOKENIZER)
STAGING = re.compile(r"\.tmp-([0-9a-f]{24})-[0-9a-f]{8}")  # a conversion being saved: .tmp-<key>-<random>
# One backend measured this many times the other's speed on this CPU before: auto loads the faster alone. The
# probe's own margin (batching.probe.NOISE): closer rates are measured again.
CLEAR_WIN = 1.1
# A kept choice older than this is timed again: drivers, libraries and the machine's neighbours change.
MAX_AGE = 7 * 86400
CHECK_LENGTHS = (3, 11, 29, 64)  # a conversion's check rows: other lengths than the trace's 8, padding among them
# OpenVINO's CPU kernels run small batches as fast as large ones (MiniLM, bf16, 2 cores: 4,096 tokens 15% faster
# than 16,384), and a small budget keeps each batch's activations in cache: its max_tokens where the probe cannot
# measure.
BUDGET = 4096
# What the runner's dtype names mean as OpenVINO's inference precision hint.
PRECISIONS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def available() -> bool:
    return importlib.util.find_spec("openvino") is not None


# The CPU kinds the project runs on, as OpenVINO's CPU plugin lists their capabilities: AVX2-only (an AMD EPYC
# before Zen 4), AVX-512 with avx512_bf16 and no AMX (a Zen 4 EPYC) and AMX (a Sapphire Rapids Xeon);
# `lscpu | grep -o 'avx512_bf16\|amx_bf16'` tells them apart on a machine. Each kind's precision under model.dtype
# auto on OpenVINO's encoders.
CPU_KINDS = {
    "avx2": (("FP32", "INT8", "BIN", "EXPORT_IMPORT"), "f32"),
    "avx512_bf16": (("FP32", "BF16", "INT8", "BIN", "EXPORT_IMPORT"), "bf16"),
    "amx": (("FP32", "BF16", "FP16", "INT8", "BIN", "EXPORT_IMPORT"), "bf16"),
}
# For tests: OpenVINO's capabilities read as those of another CPU kind (a key of CPU_KINDS), in this process and
# every worker it starts, so that the suite runs each kind's path on any machine (docs/architecture.md, "Tests").
STAND_IN = "BATCHINFER_STAND_IN_CPU"


def bf16_supported() -> bool:
    """Whether this CPU runs bf16 matrix work natively (avx512_bf16 or AMX), as OpenVINO reports it.

    BATCHINFER_NO_BF16=1 answers no on any CPU, so a bf16 machine takes (and tests) the path of CPUs without it."""
    return not bf16_turned_off() and "BF16" in _cpu_capabilities()


def _cpu_capabilities() -> tuple[str, ...]:
    kind = os.environ.get(STAND_IN, "").strip()
    if not kind:
        return _native_capabilities()
    if kind not in CPU_KINDS:
        raise ConfigError(f"{STAND_IN}={kind} is no CPU kind", f"use one of {', '.join(CPU_KINDS)}, or unset it")
    return CPU_KINDS[kind][0]


@functools.cache
def _native_capabilities() -> tuple[str, ...]:
    import openvino as ov

    return tuple(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def emulates_bf16() -> bool:
    """Whether bf16 here is a stand-in's: OpenVINO compiles a bf16 hint to f32 on a CPU without native bf16, so
    forward rounds its outputs to bf16 instead, and a result that assumes f32 fails here as on a real bf16 CPU."""
    return "BF16" not in _native_capabilities() and bool(os.environ.get(STAND_IN, "").strip())


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def bf16_turned_off() -> bool:
    return os.environ.get("BATCHINFER_NO_BF16", "").strip() not in ("", "0")


@dataclass(frozen=True)
class Device:
    """torch.device("cpu") as far as a run on OpenVINO asks of it (its type, its name), without torch."""

    type: str = "cpu"

    def __str__(self) -> str:
        return self.type


class OpenVINOBackend:
    """A compiled OpenVINO model as a Backend (base.py): numpy in, numpy out, in one of the compiled precisions
    (`use`), padded batches only. forward returns the one output converted (the task's logits, hidden states or
    pooled vectors), so a runner whose head reads numpy runs without torch."""

    name, reference, default_budget = "openvino", False, BUDGET
    packing_problem = "OpenVINO runs padded batches only"
    device = Device()

    def __init__(self, config, compiled: dict, output: str, names: tuple[str, ...], seconds: dict, entry: Path):
        self.config, self.entry = config, entry
        self.compiled = compiled  # precision ("f32", "bf16") -> openvino.CompiledModel
        self.requests = {p: c.create_infer_request() for p, c in compiled.items()}
        self.output, self.names = output, names
        self.precision = next(iter(compiled))
        self.seconds = seconds  # convert / read / compile times, for the report's start-up figures
        self.check: dict | None = None  # the conversion checked against torch when it was made (_check)
        self.emulated = "bf16" in compiled and emulates_bf16()  # a stand-in's bf16: outputs rounded (forward)

    @property
    def precisions(self) -> list[str]:
        return list(self.compiled)

    @property
    def f32(self) -> bool:
        return "f32" in self.compiled

    def forward(self, batch: Batch) -> np.ndarray:
        """The converted output for a padded batch: [b, ...]."""
        if batch.packed:
            raise ValueError(f"a packed batch reached OpenVINO: {self.packing_problem}")
        # Token type ids go in only where the graph takes them (see backends._input_names).
        inputs = batch.inputs()
        request = self.requests[self.precision]
        request.infer({name: inputs[name] for name in self.names})
        # The request's output buffer is reused by the next call: copy it out.
        out = request.get_output_tensor(0).data.copy()
        return to_bf16(out) if self.emulated and self.precision == "bf16" else out

    def use(self, precision: str | None) -> None:
        """Run the next calls in `precision` (one compiled; None: the first)."""
        self.precision = precision or next(iter(self.compiled))

    def keep(self, precision: str | None) -> None:
        """Use `precision` from now on and free the others."""
        self.use(precision)
        self.compiled = {self.precision: self.compiled[self.precision]}
        self.requests = {self.precision: self.requests[self.precision]}

    def remember(self, rates: dict[str, float], load: dict | None) -> None:
        remember(self.entry, rates, load)

    def best_rates(self) -> dict[str, float]:
        return (_kept(self.entry, RATES) or {}).get(cpu_id(), {}).get("best", {})


def conversion(identity: str, auto_class: str, output: str, names: tuple[str, ...]) -> dict:
    """What a cached conversion is of: the model identity, what is converted, and the library versions (as
    installed: importing transformers or torch to ask costs a warm start seconds)."""
    import openvino

    return {
        "format": FORMAT,
        "model": identity,
        "class": auto_class,
        "output": output,
        "inputs": names,
        "openvino": openvino.__version__,
        "transformers": version("transformers"),
        "torch": version("torch"),
    }


def load(config, of: dict, precisions: list[str], torch_model, head=None) -> OpenVINOBackend:
    """The conversion `of` (see conversion()), from the cache or converted now from `torch_model` (a callable
    that loads it, called only on a cache miss), compiled in each of `precisions`. head: builds a torch module
    (only on a cache miss) computed inside the graph from the hidden states and mask, in place of the model
    output `of["output"]` (which then names it)."""
    import openvino as ov

    names, output = tuple(of["inputs"]), of["output"].split(":")[0]
    entry, seconds = cached(of, lambda staging: _convert(torch_model(), of, staging, head))
    core = ov.Core()
    if os.access(entry, os.W_OK):  # a warm compile reads the blob an earlier one left: half the time (MiniLM, 2 cores)
        core.set_property({"CACHE_DIR": str(entry / BLOBS)})
    compiled = {}
    t2 = time.perf_counter()
    # One request at a time on all of this process's threads (a Ray worker's share: torch's thread count).
    settings = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads()}
    for precision in precisions:
        try:
            compiled[precision] = core.compile_model(
                str(entry / "model.xml"), "CPU", {**settings, "INFERENCE_PRECISION_HINT": precision}
            )
        except RuntimeError as exc:
            raise ModelError(
                f"OpenVINO cannot compile the model in {precision} on this CPU: {_said(exc)}",
                "set model.dtype: float32 (or auto), or model.backend: torch",
            ) from exc
    seconds["compile"] = round(time.perf_counter() - t2, 3)
    model = OpenVINOBackend(config, compiled, output, names, seconds, entry)
    model.check = (_kept(entry, MANIFEST) or {}).get("check")
    return model


def cached(of: dict, write) -> tuple[Path, dict]:
    """The cache entry holding the conversion `of`, made now by write(folder) on a miss (which writes the
    conversion's files into the fresh folder it is given), and the seconds that took ({"convert": s}, or {})."""
    seconds = {}
    entry = entry_of(of)
    t0 = time.perf_counter()
    with _entry_lock(entry) as writable:
        if not _valid(entry):
            if not writable:
                raise _cache_error(entry.parent, "cannot be written, and holds no whole conversion of this model")
            _clear_staging(entry)
            _discard(entry)
            _store(entry, of, write)
            seconds["convert"] = round(time.perf_counter() - t0, 3)
    return entry, seconds


def hit(of: dict) -> Path | None:
    """The cache entry holding the conversion `of` where it is there whole, without converting or locking."""
    entry = entry_of(of)
    return entry if _valid(entry) else None


def entry_of(of: dict) -> Path:
    return cache_root() / "openvino" / hashlib.sha256(json.dumps(of, sort_keys=True).encode()).hexdigest()[:24]


def cpu_id() -> str:
    """This CPU as far as speed goes: its model, flags, the threads a run uses and whether it runs bf16 (which
    BATCHINFER_NO_BF16 turns off, so rates measured without it are kept apart)."""
    try:
        with open("/proc/cpuinfo") as f:
            described = [line for line in f if line.startswith(("model name", "flags"))][:2]
    except OSError:
        described = []
    speed = f"{described}{os.cpu_count()}{threads()}{bf16_supported()}"
    return hashlib.sha256(speed.encode()).hexdigest()[:16]


def threads() -> int:
    """The threads a run computes on: torch's count where torch is imported (a Ray worker sets its share
    there), else what torch would take: OMP_NUM_THREADS, else one per physical core this process may use."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.get_num_threads()
    if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    try:
        with open("/proc/cpuinfo") as f:
            counts = dict(line.split(":", 1) for line in f if line.startswith(("siblings", "cpu cores")))
        per_core = max(1, int(counts["siblings"]) // int(counts["cpu cores"]))  # hyperthreads
    except (OSError, KeyError, ValueError):
        per_core = 1
    return max(1, len(os.sched_getaffinity(0)) // per_core)


def remember(entry: Path, rates: dict[str, float], load: dict | None) -> None:
    """Keep the backends' measured tokens/s beside the conversion, for later jobs on this CPU: with the machine's
    load they were timed under (machine.Load.as_dict), when, and each backend's best rate here so far."""
    kept = _kept(entry, RATES) or {}
    before = kept.get(cpu_id()) if isinstance(kept.get(cpu_id()), dict) else {}
    best = {name: max(rate, before.get("best", {}).get(name, 0.0)) for name, rate in rates.items()}
    _keep(entry, RATES, {**kept, cpu_id(): {**rates, "load": load, "at": round(time.time()), "best": best}})


def saved_tokenizer(model: OpenVINOBackend) -> dict | None:
    """The tokenizer record (folder.tokenizer_record) kept beside the conversion, or None."""
    return _kept(model.entry, TOKENIZER)


def save_tokenizer(model: OpenVINOBackend, record: dict) -> None:
    """Keep the tokenizer transformers built (folder.tokenizer_record) beside the conversion, for warm runs."""
    _keep(model.entry, TOKENIZER, record)


def _kept(entry: Path, name: str):
    try:
        return json.loads((entry / name).read_text())
    except (OSError, ValueError):
        return None


def _keep(entry: Path, name: str, value) -> None:
    """Write `name` in the entry whole (a reader finds the old file or the new one, never a part)."""
    staging = entry / f".{name}.{uuid.uuid4().hex[:8]}"
    try:
        staging.write_text(json.dumps(value, indent=1))
        os.replace(staging, entry / name)
    except OSError:  # a read-only cache: the next job does the work again
        staging.unlink(missing_ok=True)


def known_faster(of: dict, now: Load | None) -> tuple[tuple[str, float] | None, str | None]:
    """The backend that ran the conversion `of` clearly faster than the other on this CPU before (by CLEAR_WIN or
    more) and how many times the other's speed, where that choice still stands: measured under a load comparable
    to `now` (this run's so far: machine.load_so_far) and less than MAX_AGE ago. And a note: under what load the
    choice was measured, or why it is not used (both backends are then timed again). (None, None) where they were
    close or were not both timed here."""
    try:
        record = _kept(entry_of(of), RATES)[cpu_id()]
        ratio = record["openvino"] / record["torch"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None, None
    if ratio >= CLEAR_WIN:
        winner = ("openvino", ratio)
    elif ratio > 0 and 1 / ratio >= CLEAR_WIN:
        winner = ("torch", 1 / ratio)
    else:
        return None, None
    said = f"{'OpenVINO' if winner[0] == 'openvino' else 'torch'} at {winner[1]:.1f}x the other's speed"
    then, at = Load.from_dict(record.get("load")), record.get("at")
    if not isinstance(at, (int, float)) or (then is None) != (now is None):
        return None, f"both backends timed again: the kept choice ({said}) has no record of when or under what load"
    if time.time() - at > MAX_AGE:
        return None, f"both backends timed again: the kept choice ({said}) was measured {_ago(at)}, over 7 days"
    if then is not None and not then.comparable(now):
        why = f"was measured while {then.describe()}; now {now.describe()}"
        return None, f"both backends timed again: the kept choice ({said}) {why}"
    while_ = f", while {then.describe()}" if then is not None else ""
    return winner, f"measured {_ago(at)}{while_}"


def _ago(at: float) -> str:
    hours = max(0.0, time.time() - at) / 3600
    return f"{hours:.0f} hours ago" if hours < 48 else f"{hours / 24:.0f} days ago"


def _convert(model, of: dict, folder: Path, head=None) -> dict:
    """Convert the encoder, check it against torch (_check) and save it in `folder` as model.xml and model.bin;
    the check's figures, for the manifest."""
    import openvino as ov
    import torch

    class OneOutput(torch.nn.Module):
        """The transformers model with the one output a task reads, or `head` of its hidden states and mask."""

        def __init__(self):
            super().__init__()
            self.model = model  # a submodule: the tracer takes its weights as parameters
            self.head = head() if head else None  # the same for the head's (a Dense layer's)

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, **types, **no_cache)
            return self.head(out.last_hidden_state, attention_mask) if self.head else getattr(out, of["output"])

    # A decoder (Llama, Qwen3: embedders with last-token pooling) builds a KV cache by default, whose concatenation
    # OpenVINO cannot convert (aten::cat); an encoder task reads none of it.
    no_cache = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    names = tuple(of["inputs"])
    example = {name: torch.ones(2, 8, dtype=torch.long) for name in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on data-dependent branches in attention masks
        try:
            converted = ov.convert_model(
                OneOutput(),
                example_input=example,
                input=[(name, ov.PartialShape([-1, -1]), ov.Type.i64) for name in names],
            )
        except Exception as exc:  # noqa: BLE001 - the tracer and each op's converter raise their own kinds
            name = getattr(model.config, "name_or_path", "") or type(model).__name__
            raise ModelError(
                f"OpenVINO cannot convert the model {name} ({type(model).__name__}): {_said(exc)}",
                "set model.backend: torch",
            ) from exc
    check = _check(OneOutput(), converted, names)
    ov.save_model(converted, folder / "model.xml", compress_to_fp16=False)
    return {"check": check}


def _store(entry: Path, of: dict, write) -> None:
    """write(folder) into a fresh folder beside the entry, a manifest of every file it wrote (sizes and digests)
    and of what write returned (a conversion's check) added last, then the folder moved into place whole."""
    staging = entry.parent / f".tmp-{entry.name}-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir(parents=True)
        kept = write(staging) or {}
        manifest = {p.name: file_digest(p) for p in sorted(staging.iterdir())}
        (staging / MANIFEST).write_text(json.dumps({"key": entry.name, **of, "files": manifest, **kept}, indent=1))
        os.replace(staging, entry)
    except (OSError, RuntimeError) as exc:  # RuntimeError: OpenVINO's own writes (a full disk: iostream error)
        raise _cache_error(entry.parent, f"could not take the conversion ({_said(exc)})") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check(module, converted, names: tuple[str, ...]) -> dict:
    """The conversion in f32 against the torch module it was traced from, on rows of other lengths than the
    trace's, right-padded: every row's output (over its real tokens where the output is per token) at cosine
    COSINE_FLOOR or more; its figures, or a ModelError where it falls short. A job's own rows check it again
    where torch is loaded beside it (runners/base.py check_conversion)."""
    import openvino as ov
    import torch

    t0 = time.perf_counter()
    lengths = torch.tensor(CHECK_LENGTHS)
    vocab = min(getattr(module.model.config, "vocab_size", None) or 100, 1000)
    ids = torch.randint(
        vocab // 10, vocab, (len(lengths), int(lengths.max())), generator=torch.Generator().manual_seed(0)
    )
    mask = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    inputs = {name: inputs[name] for name in names}
    with torch.inference_mode():
        reference = module(**inputs).float().numpy()
    compiled = ov.Core().compile_model(converted, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    ours = compiled({name: value.numpy() for name, value in inputs.items()})[0]
    per_token = reference.ndim == 3  # [b, L, ...]: the real tokens' outputs only
    rows = [(r[:n] if per_token else r, o[:n] if per_token else o) for r, o, n in zip(reference, ours, CHECK_LENGTHS)]
    cosines = [float(r.ravel() @ o.ravel() / max(np.linalg.norm(r) * np.linalg.norm(o), 1e-12)) for r, o in rows]
    check = {"precision": "f32", "against": "torch", "items": len(rows), "min_cosine": round(min(cosines), 6)}
    check["seconds"] = round(time.perf_counter() - t0, 3)  # its compile and both runs, inside the conversion's
    if min(cosines) < COSINE_FLOOR:
        raise ModelError(
            f"OpenVINO's conversion of the model {getattr(module.model.config, 'name_or_path', '')} disagrees with "
            f"torch: min cosine {check['min_cosine']} on {len(rows)} rows of random tokens",
            "set model.backend: torch",
        )
    return check


def _valid(entry: Path) -> bool:
    """The entry's files are whole and the ones its manifest names (a cut or foreign copy is not)."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        files = manifest["files"]
        return (
            manifest.get("key") == entry.name
            and bool(files)
            and all(file_digest(entry / name) == digest for name, digest in files.items())
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _discard(entry: Path) -> None:
    """Remove a damaged entry, only when it is a folder holding nothing but the files a conversion writes."""
    fix = "move it away, or point $BATCHINFER_CACHE at a folder of batchinfer's own"
    if not entry.exists():
        return
    if not entry.is_dir():
        raise ModelError(f"{entry} is a file where batchinfer keeps a conversion, and not one it wrote", fix)
    try:
        foreign = sorted({p.name for p in entry.iterdir()} - set(ENTRY_FILES))
        if not foreign:
            shutil.rmtree(entry)
    except OSError as exc:
        raise _cache_error(entry.parent, f"could not remove the damaged conversion {entry.name} ({exc})") from exc
    if foreign:
        raise ModelError(f"{entry} holds files batchinfer did not write ({', '.join(foreign)})", fix)


def _clear_staging(entry: Path) -> None:
    """Remove the staging folders that conversions killed on the way left (kill -9, a power cut). A conversion
    stages only while it holds its key's lock, so one whose lock is free (or is `entry`'s, held here) is
    nobody's."""
    for staging in entry.parent.glob(".tmp-*"):
        key = STAGING.fullmatch(staging.name)
        if key and staging.is_dir() and (key.group(1) == entry.name or _lock_is_free(entry.parent, key.group(1))):
            shutil.rmtree(staging, ignore_errors=True)


def _lock_is_free(root: Path, key: str) -> bool:
    path = root / f".{key}.lock"
    if not path.exists():
        return True
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except (Timeout, OSError):  # held: a conversion at work (or a lock this process cannot open: left alone)
        return False
    lock.release()
    return True


@contextmanager
def _entry_lock(entry: Path):
    """One converter per machine and key: the others wait, then find the entry made. Yields whether the
    cache can be written; one that cannot is only read (no one converts there)."""
    lock = FileLock(entry.parent / f".{entry.name}.lock")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def _cache_error(folder: Path, problem: str) -> ModelError:
    return ModelError(
        f"the OpenVINO conversion cache {folder} {problem}",
        "set BATCHINFER_CACHE to a writable folder with room for the model's conversion (about its weights' size), "
        "or set model.backend: torch",
    )


def _said(exc: BaseException) -> str:
    """What an OpenVINO error says, without the source line it starts with ("Exception from src/...:"); of the
    converter's report (each failed operation in detail, then a summary), the summary."""
    text = str(exc).rsplit("Summary:", 1)[-1]
    lines = [line.strip(" -") for line in text.splitlines() if not line.startswith("Exception from")]
    said = " ".join(line for line in lines if line) or type(exc).__name__
    return said if len(said) <= 300 else said[:297] + "..."
