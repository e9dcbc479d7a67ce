import ast
from pathlib import Path

from helpers import check_readme_section

from batchinfer.reasons import REASONS, RETRYABLE, reasons_markdown

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "batchinfer"


def test_readme_reason_table_is_generated_from_the_table():
    """Regenerate with: BATCHINFER_UPDATE_README=1 python -m pytest tests/test_reasons.py"""
    check_readme_section("reasons", reasons_markdown())


def test_reason_codes_are_spelled_only_in_the_table():
    """A code written as a bare string elsewhere could drift from the table (and from RETRYABLE) unseen.
    `length` is also a finish_reason (OpenAI's word for a completion max_new_tokens cut), spelled as such."""
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "reasons.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in REASONS and node.value != "length":
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not bare, "use batchinfer.reasons.Reason:\n" + "\n".join(bare)


def test_only_what_a_retry_may_change_is_retryable():
    # --retry-errors may change max_length, truncation and dtype: what they cure, and nothing in the input itself
    assert RETRYABLE == {"too_long", "oom", "model_error"}
