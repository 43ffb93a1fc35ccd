"""convert.formats: [binary, torchrec]: TorchRec's per-day .npy files, read back with np.load.

The parquet is written here with pyarrow (tests/test_converters.py's writer), so the expected
values are the parquet's own; the comparison with TorchRec's scripts on raw logs is a
benchmark (bench/bench_torchrec_anchor.py), since it needs torch outside the project's venv.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from converters.convert import convert_parquet
from converters.torchrec_format import DAYS, TORCHREC_JSON, day_file, train_day_rows
from dlrm_contracts.config import ConfigError, ConvertConfig, config_from_dict
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS
from dlrm_contracts.verify import verify_dataset
from tests.converter_helpers import CONFIG, SPLIT_ROWS, TABLE_SIZES, write_workdir

TORCHREC_CONFIG = ConvertConfig(
    workers=2, batch_rows=700, progress=False, fsync=False, formats=["binary", "torchrec"]
)


def _columns(table: pa.Table, names, dtype) -> np.ndarray:
    return np.stack([table.column(n).to_numpy().astype(dtype) for n in names], axis=1)


@pytest.fixture(scope="module")
def torchrec_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchrec")
    expected = write_workdir(root)
    summary = convert_parquet(root / "parquet", root / "binary", TORCHREC_CONFIG)
    return root, expected, summary


def _load(directory, part):
    return [np.load(directory / day_file(day, part)) for day in range(DAYS)]


def test_files_have_torchrecs_names_dtypes_and_shapes(torchrec_dataset):
    root, _, summary = torchrec_dataset
    directory = root / "binary" / "torchrec"
    rows = train_day_rows(SPLIT_ROWS["train"]) + [SPLIT_ROWS["test"] + SPLIT_ROWS["validation"]]
    for part, dtype, width in (("dense", np.float32, 13), ("sparse", np.int64, 26), ("labels", np.int32, 1)):
        for day, array in enumerate(_load(directory, part)):
            assert array.dtype == dtype and array.shape == (rows[day], width), (part, day)
    assert summary["torchrec"]["rows_per_day"] == rows
    assert sum(rows) == sum(SPLIT_ROWS.values())
    description = json.loads((directory / TORCHREC_JSON).read_text())
    assert description["num_embeddings_per_feature"] == TABLE_SIZES
    verify_dataset(root / "binary")  # the split binary beside it is unchanged and valid


def test_every_value_equals_the_parquet_train_then_test_then_validation(torchrec_dataset):
    root, expected, _ = torchrec_dataset
    directory = root / "binary" / "torchrec"
    dense, sparse, labels = (np.concatenate(_load(directory, p)) for p in ("dense", "sparse", "labels"))
    tables = [expected[s] for s in ("train", "test", "validation")]
    want_dense = np.concatenate([_columns(t, INT_COLUMNS, np.float32) for t in tables])
    want_sparse = np.concatenate([_columns(t, CAT_COLUMNS, np.int64) for t in tables])
    want_labels = np.concatenate([_columns(t, ["label"], np.int32) for t in tables])
    np.testing.assert_array_equal(dense, want_dense)
    np.testing.assert_array_equal(sparse, want_sparse)
    np.testing.assert_array_equal(labels, want_labels)
    # TorchRec's reader takes ids modulo the table sizes it is given: ours stay as they are.
    np.testing.assert_array_equal(sparse % np.array(TABLE_SIZES), sparse)


def test_binary_output_is_the_same_bytes_with_or_without_torchrec(torchrec_dataset, tmp_path):
    root, _, _ = torchrec_dataset
    convert_parquet(root / "parquet", tmp_path / "plain", CONFIG)
    with_torchrec = json.loads((root / "binary" / "dataset.json").read_text())["checksums"]
    plain = json.loads((tmp_path / "plain" / "dataset.json").read_text())["checksums"]
    assert with_torchrec == plain
    assert not (tmp_path / "plain" / "torchrec").exists()


def test_train_days_are_near_equal_consecutive_pieces():
    assert train_day_rows(7, 3) == [2, 2, 3]
    pieces = train_day_rows(1000, 23)
    assert sum(pieces) == 1000 and max(pieces) - min(pieces) <= 1 and len(pieces) == 23
    assert train_day_rows(5, 23).count(0) == 18  # fewer rows than days: empty days, no loss


def test_formats_config_accepts_the_contract_names_and_refuses_others():
    config = config_from_dict({"convert": {"formats": ["binary", "torchrec", "mlperf_multihot"]}})
    assert config.convert.formats == ["binary", "torchrec", "mlperf_multihot"]
    assert ConvertConfig().formats == ["binary"]
    with pytest.raises(ConfigError, match="convert.formats 'parquet'"):
        ConvertConfig(formats=["binary", "parquet"])
    with pytest.raises(ConfigError, match='convert.formats must include "?binary'):
        ConvertConfig(formats=["torchrec"])


def _stage_context(root, threshold):
    from dlrm_contracts.config import PipelineConfig, PreprocessConfig
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline.manifest import ManifestStore
    from pipeline.stages import StageContext

    config = PipelineConfig(
        workdir=str(root), preprocess=PreprocessConfig(frequency_threshold=threshold), convert=TORCHREC_CONFIG
    )
    layout = WorkdirLayout.at(root)
    return StageContext(
        config, layout, ManifestStore(layout.root / "manifests"), layout.root / "effective_config.yaml"
    )


def test_the_convert_stage_writes_torchrec_files_and_refuses_a_raise_it_cannot_give(tmp_path):
    from dlrm_contracts.errors import PipelineError
    from pipeline.stages import _convert

    write_workdir(tmp_path)  # its parquet is at threshold 2
    outcome = _convert(_stage_context(tmp_path, 2))
    assert outcome.action == "ran" and (tmp_path / "binary" / "torchrec" / TORCHREC_JSON).exists()
    # A raise would rethreshold the binary alone and leave the TorchRec ids at threshold 2.
    with pytest.raises(PipelineError, match="convert.formats torchrec writes the parquet's ids"):
        _convert(_stage_context(tmp_path, 5))
    assert json.loads((tmp_path / "binary" / "dataset.json").read_text())["threshold_spec"] == "2"
