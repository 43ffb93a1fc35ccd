"""Reusing a previous conversion, day by day (stable ids' daily runs).

With ``preprocess.ids: stable`` the parquet splits are made of days (``parquet/segments.json``,
written by spark_jobs.day_store: per split, each day's files, rows and a token naming that
transform of the day). The binary dataset records the same list (``dataset.json`` key
``segments``: day, rows, token per split, in row order). A new conversion copies the rows of a
day whose token it converted before straight from the previous dataset's files (no parquet
decoding, no id narrowing) and converts only the other days. Copied ids were checked when first
written, against tables that can only have grown since (stable ids), so they stay in range; a
table that crossed an id-width boundary is widened while copying.

The previous dataset is read before the new one replaces it (the conversion is atomic), so a
killed conversion leaves it whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrm_contracts.binary_format import (
    LABEL_DTYPE,
    LABEL_FILE,
    NUM_NUMERICAL,
    NUMERICAL_DTYPE,
    NUMERICAL_FILE,
    DatasetError,
    cat_file,
    read_info,
    read_json,
)
from dlrm_contracts.multi_hot import MultiHotSpec, spec_of_dataset
from dlrm_contracts.layout import DATASET_JSON, SEGMENTS_JSON, SUCCESS
from dlrm_contracts.schema import NUM_CATEGORICAL, SPLITS
from dlrm_contracts.verify import verify_dataset

log = logging.getLogger(__name__)

SEGMENTS_KEY = "segments"  # in dataset.json: per split, [{day, rows, token}] in row order
COPY_ROWS = 1 << 20  # rows copied per read: bounds memory whatever the day's size


@dataclass(frozen=True)
class Segment:
    """One day's rows of one split."""

    day: int
    files: tuple[Path, ...]
    rows: int
    token: str


@dataclass(frozen=True)
class Reuse:
    """Rows [start, start + rows) of the previous dataset's ``folder`` (one split)."""

    folder: Path
    start: int
    rows: int
    cat_dtypes: tuple[np.dtype, ...]


def parquet_segments(parquet_dir: Path, files: dict[str, list[Path]]) -> dict[str, list[Segment]] | None:
    """The splits' days from ``segments.json`` (None: the parquet has no days, frequency ids).
    Its files must be exactly the split directories' files, in their order."""
    path = parquet_dir / SEGMENTS_JSON
    if not path.exists():
        return None
    data = read_json(path)
    try:
        listed = {
            split: [
                Segment(
                    int(s["day"]),
                    tuple(parquet_dir / split / f for f in s["files"]),
                    int(s["rows"]),
                    str(s["token"]),
                )
                for s in data["splits"][split]
            ]
            for split in SPLITS
        }
    except (TypeError, KeyError, ValueError) as exc:
        raise DatasetError(f"{path} is damaged ({type(exc).__name__}: {exc}); rerun spark_jobs") from None
    for split in SPLITS:
        names = [f.name for s in listed[split] for f in s.files]
        if names != [f.name for f in files[split]]:
            raise DatasetError(f"{path} lists other files than {parquet_dir / split} holds; rerun spark_jobs")
    return listed


def previous_segments(
    binary_dir: Path, table_sizes: list[int], multi: MultiHotSpec | None = None
) -> dict[tuple[str, str], Reuse]:
    """(split, token) → where that day's rows sit in the complete dataset at ``binary_dir``;
    empty when there is none, it has no segments, or a table shrank (its ids may not fit),
    or its multi-hot rows are not the ones ``multi`` gives: they are drawn from a stream that
    depends on every table's size, so a multi-hot day is reused only when nothing changed."""
    if not (binary_dir / SUCCESS).exists() or not (binary_dir / DATASET_JSON).exists():
        return {}
    try:
        verify_dataset(binary_dir, full=False)  # metadata and file sizes: a few stats
        info = read_info(binary_dir)
    except DatasetError as exc:
        log.warning("the previous dataset %s is not reused: %s", binary_dir, exc)
        return {}
    if (multi is not None or info.multi_hot_sizes != (1,) * NUM_CATEGORICAL) and spec_of_dataset(
        info
    ) != multi:
        return {}
    recorded = info.extra.get(SEGMENTS_KEY)
    if not isinstance(recorded, dict) or any(new < old for new, old in zip(table_sizes, info.table_sizes)):
        return {}
    dtypes = tuple(np.dtype(d).newbyteorder("<") for d in info.cat_dtypes)
    found = {}
    for split in SPLITS:
        start = 0
        for s in recorded.get(split, []):
            found[(split, s["token"])] = Reuse(binary_dir / split, start, int(s["rows"]), dtypes)
            start += int(s["rows"])
        if start != info.splits.get(split):
            return {}  # the list does not describe the files: reuse nothing
    return found


def copy_rows(outputs, reuse: Reuse) -> None:
    """Append the reused rows to a group of output files (one worker's share), widening ids
    whose table now needs a wider type; each file's checksum follows its bytes."""
    if reuse.rows == 0:
        return
    for output in outputs:
        name = output.name
        if name == LABEL_FILE:
            source = target = LABEL_DTYPE
            width = 1
        elif name == NUMERICAL_FILE:
            source = target = NUMERICAL_DTYPE
            width = NUM_NUMERICAL
        else:
            index = next(i for i in range(NUM_CATEGORICAL) if cat_file(i) == name)
            source, target = reuse.cat_dtypes[index], output.dtype
            width = 1 if output.table is None else output.table.shape[1]
        data = np.memmap(
            reuse.folder / name,
            dtype=source,
            mode="r",
            offset=reuse.start * width * source.itemsize,
            shape=(reuse.rows * width,),
        )
        for first in range(0, len(data), COPY_ROWS * width):
            piece = np.asarray(data[first : first + COPY_ROWS * width]).astype(target, copy=False)
            view = memoryview(np.ascontiguousarray(piece)).cast("B")
            output.handle.write(view)
            output.digest.update(view)
        del data


def recorded_segments(segments: dict[str, list[Segment]]) -> dict[str, list[dict]]:
    """What dataset.json keeps of the days: enough for the next conversion to find them."""
    return {
        split: [{"day": s.day, "rows": s.rows, "token": s.token} for s in segments[split]] for split in SPLITS
    }
