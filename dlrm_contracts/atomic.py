"""All-or-nothing writes of files and directories: the one way every wing writes its outputs.

A file or directory is written under a temporary sibling name (``.<name>.tmp-<pid>-<random>``)
and renamed onto its final name, so a reader finds the previous complete version, nothing, or
the new complete one, whatever stops the writer (an exception, a kill, a power cut). A failed
writer removes its temporary; one killed hard leaves it to the next run, which deletes it once
its pid is no longer alive (:func:`remove_stale_temporaries`). A directory is complete only
with its ``_SUCCESS`` marker, written after the rename (verify refuses a directory without it).

fsync policy, the same for every caller. With ``fsync=True`` (the default) a file's content is
flushed before the rename and its directory after it: without the first, a power cut can leave
the final name pointing at a short file; without the second, the rename itself can be lost.
A directory is flushed file by file and then as a directory. ``fsync=False`` is only for bulk
outputs that are cheap to remake and whose config says so (ConvertConfig.fsync, the converters'
``--no-fsync``, the generator's day files): such a write is still atomic against the writer
dying, not against the machine losing power. Flushing a directory is best effort (not every
file system allows it).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.layout import SUCCESS


def fsync_path(path: Path) -> None:
    """Flush a file or directory entry to disk (directories: best effort, not on every OS)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(final: Path) -> list[Path]:
    """Delete temporary / set-aside siblings (directories or files) of ``final`` left by runs
    that died (pid gone)."""
    removed = []
    prefixes = (f".{final.name}.tmp-", f".{final.name}.old-")
    if not final.parent.is_dir():
        return removed
    for entry in final.parent.iterdir():
        prefix = next((p for p in prefixes if entry.name.startswith(p)), None)
        if prefix is None:
            continue
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def temporary_sibling(final: Path, kind: str = "tmp") -> Path:
    """A fresh name beside ``final`` that :func:`remove_stale_temporaries` recognises."""
    final = Path(final)
    return final.parent / f".{final.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextmanager
def atomic_file(final: str | Path, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on a clean exit it is renamed onto ``final``."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final)
    temporary = temporary_sibling(final)
    try:
        yield temporary
        if fsync:
            fsync_path(temporary)
        os.replace(temporary, final)
        if fsync:
            fsync_path(final.parent)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk must not also keep a half-written file
        raise


def write_text_atomic(path: str | Path, text: str, fsync: bool = True) -> None:
    with atomic_file(path, fsync) as temporary:
        temporary.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, data: Any, sort_keys: bool = True,
                      fsync: bool = True) -> None:
    """Indented JSON. ``sort_keys=False`` keeps the mapping's order (C1..C26, days in order),
    for files people read."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=sort_keys, default=str) + "\n",
                      fsync)


def read_json(path: str | Path, default: Any = None) -> Any:
    """A JSON file's content, or ``default`` when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default


def refuse_overlap(output: str | Path, inputs: dict[str, str | Path]) -> None:
    """Refuse an output that is, contains or lies inside one of the inputs.

    The output directory is replaced as a whole (and a previous one deleted), so writing onto
    the source, onto a folder holding it (e.g. the workdir) or into it would delete the input.
    Paths are resolved, so ``..`` and symlinks do not hide an overlap.
    """
    out = Path(output).resolve()
    for what, path in inputs.items():
        source = Path(path).resolve()
        if out == source or out in source.parents or source in out.parents:
            raise DatasetError(f"output {output} overlaps the {what} {path} (the output directory "
                               "is replaced as a whole); choose a separate output directory")


def is_complete(path: Path) -> bool:
    return (Path(path) / SUCCESS).is_file()


@contextmanager
def atomic_directory(final: str | Path, overwrite: bool = False,
                     fsync: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary directory; on a clean exit it becomes ``final`` + ``_SUCCESS``.

    A complete ``final`` is replaced only with ``overwrite``; an incomplete one (no
    ``_SUCCESS``) is leftover of a failed run and is replaced without asking.
    """
    final = Path(final).absolute()
    if is_complete(final) and not overwrite:
        raise DatasetError(f"{final} already holds a complete dataset; "
                           "allow overwriting (ConvertConfig.overwrite) to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final)
    temporary = temporary_sibling(final)
    temporary.mkdir()
    try:
        yield temporary
        if fsync:
            fsync_tree(temporary)
        replace_directory(temporary, final, fsync)
        success = final / SUCCESS
        success.write_text("")
        if fsync:
            fsync_path(success)
            fsync_path(final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then each directory entry."""
    for directory, _dirs, files in os.walk(root):
        for name in files:
            fsync_path(Path(directory) / name)
        fsync_path(Path(directory))


def replace_directory(new: str | Path, final: str | Path, fsync: bool = True) -> None:
    """Move the finished directory ``new`` onto ``final``; an old ``final`` is set aside first
    and deleted only after the rename, so a crash leaves one of the two whole. ``new`` is
    expected on disk already (:func:`fsync_tree`); ``fsync`` makes the rename durable."""
    new, final = Path(new), Path(final)
    old = None
    if final.exists() or final.is_symlink():
        old = temporary_sibling(final, "old")
        # Unmark first: between the renames nothing at `final` may look complete.
        (final / SUCCESS).unlink(missing_ok=True)
        os.replace(final, old)
    os.replace(new, final)
    if fsync:
        fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
