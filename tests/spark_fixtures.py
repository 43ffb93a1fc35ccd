"""Shared helpers of the spark_jobs tests: one Spark session, tiny inputs, a plain-Python reference.

The reference below re-implements the preprocessing rules of docs/spark_jobs.md line by line in
plain Python (no Spark), so the tests compare every output row with an independent reading of
the same rules.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from dlrm_contracts.config import PreprocessConfig, SparkConfig
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import parse_threshold_spec

_SESSION = None


def spark_session():
    """One local[2] session for the whole test run; small files are split into several
    partitions (maxPartitionBytes) so that line-order logic crosses partition boundaries."""
    global _SESSION
    if _SESSION is None:
        import os
        import sys

        from pyspark.sql import SparkSession

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the Arrow engine's workers

        from spark_jobs.class_archive import java_options, select_archive
        from spark_jobs.session import JVM_OPTIONS

        # The tests' inputs are tiny: C2, the optimizing JIT, would spend more CPU compiling
        # Spark's planner and generated classes than it ever wins back on them. C1 alone
        # compiles quickly and runs the same bytecode (the JIT changes speed, never results).
        # The install's class-data archive, as a job's driver maps it (spark.class_archive).
        archive = java_options(select_archive("auto"))
        # The session lives through every Spark file of a worker: C1 alone gets a 48 MB code
        # cache, which that many plans fill (the JIT then stops compiling); room for them all.
        jvm_options = (
            f"{JVM_OPTIONS} -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m {archive}".strip()
        )
        _SESSION = (
            SparkSession.builder.master("local[2]")
            .appName("spark_jobs-tests")
            .config("spark.driver.memory", "2g")
            .config("spark.driver.extraJavaOptions", jvm_options)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.files.maxPartitionBytes", "65536")
            .config("spark.sql.files.openCostInBytes", "0")
            # a job's local daemon (spark_jobs.session): workers forked with the Arrow engine's
            # loops loaded and pyspark imported from its package, not from Spark's zip
            .config("spark.python.daemon.module", "spark_jobs.engines.arrow.python_daemon")
            .getOrCreate()
        )
        _SESSION.sparkContext.setLogLevel("ERROR")
    return _SESSION


def spark_config(**overrides) -> SparkConfig:
    return SparkConfig(master="local[2]", driver_memory="2g", shuffle_partitions=4, **overrides)


def run(spark, input_dir, workdir, threshold="2", **preprocess):
    """run_preprocess on the shared session with test-sized settings."""
    from spark_jobs.preprocess import run_preprocess

    assert spark is not None
    return run_preprocess(
        input_dir, workdir, spark_config(), PreprocessConfig(frequency_threshold=threshold, **preprocess)
    )


# ---------------------------------------------------------------- inputs


def random_line(rng: random.Random, vocab: int = 40) -> str:
    label = "1" if rng.random() < 0.3 else "0"
    ints = [str(rng.randint(-5, 3000)) if rng.random() > 0.2 else "" for _ in range(13)]
    # zipf-ish: small ranks are frequent, so thresholds keep some values and drop others
    cats = [
        "%08x" % (int(rng.paretovariate(1.0) * (j + 1)) * 2654435761 % 2**32) if rng.random() > 0.1 else ""
        for j in range(26)
    ]
    _ = vocab
    return "\t".join([label, *ints, *cats])


def random_days(seed: int, days: int, rows: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[random_line(rng) for _ in range(rows)] for _ in range(days)]


# Longer than preprocess.max_line_bytes by one byte, cut by the rejects inside a two-byte
# character (the engines must cut the same bytes). Not salted into the days:
# a few KB more move where Spark splits the SQL engine's last day, and with it how the
# test/validation rows fall into files (tests/test_spark_engines.py has its own huge lines).
_LIMIT = PreprocessConfig().max_line_bytes
TOO_LONG_LINES = ["x" + "\u00e9" * (_LIMIT // 2)]
BAD_LINES: dict[str, list[str]] = {
    "line_too_long": [],
    # 41 fields
    "too_many_fields": [
        "0" + "\t" * 40,
        "1\t" + "\t".join(["5"] * 13) + "\t" + "\t".join(["0a0b0c0d"] * 26) + "\textra",
    ],
    "bad_label": ["2" + "\t" * 39, "\t" * 39, "x\t1", "", "0.5\t3"],
    "non_integer": [
        "0\t1.5" + "\t" * 38,
        "1\t\tabc",
        "0\t99999999999999999999999",
        "1\t1e3\t2",
        "0\t+5",
        "0\t 7",
    ],
    "non_hex_categorical": [
        "0" + "\t" * 14 + "zzzzzzzz",
        "1" + "\t" * 20 + "0a0b0c0d0",
        "0" + "\t" * 39 + "-1",
        "1" + "\t" * 14 + "0x12",
    ],
}


def salted_days(seed: int, days: int, rows: int) -> list[list[str]]:
    """Random days with every bad-line kind inserted at random places, plus short valid lines."""
    rng = random.Random(seed)
    out = random_days(seed, days, rows)
    bad = [line for lines in BAD_LINES.values() for line in lines]
    for d, lines in enumerate(out):
        for line in bad:
            lines.insert(rng.randrange(len(lines) + 1), line)
        for _ in range(5):  # short but valid: trailing fields missing
            lines.insert(
                rng.randrange(len(lines) + 1), "\t".join(random_line(rng).split("\t")[: rng.randint(1, 39)])
            )
    return out


def write_days(directory: Path, days: list[list[str]], gz: bool = False, crlf: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    newline = "\r\n" if crlf else "\n"
    for k, lines in enumerate(days):
        data = "".join(line + newline for line in lines).encode()
        if gz:
            with gzip.open(directory / f"day_{k}.gz", "wb") as fh:
                fh.write(data)
        else:
            (directory / f"day_{k}").write_bytes(data)
    return directory


# ---------------------------------------------------------------- reference implementation

_INT = re.compile(r"-?[0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]{1,8}")


def reference_parse(line: str, max_line_bytes: int = _LIMIT):
    """(reason or None, padded, label, ints, cats) by the documented rules."""
    if len(line.encode()) > max_line_bytes:
        return "line_too_long", False, None, None, None
    fields = line.split("\t")
    if len(fields) > 40:
        return "too_many_fields", False, None, None, None
    padded = len(fields) < 40
    fields = fields + [""] * (40 - len(fields))
    if fields[0] not in ("0", "1"):
        return "bad_label", padded, None, None, None
    ints = []
    for text in fields[1:14]:
        if text == "":
            ints.append(None)
        elif _INT.fullmatch(text) and -(2**63) <= int(text) < 2**63:
            ints.append(int(text))
        else:
            return "non_integer", padded, None, None, None
    cats = []
    for text in fields[14:]:
        if text == "":
            cats.append(None)
        elif _HEX.fullmatch(text):
            cats.append(text.lower().rjust(8, "0"))
        else:
            return "non_hex_categorical", padded, None, None, None
    return None, padded, int(fields[0]), ints, cats


def reference_missing_rates(lines: list[str]) -> dict[str, float]:
    """Per column, the share of a day's valid rows whose value is missing (days.json)."""
    from dlrm_contracts.schema import INT_COLUMNS

    valid = [p for p in map(reference_parse, lines) if p[0] is None]
    rates = {}
    for i, c in enumerate(INT_COLUMNS):
        rates[c] = sum(p[3][i] is None for p in valid) / len(valid) if valid else 0.0
    for j, c in enumerate(CAT_COLUMNS):
        rates[c] = sum(p[4][j] is None for p in valid) / len(valid) if valid else 0.0
    return rates


def reference_numerical(x) -> np.float32:
    if x is None or x <= -3:
        return np.float32(0.0)
    return np.float32(math.log(x + 3))


@dataclass
class Reference:
    splits: dict[str, list[tuple]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    ids: dict[str, dict[str, int]] = field(default_factory=dict)
    day_counts: list[dict[str, Counter]] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    padded: int = 0
    rows_in: int = 0


def reference_preprocess(days: list[list[str]], threshold: str) -> Reference:
    spec = parse_threshold_spec(threshold)
    ref = Reference()
    parsed_days = []
    for lines in days:
        counts = {c: Counter() for c in CAT_COLUMNS}
        parsed = []
        for line in lines:
            ref.rows_in += 1
            reason, padded, label, ints, cats = reference_parse(line)
            if reason:
                ref.rejected[reason] += 1
                parsed.append(None)
                continue
            ref.padded += padded
            for c, v in zip(CAT_COLUMNS, cats):
                if v is not None:
                    counts[c][v] += 1
            parsed.append((label, ints, cats))
        ref.day_counts.append(counts)
        parsed_days.append(parsed)
    for c in CAT_COLUMNS:
        total = Counter()
        for counts in ref.day_counts:
            total.update(counts[c])
        kept = sorted((v for v, n in total.items() if n >= spec.effective(c)), key=lambda v: (-total[v], v))
        ref.ids[c] = {v: i + 1 for i, v in enumerate(kept)}
        ref.sizes[c] = len(kept) + 1

    def row(parsed):
        label, ints, cats = parsed
        return (
            label,
            *[reference_numerical(x) for x in ints],
            *[ref.ids[c].get(v, 0) if v is not None else 0 for c, v in zip(CAT_COLUMNS, cats)],
        )

    ref.splits["train"] = [row(p) for parsed in parsed_days[:-1] for p in parsed if p]
    last = parsed_days[-1]
    half = (len(last) + 1) // 2
    ref.splits["test"] = [row(p) for p in last[:half] if p]
    ref.splits["validation"] = [row(p) for p in last[half:] if p]
    return ref


# ---------------------------------------------------------------- reading outputs


def read_split(path: Path) -> list[tuple]:
    """Rows of a parquet split in contract order: files sorted by name, rows within a file."""
    files = sorted(Path(path).glob("part-*.parquet"))
    rows = []
    for file in files:
        table = pq.read_table(file)
        columns = [table.column(i).to_numpy(zero_copy_only=False) for i in range(table.num_columns)]
        rows.extend(zip(*[col.tolist() if col.dtype != np.float32 else list(col) for col in columns]))
    return rows


def assert_rows_equal(actual: list[tuple], expected: list[tuple], what: str) -> None:
    """Exact on label and ids; numericals equal as float32 up to one unit in the last place."""
    assert len(actual) == len(expected), f"{what}: {len(actual)} rows, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a[0] == e[0] and tuple(a[14:]) == tuple(e[14:]), f"{what} row {i}: {a} != {e}"
        got = np.array(a[1:14], dtype=np.float32)
        want = np.array(e[1:14], dtype=np.float32)
        assert np.all(np.abs(got - want) <= np.spacing(np.maximum(np.abs(want), 1e-30))), (
            f"{what} row {i}: numericals {got} != {want}"
        )


def sort_key(row: tuple) -> tuple:
    return tuple(float(x) for x in row)


def land_day(raw: Path, day: int, lines: list[str]) -> None:
    """A day file arriving (written aside and renamed in, as a delivery would)."""
    raw.mkdir(parents=True, exist_ok=True)
    part = raw / f".day_{day}.part"
    part.write_text("".join(line + "\n" for line in lines))
    part.rename(raw / f"day_{day}")


def copy_of_run(base: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(raw, work): a copy of a first run's input and workdir under ``base``, the day files with
    their mtimes (their fingerprints, hence what the next run reuses, are those of the original),
    for tests that each go on from one shared first run."""
    raw, work = tmp_path / "raw", tmp_path / "work"
    shutil.copytree(base / "raw", raw)
    shutil.copytree(base / "work", work, symlinks=True)
    return raw, work


def check_against_reference(lines: list[list[str]], work, summary, threshold: str) -> None:
    """Every split, the table sizes and the row counts of a run equal the reference's (the train
    split as a multiset: its order depends on the shuffle)."""
    ref = reference_preprocess(lines, threshold)
    layout = WorkdirLayout.at(work)
    for split in ("test", "validation"):
        assert_rows_equal(read_split(layout.parquet_split(split)), ref.splits[split], split)
    train = read_split(layout.parquet_split("train"))
    assert_rows_equal(
        sorted(train, key=sort_key), sorted(ref.splits["train"], key=sort_key), "train (as a multiset)"
    )
    assert json.loads(layout.parquet_model_size.read_text()) == ref.sizes
    assert summary["table_sizes"] == ref.sizes
    assert summary["rows"] == {s: len(ref.splits[s]) for s in ("train", "test", "validation")}


def split_files(work: Path, split: str) -> list:
    """Each file of the split, in name order, as (its parquet schema, its rows in order)."""
    files = sorted(WorkdirLayout.at(work).parquet_split(split).glob("part-*.parquet"))
    return [(str(pq.read_schema(p).remove_metadata()), pq.read_table(p).to_pylist()) for p in files]


def canonical_rows(directory: Path) -> list[tuple]:
    """Every row of a Spark-written parquet or JSON directory, in a canonical order."""
    if any(directory.rglob("*.json")):
        rows = [
            tuple(sorted(json.loads(line).items()))
            for p in directory.rglob("*.json")
            for line in p.read_text().splitlines()
        ]
    else:
        table = pq.read_table(directory)
        rows = [tuple(sorted(r.items())) for r in table.to_pylist()]
    return sorted(rows, key=repr)
