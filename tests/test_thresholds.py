import pytest

from dlrm_contracts.thresholds import ThresholdSpecError, parse_threshold_spec


def test_global_and_overrides():
    spec = parse_threshold_spec("15, c3:3 ,C20:40")
    assert spec.for_column("C1") == 15
    assert spec.for_column("C3") == 3
    assert spec.for_column("C20") == 40
    assert str(spec) == "15,C3:3,C20:40"


def test_canonical_form_drops_redundant_overrides_and_sorts_columns():
    assert str(parse_threshold_spec("5,C20:40,C3:5")) == "5,C20:40"
    assert parse_threshold_spec("5,C20:40,C3:5") == parse_threshold_spec("5,C20:40")


def test_zero_and_one_both_keep_everything():
    assert parse_threshold_spec("0").effective("C1") == 1
    assert parse_threshold_spec(1).effective("C1") == 1


def test_is_at_least_compares_every_column():
    base = parse_threshold_spec("2,C5:10")
    assert parse_threshold_spec("7,C5:10").is_at_least(base)
    assert not parse_threshold_spec("7,C5:9").is_at_least(base)
    assert parse_threshold_spec("1").is_at_least(parse_threshold_spec("0"))


@pytest.mark.parametrize(
    "bad, words",
    [
        ("", "global threshold"),
        ("C3:3", "global threshold"),
        ("x", "not a whole number"),
        ("-1", "negative"),
        ("5,C3", "COLUMN:THRESHOLD"),
        ("5,C27:3", "unknown column"),
        ("5,C3:1,c3:2", "twice"),
        ("1_0", "not a whole number"),  # Python's int() reads these; a spec takes ASCII digits only
        ("+5", "not a whole number"),
        ("\uff11\uff15", "not a whole number"),
        ("5,C3:\u0663", "not a whole number"),
    ],
)
def test_bad_specs_say_what_is_wrong(bad, words):
    with pytest.raises(ThresholdSpecError, match=words):
        parse_threshold_spec(bad)
