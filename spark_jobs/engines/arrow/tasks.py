"""The Arrow engine's Python tasks (run by ``mapInArrow`` inside Spark's Python workers).

Each task gets chunk numbers (``spark.range``, one per partition), reads its chunks itself
(``spark_jobs.engines.arrow.chunks``), parses whole blocks with numpy
(``spark_jobs.engines.arrow.fastparse``) and yields Arrow record batches:

- ``count_task``: per chunk, the statistics as a few coded rows and, for days being counted,
  each column's distinct values and their counts written to a partial file
  (``spark_jobs.engines.arrow.partial_files``; ``spark_jobs.engines.arrow.dictionaries`` merges
  them) with samples of the values as rows;
- ``reject_task``: the rejected lines with their position and reason;
- ``transform_task``: the output rows of the splits, ids looked up in the memory-mapped
  dictionary index (``spark_jobs.engines.arrow.dictionary_index``) or, with ``ids: modulo``,
  capped (``spark_jobs.capped_ids``), with the train order keys of ``spark_jobs.order``.

Statistics rows have ``column = STATS_COLUMN`` and ``value = chunk << CODE_BITS | code``; the codes
are below. Every statistic a task emits is a sum over its lines, so summing them gives the
day's totals whatever the chunking.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.schema import CAT_COLUMNS, NUM_CATEGORICAL, NUM_INTEGER
from spark_jobs.engines.arrow.chunks import Chunk, LineBlock, line_blocks
from spark_jobs.engines.arrow.dictionaries import KIND_STATS, sample_rows, write_partials
from spark_jobs.engines.arrow.fastparse import MISSING, REASON_CODES, parse_block
from spark_jobs.engines.arrow.input_copies import KEEP, READ, TAKE, ChunkCopy, CopySpec
from spark_jobs.engines.arrow.partial_files import SUFFIX as PARTIAL_SUFFIX
from spark_jobs.engines.arrow.value_counts import DAY_COUNT_DTYPE, Counts, count_values, merge_counts

STATS_COLUMN = -1
CODE_BITS = 8
LINES, PADDED, SLOW = 0, 6, 7  # 1..5: rejected, by reason code
MISSING_INT, MISSING_CAT = 16, 32  # + column index
STAT_CODES = 64

REJECT_SCHEMA = "day INT, pos LONG, reason STRING, line STRING, line_bytes LONG"


@dataclass(frozen=True)
class ReadSettings:
    block_bytes: int  # text parsed per numpy block
    count_flush_lines: int  # valid lines whose values are counted together
    # longer lines are rejected; the rejects keep this much of a line
    max_line_bytes: int = PreprocessConfig.max_line_bytes
    remote_read_bytes: int = PreprocessConfig.arrow_remote_read_mb << 20  # largest read behind a URL
    # the run's node-local copies of chunks read behind a URL (``input_copies``); None: none
    input_copies: CopySpec | None = None


def _chunk_ids(batches):
    for batch in batches:
        yield from batch.column(0).to_numpy()


def _blocks(chunks: list[Chunk], batches, settings: ReadSettings, copies: str | None = None):
    """(chunk number, chunk, its line blocks) for each chunk the task was given; ``copies``:
    what the task does with the node's copy of a chunk behind a URL (``input_copies``)."""
    for chunk_id in _chunk_ids(batches):
        chunk = chunks[int(chunk_id)]
        copy = ChunkCopy.of(settings.input_copies, chunk, copies, settings.block_bytes)
        yield (
            int(chunk_id),
            chunk,
            line_blocks(
                chunk, settings.block_bytes, settings.max_line_bytes, settings.remote_read_bytes, copy
            ),
        )


def _parse(block: LineBlock, settings: ReadSettings):
    return parse_block(block.data, block.starts, block.ends, settings.max_line_bytes, block.cut)


# ---------------------------------------------------------------- count pass


def _stat_rows(day: int, chunk: int, stats: np.ndarray):
    import pyarrow as pa

    codes = np.flatnonzero(stats)
    if stats[LINES] and LINES not in codes:
        codes = np.append(codes, LINES)
    n = len(codes)
    return pa.record_batch(
        {
            "kind": pa.array(np.full(n, KIND_STATS, np.int32)),
            "day": pa.array(np.full(n, day, np.int32)),
            "column": pa.array(np.full(n, STATS_COLUMN, np.int32)),
            "value": pa.array((np.int64(chunk) << CODE_BITS) | codes.astype(np.int64)),
            "count": pa.array(stats[codes].astype(np.int64)),
            "values": pa.nulls(n, pa.binary()),
            "counts": pa.nulls(n, pa.binary()),
        }
    )


class _ValueCounter:
    """A chunk's value counts per column. Raw values are counted every ``flush_lines`` valid
    lines (bounding memory); the partial counts are merged once at the end, so each distinct
    value of the chunk leaves the task once."""

    def __init__(self, flush_lines: int):
        self.flush_lines = flush_lines
        self.pending: list[np.ndarray] = []  # [26, lines] blocks, column-major
        self.pending_lines = 0
        self.partials: list[list[Counts]] = [[] for _ in range(NUM_CATEGORICAL)]

    def add(self, cats: np.ndarray) -> None:
        """cats [26, lines]: the valid lines' values, by column."""
        self.pending.append(cats)
        self.pending_lines += cats.shape[1]
        if self.pending_lines >= self.flush_lines:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        values = np.concatenate(self.pending, axis=1)
        self.pending, self.pending_lines = [], 0
        for j in range(NUM_CATEGORICAL):
            self.partials[j].append(count_values(values[j]))

    def write(self, path: str | None, day: int) -> list:
        """The chunk's partial counts written to ``path``, or (None) as rows for Spark's
        exchange (``count_exchange``); with its sample rows (``dictionaries.COUNT_SCHEMA``)."""
        self._flush()
        merged = {j: merge_counts(parts, DAY_COUNT_DTYPE) for j, parts in enumerate(self.partials)}
        merged = {j: c for j, c in merged.items() if len(c)}
        if not merged:
            return []
        if path is None:
            from spark_jobs.engines.arrow.count_exchange import partial_rows

            return [sample_rows(day, merged), partial_rows(day, merged)]
        return [write_partials(path, day, merged)]


def _add_stats(stats: np.ndarray, parsed) -> None:
    valid = parsed.valid
    stats[LINES] += len(parsed)
    stats[1 : len(REASON_CODES)] += np.bincount(parsed.reason, minlength=len(REASON_CODES))[1:]
    stats[PADDED] += int(np.count_nonzero(parsed.padded))
    stats[SLOW] += int(np.count_nonzero(parsed.slow))
    stats[MISSING_INT : MISSING_INT + NUM_INTEGER] += parsed.int_missing[valid].sum(axis=0)
    stats[MISSING_CAT : MISSING_CAT + NUM_CATEGORICAL] += (parsed.cats.T[:, valid] == MISSING).sum(axis=1)


def count_task(
    chunks: list[Chunk], count_days: frozenset[int], settings: ReadSettings, partials_dir: str | None
):
    """mapInArrow function: statistics of every chunk, value counts of ``count_days`` (to a
    partial file per chunk in ``partials_dir``, named by its number: a retry replaces it;
    None: as rows, ``count_exchange``)."""

    def run(batches):
        for number, chunk, blocks in _blocks(chunks, batches, settings, KEEP):
            stats = np.zeros(STAT_CODES, np.int64)
            counter = _ValueCounter(settings.count_flush_lines) if chunk.day in count_days else None
            for block in blocks:
                parsed = _parse(block, settings)
                _add_stats(stats, parsed)
                if counter is not None:
                    counter.add(parsed.cats.T[:, parsed.valid])
            if counter is not None:
                path = partials_dir and f"{partials_dir}/chunk-{number:07d}{PARTIAL_SUFFIX}"
                yield from counter.write(path, chunk.day)
            if stats[LINES]:
                yield _stat_rows(chunk.day, chunk.index, stats)

    return run


# ---------------------------------------------------------------- rejects


def _line_lengths(block: LineBlock) -> np.ndarray:
    """Each line's full length in bytes, without its '\\n' and a trailing '\\r'."""
    if block.cut is not None:
        return block.cut
    crlf = (block.ends > block.starts) & (block.data[np.maximum(block.ends - 1, 0)] == 13)
    return block.ends - block.starts - crlf


def _kept_text(block: LineBlock, i: int, length: int, keep: int) -> str:
    """What the rejects keep of line ``i``: its first ``keep`` bytes (a line can be any size,
    and a day file anything the pipeline can read), as text."""
    start = int(block.starts[i])
    return block.data[start : start + min(int(length), keep)].tobytes().decode("utf-8", "replace")


def reject_task(chunks: list[Chunk], settings: ReadSettings):
    """mapInArrow function: (day, pos, reason, line, line_bytes) of every rejected line: the
    line's first ``max_line_bytes`` bytes and its full length."""
    import pyarrow as pa

    def run(batches):
        for _, chunk, blocks in _blocks(chunks, batches, settings, READ):
            for block in blocks:
                parsed = _parse(block, settings)
                bad = np.flatnonzero(~parsed.valid)
                if not len(bad):
                    continue
                lengths = _line_lengths(block)[bad]
                yield pa.record_batch(
                    {
                        "day": pa.array(np.full(len(bad), chunk.day, np.int32)),
                        "pos": pa.array((np.int64(chunk.index) << 33) + block.first + bad),
                        "reason": pa.array([REASON_CODES[parsed.reason[i]] for i in bad], pa.string()),
                        "line": pa.array(
                            [_kept_text(block, i, n, settings.max_line_bytes) for i, n in zip(bad, lengths)],
                            pa.string(),
                        ),
                        "line_bytes": pa.array(lengths.astype(np.int64)),
                    }
                )

    return run


# ---------------------------------------------------------------- transform pass


@dataclass(frozen=True)
class TransformSpec:
    """What a transform task needs besides its chunks; small, pickled with the task."""

    index_dir: str | None  # the dictionary index (engines.arrow.dictionary_index); None: none
    run_token: str
    index_on_node: bool  # copy the index into the node's local dir first
    seed: int
    chunk_first_line: dict[tuple[int, int], int]  # (day, chunk) → its first line in the day
    eval_day: int
    test_lines: int  # test = lines [0, test_lines) of the eval day
    # every id modulo its column's cap (preprocess.caps); with no index, the hex value's
    # (spark_jobs.capped_ids)
    caps: tuple[int, ...] | None = None
    # how the index is read: the mode's rule for missing and absent values (IdMode)
    missing_value: int | None = None
    rare_id: int = 0


# The order keys and the packed row (``spark_jobs.engines.arrow.split_writer``).
TRANSFORM_SCHEMA = "_order LONG NOT NULL, _tie LONG NOT NULL, row BINARY NOT NULL"


def log_numericals(ints: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """log(x + 3) as float32 for x > -3; missing or x <= -3 → 0 (computed in float64, as Spark)."""
    use = ~missing & (ints > -3)
    out = np.zeros(ints.shape, np.float64)
    np.log(ints.astype(np.float64) + 3.0, out=out, where=use)
    return out.astype(np.float32)


def _order_keys(spec: TransformSpec, day: int, lines: np.ndarray):
    """(_order, _tie): the train order keys, or for the last day its line numbers (the split, test
    below test_lines, is derived from them in Spark: no per-row strings cross from Python)."""
    if day != spec.eval_day:
        from spark_jobs.order import train_keys

        return train_keys(spec.seed, day, lines)
    return lines, np.zeros(len(lines), np.int64)


@dataclass
class _Rows:
    """A block's valid rows, transformed: what the splits hold, before packing or writing."""

    lines: np.ndarray  # line numbers within the day
    label: np.ndarray
    numericals: np.ndarray  # float32 [lines, 13]
    ids: np.ndarray  # int32 [26, lines]


def _transformed(spec: TransformSpec, chunk: Chunk, block: LineBlock, parsed, index) -> _Rows:
    valid = np.flatnonzero(parsed.valid)
    cats = parsed.cats.T[:, valid]  # [26, lines], one contiguous row per column
    ids = np.empty(cats.shape, np.int32)
    index.lookup_into(cats, ids)
    return _Rows(
        lines=spec.chunk_first_line[(chunk.day, chunk.index)] + block.first + valid,
        label=parsed.label[valid],
        numericals=log_numericals(parsed.ints[valid], parsed.int_missing[valid]),
        ids=ids,
    )


def _output_batch(spec: TransformSpec, chunk: Chunk, rows: _Rows):
    import pyarrow as pa

    from spark_jobs.engines.arrow.split_writer import pack_rows

    key, tie = _order_keys(spec, chunk.day, rows.lines)
    return pa.record_batch(
        {
            "_order": pa.array(key),
            "_tie": pa.array(tie),
            "row": pack_rows(rows.label, rows.numericals, rows.ids.T),
        }
    )


def _ids_of(spec: TransformSpec):
    """What gives a task its ids (``lookup_into``): without dictionaries, each value and its
    cap; else the dictionary index, opened once per worker, itself when the mode reads it as
    it is, or through the mode's rule (``spark_jobs.contiguous_ids.ContiguousIds``)."""
    if spec.index_dir is None:
        from spark_jobs.capped_ids import CappedIds

        assert spec.caps is not None  # IdMode.caps_required where no dictionaries are written
        return CappedIds(spec.caps)
    from spark_jobs.engines.arrow.dictionary_index import node_local_root, worker_index

    local = node_local_root() if spec.index_on_node else None
    index = worker_index(spec.index_dir, CAT_COLUMNS, spec.run_token, local)
    if spec.missing_value is None and not spec.rare_id and spec.caps is None:
        return index
    from spark_jobs.contiguous_ids import ContiguousIds

    return ContiguousIds(index, spec.caps, spec.missing_value, spec.rare_id)


def _transformed_blocks(chunks: list[Chunk], spec: TransformSpec, settings: ReadSettings, batches):
    """(chunk number, chunk, transformed rows of one block) for each block of the task's chunks."""
    index = None
    for chunk_id, chunk, blocks in _blocks(chunks, batches, settings, TAKE):
        if index is None:
            index = _ids_of(spec)
        for block in blocks:
            parsed = _parse(block, settings)
            yield chunk_id, chunk, _transformed(spec, chunk, block, parsed, index)


def transform_task(chunks: list[Chunk], spec: TransformSpec, settings: ReadSettings):
    """mapInArrow function: the valid rows of each chunk, packed for the split writer."""

    def run(batches):
        for _, chunk, rows in _transformed_blocks(chunks, spec, settings, batches):
            yield _output_batch(spec, chunk, rows)

    return run


def eval_write_task(chunks: list[Chunk], spec: TransformSpec, settings: ReadSettings, write):
    """mapInArrow function for the last day when every column is looked up in the task: each
    chunk's rows go straight to its test and validation files (chunk k writes part k, so the
    files' order is the lines' order); yields the files written (``split_writer.RESULT_SCHEMA``).
    Nothing needs Spark between the parse and the file, so the rows do not cross to the JVM."""
    from spark_jobs.engines.arrow.split_writer import PartitionFiles, parquet_schema, split_table

    schema = parquet_schema()

    def run(batches):
        files: dict[int, PartitionFiles] = {}
        for part, _, rows in _transformed_blocks(chunks, spec, settings, batches):
            if part not in files:
                files[part] = PartitionFiles(write, part)
            table = split_table(rows.label, np.ascontiguousarray(rows.numericals.T), rows.ids, schema)
            files[part].add(table, rows.lines)
        for partition in files.values():
            results = partition.results()
            if results is not None:
                yield results

    return run
