"""The split directories both engines write: their schema, an empty part, the move into place,
the rows they hold, and how many train files there are.

Kept apart from either engine because the preprocess job settles the splits the same way
whichever engine wrote them (``spark_jobs.preprocess``), and the progress report plans the
transform's write tasks from ``train_files``.
"""

from __future__ import annotations

import posixpath
import shutil
from pathlib import Path

from dlrm_contracts import object_commit, storage, workdir_io
from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, LABEL
from dlrm_contracts.storage import Location

# pyarrow's names for the codecs the config accepts
_CODECS = {"uncompressed": "none", "none": "none"}


def parquet_schema():
    """The splits' schema: every field required, as Spark's writer has it."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(LABEL, pa.int32(), nullable=False),
            *[pa.field(c, pa.float32(), nullable=False) for c in INT_COLUMNS],
            *[pa.field(c, pa.int32(), nullable=False) for c in CAT_COLUMNS],
        ]
    )


def parquet_codec(compression: str) -> str:
    """pyarrow's name of a configured codec (Spark's "uncompressed" is pyarrow's "none")."""
    return _CODECS.get(compression.lower(), compression.lower())


def write_empty(path: Path | Location, compression: str) -> None:
    """A parquet file with the splits' schema and no rows (at a URL: one object, the same
    bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if workdir_io.is_remote(path):
        sink = pa.BufferOutputStream()
        pq.write_table(parquet_schema().empty_table(), sink, compression=parquet_codec(compression))
        path.write_bytes(sink.getvalue().to_pybytes())
        return
    local = workdir_io.local_path(path)
    local.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(parquet_schema().empty_table(), local, compression=parquet_codec(compression))


def split_staging(parquet_dir: Path | Location) -> Path | Location:
    """Where the engine writes the splits (``<staging>/<split>/part-*.parquet``, through
    :func:`split_dir`) before :func:`settle_split_dirs` puts them in place. Locally a directory
    beside them, renamed into place. At a URL a fresh version name ``parquet/.v-<...>``: each
    split's files go straight under ``parquet/<split>/.v-<...>/``, the prefix its commit
    marker then publishes, so no object is copied."""
    if workdir_io.is_remote(parquet_dir):
        return parquet_dir / workdir_io.new_version_name()
    return parquet_dir / ".splits-staging"


def split_dir(staging: str, split: str) -> str:
    """The directory (or prefix) a split's files are written into for ``staging`` (a path or
    URL): ``staging/<split>``, or for a version staging at a URL (:func:`split_staging`) that
    version under the split's own directory."""
    name = posixpath.basename(staging.rstrip("/"))
    if storage.is_url(staging) and name.startswith(object_commit.VERSION_PREFIX):
        return posixpath.join(posixpath.dirname(staging.rstrip("/")), split, name)
    return posixpath.join(staging, split) if storage.is_url(staging) else str(Path(staging, split))


def settle_split_dirs(
    staging: Path | Location, targets: dict[str, Path | Location], compression: str
) -> None:
    """The engine's splits put where readers take them, a split without rows getting one
    empty part: locally renamed into place (:func:`move_split_dirs`), at a URL published by
    their markers (:func:`publish_split_dirs`)."""
    if workdir_io.is_remote(staging):
        publish_split_dirs(staging, targets, compression)  # type: ignore[arg-type]
        return
    for name in move_split_dirs(workdir_io.local_path(staging), targets):  # type: ignore[arg-type]
        write_empty(targets[name] / "part-00000.parquet", compression)


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


def publish_split_dirs(staging: Location, targets: dict[str, Location], compression: str) -> list[str]:
    """At a URL: each split's version, written by the engine under ``targets[name]`` for the
    version ``staging`` names (:func:`split_staging`), published by its commit marker (a split
    the engine wrote no file for gets one empty part); returns the names that had no rows.
    Nothing is copied: the marker written last is the publication. A kill before a split's
    marker leaves that split's previous publication (or none) for readers, and its unnamed
    version is deleted by the next publication; ``_SUCCESS``, removed at the run's start, is
    what says the set is complete."""
    empty = []
    for name, target in targets.items():
        version = target / staging.name
        if not version.files():
            write_empty(version / "part-00000.parquet", compression)
            empty.append(name)
        workdir_io.commit_version(target, version)
    return empty


def split_files(split_dir: Path | Location) -> list[Path | Location]:
    """The parquet parts of a split directory, in order (at a URL: those its marker names)."""
    return workdir_io.published_files(split_dir, "part-*.parquet")


def rows_in_files(split_dir: Path | Location) -> int:
    """Rows of a split directory, from its parquet footers."""
    import pyarrow.parquet as pq

    if workdir_io.is_remote(split_dir):
        total = 0
        for part in split_files(split_dir):
            assert isinstance(part, Location)  # a marker names objects of the store
            with part.open_input() as handle:
                total += pq.ParquetFile(handle).metadata.num_rows
        return total
    local = workdir_io.local_path(split_dir)
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(local.glob("part-*.parquet")))


def train_files(cfg: PreprocessConfig, train_rows: int) -> int:
    """How many train files: from the config and the row count only (the order depends on it)."""
    if cfg.output_files > 0:
        return cfg.output_files
    return max(1, -(-train_rows // max(1, cfg.train_rows_per_file)))
