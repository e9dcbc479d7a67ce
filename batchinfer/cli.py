"""The command line. The one place where errors become messages and exit codes."""

from __future__ import annotations

import json
import shlex
import signal
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from .errors import BatchinferError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Offline batch inference: Parquet/JSONL shards in, Parquet results out, resumable.")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

SetOption = typer.Option(None, "--set", help="Override a job key, e.g. --set batching.max_tokens=8192 (repeatable).")
DebugOption = typer.Option(False, "--debug", help="Show the full traceback of an error.")


@contextmanager
def reported(debug: bool):
    """Turn errors into one message and an exit code; a traceback only with --debug."""
    warnings.showwarning = lambda message, *_: err.print(f"[yellow]warning:[/] {message}", highlight=False)
    try:
        yield
    except BatchinferError as exc:
        if debug:
            traceback.print_exc()
        err.print(f"[bold red]error:[/] {exc.message}", highlight=False)
        if exc.hint:
            err.print(f"[yellow]fix:[/] {exc.hint}", highlight=False)
        raise typer.Exit(exc.exit_code)
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the last line of defence: say what broke, hide the stack
        if debug:
            traceback.print_exc()
        err.print(f"[bold red]internal error:[/] {type(exc).__name__}: {exc}", highlight=False)
        err.print("[yellow]fix:[/] rerun with --debug for the traceback, and report it if the input looks fine", highlight=False)
        raise typer.Exit(1)


@app.command()
def run(
    job: Path = typer.Argument(..., help="The job file (YAML)."),
    set_: Optional[List[str]] = SetOption,
    restart: bool = typer.Option(False, "--restart", help="Discard the output folder's earlier results and start over."),
    retry_errors: bool = typer.Option(False, "--retry-errors", help="Run the rows in _errors/ again, e.g. after "
                                      "raising model.max_length; only max_length, truncation and dtype may change."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write to this folder instead of output.path."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    debug: bool = DebugOption,
):
    """Run a job, or resume it where it stopped."""
    from .config import load_job

    with reported(debug):
        overrides = list(set_ or []) + ([f"output.path={output}"] if output else [])
        config = load_job(job, overrides)
        command = resume_command(["run", str(job)], set_ or [], output) + (" --retry-errors" if retry_errors else "")
        execute(config, command, restart=restart, retry_errors=retry_errors, quiet=quiet)


@app.command("openai-batch")
def openai_batch(
    requests: Path = typer.Argument(..., help="An OpenAI Batch API request file (JSONL: custom_id, method, url, body)."),
    model: str = typer.Option(..., "--model", "-m", help="The model to run instead of each request's body.model."),
    output: Path = typer.Option(..., "--output", "-o", help="The response file to write (JSONL)."),
    set_: Optional[List[str]] = SetOption,
    restart: bool = typer.Option(False, "--restart", help="Discard earlier results for OUTPUT and start over."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    debug: bool = DebugOption,
):
    """Run an OpenAI Batch API file locally: responses to OUTPUT, failed requests to OUTPUT's .errors.jsonl.

    Work is checkpointed in OUTPUT.batchinfer/; rerun the same command to resume."""
    from .config import apply_override, validate_job
    from .openai_batch import check_targets, deliver, task_of_requests

    with reported(debug):
        work = output.with_name(output.name + ".batchinfer")
        data = {"input": {"path": str(requests), "format": "openai"},
                "model": {"path": model, "task": task_of_requests(requests)},
                "output": {"path": str(work), "format": "openai"}}
        for item in set_ or []:
            apply_override(data, item)
        config = validate_job(data, "openai-batch")
        command = resume_command(["openai-batch", str(requests), "--model", model, "-o", str(output)], set_ or [], None)
        errors = output.with_name(output.name.removesuffix(".jsonl") + ".errors.jsonl")
        check_targets(work, [output, errors])
        report = execute(config, command, restart=restart, retry_errors=False, quiet=quiet)
        deliver(work, {"output.jsonl": output, "errors.jsonl": errors})
        err.print(f"wrote {report['openai']['output.jsonl']:,} responses to {output} and "
                  f"{report['openai']['errors.jsonl']:,} failed requests to {errors}", highlight=False)


def execute(config, command: str, *, restart: bool, retry_errors: bool, quiet: bool) -> dict:
    """Run a job with a progress bar; on SIGINT/SIGTERM stop cleanly and say how to resume."""
    from .control import Interrupted, StopFlag
    from .driver import run_job
    from .progress import RunProgress, summary_table

    stop = StopFlag()
    progress = None if quiet else RunProgress(err)
    previous = {s: signal.signal(s, lambda signum, _: stop.set(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        report = run_job(config, restart=restart, retry_errors=retry_errors, progress=progress, stop=stop,
                         command=command)
    except Interrupted as exc:
        name = signal.Signals(exc.signum).name
        err.print(f"[yellow]stopped on {name}[/]: finished chunks are saved in {config.output.path}.")
        err.print(f"resume with: {command}", highlight=False)
        raise typer.Exit(128 + exc.signum)
    finally:
        if progress:
            progress.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    err.print(summary_table(report))
    return report


@app.command()
def validate(job: Path = typer.Argument(..., help="The job file (YAML)."), set_: Optional[List[str]] = SetOption,
             debug: bool = DebugOption):
    """Check a job file, its input and its model folder, without loading the model."""
    from .config import load_job
    from .models import check_model_folder, resolve_model_path
    from .plan import plan_chunks
    from .sources import discover_shards

    with reported(debug):
        config = load_job(job, set_ or [])
        shards, bad, _ = discover_shards(config.input, config.columns, output=config.output.path)
        model_path = resolve_model_path(config.model.path)
        check_model_folder(model_path, config.model.allow_pickle)
        chunks = plan_chunks([s.num_rows for s in shards], config.batching.chunk_rows)
        rows = sum(s.num_rows for s in shards)
        for shard in bad:
            out.print(f"[yellow]skipped[/] (input.on_bad_shard: skip): {shard.message}", highlight=False)
        out.print(f"[green]ok[/]: {job} — {len(shards)} shard(s), {rows:,} rows, {len(chunks)} chunk(s); "
                  f"model {model_path}", highlight=False)


@app.command()
def schema():
    """Print the job file's JSON schema."""
    from .config import JobConfig

    print(json.dumps(JobConfig.model_json_schema(), indent=2))


@app.command()
def status(folder: str = typer.Argument(..., help="A job's output folder (a path or a URL such as s3://bucket/out)."),
           debug: bool = DebugOption):
    """Show how far a job's output folder is: chunks, rows, errors, the run holding it. Changes nothing."""
    from .errors import OutputError
    from .sink import JOB, LEGACY, REPORT, SUCCESS, current_errors, read_state
    from .storage import is_uri

    with reported(debug):
        try:
            state = read_state(folder)
        except OSError as exc:
            raise OutputError(f"cannot read {folder}: {exc}", "check the path or URL and the credentials") from exc
        if state is None:
            legacy = not is_uri(folder) and (Path(folder) / LEGACY).exists()
            raise OutputError(f"{folder} holds no batchinfer run (no {JOB})" + (
                f"; its {LEGACY} was written by an earlier batchinfer, which this one cannot resume" if legacy else ""),
                "give the output.path of a job")
        sink, done = state
        errors: Counter = Counter()
        for name in current_errors(done).values():
            errors.update(done[name]["errors"])
        chunks = [r for r in done.values() if "retry_of" not in r]
        updated = max([sink.folder.mtime(JOB) or 0.0] + [r.get("finished", 0.0) for r in done.values()])
        holder = sink.holder()
        complete = sink.folder.read(SUCCESS) is not None
        total = sink.job.get("plan", {}).get("chunks", "?")
        out.print(f"chunks  {len(chunks)}/{total} done" + (" (complete)" if complete else ""))
        out.print(f"rows    {sum(r['rows'] for r in chunks):,} done, {sum(r['ok'] for r in done.values()):,} ok")
        out.print(f"errors  {', '.join(f'{k} {v:,}' for k, v in sorted(errors.items())) or 'none'}")
        out.print(f"updated {datetime.fromtimestamp(updated).isoformat(timespec='seconds')}")
        out.print(f"active  {'yes, pid ' + str(holder['pid']) + ' on ' + holder['host'] if holder else 'no'}")
        raw = sink.folder.read(REPORT)
        if raw is not None:
            try:
                json.loads(raw)
            except ValueError:
                out.print(f"report  {REPORT} is damaged; the next run of the job writes it again")
        if not complete and not holder:
            out.print(f"resume  {sink.command or 'batchinfer run JOB.yaml (the same job file and --set options)'}", highlight=False)


def resume_command(words: list[str], overrides: list[str], output: str | None) -> str:
    words = ["batchinfer", *words] + [w for o in overrides for w in ("--set", o)]
    if output:
        words += ["--output", output]
    return shlex.join(words)
