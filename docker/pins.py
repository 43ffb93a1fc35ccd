"""The image build's view of the project's pins: every version comes from pyproject.toml.

The Dockerfiles declare version ARGs without values; ``docker/build.sh`` fills them from here,
and each image re-checks inside the build that what got installed is what pyproject.toml pins
(``check-installed``), so a hand-typed ``--build-arg`` cannot drift from the project.

    python docker/pins.py build-args                      # NAME=VALUE, one per line
    python docker/pins.py requirements [--exclude PKG]... [--extra NAME]...
    python docker/pins.py check-installed PKG...          # exit 1 unless installed == pinned
    python docker/pins.py check-args NAME=VALUE...        # exit 1 unless each build arg == pin

Only the standard library is used, so this runs on any build host with Python 3.11+.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 build hosts
    import tomli as tomllib  # type: ignore[no-redef]

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;,]+)\s*$")


def canonical(name: str) -> str:
    """PEP 503 name: what pip and importlib.metadata agree on."""
    return re.sub(r"[-_.]+", "-", name).lower()


def arg_name(package: str) -> str:
    """The Dockerfile ARG carrying a package's pin: ``pyspark`` -> ``PYSPARK_VERSION``."""
    return canonical(package).replace("-", "_").upper() + "_VERSION"


def _project(pyproject: Path) -> dict:
    with open(pyproject, "rb") as fh:
        return tomllib.load(fh)["project"]


def _pins_of(requirements: list[str], where: str) -> dict[str, str]:
    pins = {}
    for requirement in requirements:
        match = PIN.match(requirement)
        if not match:
            raise ValueError(f"{where}: '{requirement}' is not an exact '==' pin")
        pins[canonical(match.group(1))] = match.group(2)
    return pins


def load_pins(pyproject: Path = PYPROJECT) -> dict[str, dict[str, str]]:
    """Pins by group: ``""`` for the runtime dependencies, else the extra's name."""
    project = _project(pyproject)
    groups = {"": _pins_of(project.get("dependencies", []), "dependencies")}
    for extra, requirements in project.get("optional-dependencies", {}).items():
        groups[extra] = _pins_of(requirements, f"optional-dependencies.{extra}")
    return groups


def all_pins(pyproject: Path = PYPROJECT) -> dict[str, str]:
    merged: dict[str, str] = {}
    for pins in load_pins(pyproject).values():
        merged.update(pins)
    return merged


def build_args(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """Every pin as a build argument, plus the project's own version."""
    args = {arg_name(name): version for name, version in sorted(all_pins(pyproject).items())}
    args["PROJECT_VERSION"] = _project(pyproject)["version"]
    return args


def requirements(exclude: list[str], extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    groups = load_pins(pyproject)
    unknown = sorted(set(extras) - set(groups))
    if unknown:
        raise ValueError(f"unknown extra(s) {unknown}; pyproject.toml has {sorted(groups)}")
    skip = {canonical(name) for name in exclude}
    chosen = {}
    for group in ["", *extras]:
        chosen.update(groups[group])
    return [f"{name}=={version}" for name, version in sorted(chosen.items()) if name not in skip]


def installed_mismatches(packages: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    pins = all_pins(pyproject)
    problems = []
    for package in packages:
        name = canonical(package)
        if name not in pins:
            problems.append(f"{package}: not pinned in {pyproject.name}")
            continue
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{package}: not installed (pyproject pins {pins[name]})")
            continue
        if have != pins[name]:
            problems.append(f"{package}: installed {have}, pyproject pins {pins[name]}")
    return problems


def arg_mismatches(assignments: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    """Build arguments (``NAME=VALUE``) that are empty or differ from pyproject.toml."""
    expected = build_args(pyproject)
    problems = []
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        if name not in expected:
            problems.append(f"{name}: not a pin of {pyproject.name} (known: {', '.join(expected)})")
        elif value != expected[name]:
            problems.append(f"{name}={value or '(empty)'}, pyproject pins {expected[name]} "
                            "(build with docker/build.sh, which passes the pins)")
    return problems


def _report(problems: list[str], what: str) -> int:
    if problems:
        print(f"pins.py: {what} differ from pyproject.toml:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 1
    print(f"pins.py: {what} match pyproject.toml")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build-args", help="NAME=VALUE lines for docker build --build-arg")
    req = sub.add_parser("requirements", help="pip requirement lines from the pins")
    req.add_argument("--exclude", action="append", default=[], help="package to leave out")
    req.add_argument("--extra", action="append", default=[], help="optional group to add")
    check = sub.add_parser("check-installed", help="fail unless installed versions equal pins")
    check.add_argument("packages", nargs="+")
    check_args = sub.add_parser("check-args", help="fail unless NAME=VALUE build args equal pins")
    check_args.add_argument("assignments", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "build-args":
            print("\n".join(f"{k}={v}" for k, v in build_args(args.pyproject).items()))
        elif args.command == "requirements":
            print("\n".join(requirements(args.exclude, args.extra, args.pyproject)))
        elif args.command == "check-args":
            return _report(arg_mismatches(args.assignments, args.pyproject), "build arguments")
        else:
            return _report(installed_mismatches(args.packages, args.pyproject), "installed versions")
    except ValueError as exc:
        print(f"pins.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
