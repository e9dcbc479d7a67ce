"""The command line. The one place where errors become messages and exit codes."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shlex
import signal
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from .errors import BatchinferError, ConfigError, InputError
from .progress import labelled

app = typer.Typer(
    add_completion=False,
    # Plain help: rich markup would eat [serve] in `pip install -e ".[serve]"`, and flags show as flags (--restart),
    # not as options taking a <bool>.
    rich_markup_mode=None,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Offline batch inference: Parquet/JSONL shards in, Parquet results out, resumable.",
)
# No markup: messages carry paths, column names and values that may hold [brackets]; labels are styled Text.
out = Console(soft_wrap=True, markup=False)
err = Console(stderr=True, soft_wrap=True, markup=False)
LOG_WIDTH = 200  # the summary's width where stderr is no terminal

SetOption = typer.Option(
    None, "--set", metavar="KEY=VALUE", help="Override a job key, e.g. --set batching.max_tokens=8192 (repeatable)."
)
OutputOption = typer.Option(None, "--output", "-o", help="The output folder, in place of output.path.")
LimitOption = typer.Option(
    None,
    "--limit",
    min=1,
    help="Run only the first N rows, to try a job; the same command without --limit (or a larger N) continues it.",
)
DebugOption = typer.Option(False, "--debug", help="Show the full traceback of an error.")
QuietOption = typer.Option(False, "--quiet", "-q", help="No progress (--progress none).")
ProgressOption = typer.Option("auto", "--progress", help="auto (a bar on a terminal, else lines), bar, lines or none.")
EveryOption = typer.Option(30.0, "--every", min=0.0, help="Seconds between progress lines (--progress lines).")


def with_output(sets: Optional[List[str]], output: Optional[str]) -> list[str]:
    """The --set overrides, and --output as the override of output.path (as `run` prints it in a resume line)."""
    return list(sets or []) + ([f"output.path={output}"] if output is not None else [])


def _version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"batchinfer {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
):
    """Offline batch inference: Parquet/JSONL/CSV shards in, Parquet results out, resumable."""


@contextmanager
def reported(debug: bool):
    """Turn errors into one message and an exit code; a traceback only with --debug."""
    from .control import show_library_logs

    warnings.showwarning = lambda message, *_: err.print(labelled("warning:", "yellow", str(message)), highlight=False)
    show_library_logs(debug)  # without importing torch, which status and export never need
    try:
        yield
    except BatchinferError as exc:
        if debug:
            traceback.print_exc()
        err.print(labelled("error:", "bold red", exc.message), highlight=False)
        if exc.hint:
            err.print(labelled("fix:", "yellow", exc.hint), highlight=False)
        raise typer.Exit(exc.exit_code) from None
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the last line of defence: say what broke, hide the stack
        if debug:
            traceback.print_exc()
        err.print(labelled("internal error:", "bold red", f"{type(exc).__name__}: {exc}"), highlight=False)
        err.print(
            labelled("fix:", "yellow", "rerun with --debug for the traceback, and report it if the input looks fine"),
            highlight=False,
        )
        raise typer.Exit(1) from None


@app.command()
def run(
    job: Path = typer.Argument(..., help="The job file (YAML)."),
    set_: Optional[List[str]] = SetOption,
    restart: bool = typer.Option(
        False, "--restart", help="Discard the output folder's earlier results and start over."
    ),
    retry_errors: bool = typer.Option(
        False,
        "--retry-errors",
        help="Run the rows in _errors/ again, e.g. after "
        "raising model.max_length; only max_length, truncation and dtype may change.",
    ),
    output: Optional[str] = OutputOption,
    limit: Optional[int] = LimitOption,
    progress: str = ProgressOption,
    every: float = EveryOption,
    quiet: bool = QuietOption,
    debug: bool = DebugOption,
):
    """Run a job, or resume it where it stopped."""
    from .job.config import load_job

    with reported(debug):
        config = load_job(job, with_output(set_, output))
        command = (
            resume_command(["run", str(job)], set_ or [], output)
            + (" --retry-errors" if retry_errors else "")
            + (f" --limit {limit}" if limit else "")
        )
        execute(
            config,
            command,
            restart=restart,
            retry_errors=retry_errors,
            limit=limit,
            progress=progress_display("none" if quiet else progress, every),
        )


@app.command("openai-batch")
def openai_batch(
    requests: Path = typer.Argument(
        ..., help="An OpenAI Batch API request file (JSONL: custom_id, method, url, body)."
    ),
    model: str = typer.Option(..., "--model", "-m", help="The model to run instead of each request's body.model."),
    # text, not a Path, which would drop the / that marks a folder
    output: str = typer.Option(..., "--output", "-o", metavar="<path>", help="The response file to write (JSONL)."),
    set_: Optional[List[str]] = SetOption,
    restart: bool = typer.Option(False, "--restart", help="Discard earlier results for OUTPUT and start over."),
    retry_errors: bool = typer.Option(
        False,
        "--retry-errors",
        help="Answer the failed requests again, e.g. too_long ones after raising model.max_length; only "
        "max_length, truncation and dtype may change.",
    ),
    progress: str = ProgressOption,
    every: float = EveryOption,
    quiet: bool = QuietOption,
    debug: bool = DebugOption,
):
    """Run an OpenAI Batch API file locally: responses to OUTPUT, failed requests to OUTPUT's .errors.jsonl.

    Work is checkpointed in OUTPUT.batchinfer/; rerun the same command to resume."""
    from .backends.models import read_config, resolve_model_path
    from .commands.delivery import results_path
    from .errors import ModelError
    from .job.config import validate_with_overrides
    from .openai_compat.batch_files import task_of_requests

    with reported(debug):
        output = results_path(output)
        work = output.with_name(output.name + ".batchinfer")
        data = {
            "input": {"path": str(requests), "format": "openai"},
            "model": {"path": model, "task": task_of_requests(requests)},
            "output": {"path": str(work), "format": "openai"},
        }
        config = validate_with_overrides(data, set_ or [], "openai-batch")
        model_path = resolve_model_path(config.model.path)
        try:
            read_config(config.model, model_path)
        except ModelError as exc:  # the model lacks what the file's url needs
            raise ModelError(
                f"{exc.message} (task {config.model.task} follows from the url of the first request in {requests}; "
                "as in OpenAI's Batch API, one file holds requests of one url, others become error lines)",
                exc.hint,
            ) from exc
        command = resume_command(
            ["openai-batch", str(requests), "--model", model, "-o", str(output)], set_ or [], None
        ) + (" --retry-errors" if retry_errors else "")
        shown = progress_display("none" if quiet else progress, every)
        _run_batch(config, command, output, work, restart=restart, retry_errors=retry_errors, progress=shown)


def _run_batch(config, command: str, output: Path, work: Path, *, restart: bool, retry_errors: bool, progress):
    """Run the batch's job in `work`, then move its responses to `output` and its failed requests beside it."""
    from .commands.delivery import check_targets, deliver
    from .errors import Elsewhere

    errors = output.with_name(output.name.removesuffix(".jsonl") + ".errors.jsonl")
    known = check_targets(work, [output, errors])
    try:
        report = execute(config, command, restart=restart, retry_errors=retry_errors, progress=progress)
    except Elsewhere as exc:  # its fix is run's (--output NEW_FOLDER); here -o names a file
        raise exc.at("a new file with -o NEW.jsonl") from None
    counts = report["openai"]
    deliver(work, {"output.jsonl": output, "errors.jsonl": errors}, counts, known)
    _say_delivered(counts, output, errors, work)


def _say_delivered(counts: dict, output: Path, errors: Path, work: Path) -> None:
    answered, failed = counts["output.jsonl"], counts["errors.jsonl"]
    err.print(
        (
            f"wrote {answered:,} response{'s' * (answered != 1)} to {output} and "
            if answered
            else "wrote no response (every request failed, so no results file) and "
        )
        + (
            f"{failed:,} failed request{'s' * (failed != 1)} to {errors}"
            if failed
            else "no failed request (so no errors file)"
        ),
        highlight=False,
    )
    err.print(
        f"{work}/ keeps the checkpoint: a rerun resumes from it, and may replace these files because it "
        "holds their digests; remove it when you are done with this batch",
        highlight=False,
    )


def check_port(host: str, port: int) -> None:
    import errno
    import socket

    if not 1 <= port <= 65535:  # 0 is refused too: the system would pick a port, and no message could name it
        raise ConfigError(f"--port {port} is not a port to listen on", "give --port a number from 1 to 65535")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
            probe.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
            why = f"{host} is not an address of this machine"
            fix = "give --host one of its addresses: 127.0.0.1 (this machine alone) or 0.0.0.0 (all of them)"
        elif exc.errno == errno.EADDRINUSE:
            why, fix = exc.strerror, "stop the program that holds the port, or give another with --port"
        else:
            why, fix = exc.strerror or str(exc), "give another --host or --port"
        raise ConfigError(f"cannot listen on {host}:{port}: {why}", fix) from None


def progress_display(kind: str, every: float):
    """auto: a bar when stderr is a terminal, else plain lines every `every` seconds (logs, nohup, cron)."""
    from .progress import LineProgress, RunProgress

    if kind not in ("auto", "bar", "lines", "none"):
        raise ConfigError(f"--progress {kind!r} is not one of auto, bar, lines, none", "write e.g. --progress lines")
    if kind == "auto":
        kind = "bar" if err.is_terminal else "lines"
    return {"bar": lambda: RunProgress(err), "lines": lambda: LineProgress(err, every), "none": lambda: None}[kind]()


def execute(config, command: str, *, restart: bool, retry_errors: bool, progress, limit: int | None = None) -> dict:
    """Run a job showing progress; on SIGINT/SIGTERM stop cleanly and say how to resume; on a second
    one, exit at once (control.Signals)."""
    from .commands.show import no_rows
    from .control import Interrupted, Signals, StopFlag
    from .execution.driver import run_job
    from .progress import summary_table

    def forced(signum: int) -> None:  # no console and no lock: the main thread may hold them
        os.write(
            2,
            (
                ("\x1b[?25h" if err.is_terminal else "")
                + f"\nstopped at once on a second {signal.Signals(signum).name}: the chunks in flight are dropped, "
                f"finished chunks are saved in {config.output.path}.\nresume with: {command}\n"
            ).encode(),
        )

    stop = StopFlag()
    try:
        with Signals(stop, forced):
            report = run_job(
                config,
                restart=restart,
                retry_errors=retry_errors,
                limit=limit,
                progress=progress,
                stop=stop,
                command=command,
            )
    except Interrupted as exc:
        kept = None
        if progress:
            progress.stop()
            kept, progress = progress.kept(), None
        name = signal.Signals(exc.signum).name
        said = kept.line(config.output.path) if kept else f"finished chunks are saved in {config.output.path}."
        err.print(labelled(f"stopped on {name}:", "yellow", said))
        err.print(f"resume with: {command}", highlight=False)
        exit_at_once(128 + exc.signum)
    finally:
        if progress:
            progress.stop()
    if report["complete"] and not report["rows"]:
        err.print(f"{no_rows(config)}: {config.output.path} is complete with none", highlight=False)
    elif report["complete"] and not report["run"]["rows"]:
        err.print(
            f"already complete: {report['rows']:,} rows in {config.output.path} (use --restart to run it again)",
            highlight=False,
        )
    else:  # into a log (nohup, cron) at LOG_WIDTH: rich takes 80 columns where stderr is no terminal
        (err if err.is_terminal else Console(stderr=True, markup=False, width=LOG_WIDTH)).print(summary_table(report))
    return report


def exit_at_once(code: int) -> None:
    """End the process without Python's teardown of its modules, which takes two seconds once
    transformers is imported: a stopped run is over when it says so. Exit handlers still run and the
    standard streams are flushed; the run has closed its files and released its lock already."""
    import atexit
    import sys

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command()
def validate(
    job: Path = typer.Argument(..., help="The job file (YAML)."),
    set_: Optional[List[str]] = SetOption,
    output: Optional[str] = OutputOption,
    debug: bool = DebugOption,
):
    """Check a job file, its input, its model (config only, no weights) and its output folder. Writes nothing."""
    from .backends.models import pick_device
    from .commands.dryrun import sample_problems
    from .execution.job_plan import JobPlan
    from .job.config import load_job
    from .output.status import describe_folder

    with reported(debug):
        config = load_job(job, with_output(set_, output))
        plan = JobPlan.open(config)
        if config.runtime.executor == "local":  # Ray workers pick their devices on their own machines
            pick_device(config.model.device)
        folder, _, chunks = describe_folder(
            config.output.path, config.output.storage_options, plan.fingerprint(), lambda cuts: plan.chunks(None, cuts)
        )
        for shard in plan.inputs.bad:
            out.print(labelled("skipped", "yellow", f"(input.on_bad_shard: skip): {shard.message}"), highlight=False)
        say_sample_problems(*sample_problems(config, plan.inputs))
        if config.model.task == "generate" and importlib.util.find_spec("xgrammar"):  # else run says it is needed
            from .constrained.grammar import check_job_constraint

            check_job_constraint(config.generation)
        out.print(
            labelled(
                "ok:",
                "green",
                f"{job} — {len(plan.inputs.shards)} shard(s), {plan.rows:,} rows, {len(chunks)} chunk(s); "
                f"model {plan.model_path}",
            ),
            highlight=False,
        )
        out.print(f"output {config.output.path}: {folder}", highlight=False)


@app.command("plan")
def plan_command(
    job: Path = typer.Argument(..., help="The job file (YAML)."),
    set_: Optional[List[str]] = SetOption,
    output: Optional[str] = OutputOption,
    sample: Optional[int] = typer.Option(
        None,
        "--sample",
        min=1,
        help="Rows to tokenize and time [default: the job's first chunk, at least 2,000: the probe's share of it].",
    ),
    limit: Optional[int] = typer.Option(
        None, "--limit", min=1, help="Plan what `run --limit N` would run: the job's first N rows."
    ),
    debug: bool = DebugOption,
):
    """What a job will do, before any output is written: rows, tokens, chunks, padding, a time estimate."""
    from .commands.dryrun import estimate_job
    from .commands.show import plan_lines
    from .job.config import load_job

    with reported(debug):
        config = load_job(job, with_output(set_, output))
        summary = estimate_job(config, sample, limit=limit)
        say_sample_problems(*summary["sample_check"])
        for line in plan_lines(config, summary):
            out.print(line, highlight=False)


def _served_job(job: Optional[Path], model: Optional[str], task: Optional[str], sets: list[str], served):
    """The job serve runs: a job file's, or one built from --model and --task."""
    from .job.config import load_job, validate_with_overrides

    if job is not None:
        return load_job(job, sets)
    if not (model and task):
        raise ConfigError("give a job file, or --model and --task", "e.g. batchinfer serve --model PATH --task embed")
    if task not in served:  # before the job is checked, which would first ask for what the task needs
        raise ConfigError(
            f"serve runs tasks {', '.join(served)}; {task} runs offline with batchinfer run",
            f"use batchinfer run for task {task}, or --task one of {', '.join(served)}",
        )
    data = {
        "input": {"path": "-", "text": "text", **({"text_pair": "text_pair"} if task == "score" else {})},
        "model": {"path": model, "task": task},
        "output": {"path": "-"},
    }
    return validate_with_overrides(data, sets, "batchinfer serve")


@app.command()
def serve(
    job: Optional[Path] = typer.Argument(None, help="A job file: its model, batching, generation and serve sections."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="The model (instead of a job file)."),
    task: Optional[str] = typer.Option(None, "--task", help="embed, classify, score or generate (with --model)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    set_: Optional[List[str]] = SetOption,
    debug: bool = DebugOption,
):
    """Serve the model over HTTP, batching concurrent requests (pip install -e ".[serve]")."""
    from .backends.models import read_config, resolve_model_path

    with reported(debug):
        try:
            import uvicorn

            from .serve import SERVED, BadInput, create_app
        except ImportError as exc:
            raise ConfigError(
                f"batchinfer serve needs FastAPI and uvicorn ({exc})", 'pip install -e ".[serve]"'
            ) from exc
        config = _served_job(job, model, task, set_ or [], SERVED)
        model_path = resolve_model_path(config.model.path)
        read_config(config.model, model_path)
        check_port(host, port)  # before the model loads: a taken port is known at once
        try:
            app = create_app(config, model_path)
        except BadInput as exc:
            raise ConfigError(str(exc), "use batchinfer run for this task") from exc
        err.print(
            f"serving {config.model.task} with {config.model.path} on http://{host}:{port} "
            "(Ctrl-C or SIGTERM: stop taking requests, answer the queued ones, exit)",
            highlight=False,
        )
        settings = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info" if debug else "warning",
            access_log=debug,
            timeout_graceful_shutdown=60,
        )
        # The model and its libraries are ~470,000 objects a full collection walks: 200 ms with MiniLM on a
        # CPU, a pause every request queued then waits out. They live as long as the server: out of the
        # collector's sight (what requests make is still collected).
        gc.collect()
        gc.freeze()
        _graceful_server()(settings).run()


def _graceful_server():
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn, but a drained stop on SIGTERM exits 0 (uvicorn raises the signal again once stopped)."""

        @contextmanager
        def capture_signals(self):
            previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    return GracefulServer


@app.command()
def schema():
    """Print the job file's JSON schema."""
    from .job.config import JobConfig

    print(json.dumps(JobConfig.model_json_schema(), indent=2))


@app.command()
def status(
    folder: str = typer.Argument(..., help="A job's output folder (a path or a URL such as s3://bucket/out)."),
    debug: bool = DebugOption,
):
    """Show how far a job's output folder is: chunks, rows, errors, the run holding it. Changes nothing."""
    from .commands.show import status_lines
    from .output.failures import reach_error
    from .output.status import FolderStatus

    with reported(debug):
        try:
            state = FolderStatus.of_run(folder)
        except OSError as exc:
            raise reach_error(folder, exc, "read", "check the path or URL and the credentials") from exc
        for line in status_lines(state):
            out.print(line, highlight=False)


@app.command()
def export(
    folder: str = typer.Argument(..., help="A finished job's output folder (a path or a URL)."),
    format: str = typer.Option("parquet", "--format", "-f", help="parquet, jsonl or csv."),
    output: str = typer.Option(
        ..., "--output", "-o", metavar="<path>", help="The file to write, outside every output folder."
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace OUTPUT if an earlier export wrote it (a Parquet file whose footer says so)."
    ),
    partial: bool = typer.Option(
        False, "--partial", help="Export what an unfinished folder holds (a --limit trial, a stopped run)."
    ),
    debug: bool = DebugOption,
):
    """Write a finished job's results as one file, in input order (CSV holds lists as JSON text)."""
    from .commands.delivery import results_path
    from .commands.export import export_folder

    with reported(debug):
        output = results_path(output, f".{format}", "")
        done = export_folder(folder, format, output, force, partial)
        what = f"; a partial export: the {done.partial} the folder finished, not the whole job" if done.partial else ""
        if done.errors:
            what += f"; {done.errors:,} rows in error are not in it (they are in {folder.rstrip('/')}/_errors/)"
        err.print(f"wrote {done.rows:,} rows to {output}{what}", highlight=False)


def say_sample_problems(seen: int, reasons: Counter, examples: dict[str, str], ids: str = "") -> None:
    """validate and plan: stop when every row read from the start of the input would fail; warn when some would,
    and when their ids repeat or are null (`ids`: dryrun.id_note)."""
    if ids:
        out.print(labelled("note:", "yellow", ids), highlight=False)
    if not reasons:
        return
    counts = ", ".join(f"{reason} {n:,}" for reason, n in reasons.most_common())
    example = examples[reasons.most_common(1)[0][0]]
    if sum(reasons.values()) == seen:
        raise InputError(
            f"every one of the first {seen:,} rows would go to _errors/ ({counts}), e.g. {example}",
            "check input.text (or input.text_pair, input.messages) against the columns the input has",
        )
    out.print(
        labelled(
            "note:",
            "yellow",
            f"{sum(reasons.values()):,} of the first {seen:,} rows would go to _errors/ ({counts}), e.g. {example}",
        ),
        highlight=False,
    )


def resume_command(words: list[str], overrides: list[str], output: str | None) -> str:
    words = ["batchinfer", *words] + [w for o in overrides for w in ("--set", o)]
    if output:
        words += ["--output", output]
    return shlex.join(words)
