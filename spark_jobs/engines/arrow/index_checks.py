"""The dictionary index checked before a worker maps it and before a lookup reads it.

Why: a worker maps each range file at ``base + starts[r] * 8`` of a reserved span with
``MAP_FIXED``, and the numba probe reads slots without bounds checks. An ``index.json`` whose
bounds, starts or sizes disagree with each other or with the files would map a file over memory
the process uses, or let a probe read outside the span; a range file with other bytes would give
other ids without a word. So, before the first mapping, every number of ``index.json`` and every
range file's presence, type and size are checked; once mapped, before the first lookup, each
range file's bytes are checked against the checksum recorded when the index was sealed (after
the dictionary tasks wrote it). Any difference is one :class:`DictionaryIndexError` line naming
the file and the fix (the index is rebuilt by running the preprocess stage again).

What this detects: any change to ``index.json`` (its own checksum covers every bound, start,
size and file checksum; a change that keeps them consistent is still refused unless it also
recomputes that checksum), and any change to a range file's length or bytes (xxh3-128 of the
whole file), a missing file, or a file where a range keeps nothing. What it cannot: a file
changed after it was checked in a worker that already mapped it (a truncation then raises
SIGBUS on the next read of the lost pages); and a deliberate forgery that recomputes every
checksum, which at worst gives other ids: the structural checks and the bounded probe keep even
that from reading outside the mapped span or looping.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import xxhash

from dlrm_contracts.binary_format import checksum_text
from spark_jobs.errors import PreprocessJobError

REBUILD = "rebuild it by running the preprocess stage again (--stages preprocess --force)"
_MAX_BOUND = 2**32 - 1
_MAX_SLOTS = 1 << 34  # more than a range holding every uint32 value needs


class DictionaryIndexError(PreprocessJobError):
    """The dictionary index on disk is not the one the dictionary tasks wrote and sealed."""


def damaged(path: Path | str, problem: str) -> DictionaryIndexError:
    return DictionaryIndexError(f"damaged dictionary index: {path}: {problem}; {REBUILD}")


def read_meta(index_dir: Path, sealed: bool = True) -> dict:
    """``index.json`` parsed, of this format, with a ``columns`` mapping; with ``sealed`` its
    recorded checksum must match its contents."""
    from spark_jobs.engines.arrow.dictionary_index import INDEX_FORMAT_VERSION, INDEX_JSON

    path = index_dir / INDEX_JSON
    try:
        meta = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise damaged(path, "missing") from None
    except OSError as error:
        raise damaged(path, f"unreadable ({error.strerror})") from None
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested beyond reason
        raise damaged(path, "not JSON") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("columns"), dict):
        raise damaged(path, "no 'columns' mapping")
    if meta.get("format_version") != INDEX_FORMAT_VERSION:
        raise damaged(path, f"format {meta.get('format_version')!r}, expected {INDEX_FORMAT_VERSION}")
    if sealed:
        if not isinstance(meta.get("checksum"), str):
            raise damaged(path, "not sealed (the dictionary tasks did not finish)")
        if meta["checksum"] != meta_checksum(meta["columns"]):
            raise damaged(path, "its contents do not match its checksum")
    return meta


def meta_checksum(columns: dict) -> str:
    """The checksum of every column's entry (bounds, starts, sizes, file checksums)."""
    text = json.dumps(columns, sort_keys=True, separators=(",", ":"))
    return checksum_text(xxhash.xxh3_128(text.encode()))


def column_arrays(
    meta: dict, path: Path, column: str, sealed: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """A column's (bounds uint32, starts int64, sizes int64, file checksums) from ``meta``,
    checked: equal lengths, bounds ascending from 0, sizes whole pages, each start the sum of
    the sizes before it (so every range lies inside the span of the column's slots, one after
    another), and with ``sealed`` a checksum for each range that keeps something."""
    from spark_jobs.engines.arrow.dictionary_index import PAGE_SLOTS

    data = meta["columns"].get(column)
    if not isinstance(data, dict):
        raise damaged(path, f"no entry for column {column}")
    bounds = _integers(data, "bounds", _MAX_BOUND, path, column)
    starts = _integers(data, "starts", len(bounds) * _MAX_SLOTS, path, column)
    sizes = _integers(data, "sizes", _MAX_SLOTS, path, column)
    if not len(bounds) == len(starts) == len(sizes):
        raise damaged(path, f"column {column}: bounds, starts and sizes of different lengths")
    if bounds[0] != 0 or (np.diff(bounds) <= 0).any():
        raise damaged(path, f"column {column}: bounds not ascending from 0")
    if (sizes % PAGE_SLOTS).any():
        raise damaged(path, f"column {column}: a size that is not whole pages of {PAGE_SLOTS} slots")
    if not np.array_equal(starts, np.concatenate([[0], np.cumsum(sizes[:-1])])):
        raise damaged(path, f"column {column}: starts are not the sums of the sizes before them")
    checksums = data.get("checksums")
    if sealed and (
        not isinstance(checksums, list)
        or len(checksums) != len(sizes)
        or any(not isinstance(c, str) if s else c is not None for c, s in zip(checksums, sizes.tolist()))
    ):
        raise damaged(path, f"column {column}: no checksum for each range that keeps values")
    return bounds.astype(np.uint32), starts, sizes, checksums


def _integers(data: dict, key: str, highest: int, path: Path, column: str) -> np.ndarray:
    items = data.get(key)
    if (
        not isinstance(items, list)
        or not items
        or not all(type(x) is int and 0 <= x <= highest for x in items)
    ):  # bool is not a number here
        raise damaged(path, f"column {column}: '{key}' is not a list of integers from 0 to {highest}")
    return np.array(items, np.int64)


def check_files(index_dir: Path, column: str, sizes: np.ndarray) -> None:
    """Each range that keeps values has a regular file of exactly its slots; no other range has
    a file (a range emptied in ``index.json`` would otherwise lose its ids without a word)."""
    from spark_jobs.engines.arrow.dictionary_index import region_path

    for rank, slots in enumerate(sizes.tolist()):
        path = region_path(index_dir, column, rank)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            if slots:
                raise damaged(path, "missing") from None
            continue
        except OSError as error:
            raise damaged(path, f"unreadable ({error.strerror})") from None
        if not slots:
            raise damaged(path, "a file for a range that index.json says keeps nothing")
        check_region_stat(path, info, slots)


def check_region_stat(path: Path, info: os.stat_result, slots: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise damaged(path, "not a regular file")
    if info.st_size != slots * 8:
        raise damaged(path, f"{info.st_size} bytes where index.json says {slots * 8}")


def region_checksum(slots: np.ndarray) -> str:
    """The checksum of a range's slots as they are in its file (little-endian uint64)."""
    return checksum_text(xxhash.xxh3_128(slots))


def check_region(path: Path, slots: np.ndarray, recorded: str) -> None:
    """A mapped range's slots against the checksum recorded when the index was sealed."""
    if region_checksum(slots) != recorded:
        raise damaged(path, "its slots are not those the index was sealed with")
