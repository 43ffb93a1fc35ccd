"""All-or-nothing output directories.

A dataset is written into a temporary sibling (``.<name>.tmp-<pid>-<random>``), flushed to
disk, renamed onto the final name and only then marked with ``_SUCCESS``. Whatever stops the
process — an exception, a kill, a power cut — the final path either holds the previous
complete dataset, nothing, or a new complete one; a directory without ``_SUCCESS`` is never
read as finished (verify refuses it). A failed run removes its temporary directory; one killed
hard is removed by the next run (its pid is no longer alive).
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from converters.format import SUCCESS, DatasetError


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
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temporary = final.parent / f".{final.name}.tmp-{tag}"
    temporary.mkdir()
    try:
        yield temporary
        if fsync:
            for root, _dirs, files in os.walk(temporary):
                for name in files:
                    fsync_path(Path(root) / name)
                fsync_path(Path(root))
        _replace(temporary, final, tag)
        success = final / SUCCESS
        success.write_text("")
        if fsync:
            fsync_path(success)
            fsync_path(final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _replace(temporary: Path, final: Path, tag: str) -> None:
    """Move ``temporary`` onto ``final``; an old ``final`` is set aside first, then deleted."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.parent / f".{final.name}.old-{tag}"
        # Unmark first: between the renames nothing at `final` may look complete.
        if (final / SUCCESS).exists():
            (final / SUCCESS).unlink()
        os.replace(final, old)
    os.replace(temporary, final)
    fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
