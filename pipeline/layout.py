"""Where every artifact lives under a pipeline workdir.

One place names the paths so that stages, tests and users agree; the layout is part of the
product's interface (schedulers read it), so change it only with a note in the README.

    DIR/raw/                      generated day files (only when the generate stage runs)
    DIR/counts/                   per-day categorical value counts (parquet) + count histograms
    DIR/parquet/{train,test,validation}/   transformed parquet
    DIR/parquet/model_size.json   table sizes of the parquet dataset
    DIR/parquet/data_quality.json rows read / written / padded / rejected per reason per day
    DIR/parquet/_REMOVED.json     the splits were deleted after conversion (keep_parquet: false)
    DIR/rejects/                  rejected raw lines with their reason
    DIR/binary/{train,test,validation}/    split binary dataset (+ model_size.json, dataset.json)
    DIR/checkpoints/              trainer checkpoints (one subfolder per rank for its tables)
    DIR/logs/                     timestamped run logs, metrics.jsonl, TensorBoard events
    DIR/export/saved_model/       the SavedModel for serving (+ DIR/export/fingerprint.json)
    DIR/scores/<name>.parquet     scores of a raw file (score stage; rejects in DIR/scores/rejects/)
    DIR/manifests/                one manifest + completion marker per stage
    DIR/report/                   run report (Markdown + PNG plots)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkdirLayout:
    root: Path

    @classmethod
    def at(cls, root: str | Path) -> "WorkdirLayout":
        return cls(Path(root).resolve())

    @property
    def raw(self) -> Path:
        return self.root / "raw"

    @property
    def counts(self) -> Path:
        return self.root / "counts"

    @property
    def parquet(self) -> Path:
        return self.root / "parquet"

    def parquet_split(self, split: str) -> Path:
        return self.parquet / split

    @property
    def parquet_model_size(self) -> Path:
        return self.parquet / "model_size.json"

    @property
    def parquet_removed(self) -> Path:
        """Written when the lean-disk mode deleted the parquet splits (what, when, why)."""
        return self.parquet / "_REMOVED.json"

    @property
    def data_quality(self) -> Path:
        return self.parquet / "data_quality.json"

    @property
    def rejects(self) -> Path:
        return self.root / "rejects"

    @property
    def binary(self) -> Path:
        return self.root / "binary"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def dictionaries(self) -> Path:
        return self.parquet / "dictionaries"

    @property
    def export(self) -> Path:
        return self.root / "export"

    @property
    def saved_model(self) -> Path:
        return self.export / "saved_model"

    @property
    def export_fingerprint(self) -> Path:
        return self.export / "fingerprint.json"

    @property
    def scores(self) -> Path:
        return self.root / "scores"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def lock_file(self) -> Path:
        return self.root / ".pipeline.lock"
