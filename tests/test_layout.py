"""The map of the code ("How the code is laid out" in docs/architecture.md) names every module, and only modules
that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## How the code is laid out"


def _mapped() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert SECTION in text, f"docs/architecture.md has no {SECTION!r} section"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `((?:[a-z_]+/)*[a-z_]+\.py)`:", body, flags=re.M)  # one line a module


def test_the_map_names_every_module_once():
    modules = sorted(str(p.relative_to(ROOT / "batchinfer")) for p in (ROOT / "batchinfer").rglob("*.py"))
    modules = [m for m in modules if not m.endswith("__main__.py")]
    mapped = _mapped()
    assert sorted(set(mapped)) == sorted(mapped), "a module is named twice in docs/architecture.md's map"
    assert sorted(mapped) == modules, (
        f"missing from the map: {sorted(set(modules) - set(mapped))}; "
        f"in the map but not in batchinfer/: {sorted(set(mapped) - set(modules))}"
    )
