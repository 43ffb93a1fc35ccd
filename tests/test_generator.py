"""The synthetic Criteo generator: layout, shape claims, planted model, determinism, CLI."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dlrm_contracts.config import GeneratorConfig
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, NUM_FIELDS
from pipeline.generate import main
from pipeline.synthetic import META_FILE, generate
from pipeline.synthetic.planted_model import HEAD_RANKS, hashed_main_effect
from pipeline.synthetic.shape import (
    CATEGORICAL_MISSING_RATES,
    INTEGER_SHAPES,
    MISSING_TOGETHER,
    TERABYTE_CARDINALITIES,
    scaled_cardinality,
)
from pipeline.synthetic.source import SyntheticSource
from pipeline.synthetic.writer import IN_PROGRESS_FILE, pool_context

HEX8 = re.compile(r"^[0-9a-f]{8}$")
INTEGER = re.compile(r"^(0|-?[1-9][0-9]*)$")
SHAPE_CONFIG = GeneratorConfig(days=2, rows_per_day=60_000, seed=7, chunk_rows=16_384, workers=2)
SMALL = GeneratorConfig(days=2, rows_per_day=5_000, seed=11, chunk_rows=2_048, workers=1)


@dataclasses.dataclass
class Parsed:
    labels: np.ndarray  # (rows,) int
    ints: list[list[str]]  # 13 columns of raw text
    cats: list[list[str]]  # 26 columns of raw text


def parse_lines(data: bytes) -> Parsed:
    """Strict reader: every line must have exactly 40 fields (raises otherwise)."""
    text = data.decode("ascii")
    assert text.endswith("\n") and "\r" not in text
    rows = [line.split("\t") for line in text[:-1].split("\n")]
    bad = [i for i, r in enumerate(rows) if len(r) != NUM_FIELDS]
    assert not bad, f"lines with != {NUM_FIELDS} fields: {bad[:5]}"
    columns = list(zip(*rows))
    return Parsed(
        np.array([int(v) for v in columns[0]]),
        [list(c) for c in columns[1:14]],
        [list(c) for c in columns[14:]],
    )


def read_days(out: Path, meta: dict) -> Parsed:
    blobs = []
    for day in meta["days"]:
        raw = (out / day["file"]).read_bytes()
        blobs.append(gzip.decompress(raw) if day["file"].endswith(".gz") else raw)
    return parse_lines(b"".join(blobs))


@pytest.fixture(scope="module")
def shaped(tmp_path_factory) -> tuple[Path, dict, Parsed]:
    out = tmp_path_factory.mktemp("shaped")
    meta = generate(out, SHAPE_CONFIG)
    return out, meta, read_days(out, meta)


def test_layout_every_field_parses(shaped):
    out, meta, parsed = shaped
    assert sorted(p.name for p in out.iterdir()) == ["day_0", "day_1", META_FILE]
    assert len(parsed.labels) == 120_000 == meta["rows"]
    assert set(np.unique(parsed.labels)) == {0, 1}
    for column in parsed.ints:  # canonical decimal integers: no '+', spaces or leading zeros
        assert all(v == "" or INTEGER.match(v) for v in column)
    for column in parsed.cats:
        assert all(v == "" or HEX8.match(v) for v in column)


def test_click_rate_near_three_percent(shaped):
    _, meta, parsed = shaped
    assert abs(parsed.labels.mean() - 0.03) < 0.004
    assert meta["clicks"] == parsed.labels.sum()
    assert meta["click_rate"] == pytest.approx(parsed.labels.mean())


def test_missing_rates_follow_the_configured_shape(shaped):
    _, _, parsed = shaped
    for name, column, rate in zip(CAT_COLUMNS, parsed.cats, CATEGORICAL_MISSING_RATES):
        observed = sum(v == "" for v in column) / len(column)
        assert abs(observed - rate) < 0.01, (name, observed, rate)
    for name, column, shape in zip(INT_COLUMNS, parsed.ints, INTEGER_SHAPES):
        observed = sum(v == "" for v in column) / len(column)
        assert abs(observed - shape.missing) < 0.01, (name, observed, shape.missing)
    # Real logs: I12 mostly missing, I2 never, C22 mostly missing, C1 never.
    assert sum(v == "" for v in parsed.ints[11]) / 120_000 > 0.6
    assert "" not in parsed.ints[1] and "" not in parsed.cats[0]


def test_columns_missing_together_in_real_logs_are_missing_together(shaped):
    _, meta, parsed = shaped
    columns = dict(zip(INT_COLUMNS + CAT_COLUMNS, parsed.ints + parsed.cats))
    assert meta["shape"]["missing_together"] == [list(g) for g in MISSING_TOGETHER]
    for group in MISSING_TOGETHER:
        masks = [[v == "" for v in columns[name]] for name in group]
        assert all(m == masks[0] for m in masks[1:]), group
        assert 0.1 < sum(masks[0]) / len(masks[0]) < 0.9
    # ...and only those: I1 and I3 are missing independently.
    both = sum(a == "" and b == "" for a, b in zip(columns["I1"], columns["I3"])) / 120_000
    assert abs(both - 0.45 * 0.21) < 0.01


def test_integers_heavy_tailed_with_negatives(shaped):
    _, _, parsed = shaped
    i2 = Counter(int(v) for v in parsed.ints[1])
    assert 0.07 < i2[-1] / 120_000 < 0.11 and i2[-2] > 0
    i5 = np.array([int(v) for v in parsed.ints[4] if v])
    assert 1_000 < np.median(i5) < 6_000 and i5.max() > 1_000_000  # heavy tail
    assert min(int(v) for c in parsed.ints[2:] for v in c if v) >= 0  # only I2 goes negative
    assert sum(v == "0" for v in parsed.ints[11] if v) / sum(1 for v in parsed.ints[11] if v) > 0.7


def test_cardinality_spread_like_terabyte(shaped):
    _, meta, parsed = shaped
    vocab = meta["shape"]["cardinalities"]
    distinct = {name: len(set(c) - {""}) for name, c in zip(CAT_COLUMNS, parsed.cats)}
    for name, true_size in zip(CAT_COLUMNS, TERABYTE_CARDINALITIES):
        assert vocab[name] == scaled_cardinality(
            true_size, SHAPE_CONFIG.cardinality_scale, SHAPE_CONFIG.cardinality_floor
        )
        assert distinct[name] <= vocab[name]
        if vocab[name] <= 155:  # small tables keep their true size and are fully seen
            assert vocab[name] == true_size and distinct[name] == true_size, name
    assert distinct["C6"] == 3 and distinct["C13"] == 10 and distinct["C9"] == 63
    biggest = sorted(distinct.values())[-4:]
    assert min(biggest) > 10_000  # C1, C10, C20, C22
    assert sum(d < 1_500 for d in distinct.values()) >= 10  # many small ones
    assert max(distinct.values()) > 100 * distinct["C26"]
    # Vocabulary sizes keep the Terabyte order of sizes.
    by_true_size = [vocab[n] for _, n in sorted(zip(TERABYTE_CARDINALITIES, CAT_COLUMNS))]
    assert by_true_size == sorted(by_true_size)


def test_value_frequencies_are_zipf_like(shaped):
    _, _, parsed = shaped
    counts = Counter(v for v in parsed.cats[19] if v)  # C20, the largest table
    frequencies = np.array(sorted(counts.values(), reverse=True))
    top_share = frequencies[0] / frequencies.sum()
    assert 0.03 < top_share < 0.2
    assert (frequencies == 1).sum() > 0.5 * len(frequencies)  # most values seen once
    # Frequent values are arbitrary hashes, not '00000001'.
    assert counts.most_common(1)[0][0] not in {"00000000", "00000001"}
    # Rank-frequency slope near -exponent over the head.
    slope = np.polyfit(np.log(np.arange(1, 101)), np.log(frequencies[:100]), 1)[0]
    assert -1.5 < slope < -0.7


def test_meta_records_parameters_and_bayes_auc(shaped):
    out, meta, _ = shaped
    on_disk = json.loads((out / META_FILE).read_text())
    assert on_disk == json.loads(json.dumps(meta))
    assert on_disk["seed"] == 7
    assert on_disk["parameters"]["rows_per_day"] == 60_000
    assert [d["rows"] for d in on_disk["days"]] == [60_000, 60_000]
    assert 0.75 < on_disk["bayes_auc"] < 0.88
    assert on_disk["bayes_auc_max_error"] < 1e-4


def _rank_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Plain Mann-Whitney AUC with average ranks for ties."""
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = 0.5 * (s + e - 1) + 1
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return (ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _int_column(column: list[str]) -> tuple[np.ndarray, np.ndarray]:
    text = pa.array(column, pa.string())
    missing = pc.equal(text, "")
    values = pc.cast(pc.if_else(missing, "0", text), pa.int64())
    return values.to_numpy(), missing.to_numpy(zero_copy_only=False)


def _hex_column(column: list[str]) -> tuple[np.ndarray, np.ndarray]:
    text = pa.array(column, pa.string())
    missing = pc.equal(text, "").to_numpy(zero_copy_only=False)
    digits = np.frombuffer(text.buffers()[2], np.uint8, count=8 * int((~missing).sum()))
    digits = digits.reshape(-1, 8)
    nibbles = np.where(digits >= ord("a"), digits - ord("a") + 10, digits - ord("0"))
    present = np.zeros(len(digits), np.uint32)
    for k in range(8):
        present = (present << np.uint32(4)) | nibbles[:, k].astype(np.uint32)
    values = np.zeros(len(column), np.uint32)
    values[~missing] = present
    return values, missing


def _fields_to_arrays(parsed: Parsed):
    ints, int_missing = zip(*(_int_column(c) for c in parsed.ints))
    cats, cat_missing = zip(*(_hex_column(c) for c in parsed.cats))
    return np.stack(ints), np.stack(int_missing), np.stack(cats), np.stack(cat_missing)


@pytest.fixture(scope="module")
def source() -> SyntheticSource:
    return SyntheticSource.from_config(SHAPE_CONFIG)


@pytest.fixture(scope="module")
def read_back(shaped, source):
    """The sampled features, rebuilt from the written text (hex values inverted to ranks)."""
    return source.features_from_fields(*_fields_to_arrays(shaped[2]))


def test_bayes_auc_is_the_auc_of_the_planted_probabilities(shaped, source, read_back):
    """Recompute the true probabilities from the written text and check the meta's AUC."""
    _, meta, parsed = shaped
    probabilities = source.model.probabilities(read_back)
    exact = _rank_auc(probabilities, parsed.labels)
    assert meta["bayes_auc"] == pytest.approx(exact, abs=meta["bayes_auc_max_error"] + 1e-9)
    # And they are the probabilities the labels were drawn from: calibrated, not just ranked.
    assert abs(probabilities.mean() - parsed.labels.mean()) < 0.003
    top = probabilities > np.quantile(probabilities, 0.9)
    assert parsed.labels[top].mean() == pytest.approx(probabilities[top].mean(), rel=0.15)


def test_rebuilt_features_are_the_sampled_ones(source, read_back):
    features, logits, labels = source.sample(0, 0, SHAPE_CONFIG.chunk_rows)
    rows = slice(0, SHAPE_CONFIG.chunk_rows)
    np.testing.assert_array_equal(read_back.cat_ranks[:, rows], features.cat_ranks)
    np.testing.assert_array_equal(read_back.int_missing[:, rows], features.int_missing)
    present = ~features.int_missing
    np.testing.assert_array_equal(read_back.int_values[:, rows][present], features.int_values[present])
    np.testing.assert_array_equal(source.model.logits(read_back)[rows], logits)


def test_head_table_equals_the_hashed_weights(source):
    ranks = np.arange(0, HEAD_RANKS + 50)
    for c in (0, 5, 19):
        ranks_c = np.minimum(ranks, source.shapes.cardinalities[c])
        hashed = hashed_main_effect(
            ranks_c, source.model.categorical_salts[c], source.model.categorical_amplitudes[c]
        )
        np.testing.assert_array_equal(source.model.main_effect(c, ranks_c), hashed)


def test_frequent_values_carry_the_signal(shaped, source, read_back):
    """Erase every categorical value seen fewer than 20 times (what a model cannot learn):
    the AUC of the remaining planted signal stays close to the Bayes AUC."""
    _, meta, parsed = shaped
    features = dataclasses.replace(read_back, cat_ranks=read_back.cat_ranks.copy())
    for c in range(26):
        ranks = features.cat_ranks[c]
        _, inverse, counts = np.unique(ranks, return_inverse=True, return_counts=True)
        ranks[(counts[inverse] < 20) & (ranks > 0)] = 2**31 - 1  # ~zero weight
    learnable = _rank_auc(source.model.logits(features), parsed.labels)
    assert learnable > meta["bayes_auc"] - 0.03


def _one_hot_ids(features, train_rows: int) -> np.ndarray:
    """Per row, 39 feature ids: categorical values seen >= 3 times in training (else one
    'rare' id per column), integers in half-unit bins of log(x + 3) (plus 'missing')."""
    ids, offset = [], 0
    for ranks in features.cat_ranks:
        values, inverse = np.unique(ranks, return_inverse=True)
        kept = np.bincount(inverse[:train_rows], minlength=values.size) >= 3
        ids.append(offset + np.where(kept, np.cumsum(kept), 0)[inverse])
        offset += int(kept.sum()) + 1
    for values, missing in zip(features.int_values, features.int_missing):
        t = np.where(values > -3, np.log(np.maximum(values, -2) + 3.0), 0.0)
        ids.append(offset + np.where(missing, 31, np.clip((2 * t).astype(int), 0, 30)))
        offset += 32
    return np.stack(ids, axis=1)


def test_signal_is_learnable_from_100k_rows(shaped, read_back):
    """One pass of a plain one-hot logistic regression (Adagrad) on 100k rows ranks the
    20k held-out rows well: the planted signal is learnable, not just present."""
    _, meta, parsed = shaped
    train = 100_000
    ids, labels = _one_hot_ids(read_back, train), parsed.labels.astype(np.float64)
    weights = np.zeros(ids.max() + 1)
    squares = np.full_like(weights, 1e-6)
    bias = np.log(0.03 / 0.97)
    for start in range(0, train, 1024):
        batch = ids[start : start + 1024]
        error = 1 / (1 + np.exp(-(bias + weights[batch].sum(1)))) - labels[start : start + 1024]
        grad = np.bincount(batch.ravel(), np.repeat(error, batch.shape[1]), weights.size)
        squares += grad**2
        weights -= 0.05 * grad / np.sqrt(squares)
    held_out = _rank_auc(weights[ids[train:]].sum(1), parsed.labels[train:])
    assert held_out > 0.70, held_out
    assert held_out < meta["bayes_auc"] + 0.02


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, dict]:
    """SMALL generated once (its directory and meta): the reference output of the tests below
    that compare another run with it, or rerun over a copy of it."""
    out = tmp_path_factory.mktemp("small") / "one"
    return out, generate(out, SMALL)


def copy_of_small(small, target: Path) -> Path:
    """A copy of SMALL's output at ``target`` (which may exist, empty): as a run there left it."""
    shutil.copytree(small[0], target, dirs_exist_ok=True)
    return target


def test_same_bytes_for_same_seed_whatever_the_workers(tmp_path, small):
    one_dir, one = small
    two = generate(tmp_path / "two", dataclasses.replace(SMALL, workers=2))
    again = generate(tmp_path / "again", SMALL)
    other = generate(tmp_path / "other", dataclasses.replace(SMALL, seed=12))
    for day in ("day_0", "day_1"):
        data = (one_dir / day).read_bytes()
        assert data == (tmp_path / "two" / day).read_bytes()
        assert data == (tmp_path / "again" / day).read_bytes()
        assert data != (tmp_path / "other" / day).read_bytes()
    assert one == two == again and one["bayes_auc"] != other["bayes_auc"]


def test_same_bytes_from_a_threaded_caller(tmp_path, small):
    """A caller with threads gets a forkserver pool instead of fork: same output."""
    one_dir, one = small
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        assert pool_context().get_start_method() == "forkserver"
        threaded = generate(tmp_path / "threaded", dataclasses.replace(SMALL, workers=2))
    finally:
        stop.set()
        helper.join()
    assert threaded == one
    for day in ("day_0", "day_1"):
        assert (one_dir / day).read_bytes() == (tmp_path / "threaded" / day).read_bytes()


def test_gzip_output_is_the_same_lines(tmp_path, small):
    plain_dir, plain = small
    packed = generate(tmp_path / "packed", dataclasses.replace(SMALL, gzip=True, workers=2))
    assert [d["file"] for d in packed["days"]] == ["day_0.gz", "day_1.gz"]
    for day in range(2):
        with gzip.open(tmp_path / "packed" / f"day_{day}.gz", "rb") as fh:
            assert fh.read() == (plain_dir / f"day_{day}").read_bytes()
    assert packed["bayes_auc"] == plain["bayes_auc"]


def test_refuses_foreign_day_files_and_cleans_its_own(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "day_0").write_text("precious\n")
    with pytest.raises(FileExistsError):
        generate(tmp_path / "real", SMALL)
    assert (tmp_path / "real" / "day_0").read_text() == "precious\n"
    generate(tmp_path / "ours", dataclasses.replace(SMALL, days=3))
    (tmp_path / "ours" / ".day_1.chunk2.part").write_text("left by a killed run")
    (tmp_path / "ours" / ".day_2.tmp-4194305-0badcafe").write_text("left by a killed run")
    generate(tmp_path / "ours", SMALL)  # a smaller rerun leaves no stale day_2, no leftovers
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["day_0", "day_1", META_FILE]


def test_a_failed_run_leaves_nothing_behind(tmp_path, monkeypatch):
    real = SyntheticSource.make_chunk

    def failing(self, day, index, rows):
        if day == 1:
            raise OSError("disk full (simulated)")
        return real(self, day, index, rows)

    monkeypatch.setattr(SyntheticSource, "make_chunk", failing)
    with pytest.raises(OSError, match="simulated"):
        generate(tmp_path, SMALL)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_run_is_replaced_by_the_rerun_and_takes_its_workers(tmp_path):
    """SIGKILL the CLI mid-run: its pool workers die with it (no orphans), and a rerun
    into the same directory recognises the half-written output as its own."""
    out = tmp_path / "raw"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.generate",
            "--out",
            str(out),
            "--days",
            "20",
            "--rows-per-day",
            "16384",
            "--chunk-rows",
            "4096",
            "--workers",
            "2",
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 600  # a bound: the loop ends when day_0 appears
    while not (out / "day_0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (out / "day_0").exists() and proc.poll() is None, "the run ended too soon"
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert len(workers) == 2
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive, f"orphaned pool workers: {alive}"
    assert not (out / META_FILE).exists() and (out / IN_PROGRESS_FILE).exists()
    generate(out, SMALL)
    assert sorted(p.name for p in out.iterdir()) == ["day_0", "day_1", META_FILE]


def _peak_rss_mb(out: Path, rows: int) -> float:
    """Peak RSS of a fresh interpreter generating one day of ``rows`` rows in-process."""
    code = (
        "import resource, sys; from dlrm_contracts.config import GeneratorConfig; "
        "from pipeline.synthetic import generate; "
        "generate(sys.argv[1], GeneratorConfig(days=1, rows_per_day=int(sys.argv[2]), "
        "chunk_rows=16384, workers=1)); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(out), str(rows)], check=True, capture_output=True, text=True
    )
    return int(done.stdout.split()[-1]) / 1024


def test_memory_does_not_grow_with_rows(tmp_path):
    small = _peak_rss_mb(tmp_path / "small", 20_000)
    large = _peak_rss_mb(tmp_path / "large", 250_000)  # 61 MB of text
    assert large - small < 20, (small, large)  # 12x the rows: the chunks bound the memory


def test_small_columns_keep_their_true_size_at_any_scale():
    for scale in (1e-6, 0.002, 0.5):
        assert scaled_cardinality(3, scale, 1000) == 3
        assert scaled_cardinality(63, scale, 1000) == 63
        assert 1000 <= scaled_cardinality(39060, scale, 1000) <= 39060
    assert scaled_cardinality(292775614, 0.002, 1000) == 585551
    assert scaled_cardinality(292775614, 1.0, 1000) == 292775614


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli"
    assert (
        main(
            [
                "--out",
                str(out),
                "--days",
                "1",
                "--rows-per-day",
                "3000",
                "--seed",
                "5",
                "--gzip",
                "--cardinality-scale",
                "0.0001",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rows"] == 3000
    meta = json.loads((out / META_FILE).read_text())
    assert meta["parameters"]["cardinality_scale"] == 0.0001 and meta["parameters"]["gzip"]
    assert (out / "day_0.gz").exists()
    assert main(["--out", str(tmp_path / "bad"), "--days", "0"]) == 2
    assert "days must be >= 1" in capsys.readouterr().err


def test_cli_reads_the_generator_section_of_a_config_file(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("generator:\n  days: 1\n  rows_per_day: 2000\n  seed: 3\n  click_rate: 0.1\n")
    assert main(["--out", str(tmp_path / "raw"), "--config", str(config), "--seed", "4"]) == 0
    meta = json.loads((tmp_path / "raw" / META_FILE).read_text())
    assert meta["seed"] == 4 and meta["parameters"]["rows_per_day"] == 2000
    assert 0.07 < meta["click_rate"] < 0.13  # the planted intercept follows click_rate
    config.write_text("generator:\n  dayz: 1\n")
    assert main(["--out", str(tmp_path / "raw2"), "--config", str(config)]) == 2
    assert "dayz" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"click_rate": 0.0}, "click_rate"),
        ({"chunk_rows": 0}, "chunk_rows"),
        ({"cardinality_scale": float("inf")}, "cardinality_scale"),
        ({"cardinality_scale": float("nan")}, "cardinality_scale"),
        ({"cardinality_floor": 0}, "cardinality_floor"),
        ({"cardinality_floor": -5}, "cardinality_floor"),
        ({"zipf_exponent": float("nan")}, "zipf_exponent"),
        ({"signal_strength": float("inf")}, "signal_strength"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_a_bad_parameter_is_refused_before_the_previous_output_is_touched(
    tmp_path, capsys, small, bad, message
):
    """A rerun with a bad value used to delete the previous output before refusing (and
    some values crashed with a traceback): now a one-line error, exit 2, output intact."""
    copy_of_small(small, tmp_path)  # the previous output
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match=message):
        generate(tmp_path, dataclasses.replace(SMALL, **bad))
    flag, value = next(iter(bad.items()))
    assert main(["--out", str(tmp_path), f"--{flag.replace('_', '-')}", str(value)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_tiny_runs_have_exact_rows_and_valid_json_meta(tmp_path, capsys):
    """1 row, more workers than rows, days not a multiple of chunks: exact row counts, and a
    run without a click writes bayes_auc null (NaN is not JSON)."""
    assert (
        main(
            [
                "--out",
                str(tmp_path / "one"),
                "--days",
                "1",
                "--rows-per-day",
                "1",
                "--seed",
                "0",
                "--workers",
                "3",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    meta = json.loads(
        (tmp_path / "one" / META_FILE).read_text(),
        parse_constant=lambda c: pytest.fail(f"{c} in generator_meta.json"),
    )
    assert meta["rows"] == 1 and meta["clicks"] == 0
    assert meta["bayes_auc"] is None and summary["bayes_auc"] is None
    config = dataclasses.replace(SMALL, days=3, rows_per_day=7, chunk_rows=3, workers=4)
    generate(tmp_path / "seven", config)
    for day in range(3):
        lines = (tmp_path / "seven" / f"day_{day}").read_bytes().split(b"\n")
        assert lines[-1] == b"" and len(lines) == 8
        assert all(len(line.split(b"\t")) == NUM_FIELDS for line in lines[:-1])
    generate(tmp_path / "seven1", dataclasses.replace(config, workers=1))
    for day in range(3):
        assert (tmp_path / "seven" / f"day_{day}").read_bytes() == (
            tmp_path / "seven1" / f"day_{day}"
        ).read_bytes()


def test_drift_moves_the_frequent_values_day_by_day_and_keeps_their_effect(tmp_path, capsys):
    """C3 drifting by a quarter of its values a day: each day's most frequent C3 value is a
    new one; the value → rank mapping the model sees stays the same (features rebuilt from a
    drifted day's fields are the sampled ones), and a column without drift keeps its head."""
    out = tmp_path / "drift"
    assert (
        main(
            [
                "--out",
                str(out),
                "--days",
                "3",
                "--rows-per-day",
                "20000",
                "--seed",
                "9",
                "--cardinality-scale",
                "0.0001",
                "--workers",
                "1",
                "--drift-column",
                "C3=0.25",
            ]
        )
        == 0
    )
    meta = json.loads((out / META_FILE).read_text())
    assert meta["shape"]["drift_columns"] == {"C3": 0.25}
    parsed = read_days(out, meta)
    per_day = len(parsed.cats[0]) // 3
    top = {
        name: [
            Counter(
                v for v in parsed.cats[CAT_COLUMNS.index(name)][d * per_day : (d + 1) * per_day] if v
            ).most_common(1)[0][0]
            for d in range(3)
        ]
        for name in ("C3", "C4")
    }
    assert len(set(top["C3"])) == 3  # a new head every day
    assert len(set(top["C4"])) == 1  # no drift: the same head
    config = GeneratorConfig(
        days=3, rows_per_day=20000, seed=9, cardinality_scale=0.0001, drift_columns={"C3": 0.25}
    )
    source = SyntheticSource.from_config(config)
    features, _, _ = source.sample(2, 0, 500)
    values = source.hex_values(features)
    rebuilt = source.features_from_fields(
        features.int_values, features.int_missing, values, features.cat_ranks == 0
    )
    assert np.array_equal(rebuilt.cat_ranks, features.cat_ranks)
    assert main(["--out", str(tmp_path / "bad"), "--drift-column", "C3=x"]) == 2
    assert "must look like C3=0.05" in capsys.readouterr().err
