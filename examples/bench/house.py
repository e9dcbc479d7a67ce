"""The shape of the code, as a table: rooms (modules), floors (import layers), the largest file and
function, the most branching function, and how often the driver calls into the output layer.

    python examples/bench/house.py              # this checkout
    python examples/bench/house.py /tmp/old     # another checkout (say, `git worktree add /tmp/old <commit>`)

Floors: the longest chain of module-level imports inside the package plus one (a module that imports no
other batchinfer module is on floor 1). Branches: if/for/while/except/with/boolean operators/match
cases/comprehension ifs, plus one — mccabe's count, close to ruff's C901. Driver → output calls: calls
in the driver (execution/driver.py; driver.py before issue 34) to a name imported from the output layer, or
to a method of a value that such a call returned (followed through assignments within the driver), other than
reading a returned mapping.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

OUTPUT_LAYER = ("sink", "output", "storage")  # batchinfer.<these> and their submodules
NOT_OUTPUT = {"batchinfer.storage.lines"}  # JSON lines read from inputs (lines.py before issue 34)
DRIVERS = ("batchinfer.execution.driver", "batchinfer.driver")  # where the driver is; before issue 34
DICT_METHODS = {"items", "values", "keys", "get"}  # reading a returned mapping is no trip into the layer


def modules(package: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - node.level + 1]
    return ".".join(anchor + ([node.module] if node.module else []))


def top_level_imports(module: str, path: Path, known: set[str]) -> set[str]:
    """batchinfer modules imported at module level (not inside a function)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        for stmt in [node, *ast.walk(node)] if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(stmt, ast.Import):
                found |= {a.name for a in stmt.names if a.name in known}
            elif isinstance(stmt, ast.ImportFrom):
                base = resolve(module, path.name == "__init__.py", stmt)
                found |= {m for m in [base, *(f"{base}.{a.name}" for a in stmt.names)] if m in known}
    found.discard(module)
    return found


def floors(graph: dict[str, set[str]]) -> int:
    @cache
    def floor(module: str) -> int:
        return 1 + max((floor(m) for m in graph[module]), default=0)

    return max(floor(m) for m in graph)


def branches(fn: ast.AST) -> int:
    count = 1
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler)):
            count += 1
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
        elif isinstance(node, ast.match_case):
            count += 1
    return count


def functions(path: Path, module: str):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{module}.{node.name}", node.end_lineno - node.lineno + 1, branches(node)


def output_calls(driver: Path, module: str) -> int:
    """Calls from the driver into the output layer (see the module docstring)."""
    tree = ast.parse(driver.read_text())
    tracked = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = resolve(module, False, node)
            if base.split(".")[1:2] and base.split(".")[1] in OUTPUT_LAYER:
                tracked |= {a.asname or a.name for a in node.names}

    def from_output(value: ast.AST) -> bool:
        while isinstance(value, (ast.Call, ast.Attribute)):
            value = value.func if isinstance(value, ast.Call) else value.value
        return isinstance(value, ast.Name) and value.id in tracked

    for _ in range(3):  # follow x = out.open(...); y = x.something(...)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value and from_output(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    tracked |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.withitem) and node.optional_vars and from_output(node.context_expr):
                tracked |= {n.id for n in ast.walk(node.optional_vars) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.arg) and node.annotation is not None and from_output(node.annotation):
                tracked.add(node.arg)
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and from_output(node.func)
        and not (isinstance(node.func, ast.Attribute) and node.func.attr in DICT_METHODS)
    )


def main(root: Path) -> None:
    package = root / "batchinfer"
    found = modules(package)
    graph = {m: top_level_imports(m, p, set(found)) for m, p in found.items()}
    lines = {m: len(p.read_text().splitlines()) for m, p in found.items()}
    fns = [f for m, p in found.items() for f in functions(p, m)]
    biggest_file = max(lines, key=lines.get)
    longest = max(fns, key=lambda f: f[1])
    tangled = max(fns, key=lambda f: f[2])
    layer = [m for m in found if m.split(".")[1:2] and m.split(".")[1] in OUTPUT_LAYER and m not in NOT_OUTPUT]
    driver = next(m for m in DRIVERS if m in found)
    rows = [
        ("rooms (modules)", f"{len(found)} in {sum(1 for p in found.values() if p.name == '__init__.py')} packages"),
        ("floors (import layers)", str(floors(graph))),
        ("lines of code", f"{sum(lines.values()):,}"),
        ("largest file", f"{biggest_file} ({lines[biggest_file]} lines)"),
        ("modules over 400 lines", str(sum(1 for n in lines.values() if n > 400))),
        ("largest function", f"{longest[0]} ({longest[1]} lines)"),
        ("most branching function", f"{tangled[0]} ({tangled[2]})"),
        ("functions over 60 lines", str(sum(1 for f in fns if f[1] > 60))),
        ("output layer", f"{len(layer)} modules, largest {max((lines[m] for m in layer), default=0)} lines"),
        ("driver → output-layer calls", str(output_calls(found[driver], driver))),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"| {'':{width}} | {root.resolve().name} |\n|{'-' * (width + 2)}|---|")
    for key, value in rows:
        print(f"| {key:{width}} | {value} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
