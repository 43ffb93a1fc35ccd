"""Parquet from spark_jobs → the split binary dataset, in one streaming pass.

Each split's parquet files are read in name order, row groups in order, as record batches of
``ConvertConfig.batch_rows`` rows, so row order is preserved exactly and memory stays at a few
batches whatever the dataset size. While the main thread decodes the next batch (pyarrow,
multi-threaded, GIL released), a thread pool narrows the current one column by column and
appends it to the 28 output files (numpy casts and file writes release the GIL too): both
cores work, and every byte is written once. Every id is checked against its table size before
it is narrowed, so a bad id is an error, never a silently wrapped value. The output is atomic
(see dlrm_contracts.atomic).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from converters.mlperf_multihot import FORMAT as MLPERF_MULTIHOT, write_mlperf_multihot
from converters.segments import (
    SEGMENTS_KEY,
    Reuse,
    copy_rows,
    parquet_segments,
    previous_segments,
    recorded_segments,
)
from converters.torchrec_format import TORCHREC_DIR, TorchrecWriter
from dlrm_contracts.atomic import atomic_directory, is_complete, refuse_overlap
from dlrm_contracts.binary_format import (
    CHECKSUMS_KEY,
    LABEL_DTYPE,
    LABEL_FILE,
    NUM_NUMERICAL,
    NUMERICAL_DTYPE,
    NUMERICAL_FILE,
    DatasetError,
    DatasetInfo,
    cat_dtype,
    cat_file,
    checksum_text,
    describe,
    file_key,
    model_size_list,
    multi_hot_extra,
    new_checksum,
    read_json,
    unreadable_parquet,
    write_json,
)
from dlrm_contracts.config import ConvertConfig
from dlrm_contracts.dataset_identity import (
    DICTIONARIES_FINGERPRINT_KEY,
    dictionaries_fingerprint,
    parquet_footer,
)
from dlrm_contracts.multi_hot import MultiHotSpec, check_sizes, iter_tables, materialize, spec_of_dataset
from dlrm_contracts.id_modes import IdMode, recorded_or_default
from dlrm_contracts.layout import DATASET_JSON, MODEL_SIZE_JSON, PREPROCESS_JSON, SUCCESS, dictionaries_under
from dlrm_contracts.progress import counting
from dlrm_contracts.schema import ALL_COLUMNS, CAT_COLUMNS, INT_COLUMNS, SPLITS
from dlrm_contracts.thresholds import parse_threshold_spec
from dlrm_contracts.verify import verify_dataset

log = logging.getLogger(__name__)

TORCHREC = "torchrec"  # the convert.formats name of converters.torchrec_format's layout


def parquet_files(split_dir: Path) -> list[Path]:
    """Data files of one split in row order: ``*.parquet`` sorted by name (no hidden/_ files)."""
    if not split_dir.is_dir():
        raise DatasetError(f"{split_dir} is missing: the parquet has no such split")
    return sorted(
        (p for p in split_dir.iterdir() if p.is_file() and p.suffix == ".parquet" and p.name[0] not in "._"),
        key=lambda p: p.name,
    )


def _num_rows(path: Path) -> int:
    try:
        return pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError) as exc:
        raise unreadable_parquet(path, exc) from exc


def source_fingerprint(parquet_dir: Path, files: dict[str, list[Path]]) -> str:
    """Hash of preprocess.json plus each file's name, size and footer: changes with the data,
    not with a copy or a touch, and costs a few reads per file."""
    digest = xxhash.xxh3_128()
    preprocess = parquet_dir / PREPROCESS_JSON
    digest.update(preprocess.read_bytes() if preprocess.exists() else b"")
    for split in SPLITS:
        for path in files[split]:
            digest.update(f"{split}/{path.name}:{path.stat().st_size}\n".encode())
            digest.update(parquet_footer(path))
    return "xxh3_128:" + digest.hexdigest()


def _check_schema(path: Path, schema: pa.Schema) -> None:
    missing = [c for c in ALL_COLUMNS if c not in schema.names]
    if missing:
        raise DatasetError(f"{path}: missing columns {missing}")
    for name in ALL_COLUMNS:
        kind = schema.field(name).type
        ok = pa.types.is_floating(kind) if name in INT_COLUMNS else pa.types.is_integer(kind)
        if not ok:
            raise DatasetError(
                f"{path}: column {name} has type {kind}; "
                f"expected {'float' if name in INT_COLUMNS else 'integer'}"
            )


def _values(batch: pa.RecordBatch, index: int, where: str) -> np.ndarray:
    column = batch.column(index)
    if column.null_count:
        raise DatasetError(
            f"{where}: column {batch.schema.names[index]} has "
            f"{column.null_count} null(s); spark_jobs writes 0 for missing"
        )
    return column.to_numpy(zero_copy_only=False)


@dataclass
class _Output:
    """One output file, how a batch becomes its bytes, and the checksum of what was written."""

    name: str
    handle: BinaryIO
    digest: Any = field(default_factory=new_checksum)
    cost = 1  # relative work per row, for balancing the thread pool

    def encode(self, batch: pa.RecordBatch, where: str) -> np.ndarray:
        raise NotImplementedError


class _LabelOutput(_Output):
    def encode(self, batch, where):
        labels = _values(batch, 0, where)
        if labels.size and (labels.min() < 0 or labels.max() > 1):
            raise DatasetError(f"{where}: label outside {{0, 1}} (min {labels.min()}, max {labels.max()})")
        return labels.astype(LABEL_DTYPE)


class _NumericalOutput(_Output):
    cost = NUM_NUMERICAL

    def encode(self, batch, where):
        out = np.empty((batch.num_rows, NUM_NUMERICAL), dtype=NUMERICAL_DTYPE)
        with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
            for j in range(NUM_NUMERICAL):
                out[:, j] = _values(batch, 1 + j, where)
        finite = np.isfinite(out)
        if not finite.all():
            row, j = (int(x) for x in np.argwhere(~finite)[0])
            value = float(_values(batch, 1 + j, where)[row])
            raise DatasetError(
                f"{where}: column {INT_COLUMNS[j]} holds {value!r}, a numerical "
                "value NaN/inf or beyond float16 range"
            )
        return out


@dataclass
class _CatOutput(_Output):
    index: int = 0
    table_size: int = 1
    # The column's multi-hot lookup table (dlrm_contracts.multi_hot), already in the file's
    # dtype; None for a one-hot column.
    table: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.cost = 1 if self.table is None else self.table.shape[1]

    @property
    def dtype(self) -> np.dtype:
        return cat_dtype(self.table_size)

    def encode(self, batch, where):
        ids = _values(batch, 1 + NUM_NUMERICAL + self.index, where)
        if ids.size and (ids.min() < 0 or ids.max() >= self.table_size):
            raise DatasetError(
                f"{where}: column {CAT_COLUMNS[self.index]} has id "
                f"{ids.min() if ids.min() < 0 else ids.max()} outside its "
                f"table of size {self.table_size}"
            )
        if self.table is not None:  # rows x k ids, row-major, straight in the file's dtype
            return materialize(ids, self.table)
        return ids.astype(cat_dtype(self.table_size), copy=False)


def write_batch_columns(outputs: list[_Output], batch: pa.RecordBatch, where: str) -> None:
    """Append one record batch to a group of output files (one worker's share of a batch);
    each file's checksum follows its bytes (the same thread, in batch order)."""
    for output in outputs:
        data = memoryview(output.encode(batch, where)).cast("B")
        output.handle.write(data)
        output.digest.update(data)


def _balanced_groups(outputs: list[_Output], workers: int) -> list[list[_Output]]:
    """Split the outputs into ``workers`` groups of similar cost (numerical = 13 columns)."""
    groups: list[list[_Output]] = [[] for _ in range(workers)]
    cost = [0] * workers
    for output in sorted(outputs, key=lambda o: -o.cost):
        k = cost.index(min(cost))
        groups[k].append(output)
        cost[k] += output.cost
    return [g for g in groups if g]


def _batches(files: list[Path], batch_rows: int, use_threads: bool) -> Iterator[tuple[pa.RecordBatch, str]]:
    for path in files:
        try:
            reader = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise unreadable_parquet(path, exc) from exc
        with reader:
            _check_schema(path, reader.schema_arrow)
            batches = reader.iter_batches(
                batch_size=batch_rows, columns=list(ALL_COLUMNS), use_threads=use_threads
            )
            while True:
                try:  # decoding errors (corrupt pages) name the file, like every other error
                    batch = next(batches)
                except StopIteration:
                    break
                except (pa.ArrowException, OSError) as exc:
                    raise unreadable_parquet(path, exc) from exc
                yield batch, str(path)


@dataclass(frozen=True)
class _SplitWriting:
    """What every split of one conversion is written with: the table sizes, the settings,
    the multi-hot tables (``multi_hot_tables``), the TorchRec layout's writer (None: not
    written), and the checksums each written file is added to."""

    table_sizes: list[int]
    config: ConvertConfig
    tables: dict[int, np.ndarray]
    checksums: dict[str, str]
    torchrec: TorchrecWriter | None = None


def _convert_split(
    pieces: list[tuple[list[Path], Reuse | None]],
    out_dir: Path,
    writing: _SplitWriting,
    pool: ThreadPoolExecutor,
    bar: Any,
) -> int:
    """Write one split's files from its pieces in order (parquet files to convert, or rows of
    the previous dataset to copy); their checksums go into ``writing.checksums``; each batch
    also goes to the TorchRec layout when one is written. Returns the rows."""
    config, tables, torchrec = writing.config, writing.tables, writing.torchrec
    out_dir.mkdir()
    handles = [
        open(out_dir / name, "wb")
        for name in [LABEL_FILE, NUMERICAL_FILE] + [cat_file(i) for i in range(len(CAT_COLUMNS))]
    ]
    pending: list[Future] = []
    try:
        outputs: list[_Output] = [
            _LabelOutput(LABEL_FILE, handles[0]),
            _NumericalOutput(NUMERICAL_FILE, handles[1]),
        ]
        outputs += [
            _CatOutput(cat_file(i), handles[2 + i], index=i, table_size=size, table=tables.get(i))
            for i, size in enumerate(writing.table_sizes)
        ]
        groups = _balanced_groups(outputs, max(1, config.workers))
        rows = 0
        for files, reuse in pieces:
            if reuse is not None:
                for future in pending:
                    future.result()
                pending = [pool.submit(copy_rows, g, reuse) for g in groups]
                rows += reuse.rows
                continue
            for batch, where in _batches(files, config.batch_rows, use_threads=config.workers > 1):
                for future in pending:  # files are appended in batch order
                    future.result()
                pending = [pool.submit(write_batch_columns, g, batch, where) for g in groups]
                if torchrec is not None:
                    pending.append(pool.submit(torchrec.write, out_dir.name, batch, where))
                rows += batch.num_rows
                bar.update(batch.num_rows)
        for future in pending:
            future.result()
        writing.checksums.update({file_key(out_dir.name, o.name): checksum_text(o.digest) for o in outputs})
        return rows
    finally:
        for future in pending:  # on an error, let running writes end before closing files
            future.exception()
        for handle in handles:
            handle.close()


def _threshold_spec(parquet_dir: Path, given: str | None) -> str | None:
    if given is not None:
        return str(parse_threshold_spec(given))
    preprocess = parquet_dir / PREPROCESS_JSON
    if preprocess.exists():
        data = read_json(preprocess)
        if not isinstance(data, dict):
            raise DatasetError(f"{preprocess}: expected a JSON object with 'threshold_spec'")
        spec = data.get("threshold_spec")
        return None if spec is None else str(parse_threshold_spec(spec))
    return None


def _pieces(
    parquet_dir: Path,
    binary_dir: Path | None,
    files: dict[str, list[Path]],
    table_sizes: list[int],
    multi: MultiHotSpec | None,
):
    """Per split, what to write in order: (parquet files, None) to convert, or (files, Reuse)
    to copy from the previous dataset (a day converted before, converters.segments); and the
    parquet's segments (None without days)."""
    segments = parquet_segments(parquet_dir, files)
    if segments is None:
        return {split: [(files[split], None)] for split in SPLITS}, None
    previous = previous_segments(binary_dir, table_sizes, multi) if binary_dir is not None else {}
    pieces = {}
    for split in SPLITS:
        pieces[split] = []
        for segment in segments[split]:
            reuse = previous.get((split, segment.token))
            if reuse is not None and reuse.rows != segment.rows:
                reuse = None
            pieces[split].append((list(segment.files), reuse))
    return pieces, segments


def _ids_mode(parquet_dir: Path) -> IdMode:
    """How preprocess gave the ids (its preprocess.json), recorded in dataset.json unless the
    default: rethreshold and the trainer ask it which thresholds the dataset may be read at,
    the export how a raw value becomes its id."""
    preprocess = parquet_dir / PREPROCESS_JSON
    return recorded_or_default(read_json(preprocess) if preprocess.exists() else {})


def convert_parquet(
    parquet_dir: str | Path,
    binary_dir: str | Path,
    config: ConvertConfig | None = None,
    threshold_spec: str | None = None,
    reuse: bool = True,
    source: str | None = None,
) -> dict[str, Any]:
    """Convert the parquet splits of spark_jobs into the split binary dataset the trainer reads.

    The dataset is written into a temporary directory, verified, then renamed into place: a
    reader of ``binary_dir`` never sees a half-written dataset.

    Args:
        parquet_dir: spark_jobs' output; refused unless its ``_SUCCESS`` marker is there.
        binary_dir: where the dataset goes (must not overlap ``parquet_dir``).
        config: workers, fsync, overwrite, full verification; defaults to ``ConvertConfig()``.
        threshold_spec: the spec to record in ``dataset.json``; None = the one in
            ``preprocess.json``. ``rethreshold`` needs it to know which values were kept.
        reuse: copy the days converted before from the dataset at ``binary_dir`` (stable
            ids, ``converters.segments``); False when that dataset is known to be damaged.
        source: where the parquet was published, recorded in ``dataset.json`` when
            ``parquet_dir`` is a local copy of it (a workdir URL); None = ``parquet_dir``.

    Returns:
        A summary: rows per split, table sizes, id dtypes, threshold spec, source fingerprint,
        bytes written, seconds, rows/s.

    Raises:
        DatasetError: incomplete or inconsistent parquet, a value the format cannot hold, or a
            complete ``binary_dir`` without ``config.overwrite``.
    """
    config = config or ConvertConfig()
    parquet_dir, binary_dir = Path(parquet_dir), Path(binary_dir)
    refuse_overlap(binary_dir, {"parquet": parquet_dir})
    table_sizes = _complete_table_sizes(parquet_dir)
    spec = _threshold_spec(parquet_dir, threshold_spec)
    files = {split: parquet_files(parquet_dir / split) for split in SPLITS}
    expected = {split: sum(_num_rows(p) for p in files[split]) for split in SPLITS}
    fingerprint = source_fingerprint(parquet_dir, files)
    # The TorchRec layout is written from parquet batches: no day is copied from before.
    reuse = reuse and TORCHREC not in config.formats
    multi = multi_hot_spec(config, table_sizes)
    pieces, segments = _pieces(parquet_dir, binary_dir if reuse else None, files, table_sizes, multi)
    start = time.perf_counter()
    checksums: dict[str, str] = {}
    with atomic_directory(binary_dir, overwrite=config.overwrite, fsync=config.fsync) as tmp:
        tables = multi_hot_tables(multi)
        torchrec = (
            TorchrecWriter(tmp / TORCHREC_DIR, expected, table_sizes) if TORCHREC in config.formats else None
        )
        try:
            writing = _SplitWriting(table_sizes, config, tables, checksums, torchrec and torchrec.open())
            rows = _convert_splits(pieces, expected, tmp, writing)
            del writing  # the multi-hot tables go with ``tables`` below
            torchrec_description = torchrec and torchrec.finish()
        finally:
            if torchrec is not None:
                torchrec.close()
        del tables
        info = describe(
            tmp,
            rows,
            table_sizes,
            spec,
            fingerprint,
            _dataset_extra(parquet_dir, segments, checksums, multi, source),
        )
        write_json(tmp / MODEL_SIZE_JSON, info.model_size)
        write_json(tmp / DATASET_JSON, info.to_json())
        verify_dataset(tmp, full=config.verify_full, require_success=False)
    seconds = time.perf_counter() - start
    log.info("converted %d rows in %.2f s into %s", sum(rows.values()), seconds, binary_dir)
    summary = _summary(binary_dir, info, spec, fingerprint, pieces, segments, seconds)
    if torchrec_description:
        summary[TORCHREC] = {
            "path": str(binary_dir / TORCHREC_DIR),
            "rows_per_day": torchrec_description["rows_per_day"],
        }
    return {**summary, **write_other_formats(binary_dir, config)}


def write_other_formats(binary_dir: Path, config: ConvertConfig) -> dict[str, Any]:
    """The datasets besides ours that ``convert.formats`` asks for, each written from the
    finished binary dataset into its own directory beside it; their summaries by format."""
    written = {}
    if MLPERF_MULTIHOT in config.formats:
        written[MLPERF_MULTIHOT] = write_mlperf_multihot(binary_dir, config=config)
    return written


def multi_hot_spec(config: ConvertConfig, table_sizes: list[int]) -> MultiHotSpec | None:
    """The materialization ``convert.multi_hot_sizes`` asks for over these tables; None when
    every column stays one-hot (the dataset is then byte for byte a one-hot one)."""
    sizes = check_sizes(config.multi_hot_sizes, "convert.multi_hot_sizes")
    if all(k == 1 for k in sizes):
        return None
    return MultiHotSpec(tuple(table_sizes), sizes, config.multi_hot_seed, config.multi_hot_distribution)


def same_materialization(info: DatasetInfo, config: ConvertConfig) -> bool:
    """Whether a dataset's multi-hot rows are the ones ``config`` asks for (sizes, seed,
    distribution); a dataset derived from it (rethreshold) keeps its materialization."""
    return spec_of_dataset(info) == multi_hot_spec(config, list(info.table_sizes))


def multi_hot_tables(multi: MultiHotSpec | None) -> dict[int, np.ndarray]:
    """Every multi-hot column's lookup table, in the dtype of its ids file (ids < the table
    size, so the narrowing is exact): a row of output is then one gather, no cast. They take
    sum(table size x k) ids in memory, the reference's own cost (docs/converters.md)."""
    if multi is None:
        return {}
    log.info(
        "building multi-hot lookup tables (%.1f MB)",
        sum(multi.table_bytes(c) for c in range(len(multi.sizes))) / 1e6,
    )
    return dict(
        iter_tables(multi, allocate=lambda c, shape, _dtype: np.empty(shape, cat_dtype(multi.table_sizes[c])))
    )


def _complete_table_sizes(parquet_dir: Path) -> list[int]:
    """The table sizes of a complete parquet output, each one the format can hold."""
    if not is_complete(parquet_dir):
        raise DatasetError(f"{parquet_dir} has no {SUCCESS}: the parquet is incomplete (rerun spark_jobs)")
    table_sizes = model_size_list(read_json(parquet_dir / MODEL_SIZE_JSON), parquet_dir / MODEL_SIZE_JSON)
    for size in table_sizes:
        cat_dtype(size)  # refuses tables that do not fit int32
    return table_sizes


def _convert_splits(
    pieces: dict[str, list[tuple[list[Path], Reuse | None]]],
    expected: dict[str, int],
    tmp: Path,
    writing: _SplitWriting,
) -> dict[str, int]:
    """Every split into ``tmp``, each checked against the rows its parquet metadata gives.
    Progress counts the rows converted only: a day's rows copied from the previous dataset
    (stable ids) cost a fraction of converting them, and counting them would make a daily
    run's bar jump and its ETA too short."""
    config = writing.config
    rows: dict[str, int] = {}
    copied = sum(reuse.rows for split in pieces.values() for _, reuse in split if reuse)
    with (
        ThreadPoolExecutor(max(1, config.workers), thread_name_prefix="convert") as pool,
        counting(
            "convert", sum(expected.values()) - copied, "rows", phase="convert", enabled=config.progress
        ) as bar,
    ):
        for split in SPLITS:
            rows[split] = _convert_split(pieces[split], tmp / split, writing, pool, bar)
            if rows[split] != expected[split]:
                raise DatasetError(
                    f"{split}: read {rows[split]} rows, parquet metadata says {expected[split]}"
                )
    return rows


def _dataset_extra(
    parquet_dir: Path,
    segments,
    checksums: dict[str, str],
    multi: MultiHotSpec | None,
    source: str | None = None,
) -> dict[str, Any]:
    """What dataset.json records beyond the format: the source, the dictionaries it must be
    served with, stable ids and their day segments, the multi-hot sizes and what their draws
    depend on, and every file's checksum."""
    mode = _ids_mode(parquet_dir)
    dictionaries = dictionaries_under(Path(parquet_dir), mode)
    return {
        "source": {"kind": "parquet", "path": source or str(parquet_dir.absolute())},
        # what a model trained on it must be served with (trainer.export)
        DICTIONARIES_FINGERPRINT_KEY: None
        if dictionaries is None
        else dictionaries_fingerprint(dictionaries),
        **({"ids": mode.name} if not mode.default else {}),
        **({SEGMENTS_KEY: recorded_segments(segments)} if segments else {}),
        **(multi_hot_extra(multi.sizes, multi.seed, multi.distribution) if multi else {}),
        CHECKSUMS_KEY: dict(sorted(checksums.items())),
    }


def _summary(
    binary_dir: Path,
    info: DatasetInfo,
    spec: str | None,
    fingerprint: str,
    pieces: dict[str, list[tuple[list[Path], Reuse | None]]],
    segments,
    seconds: float,
) -> dict[str, Any]:
    total_rows = sum(info.splits.values())
    return {
        "output": str(binary_dir),
        "rows": dict(info.splits),
        "table_sizes": info.model_size,
        "cat_dtypes": list(info.cat_dtypes),
        "threshold_spec": spec,
        "source_fingerprint": fingerprint,
        "bytes_written": sum(info.nbytes(s) for s in SPLITS),
        "seconds": round(seconds, 3),
        # stable ids: the days whose rows were copied from the previous dataset
        "days_reused": {
            split: [s.day for (_, r), s in zip(pieces[split], segments[split]) if r is not None]
            for split in SPLITS
        }
        if segments
        else {},
        "rows_per_second": round(total_rows / seconds) if seconds else None,
    }
