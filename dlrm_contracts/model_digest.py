"""The content digest of an exported SavedModel, recorded in its fingerprint.json.

A model directory a server or the score stage loads is code (TensorFlow ops can read and write
files), so both load only a version whose files still hash to what the export stage recorded
(docs/cluster.md, "Serving"). The serving image has no Python: the digest is defined so that
coreutils compute the same value, which docker/serving/entrypoint.sh does::

    cd VERSION && find . -type f ! -path ./fingerprint.json -print0 | LC_ALL=C sort -z \\
        | xargs -0 sha256sum | sha256sum

that is, the sha256 of one ``<sha256 of the file>  ./<relative path>`` line per file but the
fingerprint itself, in byte order of the paths.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dlrm_contracts.layout import EXPORT_FINGERPRINT

DIGEST_KEY = "content_sha256"


class ModelDigestError(ValueError):
    """A model version without a fingerprint, or whose files differ from it."""


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def saved_model_digest(directory: str | Path) -> str:
    """The digest of every file under ``directory`` except fingerprint.json (see above)."""
    root = Path(directory)
    files = sorted(
        (b"./" + p.relative_to(root).as_posix().encode(), p)
        for p in root.rglob("*")
        if p.is_file() and p != root / EXPORT_FINGERPRINT
    )
    listing = b"".join(_file_sha256(p).encode() + b"  " + name + b"\n" for name, p in files)
    return hashlib.sha256(listing).hexdigest()


def verify_saved_model(directory: str | Path) -> dict[str, Any]:
    """The version's fingerprint when its files hash to the digest it records; else
    ModelDigestError naming the version and what is wrong."""
    root = Path(directory)
    try:
        fingerprint = json.loads((root / EXPORT_FINGERPRINT).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDigestError(
            f"{root} has no {EXPORT_FINGERPRINT}: not a version the export stage wrote; refusing to load it"
        ) from None
    except (OSError, ValueError) as error:
        raise ModelDigestError(f"{root / EXPORT_FINGERPRINT} cannot be read: {error}") from None
    recorded = fingerprint.get(DIGEST_KEY) if isinstance(fingerprint, dict) else None
    links = sorted(str(p) for p in root.rglob("*") if p.is_symlink())
    if links:  # the digest covers regular files: a link could point anywhere
        raise ModelDigestError(
            f"{root} holds a symbolic link ({links[0]}), which the export "
            "stage never writes; refusing to load it"
        )
    if not recorded:
        raise ModelDigestError(
            f"{root / EXPORT_FINGERPRINT} records no {DIGEST_KEY}: export "
            "the model again (an export of an older version of the pipeline)"
        )
    if saved_model_digest(root) != recorded:
        raise ModelDigestError(
            f"{root}: its files differ from what the export stage recorded "
            f"({EXPORT_FINGERPRINT} {DIGEST_KEY}); refusing to load it"
        )
    result: dict[str, Any] = fingerprint
    return result
