"""Nothing lost to a power cut: every file a later run depends on is on disk, and so is its
directory entry, before the step that makes it current, and the copy it replaces goes only
after that (dlrm_contracts.atomic, docs/pipeline.md "What survives a kill, what survives a
power cut").

A power cut cannot be had in a test; what it would lose can be read off the order of the
calls: a recording layer over os.fsync, os.rename, os.replace, os.unlink and shutil.rmtree
(and numpy's memmap flush, an msync) notes each call with its path, and the tests check that
each kind of file (records and manifests, a whole directory such as the binary dataset, the
stable dictionaries, a transformed day, the dictionary index, the counts, the parquet's
completion marker) follows sync, then publish, then delete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts import atomic
from dlrm_contracts.layout import SUCCESS, WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import parse_threshold_spec


def _where(path) -> str:
    """A path as the kernel names it (the parent resolved, the name itself kept)."""
    path = os.fspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


class Recording:
    """The filesystem calls made while it is installed, in order: (call, path[, target])."""

    def __init__(self):
        self.calls: list[tuple] = []

    def install(self, monkeypatch) -> "Recording":
        fsync, rename, replace = os.fsync, os.rename, os.replace
        unlink, rmtree, flush = os.unlink, shutil.rmtree, np.memmap.flush

        def on_fsync(fd):
            self.calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            return fsync(fd)

        def on_rename(src, dst, *args, **kwargs):
            self.calls.append(("rename", _where(src), _where(dst)))
            return rename(src, dst, *args, **kwargs)

        def on_replace(src, dst, *args, **kwargs):
            self.calls.append(("rename", _where(src), _where(dst)))
            return replace(src, dst, *args, **kwargs)

        def on_unlink(path, *args, **kwargs):
            if kwargs.get("dir_fd") is None:
                self.calls.append(("delete", _where(path)))
            return unlink(path, *args, **kwargs)

        def on_rmtree(path, *args, **kwargs):
            self.calls.append(("delete", _where(path)))
            return rmtree(path, *args, **kwargs)

        def on_flush(array):
            self.calls.append(("msync", _where(array.filename)))
            return flush(array)

        monkeypatch.setattr(os, "fsync", on_fsync)
        monkeypatch.setattr(os, "rename", on_rename)
        monkeypatch.setattr(os, "replace", on_replace)
        monkeypatch.setattr(os, "unlink", on_unlink)
        monkeypatch.setattr(shutil, "rmtree", on_rmtree)
        monkeypatch.setattr(np.memmap, "flush", on_flush)
        return self

    def index(self, *call) -> int:
        """Where the first call equal to ``call`` is (the test fails when there is none)."""
        wanted = tuple(_where(c) if isinstance(c, Path) else c for c in call)
        for i, made in enumerate(self.calls):
            if made == wanted:
                return i
        raise AssertionError(f"no call {wanted} among {self.calls}")

    def renamed(self, source: Path) -> int:
        """The rename of ``source`` (to wherever)."""
        for i, made in enumerate(self.calls):
            if made[0] == "rename" and made[1] == _where(source):
                return i
        raise AssertionError(f"{source} was never renamed: {self.calls}")

    def synced_under(self, root: Path, before: int) -> set[str]:
        """Paths under ``root`` (relative) fsynced before call number ``before``."""
        root = _where(root)
        return {
            os.path.relpath(c[1], root)
            for c in self.calls[:before]
            if c[0] == "fsync" and (c[1] == root or c[1].startswith(root + os.sep))
        }


def _files(root: Path) -> set[str]:
    return {os.path.relpath(p, root) for p in Path(root).rglob("*") if p.is_file()}


def assert_published(
    rec: Recording, new: Path, final: Path, aside: Path | None = None, files: set[str] | None = None
) -> None:
    """``new`` renamed onto ``final`` in the safe order: each of its files (``files``, by
    default what ``final`` now holds) and itself flushed before; the old copy (``aside``)
    renamed away before and deleted only after the parent directory was flushed."""
    publish = rec.index("rename", new, final)
    files = _files(final) if files is None else files
    assert files, "nothing to check"
    synced = rec.synced_under(new, publish)
    assert files <= synced, f"not flushed before the rename: {sorted(files - synced)}"
    assert "." in synced, "the new directory itself was not flushed"
    later = [i for i, c in enumerate(rec.calls) if c == ("fsync", _where(final.parent)) and i > publish]
    assert later, f"{final.parent} not flushed after the rename: {rec.calls}"
    if aside is not None:
        set_aside = rec.index("rename", final, aside)
        deleted = rec.index("delete", aside)
        assert set_aside < publish < later[0] < deleted, rec.calls


# ---------------------------------------------------------------- records, manifests, dirs


def test_a_record_is_flushed_before_its_rename_and_the_rename_after(tmp_path, monkeypatch):
    """Manifests, markers, summaries, day and segment lists: write_json_atomic."""
    from pipeline.manifest import ManifestStore, StageRecord

    store = ManifestStore(tmp_path / "manifests")
    store.directory.mkdir()
    rec = Recording().install(monkeypatch)
    store.complete(StageRecord("train", "k", {}))
    renames = [i for i, c in enumerate(rec.calls) if c[0] == "rename"]
    for final in (store.manifest_path("train"), store.marker_path("train")):
        publish = next(i for i in renames if rec.calls[i][2] == _where(final))
        temporary = rec.calls[publish][1]
        assert rec.index("fsync", temporary) < publish
        assert ("fsync", _where(final.parent)) in rec.calls[publish + 1 :]
    # the manifest is on disk before the marker that vouches for it is written
    manifest, marker = (
        next(i for i in renames if rec.calls[i][2] == _where(f))
        for f in (store.manifest_path("train"), store.marker_path("train"))
    )
    assert rec.calls.index(("fsync", _where(store.directory)), manifest) < marker


def test_a_directory_replaces_the_old_one_only_once_it_is_on_disk(tmp_path, monkeypatch):
    """The binary dataset, a rethresholded one, a checkpoint: atomic_directory and
    replace_directory. Its _SUCCESS is in it before the rename (never a bare directory
    between the rename and the marker)."""
    final = tmp_path / "binary"
    (final / "train").mkdir(parents=True)
    (final / "train" / "label.bin").write_bytes(b"old")
    (final / SUCCESS).write_text("")
    rec = Recording().install(monkeypatch)
    with atomic.atomic_directory(final, overwrite=True) as tmp:
        (tmp / "train").mkdir()
        (tmp / "train" / "label.bin").write_bytes(b"new")
        (tmp / "dataset.json").write_text("{}")
    aside = Path(next(c[2] for c in rec.calls if c[0] == "rename" and c[1] == _where(final)))
    assert_published(rec, tmp, final, aside)
    assert (final / "train" / "label.bin").read_bytes() == b"new" and atomic.is_complete(final)
    assert not aside.exists()


def test_a_kill_between_the_two_renames_puts_the_old_copy_back(tmp_path):
    """A writer killed after setting the old copy aside and before renaming the new one in:
    the next writer finds nothing at the final name and restores the old copy (the new
    one, unfinished in the eyes of the next run, is deleted)."""
    import subprocess
    import sys

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    pid = int(dead.stdout)
    final = tmp_path / "binary"
    aside = tmp_path / f".binary.old-{pid}-abcdef12"
    new = tmp_path / f".binary.tmp-{pid}-abcdef12"
    for directory, content in ((aside, b"old"), (new, b"new")):
        directory.mkdir()
        (directory / "label.bin").write_bytes(content)
    atomic.remove_stale_temporaries(final)
    assert (final / "label.bin").read_bytes() == b"old"
    assert not aside.exists() and not new.exists()


# ---------------------------------------------------------------- spark_jobs (no Spark)


def test_the_stable_dictionaries_are_on_disk_before_the_swap_and_the_swap_before_the_old_go(
    tmp_path, monkeypatch
):
    from spark_jobs import stable_ids

    dict_dir = tmp_path / "parquet" / "dictionaries"
    (dict_dir / "column=C1").mkdir(parents=True)
    (dict_dir / "column=C1" / "part-00000.parquet").write_bytes(b"old ids")
    (dict_dir / stable_ids.IDS_RECORD).write_text('{"lineage": "L"}')
    staging = stable_ids.staging_dir(dict_dir)
    for column in ("C1", "C2"):
        (staging / f"column={column}").mkdir(parents=True)
        (staging / f"column={column}" / "part-00000.parquet").write_bytes(b"new ids")
    rec = Recording().install(monkeypatch)
    stable_ids.commit(staging, dict_dir, parse_threshold_spec("2"), {c: 2 for c in CAT_COLUMNS})
    assert_published(rec, staging, dict_dir, stable_ids.retired_dir(dict_dir))
    assert stable_ids.IDS_RECORD in _files(dict_dir)  # the record was flushed too
    assert stable_ids.lineage(dict_dir) == "L"


def test_a_power_cut_during_the_swap_leaves_one_whole_copy_of_the_ids(tmp_path):
    """Each state a power cut can leave (the renames flushed or not) is settled by
    ``recover`` into one whole set of dictionaries."""
    from spark_jobs import stable_ids

    dict_dir = tmp_path / "parquet" / "dictionaries"
    retired, staging = stable_ids.retired_dir(dict_dir), stable_ids.staging_dir(dict_dir)

    def make(directory: Path, lineage: str) -> None:
        (directory / "column=C1").mkdir(parents=True)
        (directory / stable_ids.IDS_RECORD).write_text(f'{{"lineage": "{lineage}"}}')

    # neither rename reached the disk: the old ones stay, the staged ones go
    make(dict_dir, "old")
    make(staging, "old")
    stable_ids.recover(dict_dir)
    assert stable_ids.lineage(dict_dir) == "old" and not staging.exists()
    # only the first did: the old ones come back
    dict_dir.rename(retired)
    make(staging, "old")
    stable_ids.recover(dict_dir)
    assert stable_ids.lineage(dict_dir) == "old" and not retired.exists()
    # both did, the old copy not yet deleted: the new ones stay
    dict_dir.rename(retired)
    make(dict_dir, "old")
    stable_ids.recover(dict_dir)
    assert (dict_dir / stable_ids.IDS_RECORD).is_file() and not retired.exists()


def test_the_relabelled_index_region_is_msynced_and_flushed_before_its_rename(tmp_path, monkeypatch):
    """The region is relabelled through a writable mapping: msync, fsync, rename, then its
    directory, so a node copying the index from a shared filesystem sees the new ids."""
    from spark_jobs.engines.arrow import dictionary_index, dictionary_parts
    from spark_jobs.engines.arrow.kernels import build_region

    index_dir = tmp_path / "dictionary_index"
    (index_dir / "C1").mkdir(parents=True)
    values = np.array([5, 7, 9], np.uint32)
    slots = dictionary_index.region_slots(len(values))
    region = np.zeros(slots, np.uint64)
    build_region(values, np.arange(1, 4, dtype=np.int32), region)  # slots point at rows 1..3
    staged = tmp_path / "staging" / "part-0000001.slots"
    staged.parent.mkdir()
    region.tofile(staged)
    rec = Recording().install(monkeypatch)
    dictionary_parts._install_region(
        staged,
        np.array([0, 11, 22, 33], np.int32),
        tmp_path / "unused.parquet",
        str(index_dir),
        "C1",
        0,
        slots,
    )
    final = dictionary_index.region_path(index_dir, "C1", 0)
    relabelling = staged.with_name(staged.name + ".relabelling")
    msync = rec.index("msync", relabelling)
    fsync = rec.index("fsync", _where(relabelling))
    publish = rec.index("rename", relabelling, final)
    assert (
        msync
        < fsync
        < publish
        < max(i for i, c in enumerate(rec.calls) if c == ("fsync", _where(final.parent)))
    )
    ids = np.fromfile(final, np.uint64) >> np.uint64(32)
    assert sorted(int(i) for i in ids if i) == [11, 22, 33]


def test_the_index_description_is_written_whole_and_flushed(tmp_path, monkeypatch):
    from spark_jobs.engines.arrow import dictionary_index

    layout = dictionary_index.ColumnLayout.of([0], [3])
    rec = Recording().install(monkeypatch)
    dictionary_index.create_index(tmp_path / "index", {"C1": layout})
    final = tmp_path / "index" / dictionary_index.INDEX_JSON
    rename = next(i for i, c in enumerate(rec.calls) if c[0] == "rename" and c[2] == _where(final))
    assert rec.index("fsync", rec.calls[rename][1]) < rename


# ---------------------------------------------------------------- a real preprocess run


@pytest.mark.spark
def test_a_preprocess_run_flushes_counts_dictionaries_days_and_parquet_before_marking_them(
    tmp_path, monkeypatch
):
    """Two stable-ids runs on a real local Spark session (the second transforms every day
    again): on the driver, the value counts are on disk before days.json vouches for them,
    the new dictionaries and each transformed day before they replace the old ones (deleted
    only after), and every file of the parquet before its _SUCCESS."""
    from spark_fixtures import random_days, run, spark_session, write_days

    spark = spark_session()
    raw = write_days(tmp_path / "raw", random_days(7, 3, 400))
    work = tmp_path / "work"
    run(spark, raw, work, "2", ids="stable")
    layout = WorkdirLayout.at(work)
    (raw / "day_2").write_text((raw / "day_2").read_text() + (raw / "day_0").read_text())
    rec = Recording().install(monkeypatch)
    from spark_jobs.preprocess import run_preprocess
    from spark_fixtures import spark_config
    from dlrm_contracts.config import PreprocessConfig

    run_preprocess(
        raw, work, spark_config(), PreprocessConfig(frequency_threshold="2", ids="stable"), retransform=True
    )
    monkeypatch.undo()
    # counts: every value-count file flushed before days.json is renamed into place
    days_json = layout.counts / "days.json"
    published = next(i for i, c in enumerate(rec.calls) if c[0] == "rename" and c[2] == _where(days_json))
    counted = _files(layout.counts / "values")
    assert counted and counted <= rec.synced_under(layout.counts / "values", published)
    # dictionaries: staged, flushed, swapped, the old ones deleted after
    from spark_jobs import stable_ids

    assert_published(
        rec,
        stable_ids.staging_dir(layout.dictionaries),
        layout.dictionaries,
        stable_ids.retired_dir(layout.dictionaries),
    )
    # each day transformed again replaces the stored one in the same order
    for day in (0, 1, 2):
        final = layout.parquet_day(day)
        new = Path(next(c[1] for c in rec.calls if c[0] == "rename" and c[2] == _where(final)))
        assert_published(rec, new, final, layout.parquet_days / f".old-day={day}")
    # the parquet: every file on disk before the marker that says it is complete
    success = next(
        i for i, c in enumerate(rec.calls) if c[0] == "rename" and c[2] == _where(layout.parquet / SUCCESS)
    )
    missing = _files(layout.parquet) - {SUCCESS} - rec.synced_under(layout.parquet, success)
    assert not missing, sorted(missing)[:10]


# ---------------------------------------------------------------- trainer and generator


def test_a_checkpoint_is_on_disk_before_its_rename_and_older_ones_go_after(tmp_path, monkeypatch):
    from trainer.checkpoint import Retention, save_checkpoint
    from trainer.comm import LocalComm

    root = tmp_path / "checkpoints"
    owned = {"table/0/0-4": np.ones((3, 4), np.float32)}
    save_checkpoint(root, 1, LocalComm(), owned, {"w": np.zeros(2)}, {"run": "r"}, Retention(keep=1))
    rec = Recording().install(monkeypatch)
    final = save_checkpoint(root, 2, LocalComm(), owned, {"w": np.zeros(2)}, {"run": "r"}, Retention(keep=1))
    assert_published(rec, root / ".step-000000002.tmp", final)
    flushed = max(i for i, c in enumerate(rec.calls) if c == ("fsync", _where(root)))
    assert flushed < rec.index("delete", root / "step-000000001")  # pruned once it is durable


def test_generated_days_are_on_disk_before_the_in_progress_marker_goes(tmp_path, monkeypatch):
    from dlrm_contracts.config import GeneratorConfig
    from pipeline.synthetic import generate
    from pipeline.synthetic.writer import IN_PROGRESS_FILE

    rec = Recording().install(monkeypatch)
    generate(tmp_path / "raw", GeneratorConfig(days=2, rows_per_day=300, workers=1))
    done = rec.index("delete", tmp_path / "raw" / IN_PROGRESS_FILE)
    days = {p.name for p in (tmp_path / "raw").glob("day_*")}
    assert len(days) == 2 and days <= rec.synced_under(tmp_path / "raw", done)
