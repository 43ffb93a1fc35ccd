"""Which export version is served, which are pinned, which verified: ``DIR/export/serving.json``.

The export stage adds versions and prunes old ones; the score stage and the serving image
(docker/serving/entrypoint.sh) load one of them. This small file is the one place that says
which, so that pruning can never delete the model in use and a bad version can be rolled
back with one command (``run_pipeline.sh export rollback``)::

    {"format_version": 1,
     "held": 3,                      # set by a rollback: served until `export latest`
     "pinned": [2],                  # never pruned, until unpinned
     "served_version": 3,            # what a server and the score stage load (derived)
     "verified": {"2": "<time>", "3": "<time>", "4": "<time>"}}

``served_version`` is derived from the rest and the versions on disk: the held version when
there is one, else the newest verified version (an export checks its SavedModel loads and
scores before it is renamed into place, and records it here once it is), else the newest
version (a workdir exported before this file existed). It is written on a line of its own so
that the serving image, which has no Python, can read it with sed.

The file is replaced atomically (written beside, synced, renamed): a reader sees the old or
the new state, never a mix. A damaged file is refused, never guessed at: pruning then deletes
nothing and the commands name it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlrm_contracts.atomic import write_text_atomic
from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.layout import SERVING_JSON, export_versions

FORMAT_VERSION = 1


class ServingStateError(PipelineError):
    """``serving.json`` cannot be read as a serving state."""

    default_code = ExitCode.USAGE


@dataclass
class ServingState:
    pinned: set[int] = field(default_factory=set)
    held: int | None = None
    verified: dict[int, str] = field(default_factory=dict)


def state_path(export_dir: str | Path) -> Path:
    return Path(export_dir) / SERVING_JSON


def _damaged(path: Path, why: str) -> ServingStateError:
    return ServingStateError(
        f"{path} is damaged ({why}): it records the pinned, held and verified export versions; "
        "restore it from a backup, or delete it to forget them (the newest version is then "
        "served and pruning keeps only the newest export.keep_versions)"
    )


def _version(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) >= 1:
        return int(value)
    return None


def read_state(export_dir: str | Path) -> ServingState:
    """The state recorded under ``export_dir`` (empty when there is no file yet)."""
    path = state_path(export_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ServingState()
    except (OSError, ValueError) as exc:
        raise _damaged(path, str(exc)) from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        raise _damaged(path, f"not a format_version {FORMAT_VERSION} record")
    pinned, held, verified = data.get("pinned", []), data.get("held"), data.get("verified", {})
    if not isinstance(pinned, list) or not isinstance(verified, dict):
        raise _damaged(path, "'pinned' must be a list and 'verified' a mapping")
    return ServingState(
        {_recorded_version(v, path) for v in pinned},
        _recorded_version(held, path) if held is not None else None,
        {_recorded_version(k, path): str(t) for k, t in verified.items()},
    )


def _recorded_version(value: object, path: Path) -> int:
    """``value`` as a version number, or the refusal of the file that records it."""
    version = _version(value)
    if version is None:
        raise _damaged(path, "a version that is not a positive integer")
    return version


def served_version(state: ServingState, versions: list[int]) -> int | None:
    """What is served of ``versions`` (those on disk): see the module docstring."""
    if state.held in versions:
        return state.held
    verified = [v for v in versions if v in state.verified]
    if verified:
        return max(verified)
    return max(versions) if versions else None


def protected_versions(state: ServingState, versions: list[int]) -> set[int]:
    """The versions pruning must keep whatever ``keep_versions`` says: the pinned, the served
    one and the newest verified one (the last known good model to roll back to)."""
    kept = state.pinned & set(versions)
    served = served_version(state, versions)
    verified = [v for v in versions if v in state.verified]
    kept |= {v for v in (served, max(verified) if verified else None) if v is not None}
    return kept


def write_state(export_dir: str | Path, state: ServingState) -> dict[str, object]:
    """Record ``state`` (with its served version, from the versions on disk now); returns
    what was written. Entries of versions no longer on disk are dropped, except pins, which
    only a user removes."""
    versions = [v for v, _ in export_versions(export_dir)]
    held = state.held if state.held in versions else None
    record: dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "held": held,
        "pinned": sorted(state.pinned),
        "served_version": served_version(ServingState(state.pinned, held, state.verified), versions),
        "verified": {str(v): t for v, t in sorted(state.verified.items()) if v in versions},
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_text_atomic(state_path(export_dir), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def served_export(export_dir: str | Path) -> Path | None:
    """The directory of the served version (None before any export): what the score stage
    scores with and what the serving image loads."""
    found = export_versions(export_dir)
    version = served_version(read_state(export_dir), [v for v, _ in found])
    return dict(found).get(version) if version is not None else None
