"""examples/bench/gpu.sh's own pieces: what the machine is, its peak memory while the steps run, and the one
table that ends the run, read from the steps' outputs.

    python3 examples/bench/gpu_report.py env --device cuda               # versions and the GPU (a dry run: the CPU)
    python3 examples/bench/gpu_report.py watch --device cuda OUT/memory.json &   # peak memory in use, every 0.5 s
    python3 examples/bench/gpu_report.py table OUT                       # the summary of OUT's step outputs

Each line runs on a CPU too (gpu.sh's dry run): there the GPU's figures are the CPU's equivalents, said so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SMI = ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"]
BENCH_RUNS = {"batchinfer": "auto", "batchinfer-packed": "packed", "batchinfer-padded": "padded", "naive": "naive"}
BENCH_RUNS |= {"pipeline": "pipeline", "st": "sentence-transformers"}
ENGINES = ("auto", "transformers", "static", "raw", "vllm")


# --- env -------------------------------------------------------------------------------------------------------


def describe(device: str) -> list[str]:
    """Lines saying what runs the figures: versions, and the GPU, or in a dry run the CPU."""
    import torch
    import transformers

    from batchinfer.backends.packing import _varlen_attn

    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}"]
    varlen = _varlen_attn() is not None  # its import costs a second: kept for the GPU's line, checked here too
    if device == "cpu":
        cores, flags = os.cpu_count(), cpu_flags()
        lines.append(f"dry run on the CPU: {cpu_model()}, {cores} cores, {flags or 'no avx2'}; varlen_attn {varlen}")
    else:
        free, total = torch.cuda.mem_get_info()
        lines.append(
            f"{torch.cuda.get_device_name()}, sm{''.join(map(str, torch.cuda.get_device_capability()))}, "
            f"bf16 {torch.cuda.is_bf16_supported()}, varlen_attn {varlen}, "
            f"{free / 2**30:.0f} of {total / 2**30:.0f} GiB free"
        )
    return lines


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next(line for line in f if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return ""
    return " ".join(sorted(flags & {"avx2", "avx512_bf16", "amx_bf16"}))


# --- watch -----------------------------------------------------------------------------------------------------


def parse_smi(text: str) -> tuple[int, int]:
    """nvidia-smi's "used, total" line (MiB) of the first GPU."""
    used, total = text.strip().splitlines()[0].split(",")
    return int(used), int(total)


def memory_in_use(device: str) -> tuple[int, int]:
    """(MiB in use, MiB in all): the GPU's by nvidia-smi, in a dry run the machine's RAM by /proc/meminfo."""
    if device != "cpu":
        return parse_smi(subprocess.run(SMI, capture_output=True, text=True, check=True).stdout)
    with open("/proc/meminfo") as f:
        info = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}
    return (info["MemTotal"] - info["MemAvailable"]) // 1024, info["MemTotal"] // 1024


def watch(device: str, path: Path, every: float = 0.5, rounds: int | None = None) -> None:
    """Write {"peak_mib", "baseline_mib", "total_mib", "source"} to `path` at each new peak, until killed."""
    baseline, total = memory_in_use(device)
    peak = -1
    while rounds is None or rounds > 0:
        used = memory_in_use(device)[0]
        if used > peak:
            peak = used
            state = {"peak_mib": peak, "baseline_mib": baseline, "total_mib": total}
            state["source"] = "RAM, /proc/meminfo (dry run)" if device == "cpu" else "GPU, nvidia-smi"
            path.with_suffix(".tmp").write_text(json.dumps(state))
            path.with_suffix(".tmp").replace(path)
        rounds = None if rounds is None else rounds - 1
        time.sleep(every)


# --- table -----------------------------------------------------------------------------------------------------


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(out: Path) -> dict[str, tuple[int, int]]:
    """step name -> (seconds, exit status) from gpu.sh's steps.tsv; 124 is a step that ran out of its time."""
    try:
        lines = (out / "steps.tsv").read_text().splitlines()
    except OSError:
        return {}
    return {name: (int(seconds), int(rc)) for name, seconds, rc in (line.split("\t") for line in lines if line)}


def status(out: Path, step: str) -> str:
    seconds, rc = steps(out).get(step, (0, -1))
    return {-1: "did not run", 0: f"{seconds} s"}.get(rc, "timed out" if rc in (124, 137) else f"failed (exit {rc})")


def tests_line(out: Path) -> str:
    try:
        suite = ET.parse(out / "pytest-gpu.xml").getroot()
    except (OSError, ET.ParseError):
        return f"no results ({status(out, 'pytest-gpu')})"
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    count = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    failed = [
        c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None
    ]
    return f"{passed} passed, {count['failures'] + count['errors']} failed, {count['skipped']} skipped" + (
        f" ({', '.join(failed)})" if failed else ""
    )


def figures_of(out: Path, step: str, key: str) -> tuple[dict, dict] | None:
    """A step's JSON (meta, its figures under `key`); None where it wrote none (it failed or ran out of time first)."""
    data = read_json(out / f"{step}.json")
    return (data["meta"], data[key]) if data and data.get(key) else None


def bench_lines(out: Path, step: str, what: str) -> list[tuple[str, str]]:
    if (bench := figures_of(out, step, "runs")) is None:
        return [(what, f"no figures ({status(out, step)})")]
    meta, runs = bench
    head = f"{what}: {meta['rows']:,} rows, mean {meta['mean_tokens']:.1f} tokens, {meta['limit_name']}"
    lines = [(head, f"{meta['rate'] / 1e9:,.0f} GFLOP/s measured ({status(out, step)})")]
    for run, r in runs.items():
        figure = f"{r['rows_per_s_compute']:,.1f} rows/s of compute, {r['pct_limit']:.0f}% of limit"
        figure += f"; whole process {r['wall']:.1f} s" + (f" ({r['backend']})" if r.get("backend") else "")
        lines.append((f"  {BENCH_RUNS.get(run, run)}", figure))
    if "st" in runs and "batchinfer" in runs:
        ratio = runs["st"]["wall"] / runs["batchinfer"]["wall"]
        lines.append(("  sentence-transformers ÷ batchinfer, whole process", f"{ratio:.2f}x"))
    return lines


def generation_lines(out: Path, step: str) -> list[tuple[str, str]]:
    if (gen := figures_of(out, step, "engines")) is None:
        return [(step, f"no figures ({status(out, step)})")]
    meta, engines = gen
    skipped = (read_json(out / f"{step}.json") or {}).get("skipped", {})
    head = f"generation, {meta['concurrency']} in flight: {meta['rows']} rows, {meta['new_tokens']:,} new tokens"
    lines = [(head, f"{meta['model']} ({status(out, step)})")]
    static = engines.get("static", {}).get("tokens_per_s")
    for engine in ENGINES:
        r = engines.get(engine)
        if r is None:
            why = skipped.get(engine)
            lines.append((f"  {engine}", f"not run: {why}" if why else "not run (timed out before it)"))
            continue
        figure = f"{r['tokens_per_s']:,.1f} tokens/s, median time to first token {r['first_token_s']:.2f} s"
        if static and engine != "static":
            figure += f", {r['tokens_per_s'] / static:.2f}x static"
        if r.get("chose"):
            figure += f"; ran {r['chose']}"
        lines.append((f"  {engine}", figure))
    return lines


def table(out: Path) -> str:
    """The run's one table: every figure gpu.sh measured, or why it is missing."""
    env = (out / "env.txt").read_text().strip().splitlines() if (out / "env.txt").exists() else ["?"]
    rows: list[tuple[str, str]] = [("machine", "; ".join(env[1:]) or "?"), ("stack", env[0])]
    rows.append(("GPU tests (pytest -m gpu tests/test_gpu.py)", tests_line(out)))
    rows += bench_lines(out, "bench-base-cls", "BERT-base classify")
    rows += bench_lines(out, "bench-minilm", "MiniLM embed")
    rows += generation_lines(out, "generate-32") + generation_lines(out, "generate-256")
    if profile := read_json(out / "profile.json"):
        rows.append(("encoder forward, where the time goes", ", ".join(f"{k} {v:.0%}" for k, v in profile.items())))
    memory = read_json(out / "memory.json")
    if memory:
        peak = f"{memory['peak_mib'] / 1024:,.1f} of {memory['total_mib'] / 1024:,.0f} GiB in use at the peak"
        rows.append(
            (f"peak memory ({memory['source']})", f"{peak} ({memory['baseline_mib'] / 1024:,.1f} at the start)")
        )
    rows.append(("steps", ", ".join(f"{name} {status(out, name)}" for name in steps(out)) or "none ran"))
    return "\n".join(["| what | figure |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    env = commands.add_parser("env", help="versions and the machine")
    env.add_argument("--device", default="cuda")
    mem = commands.add_parser("watch", help="peak memory in use, into PATH, until killed")
    mem.add_argument("--device", default="cuda")
    mem.add_argument("path", type=Path)
    summary = commands.add_parser("table", help="the one table of OUT's step outputs")
    summary.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "env":
        print("\n".join(describe(args.device)))
    elif args.command == "watch":
        watch(args.device, args.path)
    else:
        print(table(args.out))


if __name__ == "__main__":
    main()
