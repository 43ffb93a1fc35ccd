"""A floor for spark_jobs on this machine: the job's own flow with every line check removed.

Why: bench_spark.py measures the job; this script measures how fast the same flow could be at
best in Spark SQL, so that a speed target can be judged against what Spark itself needs here.
It runs, in one Spark session made by ``spark_jobs.session`` (same tuning as the job):

1. count: Spark's CSV reader (typed, no quoting; faster than the job's split + checks, but it
   checks nothing: it skips blank lines, takes ``01`` or ``+1`` as a label, accepts any string
   as a categorical) → one (day, column, value) count aggregation → counts parquet by day;
2. dictionaries: the job's own ``build_dictionaries`` over the summed counts;
3. transform: the CSV reader again → the job's own joins, train shuffle and sort, eval split
   and single partitioned parquet write (``spark_jobs.engines.sql.transform``).

What it leaves out, compared with the job: every validity check and reject reason, the rejects
output, per-day statistics (rows, padded, missing rates, line counts per read partition), the
quality report, days.json and the count histogram. The test/validation boundary is taken at a
read-partition edge instead of the exact middle line. So its time is a lower bound for the job
on the same input, not a substitute for it. Usage:

    .venv/bin/python bench/bench_spark_floor.py                 # 4 days x 2M rows (8M)
    .venv/bin/python bench/bench_spark_floor.py --rows-per-day 250000
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from functools import reduce
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_spark import REFERENCE_ROWS_PER_SECOND, ensure_input  # noqa: E402
from dlrm_contracts.config import PreprocessConfig, SparkConfig  # noqa: E402
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, LABEL  # noqa: E402

CSV_SCHEMA = ", ".join(
    [f"{LABEL} INT", *(f"{c} BIGINT" for c in INT_COLUMNS), *(f"{c} STRING" for c in CAT_COLUMNS)]
)


def csv_day(session, raw: Path, day: int):
    """One day through Spark's CSV reader: tab separated, no quoting, lines end at '\\n'."""
    from pyspark.sql import functions as F

    return (
        session.read.option("sep", "\t")
        .option("quote", "\u0000")
        .option("lineSep", "\n")
        .schema(CSV_SCHEMA)
        .csv(str(raw / f"day_{day}"))
        .withColumn("day", F.lit(str(day)))
    )


def count_values(session, raw: Path, days: int, counts: Path) -> None:
    from pyspark.sql import functions as F

    pairs = ", ".join(f"'{c}', `{c}`" for c in CAT_COLUMNS)
    frames = [
        csv_day(session, raw, d)
        .select("day", F.expr(f"stack({len(CAT_COLUMNS)}, {pairs}) AS (column, value)"))
        .where(F.col("value").isNotNull())
        for d in range(days)
    ]
    (
        reduce(lambda a, b: a.unionByName(b), frames)
        .groupBy("day", "column", "value")
        .agg(F.count(F.lit(1)).alias("count"))
        .write.mode("overwrite")
        .partitionBy("day")
        .parquet(str(counts))
    )


def dictionaries(session, counts: Path, threshold: str, out: Path) -> dict[str, int]:
    from pyspark.sql import functions as F

    from dlrm_contracts.thresholds import parse_threshold_spec
    from spark_jobs.engines.sql.dictionaries import _threshold_of, build_dictionaries

    spec = parse_threshold_spec(threshold)
    totals = (
        session.read.parquet(str(counts))
        .groupBy("column", "value")
        .agg(F.sum("count").cast("long").alias("count"))
        .persist()
    )
    kept = {
        r["column"]: r["n"]
        for r in totals.groupBy("column")
        .agg(F.sum((F.col("count") >= _threshold_of(F.col("column"), spec)).cast("long")).alias("n"))
        .collect()
    }
    sizes = {c: 1 + int(kept.get(c, 0)) for c in CAT_COLUMNS}
    build_dictionaries(totals, spec, sizes, out)
    totals.unpersist()
    return sizes


def keyed_rows(session, raw: Path, day: int, seed: int):
    """day, pos, key1, key2 (seeded hashes of the row), label, I*, C* as the job's join keys."""
    from pyspark.sql import functions as F

    from spark_jobs.engines.sql.parse import value_key

    frame = csv_day(session, raw, day)
    fields = [F.col(LABEL), *map(F.col, INT_COLUMNS), *map(F.col, CAT_COLUMNS)]
    return frame.select(
        "day",
        F.monotonically_increasing_id().alias("pos"),
        F.xxhash64(F.lit(seed), *fields).alias("_order"),
        F.hash(F.lit(seed), *fields).cast("long").alias("_tie"),
        F.col(LABEL),
        *INT_COLUMNS,
        *[
            F.when(F.col(c).isNull(), F.lit(None).cast("long")).otherwise(value_key(F.col(c))).alias(c)
            for c in CAT_COLUMNS
        ],
    )


def transform_splits(
    session,
    raw: Path,
    days: int,
    rows_per_day: int,
    sizes: dict[str, int],
    dict_dir: Path,
    out: Path,
    cfg: PreprocessConfig,
) -> None:
    from pyspark.sql import functions as F

    from spark_jobs.engines.sql import transform
    from spark_jobs.splits import train_files

    def mapped(rows):
        return transform.map_categoricals(rows, session, dict_dir, sizes, cfg.broadcast_max_values)

    train, _ = mapped(
        reduce(
            lambda a, b: a.unionByName(b),
            [keyed_rows(session, raw, d, cfg.shuffle_seed) for d in range(days - 1)],
        )
    )
    last = keyed_rows(session, raw, days - 1, cfg.shuffle_seed)
    boundary = (last.rdd.getNumPartitions() // 2) << 33  # a read-partition edge (see the doc)
    evaluation, shuffled = mapped(last)
    split = F.when(F.col("pos") < F.lit(boundary), "test").otherwise("validation")
    evaluation = transform.output_projection(
        evaluation.withColumn("split", split).withColumn("_order", F.col("pos")), extra=("split", "_order")
    )
    transform.write_parquet(
        transform.eval_part(evaluation, shuffled), out, cfg.compression, partition_by="split"
    )
    train = transform.output_projection(train, extra=("_order", "_tie"))
    transform.write_parquet(
        transform.train_part(train, train_files(cfg, (days - 1) * rows_per_day)),
        out / "split=train",
        cfg.compression,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--rows-per-day", type=int, default=2_000_000)
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--data-root", default="/tmp/spark_jobs_bench")
    p.add_argument("--threshold", default=str(PreprocessConfig().frequency_threshold))
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="12g")
    args = p.parse_args()
    if args.days < 2:
        p.error("--days must be at least 2 (train days and the test/validation day)")
    raw = ensure_input(Path(args.data_root), args.days, args.rows_per_day, args.seed)
    work = Path(args.data_root) / f"floor_{args.days}x{args.rows_per_day}"
    shutil.rmtree(work, ignore_errors=True)

    from spark_jobs.session import get_session

    start = time.perf_counter()
    session = get_session(SparkConfig(master=args.master, driver_memory=args.driver_memory))
    timings = {"session": time.perf_counter() - start}
    t = time.perf_counter()
    count_values(session, raw, args.days, work / "counts")
    timings["count"] = time.perf_counter() - t
    t = time.perf_counter()
    sizes = dictionaries(session, work / "counts", args.threshold, work / "dictionaries")
    timings["dictionaries"] = time.perf_counter() - t
    t = time.perf_counter()
    transform_splits(
        session,
        raw,
        args.days,
        args.rows_per_day,
        sizes,
        work / "dictionaries",
        work / "splits",
        PreprocessConfig(frequency_threshold=args.threshold),
    )
    timings["transform"] = time.perf_counter() - t
    wall = time.perf_counter() - start

    rows = args.days * args.rows_per_day
    print(
        f"floor (no line checks, no statistics): {args.days} days x {args.rows_per_day} rows = "
        f"{rows:,} rows, master {args.master}, driver memory {args.driver_memory}"
    )
    for name, seconds in timings.items():
        print(f"{name:15s} {seconds:8.1f} s")
    ratio = rows / wall / REFERENCE_ROWS_PER_SECOND
    print(
        f"{'end to end':15s} {wall:8.1f} s {rows / wall:>12,.0f} rows/s = {ratio:.2f}x the "
        f"reference ({REFERENCE_ROWS_PER_SECOND:,} rows/s); 4x would need "
        f"{rows / (4 * REFERENCE_ROWS_PER_SECOND):.1f} s"
    )
    print(
        json.dumps(
            {
                "rows": rows,
                "wall_seconds": round(wall, 1),
                "timings": {k: round(v, 1) for k, v in timings.items()},
                "ratio_to_reference": round(ratio, 2),
                "table_sizes_max": max(sizes.values()),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
