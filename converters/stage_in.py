"""stage-in: the split binary dataset copied from the workdir URL to a training node's disk.

Training reads the binary dataset with memory maps and random reads, from local or shared
disk as always; when the workdir is on an object store (or HDFS), each training node copies
the dataset once, here, before the trainer starts. The copy is checked against the checksums
``dataset.json`` recorded when the dataset was written (dlrm_contracts.verify) and published
whole (dlrm_contracts.atomic): a node whose copy is already there and intact copies nothing,
one killed mid-copy starts over, one whose copy was damaged (or is of another dataset) gets a
fresh one.

The source is a dataset directory at a URL, committed by its marker
(dlrm_contracts.object_commit: only the files it names are read), or a plain directory of the
dataset (a local or shared path, a tree uploaded by other tools, with its ``_SUCCESS``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from dlrm_contracts.atomic import atomic_directory
from dlrm_contracts.binary_format import DamagedDatasetError, DatasetError
from dlrm_contracts.layout import DATASET_JSON, SUCCESS
from dlrm_contracts.object_commit import committed_files, is_committed
from dlrm_contracts.storage import Location, resolve
from dlrm_contracts.verify import verify_checksums

log = logging.getLogger(__name__)


def source_files(source: Location) -> dict[str, Location]:
    """name -> Location of the dataset's files at ``source`` (without ``_SUCCESS``)."""
    if is_committed(source):
        files = committed_files(source)
    else:
        if not (source / SUCCESS).is_file():
            raise DatasetError(
                f"{source} holds no complete binary dataset (no commit marker and "
                f"no {SUCCESS}): run the convert stage first"
            )
        files = {p.relative_to(source): p for p in source.files()}
    files = {name: loc for name, loc in files.items() if name != SUCCESS}
    if DATASET_JSON not in files:
        raise DatasetError(f"{source} has no {DATASET_JSON}: not a split binary dataset")
    return files


def _intact_copy(target: Path, description: bytes) -> bool:
    """Whether ``target`` already holds this dataset (same dataset.json), every file intact."""
    if not (target / SUCCESS).is_file() or not (target / DATASET_JSON).is_file():
        return False
    if (target / DATASET_JSON).read_bytes() != description:
        return False
    try:
        verify_checksums(target)
    except DatasetError as exc:
        log.warning("stage-in: the copy at %s is not intact (%s); copying again", target, exc)
        return False
    return True


def stage_in(source: str | Location, target: str | Path, fsync: bool = True) -> dict:
    """Copy the dataset at ``source`` (URL or path) to the local directory ``target`` unless an
    intact copy is there; returns {"copied": bool, "files": n, "bytes": n}.

    Raises:
        DamagedDatasetError: the copied files do not match their recorded checksums (the
            source is damaged, or changed while it was copied); nothing is published.
    """
    source = resolve(source)
    target = Path(target).absolute()
    files = source_files(source)
    description = files[DATASET_JSON].read_bytes()
    if _intact_copy(target, description):
        return {"copied": False, "files": len(files), "bytes": 0}
    copied = 0
    with atomic_directory(target, overwrite=True, fsync=fsync) as temporary:
        for name, location in files.items():
            location.copy_to(resolve(temporary / name))
            copied += (temporary / name).stat().st_size
        (temporary / SUCCESS).write_text("")  # checked before it is published
        try:
            verify_checksums(temporary)
        except DatasetError as exc:
            raise DamagedDatasetError(
                f"stage-in from {source}: the copy does not match the dataset's recorded checksums ({exc})"
            ) from None
    return {"copied": True, "files": len(files), "bytes": copied}
