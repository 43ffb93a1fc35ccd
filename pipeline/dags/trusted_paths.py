"""The checks on the DAG's administrator settings that name code: ``criteo_dlrm_python`` (the
interpreter every task runs) and ``criteo_dlrm_home`` (the directory whose ``pipeline`` package
it runs). Whoever can change either runs code as the Airflow user, so each must be an absolute
path owned by that user or root, and neither it nor the directory holding it writable by its
group or others (docs/pipeline.md, "Airflow: the shipped DAG").

Standard library only: the DAG loads this file beside itself (Airflow's environment does not
have the product's packages).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UntrustedPathError(ValueError):
    """A setting naming code that someone other than the Airflow user or root could change."""


def _problem(path: Path, info: os.stat_result, owners: set[int]) -> str | None:
    """Why ``path`` could be changed by another user, or None."""
    if info.st_uid not in owners:
        return f"{path} belongs to uid {info.st_uid}, neither this user ({os.geteuid()}) nor root"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def check_trusted_path(setting: str, value: str, kind: str) -> Path:
    """``value`` as a Path when it names code only the Airflow user or root can change: an
    absolute path to an existing ``kind`` ("executable" or "directory"); the path itself (a
    link and what it points to) and the directories holding them owned by this user or root,
    and not group- or world-writable. Else UntrustedPathError naming the setting and why."""
    path = Path(value)
    if not path.is_absolute():
        raise UntrustedPathError(f"the Airflow Variable {setting} must be an absolute path, got {value!r}")
    target = path.resolve()
    if kind == "executable" and not (target.is_file() and os.access(target, os.X_OK)):
        raise UntrustedPathError(f"the Airflow Variable {setting} ({value}) is not an executable")
    if kind == "directory" and not target.is_dir():
        raise UntrustedPathError(f"the Airflow Variable {setting} ({value}) is not a directory")
    owners = {os.geteuid(), 0}
    checked = [
        (path, os.lstat(path)),
        (target, os.stat(target)),
        (path.parent, os.stat(path.parent)),
        (target.parent, os.stat(target.parent)),
    ]
    for candidate, info in checked:
        if stat.S_ISLNK(info.st_mode):  # a link's own mode means nothing; its owner does
            if info.st_uid not in owners:
                raise UntrustedPathError(
                    f"the Airflow Variable {setting}: the link {candidate} belongs to uid {info.st_uid}"
                )
            continue
        why = _problem(candidate, info, owners)
        if why:
            raise UntrustedPathError(
                f"the Airflow Variable {setting} names code others could "
                f"change: {why}; it must be owned by the Airflow user or "
                "root and writable by no one else"
            )
    return path
