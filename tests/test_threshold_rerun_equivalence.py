"""Cross-wing check of the no-Spark threshold raise: the converter's raise must be exactly what
Spark would have written, or raising a threshold without Spark would change the data.

spark_jobs runs from scratch at threshold 2 and at threshold 7 on the same generated logs;
the threshold-7 dataset derived from the threshold-2 one by ``converters.rethreshold`` must be
byte-identical to the one converted from the threshold-7 parquet: every ``.bin`` file of every
split and ``model_size.json``. This holds only if ids are assigned by count descending then
value, the train shuffle does not depend on the threshold, and the clamp and dtype narrowing
match what a fresh conversion writes.
"""

from __future__ import annotations

import json

import pytest

from converters.convert import convert_parquet
from converters.rethreshold import rethreshold
from dlrm_contracts.config import ConvertConfig, GeneratorConfig, PreprocessConfig, SparkConfig
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import SPLITS
from dlrm_contracts.table_sizes import LowerThresholdError
from dlrm_contracts.verify import verify_dataset
from pipeline.synthetic import generate

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CONVERT = ConvertConfig(workers=2, batch_rows=1024, progress=False, fsync=False)


def _spark_then_convert(raw, workdir, threshold: str) -> WorkdirLayout:
    from spark_jobs.preprocess import run_preprocess

    spark = SparkConfig(master="local[2]", driver_memory="2g")
    run_preprocess(raw, workdir, spark, PreprocessConfig(frequency_threshold=threshold, output_files=2))
    layout = WorkdirLayout.at(workdir)
    convert_parquet(layout.parquet, layout.binary, CONVERT)
    return layout


def test_threshold_7_derived_from_2_is_byte_identical_to_spark_at_7(tmp_path):
    raw = tmp_path / "raw"
    # Small on purpose: the cost is Spark's fixed overhead; 2 x 2000 rows already shrink tables
    # across the int16 -> int8 boundary at threshold 7.
    generate(raw, GeneratorConfig(days=2, rows_per_day=2000, seed=4242, workers=1))
    at2 = _spark_then_convert(raw, tmp_path / "t2", "2")
    at7 = _spark_then_convert(raw, tmp_path / "t7", "7")
    derived = tmp_path / "derived7"
    summary = rethreshold(at2.binary, at2.counts, "7", derived, CONVERT)

    fresh = json.loads((at7.binary / "dataset.json").read_text())
    made = json.loads((derived / "dataset.json").read_text())
    for key in ("splits", "table_sizes", "cat_dtypes", "threshold_spec"):
        assert made[key] == fresh[key], key
    assert summary["columns_rewritten"], "threshold 7 should shrink some tables of this data"
    base = json.loads((at2.binary / "dataset.json").read_text())
    assert any(a != b for a, b in zip(base["cat_dtypes"], made["cat_dtypes"])), (
        "some table should cross a dtype boundary, so narrowing is compared too"
    )
    compared = 0
    for split in SPLITS:
        for path in sorted((at7.binary / split).iterdir()):
            assert (derived / split / path.name).read_bytes() == path.read_bytes(), (
                f"{split}/{path.name} differs"
            )
            compared += 1
    assert compared == 3 * 28
    assert (derived / "model_size.json").read_bytes() == (at7.binary / "model_size.json").read_bytes()
    verify_dataset(derived)

    with pytest.raises(LowerThresholdError, match="Spark rerun"):
        rethreshold(at7.binary, at7.counts, "2", tmp_path / "lower", CONVERT)
