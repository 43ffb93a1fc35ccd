"""The split binary dataset format (docs/architecture.md), named once for writer and readers.

``DIR/binary/<split>/label.bin`` (uint8), ``numerical.bin`` (float16, 13 per row, row-major),
``cat_<i>.bin`` (narrowest signed integer holding table i; k ids per row, row-major, for a
column of multi-hot size k), plus ``model_size.json``,
``dataset.json`` and ``_SUCCESS`` at the top. Everything that knows a file name, a dtype or a
key of ``dataset.json`` lives here, so convert, rethreshold, verify and the trainer agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.layout import DATASET_JSON
from dlrm_contracts.schema import CAT_COLUMNS, NUM_CATEGORICAL, NUM_INTEGER, SPLITS

FORMAT_VERSION = 1
LABEL_FILE = "label.bin"
NUMERICAL_FILE = "numerical.bin"
LABEL_DTYPE = np.dtype("<u1")
NUMERICAL_DTYPE = np.dtype("<f2")
NUM_NUMERICAL = NUM_INTEGER
MAX_TABLE_SIZE = 2**31  # ids must fit int32
# dataset.json maps each file ("train/label.bin") to the checksum of the bytes written into it,
# computed while writing; a derivation reuses a file only if it still has it (verify.py).
CHECKSUMS_KEY = "checksums"
CHECKSUM_PREFIX = "xxh3_128:"
CHECKSUM_CHUNK_BYTES = 8 * 2**20
# dataset.json's ids per row of each column, written only when some column has more than one
# (absent = all one-hot, so one-hot datasets stay byte for byte what they were).
MULTI_HOT_SIZES_KEY = "multi_hot_sizes"
MULTI_HOT_KEY = MULTI_HOT_SIZES_KEY  # the name the trainer's branch gave it
MULTI_HOT_SEED_KEY = "multi_hot_seed"
MULTI_HOT_DISTRIBUTION_KEY = "multi_hot_distribution"
MULTI_HOT_KEYS = (MULTI_HOT_SIZES_KEY, MULTI_HOT_SEED_KEY, MULTI_HOT_DISTRIBUTION_KEY)


class DatasetError(PipelineError, ValueError):
    """A binary dataset (or its source) that breaks the format; the message says where."""

    default_code = ExitCode.DATASET_INVALID


class DamagedDatasetError(DatasetError):
    """A dataset whose files are not what its writer wrote (missing, resized, another checksum,
    an unreadable description): rebuild it from its source, never derive from it.

    ``problems`` lists each finding on its own (file named), for one-line reports."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [message])

    def one_line(self, limit: int = 3) -> str:
        shown = "; ".join(self.problems[:limit])
        return shown + (f"; and {len(self.problems) - limit} more" if len(self.problems) > limit else "")


def new_checksum() -> xxhash.xxh3_128:
    """A streaming checksum of a file's bytes (xxh3-128: ~9 GB/s on one core)."""
    return xxhash.xxh3_128()


def checksum_text(digest: xxhash.xxh3_128) -> str:
    return CHECKSUM_PREFIX + str(digest.hexdigest())


def file_checksum(path: Path) -> str:
    """The checksum of a file as written, read in CHECKSUM_CHUNK_BYTES pieces."""
    digest = new_checksum()
    with open(path, "rb", buffering=0) as fh:
        buffer = bytearray(CHECKSUM_CHUNK_BYTES)
        view = memoryview(buffer)
        while True:
            n = fh.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
    return checksum_text(digest)


def file_key(split: str, name: str) -> str:
    """A file's name in ``checksums``: ``<split>/<file>``."""
    return f"{split}/{name}"


class UnreadableParquetError(DatasetError):
    """A parquet file (split, counts) that cannot be read: the stage that wrote it must run
    again."""


def unreadable_parquet(path: Path, exc: Exception) -> DatasetError:
    """pyarrow's own errors do not name the file; ours do."""
    return UnreadableParquetError(
        f"{path} is not a readable parquet file (corrupt or truncated?): {type(exc).__name__}: {exc}"
    )


def cat_file(index: int) -> str:
    """File of categorical column C<index+1>."""
    return f"cat_{index}.bin"


def all_files() -> list[str]:
    return [LABEL_FILE, NUMERICAL_FILE] + [cat_file(i) for i in range(NUM_CATEGORICAL)]


def cat_dtype(table_size: int) -> np.dtype:
    """Narrowest little-endian signed integer holding ids 0..table_size-1."""
    if table_size < 1:
        raise DatasetError(f"table size {table_size} is below 1 (id 0 always exists)")
    if table_size <= 2**7:
        return np.dtype("<i1")
    if table_size <= 2**15:
        return np.dtype("<i2")
    if table_size <= MAX_TABLE_SIZE:
        return np.dtype("<i4")
    raise DatasetError(f"table size {table_size} does not fit int32 ids")


def dtype_name(dtype: np.dtype[Any]) -> str:
    return str(np.dtype(dtype).name)  # 'int8', 'int16', 'int32', 'uint8', 'float16'


def row_width(name: str, info: "DatasetInfo") -> tuple[np.dtype, int]:
    """(dtype, values per row) of one file of the dataset."""
    if name == LABEL_FILE:
        return LABEL_DTYPE, 1
    if name == NUMERICAL_FILE:
        return NUMERICAL_DTYPE, NUM_NUMERICAL
    index = int(name[len("cat_") : -len(".bin")])
    return np.dtype(info.cat_dtypes[index]).newbyteorder("<"), multi_hot_sizes(info)[index]


def multi_hot_sizes(description: "DatasetInfo | dict[str, Any]") -> tuple[int, ...]:
    """Ids per row of each of the 26 columns (1 = one-hot), from a dataset's description
    (``DatasetInfo`` or the parsed ``dataset.json``); every reader of ``cat_<i>.bin`` asks here.

    Raises:
        DatasetError: the recorded value is not 26 integers >= 1.
    """
    data = description.extra if isinstance(description, DatasetInfo) else description
    sizes = data.get(MULTI_HOT_SIZES_KEY) if isinstance(data, dict) else None
    if sizes is None:
        return (1,) * NUM_CATEGORICAL
    if (
        not isinstance(sizes, list)
        or len(sizes) != NUM_CATEGORICAL
        or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in sizes)
    ):
        raise DatasetError(
            f"{DATASET_JSON}: '{MULTI_HOT_SIZES_KEY}' must list "
            f"{NUM_CATEGORICAL} integers >= 1, not {sizes!r}"
        )
    return tuple(sizes)


def multi_hot_extra(
    sizes: "tuple[int, ...] | list[int] | None", seed: int = 0, distribution: str = "uniform"
) -> dict[str, Any]:
    """What ``dataset.json`` records of a materialization (dlrm_contracts.multi_hot): the sizes
    and what the draws depend on besides the table sizes; nothing when all sizes are 1."""
    if sizes is None or all(int(k) == 1 for k in sizes):
        return {}
    return {
        MULTI_HOT_SIZES_KEY: [int(k) for k in sizes],
        MULTI_HOT_SEED_KEY: int(seed),
        MULTI_HOT_DISTRIBUTION_KEY: distribution,
    }


@dataclass(frozen=True)
class DatasetInfo:
    """What ``dataset.json`` says about a dataset, plus where it is."""

    path: Path
    splits: dict[str, int]
    table_sizes: tuple[int, ...]
    cat_dtypes: tuple[str, ...]
    threshold_spec: str | None
    source_fingerprint: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def checksums(self) -> dict[str, str]:
        """``<split>/<file>`` -> checksum recorded when written (empty for older datasets)."""
        recorded = self.extra.get(CHECKSUMS_KEY)
        return dict(recorded) if isinstance(recorded, dict) else {}

    @property
    def multi_hot_sizes(self) -> tuple[int, ...]:
        """Ids per row of each column (1 = one-hot); see :func:`multi_hot_sizes`."""
        return multi_hot_sizes(self)

    @property
    def model_size(self) -> dict[str, int]:
        return dict(zip(CAT_COLUMNS, self.table_sizes))

    def file(self, split: str, name: str) -> Path:
        return self.path / split / name

    def nbytes(self, split: str) -> int:
        return sum(
            self.splits[split] * dt.itemsize * width
            for dt, width in (row_width(n, self) for n in all_files())
        )

    def to_json(self) -> dict[str, Any]:
        data = {
            "format_version": FORMAT_VERSION,
            "splits": {s: int(self.splits[s]) for s in SPLITS},
            "table_sizes": [int(t) for t in self.table_sizes],
            "cat_dtypes": list(self.cat_dtypes),
            "label_dtype": dtype_name(LABEL_DTYPE),
            "numerical_dtype": dtype_name(NUMERICAL_DTYPE),
            "num_numerical": NUM_NUMERICAL,
            "threshold_spec": self.threshold_spec,
            "source_fingerprint": self.source_fingerprint,
        }
        data.update(self.extra)
        return data


def describe(
    path: Path,
    splits: dict[str, int],
    table_sizes: list[int],
    threshold_spec: str | None,
    source_fingerprint: str,
    extra: dict[str, Any] | None = None,
) -> DatasetInfo:
    """Build the description of a dataset; dtypes follow from the table sizes."""
    return DatasetInfo(
        Path(path),
        dict(splits),
        tuple(int(t) for t in table_sizes),
        tuple(dtype_name(cat_dtype(t)) for t in table_sizes),
        threshold_spec,
        source_fingerprint,
        dict(extra or {}),
    )


def write_json(path: Path, data: dict[str, Any]) -> None:
    """One top-level key per line (lists stay on one line): readable and diff-friendly."""
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in data.items()]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetError(f"{path} is missing") from None
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path} is not valid JSON: {exc}") from None


def model_size_list(model_size: Any, where: Path) -> list[int]:
    """Table sizes C1..C26 from a ``model_size.json`` mapping, with a clear error if off."""
    if not isinstance(model_size, dict):
        raise DatasetError(f"{where}: expected a mapping C1..C26 -> table size")
    missing = [c for c in CAT_COLUMNS if c not in model_size]
    unknown = sorted(set(model_size) - set(CAT_COLUMNS))
    if missing or unknown:
        raise DatasetError(f"{where}: missing columns {missing} / unknown keys {unknown}")
    sizes = []
    for column in CAT_COLUMNS:
        value = model_size[column]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DatasetError(f"{where}: {column} has table size {value!r}; expected an int >= 1")
        sizes.append(value)
    return sizes


def read_info(path: str | Path) -> DatasetInfo:
    """Parse ``dataset.json`` (no checks against the files; see dlrm_contracts.verify)."""
    path = Path(path)
    data = read_json(path / DATASET_JSON)
    known = {
        "format_version",
        "splits",
        "table_sizes",
        "cat_dtypes",
        "label_dtype",
        "numerical_dtype",
        "num_numerical",
        "threshold_spec",
        "source_fingerprint",
    }
    missing = sorted(known - set(data)) if isinstance(data, dict) else sorted(known)
    if missing:
        raise DatasetError(f"{path / DATASET_JSON}: missing keys {missing}")
    splits = data["splits"]
    if not isinstance(splits, dict) or sorted(splits) != sorted(SPLITS):
        raise DatasetError(f"{path / DATASET_JSON}: 'splits' must map {list(SPLITS)} to row counts")
    for key in ("table_sizes", "cat_dtypes"):
        if not isinstance(data[key], list):
            raise DatasetError(f"{path / DATASET_JSON}: '{key}' must be a list of {NUM_CATEGORICAL} entries")
    return DatasetInfo(
        path,
        {s: splits[s] for s in SPLITS},
        tuple(data["table_sizes"]),
        tuple(data["cat_dtypes"]),
        data["threshold_spec"],
        data["source_fingerprint"],
        {k: v for k, v in data.items() if k not in known},
    )
