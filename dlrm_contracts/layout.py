"""Where every artifact lives under a pipeline workdir, and every file name the wings share.

One place names the paths so that stages, wings, tests and users agree; the layout is part of
the product's interface (schedulers read it), so change it only with a note in the README.

    DIR/raw/                      generated day files (only when the generate stage runs)
    DIR/counts/values/day=<k>/    per-day categorical value counts (parquet)
    DIR/counts/days.json          which days were counted, with their fingerprints
    DIR/counts/histogram.parquet  distinct values per total count: the table size at any threshold
    DIR/parquet/preprocess.json   what the Spark job did (threshold spec, rows, engine)
    DIR/parquet/_SUCCESS          the parquet splits are complete
    DIR/parquet/{train,test,validation}/   transformed parquet (with stable ids: hard links to
                                  the days' parts below, train days in day order)
    DIR/parquet/days/day=<k>/     stable ids only: day k transformed alone ({train} or
                                  {test,validation} parts, and day.json: its role, fingerprint,
                                  the dictionaries it was transformed with); reused by later runs
    DIR/parquet/segments.json     stable ids only: each split's days, their files and rows (the
                                  converter reuses the binary of a day it converted before)
    DIR/parquet/model_size.json   table sizes of the parquet dataset
    DIR/parquet/dictionaries/     value → id per column (parquet, partitioned by column)
    DIR/parquet/dictionary_index/ the same as memory-mapped hash tables (Arrow engine)
    DIR/parquet/data_quality.json rows read / written / padded / rejected per reason per day
    DIR/parquet/_REMOVED.json     the splits were deleted after conversion (keep_parquet: false)
    DIR/rejects/                  rejected raw lines with their reason
    DIR/binary/{train,test,validation}/    split binary dataset (+ model_size.json, dataset.json)
    DIR/mlperf_multihot/          convert.formats: the same rows in the MLPerf DLRMv2 reference's
                                  multi-hot layout (day_<d>_sparse_multi_hot.npz, _dense.npy,
                                  _labels.npy; docs/converters.md)
    DIR/checkpoints/step-<N>/     trainer checkpoints (each rank's tables, the replicated part,
                                  meta.json naming the run that wrote it)
    DIR/checkpoints/run.json      the current run: the one whose checkpoints training resumes
                                  and eval and export read
    DIR/checkpoints/superseded/<time>/  earlier runs' checkpoints set aside (never deleted) when
                                  a setting of the model changed, with why.json
    DIR/logs/                     timestamped run logs, metrics.jsonl, TensorBoard events
    DIR/export/<N>/               export version N (N = 1, 2, ...): the SavedModel for serving
                                  and its fingerprint.json; the newest keep_versions are kept,
                                  and the pinned, served and newest verified ones
    DIR/export/serving.json       the served, held (rollback), pinned and verified versions
    DIR/scores/<name>.parquet     scores of a raw file (score stage; rejects in DIR/scores/rejects/)
    DIR/manifests/                one manifest + completion marker per stage
    DIR/report/                   run report (Markdown + PNG plots)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, overload

# re-exported: the layout names every file the wings share (the modes name this one)
from dlrm_contracts.id_modes import DICTIONARIES_DIR as DICTIONARIES_DIR
from dlrm_contracts.id_modes import IdMode
from dlrm_contracts.storage import Location, location_of

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    # The root of a layout: a local workdir's Path or a workdir URL's Location. An annotation
    # that names no root (``layout: WorkdirLayout``) means a local workdir's.
    RootT = TypeVar("RootT", Path, Location, default=Path)
else:  # the default is for the checker only (typing_extensions is not a runtime dependency)
    from typing import TypeVar

    RootT = TypeVar("RootT", Path, Location)

SUCCESS = "_SUCCESS"  # marks a complete output directory; written last
PREPROCESS_JSON = "preprocess.json"  # spark_jobs -> converters, pipeline
MODEL_SIZE_JSON = "model_size.json"  # table sizes C1..C26 (parquet and binary dataset)
DATASET_JSON = "dataset.json"  # the binary dataset's description (binary_format)
DAYS_JSON = "days.json"
# stable ids' record beside the dictionaries (spark_jobs writes it, trainer's export reads it);
# readers of the dictionaries skip names starting with "_"
IDS_RECORD = "_ids.json"
HISTOGRAM_FILE = "histogram.parquet"
COUNT_VALUES_DIR = "values"
CHECKPOINT_META = "meta.json"  # a checkpoint step-N/ is complete once it exists
CHECKPOINT_DIR = re.compile(r"^step-(\d+)$")
CURRENT_RUN_JSON = "run.json"  # under DIR/checkpoints: {"id": the current run's id}
SUPERSEDED_DIR = "superseded"  # under DIR/checkpoints: runs set aside, one folder each
RUN_KEY = "run"  # a checkpoint meta's {"id", "settings"} of its run
LEGACY_RUN = "legacy"  # the run of checkpoints saved before they named theirs
EXPORT_VERSION_DIR = re.compile(r"^[0-9]+$")  # TensorFlow Serving's version directories
SAVED_MODEL_PB = "saved_model.pb"
EXPORT_FINGERPRINT = "fingerprint.json"  # in each version directory, beside saved_model.pb
SERVING_JSON = "serving.json"  # in DIR/export: which version is served (serving_state)
DAYS_DIR = "days"  # under the parquet directory: stable ids' per-day parts
DAY_JSON = "day.json"  # in each day=<k>/ of DAYS_DIR: what the day was made with
SEGMENTS_JSON = "segments.json"  # beside the splits: which day's files make each split


def values_dir(counts_dir: str | Path) -> Path:
    """The per-day value counts (parquet, partitioned by day) under a counts directory."""
    return Path(counts_dir) / COUNT_VALUES_DIR


def days_json_path(counts_dir: str | Path) -> Path:
    return Path(counts_dir) / DAYS_JSON


def histogram_path(counts_dir: str | Path) -> Path:
    """The count histogram of a counts directory (a path to the parquet file itself stays)."""
    path = Path(counts_dir)
    return path if path.suffix == ".parquet" else path / HISTOGRAM_FILE


@overload
def counts_beside(binary_dir: str | Path) -> Path: ...
@overload
def counts_beside(binary_dir: Location) -> Location: ...
def counts_beside(binary_dir: str | Path | Location) -> Path | Location:
    """The counts a binary dataset was made from, when it sits in a workdir (DIR/binary ->
    DIR/counts): the default wherever a threshold raise needs the histogram."""
    if isinstance(binary_dir, Location):
        return binary_dir.parent / "counts"
    return Path(binary_dir).parent / "counts"


def dictionaries_under(parquet_dir: RootT, mode: IdMode) -> RootT | None:
    """Where ``mode``'s value -> id tables are under a parquet directory (None: it has none):
    the one rule for every reader, a workdir's (``WorkdirLayout.dictionaries_of``) or a bare
    parquet dataset's (the converter's)."""
    return None if mode.dictionaries_dir is None else parquet_dir / mode.dictionaries_dir


def checkpoint_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:09d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = CHECKPOINT_DIR.match(path.name)
        if match and (path / CHECKPOINT_META).exists():
            found.append((int(match.group(1)), path))
    return sorted(found)


def read_checkpoint_meta(path: Path) -> dict[str, Any] | None:
    """A checkpoint's meta.json; None when it is missing or unreadable."""
    try:
        meta = json.loads((path / CHECKPOINT_META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def checkpoint_run(meta: dict[str, Any] | None) -> str:
    """The id of the run a checkpoint (its meta.json) belongs to; ``LEGACY_RUN`` for one saved
    before checkpoints named their run."""
    run = (meta or {}).get(RUN_KEY)
    run_id = run.get("id") if isinstance(run, dict) else None
    return run_id if isinstance(run_id, str) and run_id else LEGACY_RUN


def current_run(root: str | Path) -> str | None:
    """The run ``DIR/checkpoints/run.json`` names (its trainer writes it with each checkpoint);
    None when there is none or it is unreadable."""
    try:
        record = json.loads((Path(root) / CURRENT_RUN_JSON).read_text())
    except (OSError, ValueError):
        return None
    run_id = record.get("id") if isinstance(record, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def run_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of the current run's complete checkpoints, oldest first: what training
    resumes and eval and export read. A checkpoint of another run (an earlier run at higher
    steps, a stray ``step-999999999/`` copied in) is never one of them. Without a current run
    that has checkpoints (a workdir from before runs were recorded), every complete checkpoint.
    A directory whose meta.json names another step than its name (a copy) is none of them."""
    found = [(step, path, read_checkpoint_meta(path)) for step, path in complete_checkpoints(root)]
    # a directory renamed or copied to another step's name (its meta says which step it is)
    found = [
        (step, path, meta)
        for step, path, meta in found
        if meta is None or not isinstance(meta.get("step"), int) or meta["step"] == step
    ]
    run_id = current_run(root)
    mine = [
        (step, path) for step, path, meta in found if run_id is not None and checkpoint_run(meta) == run_id
    ]
    return mine or [(step, path) for step, path, _meta in found]


def latest_checkpoint(root: str | Path) -> Path | None:
    """Where training resumes: the current run's newest complete checkpoint."""
    found = run_checkpoints(root)
    return found[-1][1] if found else None


def best_checkpoint(root: str | Path) -> Path | None:
    """The run's model, which eval and export use: the checkpoint of the best validation AUC
    when the latest checkpoint names one (a run with early stopping), else the latest; both of
    the current run.

    A best checkpoint that is no longer complete (deleted by hand) falls back to the latest.
    """
    latest = latest_checkpoint(root)
    if latest is None:
        return None
    meta = read_checkpoint_meta(latest)
    if meta is None:
        return latest  # the checkpoint reader reports the damage when it opens it
    best = (meta.get("early_stopping") or {}).get("best_step")
    if isinstance(best, int) and not isinstance(best, bool):
        path = checkpoint_dir(root, best)
        if (path / CHECKPOINT_META).exists() and checkpoint_run(read_checkpoint_meta(path)) == checkpoint_run(
            meta
        ):
            return path
    return latest


def export_versions(export_dir: str | Path) -> list[tuple[int, Path]]:
    """(version, directory) of every export version under ``export_dir``, oldest first.

    A version directory only ever appears whole (it is renamed into place), so any integer
    name holding a ``saved_model.pb`` is one; other names (temporaries) are not versions.
    """
    root = Path(export_dir)
    if not root.is_dir():
        return []
    found = [
        (int(p.name), p)
        for p in root.iterdir()
        if EXPORT_VERSION_DIR.match(p.name) and (p / SAVED_MODEL_PB).is_file()
    ]
    return sorted(found)


def latest_export(export_dir: str | Path) -> Path | None:
    """The newest export version: what a server watching ``export_dir`` serves, and what the
    score stage scores with."""
    found = export_versions(export_dir)
    return found[-1][1] if found else None


@dataclass(frozen=True)
class WorkdirLayout(Generic[RootT]):
    """Every name below, for a local workdir (Paths) or one at a URL (dlrm_contracts.storage
    Locations, joined the same way: the layout is the same on every store)."""

    root: RootT

    @overload
    @classmethod
    def at(cls, root: Path) -> WorkdirLayout[Path]: ...
    @overload
    @classmethod
    def at(cls, root: str | Location) -> WorkdirLayout[Any]: ...
    @classmethod
    def at(cls, root: str | Path | Location) -> WorkdirLayout[Any]:
        """A Path's layout holds Paths; a text's or a Location's holds Paths or Locations by
        what it names (a URL: Locations), which only the value says."""
        where = location_of(root)
        if isinstance(where, Location):
            return WorkdirLayout(where)
        return WorkdirLayout(where.resolve())

    @property
    def raw(self) -> RootT:
        return self.root / "raw"

    @property
    def counts(self) -> RootT:
        return counts_beside(self.binary)

    @property
    def parquet(self) -> RootT:
        return self.root / "parquet"

    def parquet_split(self, split: str) -> RootT:
        return self.parquet / split

    @property
    def parquet_days(self) -> RootT:
        """Stable ids: the transformed days a daily run reuses (spark_jobs.day_store)."""
        return self.parquet / DAYS_DIR

    def parquet_day(self, day: int) -> RootT:
        return self.parquet_days / f"day={day}"

    @property
    def parquet_model_size(self) -> RootT:
        return self.parquet / MODEL_SIZE_JSON

    @property
    def parquet_removed(self) -> RootT:
        """Written when the lean-disk mode deleted the parquet splits (what, when, why)."""
        return self.parquet / "_REMOVED.json"

    @property
    def data_quality(self) -> RootT:
        return self.parquet / "data_quality.json"

    @property
    def rejects(self) -> RootT:
        return self.root / "rejects"

    @property
    def binary(self) -> RootT:
        return self.root / "binary"

    @property
    def checkpoints(self) -> RootT:
        return self.root / "checkpoints"

    @property
    def superseded(self) -> RootT:
        """Earlier runs' checkpoints set aside by a change of the model's settings."""
        return self.checkpoints / SUPERSEDED_DIR

    @property
    def dictionaries(self) -> RootT:
        """Frequency and stable ids' value -> id tables (``dictionaries_of`` for any mode's)."""
        return self.parquet / DICTIONARIES_DIR

    def dictionaries_of(self, mode: IdMode) -> RootT | None:
        """Where ``mode``'s value -> id tables are (None: it has none)."""
        return dictionaries_under(self.parquet, mode)

    @property
    def dictionary_index(self) -> RootT:
        """value → id of every column as memory-mapped hash tables (the Arrow engine's
        transform reads them; spark_jobs.engines.arrow.dictionary_index)."""
        return self.parquet / "dictionary_index"

    @property
    def export(self) -> RootT:
        return self.root / "export"

    @property
    def latest_export(self) -> Path | None:
        """The newest export version directory (DIR/export/<N>), None before any export."""
        export = self.export
        # exports are written on a node's local side, never at a URL
        return latest_export(export.local_path() if isinstance(export, Location) else export)

    @property
    def scores(self) -> RootT:
        return self.root / "scores"

    @property
    def logs(self) -> RootT:
        return self.root / "logs"

    @property
    def manifests(self) -> RootT:
        return self.root / "manifests"

    @property
    def report(self) -> RootT:
        return self.root / "report"

    @property
    def lock_file(self) -> RootT:
        return self.root / ".pipeline.lock"
