"""The order in which the suite's workers take the test files: longest recorded first."""

from __future__ import annotations

from pathlib import Path

import suite_costs


def test_costs_from_junit_sum_each_files_tests(tmp_path: Path):
    xml = tmp_path / "suite.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="t1" time="1.5" />'
        '<testcase classname="tests.test_b" name="t1" time="9.0" />'
        '<testcase classname="tests.test_a" name="t2" time="2.0" />'
        '<testcase classname="" name="collect error" time="0.1" />'
        "</testsuite></testsuites>"
    )
    costs = suite_costs.costs_from_junit(xml)
    assert costs == {"test_b.py": 9.0, "test_a.py": 3.5}
    assert list(costs) == ["test_b.py", "test_a.py"]  # longest first


def test_the_record_names_existing_files_and_an_unreadable_one_is_no_record(tmp_path, monkeypatch):
    recorded = suite_costs.recorded_costs()
    assert recorded and all((Path(__file__).parent / name).exists() for name in recorded)
    monkeypatch.setattr(suite_costs, "COSTS", tmp_path / "absent.json")
    assert suite_costs.recorded_costs() == {}
    (tmp_path / "bad.json").write_text("[1, 2")
    monkeypatch.setattr(suite_costs, "COSTS", tmp_path / "bad.json")
    assert suite_costs.recorded_costs() == {}
