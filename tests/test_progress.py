"""Progress for people and for logs: what the lines say, when they come, and what a stop keeps."""

import io
import re
import time

from rich.console import Console

from batchinfer.progress import Kept, LineProgress, RunProgress, _duration, labelled

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


def _console() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, width=300, force_terminal=False, color_system=None), text


def _lines(text: io.StringIO) -> list[str]:
    return text.getvalue().splitlines()


def test_lines_say_rows_done_of_total_counting_the_chunk_in_flight_batch_by_batch():
    console, text = _console()
    progress = LineProgress(console, every=0.0)  # a line at every batch
    progress.start(100, 10, time.perf_counter())
    progress.partial(5, 50)  # a batch inside the first chunk: no silence until it commits
    progress.advance(20, 400)  # the chunk commits: its 20 rows replace the 5 in flight
    progress.log("lowered batching.max_tokens to [512]")
    lines = _lines(text)
    assert all(re.match(STAMP, line) for line in lines)
    assert lines[0].endswith("started: 90 rows to run (10 done before)")
    assert re.search(
        r" 15/100 rows \(15\.0%\), [\d,.]+ rows/s and [\d,]+ input tokens/s since the run started, "
        r"(\d+[hms]\d*[ms]?|\?) left$",
        lines[1],
    )
    assert " 30/100 rows (30.0%)," in lines[2]
    assert lines[3].endswith("note: lowered batching.max_tokens to [512]")  # no markup: the brackets stay
    assert len(lines) == 4


def test_lines_come_every_so_often_and_the_end_says_where_the_run_got():
    console, text = _console()
    progress = LineProgress(console, every=3600.0)
    progress.start(50, 0, time.perf_counter())
    progress.advance(10, 100)
    progress.partial(7, 70)
    assert len(_lines(text)) == 1 and _lines(text)[0].endswith("started: 50 rows to run")  # not yet due
    progress.stop()  # stopped mid-chunk: the count reached; what is kept is kept()'s to say
    assert " 17/50 rows (34.0%)," in _lines(text)[-1] and len(_lines(text)) == 2
    assert progress.kept() == Kept(committed=10, total=50, inflight=7)
    progress.stop()  # nothing new since: no second line
    assert len(_lines(text)) == 2


def _counts(text: io.StringIO, total: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(rf" ([\d,]+)/{total}\b", text.getvalue())]


def test_a_ctrl_c_mid_chunk_never_takes_the_count_back_and_says_what_is_kept():
    """Ctrl-C drops the chunk in flight: its rows are not committed and the resume runs them again. The count
    shown stays where it got (512, not back to 256); the stop says 256 are kept and 256 recomputed."""
    console, text = _console()
    progress = LineProgress(console, every=0.0)
    progress.start(1000, 0, time.perf_counter())
    progress.advance(256, 2560)
    progress.partial(256, 2560)
    progress.stop()  # what cli.execute does on Interrupted
    assert _counts(text, "1,000") == [256, 512]
    kept = progress.kept()
    assert kept == Kept(committed=256, total=1000, inflight=256)
    assert kept.line("out/x") == (
        "256 of 1,000 rows are committed (kept) in out/x; the 256 rows in flight are dropped and will be "
        "recomputed on resume."
    )
    assert Kept(300, 1000, 0).line("out/x") == "300 of 1,000 rows are committed (kept) in out/x."


def test_the_bar_stopped_mid_chunk_stays_at_its_count_and_says_what_is_kept():
    console, text = _console()
    bar = RunProgress(console)
    assert bar.kept() is None  # stopped before it started counting (discovery, model load): cli says less
    bar.start(1000, 100, time.perf_counter())  # 100 rows done by an earlier run
    bar.advance(256, 2560)
    bar.partial(256, 2560)
    bar.stop()  # what cli.execute does on Interrupted
    assert _counts(text, "1000") == [612]
    assert bar.kept() == Kept(committed=356, total=1000, inflight=256)


def test_lines_never_show_a_lower_count_than_one_they_showed():
    console, text = _console()
    progress = LineProgress(console, every=0.0)
    assert progress.kept() is None
    progress.start(100, 0, time.perf_counter())
    progress.partial(30, 300)
    progress.partial(10, 100)  # a chunk in flight dropped and the next one begun: no line back to 10
    progress.partial(40, 400)
    assert _counts(text, "100") == [30, 40]


def test_the_rate_counts_from_the_runs_start_and_the_time_left_from_the_first_chunk():
    """One rate: rows over the wall seconds since the run started (model load included), as the summary's
    `this run` line says it; the time left goes by the rate since the first chunk started, with no start-up."""
    console, text = _console()
    progress = LineProgress(console, every=0.0)
    progress.start(1000, 0, time.perf_counter() - 100.0)  # the run started 100 s ago (model load and all) ...
    progress.computing -= 10.0  # ... and its first chunk 10 s ago
    progress.advance(100, 1000)
    line = _lines(text)[-1]
    assert " 1.0 rows/s and 10 input tokens/s since the run started, " in line, line  # 100 rows / 100 s
    assert line.endswith(" 1m30s left") or line.endswith(" 1m29s left"), line  # 900 rows at 10 rows/s


def test_the_time_left_reads_as_hours_minutes_seconds():
    assert [_duration(s) for s in (0, 59.9, 60, 61, 3599, 3600, 3 * 3600 + 5 * 60 + 9)] == [
        "0s",
        "59s",
        "1m00s",
        "1m01s",
        "59m59s",
        "1h00m",
        "3h05m",
    ]


def test_the_bar_starts_at_the_rows_done_before_and_counts_the_chunk_in_flight():
    console, text = _console()
    bar = RunProgress(console)
    bar.start(100, 10, time.perf_counter())
    bar.advance(20, 200)
    bar.partial(5, 50)
    bar.stop()
    assert "35/100" in text.getvalue()
    bar.log("kept [this] as it is")
    assert "note: kept [this] as it is" in text.getvalue()


def test_a_label_never_reads_the_text_as_markup():
    assert labelled("note:", "yellow", "/data/[bold]x").plain == "note: /data/[bold]x"
