"""All-or-nothing writes of files and directories: the one way every wing writes its outputs.

A file or directory is written under a temporary sibling name (``.<name>.tmp-<pid>-<random>``)
and renamed onto its final name, so a reader finds the previous complete version, nothing, or
the new complete one, whatever stops the writer (an exception, a kill, a power cut). A failed
writer removes its temporary; one killed hard leaves it to the next run, which deletes it once
its pid is no longer alive (:func:`remove_stale_temporaries`). A directory is complete only
with its ``_SUCCESS`` marker, written into it before the rename that makes it current.

The order every publication follows, here and nowhere else (docs/pipeline.md, "What survives
a kill, what survives a power cut"):

1. the new content is flushed (``os.fsync`` of each file, then of each directory in it);
2. the previous copy, if any, is renamed aside, and the new one renamed onto the final name;
3. the parent directory is flushed, which makes the rename itself durable;
4. only then is the previous copy deleted.

Without 1 a power cut can leave the final name pointing at a short or empty file; without 3
the rename can be undone by the power cut after 4 deleted the old copy: neither would be left.
A kill between the two renames of 2 leaves the previous copy aside and nothing at the final
name; :func:`remove_stale_temporaries` (which every writer calls first) puts it back.

``fsync=False`` is only for bulk outputs that are cheap to remake and whose config says so
(ConvertConfig.fsync, the converters' ``--no-fsync``, the generator's day files): such a
write is still atomic against the writer dying, not against the machine losing power.
Flushing a directory is best effort (not every file system allows it).

Writes into a workdir never follow a symbolic link planted at the name written: a rename
replaces the link itself, and what is appended to (logs, the run history) is opened with
``O_NOFOLLOW`` (:func:`open_append`), a link there being refused with its name.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Literal, TextIO, overload

from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.layout import SUCCESS


def fsync_path(path: Path) -> None:
    """Flush a file or directory to disk (directories: best effort, not on every OS).
    A path that cannot be opened is skipped (it is gone, or not ours to flush)."""
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


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then each directory, deepest first, then ``root``
    (a single file: just it)."""
    root = Path(root)
    if not root.is_dir():
        fsync_path(root)
        return
    for directory, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(directory) / name)
        fsync_path(Path(directory))


def remove_path(path: Path) -> None:
    """Delete a file, a link or a directory tree, whichever stands at ``path`` (if any)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def publish(new: str | Path, final: str | Path, fsync: bool = True, aside: str | Path | None = None) -> None:
    """Make ``new`` (a finished file or directory beside ``final``) the one at ``final``, in
    the order of the module's docstring: flushed, the old copy set aside, renamed, the
    directory flushed, the old copy deleted. ``aside``: where the old copy waits (a name a
    recovery knows; by default one :func:`remove_stale_temporaries` recognises)."""
    new, final = Path(new), Path(final)
    if fsync:
        fsync_tree(new)
    old = None
    if final.exists() or final.is_symlink():
        old = Path(aside) if aside is not None else temporary_sibling(final, "old")
        if old.exists() or old.is_symlink():
            remove_path(old)
        if final.is_dir() and not final.is_symlink():
            # between the renames nothing at `final` may look complete
            (final / SUCCESS).unlink(missing_ok=True)
        os.replace(final, old)
    os.replace(new, final)
    if fsync:
        fsync_path(final.parent)
    if old is not None:
        remove_path(old)


def replace_file(temporary: str | Path, final: str | Path, fsync: bool = True) -> None:
    """The written file ``temporary`` renamed onto ``final``: flushed first, its directory
    after (the rename replaces a link at ``final``, never writes through it)."""
    temporary, final = Path(temporary), Path(final)
    if fsync:
        fsync_path(temporary)
    os.replace(temporary, final)
    if fsync:
        fsync_path(final.parent)


@overload
def open_append(path: str | Path, binary: Literal[False] = False, buffering: int = -1) -> TextIO: ...
@overload
def open_append(path: str | Path, binary: Literal[True], buffering: int = -1) -> BinaryIO: ...
def open_append(path: str | Path, binary: bool = False, buffering: int = -1) -> TextIO | BinaryIO:
    """``path`` opened to append (created 0644 if missing), never through a symbolic link:
    a link planted there is refused with an OSError naming it, its target left untouched."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if path.is_symlink():
            raise symlink_refused(path) from None
        raise exc
    if binary:
        return os.fdopen(fd, "ab", buffering=buffering)
    return os.fdopen(fd, "a", buffering=buffering, encoding="utf-8")


def symlink_refused(path: Path) -> OSError:
    """The error for a symbolic link found where a workdir file is written."""
    return OSError(
        errno.ELOOP,
        f"{path} is a symbolic link (to {os.readlink(path)}): files in "
        "a workdir are never written through a link; remove it",
        str(path),
    )


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with ``pid`` runs (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(final: Path) -> list[Path]:
    """Delete temporary / set-aside siblings (directories or files) of ``final`` left by runs
    that died (pid gone). A writer killed between :func:`publish`'s two renames left the
    previous copy aside and nothing at ``final``: that copy is put back first."""
    removed: list[Path] = []
    final = Path(final)
    prefixes = (f".{final.name}.tmp-", f".{final.name}.old-")
    if not final.parent.is_dir():
        return removed
    stale = []
    for entry in final.parent.iterdir():
        prefix = next((p for p in prefixes if entry.name.startswith(p)), None)
        if prefix is None:
            continue
        pid_text = entry.name[len(prefix) :].split("-", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            stale.append((prefix, entry))
    set_aside = [entry for prefix, entry in stale if prefix == prefixes[1]]
    if set_aside and not (final.exists() or final.is_symlink()):
        restored = max(set_aside, key=lambda p: p.lstat().st_mtime)
        os.replace(restored, final)
        fsync_path(final.parent)
        stale = [(prefix, entry) for prefix, entry in stale if entry != restored]
    for _prefix, entry in stale:
        remove_path(entry)
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
        replace_file(temporary, final, fsync)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk must not also keep a half-written file
        raise


def write_text_atomic(path: str | Path, text: str, fsync: bool = True) -> None:
    with atomic_file(path, fsync) as temporary:
        temporary.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, data: Any, sort_keys: bool = True, fsync: bool = True) -> None:
    """Indented JSON. ``sort_keys=False`` keeps the mapping's order (C1..C26, days in order),
    for files people read."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=sort_keys, default=str) + "\n", fsync)


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
            raise DatasetError(
                f"output {output} overlaps the {what} {path} (the output directory "
                "is replaced as a whole); choose a separate output directory"
            )


def is_complete(path: Path) -> bool:
    return (Path(path) / SUCCESS).is_file()


@contextmanager
def atomic_directory(final: str | Path, overwrite: bool = False, fsync: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary directory; on a clean exit it becomes ``final`` + ``_SUCCESS``.

    A complete ``final`` is replaced only with ``overwrite``; an incomplete one (no
    ``_SUCCESS``) is leftover of a failed run and is replaced without asking.
    """
    final = Path(final).absolute()
    if is_complete(final) and not overwrite:
        raise DatasetError(
            f"{final} already holds a complete dataset; "
            "allow overwriting (ConvertConfig.overwrite) to replace it"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final)
    temporary = temporary_sibling(final)
    temporary.mkdir()
    try:
        yield temporary
        (temporary / SUCCESS).write_text("")
        publish(temporary, final, fsync)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def replace_directory(new: str | Path, final: str | Path, fsync: bool = True) -> None:
    """Move the finished directory ``new`` onto ``final`` (:func:`publish`): an old ``final``
    is set aside first and deleted only once the rename is durable, so a crash or a power cut
    leaves one of the two whole."""
    publish(new, final, fsync)
