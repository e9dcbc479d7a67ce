"""The project's version floors on a machine it did not set up (examples/bench/gpu.sh's GPU image).

    python3 examples/bench/floors.py install .whl /tmp/batchinfer-site   # carried wheels this python needs
    python3 examples/bench/floors.py check .whl                          # exit 1, naming each one below

The floors are read from pyproject.toml's [project] dependencies, never copied here. `install` puts into
TARGET (which then goes first on PYTHONPATH) each carried wheel whose distribution this python lacks or holds
below the project's floor, and what those wheels need in turn where this python does not meet it. `check`
then fails loudly when a dependency is still missing or below its floor, or when a carried wheel that went
in needs what this python lacks: figures measured on an unsupported stack are not figures of the project.
Needs Python 3.11 (tomllib) and `packaging`, which transformers needs too.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str  # canonical
    version: Version
    needs: tuple[Requirement, ...]  # Requires-Dist without extras' markers


def floors(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """The project's required dependencies, as pyproject.toml states them."""
    with open(pyproject, "rb") as f:
        return [Requirement(line) for line in tomllib.load(f)["project"]["dependencies"]]


def installed(name: str) -> Version | None:
    try:
        return Version(importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:
        return None


def unmet(requirements: list[Requirement], version_of=installed) -> list[str]:
    """'name: need >=X, found Y' (or 'missing') for each requirement this python does not meet (pure, given
    `version_of`); requirements whose markers exclude this python are met."""
    out = []
    for req in requirements:
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        have = version_of(req.name)
        if have is None or not req.specifier.contains(have, prereleases=True):
            out.append(f"{req.name}: need {req.specifier or 'any'}, found {have or 'missing'}")
    return out


def read_wheel(path: Path) -> Wheel:
    with zipfile.ZipFile(path) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    field = {k: v for k, _, v in (line.partition(": ") for line in lines if ": " in line) if k in ("Name", "Version")}
    needs = tuple(
        Requirement(line.removeprefix("Requires-Dist: "))
        for line in lines
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    )
    return Wheel(path, canonicalize_name(field["Name"]), Version(field["Version"]), needs)


def to_install(wheels: list[Wheel], requirements: list[Requirement], version_of=installed) -> list[Wheel]:
    """The carried wheels this python needs (pure, given `version_of`): those of a requirement it does not meet,
    then, until nothing changes, those that a chosen wheel needs and this python does not provide."""
    by_name = {w.name: w for w in wheels}
    chosen: dict[str, Wheel] = {}

    def have(name: str) -> Version | None:
        name = canonicalize_name(name)
        return chosen[name].version if name in chosen else version_of(name)

    wanted = list(requirements)
    while wanted:
        req = wanted.pop()
        name = canonicalize_name(req.name)
        if name in chosen or name not in by_name or not unmet([req], have):
            continue
        chosen[name] = by_name[name]
        wanted += by_name[name].needs
    return list(chosen.values())


def install(carried: Path, target: Path) -> None:
    wheels = [read_wheel(p) for p in sorted(carried.glob("*.whl"))]
    chosen = to_install(wheels, floors())
    print(f"carried wheels installed into {target}: {', '.join(f'{w.name} {w.version}' for w in chosen) or 'none'}")
    if chosen:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
            + ["--upgrade", "--target", str(target), *(str(w.path) for w in chosen)],
            check=True,
        )


def check(carried: Path) -> int:
    """0 when every floor holds and every carried wheel now in use has what it needs; else 1, each problem named."""
    problems = unmet(floors())
    for wheel in (read_wheel(p) for p in sorted(carried.glob("*.whl"))):
        if installed(wheel.name) == wheel.version:  # the carried one is what this python imports
            problems += [f"{p} (needed by the carried {wheel.name} {wheel.version})" for p in unmet(list(wheel.needs))]
    for problem in problems:
        print(f"BELOW THE PROJECT'S FLOOR: {problem}", file=sys.stderr)
    if problems:
        print(
            "these figures would be of an unsupported stack: add the wheels to examples/bench/gpu_wheels.sh's list "
            "and carry them",
            file=sys.stderr,
        )
        return 1
    print(f"every floor of pyproject.toml holds ({len(floors())} dependencies)")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    put = commands.add_parser("install", help="the carried wheels this python needs, into TARGET")
    put.add_argument("carried", type=Path)
    put.add_argument("target", type=Path)
    test = commands.add_parser("check", help="exit 1 when a dependency is below the project's floor")
    test.add_argument("carried", type=Path)
    args = parser.parse_args()
    if args.command == "install":
        install(args.carried, args.target)
    else:
        sys.exit(check(args.carried))


if __name__ == "__main__":
    main()
