"""``run_pipeline.sh export list | pin V | unpin V | rollback [V] | latest``: the served model.

Every export adds a version ``DIR/export/<N>``; ``DIR/export/serving.json``
(dlrm_contracts.serving_state) says which one the score stage and the serving image load, which
are pinned and which were verified. These commands change that record, under the workdir's
lock (an export running at the same time cannot interleave with them):

- ``pin V`` keeps version V through every pruning until ``unpin V``;
- ``rollback [V]`` serves version V (by default the newest version older than the one served
  now) and holds it there: later exports add versions but do not replace it, and pruning never
  deletes it;
- ``latest`` ends the hold: the newest verified version is served again, and each new one.

A server started from the serving image follows the record within its poll interval, without a
restart (docker/serving/entrypoint.sh); the score stage scores with the served version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from dlrm_contracts.errors import UsageError
from dlrm_contracts.layout import EXPORT_FINGERPRINT, WorkdirLayout, export_versions
from dlrm_contracts.lock import WorkdirLock
from dlrm_contracts.serving_state import ServingState, read_state, served_version, write_state

ACTIONS = ("list", "pin", "unpin", "rollback", "latest")


def _versions(layout: WorkdirLayout) -> list[int]:
    return [v for v, _ in export_versions(layout.export)]


def _existing(layout: WorkdirLayout, version: int | None) -> int:
    versions = _versions(layout)
    if version is None or version not in versions:
        listed = ", ".join(map(str, versions)) or "none"
        raise UsageError(f"no export version {version} in {layout.export} (versions: {listed})")
    return version


def _rollback_target(state: ServingState, versions: list[int]) -> int:
    served = served_version(state, versions)
    older = [v for v in versions if served is not None and v < served]
    if not older:
        raise UsageError(
            f"no version older than the served one ({served}) to roll back to "
            f"(versions: {', '.join(map(str, versions)) or 'none'})"
        )
    return older[-1]


def _change(layout: WorkdirLayout, action: str, version: int | None) -> list[str]:
    """Apply ``action`` to the record under the lock; returns what to tell the user."""
    with WorkdirLock(layout.lock_file, f"pipeline export {action}"):
        state = read_state(layout.export)
        versions = _versions(layout)
        if action == "pin":
            state.pinned.add(_existing(layout, version))
            said = [f"version {version} pinned: pruning keeps it until `export unpin {version}`"]
        elif action == "unpin":
            if version not in state.pinned:
                said = [f"version {version} was not pinned"]
            else:
                state.pinned.discard(version)
                said = [
                    f"version {version} unpinned: pruning may delete it once it is not "
                    "among the newest export.keep_versions, served or the newest verified"
                ]
        elif action == "rollback":
            target = _existing(layout, version) if version is not None else _rollback_target(state, versions)
            state.held = target
            said = [f"serving version {target} (held: new exports do not replace it until `export latest`)"]
        else:  # latest
            state.held = None
            said = ["following the newest verified version again"]
        write_state(layout.export, state)
    return said


def version_table(layout: WorkdirLayout) -> dict[str, Any]:
    """Every version with what the record says of it, and the served one."""
    state = read_state(layout.export)
    found = export_versions(layout.export)
    served = served_version(state, [v for v, _ in found])
    rows = []
    for version, path in found:
        try:
            fingerprint = json.loads((path / EXPORT_FINGERPRINT).read_text())
        except (OSError, ValueError):
            fingerprint = {}
        rows.append(
            {
                "version": version,
                "served": version == served,
                "pinned": version in state.pinned,
                "verified": state.verified.get(version),
                "checkpoint_step": fingerprint.get("checkpoint_step"),
                "test_auc": fingerprint.get("test_auc"),
                "created": fingerprint.get("created"),
            }
        )
    return {
        "export": str(layout.export),
        "served_version": served,
        "held": state.held if state.held == served else None,
        "pinned": sorted(state.pinned),
        "versions": rows,
    }


def _describe(row: dict[str, Any]) -> str:
    marks = [
        m
        for m, on in (("served", row["served"]), ("pinned", row["pinned"]), ("verified", row["verified"]))
        if on
    ]
    return (
        f"  {row['version']:>4}  step {row['checkpoint_step']}  test auc {row['test_auc']}  "
        f"created {row['created']}  {' '.join(marks)}"
    )


def export_command(
    workdir: str | Path, action: str, version: int | None, say: Callable[[str], None] = print
) -> int:
    """One export command; its lines through ``say``, the version table as the last line."""
    if action in ("pin", "unpin") and version is None:
        raise UsageError(f"export {action} needs a VERSION (see `export list`)")
    if action in ("list", "latest") and version is not None:
        raise UsageError(f"export {action} takes no VERSION")
    layout = WorkdirLayout.at(workdir)
    if not layout.root.is_dir():
        raise UsageError(f"no workdir at {layout.root}")
    if action != "list":
        for line in _change(layout, action, version):
            say(line)
    table = version_table(layout)
    for row in table["versions"]:
        say(_describe(row))
    say(json.dumps({"status": "ok", **table}, sort_keys=True))
    return 0
