"""How lines should reach the Arrow engine's Python tasks: two designs measured side by side.

(a) ``spark.read.text`` (the JVM reads and splits the lines) → ``mapInArrow``: every line is
    copied into an Arrow batch by the JVM and sent to the Python worker over its socket;
(b) ``spark.range(chunks)`` → ``mapInArrow``: the task reads its byte range of the day file
    itself (``spark_jobs.engines.arrow.chunks``) and finds the line ends with numpy.

Both only count lines (no parse), so the figure is the floor of getting the text to Python.
Also printed: the full Arrow count task (read + parse + value counts) for (b). Usage:

    .venv/bin/python bench/bench_arrow_read.py                  # the 8M-row benchmark input
    .venv/bin/python bench/bench_arrow_read.py --input DIR --repeat 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _count_lines_of_batches(batches):
    import pyarrow as pa

    n = 0
    for batch in batches:
        n += batch.num_rows
    yield pa.record_batch({"n": pa.array([n], pa.int64())})


def _chunk_line_counter(chunks):
    def run(batches):
        import pyarrow as pa

        from spark_jobs.engines.arrow.chunks import line_blocks

        n = 0
        for batch in batches:
            for chunk_id in batch.column(0).to_numpy():
                for block in line_blocks(chunks[int(chunk_id)]):
                    n += len(block)
        yield pa.record_batch({"n": pa.array([n], pa.int64())})

    return run


def _timed(label: str, action, rows_expected: int | None = None) -> float:
    from spark_jobs.timing import process_tree_cpu_seconds

    start, cpu = time.perf_counter(), process_tree_cpu_seconds()
    rows = action()
    wall, cpu = time.perf_counter() - start, process_tree_cpu_seconds() - cpu
    check = "" if rows_expected in (None, rows) else f"  (!= {rows_expected})"
    print(f"{label:58s} {wall:7.1f} s  {cpu:7.1f} CPU-s  {rows:,} lines{check}", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", default="/tmp/spark_jobs_bench/raw_4x2000000_s20240601")
    p.add_argument("--chunk-mb", type=int, default=256)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()

    from pyspark.sql import functions as F

    from dlrm_contracts.config import SparkConfig
    from spark_jobs.engines.arrow.tasks import COUNT_SCHEMA, ReadSettings, count_task
    from spark_jobs.engines.arrow.chunks import plan_chunks
    from spark_jobs.inputs import discover_days
    from spark_jobs.session import get_session

    days = discover_days(args.input)
    session = get_session(SparkConfig(master="local[2]", driver_memory="12g"))
    chunks = plan_chunks(days, args.chunk_mb << 20)
    over_chunks = session.range(0, len(chunks), 1, len(chunks))

    def via_text():
        frames = [session.read.option("lineSep", "\n").text(str(d.path)) for d in days]
        lines = frames[0]
        for frame in frames[1:]:
            lines = lines.unionByName(frame)
        return lines.mapInArrow(_count_lines_of_batches, "n LONG").agg(F.sum("n")).first()[0]

    def via_chunks():
        return over_chunks.mapInArrow(_chunk_line_counter(chunks), "n LONG").agg(F.sum("n")).first()[0]

    def count_pass():
        task = count_task(chunks, frozenset(d.day for d in days), ReadSettings(1 << 20, 1 << 18))
        rows = over_chunks.mapInArrow(task, COUNT_SCHEMA)
        stats = rows.where("column = -1 AND value & 255 = 0").agg(F.sum("count")).first()[0]
        return stats

    expected = None
    for _ in range(args.repeat):
        expected = _timed("(a) spark.read.text -> mapInArrow, lines counted", via_text, expected)
        _timed("(b) chunks read by the task, lines counted", via_chunks, expected)
        _timed("(b) + parse + statistics + partial value counts", count_pass, expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
