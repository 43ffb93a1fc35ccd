"""A workdir at a URL (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``): what lives where.

The stages' shared outputs live at the URL, each published all or nothing
(dlrm_contracts.object_commit): the parquet splits and dictionaries (written there by
``python -m spark_jobs``), the binary dataset (published by the convert stage), and the
pipeline's own records (``manifests/``, ``summary.json``, ``eval.json``, ``report/``, the
progress channels, ``export/serving.json``). What needs a POSIX filesystem stays on this node's
disk, in the workdir's *local side* (``train.stage_dir``, laid out like a workdir): the copy
of the binary dataset the trainer memory-maps (staged in once, checked against its
checksums), the parquet the converter reads while it runs, checkpoints, logs and exports.
Checkpoints and exports are published at the URL too, and restored from it on a node that
lacks them (pipeline/remote_models.py).

The records are worked on in the local side and published at the URL after every stage and
when the run ends; a run starts from the URL's records (pulled over the local side's), so a
rerun on any node, after a kill, sees what the last run finished. Manifests are uploaded
before their completion markers, so a kill between the two leaves a stage that runs again.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

from dlrm_contracts.atomic import atomic_directory
from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.content_sample import sampled_hash_of
from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.layout import (
    DATASET_JSON,
    DICTIONARIES_DIR,
    HISTOGRAM_FILE,
    MODEL_SIZE_JSON,
    PREPROCESS_JSON,
    SEGMENTS_JSON,
    SUCCESS,
    WorkdirLayout,
)
from dlrm_contracts.object_commit import COMMIT_MARKER, committed_files, is_committed
from dlrm_contracts.schema import SPLITS
from dlrm_contracts.storage import Location, resolve
from dlrm_contracts.fingerprint import stable_hash
from pipeline.remote_models import (
    CHECKPOINTS,
    EXPORTS,
    Publisher,
    publish_tree,
    restore_checkpoints,
    restore_exports,
)

log = logging.getLogger("pipeline")

# The pipeline's records, relative to the workdir: published at the URL, and (the first two)
# read back from it when a run starts. Completion markers (*.done) go after everything else.
PUSHED = ("manifests", "summary.json", "eval.json", "report", "export/serving.json")
PULLED = ("manifests", "eval.json")
PROGRESS_SUFFIX = ".progress.jsonl"
MARKER_SUFFIX = ".done"
# Which stages need this node's checkpoints or exports (restored from the URL first), and which
# change them (published at the URL after they run, fail or are stopped).
NEEDS_CHECKPOINTS = ("train", "eval", "export")
NEEDS_EXPORTS = ("export", "score")
PUBLISHES = {"train": (CHECKPOINTS,), "export": (CHECKPOINTS, EXPORTS)}
STAGE_CODES = {
    "train": ExitCode.TRAIN,
    "eval": ExitCode.EVAL,
    "export": ExitCode.EXPORT,
    "score": ExitCode.SCORE,
}
# The small files beside the splits that the converter reads.
PARQUET_RECORDS = (PREPROCESS_JSON, MODEL_SIZE_JSON, SEGMENTS_JSON)


def local_side(url: str, stage_dir: str | None) -> Path:
    """This node's local side of the workdir ``url``: ``train.stage_dir``, else a directory
    under the system temp named by a hash of the URL (one per workdir, reused by reruns)."""
    if stage_dir:
        return Path(stage_dir).absolute()
    name = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "dlrm-workdirs" / name


class RemoteWorkdir:
    """The workdir at ``url`` and its local side ``local`` (a WorkdirLayout)."""

    def __init__(self, url: str, local: WorkdirLayout):
        self.root = resolve(url)
        self.local = local
        self.local_root = Path(str(local.root))  # always a path: a layout of this node's disk
        self.models_ready: set[str] = set()  # stages whose checkpoints (exports) are restored

    @property
    def parquet(self) -> Location:
        return self.root / "parquet"

    @property
    def binary(self) -> Location:
        return self.root / "binary"

    # ------------------------------------------------------------ records
    def pull_records(self) -> None:
        """The URL's records over the local side's (a record the URL lacks is removed here:
        the URL's state is the workdir's)."""
        for name in PULLED:
            remote, local = self.root / name, self.local_root / name
            if name == "manifests":
                wanted = {f.relative_to(remote): f for f in remote.files()}
                for path in local.rglob("*") if local.is_dir() else []:
                    rel = path.relative_to(local).as_posix()
                    if path.is_file() and rel not in wanted:
                        path.unlink()
                for rel, source in wanted.items():
                    source.copy_to(resolve(local / rel))
            elif remote.is_file():
                remote.copy_to(resolve(local))
            else:
                local.unlink(missing_ok=True)

    def push_records(self) -> None:
        """The local side's records published at the URL: what the local side no longer has is
        deleted there first, completion markers are uploaded last."""
        files: dict[str, Path] = {}
        for name in PUSHED:
            path = self.local_root / name
            if path.is_dir():
                files.update(
                    {
                        p.relative_to(self.local_root).as_posix(): p
                        for p in sorted(path.rglob("*"))
                        if p.is_file()
                    }
                )
            elif path.is_file():
                files[name] = path
        for path in sorted((self.local_root / "logs").glob(f"*{PROGRESS_SUFFIX}")):
            files[path.relative_to(self.local_root).as_posix()] = path
        for stale in (self.root / "manifests").files():
            if stale.relative_to(self.root) not in files:
                stale.delete()
        for rel in sorted(files, key=lambda r: (r.endswith(MARKER_SUFFIX), r)):
            (self.root / rel).write_bytes(files[rel].read_bytes())

    # ------------------------------------------------------------ checkpoints and exports
    def restore_models(self, stage: str) -> None:
        """Before ``stage``: the published checkpoints (exports) restored to the local side
        when this node's are older or missing (pipeline/remote_models.py)."""
        wanted = [(CHECKPOINTS, restore_checkpoints)] if stage in NEEDS_CHECKPOINTS else []
        wanted += [(EXPORTS, restore_exports)] if stage in NEEDS_EXPORTS else []
        for tree, restore in wanted:
            try:
                done = restore(self.root / tree.name, self.local_root / tree.name)
            except DatasetError as exc:
                raise PipelineError(
                    f"{exc}; publish them again from the node that has them", STAGE_CODES[stage]
                ) from None
            if done:
                log.info("%-10s %s from %s: %s", stage, tree.name, self.root / tree.name, done)
        self.models_ready.add(stage)

    def publish_models(self, stage: str) -> None:
        """After ``stage`` (run, skipped, failed or stopped): the local side's checkpoints
        (exports) it may have changed published at the URL, what it no longer keeps removed.
        Not after a stage whose restore failed: this node's copy would replace the URL's."""
        if stage not in self.models_ready:
            return
        for tree in PUBLISHES.get(stage, ()):
            local = self.local_root / tree.name
            if not local.is_dir():
                continue
            cost = publish_tree(tree, local, self.root / tree.name)
            log.info(
                "%-10s %s published at %s: %d units, %d uploaded (%.1f MiB), %d removed",
                stage,
                tree.name,
                self.root / tree.name,
                cost["units"],
                cost["uploaded"],
                cost["bytes"] / 2**20,
                cost["removed"],
            )

    def publishing_checkpoints(self) -> Publisher:
        """While the train stage runs: each checkpoint published as the trainer keeps it."""
        return Publisher(CHECKPOINTS, self.local_root / CHECKPOINTS.name, self.root / CHECKPOINTS.name)

    # ------------------------------------------------------------ parquet
    def parquet_fingerprint(self) -> str:
        """The published parquet's identity: its description and each split's marker (which
        names a fresh version prefix on every publication)."""
        parts = [_bytes_or_missing(self.parquet / PREPROCESS_JSON)]
        parts += [_bytes_or_missing(self.parquet / split / COMMIT_MARKER) for split in SPLITS]
        return stable_hash([hashlib.sha256(p).hexdigest() if p is not None else "missing" for p in parts])

    def parquet_complete(self) -> bool:
        """Whether the preprocess stage finished publishing: its ``_SUCCESS`` (removed when a
        run starts, written last), its description and every split's marker are there."""
        return all(f.is_file() for f in (self.parquet / SUCCESS, self.parquet / PREPROCESS_JSON)) and all(
            is_committed(self.parquet / split) for split in SPLITS
        )

    def fetch_parquet(self, target: Path) -> int:
        """The published splits (only the files their markers name), their description and
        dictionaries copied to the local directory ``target``, replaced whole; returns bytes.

        Raises:
            DatasetError: a split is not committed (preprocess has not published it).
        """
        if not self.parquet_complete():
            raise DatasetError(
                f"{self.parquet} holds no complete published parquet ("
                f"{SUCCESS}, {PREPROCESS_JSON} and a {COMMIT_MARKER} per split): "
                "run the preprocess stage"
            )
        copied = 0
        with atomic_directory(target, overwrite=True, fsync=False) as temporary:
            for split in SPLITS:
                copied += _copy_all(committed_files(self.parquet / split), temporary / split)
            dictionaries = self.parquet / DICTIONARIES_DIR
            if is_committed(dictionaries):
                copied += _copy_all(committed_files(dictionaries), temporary / DICTIONARIES_DIR)
            elif dictionaries.exists():
                copied += _copy_all(
                    {f.relative_to(dictionaries): f for f in dictionaries.files()},
                    temporary / DICTIONARIES_DIR,
                )
            for name in PARQUET_RECORDS:
                if (self.parquet / name).is_file():
                    copied += _copy_all({name: self.parquet / name}, temporary)
            (temporary / SUCCESS).write_text("")
        return copied

    def dictionaries_fingerprint(self) -> str:
        marker = _bytes_or_missing(self.parquet / DICTIONARIES_DIR / COMMIT_MARKER)
        return hashlib.sha256(marker).hexdigest()[:16] if marker is not None else "missing"

    def fetch_dictionaries(self, target: Path) -> None:
        """The published dictionaries (the export stage's) copied to ``target`` unless there,
        replaced whole."""
        source = self.parquet / DICTIONARIES_DIR
        if target.is_dir() or not is_committed(source):
            return
        with atomic_directory(target, overwrite=True, fsync=False) as temporary:
            _copy_all(committed_files(source), temporary)

    def fetch_histogram(self, counts: Path) -> None:
        """The count histogram (a threshold raise derives the dataset from it), when published."""
        source = self.root / "counts" / HISTOGRAM_FILE
        if source.is_file():
            source.copy_to(resolve(counts / HISTOGRAM_FILE))

    # ------------------------------------------------------------ binary dataset
    def binary_description(self) -> bytes | None:
        """The published dataset's ``dataset.json`` (None when nothing is committed)."""
        if not is_committed(self.binary):
            return None
        files = committed_files(self.binary, check=False)
        return files[DATASET_JSON].read_bytes() if DATASET_JSON in files else None

    def binary_fingerprint(self) -> str:
        marker = _bytes_or_missing(self.binary / COMMIT_MARKER)
        return hashlib.sha256(marker).hexdigest()[:16] if marker is not None else "missing"

    def dataset_hash(self) -> str:
        """As dlrm_contracts.fingerprint.file_content_hash of the published dataset.json."""
        description = self.binary_description()
        return hashlib.sha256(description).hexdigest()[:16] if description is not None else "missing"


def _bytes_or_missing(location: Location) -> bytes | None:
    try:
        return location.read_bytes()
    except FileNotFoundError:
        return None


def _copy_all(files: dict[str, Location], target: Path) -> int:
    copied = 0
    for name, location in files.items():
        destination = target / name
        location.copy_to(resolve(destination))
        copied += destination.stat().st_size
    return copied


def input_fingerprint(input_url: str) -> str:
    """pipeline.fingerprint.input_fingerprint of day files at a URL: the names, sizes and
    sampled-block hashes of the objects directly under it (a ranged GET per block)."""
    entries = []
    for location in resolve(input_url).iterdir():
        if not location.is_file() or location.name == "generator_meta.json":
            continue
        size = location.size()
        with location.open_input() as fh:
            sample = sampled_hash_of(lambda offset, length: fh.read_at(length, offset), size)
        entries.append((location.name, size, location.mtime_ns(), sample))
    return stable_hash(entries) if entries else "missing"


def drop_local_parquet(layout: WorkdirLayout) -> None:
    """The converter's local copy of the splits, once the dataset is made (the URL keeps them);
    the dictionaries stay, for the export stage."""
    for split in SPLITS:
        shutil.rmtree(str(layout.parquet_split(split)), ignore_errors=True)
