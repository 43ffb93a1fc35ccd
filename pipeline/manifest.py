"""Stage manifests: what a stage consumed, how it was configured, what it produced, and when.

A stage is done when its completion marker holds the same key as the one computed now from its
inputs and config, and its outputs still have the fingerprint the manifest recorded. Markers are
written last (after the outputs and the manifest), by rename, so a run killed at any point
leaves either a finished stage or one that will be redone.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrm_contracts.atomic import open_append, write_json_atomic
from dlrm_contracts.storage import Location
from dlrm_contracts.fingerprint import stable_hash

log = logging.getLogger("pipeline")
_warned: set[str] = set()  # damaged records already reported in this run


def read_record(path: Path | Location) -> dict[str, Any] | None:
    """A JSON object the stages wrote (manifest, marker, dataset description), or None when it
    is missing or damaged (not JSON, not an object): a damaged record says nothing, so the
    stage that wrote it counts as not done and runs again. A warning names the file. ``path``
    may be a Location at a workdir URL (dlrm_contracts.storage)."""
    try:
        data = json.loads(path.read_bytes() if isinstance(path, Location) else Path(path).read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if not isinstance(exc, IsADirectoryError) and str(path) not in _warned:
            _warned.add(str(path))
            log.warning(
                "%s is not valid JSON (%s): ignored, the stage that writes it runs again",
                path,
                exc.__class__.__name__,
            )
        return None
    if not isinstance(data, dict):
        _warned.add(str(path))
        log.warning("%s is not a JSON object: ignored, the stage that writes it runs again", path)
        return None
    return data


@dataclass
class StageRecord:
    """What one stage did in one run; becomes the stage's manifest."""

    stage: str
    key: str
    inputs: dict[str, Any]
    action: str = "pending"  # ran | skipped | derived
    engine: str = ""  # spark | converters | rethreshold | horovod | python | -
    summary: dict[str, Any] = field(default_factory=dict)
    outputs_fingerprint: str = ""
    started: float = 0.0
    seconds: float = 0.0
    rows: int | None = None  # rows (samples, lines) it went through
    cpu_seconds: float | None = None  # this machine's processes (a cluster's executors not)
    # Name -> [size, mtime_ns] of each output file, for the stages whose outputs later stages
    # check by name (the binary dataset): which file changed, not only that one did.
    output_files: dict[str, list[int]] | None = None

    def rows_per_s(self) -> float | None:
        return round(self.rows / self.seconds, 1) if self.rows and self.seconds > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "key": self.key,
            "inputs": self.inputs,
            "action": self.action,
            "engine": self.engine,
            "summary": self.summary,
            "outputs_fingerprint": self.outputs_fingerprint,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "seconds": round(self.seconds, 3),
            "rows": self.rows,
            "rows_per_s": self.rows_per_s(),
            "cpu_seconds": self.cpu_seconds,
            **({"output_files": self.output_files} if self.output_files is not None else {}),
        }


class ManifestStore:
    def __init__(self, directory: Path):
        self.directory = directory

    def manifest_path(self, stage: str) -> Path:
        return self.directory / f"{stage}.json"

    def marker_path(self, stage: str) -> Path:
        return self.directory / f"{stage}.done"

    @staticmethod
    def key_of(inputs: dict[str, Any]) -> str:
        return stable_hash(inputs)

    def load(self, stage: str) -> dict[str, Any] | None:
        return read_record(self.manifest_path(stage))

    def is_done(self, stage: str, key: str, outputs_fingerprint: str) -> bool:
        marker = read_record(self.marker_path(stage))
        manifest = self.load(stage)
        return bool(
            marker
            and manifest
            and marker.get("key") == key
            and manifest.get("key") == key
            and manifest.get("outputs_fingerprint") == outputs_fingerprint
        )

    def invalidate(self, stage: str) -> None:
        self.marker_path(stage).unlink(missing_ok=True)

    def complete(self, record: StageRecord) -> None:
        write_json_atomic(self.manifest_path(record.stage), record.as_dict())
        write_json_atomic(self.marker_path(record.stage), {"key": record.key})

    def append_history(self, entry: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(entry, sort_keys=True, default=str) + "\n").encode()
        # appended to, never through a symbolic link planted at its name (refused, naming it)
        with open_append(self.directory / "history.jsonl", binary=True, buffering=0) as fh:
            size = fh.seek(0, os.SEEK_END)
            try:
                if fh.write(line) != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), fh.name)
            except OSError:  # a full disk: no half line for the next run to append to
                os.ftruncate(fh.fileno(), size)
                raise
