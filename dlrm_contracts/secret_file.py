"""The shared-secret file of an authenticated Spark cluster: what `pipeline.cluster_auth prepare`
writes and what the Spark job reads (docs/cluster.md section 2.2)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from dlrm_contracts.errors import UsageError

# Java's properties-file reader gives backslashes, '#', '!' and whitespace meanings of their
# own, so a secret is kept to characters that mean nothing there (hex, base64, base64url).
SECRET_CHARS = re.compile(r"^[A-Za-z0-9._~+/=-]+$")
SECRET_MIN_CHARS = 32  # 128 bits as hex: a guessable secret is no secret


class SecretFileError(UsageError, ValueError):
    """A secret file that is missing, readable by others, or not a usable secret.

    The message names the file and the rule broken, never the file's content."""


def read_secret_file(path: str | Path) -> str:
    """The secret held by ``path``: one line, owner-only permissions, at least
    SECRET_MIN_CHARS characters of SECRET_CHARS."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as error:
        raise SecretFileError(f"secret file {path} cannot be read: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SecretFileError(f"secret file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise SecretFileError(
            f"secret file {path} has mode {stat.S_IMODE(info.st_mode):04o}: it "
            f"must be readable by its owner only (chmod 600 {path})"
        )
    if info.st_uid != os.geteuid():
        raise SecretFileError(f"secret file {path} belongs to another user (uid {info.st_uid})")
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        raise SecretFileError(f"secret file {path} is not ASCII text") from None
    lines = [line.strip() for line in lines if line.strip()]
    if len(lines) != 1:
        raise SecretFileError(f"secret file {path} must hold exactly one non-empty line, it has {len(lines)}")
    secret = lines[0]
    if len(secret) < SECRET_MIN_CHARS or not SECRET_CHARS.match(secret):
        raise SecretFileError(
            f"secret file {path}: the secret must be at least {SECRET_MIN_CHARS} characters "
            "from A-Z a-z 0-9 . _ ~ + / = - (e.g. python -c 'import secrets; "
            "print(secrets.token_hex(32))')"
        )
    return secret
