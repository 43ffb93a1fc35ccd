"""What a trained model is bound to: the ids of its embedding rows mean the values of the
dictionaries of one preprocess run, and nothing else.

A new day preprocessed rewrites the dictionaries (ids move with the counts), so a checkpoint
exported with today's dictionaries would score every value with the row of another. The
converters record the dictionaries' fingerprint in ``dataset.json``, the trainer copies the
dataset's identity into each checkpoint's ``meta.json``, and the export refuses a checkpoint
whose identity is not the one of the dictionaries it would ship.

The fingerprint hashes every byte of the dictionary files (xxh3-128, ~9 GB/s): a footer can
stay the same when two values swap ids. The export reads the same files in full anyway, and the
converters' few seconds on the Terabyte's dictionaries (a GB or two) are nothing beside the
conversion itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xxhash

from dlrm_contracts.binary_format import CHECKSUM_PREFIX, DatasetError, DatasetInfo, file_checksum
from dlrm_contracts.id_modes import IdMode, recorded_or_default
from dlrm_contracts.thresholds import ThresholdSpec

# Keys: dataset.json's (written by the converters) and the checkpoint meta's.
DICTIONARIES_FINGERPRINT_KEY = "dictionaries_fingerprint"
IDENTITY_KEY = "dataset_identity"
# The identity of a dataset whose ids are not served through parquet/dictionaries says how
# they were given (IdMode.in_dataset_identity): capped ids come from no dictionary, so the
# export and a warm start must know; contiguous ids' dictionaries are elsewhere and read by
# another rule (dlrm_contracts.contiguous_ids). The other modes' identities stay what they were.
IDS_KEY = "ids"


def parquet_footer(path: Path) -> bytes:
    """The parquet footer (metadata: schema, row groups, offsets, statistics) of one file."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        if size < 12:
            raise DatasetError(f"{path} is not a parquet file ({size} bytes)")
        fh.seek(size - 8)
        tail = fh.read(8)
        if tail[4:] != b"PAR1":
            raise DatasetError(f"{path} is not a parquet file (no PAR1 trailer)")
        length = int.from_bytes(tail[:4], "little")
        if length > size - 12:
            raise DatasetError(
                f"{path} is not a parquet file (footer length {length} does not fit in {size} bytes)"
            )
        fh.seek(size - 8 - length)
        return fh.read(length)


def dictionaries_fingerprint(directory: str | Path) -> str | None:
    """Hash of every ``*.parquet`` file under the dictionaries' directory (name and bytes);
    None when there is no such directory (a dataset converted without its dictionaries)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    digest = xxhash.xxh3_128()
    for path in sorted(directory.rglob("*.parquet")):
        name = path.relative_to(directory)
        if any(part.startswith((".", "_")) for part in name.parts):
            continue
        digest.update(f"{name}:{path.stat().st_size}\n".encode())
        digest.update(bytes.fromhex(file_checksum(path).removeprefix(CHECKSUM_PREFIX)))
    return CHECKSUM_PREFIX + digest.hexdigest()


def dataset_identity(info: DatasetInfo, read_threshold: ThresholdSpec | None = None) -> dict[str, Any]:
    """What a checkpoint trained on this dataset records about it (``meta.json``)."""
    return {
        "source_fingerprint": info.source_fingerprint,
        DICTIONARIES_FINGERPRINT_KEY: info.extra.get(DICTIONARIES_FINGERPRINT_KEY),
        "threshold_spec": (info.threshold_spec if read_threshold is None else str(read_threshold)),
        **({IDS_KEY: mode.name} if (mode := recorded_or_default(info.extra)).in_dataset_identity else {}),
    }


def identity_mode(identity: dict[str, Any] | None) -> IdMode:
    """How the ids of a dataset identity (or a checkpoint's record of one) were given, as far
    as serving them is concerned: an identity that names no mode is of dictionary ids."""
    return recorded_or_default(identity)


def capped(identity: dict[str, Any] | None) -> bool:
    """Whether a dataset identity (or a checkpoint's record of one) is of capped ids."""
    return identity_mode(identity).capped


def contiguous(identity: dict[str, Any] | None) -> bool:
    """Whether a dataset identity (or a checkpoint's record of one) is of contiguous ids."""
    return identity_mode(identity).contiguous


def trained_on(checkpoint_meta: dict[str, Any], identity: dict[str, Any]) -> bool:
    """Whether a checkpoint (its meta.json) was trained on the dataset of ``identity``.

    What tells a run of this dataset (resumed, or replaced by a rerun) from the previous model
    a warm start begins from. A checkpoint that records no dataset (saved before checkpoints
    did) counts as this one, as resuming always treated it.
    """
    recorded = checkpoint_meta.get(IDENTITY_KEY)
    return not recorded or not identity or recorded == identity
