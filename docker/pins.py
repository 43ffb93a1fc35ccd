"""The image build's view of the project's pins: every version comes from pyproject.toml.

The Dockerfiles declare version ARGs without values; ``docker/build.sh`` fills them from here,
and each image re-checks inside the build that what got installed is what pyproject.toml pins
(``check-installed``), so a hand-typed ``--build-arg`` cannot drift from the project.

    python docker/pins.py build-args                      # NAME=VALUE, one per line
    python docker/pins.py requirements [--exclude PKG]... [--extra NAME]...
    python docker/pins.py check-installed PKG...          # exit 1 unless installed == pinned
    python docker/pins.py check-args NAME=VALUE...        # exit 1 unless each build arg == pin
    python docker/pins.py locked LOCK PKG                 # PKG's line of a lock, hashes included
    python docker/pins.py check-lock LOCK.in LOCK         # exit 1 unless the lock has every pin

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
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[A-Za-z0-9._,-]*\])?\s*==\s*([^\s;,]+)\s*$")


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


def requirements(
    exclude: list[str], extras: list[str], pyproject: Path = PYPROJECT, build_system: bool = False
) -> list[str]:
    """Pinned requirement lines; with ``build_system``, also what pyproject.toml's
    [build-system] requires (so the project installs without fetching anything unlocked)."""
    groups = load_pins(pyproject)
    unknown = sorted(set(extras) - set(groups))
    if unknown:
        raise ValueError(f"unknown extra(s) {unknown}; pyproject.toml has {sorted(groups)}")
    skip = {canonical(name) for name in exclude}
    chosen = {}
    for group in ["", *extras]:
        chosen.update(groups[group])
    lines = [f"{name}=={version}" for name, version in sorted(chosen.items()) if name not in skip]
    if build_system:
        with open(pyproject, "rb") as fh:
            lines += tomllib.load(fh).get("build-system", {}).get("requires", [])
    return lines


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
            problems.append(
                f"{name}={value or '(empty)'}, pyproject pins {expected[name]} "
                "(build with docker/build.sh, which passes the pins)"
            )
    return problems


def parse_lock(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """A pip-compile --generate-hashes file: canonical name -> (version, its sha256 hashes)."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n", " ", lock.read_text(encoding="utf-8"))
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):  # an option line (--extra-index-url, ...)
            continue
        requirement, *options = line.split()
        name, _, version = requirement.partition("==")
        hashes = [o.removeprefix("--hash=sha256:") for o in options if o.startswith("--hash=sha256:")]
        entries[canonical(name)] = (version, hashes)
    return entries


def locked_line(lock: Path, package: str) -> str:
    """``pkg==version --hash=sha256:...`` for ``pip download --require-hashes -r``."""
    entry = parse_lock(lock).get(canonical(package))
    if entry is None:
        raise ValueError(f"{package} is not in {lock}")
    version, hashes = entry
    return " ".join([f"{canonical(package)}=={version}", *(f"--hash=sha256:{h}" for h in hashes)])


def lock_problems(requirements_in: Path, lock: Path) -> list[str]:
    """What makes ``lock`` disagree with its input: an exact pin locked at another version or
    missing, or an entry without a hash (pip --require-hashes would refuse the whole file)."""
    entries = parse_lock(lock)
    problems = [
        f"{name}=={version}: no sha256 hash"
        for name, (version, hashes) in sorted(entries.items())
        if not hashes or not version
    ]
    for line in requirements_in.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line.split("#", 1)[0])
        if not match:
            continue
        name, version = canonical(match.group(1)), match.group(2)
        if name not in entries:
            problems.append(f"{name}=={version} is not in {lock.name}")
        elif entries[name][0] != version:
            problems.append(f"{name}: {lock.name} has {entries[name][0]}, the pin is {version}")
    return problems


def _report(problems: list[str], what: str) -> int:
    if problems:
        print(f"pins.py: {what} differ from pyproject.toml:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"pins.py: {what} match pyproject.toml")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build-args", help="NAME=VALUE lines for docker build --build-arg")
    req = sub.add_parser("requirements", help="pip requirement lines from the pins")
    req.add_argument("--exclude", action="append", default=[], help="package to leave out")
    req.add_argument("--extra", action="append", default=[], help="optional group to add")
    req.add_argument(
        "--build-system", action="store_true", help="add [build-system] requires (setuptools, wheel)"
    )
    check = sub.add_parser("check-installed", help="fail unless installed versions equal pins")
    check.add_argument("packages", nargs="+")
    check_args = sub.add_parser("check-args", help="fail unless NAME=VALUE build args equal pins")
    check_args.add_argument("assignments", nargs="+")
    locked = sub.add_parser("locked", help="a package's line of a lock, with its hashes")
    locked.add_argument("lock", type=Path)
    locked.add_argument("package")
    check_lock = sub.add_parser("check-lock", help="fail unless a lock has every pin of its .in")
    check_lock.add_argument("requirements_in", type=Path)
    check_lock.add_argument("lock", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "build-args":
            print("\n".join(f"{k}={v}" for k, v in build_args(args.pyproject).items()))
        elif args.command == "requirements":
            print("\n".join(requirements(args.exclude, args.extra, args.pyproject, args.build_system)))
        elif args.command == "check-args":
            return _report(arg_mismatches(args.assignments, args.pyproject), "build arguments")
        elif args.command == "locked":
            print(locked_line(args.lock, args.package))
        elif args.command == "check-lock":
            return _report(lock_problems(args.requirements_in, args.lock), f"{args.lock.name}'s pins")
        else:
            return _report(installed_mismatches(args.packages, args.pyproject), "installed versions")
    except ValueError as exc:
        print(f"pins.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
