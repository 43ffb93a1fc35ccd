"""A workdir's records and published directories, written and read the same way on a local
path and at a URL (S3, GCS, Azure, HDFS).

Why functions over ``Path | Location``: ``WorkdirLayout`` already names every output as a Path
(a local workdir) or a ``dlrm_contracts.storage.Location`` (a workdir URL), joined the same
way, so only the operation differs. Each function here takes either and does what that
filesystem needs; a stage calls one of them where it wrote a file, and its code reads the
same for both. For a Path each keeps exactly the local code path it replaces (atomic.py's
temporary, fsync, rename), so local bytes and crash behaviour do not change.

On a store:

- a record (a small JSON or text file) is one PUT, which replaces the previous object whole;
- a directory that readers take as a whole (a split, the dictionaries) is published by
  ``dlrm_contracts.object_commit``'s protocol: its files go under a fresh prefix
  ``DIR/.v-<time>-<random>/``, then one marker ``DIR/_COMMIT.json`` naming them is written
  last. :func:`published_files` and :func:`published_dir` read only what the marker names, so
  a writer killed before its marker leaves nothing a reader trusts, and the next publication
  deletes its leftovers.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import shutil
from pathlib import Path
from typing import Any, TypeGuard

import pyarrow.fs as pafs

from dlrm_contracts import object_commit
from dlrm_contracts.atomic import read_json as _read_json_local
from dlrm_contracts.atomic import write_text_atomic
from dlrm_contracts.storage import Location

Target = Path | Location


def is_remote(target: object) -> TypeGuard[Location]:
    """Whether ``target`` is a Location on a store (a local Location counts as local)."""
    return isinstance(target, Location) and not target.is_local


def json_text(data: Any, sort_keys: bool = True) -> str:
    """The bytes every record is written with, here and by ``atomic.write_json_atomic``."""
    return json.dumps(data, indent=2, sort_keys=sort_keys, default=str) + "\n"


# ---------------------------------------------------------------------- records
def write_text(target: Target, text: str) -> None:
    """A small file, all or nothing: locally temporary + fsync + rename; on a store one PUT."""
    if is_remote(target):
        target.write_text(text)
    else:
        write_text_atomic(local_path(target), text)


def write_json(target: Target, data: Any, sort_keys: bool = True) -> None:
    """Indented JSON (``sort_keys=False`` keeps the mapping's order, for files people read)."""
    write_text(target, json_text(data, sort_keys))


def read_text(target: Target) -> str:
    """A small file's text (FileNotFoundError when it is not there)."""
    if is_remote(target):
        return target.read_text()
    return local_path(target).read_text(encoding="utf-8")


def read_json(target: Target, default: Any = None) -> Any:
    """A JSON record, or ``default`` when there is none."""
    if not is_remote(target):
        return _read_json_local(local_path(target), default)
    try:
        return json.loads(target.read_text())
    except FileNotFoundError:
        return default


def exists(target: Target) -> bool:
    return target.exists() if is_remote(target) else local_path(target).exists()


def is_dir(target: Target) -> bool:
    """A directory, or on a store a prefix with at least one object under it."""
    return target.is_dir() if is_remote(target) else local_path(target).is_dir()


def entries(directory: Target) -> list[Target]:
    """The entries directly inside ``directory``, sorted by name ([] when it is missing)."""
    if is_remote(directory):
        return list(directory.iterdir())
    path = local_path(directory)
    return list(sorted(path.iterdir())) if path.is_dir() else []


def remove(target: Target) -> None:
    """A file, if it is there."""
    if is_remote(target):
        target.delete()
    else:
        local_path(target).unlink(missing_ok=True)


def remove_tree(target: Target) -> None:
    """A directory (on a store: a prefix) and everything under it, if it is there."""
    if is_remote(target):
        target.delete_tree()
    else:
        shutil.rmtree(local_path(target), ignore_errors=True)


def make_dir(target: Target) -> None:
    """A directory (nothing to do on a store without directories)."""
    if is_remote(target):
        return
    local_path(target).mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------------- published directories
def new_version(final: Location) -> Location:
    """A fresh, empty prefix under ``final`` for the files of a new publication of ``final``
    (a store only); :func:`commit_version` publishes it."""
    return final / new_version_name()


def new_version_name() -> str:
    """A fresh version's name (``.v-<time>-<random>``), for writers that put one version's
    files under several directories, each then committed on its own."""
    return object_commit._new_version()


def commit_version(final: Location, version: Location) -> dict[str, int]:
    """Publish ``version`` (written under ``final`` by :func:`new_version`): its marker names
    every file in it with its size, written last; then the other versions go. Returns the
    files named (relative name -> size)."""
    files = _sizes_under(version)
    object_commit.write_marker(final, version.name, files)
    object_commit.remove_other_versions(final, keep=version.name)
    return files


def _sizes_under(root: Location) -> dict[str, int]:
    """relative name -> size of every file under ``root``, from one listing (no request per
    file)."""
    selector = pafs.FileSelector(root.path, allow_not_found=True, recursive=True)
    return {
        posixpath.relpath(info.path, root.path): info.size
        for info in root.fs.get_file_info(selector)
        if info.type == pafs.FileType.File
    }


def published_dir(final: Target) -> Target | None:
    """Where the published content of ``final`` is: the directory itself locally (None when it
    is missing), the committed version on a store (None before its first commit)."""
    if is_remote(final):
        return object_commit.committed_version(final)
    path = local_path(final)
    return path if path.is_dir() else None


def published_files(final: Target, pattern: str = "*") -> list[Target]:
    """The files of the directory ``final`` whose names match ``pattern``, sorted by name:
    locally its files (names starting with "." or "_" left out); on a store only those its
    commit marker names, each checked present at its recorded size."""
    if not is_remote(final):
        path = local_path(final)
        return [p for p in sorted(path.glob(pattern)) if p.is_file() and not p.name.startswith((".", "_"))]
    named = object_commit.committed_files(final)
    return [named[name] for name in sorted(named) if fnmatch.fnmatch(name, pattern)]


def local_path(target: Target) -> Path:
    """The local path of a Path or of a Location on the local filesystem."""
    return target.local_path() if isinstance(target, Location) else Path(target)
