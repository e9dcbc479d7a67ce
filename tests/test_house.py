"""The shape docs/architecture.md promises of the code: functions small enough to read at once, state changed only by
the object that owns it, and the declared protocols implemented as declared."""

import ast
import inspect
from pathlib import Path

import pytest

from batchinfer.runners import LABEL_SCORER
from batchinfer.runners import RUNNERS as TASK_RUNNERS

PACKAGE = Path(__file__).resolve().parent.parent / "batchinfer"
MAX_LINES = 60
# Still longer, to be cut; the list only shrinks.
LONG: set[str] = set()
# Objects of other libraries configured where batchinfer builds them: not batchinfer state.
FOREIGN = {
    "backends.packing.repad": "the model's output object, re-padded in place of the packed one",
    "runners.continuous.count_prefix_hits": "transformers' manager, its cache's prefix search wrapped to count hits",
    "backends.openvino_causal._step.Step.forward": "a transformers cache layer given the traced past as its tensors",
    "backends.openvino_causal._mask_always_built": "transformers' mask builder told to build the mask while tracing",
}


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{module}.{node.name}", node


def test_no_function_is_longer_than_sixty_lines():
    long = {name: fn.end_lineno - fn.lineno + 1 for name, fn in _functions() if fn.end_lineno - fn.lineno >= MAX_LINES}
    assert set(long) <= LONG, f"over {MAX_LINES} lines: {long}; cut them into named steps"
    assert not LONG - set(long), f"no longer long, take them off LONG: {sorted(LONG - set(long))}"


def _sets_on(fn: ast.AST) -> list[str]:
    """`x.attr = ...` where x is one of fn's parameters (not self or cls), or an object self holds."""
    args = fn.args
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs} - {"self", "cls"}
    found = []
    for node in ast.walk(fn):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            continue
        for target in targets:
            for leaf in target.elts if isinstance(target, ast.Tuple) else [target]:
                if not isinstance(leaf, ast.Attribute):
                    continue
                owner = leaf.value
                held = (
                    isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self"
                )
                while isinstance(owner, ast.Attribute):
                    owner = owner.value
                if held or (isinstance(owner, ast.Name) and owner.id in params):
                    found.append(ast.unparse(leaf))
    return found


def test_no_function_sets_attributes_of_an_object_it_was_handed():
    """An object's state is changed by its own methods (a Folder's temporary prefix is an argument; a
    runner's strategy is lay_out's), so that each piece of state has one owner."""
    found = {}
    for name, fn in _functions():
        if name in FOREIGN or name.endswith(".__init__") and name.startswith("runners.token_classify"):
            continue  # token_classify builds transformers' pipeline without its __init__
        own_class_objects = [s for s in _sets_on(fn) if not s.startswith("request.")]  # the batcher's own Submitted
        if own_class_objects:
            found[name] = own_class_objects
    assert not found, f"attributes set from outside their object: {found}"


# The registered runners ("module:Class" in batchinfer.runners): generate's, and the encoder tasks' (EncoderRunner's).
GENERATE_RUNNER = f"batchinfer.runners.{TASK_RUNNERS['generate']}"
ENCODER_SPECS = [spec for spec in [*TASK_RUNNERS.values(), LABEL_SCORER] if spec != TASK_RUNNERS["generate"]]
ENCODER_RUNNER_CLASSES = [f"batchinfer.runners.{spec}" for spec in ENCODER_SPECS]


@pytest.mark.parametrize(
    "protocol, classes",
    [
        ("batchinfer.storage:Folder", ["batchinfer.storage:LocalFolder", "batchinfer.storage:ObjectFolder"]),
        (
            "batchinfer.backends:Backend",
            ["batchinfer.backends.torch:TorchBackend", "batchinfer.backends.openvino:OpenVINOBackend"],
        ),
        (
            "batchinfer.execution.executors:Executor",
            [
                "batchinfer.execution.executors.local:LocalExecutor",
                "batchinfer.execution.executors.ray:RayExecutor",
            ],
        ),
        (
            "batchinfer.runners.engine:Engine",
            [
                "batchinfer.runners.continuous:ContinuousEngine",
                "batchinfer.runners.openvino_engine:OpenVINOEngine",
                "batchinfer.runners.static:StaticEngine",
                "batchinfer.runners.vllm_engine:VllmEngine",
            ],
        ),
        (
            "batchinfer.runners.engine:Serving",
            ["batchinfer.runners.continuous:ContinuousServing", "batchinfer.runners.openvino_engine:OpenVINOServing"],
        ),
        ("batchinfer.runners.protocol:Runner", ["batchinfer.runners.base:EncoderRunner", GENERATE_RUNNER]),
        ("batchinfer.runners.protocol:BatchRunner", ENCODER_RUNNER_CLASSES),
        ("batchinfer.runners.protocol:Generating", [GENERATE_RUNNER]),
    ],
)
def test_each_declared_protocol_is_implemented_with_its_signatures(protocol, classes):
    import importlib

    def load(spec):
        module, name = spec.split(":")
        return getattr(importlib.import_module(module), name)

    declared = load(protocol)
    methods = {n: v for n, v in vars(declared).items() if not n.startswith("_") and callable(v)}
    fields = set(getattr(declared, "__annotations__", {})) | {
        n for n, v in vars(declared).items() if isinstance(v, property)
    }
    for spec in classes:
        cls = load(spec)
        for name, method in methods.items():
            assert callable(getattr(cls, name, None)), f"{spec} has no {name}"
            want = list(inspect.signature(method).parameters)
            assert list(inspect.signature(getattr(cls, name)).parameters) == want, f"{spec}.{name}: not {want}"
        source = inspect.getsource(cls)
        for name in fields:  # a class attribute, a property, or set in __init__
            assert hasattr(cls, name) or f"self.{name}" in source, f"{spec} has no {name}"


def _declared(spec: str) -> set[str]:
    import importlib

    module, name = spec.split(":")
    protocol = getattr(importlib.import_module(module), name)
    declared = set()
    for cls in protocol.__mro__[:-1]:  # what it extends (BatchRunner: Runner) included, object not
        declared |= set(vars(cls).get("__annotations__", {})) | {n for n in vars(cls) if not n.startswith("_")}
    return declared


def _annotated(annotation: ast.expr) -> str:
    """The type an annotation names, None aside: `Runner`, `Runner | None` and "protocol.Runner" are Runner."""
    names = [n.strip(" '\"") for n in ast.unparse(annotation).split("|") if n.strip(" '\"") != "None"]
    return names[0].rsplit(".", 1)[-1] if len(names) == 1 else " | ".join(names)


def _types_in(fn: ast.AST, known: dict[str, str]) -> dict[str, str]:
    """`known` and the receivers fn annotates: its parameters, its locals (`runner: Generating = ...`), and what it
    sets on self from either (`self.runner = runner`, `self.runner: Runner = ...`), as written → the type's name."""
    args = fn.args
    types = dict(known)
    types |= {a.arg: _annotated(a.annotation) for a in args.posonlyargs + args.args + args.kwonlyargs if a.annotation}
    for node in ast.walk(fn):
        if isinstance(node, ast.AnnAssign):
            types[ast.unparse(node.target)] = _annotated(node.annotation)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = (
                zip(target.elts, value.elts) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) else []
            )
            for leaf, source in [(target, value), *pairs]:
                if ast.unparse(leaf).startswith("self.") and ast.unparse(source) in types:
                    types.setdefault(ast.unparse(leaf), types[ast.unparse(source)])
    return types


def _scopes(tree: ast.Module):
    """(function, the receivers' types it sees) for each module-level function and method, a method seeing what any
    method of its class sets on self (nested functions are read with the function they are in)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, _types_in(node, {})
        elif isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            attributes = {}
            for method in methods:
                attributes |= {k: v for k, v in _types_in(method, {}).items() if k.startswith("self.")}
            for method in methods:
                yield method, _types_in(method, attributes)


def _used(files: list[str], protocol: str, receivers: set[str] = frozenset()) -> set[str]:
    """Attributes read in `files` (directly or by getattr/hasattr) off values annotated as `protocol` (a class's
    name), and off `receivers` (expressions as written, such as task.runner) that no annotation types otherwise."""
    used = set()
    for file in files:
        for fn, types in _scopes(ast.parse((PACKAGE / file).read_text())):
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute):
                    value, name = node.value, node.attr
                elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr"):
                    value, name = node.args[0], getattr(node.args[1], "value", None)
                else:
                    continue
                typed = types.get(ast.unparse(value))
                if typed == protocol or (typed is None and ast.unparse(value) in receivers):
                    used.add(name)
    return used


def _package_files(*folders: str) -> list[str]:
    return [str(p.relative_to(PACKAGE)) for d in folders for p in sorted((PACKAGE / d).rglob("*.py"))]


CALLERS = ["api.py", *_package_files("serve", "commands", "execution")]
# A runner not annotated otherwise is a Runner, whatever its task: the chunk's run knows none by name.
RUNNERS = {"runner", "self.runner", "task.runner", "self.task.runner"}
# Where a Backend is driven: the encoder runners' modules.
ENCODER_RUNNERS = ["runners/base.py", *(f"runners/{spec.split(':')[0]}.py" for spec in ENCODER_SPECS)]


@pytest.mark.parametrize(
    "protocol, files, receivers",
    [
        ("batchinfer.execution.executors:Executor", ["execution/driver.py"], {"executor"}),
        ("batchinfer.runners.protocol:Runner", CALLERS, RUNNERS),
        ("batchinfer.runners.protocol:BatchRunner", CALLERS, set()),
        ("batchinfer.runners.protocol:Generating", CALLERS, set()),
        (
            "batchinfer.runners.engine:Engine",
            ["runners/generate.py", *CALLERS],
            {"self.runner.engine", "runner.engine"},
        ),
        ("batchinfer.runners.engine:Serving", CALLERS, set()),
        (
            "batchinfer.backends:Backend",
            ENCODER_RUNNERS,
            {"self._running", "backend", "first", "b", "reference", "converted"},
        ),
    ],
    ids=["Executor", "Runner", "BatchRunner", "Generating", "Engine", "Serving", "Backend"],
)
def test_callers_use_of_a_protocol_only_what_it_declares(protocol, files, receivers):
    """The protocol says what callers use: every attribute read off a value of its type is declared there (a new
    task's runner or a new engine learns what it must provide from the protocol, not from an AttributeError)."""
    declared, used = _declared(protocol), _used(files, protocol.rsplit(":", 1)[1], receivers)
    assert used, f"no use of {protocol} found: the annotations or receivers {receivers} are out of date"
    assert used <= declared, f"callers use {sorted(used - declared)}, which {protocol} does not declare"


def test_one_name_means_one_thing():
    """A class or type alias is defined in one module only: two ParquetFormat, Completions or Problem made a
    reader ask which one is meant."""
    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            named = isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            if isinstance(node, ast.ClassDef):
                name = node.name
            elif named and node.targets[0].id[:1].isupper() and not node.targets[0].id.isupper():
                name = node.targets[0].id  # a type alias such as Problem = tuple[str, str]
            else:
                continue
            where.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    assert not {n: w for n, w in where.items() if len(w) > 1}


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
PYPROJECT = PACKAGE.parent / "pyproject.toml"


# A named tuple's own methods start with "_" so as not to clash with its fields; they are its documented API.
NAMEDTUPLE_API = {"_asdict", "_replace", "_fields", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    return name == "__new__" or (name.startswith("_") and not name.startswith("__") and name not in NAMEDTUPLE_API)


def _own_private_names() -> set[str]:
    """Private names batchinfer defines itself (functions, classes, module globals, attributes set on self)."""
    own = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                own.add(node.attr)
    return {name for name in own if _private(name)} - {"__new__"}


def _private_uses() -> set[tuple[str, str]]:
    """(private name, module) for each private name of another package that batchinfer's code reaches: an
    attribute (x._name, getattr(x, "_name")), a module imported by a private path, or a class built by __new__."""
    own, uses = _own_private_names(), set()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                names = [node.attr]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in GETTERS:
                names = [node.args[1].value] if isinstance(node.args[1], ast.Constant) else []
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = node.module.split(".")
            elif isinstance(node, ast.Import):
                names = [part for alias in node.names for part in alias.name.split(".")]
            uses |= {(name, where) for name in names if _private(name) and name not in own}
    return uses


GETTERS = ("getattr", "hasattr", "setattr")


def _listed() -> list[tuple[str, str, list[str]]]:
    """docs/architecture.md's table of private names: (`module:Owner.name`, package, [modules it is used in])."""
    section = ARCHITECTURE.read_text().split("### Private names of dependencies", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and ":" in cells[0]:
            rows.append((cells[0].strip("`"), cells[1], [w.strip(" `") for w in cells[2].split(",")]))
    return rows


def test_the_private_names_we_use_of_other_packages_are_the_ones_docs_architecture_lists():
    """A new reach into a dependency's private name is listed (and so checked below and bounded in pyproject)."""
    listed = set()
    for name, _package, used_in in _listed():
        module, qualified = name.split(":")
        parts = [p for p in module.split(".") + qualified.split(".") if _private(p)]
        listed |= {(part, where) for part in parts for where in used_in}
    used = _private_uses()
    assert not used - listed, f"private names used but not in docs/architecture.md's table: {sorted(used - listed)}"
    assert not listed - used, f"listed in docs/architecture.md but no longer used: {sorted(listed - used)}"


@pytest.mark.parametrize("name, package, used_in", _listed(), ids=[row[0] for row in _listed()])
def test_each_private_name_we_use_still_exists_in_the_installed_package(name, package, used_in):
    """A release that moves one fails here, naming it, rather than deep in a run."""
    import importlib

    module, qualified = name.split(":")
    owner = importlib.import_module(module) if package != "openvino" else pytest.importorskip(module)
    *path, last = qualified.split(".")
    for part in path:
        owner = getattr(owner, part)
    found = hasattr(owner, last) or last in inspect.getsource(owner)  # an attribute its own code sets on instances
    version = "" if package == "Python" else importlib.metadata.version(package)
    assert found, f"{package} {version} has no {name}, which batchinfer/{', batchinfer/'.join(used_in)} use(s)"


def test_each_package_whose_private_names_we_use_has_a_tested_upper_bound():
    """The bound says which releases the listed names were checked on: a newer one is installed only after the
    test above passes on it."""
    import re

    text = PYPROJECT.read_text()
    for package in {row[1] for row in _listed()} - {"Python"}:
        specs = re.findall(rf'"{package}(?:\[\w,]+\])?>=[^"]*"', text)
        assert specs and all("<" in s for s in specs), f"{package}: no upper bound in pyproject.toml ({specs})"
