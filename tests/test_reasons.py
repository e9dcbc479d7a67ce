import ast
import re
from pathlib import Path

from helpers import check_docs_section

from batchinfer.reasons import REASONS, RETRYABLE, reasons_markdown

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "batchinfer"


def test_reason_table_is_generated_from_the_table():
    """Regenerate with: BATCHINFER_UPDATE_DOCS=1 python -m pytest tests/test_reasons.py"""
    check_docs_section("troubleshooting.md", "reasons", reasons_markdown())


# A code-like literal (snake_case) that is the first of a (reason, message) pair whose message is built, not
# written out: a Problem tuple such as ("duplicate_id", repeats[line]).
CODE_LIKE = re.compile(r"[a-z]+(?:_[a-z]+)+")


def bare_codes(source: str) -> list[tuple[int, str]]:
    """(line, code) of every reason code spelled as a string: one of the table's, a `reason=` literal, or a
    code-like literal opening a (reason, message) pair, which may be a code the table lacks."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in REASONS and node.value != "length":
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.keyword) and node.arg == "reason" and isinstance(node.value, ast.Constant):
            found.append((node.lineno, node.value.value))
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and not isinstance(node.elts[1], ast.Constant):
            first = node.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and CODE_LIKE.fullmatch(first.value):
                found.append((node.lineno, first.value))
    return sorted(set(found))


def test_reason_codes_are_spelled_only_in_the_table():
    """A code written as a bare string elsewhere could drift from the table (and from RETRYABLE) unseen, or
    be missing from it. `length` is also a finish_reason (OpenAI's word for a completion max_new_tokens cut),
    spelled as such."""
    bare = [
        f"{path.relative_to(ROOT)}:{line}: {code!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "reasons.py"
        for line, code in bare_codes(path.read_text())
    ]
    assert not bare, "use batchinfer.reasons.Reason (adding the code to its table):\n" + "\n".join(bare)


def test_a_code_missing_from_the_table_is_seen_too():
    source = 'problem = ("duplicate_id", repeats[n])\nrow = Row(reason="not_a_code")\nok = ("rows", f"{n}")\n'
    assert bare_codes(source) == [(1, "duplicate_id"), (2, "not_a_code")]


def test_only_what_a_retry_may_change_is_retryable():
    # --retry-errors may change max_length, truncation and dtype: what they cure, and nothing in the input itself
    assert RETRYABLE == {"too_long", "oom", "model_error"}
