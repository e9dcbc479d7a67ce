"""The package's import graph: imports only go down the layers of the map in docs/architecture.md ("How the
code is laid out"), so there is no cycle, and no import inside a function hides one."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "batchinfer"
SECTION = "## How the code is laid out"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> dict[str, bool]:
    """batchinfer modules imported by `path` -> whether only inside a function."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: dict[str, bool] = {}
    tree = ast.parse(path.read_text())
    inner = {
        id(node)
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
    }
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("batchinfer")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.startswith("batchinfer"):
                names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            if (PACKAGE.parent / name.replace(".", "/")).with_suffix(".py").exists() or (
                PACKAGE.parent / name.replace(".", "/") / "__init__.py"
            ).exists():
                found[name] = found.get(name, True) and id(node) in inner
    found.pop(module, None)
    return found


def _layers() -> dict[str, tuple[int, str]]:
    """batchinfer module -> (its layer's place in the map, highest first; the layer's header): each
    bold header, then the `- `path.py`:` lines of its modules."""
    body = (PACKAGE.parent / "docs" / "architecture.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    layers: dict[str, tuple[int, str]] = {}
    place, header = -1, None
    for line in body.splitlines():
        if line.startswith("**"):
            place, header = place + 1, line.split("**")[1]
        elif header and (found := re.match(r"- `((?:[a-z_]+/)*[a-z_]+\.py)`:", line)):
            layers[_module(PACKAGE / found.group(1))] = (place, header)
    return layers


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        graph[_module(path)] = {m for m, inside in _imports(path).items() if not (top_level_only and inside)}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for child in sorted(graph.get(node, ())):
            if state.get(child) == 1:
                return trail[trail.index(child) :] + [child] if child in trail else [node, child]
            if child not in state and (found := visit(child, trail + [child])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle_at_module_level():
    assert _cycle(_graph(top_level_only=True)) is None


def test_no_import_inside_a_function_hides_a_cycle():
    cycle = _cycle(_graph(top_level_only=False))
    assert cycle is None, " -> ".join(cycle)


def test_imports_go_only_down_the_layers_of_the_map():
    """A module imports from its own layer or a lower one, at module level or inside a function."""
    graph, layers = _graph(top_level_only=False), _layers()
    layers.setdefault("batchinfer.__main__", layers["batchinfer.cli"])  # `python -m batchinfer`: the CLI
    assert len({place for place, _ in layers.values()}) > 1, "the map's bold headers were not read as layers"
    assert set(graph) <= set(layers), f"not in the map: {sorted(set(graph) - set(layers))}"
    against = [
        f"{module} ({layers[module][1]}) imports {target} ({layers[target][1]}, a higher layer)"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layers[target][0] < layers[module][0]
    ]
    assert not against, "imports against the map's order:\n" + "\n".join(against)


def test_the_graph_is_read():
    graph = _graph(top_level_only=False)
    assert (
        "batchinfer.job.config" in graph["batchinfer.execution.driver"]
        and "batchinfer.storage.lines" in graph["batchinfer.sources.jsonl"]
    )


def test_the_output_layer_reaches_nothing_that_runs_chunks_or_talks_to_users():
    """output/ knows the folder's files, not models, chunk tasks or commands: the layers above use it."""
    graph = _graph(top_level_only=False)
    layer = {m for m in graph if m.startswith("batchinfer.output.")}
    assert {"batchinfer.output.checkpoint", "batchinfer.output.status", "batchinfer.output.formats"} <= layer
    reached, todo = set(), list(layer)
    while todo:
        for child in graph.get(todo.pop(), ()):
            if child not in reached:
                reached.add(child)
                todo.append(child)
    above = ("execution", "runners", "backends", "cli", "commands", "serve", "api")
    assert sorted(m for m in reached if m.split(".")[1] in above) == []
