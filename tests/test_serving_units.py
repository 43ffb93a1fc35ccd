"""The serving graph's line rules against the plain-Python reference of the Spark job's rules,
and the export's vocabulary files and size check (no pipeline run needed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrm_contracts.config import ExportConfig
from tests.spark_fixtures import BAD_LINES, reference_parse

INTEGER_FIELDS = [
    "",
    "0",
    "-0",
    "007",
    "-3",
    "-2",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "0000000000009223372036854775807",
    "-00000000000000000000000009223372036854775808",
    "19999999999999999999",
    "1999999999999999999",
    "9300000000000000000",
    "+5",
    " 7",
    "7 ",
    "1.5",
    "1e3",
    "-",
    "--1",
    "12a",
    "٣",
    "abcdefghijklmnopqrs",
    "8\r",
]
HEX_FIELDS = [
    "",
    "0",
    "A",
    "abcdef12",
    "ABCDEF12",
    "abcdef123",
    "0x12",
    "zz",
    "-1",
    " 1",
    "ffff\r",
    "00000000",
    "éé",
]


def _lines() -> list[str]:
    base = ["1"] + ["5"] * 13 + ["0a0b0c0d"] * 26
    # the SavedModel scores request lines: the day files' line limit is not its rule
    lines = [line for reason, group in BAD_LINES.items() if reason != "line_too_long" for line in group]
    for value in INTEGER_FIELDS:
        lines.append("\t".join(base[:3] + [value] + base[4:]))
    for value in HEX_FIELDS:
        lines.append("\t".join(base[:20] + [value] + base[21:]))
    lines += ["\t".join(base[:k]) for k in (1, 2, 14, 39)]
    lines += ["\t".join(base) + "\tx", "\t".join(base) + "\r", "\t".join(base) + "\r\r", "1\r\t5"]
    return lines


def test_line_rules_equal_the_spark_reference():
    import tensorflow as tf

    from trainer.serving import normalise_categoricals, parse_integers, split_lines

    lines = _lines()
    fields, too_many = split_lines(tf.constant([line.encode() for line in lines]), tf.constant(True))
    integers, ints_valid = parse_integers(fields[:, 1:14], -(2**63))
    normalised, _, cats_valid = normalise_categoricals(fields[:, 14:])
    label = fields[:, 0].numpy()
    for i, line in enumerate(lines):
        reason, _, want_label, ints, cats = reference_parse(line.removesuffix("\r"))
        got = (
            "too_many_fields"
            if too_many[i]
            else "bad_label"
            if label[i] not in (b"0", b"1")
            else "non_integer"
            if not ints_valid[i]
            else "non_hex_categorical"
            if not cats_valid[i]
            else None
        )
        assert got == reason, (line, got, reason)
        if reason is None:
            # -2**63 is the missing marker: like every value <= -3 it becomes 0
            assert [None if v <= -3 else int(v) for v in integers[i].numpy()] == [
                None if v is None or v <= -3 else v for v in ints
            ], line
            got_cats = [c.decode() for c in normalised[i].numpy()]
            assert all(c is None or c == got for c, got in zip(cats, got_cats)), line


def test_log_transform_matches_spark_then_float16():
    import tensorflow as tf

    from trainer.serving import log_transform

    values = np.array([[-(2**63), -3, -2, 0, 1, 7, 2**40, 2**63 - 1, 1000, 65535, 3, 12, 100]], np.int64)
    got = log_transform(tf.constant(values)).numpy()[0]
    want = [0.0 if v <= -3 else np.float32(np.log(np.float64(v) + 3.0)) for v in values[0]]
    np.testing.assert_array_equal(got, np.asarray(want, np.float32).astype(np.float16).astype(np.float32))


def _dictionary(root, column, values):
    folder = root / f"column={column}"
    folder.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "value": [v for v, _ in values],
                "id": pa.array([i for _, i in values], pa.int32()),
                "count": [5] * len(values),
                "key": [0] * len(values),
            }
        ),
        folder / "part-0.parquet",
    )


def test_vocabularies_keep_the_trained_prefix_and_refuse_foreign_dictionaries(tmp_path):
    from trainer.export import ExportError, write_vocabularies
    from trainer.serving import VOCABULARY_HEADER

    dictionaries = tmp_path / "dictionaries"
    _dictionary(dictionaries, "C1", [("0000000b", 2), ("0000000a", 1), ("0000000c", 3)])
    sizes = [3] + [1] * 25  # trained at a higher threshold: ids 1..2 kept
    paths = write_vocabularies(dictionaries, sizes, tmp_path / "out")
    assert paths[0].read_text().splitlines() == [VOCABULARY_HEADER, "0000000a", "0000000b"]
    assert paths[1].read_text().splitlines() == [VOCABULARY_HEADER]
    with pytest.raises(ExportError, match="do not belong to this model"):
        write_vocabularies(dictionaries, [5] + [1] * 25, tmp_path / "out2")
    _dictionary(dictionaries, "C2", [("0000000a", 1), ("0000000b", 3)])
    with pytest.raises(ExportError, match="ids 1..k"):
        write_vocabularies(dictionaries, [3, 3] + [1] * 24, tmp_path / "out3")


def test_size_check_refuses_before_reading():
    from trainer.export import ExportError, check_export_fits, export_size

    sizes = [1000] * 26
    size = export_size(sizes, 16)
    assert size["tables_bytes"] == 26 * 1000 * 16 * 4
    assert size["disk_bytes"] == size["tables_bytes"] + 26 * 999 * 9
    check_export_fits(sizes, 16, ExportConfig(max_memory_mb=10))
    with pytest.raises(ExportError, match="needs about .* export.max_memory_mb = 1"):
        check_export_fits(sizes, 16, ExportConfig(max_memory_mb=1))


def test_export_names_a_missing_dictionary_and_refuses_another_runs_dictionaries(tmp_path):
    """The ids of a checkpoint mean the values of the dictionaries of one preprocess run: a
    missing column is named, rewritten dictionaries (a new day) are refused."""
    from dlrm_contracts.dataset_identity import IDENTITY_KEY, dictionaries_fingerprint
    from trainer.export import ExportError, check_dataset_identity, write_vocabularies

    dictionaries = tmp_path / "dictionaries"
    _dictionary(dictionaries, "C1", [("0000000a", 1), ("0000000b", 2)])
    with pytest.raises(
        ExportError,
        match=r"dictionary of C2 is missing \(.*column=C2 does not "
        r"exist\).*--stages preprocess,convert,train",
    ):
        write_vocabularies(dictionaries, [3, 2] + [1] * 24, tmp_path / "out")
    checkpoint = tmp_path / "step-000000010"
    meta = {IDENTITY_KEY: {"dictionaries_fingerprint": dictionaries_fingerprint(dictionaries)}}
    assert check_dataset_identity(checkpoint, meta, dictionaries) == (meta[IDENTITY_KEY], None)
    # the next preprocess run: the same values, their ids swapped by new counts
    shutil.rmtree(dictionaries / "column=C1")
    _dictionary(dictionaries, "C1", [("0000000b", 1), ("0000000a", 2)])
    with pytest.raises(ExportError, match="another preprocess run's dictionaries"):
        check_dataset_identity(checkpoint, meta, dictionaries)
    with pytest.raises(ExportError, match="records no dictionaries"):
        check_dataset_identity(checkpoint, {"step": 10}, dictionaries)


def _criteo_lines(rows: int, seed: int, labelled: bool, drop_empty_last: float) -> list[bytes]:
    """Lines shaped like the logs: I1 often empty or small, 8-digit hex categoricals, C26 empty
    in about half the rows; ``drop_empty_last`` of those lines lost their trailing tab."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(rows):
        ints = [("" if rng.random() < 0.4 else str(rng.integers(0, 20))) for _ in range(13)]
        cats = ["%08x" % rng.integers(0, 2**32) for _ in range(25)]
        cats.append("" if rng.random() < 0.5 else "%08x" % rng.integers(0, 2**32))
        fields = ([str(rng.integers(0, 2))] if labelled else []) + ints + cats
        line = "\t".join(fields)
        if cats[-1] == "" and rng.random() < drop_empty_last:
            line = line[:-1]  # the empty last field and its tab are gone
        lines.append(line.encode())
    return lines


def test_label_detection_reads_both_ways_and_refuses_what_fits_both(tmp_path):
    """A labelled file whose short lines lost their empty last field mostly has 39 fields, as an
    unlabelled one: the most common field count would read it unlabelled, shifted by a
    column. Both readings are tried with the Spark job's rules instead."""
    from trainer.score import ScoreError, detect_label

    def file(name: str, lines: list[bytes]) -> Path:
        path = tmp_path / name
        path.write_bytes(b"\n".join(lines) + b"\n")
        return path

    assert detect_label(file("labelled", _criteo_lines(800, 1, True, 1.0)), 0.01) is True
    assert detect_label(file("crlf", [l + b"\r" for l in _criteo_lines(800, 2, True, 0.0)]), 0.01) is True
    assert detect_label(file("unlabelled", _criteo_lines(800, 3, False, 0.0)), 0.01) is False
    # every line has 39 fields and fits both readings: refused, naming the setting
    only_39 = [l for l in _criteo_lines(1600, 4, True, 1.0) if l.count(b"\t") == 38][:500]
    with pytest.raises(ScoreError, match="score.has_label"):
        detect_label(file("ambiguous", only_39), 0.01)
    assert detect_label(file("empty", []), 0.01) is None
    (tmp_path / "blank").write_bytes(b"\n\n")
    assert detect_label(tmp_path / "blank", 0.01) is None


def test_a_truncated_gzip_score_input_is_a_score_error_naming_it(tmp_path):
    import gzip

    from trainer.score import ScoreError, detect_label

    path = tmp_path / "day_9.gz"
    data = gzip.compress(b"\n".join(_criteo_lines(600, 5, True, 0.0)) + b"\n")
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ScoreError, match=r"day_9.gz is not a readable gzip file \(truncated"):
        detect_label(path, 0.01)


def test_score_loads_only_a_version_the_export_stage_wrote(tmp_path):
    """A model directory is code: the score stage checks the version's files against the
    content digest its fingerprint.json records before TensorFlow loads anything."""
    import json

    from dlrm_contracts.config import ScoreConfig
    from dlrm_contracts.model_digest import DIGEST_KEY, saved_model_digest, verify_saved_model
    from trainer.score import ScoreError, score_files

    version = tmp_path / "export" / "3"
    (version / "variables").mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"not a graph")
    (version / "variables" / "variables.index").write_bytes(b"index")
    day = tmp_path / "day_9"
    day.write_bytes(b"0\t1\t2\n")
    with pytest.raises(ScoreError, match="no fingerprint.json"):
        score_files(tmp_path / "export", [day], tmp_path / "out", ScoreConfig())
    fingerprint = {"version": 3, DIGEST_KEY: saved_model_digest(version)}
    (version / "fingerprint.json").write_text(json.dumps(fingerprint, indent=1))
    assert verify_saved_model(version)[DIGEST_KEY] == fingerprint[DIGEST_KEY]
    (version / "variables" / "variables.index").write_bytes(b"planted")
    with pytest.raises(ScoreError, match="differ from what the export stage recorded"):
        score_files(version, [day], tmp_path / "out", ScoreConfig())
    (version / "variables" / "variables.index").write_bytes(b"index")
    (version / "assets").mkdir()
    (version / "assets" / "vocabulary").symlink_to(day)
    with pytest.raises(ScoreError, match="symbolic link"):
        score_files(version, [day], tmp_path / "out", ScoreConfig())
    assert not (tmp_path / "out").exists()
