"""Checkpoints and exports at a workdir URL: published as the node keeps them, restored on a
node whose local side lacks them.

The trainer writes checkpoints and the export stage writes model versions on this node's local
side (pipeline/remote.py): they need a POSIX filesystem. So that a train stage moved to another
node (or run after the disk was wiped) resumes instead of starting over, the pipeline publishes
them at the URL: each checkpoint as the trainer keeps it (:class:`Publisher`, while the train
stage runs), and the whole tree after the train and export stages, also when a stage fails or
the run is stopped; it restores them before a stage that needs them.

A tree (``checkpoints/``, ``export/``) is published unit by unit (a unit: one checkpoint
``step-N/``, one export version ``N/``; the tree's top-level files such as ``run.json`` are one
more unit) with the commit protocol of dlrm_contracts.object_commit, made incremental:

1. each unit that changed is uploaded under a fresh prefix ``TREE/<unit>/.v-<time>-<random>/``
   (the top-level unit under ``TREE/.v-.../``); a unit whose files have the sizes and times
   the index records is not uploaded again (a checkpoint is written once);
2. one small index, ``TREE/_PUBLISHED.json``, is written last, naming each kept unit's version
   and its files with their sizes and modification times: one PUT, replacing the previous
   index whole;
3. then the units the node no longer keeps (retention) and the superseded versions are
   deleted.

Readers trust only what the index names. A publication killed before its index leaves the
previous one readable (its versions are deleted only after the new index is written) and
objects nobody reads, deleted by the next publication. A restored file gets the modification
time the index records, so the stages' output fingerprints (names, sizes, times) on the new
node are the ones the publishing node's manifests recorded: a finished stage stays finished.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dlrm_contracts.atomic import replace_directory, replace_file, temporary_sibling
from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.layout import (
    CURRENT_RUN_JSON,
    checkpoint_run,
    complete_checkpoints,
    current_run,
    export_versions,
    latest_checkpoint,
    read_checkpoint_meta,
)
from dlrm_contracts.object_commit import VERSION_PREFIX
from dlrm_contracts.workdir_io import new_version_name
from dlrm_contracts.storage import Location, resolve
from dlrm_contracts.superseded import set_aside

log = logging.getLogger("pipeline")

INDEX = "_PUBLISHED.json"
TOP = "."  # the unit of a tree's top-level files


@dataclass(frozen=True)
class Tree:
    """A directory of the local side published unit by unit.

    Args:
        name: its path relative to the workdir.
        units: the unit directories this node keeps in it (complete ones only).
        top_files: its top-level files published with them.
        unit_name: what a unit's name looks like (anything else at the URL is left alone).
        describe: what a restore decides on, recorded in the index: ``newest`` (the latest
            step, the newest version) and for checkpoints the current ``run``.
    """

    name: str
    units: Callable[[Path], list[Path]]
    top_files: Callable[[Path], list[Path]]
    unit_name: re.Pattern
    describe: Callable[[Path], dict]


def _checkpoint_units(root: Path) -> list[Path]:
    return [path for _step, path in complete_checkpoints(root)]


def _latest_step(root: Path) -> int | None:
    latest = latest_checkpoint(root)
    return None if latest is None else int(latest.name.split("-")[1])


def _newest_export(root: Path) -> int | None:
    found = export_versions(root)
    return found[-1][0] if found else None


CHECKPOINTS = Tree(
    "checkpoints",
    _checkpoint_units,
    lambda root: [root / CURRENT_RUN_JSON] if (root / CURRENT_RUN_JSON).is_file() else [],
    re.compile(r"^step-\d+$"),
    lambda root: {"newest": _latest_step(root), "run": current_run(root)},
)
EXPORTS = Tree(
    "export",
    lambda root: [path for _version, path in export_versions(root)],
    lambda root: (
        sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
        if root.is_dir()
        else []
    ),
    re.compile(r"^\d+$"),
    lambda root: {"newest": _newest_export(root)},
)


# ---------------------------------------------------------------------------- the index
def read_index(final: Location) -> dict | None:
    """The tree's index (None: nothing published)."""
    try:
        record = json.loads((final / INDEX).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise DatasetError(f"{final / INDEX} is not a readable index: the publication is damaged") from None
    if not isinstance(record, dict) or not isinstance(record.get("units"), dict):
        raise DatasetError(f"{final / INDEX} names no units: the publication is damaged")
    return record


def _unit_files(tree: Tree, local: Path) -> dict[str, dict[str, Path]]:
    """unit name -> (relative name -> file) of what this node keeps."""
    units = {
        unit.name: {p.relative_to(unit).as_posix(): p for p in sorted(unit.rglob("*")) if p.is_file()}
        for unit in tree.units(local)
    }
    top = {p.name: p for p in tree.top_files(local)}
    if top:
        units[TOP] = top
    return units


def _stats(files: dict[str, Path]) -> dict[str, list[int]]:
    stats = {}
    for name, path in sorted(files.items()):
        st = path.stat()
        stats[name] = [st.st_size, st.st_mtime_ns]
    return stats


def _base(final: Location, unit: str) -> Location:
    return final if unit == TOP else final / unit


# ---------------------------------------------------------------------------- publish
class UnitChanged(RuntimeError):
    """A unit's files changed while they were uploaded (a writer still at work): the version
    is not named; the next publication uploads the unit again."""


def publish_tree(tree: Tree, local: Path, final: Location) -> dict[str, int]:
    """This node's ``local`` tree published at ``final`` (see the module docstring); returns
    what it cost: units uploaded, bytes uploaded, units removed."""
    record = read_index(final)
    before = record["units"] if record else {}
    described = tree.describe(local)  # before the units: never a step newer than they hold
    units, uploaded, sent = {}, [], 0
    for unit, files in sorted(_unit_files(tree, local).items()):
        stats = _stats(files)
        if before.get(unit, {}).get("files") == stats:
            units[unit] = before[unit]
            continue
        version = _base(final, unit) / new_version_name()
        for name, path in files.items():
            with path.open("rb") as fh, (version / name).open_output() as out:
                while chunk := fh.read(1 << 24):
                    out.write(chunk)
            sent += stats[name][0]
        if _stats(files) != stats:
            raise UnitChanged(f"{local / unit} changed while it was uploaded")
        units[unit] = {"version": version.name, "files": stats}
        uploaded.append(unit)
    index = {"units": units, **described}
    if record is None or {k: v for k, v in record.items() if k != "published"} != index:
        index["published"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        (final / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    removed = _remove_unnamed(tree, final, units, set(uploaded) | (set(before) - set(units)))
    return {"units": len(units), "uploaded": len(uploaded), "bytes": sent, "removed": removed}


def _remove_unnamed(tree: Tree, final: Location, units: dict, touched: set[str]) -> int:
    """Delete what the index does not name: units no longer kept, and in the units this
    publication touched the versions it superseded (and a killed publication's leftovers)."""
    removed = 0
    for entry in final.iterdir():
        if tree.unit_name.match(entry.name) and entry.name not in units:
            entry.delete_tree()
            removed += 1
    for unit in (touched & set(units)) | (touched & {TOP}):
        keep = units.get(unit, {}).get("version")
        for entry in _base(final, unit).iterdir():
            if entry.name.startswith(VERSION_PREFIX) and entry.name != keep:
                entry.delete_tree()
    return removed


# ---------------------------------------------------------------------------- restore
def restore_tree(final: Location, local: Path, record: dict) -> tuple[list[str], int]:
    """The units ``record`` (the index at ``final``) names, copied to ``local`` where this
    node's copy differs, with their recorded times; returns (units copied, bytes).

    Raises:
        DatasetError: a named file is missing at the URL or of another size.
    """
    copied, received = [], 0
    for unit, entry in sorted(record["units"].items()):
        target = local if unit == TOP else local / unit
        files = entry["files"]
        here = {name: target / name for name in files if (target / name).is_file()}
        if len(here) == len(files) and _stats(here) == files:
            continue
        version = _base(final, unit) / entry["version"]
        staging = temporary_sibling(local / (unit if unit != TOP else "top"), "restore")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            for name, (size, mtime_ns) in files.items():
                path = staging / name
                try:
                    (version / name).copy_to(resolve(path))
                except OSError as exc:
                    raise DatasetError(
                        f"{version / name} cannot be read ({exc}): the publication is damaged"
                    ) from None
                if path.stat().st_size != size:
                    raise DatasetError(
                        f"{version / name} is not of its recorded size {size}: the publication is damaged"
                    )
                os.utime(path, ns=(mtime_ns, mtime_ns))
                received += size
            if unit == TOP:
                for name in files:
                    replace_file(staging / name, local / name)
            else:
                replace_directory(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        copied.append(unit)
    return copied, received


def restore_checkpoints(final: Location, local: Path) -> str | None:
    """The published checkpoints restored to ``local`` unless this node's are as new: the
    same run (``run.json``) at the published latest step or beyond. Checkpoints of another
    run here are set aside (``superseded/``, never deleted) first. Returns what was done."""
    record = read_index(final)
    if record is None:
        return None
    run, newest = record.get("run"), record.get("newest")
    mine = _latest_step(local)
    if current_run(local) == run and mine is not None and (newest is None or mine >= newest):
        return None
    others = [p for _s, p in complete_checkpoints(local) if checkpoint_run(read_checkpoint_meta(p)) != run]
    set_aside(local, others, f"the run published at {final} was restored in their place")
    units, received = restore_tree(final, local, record)
    return f"{len(units)} of {len(record['units'])} published units restored ({received / 2**20:.1f} MiB), latest step {newest}"


def restore_exports(final: Location, local: Path) -> str | None:
    """The published export versions restored to ``local`` when this node's newest version is
    older than the published newest (or it has none)."""
    record = read_index(final)
    if record is None:
        return None
    newest, mine = record.get("newest"), _newest_export(local)
    if newest is None or (mine is not None and mine >= newest):
        return None
    units, received = restore_tree(final, local, record)
    return f"{len(units)} of {len(record['units'])} published units restored ({received / 2**20:.1f} MiB), newest version {newest}"


# ---------------------------------------------------------------------------- while a stage runs
POLL_SECONDS = 5.0  # a look at the local disk (no request): small beside a checkpoint's interval


class Publisher:
    """Publishes a tree in the background while a stage writes it (the trainer's checkpoints,
    as it keeps them): whenever this node's units change, polled on the local disk every
    ``poll`` seconds, so the store sees no request while nothing changes. A round that fails
    (a unit retired or rewritten while it was uploaded, the store unreachable) is tried again
    at the next change or poll; the stage's own publication when it ends is the one that must
    succeed. Use as a context manager around the stage's process."""

    def __init__(self, tree: Tree, local: Path, final: Location, poll: float = POLL_SECONDS):
        import threading

        self.tree, self.local, self.final, self.poll = tree, local, final, poll
        self.published = 0  # rounds that published something
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"publish-{tree.name}", daemon=True)

    def __enter__(self) -> "Publisher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _snapshot(self) -> dict:
        try:
            return {unit: _stats(files) for unit, files in _unit_files(self.tree, self.local).items()}
        except OSError:
            return {}  # a unit went while it was looked at: look again

    def _run(self) -> None:
        last: dict | None = None
        failing = False
        while not self._stop.wait(self.poll):
            now = self._snapshot()
            if not now or now == last:
                continue
            try:
                cost = publish_tree(self.tree, self.local, self.final)
            except (OSError, DatasetError, UnitChanged) as exc:
                if not failing:  # one line per streak, not one per poll
                    log.info("%s not published yet (%s); trying again", self.local, exc)
                failing = True
                continue
            last, failing = now, False
            if cost["uploaded"] or cost["removed"]:
                self.published += 1
                log.info(
                    "%s published at %s: %d units, %d uploaded (%.1f MiB), %d removed",
                    self.local,
                    self.final,
                    cost["units"],
                    cost["uploaded"],
                    cost["bytes"] / 2**20,
                    cost["removed"],
                )
