"""The id modes (dlrm_contracts.id_modes): each mode's answers, the lookup by name, and the
places that ask them (config validation, records, the spark job's stage table), without Spark."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from dlrm_contracts import id_modes
from dlrm_contracts.config import ID_MODES, ConfigError, PreprocessConfig
from dlrm_contracts.contiguous_ids import DICTIONARIES_DIR as CONTIGUOUS_DICTIONARIES_DIR
from dlrm_contracts.contiguous_ids import MISSING_VALUE, RARE_ID
from dlrm_contracts.dataset_identity import capped, contiguous, dataset_identity, identity_mode
from dlrm_contracts.id_modes import (
    CONTIGUOUS,
    FREQUENCY,
    MODULO,
    STABLE,
    UnknownIdModeError,
    id_mode,
    recorded_mode,
    recorded_or_default,
)
from dlrm_contracts.layout import DICTIONARIES_DIR, WorkdirLayout, dictionaries_under
from dlrm_contracts.thresholds import parse_threshold_spec

# name: (counts values, dictionaries dir, hex values, grows tables, caps required, caps
# allowed, threshold applies, raisable, in the dataset identity, served by, on a workdir URL)
EXPECTED = {
    "frequency": (True, DICTIONARIES_DIR, False, False, False, False, True, True, False, "vocabulary", True),
    "stable": (True, DICTIONARIES_DIR, False, True, False, False, True, False, False, "vocabulary", False),
    "modulo": (False, None, True, False, True, True, False, False, True, "modulo", True),
    "contiguous": (
        False,
        CONTIGUOUS_DICTIONARIES_DIR,
        True,
        False,
        False,
        True,
        True,
        False,
        True,
        "contiguous",
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_mode_answers_its_questions(name, tmp_path):
    mode = id_mode(name)
    assert mode.name == name
    got = (
        mode.counts_values,
        mode.dictionaries_dir,
        mode.hex_values,
        mode.grows_tables,
        mode.caps_required,
        mode.caps_allowed,
        mode.threshold_applies,
        mode.raisable,
        mode.in_dataset_identity,
        mode.served_by,
        mode.on_url_workdir,
    )
    assert got == EXPECTED[name]
    assert mode.writes_dictionaries == (mode.dictionaries_dir is not None)
    where = WorkdirLayout.at(tmp_path).dictionaries_of(mode)
    assert where == (
        None if mode.dictionaries_dir is None else tmp_path.resolve() / "parquet" / mode.dictionaries_dir
    )
    if mode.dictionaries_dir == DICTIONARIES_DIR:  # the layout's one name for these tables
        assert where == WorkdirLayout.at(tmp_path).dictionaries
    assert dictionaries_under(tmp_path, mode) == (None if where is None else tmp_path / mode.dictionaries_dir)
    assert mode.capped == (name == "modulo") and mode.contiguous == (name == "contiguous")
    assert mode.default == (name == "frequency")
    # how the dictionaries are read: contiguous ids' own rule, the others' ids as they are
    rule = (MISSING_VALUE, RARE_ID) if name == "contiguous" else (None, 0)
    assert (mode.missing_value, mode.rare_id) == rule


def test_the_names_are_the_configs_choices_and_the_lookup_refuses_others():
    assert tuple(ID_MODES) == tuple(id_modes.ID_MODES) == ("frequency", "stable", "modulo", "contiguous")
    for name in ("sometimes", "", None, "Stable"):
        with pytest.raises(UnknownIdModeError, match="is not one of frequency, stable, modulo, contiguous"):
            id_mode(name)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="preprocess.ids 'sometimes' is not one of"):
        PreprocessConfig(ids="sometimes")
    assert PreprocessConfig(ids="stable").mode is STABLE
    assert PreprocessConfig().mode is FREQUENCY
    assert PreprocessConfig(ids="modulo", caps=7).mode is MODULO


def test_the_caps_follow_the_mode():
    with pytest.raises(ConfigError, match="caps apply only with ids: modulo or contiguous"):
        PreprocessConfig(ids="stable", caps=7)
    with pytest.raises(ConfigError, match="preprocess.caps is not set"):
        PreprocessConfig(ids="modulo")
    with pytest.raises(ConfigError, match="does not apply with ids: modulo"):
        PreprocessConfig(ids="modulo", caps=7, frequency_threshold=3)
    # contiguous ids number the kept values: their threshold applies
    assert PreprocessConfig(ids="contiguous", caps=7, frequency_threshold=3).mode is CONTIGUOUS


def test_which_thresholds_a_dataset_may_be_read_at():
    two, three = parse_threshold_spec(2), parse_threshold_spec(3)
    assert FREQUENCY.readable_at(three, two) and FREQUENCY.threshold_refusal(three, None) is None
    assert STABLE.readable_at(two, two) and not STABLE.readable_at(three, two)
    assert not STABLE.readable_at(two, None)
    refusal = STABLE.threshold_refusal(three, two)
    assert refusal is not None and "stable ids" in refusal and "not its own, 2" in refusal
    for mode in (MODULO, CONTIGUOUS):  # not even at the threshold they were made at
        assert not mode.readable_at(two, two)
        refusal = mode.threshold_refusal(two, two)
        assert refusal is not None and refusal.startswith(mode.description) and "not its own" not in refusal
        assert mode.threshold_remedy


def test_records_name_their_mode():
    assert recorded_mode({}) is FREQUENCY and recorded_mode(None) is FREQUENCY
    assert recorded_mode({"ids": "stable"}) is STABLE
    with pytest.raises(UnknownIdModeError):
        recorded_mode({"ids": "sometimes"})
    assert recorded_or_default({"ids": "sometimes"}) is FREQUENCY
    assert recorded_or_default({"ids": "contiguous"}) is CONTIGUOUS


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_dataset_identity_names_the_modes_served_otherwise(name):
    info = SimpleNamespace(source_fingerprint="x", threshold_spec="2", extra={"ids": name})
    identity = dataset_identity(info)  # type: ignore[arg-type]
    assert ("ids" in identity) == (name in ("modulo", "contiguous"))
    assert capped(identity) == (name == "modulo") and contiguous(identity) == (name == "contiguous")
    # stable ids are served like frequency ids: their identity reads as dictionary ids
    assert identity_mode(identity).served_by == id_mode(name).served_by


def test_the_preprocess_job_has_steps_for_every_mode():
    from spark_jobs.preprocess import STEPS

    assert set(STEPS) == set(id_modes.ID_MODES.values())
    assert STEPS[STABLE].splits is not STEPS[FREQUENCY].splits  # per-day parts, linked
    assert STEPS[MODULO].count is STEPS[CONTIGUOUS].count  # statistics only


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_convert_keeps_the_parquets_threshold_unless_a_raise_is_a_prefix(name, tmp_path):
    """Only ids ordered by count may be converted at a higher threshold than the parquet's:
    stable and contiguous ids are refused (exit 2) before anything is read."""
    from converters.api import ConvertRequest, _refuse_fixed_threshold
    from dlrm_contracts.config import ConvertConfig
    from dlrm_contracts.errors import ExitCode, PipelineError
    from dlrm_contracts.layout import WorkdirLayout

    def request(threshold: int) -> ConvertRequest:
        return ConvertRequest(
            layout=WorkdirLayout.at(tmp_path),
            config=ConvertConfig(),
            threshold=parse_threshold_spec(threshold),
            parquet_threshold=parse_threshold_spec(2),
            ids=id_mode(name),
        )

    _refuse_fixed_threshold(request(2))  # its own threshold: always converted
    if id_mode(name).raisable:
        _refuse_fixed_threshold(request(3))
        return
    words = f"differs from 2, the threshold of this workdir's {id_mode(name).description}"
    with pytest.raises(PipelineError, match=re.escape(words)) as raised:
        _refuse_fixed_threshold(request(3))
    assert raised.value.code == ExitCode.USAGE


def test_the_transform_reads_the_index_by_the_modes_rule():
    """The engines read a mode's lookup rule as data (IdMode.missing_value, rare_id): the
    frequency ids' index as it is (missing and unknown: 0), contiguous ids' with a missing
    value looked up as the value 0 and an unknown one the rare id."""
    import numpy as np

    from spark_jobs.contiguous_ids import ContiguousIds

    class Index:  # value 7 has id 5, value 0 (a missing value, numbered) id 9
        def lookup_into(self, values, out):
            out[...] = np.select([values == 7, values == 0], [5, 9], 0)

    values = np.array([[7, -1, 3]])
    got = {}
    for mode in (FREQUENCY, CONTIGUOUS):
        out = np.empty(values.shape, np.int32)
        ContiguousIds(Index(), None, mode.missing_value, mode.rare_id).lookup_into(values, out)
        got[mode.name] = out.tolist()
    assert got == {"frequency": [[5, 0, 0]], "contiguous": [[5, 9, RARE_ID]]}
