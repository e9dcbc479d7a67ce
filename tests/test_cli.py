"""The command line as users call it: exit codes, one-line errors, no traceback without --debug."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import (
    Crash,
    CrashAfterChunks,
    assert_rows_agree,
    done_chunks,
    make_job,
    ran_in,
    run_cli,
    run_until,
    user_job,
    vectors,
    write_job,
)
from typer.testing import CliRunner

from batchinfer.cli import app
from batchinfer.execution.driver import run_job
from batchinfer.job.config import load_job

runner = CliRunner()


def test_run_validate_status(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["validate", str(job)])
    assert result.exit_code == 0 and "3 shard(s), 600 rows, 6 chunk(s)" in result.output
    result = runner.invoke(app, ["run", str(job), "--set", "batching.max_rows=32"])
    assert result.exit_code == 0, result.output
    assert "600 (600 ok, 0 errors)" in result.output and "padding efficiency" in result.output
    assert "model               BertModel, 2 layers of width 32, " in result.output
    assert ds.dataset(str(tmp_path / "out")).count_rows() == 600
    result = runner.invoke(app, ["status", str(tmp_path / "out")])
    assert result.exit_code == 0 and "6/6 done (complete)" in result.output and "active  no" in result.output


NO_TORCH = """
import sys
from batchinfer.cli import app
try:
    app(sys.argv[1:], prog_name="batchinfer")
except SystemExit as exc:
    print("exit", exc.code, "torch", "torch" in sys.modules)
"""


def test_status_export_and_plan_of_a_finished_job_never_import_torch(tmp_path, sms_parquet, tiny_embed):
    """status answers in well under a second and plan of a finished job in about one: reading a folder, and
    saying that nothing is left, need no model, so no torch (4-8 s)."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    export = ["export", str(tmp_path / "out"), "-o", str(tmp_path / "a.csv")]
    for words in (["status", str(tmp_path / "out")], export, ["plan", str(job)]):
        done = subprocess.run([sys.executable, "-c", NO_TORCH, *words], capture_output=True, text=True, timeout=120)
        assert done.stdout.split()[-4:] == ["exit", "0", "torch", "False"], done.stdout + done.stderr


def test_output_option_and_schema(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["run", str(job), "-q", "--output", str(tmp_path / "other")])
    assert result.exit_code == 0 and (tmp_path / "other" / "_SUCCESS").exists() and not (tmp_path / "out").exists()
    # validate and plan take --output as run does, so a printed resume line pastes into them
    for command in ("validate", "plan"):
        result = runner.invoke(app, [command, str(job), "--output", str(tmp_path / "other")])
        assert result.exit_code == 0, result.output
        assert "holds this job, complete: 6/6 chunks done" in result.output and not (tmp_path / "out").exists()
    schema = json.loads(runner.invoke(app, ["schema"]).output)
    assert set(schema["properties"]) == {"input", "model", "batching", "generation", "output", "runtime", "serve"}


def test_errors_are_one_message_with_a_fix_and_no_traceback(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(tmp_path / "missing", tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["run", str(job)])
    assert result.exit_code == 1
    assert "error: input.path" in result.output and "does not exist" in result.output and "fix:" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["run", str(job), "--debug"])
    assert result.exit_code == 1 and "Traceback" in result.output
    result = runner.invoke(app, ["validate", str(job), "--set", "model.tsk=embed"])
    assert result.exit_code == 2 and "model.tsk: unknown key; did you mean 'task'?" in result.output
    result = runner.invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 1 and "holds no batchinfer run" in result.output


def test_changed_job_names_keys_and_restart(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    result = runner.invoke(app, ["run", str(job), "-q", "--set", "input.text={text}!"])
    assert result.exit_code == 1 and "input.text: 'text' -> '{text}!'" in result.output and "--restart" in result.output
    # a new folder keeps the other job's results, --restart deletes them: the safe fix comes first
    fix = result.output.split("fix:", 1)[1]
    assert fix.index("--output NEW_FOLDER") < fix.index("--restart")
    assert runner.invoke(app, ["run", str(job), "-q", "--set", "input.text={text}!", "--restart"]).exit_code == 0


def test_folder_in_use_is_refused_and_stale_lock_taken_over(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    (tmp_path / "out").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "out" / "_lock").write_text(str(holder.pid))
        result = runner.invoke(app, ["run", str(job), "-q"])
        assert result.exit_code == 1 and f"in use by another batchinfer run (pid {holder.pid})" in result.output
    finally:
        holder.kill()  # kill -9, and not reaped yet: a zombie, as a shell's killed job is until the shell waits
    try:
        assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0  # the holder is dead: take over
    finally:
        holder.wait()
    assert not (tmp_path / "out" / "_lock").exists()


# Ctrl-C here; SIGTERM takes the same handler (tests/test_control.py) and its stop, exit code 143 and resume
# are checked end to end on a Ray run (tests/test_ray.py), which costs no more for it
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130)])
def test_signal_stops_cleanly_and_the_same_command_resumes(tmp_path, sms_parquet, tiny_embed, signum, code):
    # Kernels and batching pinned: what is signalled is a run, not the probe that `auto` starts with.
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, tmp_path / "out", raw=True, model__max_length=64))
    command = ["run", str(job), "--set", "batching.max_rows=1", "--every", "0"]  # a progress line per batch
    stopped = run_until(command, lambda _: done_chunks(tmp_path / "out") > 0, signum)
    output = stopped.output
    assert stopped.returncode == code, output
    assert f"stopped on {signal.Signals(signum).name}" in output and "resume with: batchinfer run" in output
    done = done_chunks(tmp_path / "out")
    assert 1 <= done < 6
    counts = [int(n) for n in re.findall(r" (\d+)/600 rows", output)]
    assert counts == sorted(counts), output  # the rows in flight dropped do not take the count back
    assert f" {done * 100} of 600 rows are committed (kept) in {tmp_path / 'out'}" in output, output
    result = run_cli(command[:2])
    assert result.returncode == 0, result.stderr
    ids = ds.dataset(str(tmp_path / "out")).to_table().column("sms_id").to_pylist()
    assert len(ids) == len(set(ids)) == 600


def _holds(pid: int, path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to see what the run reads")
def test_ctrl_c_during_discovery_of_a_large_jsonl_stops_at_once(tmp_path, sms_table, tiny_embed):
    texts = sms_table.column("text").to_pylist()
    block = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)).encode()
    shard = tmp_path / "rows.jsonl"
    shard.write_bytes(block * (60_000_000 // len(block)))  # 60 MB: seconds to discover, every line parsed
    job = write_job(
        tmp_path,
        input={"path": str(shard), "text": "text", "id": "id"},
        model={"path": str(tiny_embed), "task": "embed", "max_length": 64},
        output={"path": str(tmp_path / "out")},
    )
    stopped = run_until(["run", str(job)], lambda proc: _holds(proc.pid, shard), signal.SIGINT, timeout=60)
    said = stopped.output
    assert stopped.returncode == 130 and stopped.seconds < 2, said  # was discovery, load, a batch
    assert "stopped on SIGINT" in said and "resume with: batchinfer run" in said
    assert not (tmp_path / "out").exists()  # stopped before the output folder was touched


SLOW_BATCH = """
import time
from pathlib import Path
from batchinfer.runners.base import EncoderRunner

run, busy, done = EncoderRunner.run, Path(BUSY), Path(OUT) / "_done"

def slow(self, ids):
    if not busy.exists() and done.exists() and any(done.iterdir()):  # after a chunk: a batch of a minute
        busy.touch()
        time.sleep(60)
    return run(self, ids)

EncoderRunner.run = slow
"""


# Ctrl-C twice, the usual second signal; SIGTERM takes the same handler (tests/test_control.py)
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130)])
def test_a_second_signal_exits_at_once_and_the_same_command_resumes(tmp_path, sms_parquet, tiny_embed, signum, code):
    job = write_job(
        tmp_path,
        input={"path": str(sms_parquet / "part-0.parquet"), "text": "text", "id": "sms_id"},
        model={"path": str(tiny_embed), "task": "embed", "max_length": 64, "backend": "torch"},  # a run, not a probe
        batching={"chunk_rows": 100, "max_rows": 50, "max_tokens": 4096, "strategy": "padded"},
        output={"path": str(tmp_path / "out")},
    )
    busy = tmp_path / "busy"
    stopped = run_until(
        ["run", str(job)],
        lambda _: busy.exists(),
        (signum, signum),  # the first waits for the batch in flight
        prelude=f"BUSY, OUT = {str(busy)!r}, {str(tmp_path / 'out')!r}\n{SLOW_BATCH}",
    )
    said = stopped.output
    assert stopped.alive == [True, True]
    assert stopped.returncode == code and stopped.seconds < 2, said
    assert f"stopped at once on a second {signal.Signals(signum).name}" in said and "resume with:" in said
    out = tmp_path / "out"
    assert done_chunks(out) == 1
    for part in out.glob("part-*.parquet"):  # nothing half-written under a final name
        ds.dataset(str(part)).to_table()
    for marker in out.glob("_done/*.json"):
        json.loads(marker.read_text())
    result = run_cli(["run", str(job), "-q"])
    assert result.returncode == 0, result.stderr
    ids = ds.dataset(str(out)).to_table().column("sms_id").to_pylist()
    assert len(ids) == len(set(ids)) == 200


def test_status_changes_nothing_and_explains_a_damaged_report(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    out = tmp_path / "out"
    (out / "_report.json").write_text('{"rows": 6')  # damaged
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    result = runner.invoke(app, ["status", str(out)])
    assert (
        result.exit_code == 0 and "6/6 done (complete)" in result.output and "_report.json is damaged" in result.output
    )
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == before
    result = runner.invoke(app, ["run", str(job), "-q"])  # what status said a run does
    assert result.exit_code == 1 and "_report.json" in result.output
    (out / "_report.json").unlink()
    (out / "_done" / "00000-00001.json").write_text("{")
    result = runner.invoke(app, ["status", str(out)])
    assert "5/6 done" in result.output and "(complete)" not in result.output
    assert "damaged _done/00000-00001.json" in result.output
    result = runner.invoke(app, ["run", str(job), "-q"])
    assert result.exit_code == 1 and "_done/00000-00001.json" in result.output
    (out / "_batchinfer.json").write_text("{")
    result = runner.invoke(app, ["status", str(out)])
    assert result.exit_code == 1 and "damaged: " in result.output and "Traceback" not in result.output


def test_status_of_a_moved_folder_says_to_go_on_in_that_folder(tmp_path, sms_parquet, tiny_embed):
    import shutil

    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    first = tmp_path / "first"
    assert runner.invoke(app, ["run", str(job), "-q", "--limit", "150", "--output", str(first)]).exit_code == 0
    said = " ".join(runner.invoke(app, ["status", str(first)]).output.split())
    assert f"go on batchinfer run {job} --output {first} (the whole job)" in said, said
    shutil.move(first, tmp_path / "moved")
    said = " ".join(runner.invoke(app, ["status", str(tmp_path / "moved")]).output.split())
    assert f"go on batchinfer run {job} --output {tmp_path / 'moved'} (the whole job)" in said, said


def test_an_output_path_linking_to_nothing_says_so(tmp_path, sms_parquet, tiny_embed):
    (tmp_path / "out").symlink_to(tmp_path / "gone")
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    said = " ".join(runner.invoke(app, ["run", str(job), "-q"]).output.split())
    assert f"output.path {tmp_path / 'out'} is a link to {tmp_path / 'gone'}, which does not exist" in said, said
    assert "fix: create the folder the link points to" in said


def test_status_knows_the_total_before_the_first_chunk(tmp_path, sms_parquet, tiny_embed):
    from batchinfer.output.checkpoint import Checkpoint

    with Checkpoint.open(tmp_path / "out") as out:
        out.start({}, restart=False, extent={"chunks": 6, "rows": 600})
        result = runner.invoke(app, ["status", str(tmp_path / "out")])
    assert "chunks  0/6 done" in result.output and f"active  yes, pid {os.getpid()}" in result.output


def test_the_report_and_summary_give_the_whole_jobs_rate_over_its_runs(tmp_path, sms_parquet, tiny_embed):
    """`run` is the last invocation's; `job` counts every run that committed chunks, from each one's start to its
    last commit (a --limit trial and the rest here; a Ctrl-C and a resume alike), and the summary says it."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))  # 600 rows, chunks of 100
    assert runner.invoke(app, ["run", str(job), "--limit", "200", "--progress", "none"]).exit_code == 0
    first = json.loads((tmp_path / "out" / "_report.json").read_text())
    assert first["job"]["runs"] == 1 and first["job"]["rows"] == 200 and first["run"]["rows"] == 200
    result = runner.invoke(app, ["run", str(job), "--progress", "none"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "_report.json").read_text())
    whole = report["job"]
    assert report["run"]["rows"] == 400 and whole["runs"] == 2 and whole["rows"] == 600
    assert whole["seconds"] > first["job"]["seconds"] and whole["rows_per_s"] == round(600 / whole["seconds"], 1)
    assert f"whole job           600 rows in {whole['seconds']:.1f} s of 2 runs" in result.output
    assert "600 (600 ok, 0 errors)" in result.output


def test_one_rate_rows_over_the_wall_seconds_of_what_each_line_names(tmp_path, sms_parquet, tiny_embed):
    """The run's rate is its rows over its seconds (start-up included) in the report, the summary and the progress
    lines alike; the rate over the processing loop alone is the compute rate, and says so."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))  # 600 rows
    result = runner.invoke(app, ["run", str(job), "--every", "0"])
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "out" / "_report.json").read_text())["run"]
    # (the report rounds seconds to 3 places after dividing: a tenth of a per cent on a fast run)
    assert run["rows_per_s"] == pytest.approx(600 / run["seconds"], rel=0.005), run
    assert run["compute"]["rows_per_s"] == pytest.approx(600 / run["compute"]["seconds"], rel=0.005)
    assert run["compute"]["seconds"] < run["seconds"]
    assert f"600 rows in {run['seconds']:.1f} s on cpu: {run['rows_per_s']:,.1f} rows/s, " in result.output
    assert f"computing           {run['compute']['rows_per_s']:,.1f} rows/s over the " in result.output
    assert "throughput" not in result.output  # no third, unnamed rate
    last = next(line for line in reversed(result.stderr.splitlines()) if "600/600 rows" in line)
    shown = float(last.split(" rows/s and ")[0].rsplit(" ", 1)[1].replace(",", ""))
    # Since the same start: a line counted from after the start-up (1.7 s of this 2.1 s run) would say 4-5x. What
    # the run does after its last line (the report, _SUCCESS) is in its seconds alone: under a busy suite, over 5%.
    assert run["rows_per_s"] * 0.8 <= shown <= run["rows_per_s"] * 1.25, (last, run)


def test_the_summary_counts_one_error_in_the_singular(tmp_path, tiny_embed):
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["one", "  ", "three"]}), tmp_path / "rows.parquet")
    job = make_job(tmp_path / "rows.parquet", tiny_embed, tmp_path / "out", input__id="id", input__keep=None, raw=True)
    result = runner.invoke(app, ["run", str(write_job(tmp_path, job)), "--progress", "none"])
    assert result.exit_code == 0 and "3 (2 ok, 1 error)" in result.output, result.output


def test_limit_runs_the_first_rows_and_the_full_job_continues_it(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))  # 600 rows, chunks of 100
    result = runner.invoke(app, ["run", str(job), "--limit", "250", "--progress", "none"])
    assert result.exit_code == 0 and "the first 250 rows (--limit)" in result.output
    limited = ds.dataset(str(tmp_path / "out")).to_table()
    assert limited.num_rows == 250 and not (tmp_path / "out" / "_SUCCESS").exists()
    result = runner.invoke(app, ["run", str(job), "-q"])  # the rest, and chunk 00001-00000 again in full
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["run", str(job), "-q", "--output", str(tmp_path / "whole")]).exit_code == 0
    resumed, whole = ds.dataset(str(tmp_path / "out")).to_table(), ds.dataset(str(tmp_path / "whole")).to_table()
    assert resumed.column("sms_id").to_pylist() == whole.column("sms_id").to_pylist()
    # batching and backend auto, probed on each run's own first chunk: 1e-5 in f32, bf16's bound where it ran
    precisions = (ran_in(tmp_path / "out"), ran_in(tmp_path / "whole"))
    assert_rows_agree(vectors(resumed, "embedding"), vectors(whole, "embedding"), precisions, 1e-5)
    result = runner.invoke(app, ["run", str(job)])
    assert result.exit_code == 0 and "already complete: 600 rows" in result.output and "--restart" in result.output
    before = {name: (tmp_path / "out" / name).read_bytes() for name in ("_batchinfer.json", "_SUCCESS")}
    report = json.loads((tmp_path / "out" / "_report.json").read_text())
    result = runner.invoke(app, ["run", str(job), "--limit", "5"])  # never narrows what the folder holds
    assert result.exit_code == 0 and "already complete: 600 rows" in result.output
    assert before == {name: (tmp_path / "out" / name).read_bytes() for name in before}
    result = runner.invoke(app, ["run", str(job), "-q", "--set", "output.format=jsonl"])  # nothing to run
    after = json.loads((tmp_path / "out" / "_report.json").read_text())
    assert after["run"] == report["run"] and after["device"] == report["device"]  # the real run's figures kept
    assert after["_results.jsonl"] == 600 and "limit" not in after  # the totals of now


@pytest.mark.parametrize("limit", ["600", "10000000000000000000000"])
def test_a_limit_that_reaches_the_last_row_finishes_the_job(tmp_path, sms_parquet, tiny_embed, limit):
    """A limit of every row, or past them, ran every chunk and left the job unfinished: no _SUCCESS, and export
    refused the folder as one that would miss rows."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))  # 600 rows
    assert runner.invoke(app, ["run", str(job), "--limit", limit, "-q"]).exit_code == 0
    assert (tmp_path / "out" / "_SUCCESS").exists()
    assert "limit" not in json.loads((tmp_path / "out" / "_report.json").read_text())
    exported = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(tmp_path / "all.parquet")])
    assert exported.exit_code == 0 and pq.read_table(tmp_path / "all.parquet").num_rows == 600, exported.output


def test_the_full_run_keeps_the_trials_rows_of_the_chunk_its_limit_cut(tmp_path, sms_parquet, tiny_embed):
    """After `run --limit 250` (chunks of 100: the third cut at 50 rows), plan and the full run count the 250 rows
    as done; the cut chunk's trial part is kept as it is, its other 50 rows run as a piece of their own, and the
    folder reads as one run of the whole job would write it."""
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, tmp_path / "out", raw=True))  # batching pinned
    assert runner.invoke(app, ["run", str(job), "--limit", "250", "-q"]).exit_code == 0
    out = tmp_path / "out"
    trial = {p.name: p.read_bytes() for p in out.glob("part-*.parquet")}
    assert len(trial) == 3
    plan = runner.invoke(app, ["plan", str(job), "--sample", "60"]).output
    assert "for 350 rows left: " in plan, plan
    result = runner.invoke(app, ["run", str(job), "--progress", "lines"])
    assert result.exit_code == 0, result.output
    assert "started: 350 rows to run (250 done before)" in result.stderr, result.stderr
    assert {name: (out / name).read_bytes() for name in trial} == trial  # the trial's parts, untouched
    assert (out / "part-00001-00000_0000050.parquet").exists()
    assert runner.invoke(app, ["run", str(job), "-q", "--output", str(tmp_path / "whole")]).exit_code == 0
    ours, whole = ds.dataset(str(out)).to_table(), ds.dataset(str(tmp_path / "whole")).to_table()
    assert ours.column("sms_id").to_pylist() == whole.column("sms_id").to_pylist()
    assert_rows_agree(vectors(ours, "embedding"), vectors(whole, "embedding"), ("f32", "f32"), 1e-5)
    status = runner.invoke(app, ["status", str(out)]).output
    assert "rows    600/600 done (100.0%)" in status and "(complete)" in status, status


def test_validate_and_plan_count_the_pieces_of_chunks_limits_cut_as_status_does(tmp_path, sms_parquet, tiny_embed):
    """Each --limit that ends inside a chunk leaves its rest to run as a piece: validate and plan counted those
    pieces against the job's uncut chunks ("complete: 7/6 chunks done" with 150 rows left, "9/6" when finished),
    and status counted the whole job as planned before the last --limit cut its chunk (7/8 where validate's input
    line and the next run say 9)."""
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, tmp_path / "out", raw=True))  # 600 rows, 100 a chunk
    for limit in ("250", "333", "450"):
        assert runner.invoke(app, ["run", str(job), "--limit", limit, "-q"]).exit_code == 0
    status = runner.invoke(app, ["status", str(tmp_path / "out")]).output
    assert "chunks  7/9 done (--limit 450" in status, status
    validate = runner.invoke(app, ["validate", str(job)]).output
    assert "600 rows, 9 chunk(s)" in validate and "holds this job: 7/9 chunks done; the run resumes" in validate
    plan = runner.invoke(app, ["plan", str(job), "--limit", "450"]).output
    assert "holds this job: 7/9 chunks done; a run with --limit 450 has nothing left to do" in plan, plan
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    assert "chunks  9/9 done (complete)" in runner.invoke(app, ["status", str(tmp_path / "out")]).output
    for command in (["validate", str(job)], ["plan", str(job), "--sample", "60"]):
        said = runner.invoke(app, command).output
        assert "holds this job, complete: 9/9 chunks done; a run has nothing left to do" in said, said
    assert "600 rows, 9 chunk(s)" in runner.invoke(app, ["validate", str(job)]).output  # as plan and a run plan them


def test_validate_counts_a_changed_jobs_own_chunks_in_a_folder_it_takes_over(tmp_path, sms_parquet, tiny_embed):
    """A run killed before its first chunk finished leaves a folder the next run takes over, whatever changed:
    validate counted the new job's progress against the old job's chunks (0/6 where the job now has 12)."""
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, tmp_path / "out", raw=True))  # 600 rows, 100 a chunk

    class KilledAtStart(CrashAfterChunks):
        def start(self, total_rows, done_rows, since):
            raise Crash()

    with pytest.raises(Crash):
        run_job(load_job(job), progress=KilledAtStart(1))
    assert not done_chunks(tmp_path / "out")
    validate = runner.invoke(app, ["validate", str(job), "--set", "batching.chunk_rows=50"]).output
    assert "holds this job: 0/12 chunks done; the run resumes" in validate, validate


def test_progress_lines_when_the_output_is_not_a_terminal(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["run", str(job), "--every", "0"])  # stderr is no terminal, as under nohup or cron
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if " rows/s and " in line and " left" in line]
    assert len(lines) >= 6 and lines[-1].split(" ", 2)[2].startswith("600/600 rows (100.0%)")
    assert sum("600/600 rows" in line for line in lines) == 1  # the end is said once
    assert "started: 600 rows to run" in result.stderr and "━" not in result.stderr  # no bar drawn into a log


def test_version():
    from batchinfer import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"batchinfer {__version__}"


def test_plan_says_what_a_job_will_do_and_writes_nothing(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["plan", str(job), "--sample", "120"])
    assert result.exit_code == 0, result.output
    assert "3 shard(s), 600 rows, 6 chunk(s) of 100 rows" in result.output
    assert f"model    {tiny_embed}: BertModel, 2 layers of width 32, " in result.output
    assert (
        "tokens   about" in result.output
        and "padding efficiency" in result.output
        and "time     about" in result.output
    )
    assert "output" in result.output and "a new folder" in result.output
    assert not (tmp_path / "out").exists()


def test_plan_with_limit_plans_the_trial_that_run_with_the_same_limit_runs(tmp_path, sms_parquet, tiny_embed):
    """`plan --limit N` samples and times the job's first N rows alone, as `run --limit N` runs them, and sees what
    that trial left in the folder; the same plan without --limit counts the rest (the trial's rows are kept, those
    of the chunk the limit cut short too)."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))  # 600 rows, 100 a chunk
    result = runner.invoke(app, ["plan", str(job), "--limit", "150", "--sample", "400"])
    assert result.exit_code == 0, result.output
    assert "3 shard(s), 150 rows, 2 chunk(s) of 100 rows (--limit 150: the job's first rows)" in result.output
    assert "from 150 sampled rows" in result.output and "for 150 rows:" in result.output
    assert runner.invoke(app, ["run", str(job), "-q", "--limit", "150"]).exit_code == 0
    result = runner.invoke(app, ["plan", str(job), "--limit", "150"])
    assert result.exit_code == 0 and "nothing left to run" in result.output, result.output
    result = runner.invoke(app, ["plan", str(job), "--sample", "60"])
    assert result.exit_code == 0 and "for 450 rows left:" in result.output, result.output


def test_plan_samples_as_many_rows_as_the_first_chunk_holds_so_its_probe_cuts_slices_as_the_runs(
    tmp_path, sms_table, tiny_embed
):
    """By default plan reads the first chunk's rows (2,000 at least): its probe's slices are then the size the run's
    probe of that chunk cuts, not a 2,000-row sample's, whose slices fit one batch of the larger budgets."""
    from batchinfer.commands.dryrun import estimate_job

    pq.write_table(sms_table.slice(0, 5000), tmp_path / "sms.parquet")
    for chunk_rows, sampled in ((2500, 2500), (500, 2000)):
        job = make_job(tmp_path / "sms.parquet", tiny_embed, tmp_path / "out", batching__chunk_rows=chunk_rows)
        assert estimate_job(job, timed=False)["sampled_rows"] == sampled


def test_validate_reads_the_head_and_the_output_folder_and_a_failed_run_leaves_no_trap(
    tmp_path, sms_parquet, tiny_embed
):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["validate", str(job), "--set", "model.task=classify"])
    assert result.exit_code == 1 and "needs a sequence-classification head" in result.output
    result = runner.invoke(app, ["run", str(job), "-q", "--set", "model.task=classify"])
    assert result.exit_code == 1 and "needs a sequence-classification head" in result.output
    assert not (tmp_path / "out").exists()  # nothing written that could refuse the corrected job
    assert runner.invoke(app, ["run", str(job), "-q", "--limit", "100"]).exit_code == 0
    result = runner.invoke(app, ["validate", str(job)])
    assert result.exit_code == 0 and "holds this job: 1/6 chunks done" in result.output
    result = runner.invoke(app, ["validate", str(job), "--set", "model.max_length=32"])
    assert "different job" in result.output and "model.max_length: 64 -> 32" in result.output
    assert result.output.index("--output NEW_FOLDER") < result.output.index("--restart")  # keeping them first
    result = runner.invoke(app, ["run", str(job), "-q", "--set", "model.max_length=32"])
    assert result.exit_code == 1 and "model.max_length: 64 -> 32" in result.output
    assert "limit: " not in result.output  # dropping --limit continues a job; it is not what refuses it
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    result = runner.invoke(app, ["validate", str(job)])
    assert "holds this job, complete: 6/6 chunks done" in result.output
    (tmp_path / "out" / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["validate", str(job)])
    assert result.exit_code == 1 and "notes.txt" in result.output


def test_a_run_that_adds_rows_leaves_no_file_holding_fewer_of_them(tmp_path, sms_parquet, tiny_embed):
    """_results.jsonl holds the folder's rows when written: a trial's 250, then a run stopped part-way, or one
    whose output.format no longer writes it, must not leave those 250 beside more rows."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out", output__format="jsonl"))
    results = tmp_path / "out" / "_results.jsonl"
    assert runner.invoke(app, ["run", str(job), "-q", "--limit", "250"]).exit_code == 0
    assert len(results.read_text().splitlines()) == 250
    with pytest.raises(Crash):  # the full run stopped after a chunk more
        run_job(load_job(job), progress=CrashAfterChunks(1))
    assert not results.exists()  # the folder holds more rows than it said: gone, not stale
    result = runner.invoke(app, ["run", str(job), "-q", "--set", "output.format=parquet"])
    assert result.exit_code == 0 and not results.exists(), result.output  # a format that writes none: none
    assert runner.invoke(app, ["run", str(job), "-q", "--restart"]).exit_code == 0
    assert len(results.read_text().splitlines()) == 600


def test_jsonl_output_holds_every_result_row_in_input_order(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out", output__format="jsonl"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "_results.jsonl").read_text().splitlines()]
    table = ds.dataset(str(tmp_path / "out")).to_table()
    assert [r["sms_id"] for r in rows] == table.column("sms_id").to_pylist() and len(rows) == 600
    assert rows[0]["embedding"] == table.column("embedding").to_pylist()[0]
    assert runner.invoke(app, ["run", str(job), "-q", "--restart"]).exit_code == 0  # its own file: replaced


def test_jsonl_results_and_export_are_strict_json_where_a_kept_column_holds_nan_or_infinity(tmp_path, tiny_embed):
    """Python's json wrote a kept float's NaN and infinity as NaN and Infinity: no JSON parser but Python's reads
    them. They are null, and the other values as they were."""
    data = tmp_path / "data"
    data.mkdir()
    weights = [1.5, float("nan"), float("inf"), -float("inf"), None, 2.0]
    pq.write_table(pa.table({"text": [f"message {i}" for i in range(6)], "w": weights}), data / "a.parquet")
    config = make_job(
        data, tiny_embed, tmp_path / "out", input__id=None, input__keep=["w"], output__format="jsonl", raw=True
    )
    job = write_job(tmp_path, config)
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    exported = runner.invoke(app, ["export", str(tmp_path / "out"), "-f", "jsonl", "-o", str(tmp_path / "all.jsonl")])
    assert exported.exit_code == 0, exported.output

    def strict(text: str) -> list:
        return [json.loads(line, parse_constant=lambda name: pytest.fail(name)) for line in text.splitlines()]

    for written in (tmp_path / "out" / "_results.jsonl", tmp_path / "all.jsonl"):
        rows = strict(written.read_text())
        assert [r["w"] for r in rows] == [1.5, None, None, None, None, 2.0] and len(rows[0]["embedding"]) == 32


def test_an_output_that_holds_the_input_or_lies_in_another_jobs_output_is_refused_by_name(
    tmp_path, sms_parquet, tiny_embed
):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    for command in ("validate", "plan", "run"):
        for output, said in [(sms_parquet, "holds the input"), (tmp_path, "holds the input"), ("/", "root folder")]:
            result = runner.invoke(app, [command, str(job), "--set", f"output.path={output}"])
            assert result.exit_code == 1 and said in result.output, (command, output, result.output)
            assert "holds no .parquet" not in result.output and "Traceback" not in result.output
    assert runner.invoke(app, ["run", str(job), "-q", "--limit", "100"]).exit_code == 0
    result = runner.invoke(app, ["run", str(job), "-q", "--output", str(tmp_path / "out" / "inner")])
    assert result.exit_code == 1 and "inside" in result.output and "another batchinfer job" in result.output
    assert not (tmp_path / "out" / "inner").exists()
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0  # the outer job still resumes


def test_status_counts_bad_csv_records_and_skipped_shards(tmp_path, tiny_embed):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("id,text\n1,ok\n2,too,many,fields\n3,fine\n")
    (data / "b.parquet").write_bytes(b"")  # not Parquet at all: left out with on_bad_shard: skip
    job = write_job(
        tmp_path,
        input={"path": str(data), "text": "text", "id": "id", "on_bad_shard": "skip"},
        model={"path": str(tiny_embed), "task": "embed", "max_length": 32},
        output={"path": str(tmp_path / "out")},
    )
    result = runner.invoke(app, ["run", str(job), "-q"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["status", str(tmp_path / "out")])
    assert "errors  bad_csv 1\n" in result.output, result.output  # as _report.json counts them
    assert "skipped 1 shard(s) (input.on_bad_shard: skip): b.parquet" in result.output


def test_validate_and_plan_stop_a_job_whose_every_row_would_fail(tmp_path, tiny_embed):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"n": [1, 2, 3], "title": ["a", None, "c"]}), data / "a.parquet")
    (data / "b.jsonl").write_text('{"n": 4, "title": "d"}\n{"n": 5.5, "title": "e"}\n')
    (data / "0-empty.jsonl").write_text("")  # first in order: the check reads on past it
    job = write_job(
        tmp_path,
        input={"path": str(data), "text": "n"},
        model={"path": str(tiny_embed), "task": "embed", "max_length": 32},
        output={"path": str(tmp_path / "out")},
    )
    for command in ("validate", "plan"):
        result = runner.invoke(app, [command, str(job)])
        assert result.exit_code == 1, result.output
        assert "every one of the first 5 rows would go to _errors/ (not_text 5)" in result.output
        assert "a.parquet: column 'n' is int64, not text (a template such as '{n}' writes it as text)" in result.output
        result = runner.invoke(app, [command, str(job), "--set", "input.text={n}: {title}"])
        assert result.exit_code == 0 and "1 of the first 5 rows would go to _errors/ (null_text 1)" in result.output
    assert runner.invoke(app, ["run", str(job), "-q", "--set", "input.text={n}: {title}"]).exit_code == 0
    assert ds.dataset(str(tmp_path / "out")).to_table().num_rows == 4  # the null title is the one error row


def test_an_unknown_url_scheme_is_one_message():
    result = runner.invoke(app, ["status", "weird://bucket/out"])
    assert result.exit_code == 2 and "no filesystem for the scheme weird://" in result.output
    assert "internal error" not in result.output


def test_validate_says_when_the_device_asked_for_is_not_here(tmp_path, sms_parquet, tiny_embed):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["validate", str(job), "--set", "model.device=cuda"])
    assert result.exit_code == 1 and "no CUDA GPU is visible" in result.output


def test_an_output_path_that_is_a_file_and_brackets_in_messages(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    shard = sorted(sms_parquet.iterdir())[0]
    before = shard.read_bytes()
    for command in ("validate", "plan", "run"):
        result = runner.invoke(app, [command, str(job), "--set", f"output.path={shard}"])
        assert result.exit_code == 1 and "is a file" in result.output and "internal error" not in result.output
        result = runner.invoke(app, [command, str(job), "--set", f"output.path={shard}/out"])  # below a file
        assert result.exit_code == 1 and "internal error" not in result.output, result.output
    assert shard.read_bytes() == before
    odd = tmp_path / "[/b]"  # read as a closing markup tag, this crashed the error printer
    odd.mkdir(parents=True)
    result = runner.invoke(app, ["status", str(odd)])
    assert result.exit_code == 1 and f"{odd} holds no batchinfer run" in result.output
    result = runner.invoke(app, ["validate", str(job), "--set", "input.text=[red]x"])
    assert "input.text: no column '[red]x' in the input" in result.output


def test_a_committed_part_that_vanished_is_not_complete_and_runs_again(tmp_path, sms_parquet, tiny_embed):
    """The probe deleted one part of a finished job: the rerun said 'already complete', rewrote _SUCCESS,
    and status said every row was done, over a folder 100 rows short."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    out = tmp_path / "out"
    (out / "part-00001-00000.parquet").unlink()
    result = runner.invoke(app, ["status", str(out)])
    assert result.exit_code == 0 and "5/6 done" in result.output and "(complete)" not in result.output
    assert "chunk 00001-00000: part-00001-00000.parquet is missing" in result.output
    result = runner.invoke(app, ["run", str(job)])
    assert result.exit_code == 0, result.output
    assert "part-00001-00000.parquet is missing: chunk 00001-00000 runs again" in result.output
    assert ds.dataset(str(out)).count_rows() == 600 and (out / "_SUCCESS").exists()
    assert "6/6 done (complete)" in runner.invoke(app, ["status", str(out)]).output


def test_help_shows_brackets_and_flags_as_typed():
    serve = runner.invoke(app, ["serve", "--help"], terminal_width=200).output
    assert 'pip install -e ".[serve]"' in serve
    usage = runner.invoke(app, ["run", "--help"], terminal_width=200).output
    flags = {line.split()[0]: line for line in usage.splitlines() if line.strip().startswith("--")}
    for flag in ("--restart", "--retry-errors", "--debug"):
        assert flags[flag].split()[1][0] not in "<[", flags[flag]  # `--restart  Discard ...`, not `--restart <bool>`
    assert "--set KEY=VALUE" in usage and "--limit <int range>" in usage


def test_plan_of_a_partly_done_folder_estimates_what_is_left_at_the_folders_rate(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))  # 600 rows, chunks of 100
    assert runner.invoke(app, ["run", str(job), "--limit", "100", "-q"]).exit_code == 0
    result = runner.invoke(app, ["plan", str(job), "--sample", "60"])  # the probe's chunk alone: no rate to go by
    assert "for 500 rows left: " in result.output and "of work at " in result.output, result.output
    assert runner.invoke(app, ["run", str(job), "--limit", "300", "-q"]).exit_code == 0  # 200 rows, 2 chunks
    report = json.loads((tmp_path / "out" / "_report.json").read_text())
    assert set(report["run"]["machine"]) == {"cores", "other_cores", "steal_cores", "load_avg"}
    rate = report["run"]["compute"]["rows_per_s"]  # start-up is plan's own line
    result = runner.invoke(app, ["plan", str(job), "--sample", "60"])
    assert result.exit_code == 0, result.output
    time_line = next(line for line in result.output.splitlines() if line.startswith("time "))
    assert "for 300 rows left: " in time_line and " start-up (imports, discovery and model load" in time_line
    assert f"at {rate:,.1f} rows/s, the compute rate the folder's last run measured" in time_line
    assert "batching probe" not in time_line  # the folder recorded the probe's choice: no second probe
    assert "the probe's choice, recorded in the output folder" in result.output


def test_plan_of_a_finished_job_answers_without_loading_the_model(tmp_path, sms_parquet, tiny_embed, monkeypatch):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0

    def no_load(*args, **kwargs):
        raise AssertionError("plan loaded the model of a finished job")

    monkeypatch.setattr("batchinfer.execution.chunk_task.TaskInputs.task", no_load)
    monkeypatch.setattr("batchinfer.commands.dryrun.sample_problems", no_load)
    result = runner.invoke(app, ["plan", str(job)])
    assert result.exit_code == 0, result.output
    assert "time     nothing left to run: the output folder holds every row of this job" in result.output
    assert "holds this job, complete: 6/6 chunks done" in result.output and "tokens   about" not in result.output


def test_plan_tokenizes_the_sample_alone_and_times_a_bounded_part_of_it(tmp_path, sms_parquet, tiny_embed, monkeypatch):
    """plan of a million rows takes seconds: it reads the row counts, tokenizes --sample rows and runs about
    TIMED_TOKENS of them on the model (the probe's slices, then those again), however large the sample."""
    from batchinfer.commands import sample_timing
    from batchinfer.runners.base import EncoderRunner

    tokenized, computed = [], []
    tokenize, run = EncoderRunner.tokenize, EncoderRunner.run

    def counting_tokenize(self, texts):
        tokenized.append(len(texts))
        return tokenize(self, texts)

    def counting_run(self, ids):
        computed.append(sum(len(row) for row in ids))
        return run(self, ids)

    monkeypatch.setattr(EncoderRunner, "tokenize", counting_tokenize)
    monkeypatch.setattr(EncoderRunner, "run", counting_run)
    monkeypatch.setattr(sample_timing, "TIMED_TOKENS", 300)
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))  # 600 rows, about 15,000 tokens
    result = runner.invoke(app, ["plan", str(job), "--sample", "400"])
    assert result.exit_code == 0, result.output
    assert "from 396 sampled rows" in result.output
    timed, warm = re.search(
        r"the model on ([\d,]+) tokens of the sample after a warm-up batch of ([\d,]+);", result.output
    ).groups()
    assert int(timed) + int(warm) == 289  # the timed part, its first batch a warm-up not counted
    assert sum(tokenized) <= 2 * 400  # the sample's rows (by the chunk task, then as one chunk), not the job's
    assert sum(computed) <= 2 * 300 + 2 * 8 * 64  # twice the timed part, and two warm-ups of 8 rows (max_length 64)


def test_plan_rates_the_model_after_a_warm_up_batch_and_hides_reading_behind_it(
    tmp_path, sms_parquet, tiny_embed, monkeypatch
):
    """plan's rate leaves out the first batch cut with the chosen setting (a run warms up once, in its first
    chunk), and both executors read the next chunk while the model runs this one: the work is the slower of the
    two, plus the first chunk's reading, not their sum."""
    from batchinfer.commands.dryrun import estimate_job
    from batchinfer.runners.base import EncoderRunner

    calls = []  # (tokens, seconds) of each batch the model ran: first calls, the warm-up batch, the timed ones
    run = EncoderRunner.run

    def timed_run(self, ids):
        t0 = time.perf_counter()
        if len(calls) == 1:
            time.sleep(0.5)  # the warm-up batch: slow, as a first batch at a new shape is
        out = run(self, ids)
        calls.append((sum(len(row) for row in ids), time.perf_counter() - t0))
        return out

    monkeypatch.setattr(EncoderRunner, "run", timed_run)
    job = make_job(sms_parquet, tiny_embed, tmp_path / "out", batching__max_tokens=1024)  # 600 rows, 100 a chunk
    summary = estimate_job(job, sample=400)
    e = summary["estimate"]
    assert e["probe_s"] is None and len(calls) > 3  # batching pinned: no probe, and several timed batches
    assert e["warmup_tokens"] == calls[1][0] and e["timed_tokens"] == sum(tokens for tokens, _ in calls[2:])
    assert e["tokens_per_s"] == pytest.approx(e["timed_tokens"] / sum(s for _, s in calls[2:]), rel=0.3)
    tokens = summary["tokens_per_row"]["mean"] * summary["rows"]
    model, read = tokens / e["tokens_per_s"], tokens / e["read_tokens_per_s"]
    assert e["work_s"] == pytest.approx(max(model, read) + read * 100 / 600, rel=1e-3)


def test_a_slow_models_plan_rates_it_at_a_runs_batch_through_two_batches_of_its_sample(
    tmp_path, sms_parquet, tiny_embed, monkeypatch
):
    """A slow model is timed on a few rows, a batch far smaller than the run's: where each batch pays a fixed
    cost (on a CPU other processes share, each layer's call waiting for its threads) their own rate makes the
    model look several times slower than the run's large batches run it. On a busy machine plan times them as
    two batches and rates the model at a run's batch through the line they give."""
    from batchinfer.commands import sample_timing
    from batchinfer.commands.dryrun import estimate_job
    from batchinfer.runners.base import EncoderRunner

    calls, run = [], EncoderRunner.run

    def run_paying_a_fixed_cost(self, ids):
        t0 = time.perf_counter()
        padded = len(ids) * max(len(row) for row in ids)
        time.sleep(0.2 + padded * 5e-4)  # a fixed cost a batch, and one a token the tiny model's noise cannot tilt
        out = run(self, ids)
        calls.append((padded, time.perf_counter() - t0, sum(len(row) for row in ids)))
        return out

    monkeypatch.setattr(EncoderRunner, "run", run_paying_a_fixed_cost)
    monkeypatch.setattr(sample_timing, "TIMED_TOKENS", 600)
    job = make_job(sms_parquet, tiny_embed, tmp_path / "out", batching__max_tokens=16384)  # 600 rows, 100 a chunk
    monkeypatch.setattr(sample_timing, "busy", lambda: False)  # a quiet machine: the timed batches' own rate
    assert estimate_job(job, sample=400)["estimate"]["run_batch_tokens"] is None
    monkeypatch.setattr(sample_timing, "busy", lambda: True)
    e = estimate_job(job, sample=400)["estimate"]
    (small, s1, real1), (large, s2, real2) = calls[-2:]  # the timed rows, as two batches (tokens computed)
    assert small < large and real1 + real2 == e["timed_tokens"]
    own = e["timed_tokens"] / (s1 + s2)
    per_token = (s2 - s1) / (large - small)
    at_a_run = e["run_batch_tokens"] / (s1 - per_token * small + per_token * e["run_batch_tokens"])
    assert e["tokens_per_s"] == pytest.approx(at_a_run, rel=0.1) and e["tokens_per_s"] > 2 * own


def test_plan_says_when_the_machine_was_busy_and_counts_the_probe(monkeypatch, tmp_path, sms_parquet, tiny_embed):
    from batchinfer.commands import sample_timing
    from batchinfer.machine import Load

    class Busy:
        def stop(self):
            return Load(5.0, others=1.5, steal=0.0, cores=2, load_avg=3.5)

    monkeypatch.setattr(sample_timing, "LoadWindow", Busy)
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["plan", str(job), "--sample", "60"])
    assert result.exit_code == 0, result.output
    assert "time     about " in result.output and "for 600 rows: " in result.output
    assert " for the batching probe, " in result.output  # batching: auto, and no choice recorded yet
    assert (
        "note     the machine was busy while this estimate was measured: other processes used 1.5 of 2 cores "
        "(load average 3.5); on a quiet machine the work may run up to 4.0x faster"
    ) in result.output
    packed = ["--set", "batching.strategy=packed", "--set", "batching.max_tokens=4096"]
    result = runner.invoke(app, ["plan", str(job), "--sample", "60", *packed])
    assert "batches  packed, max_tokens 4,096: padding efficiency 1.000" in result.output  # no padding at all
    assert "batching probe" not in result.output and "(as the job sets it)" in result.output


def test_an_internal_error_says_how_to_see_it_in_plain_words(monkeypatch, tmp_path):
    import batchinfer.job.config

    def broken(*_):
        raise RuntimeError("a bug")

    monkeypatch.setattr(batchinfer.job.config, "load_job", broken)
    result = runner.invoke(app, ["run", str(tmp_path / "job.yaml")])
    assert result.exit_code == 1 and "internal error: RuntimeError: a bug" in result.output
    assert "fix: rerun with --debug" in result.output and "[yellow]" not in result.output


def test_the_summary_in_a_log_keeps_each_line_whole(tmp_path, sms_parquet, tiny_embed):
    bad = sms_parquet / ("part-9-a-shard-whose-name-is-long-enough-to-pass-eighty-columns" + ".parquet")
    bad.write_bytes(b"not parquet")
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, tmp_path / "out", raw=True, input__on_bad_shard="skip"))
    result = runner.invoke(app, ["run", str(job)])  # stderr is no terminal, as under nohup or cron
    assert result.exit_code == 0, result.output
    (skipped,) = [line for line in result.stderr.splitlines() if line.lstrip().startswith("skipped")]
    assert skipped.rstrip().endswith(f"{bad.name}; see _errors/"), result.stderr  # one line, not cut at 80


def test_progress_lines_come_batch_by_batch_inside_one_chunk_the_probes_too(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(  # one chunk of 600 rows, probed (batching: auto), in batches of at most 16 rows
        app, ["run", str(job), "--every", "0", "--set", "batching.chunk_rows=600", "--set", "batching.max_rows=16"]
    )
    assert result.exit_code == 0, result.output
    done = [
        int(line.split()[2].split("/")[0].replace(",", "")) for line in result.stderr.splitlines() if " left" in line
    ]
    assert len(done) >= 10 and done == sorted(set(done)) and done[-1] == 600  # rising, never said twice
    assert sum(1 for d in done if d < 600) >= 9  # before the chunk's commit: nothing is silent until 100%


def test_status_of_a_running_job_has_its_total_share_rate_and_time_left(tmp_path):
    from batchinfer.output.checkpoint import Checkpoint
    from batchinfer.output.records import ChunkRecord

    started = time.time() - 20  # the run began 20 s ago
    with Checkpoint.open(tmp_path / "out", started=started) as out:
        out.start({}, restart=False, extent={"chunks": 6, "rows": 600})
        for k in range(2):  # two chunks committed, 5 and 10 s in: 200 rows in 10 s
            rows = pa.table({"source": ["s"] * 100, "row": list(range(k * 100, k * 100 + 100))})
            out.writer().write_chunk(f"00000-0000{k}", rows, None)  # the parts their markers name
            out.commit(ChunkRecord(f"00000-0000{k}", rows=100, ok=100, errors={}, truncated=0))
            marker = tmp_path / "out" / "_done" / f"00000-0000{k}.json"
            marker.write_text(json.dumps({**json.loads(marker.read_text()), "finished": started + 5 + 5 * k}))
        result = runner.invoke(app, ["status", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "chunks  2/6 done" in result.output and "rows    200/600 done (33.3%), 200 ok" in result.output
    assert "rate    20.0 rows/s since the run started at " in result.output and "about 20 s left" in result.output
    assert "resume" not in result.output  # it is running


def test_status_after_a_limit_counts_the_whole_job_and_says_how_to_go_on(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))  # 600 rows, chunks of 100
    assert runner.invoke(app, ["run", str(job), "--limit", "250", "-q"]).exit_code == 0
    result = runner.invoke(app, ["status", str(tmp_path / "out")])
    # the next run plans 7: chunk 3 in two pieces, its first 50 rows kept
    assert "chunks  3/7 done (--limit 250: 3 chunk(s), the first 250 rows)" in result.output
    assert "rows    250/600 done (41.7%)" in result.output
    go_on = next(line for line in result.output.splitlines() if line.startswith("go on"))
    assert f"batchinfer run {job} (the whole job)" in go_on and "--limit 250" not in go_on
    plan = runner.invoke(app, ["plan", str(job), "--sample", "30"]).output
    assert "600 rows, 7 chunk(s)" in plan and "holds this job: 3/7 chunks done" in plan  # plan and status alike


def test_status_of_a_folder_written_from_python_says_how_to_go_on_in_words(tmp_path, sms_parquet, tiny_embed):
    """batchinfer.run records no command line: status says what to run in words, not a placeholder cut into
    shell words (it printed `batchinfer run JOB.yaml '(the' same job file and --set 'options)'`)."""
    import batchinfer

    batchinfer.run(make_job(sms_parquet, tiny_embed, tmp_path / "out", raw=True), limit=150)  # 600 rows, chunks of 100
    output = runner.invoke(app, ["status", str(tmp_path / "out")]).output
    go_on = next(line for line in output.splitlines() if line.startswith("go on"))
    assert "'" not in go_on and "batchinfer.run(...) without limit=" in go_on and "no --limit" in go_on, go_on


def test_a_saved_dataset_without_the_datasets_package_names_the_extra(tmp_path, tiny_embed, monkeypatch):
    saved = tmp_path / "saved"  # what save_to_disk leaves: discovery knows the folder by these files
    saved.mkdir()
    (saved / "dataset_info.json").write_text("{}")
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed: importing it raises ImportError
    result = runner.invoke(app, ["validate", str(write_job(tmp_path, user_job(saved, tiny_embed, tmp_path / "out")))])
    assert result.exit_code == 1, result.output
    assert "needs the datasets package, which is not installed" in result.output
    assert "pip install 'batchinfer[hf]'" in result.output and "Traceback" not in result.output


@pytest.fixture(scope="module")
def finished_folder(tmp_path_factory, sms_table, tiny_embed):
    """A finished job of two chunks, to copy and damage."""
    import pyarrow.parquet as pq

    base = tmp_path_factory.mktemp("finished")
    (base / "sms").mkdir()
    pq.write_table(sms_table.slice(0, 200), base / "sms" / "part-0.parquet")
    job = write_job(base, make_job(base / "sms", tiny_embed, base / "out", raw=True))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    return base


RECORD, MARKER = "_batchinfer.json", "_done/00000-00001.json"
DAMAGE = {  # what is written into the file: (file, a change to its JSON, or the new text), the field named
    "job_id a number": (RECORD, {"job_id": 5}, "job_id"),
    "job_id missing": (RECORD, {"job_id": None}, "job_id"),
    "plan text": (RECORD, {"plan": "x"}, "plan"),
    "plan a negative count": (RECORD, {"plan": {"chunks": -2, "rows": 200}}, "plan.chunks"),
    "command a number": (RECORD, {"command": 7}, "command"),
    "fingerprint a list": (RECORD, {"fingerprint": []}, "fingerprint"),
    "files text": (RECORD, {"files": "part-0"}, "files"),
    "tuning of the wrong type": (RECORD, {"tuning": {"max_tokens": "big", "strategy": "padded"}}, "tuning.max_tokens"),
    "record not JSON": (RECORD, '{"batchinfer": 2, "job_', "not JSON"),
    "record JSON not an object": (RECORD, "[1, 2]", "the file"),
    "finished text": (MARKER, {"finished": "yesterday"}, "finished"),
    "rows negative": (MARKER, {"rows": -5}, "rows"),
    "ok text": (MARKER, {"ok": "100"}, "ok"),
    "ok missing": (MARKER, {"ok": None}, "ok"),
    "errors a list": (MARKER, {"errors": []}, "errors"),
    "an error count negative": (MARKER, {"errors": {"too_long": -1}}, "errors.too_long"),
    "seconds negative": (MARKER, {"seconds": -3.0}, "seconds"),
    "worker a number": (MARKER, {"worker": 5}, "worker"),
    "prefix counts text": (MARKER, {"prefix": {"tokens": "40"}}, "prefix.tokens"),
    "rows a boolean": (MARKER, {"rows": True}, "rows"),
    # each field of the right type, together what batchinfer never writes: the chunk counted twice or miscounted
    "another chunk's record": (MARKER, {"chunk": "00000-00000"}, "it holds the record of chunk 00000-00000, not"),
    "counts that do not add up": (MARKER, {"rows": 7}, "its counts do not add up: 7 rows, but"),
}


@pytest.mark.parametrize("case", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_job_record_or_marker_is_named_in_run_status_and_export(tmp_path, finished_folder, tiny_embed, case):
    import shutil

    name, change, field = DAMAGE[case]
    out = tmp_path / "out"
    shutil.copytree(finished_folder / "out", out)
    job = write_job(tmp_path, make_job(finished_folder / "sms", tiny_embed, out, raw=True))
    path = out / name
    if isinstance(change, str):
        path.write_text(change)
    else:
        content = {**json.loads(path.read_text()), **change}
        path.write_text(json.dumps({k: v for k, v in content.items() if v is not None}))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for words in (["status", str(out)], ["export", str(out), "-o", str(tmp_path / "all.csv")], ["run", str(job)]):
        result = runner.invoke(app, words)
        said = " ".join(result.output.split())
        assert result.exit_code == 1, (words, said)
        assert f"damaged: {path}: {field}" in said and "internal error" not in said, (words, said)
        assert ("--restart" if name == MARKER else "--output NEW_FOLDER") in said
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing changed, nothing exported
    assert not (tmp_path / "all.csv").exists()


def test_a_max_length_past_the_models_positions_is_refused_by_validate_and_run(tmp_path, sms_parquet, tiny_embed):
    """tiny_embed reads 512 positions: 4096 is refused naming the key, the limit and the fix, before the output
    folder is made; left unset, max_length is the default (cut to the model's limit where that is shorter)."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    for command in (["validate"], ["run", "-q"]):
        result = runner.invoke(app, [*command, str(job), "--set", "model.max_length=4096"])
        assert result.exit_code == 2, result.output
        assert "model.max_length 4096 is more than" in result.output and "max_position_embeddings 512" in result.output
        assert "set model.max_length: 512 or less" in result.output
    assert not (tmp_path / "out").exists()
    assert runner.invoke(app, ["validate", str(job), "--set", "model.max_length=512"]).exit_code == 0


def test_a_ctrl_c_while_the_command_still_imports_is_exit_130_without_a_traceback():
    """The console script's entry: a Ctrl-C in the second or more the CLI takes to import printed a traceback
    and the process died of the signal (the probe sent it 0.8 s in)."""
    interrupted = (
        "import sys\n"
        "class Interrupt:\n"  # the user's Ctrl-C, arriving while batchinfer.cli imports
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'batchinfer.cli': raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['batchinfer', 'validate', 'job.yaml']\n"
        "from batchinfer.entry import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", interrupted], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr


def test_status_of_a_folder_that_is_no_run_answers_without_walking_what_is_below_it(tmp_path, monkeypatch):
    """`status /` listed the whole disk (and failed on the first folder it could not read); /usr took 7 s."""
    from batchinfer.storage import LocalFolder

    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "photo.jpg").write_bytes(b"\xff\xd8")

    def walked(self):
        raise AssertionError("status listed a folder that holds no run")

    monkeypatch.setattr(LocalFolder, "list", walked)
    result = runner.invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 1 and f"{tmp_path} holds no batchinfer run" in result.output, result.output


def test_retry_errors_refuses_a_folder_without_a_run_and_restart_beside_it(tmp_path, sms_parquet, tiny_embed):
    """--retry-errors on a new folder ran the whole job as if asked to; beside --restart it deleted the very
    errors it was asked to retry."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["run", str(job), "--retry-errors", "-q"])
    assert result.exit_code == 2 and "holds no run whose errors --retry-errors could run again" in result.output
    assert not list((tmp_path / "out").iterdir())  # nothing ran
    assert runner.invoke(app, ["run", str(job), "--limit", "100", "-q"]).exit_code == 0
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    result = runner.invoke(app, ["run", str(job), "--retry-errors", "--restart", "-q"])
    assert result.exit_code == 2 and "--retry-errors and --restart together" in result.output, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before


def test_a_job_whose_input_holds_no_rows_says_so_not_already_complete(tmp_path, tiny_embed):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("")
    job = write_job(tmp_path, user_job(tmp_path / "in", tiny_embed, tmp_path / "out"))
    result = runner.invoke(app, ["run", str(job)])
    assert result.exit_code == 0 and "the input holds no rows" in result.output, result.output
    assert "already complete" not in result.output and (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.parametrize("shard", ["a.jsonl", "a.parquet"])
def test_plan_of_an_input_with_no_rows_says_so_as_run_does(tmp_path, tiny_embed, shard):
    """plan said 'nothing left to run: the output folder holds every row' beside 'a new folder'."""
    (tmp_path / "in").mkdir()
    if shard.endswith(".jsonl"):
        (tmp_path / "in" / shard).write_text("")
    else:
        pq.write_table(
            pa.table({"sms_id": pa.array([], pa.int64()), "text": pa.array([], pa.string())}), tmp_path / "in" / shard
        )
    job = write_job(tmp_path, user_job(tmp_path / "in", tiny_embed, tmp_path / "out"))
    said = f"the input holds no rows (input.path: {tmp_path / 'in'})"
    planned = runner.invoke(app, ["plan", str(job)])
    assert planned.exit_code == 0 and f"time     nothing to run: {said}\n" in planned.output, planned.output
    assert "nothing left" not in planned.output and "holds every row" not in planned.output
    assert f"output   {tmp_path / 'out'}: a new folder, which a run marks complete with none" in planned.output
    assert not (tmp_path / "out").exists()
    ran = runner.invoke(app, ["run", str(job)])
    assert ran.exit_code == 0 and f"{said}: {tmp_path / 'out'} is complete with none" in ran.output, ran.output
    planned = runner.invoke(app, ["plan", str(job)])
    assert f"time     nothing to run: {said}\n" in planned.output and "a new folder" not in planned.output


def test_validate_notes_ids_that_repeat_or_are_null(tmp_path, tiny_embed):
    """A user joining results back by input.id learns before the run that some ids are not one row's."""
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"sms_id": [1, 1, None, 2], "text": ["a", "b", "c", "d"], "label": ["x"] * 4}),
        tmp_path / "in" / "a.parquet",
    )
    job = write_job(tmp_path, user_job(tmp_path / "in", tiny_embed, tmp_path / "out"))
    said = runner.invoke(app, ["validate", str(job)]).output
    assert "note: input.id 'sms_id': of the first 4 rows, 1 repeat an earlier id (e.g. '1') and 1 is null" in said
    pq.write_table(pa.table({"sms_id": [1, 2], "text": ["a", "b"], "label": ["x"] * 2}), tmp_path / "in" / "a.parquet")
    assert "input.id" not in runner.invoke(app, ["validate", str(job)]).output
