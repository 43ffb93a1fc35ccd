"""Checkpoints set aside, never deleted: a run that cannot continue the checkpoints it finds
(a setting of the model changed, the dataset changed, --force, --no-resume) moves them to
``DIR/checkpoints/superseded/<time>/`` with a ``why.json``, where they stay until removed with
one ``rm -r``. Days of training are never lost to a config edit; the space they hold is
listed by the preflight, the train stage's summary and the report.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

from dlrm_contracts.atomic import write_json_atomic
from dlrm_contracts.layout import (
    CURRENT_RUN_JSON,
    SUPERSEDED_DIR,
    checkpoint_run,
    complete_checkpoints,
    current_run,
    read_checkpoint_meta,
)

WHY_JSON = "why.json"


def tree_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (0 when it does not exist)."""
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _new_folder(root: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = root / SUPERSEDED_DIR
    for n in range(1000):
        folder = base / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}: no free name for {stamp}")


def set_aside(
    root: Path, paths: Iterable[Path], reason: str, changed: list[str] | None = None
) -> dict[str, Any] | None:
    """Move the checkpoint directories ``paths`` (under ``root``) to a new
    ``superseded/<time>/`` folder, its ``why.json`` written first; the current-run record goes
    with them when no checkpoint of that run stays. Returns that record (None: nothing to
    move). Partial checkpoints (``.step-*.tmp``, never usable) are removed."""
    for partial in root.glob(".step-*.tmp"):
        shutil.rmtree(partial, ignore_errors=True)
    paths = [Path(p) for p in paths if Path(p).exists()]
    if not paths:
        return None
    folder = _new_folder(root)
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reason": reason,
        "changed": list(changed or []),
        "checkpoints": sorted(p.name for p in paths),
        "bytes": sum(tree_bytes(p) for p in paths),
        "path": str(folder),
        "remove_with": f"rm -r {folder}",
    }
    write_json_atomic(folder / WHY_JSON, record)
    for path in paths:
        path.rename(folder / path.name)
    run_id = current_run(root)
    remaining = {checkpoint_run(read_checkpoint_meta(p)) for _, p in complete_checkpoints(root)}
    if run_id is not None and run_id not in remaining:
        (root / CURRENT_RUN_JSON).rename(folder / CURRENT_RUN_JSON)
    return record


def superseded_runs(root: Path) -> list[dict[str, Any]]:
    """What ``superseded/`` holds, oldest first: each folder's path, bytes and why (as far as
    its ``why.json`` still says)."""
    base = Path(root) / SUPERSEDED_DIR
    if not base.is_dir():
        return []
    out = []
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        try:
            why = json.loads((folder / WHY_JSON).read_text())
        except (OSError, ValueError):
            why = {}
        out.append(
            {
                "path": str(folder),
                "bytes": tree_bytes(folder),
                "reason": why.get("reason") if isinstance(why, dict) else None,
            }
        )
    return out
