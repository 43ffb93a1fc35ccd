"""The converter's decisions for a workdir: convert its parquet, derive a raised threshold from
the binary dataset already there, rebuild one found damaged, never derive from a local dataset
that is not the one published at a workdir URL, and remove the parquet splits in the lean mode.

One entry point, ``convert_workdir``, so that the pipeline's convert stage and ``python -m
converters convert --workdir`` only say what their records know (the parquet's threshold,
whether the binary dataset in place came from this parquet, which files changed since it was
written, whether to keep the parquet) and the decisions live beside the code that carries them
out. Ids are ordered by count, so a higher threshold is a prefix of the ids: a raise
never needs Spark, only ``rethreshold`` of the existing dataset (or of a fresh conversion).
Failures the user can fix are one ``PipelineError`` line (exit 6, or 2 for a refused stable
raise); anything else stays a bug.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from converters.convert import (
    TORCHREC,
    convert_parquet,
    parquet_files,
    same_materialization,
    source_fingerprint,
    write_other_formats,
)
from converters.rethreshold import rethreshold
from dlrm_contracts.atomic import is_complete, read_json, replace_directory, write_json_atomic
from dlrm_contracts.binary_format import DamagedDatasetError, DatasetError, UnreadableParquetError, read_info
from dlrm_contracts.config import ConvertConfig
from dlrm_contracts.errors import ExitCode, PipelineError, failing_as
from dlrm_contracts.fingerprint import file_content_hash, stable_hash, tree_fingerprint
from dlrm_contracts.id_modes import FREQUENCY, IdMode, recorded_or_default
from dlrm_contracts.layout import DATASET_JSON, DAYS_DIR, PREPROCESS_JSON, SEGMENTS_JSON, WorkdirLayout
from dlrm_contracts.schema import SPLITS
from dlrm_contracts.thresholds import ThresholdSpec, parse_threshold_spec
from dlrm_contracts.verify import verify_dataset

# The pipeline's logger: these lines are the convert stage's, in its log and on its console.
log = logging.getLogger("pipeline")


@dataclass
class Published:
    """A workdir URL's side of a request: the local workdir holds copies of what is published."""

    source: str  # the published parquet, which the dataset names as its source
    recorded_as: tuple[str, str]  # the published dataset and counts, which a derived one names
    description: bytes | None  # the published dataset.json; None when none is committed


@dataclass
class ConvertRequest:
    """What to convert, and what the caller's records know about the workdir."""

    layout: WorkdirLayout
    config: ConvertConfig
    threshold: ThresholdSpec  # the one asked for
    parquet_threshold: ThresholdSpec | None  # the parquet's (its preprocess.json), None if unknown
    ids: IdMode = FREQUENCY  # how the parquet's ids were given (its preprocess.json)
    # The binary dataset in place was converted from this very parquet: it may be derived from.
    same_parquet: bool = False
    # The files of the binary dataset changed (size or mtime) since it was written, when the
    # caller recorded them; None when it did not.
    changed_since_written: Callable[[], list[str]] | None = None
    # The lean mode's record when it removed the splits (remove_parquet_splits), else None.
    splits_removed: dict[str, Any] | None = None
    # preprocess.keep_parquet: false removes the splits once the dataset verifies (the lean
    # mode), never at a workdir URL, where the published splits stay.
    keep_parquet: bool = True
    published: Published | None = None  # at a workdir URL

    @property
    def source(self) -> str | None:
        """What the dataset names as its parquet: the published one at a URL."""
        return self.published.source if self.published else None

    @property
    def recorded_as(self) -> tuple[str, str] | None:
        return self.published.recorded_as if self.published else None


@dataclass
class ConvertResult:
    action: str  # ran | derived
    engine: str  # converters | rethreshold | converters+rethreshold
    summary: dict[str, Any] = field(default_factory=dict)


def convert_workdir(request: ConvertRequest) -> ConvertResult:
    """Convert, rethreshold or both, then the lean mode's removal of the splits; the
    converters' typed errors become one line (exit 6), anything else stays what it is (a bug:
    exit 1)."""
    _drop_unpublished(request)
    result = _convert_checked(request)
    if not request.keep_parquet and request.published is None:
        removed = remove_parquet_splits(request.layout)
        if removed:
            result.summary = {**result.summary, "parquet_removed": removed}
    return result


def _drop_unpublished(request: ConvertRequest) -> None:
    """At a workdir URL, a local binary dataset that is not the published one is removed:
    never derived from."""
    binary = request.layout.binary
    if request.published is None or not binary.exists():
        return
    description = binary / DATASET_JSON
    if not description.is_file() or description.read_bytes() != request.published.description:
        shutil.rmtree(binary)


def _convert_checked(request: ConvertRequest) -> ConvertResult:
    """A scratch dataset is removed on any failure (a full disk gets its space back)."""
    layout = request.layout
    derived = layout.binary.with_name("binary.derived")  # beside it: one rename replaces it
    shutil.rmtree(derived, ignore_errors=True)
    try:
        with failing_as(ExitCode.CONVERT, DatasetError, what="convert failed"):
            try:
                return _convert_or_derive(request, derived)
            except DatasetError as exc:
                # a damaged or missing file that preprocess writes: running it again rebuilds it
                if not any(str(d) in str(exc) for d in (layout.parquet, layout.counts)):
                    raise
                rebuilt = UnreadableParquetError if isinstance(exc, UnreadableParquetError) else DatasetError
                raise rebuilt(
                    f"{exc}; rebuild it with --stages preprocess,convert --force (the "
                    "raw days are read again)"
                ) from exc
    except BaseException:
        shutil.rmtree(derived, ignore_errors=True)
        raise


def _refuse_fixed_threshold(request: ConvertRequest) -> None:
    """Only ids ordered by count have a higher threshold as a prefix: the binary dataset of
    any other ids is never made at another threshold than the parquet's."""
    made_at, ids = request.parquet_threshold, request.ids
    if made_at is not None and request.threshold != made_at and not ids.raisable:
        raise PipelineError(
            f"threshold {request.threshold} differs from {made_at}, the threshold of "
            f"this workdir's {ids.description}: {ids.threshold_remedy} (docs/spark_jobs.md)",
            ExitCode.USAGE,
        )


def _convert_or_derive(request: ConvertRequest, derived: Path) -> ConvertResult:
    wanted, layout, config = request.threshold, request.layout, request.config
    _refuse_fixed_threshold(request)
    damaged = False
    # the TorchRec files hold the parquet's ids: a threshold raise of the binary alone would
    # leave them behind (rethreshold does not carry them), so they are always converted
    torchrec = TORCHREC in config.formats
    if request.same_parquet and layout.binary.exists() and not torchrec:
        try:
            result = _derive_from_binary(request, derived)
            if result is not None:
                return result
        except DamagedDatasetError as exc:
            # Never derive from (or keep) files that are not what the convert stage wrote.
            damage = _damage_report(exc, request)
            log.warning(
                "convert    the binary dataset %s is not what the convert stage wrote "
                "(%s): rebuilding it from the parquet",
                layout.binary,
                damage,
            )
            _needs_parquet(request, damage)
            damaged = True
    made_at = request.parquet_threshold
    _refuse_below_parquet(wanted, made_at, torchrec)
    _needs_parquet(request)
    # stable ids: the days converted before are copied from the dataset in place, never
    # from one found damaged
    derive = made_at is not None and wanted != made_at
    # other formats (convert.formats) are written from the final dataset only
    summary = convert_parquet(
        layout.parquet,
        layout.binary,
        _binary_only(config) if derive else config,
        reuse=not damaged,
        source=request.source,
    )
    if not derive:
        return ConvertResult("ran", "converters", summary)
    # The dataset was just written and checked: no need to read it back for its checksums.
    fresh = dataclasses.replace(_binary_only(config), verify_checksums=False)
    summary = rethreshold(layout.binary, layout.counts, wanted, derived, fresh, request.recorded_as)
    replace_directory(derived, layout.binary, config.fsync)
    summary.update(write_other_formats(layout.binary, config))
    return ConvertResult("derived", "converters+rethreshold", {**summary, "from_threshold": str(made_at)})


def _refuse_below_parquet(wanted: ThresholdSpec, made_at: ThresholdSpec | None, torchrec: bool) -> None:
    """Checked before converting, so that the existing binary dataset stays as it is."""
    if made_at is not None and not wanted.is_at_least(made_at):
        raise PipelineError(
            f"threshold {wanted} is below the parquet's threshold {made_at}: the "
            "rarer values are already merged into id 0, so the preprocess "
            "stage must run again (add it: --stages preprocess,convert)",
            ExitCode.CONVERT,
        )
    if torchrec and made_at is not None and wanted != made_at:
        raise PipelineError(
            f"convert.formats torchrec writes the parquet's ids (threshold "
            f"{made_at}), not ids at threshold {wanted}: run the preprocess "
            f"stage at {wanted} too (--stages preprocess,convert)",
            ExitCode.CONVERT,
        )


def _needs_parquet(request: ConvertRequest, damage: str | None = None) -> None:
    """Refuse a conversion whose parquet splits the lean mode removed, naming the way back."""
    removed, layout = request.splits_removed, request.layout
    if removed and not all(layout.parquet_split(s).exists() for s in SPLITS):
        why = f"the binary dataset is damaged ({damage}) and " if damage else ""
        raise PipelineError(
            f"{why}this conversion needs the parquet splits, which were removed "
            f"on {removed.get('time')} (preprocess.keep_parquet: false): rebuild "
            "them with --stages preprocess,convert --force (the counts are "
            "reused)",
            ExitCode.CONVERT,
        )


def _changed(request: ConvertRequest) -> list[str]:
    return request.changed_since_written() if request.changed_since_written else []


def _damage_report(exc: DamagedDatasetError, request: ConvertRequest) -> str:
    """One line: the files changed since the convert stage (by size and mtime, which names an
    edited dataset.json too), then what the check found."""
    changed = _changed(request)
    found = exc.one_line()
    return f"changed since it was written: {listed(changed)}; {found}" if changed else found


def listed(names: list[str], limit: int = 5) -> str:
    """At most ``limit`` names, then how many more."""
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")


def _derive_from_binary(request: ConvertRequest, derived: Path) -> ConvertResult | None:
    """The requested threshold from the binary dataset in the workdir (a raise, or the same
    threshold after its files changed), once it is shown intact; None when the request is not
    a raise of it.

    Raises:
        DamagedDatasetError: the dataset is incomplete, unreadable, or a file differs from what
            was written (its checksum; or its size or mtime with convert.verify_checksums off).
    """
    layout, config = request.layout, request.config
    info = verify_dataset(layout.binary, full=False)
    have = _spec_or_none(info.threshold_spec)
    if not _raise_of(have, request.threshold) or not same_materialization(info, config):
        return None
    if not config.verify_checksums:
        changed = _changed(request)
        if changed:
            raise DamagedDatasetError(
                f"{', '.join(changed)} changed after the convert stage",
                [f"{name} changed (size or modification time)" for name in changed],
            )
    summary = rethreshold(
        layout.binary,
        layout.counts,
        request.threshold,
        derived,
        _binary_only(config),  # checks every file's checksum first
        request.recorded_as,
    )
    replace_directory(derived, layout.binary, config.fsync)
    summary.update(write_other_formats(layout.binary, config))
    return ConvertResult("derived", "rethreshold", {**summary, "from_threshold": str(have)})


def derivable_from_binary(layout: WorkdirLayout, threshold: ThresholdSpec) -> bool:
    """Whether ``threshold`` is a raise of the complete binary dataset's in place (or the
    same): convert_workdir then derives it from that dataset, no parquet needed."""
    if not is_complete(layout.binary):
        return False
    return _raise_of(
        _spec_or_none((_record(layout.binary / DATASET_JSON) or {}).get("threshold_spec")), threshold
    )


def _raise_of(have: ThresholdSpec | None, wanted: ThresholdSpec) -> bool:
    """Ids are ordered by count: a threshold at least ``have``'s is a prefix of its ids."""
    return have is not None and wanted.is_at_least(have)


def _spec_or_none(text: Any) -> ThresholdSpec | None:
    try:
        return parse_threshold_spec(text)
    except (TypeError, PipelineError):
        return None


def _binary_only(config: ConvertConfig) -> ConvertConfig:
    """The convert settings for a dataset that is not yet the final one (no other formats)."""
    return dataclasses.replace(config, formats=["binary"])


def remove_parquet_splits(layout: WorkdirLayout) -> dict[str, Any] | None:
    """The lean mode (preprocess.keep_parquet: false): delete the parquet splits once the
    binary dataset verifies; None when there are none. The record names the parquet's
    fingerprint and that of what remains, so that the parquet is still recognised afterwards
    (``parquet_identity``).

    The record is written before the deletion: a run killed half-way leaves splits that no
    longer match it, so the preprocess stage is simply redone.
    """
    splits = [layout.parquet_split(s) for s in SPLITS if layout.parquet_split(s).exists()]
    if not splits:
        return None
    # stable ids: the splits are links to the kept days, which hold the bytes; they go too
    # (the next run then transforms its whole window: the lean mode trades time for disk)
    days = [p for p in (layout.parquet_days, layout.parquet / SEGMENTS_JSON) if p.exists()]
    try:
        verify_dataset(layout.binary, full=False)
    except DatasetError as exc:
        raise PipelineError(f"{exc}: the parquet splits are kept", ExitCode.DATASET_INVALID) from None
    files = {
        f.stat().st_ino: f.stat().st_size
        for d in splits + days
        for f in ([d] if d.is_file() else d.rglob("*"))
        if f.is_file()
    }
    freed = sum(files.values())  # a hard-linked file counted once
    record = {
        "fingerprint": parquet_identity(layout),
        "remaining": parquet_fingerprint(layout, ignore=REMOVED_BY_LEAN_MODE),
        "removed": [d.name for d in splits + days],
        "bytes": freed,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "reason": "preprocess.keep_parquet: false; the binary dataset verified",
    }
    write_json_atomic(layout.parquet_removed, record)
    for path in splits + days:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    log.info("convert    parquet splits removed (keep_parquet: false): %.1f MiB freed", freed / 2**20)
    return record


# What the lean mode's fingerprint of the remaining parquet leaves out: what it removes.
REMOVED_BY_LEAN_MODE = (*SPLITS, DAYS_DIR, SEGMENTS_JSON)


def parquet_fingerprint(layout: WorkdirLayout, ignore: tuple[str, ...] = ()) -> str:
    """The parquet as the stages record it: its description by content, its files by name,
    size and mtime (the lean mode's record left out)."""
    ignore = (layout.parquet_removed.name, *ignore)
    return stable_hash(
        [file_content_hash(layout.parquet / PREPROCESS_JSON), tree_fingerprint(layout.parquet, ignore=ignore)]
    )


def lean_record(layout: WorkdirLayout, record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The lean mode's ``record`` (parquet/_REMOVED.json), when the splits it removed are all
    that is missing from the parquet; else None."""
    return record if record and record.get("remaining") == parquet_fingerprint(layout) else None


def parquet_identity(layout: WorkdirLayout) -> str:
    """The parquet's fingerprint; after the lean mode removed the splits, still the one they
    had, so that what was made from them stays up to date."""
    removed = lean_record(layout, _record(layout.parquet_removed))
    return removed["fingerprint"] if removed else parquet_fingerprint(layout)


def request_from_workdir(
    layout: WorkdirLayout, config: ConvertConfig, threshold: ThresholdSpec, keep_parquet: bool = True
) -> ConvertRequest:
    """A request from what the workdir's own files say, for a caller without the pipeline's
    records (``python -m converters convert --workdir DIR --frequency-threshold T``): the
    binary dataset in place came from this parquet when it records the parquet's fingerprint,
    or when the lean mode removed the splits after it verified; its files are checked by their
    checksums (no record of their sizes and times)."""
    preprocess = _record(layout.parquet / PREPROCESS_JSON) or {}
    removed = _record(layout.parquet_removed)
    return ConvertRequest(
        layout=layout,
        config=config,
        threshold=threshold,
        parquet_threshold=_spec_or_none(preprocess.get("threshold_spec"))
        if is_complete(layout.parquet)
        else None,
        ids=recorded_or_default(preprocess),
        same_parquet=_converted_from(layout) or bool(removed),
        splits_removed=removed,
        keep_parquet=keep_parquet,
    )


def _record(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None when it is missing or damaged (then it says nothing)."""
    try:
        data = read_json(path)
    except (ValueError, OSError):
        return None
    return data if isinstance(data, dict) else None


def _converted_from(layout: WorkdirLayout) -> bool:
    """Whether the binary dataset in place records the fingerprint of the parquet there."""
    if not is_complete(layout.binary) or not all(layout.parquet_split(s).is_dir() for s in SPLITS):
        return False
    try:
        info = read_info(layout.binary)
        files = {split: parquet_files(layout.parquet_split(split)) for split in SPLITS}
        return info.source_fingerprint == source_fingerprint(layout.parquet, files)
    except (DatasetError, OSError, ValueError):
        return False  # converted anew, which names what is wrong
