"""The split directories both engines write: their schema, an empty part, the move into place,
the rows they hold, and how many train files there are.

Kept apart from either engine because the preprocess job settles the splits the same way
whichever engine wrote them (``spark_jobs.preprocess``), and the progress report plans the
transform's write tasks from ``train_files``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, LABEL

# pyarrow's names for the codecs the config accepts
_CODECS = {"uncompressed": "none", "none": "none"}


def parquet_schema():
    """The splits' schema: every field required, as Spark's writer has it."""
    import pyarrow as pa

    return pa.schema([pa.field(LABEL, pa.int32(), nullable=False),
                      *[pa.field(c, pa.float32(), nullable=False) for c in INT_COLUMNS],
                      *[pa.field(c, pa.int32(), nullable=False) for c in CAT_COLUMNS]])


def parquet_codec(compression: str) -> str:
    """pyarrow's name of a configured codec (Spark's "uncompressed" is pyarrow's "none")."""
    return _CODECS.get(compression.lower(), compression.lower())


def write_empty(path: Path, compression: str) -> None:
    """A parquet file with the splits' schema and no rows."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(parquet_schema().empty_table(), path, compression=parquet_codec(compression))


def move_split_dirs(staging: Path, targets: dict[str, Path]) -> list[str]:
    """``staging/<name>`` → ``targets[name]``; returns the names that had no rows."""
    empty = []
    for name, target in targets.items():
        shutil.rmtree(target, ignore_errors=True)
        source = staging / name
        if source.is_dir():
            source.replace(target)
        else:
            empty.append(name)
    shutil.rmtree(staging, ignore_errors=True)
    return empty


def rows_in_files(split_dir: Path) -> int:
    """Rows of a split directory, from its parquet footers."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(Path(split_dir).glob("part-*.parquet")))


def train_files(cfg: PreprocessConfig, train_rows: int) -> int:
    """How many train files: from the config and the row count only (the order depends on it)."""
    if cfg.output_files > 0:
        return cfg.output_files
    return max(1, -(-train_rows // max(1, cfg.train_rows_per_file)))
