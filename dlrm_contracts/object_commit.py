"""All-or-nothing publication of a directory on an object store, which has no rename.

On a local filesystem a directory is written under a temporary name and renamed into place
(dlrm_contracts.atomic, whose POSIX order stays as it is). An object store has no atomic
rename of a prefix: copying objects one by one onto the final names would let a reader, or a
run that was killed halfway, see a mix of two versions. So here:

1. every file of the new version is uploaded under a fresh prefix ``FINAL/.v-<time>-<random>/``
   (each upload appears whole or not at all);
2. one small marker, ``FINAL/_COMMIT.json``, is written last, naming that prefix and every
   file in it with its size: one PUT, which replaces the previous marker whole;
3. only then are the other versions' prefixes deleted.

Readers trust only what the marker names (:func:`committed_version`, :func:`committed_files`):
a version without a marker (a killed writer) is never read and is deleted by the next
publication; a marker naming a file that is missing or of another size means the directory
was damaged, and is reported, not read around. A kill between 2 and 3 leaves an extra old
version, deleted next time. One writer per workdir (the workdir lock) is assumed: two writers
racing on one marker would each publish a whole version, the later one winning.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import TypedDict, cast

import pyarrow.fs as pafs

from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.storage import Location

COMMIT_MARKER = "_COMMIT.json"
VERSION_PREFIX = ".v-"


class CommitRecord(TypedDict):
    """What a marker names: its version's prefix and every file in it (name -> size)."""

    version: str
    files: dict[str, int]


def _new_version() -> str:
    return f"{VERSION_PREFIX}{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def publish_directory(source: Path, final: Location) -> Location:
    """The local directory ``source`` published as ``final`` (see the module docstring);
    returns the version's location."""
    files = sorted(p for p in Path(source).rglob("*") if p.is_file())
    version = final / _new_version()
    named = {}
    for path in files:
        relative = path.relative_to(source).as_posix()
        target = version / relative
        with path.open("rb") as fh, target.open_output() as out:
            while chunk := fh.read(1 << 24):
                out.write(chunk)
        named[relative] = path.stat().st_size
    write_marker(final, version.name, named)
    remove_other_versions(final, keep=version.name)
    return version


def write_marker(final: Location, version: str, files: dict[str, int]) -> None:
    """Publish ``version`` (a prefix under ``final`` holding ``files``: name -> size)."""
    record = {
        "version": version,
        "files": dict(sorted(files.items())),
        "committed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (final / COMMIT_MARKER).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_marker(final: Location) -> CommitRecord | None:
    """The marker's record, None when there is none (nothing committed)."""
    marker = final / COMMIT_MARKER
    try:
        record = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise DatasetError(
            f"{marker} is not a readable commit marker: the directory's "
            "publication is damaged; run the stage again"
        ) from None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("version"), str)
        and record["version"].startswith(VERSION_PREFIX)
        and isinstance(record.get("files"), dict)
    ):
        raise DatasetError(f"{marker} does not name a version and its files; run the stage again")
    return cast(CommitRecord, record)  # its shape checked just above


def committed_version(final: Location) -> Location | None:
    """The version directory the marker names, None when nothing was committed."""
    record = read_marker(final)
    return None if record is None else final / record["version"]


def committed_files(final: Location, check: bool = True) -> dict[str, Location]:
    """name -> Location of every file of the committed version ({} when none); with
    ``check``, each must be there at its recorded size."""
    record = read_marker(final)
    if record is None:
        return {}
    version = final / record["version"]
    found = {}
    if check:
        present = {p.relative_to(version): p for p in version.files()}
    for name, size in record["files"].items():
        location = version / name
        if check:
            have = present.get(name)
            if have is None or have.size() != size:
                raise DatasetError(
                    f"{final}: the committed file {name} is missing or not of "
                    f"its recorded size {size}: the directory was damaged; run "
                    "the stage again"
                )
        found[name] = location
    return found


def is_committed(final: Location) -> bool:
    return read_marker(final) is not None


def remove_other_versions(final: Location, keep: str | None = None) -> list[str]:
    """Delete every version prefix under ``final`` but ``keep`` (by default the committed one):
    uncommitted leftovers of killed writers and superseded versions."""
    if keep is None:
        record = read_marker(final)
        keep = record["version"] if record else None
    removed = []
    for entry in final.iterdir():
        if entry.name.startswith(VERSION_PREFIX) and entry.name != keep:
            entry.delete_tree()
            removed.append(entry.name)
    return removed


def download_committed(final: Location, target: Path) -> list[Path]:
    """Every committed file copied under the local directory ``target`` (same relative names)."""
    copied = []
    for name, location in committed_files(final).items():
        destination = Path(target) / name
        location.copy_to(Location(_local_fs(), str(destination), ""))
        copied.append(destination)
    return copied


def _local_fs() -> pafs.FileSystem:
    from dlrm_contracts.storage import resolve

    return resolve("/").fs
