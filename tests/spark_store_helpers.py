"""What the preprocess tests at an object store share: a run of the job in this process, and
what readers of its workdir get (local or at a URL), to compare a run at a store with a local
one byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

from dlrm_contracts import workdir_io
from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import SPLITS
from spark_fixtures import spark_config
from spark_jobs.preprocess import run_preprocess

# What differs between any two runs, or between a file on disk and an object (its mtime in the
# days' fingerprints): left out of the records' comparison.
_VARYING = ("timings", "cpu_seconds", "days")


def run_arrow(input_dir, workdir, threshold: str) -> dict:
    """The preprocess job (Arrow engine) on the shared session's config, in this process."""
    return run_preprocess(
        input_dir, workdir, spark_config(), PreprocessConfig(frequency_threshold=threshold, engine="arrow")
    )


def published_bytes(workdir) -> dict[str, bytes]:
    """What readers of the workdir get: each split's and the dictionaries' published files
    (at a URL: those their markers name), the records and the rejects, by name."""
    layout = WorkdirLayout.at(workdir)
    files = {}
    for name in (*SPLITS, "dictionaries"):
        final = layout.parquet / name
        root = workdir_io.published_dir(final)
        assert root is not None, f"{final} was not published"
        parts = workdir_io.published_files(final) if name in SPLITS else _all_files(root)
        files.update({f"{name}/{_relative(p, root)}": p.read_bytes() for p in parts})
    for record in ("model_size.json", "data_quality.json"):
        files[record] = workdir_io.read_text(layout.parquet / record).encode()
    files["rejects"] = b"".join(
        p.read_bytes() for p in _all_files(layout.rejects) if p.name.endswith(".json")
    )
    return files


def _relative(path, root) -> str:
    return path.relative_to(root) if workdir_io.is_remote(root) else path.relative_to(root).as_posix()


def _all_files(root):
    if workdir_io.is_remote(root):
        return root.files()
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and not p.name.startswith((".", "_")))


def stable_summary(workdir) -> dict:
    """The run's preprocess.json without what differs between any two runs."""
    record = json.loads(workdir_io.read_text(WorkdirLayout.at(workdir).parquet / "preprocess.json"))
    return {k: v for k, v in record.items() if k not in _VARYING}
