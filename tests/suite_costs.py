"""The seconds each test file takes, for the order in which ./run_tests.sh's workers take the
files (tests/conftest.py). Each worker takes whole files, the next one in that order whenever
it is free: a long file handed out late keeps one worker busy while the other idles, so the
longest files go first. The figures come from a whole run's JUnit XML:

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/suite.xml
    .venv/bin/python tests/suite_costs.py /tmp/suite.xml

Only their order matters, so figures from a loaded machine serve as well as quiet ones.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

COSTS = Path(__file__).with_name("suite_costs.json")
# A file the record does not know yet (new since it was written): this many seconds for each
# of its spark, horovod or slow tests, the median of such tests in the record's run.
SECONDS_PER_HEAVY_TEST = 20.0


def recorded_costs() -> dict[str, float]:
    """File name -> seconds; empty when the record is absent or unreadable (the order falls
    back to counting heavy tests)."""
    try:
        return {str(k): float(v) for k, v in json.loads(COSTS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def costs_from_junit(xml_path: Path) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of each of its tests) in a JUnit XML."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((part for part in module if part.startswith("test_")), None)
        if name:
            seconds[f"{name}.py"] += float(case.get("time", 0.0))
    return {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: suite_costs.py JUNIT_XML", file=sys.stderr)
        return 2
    COSTS.write_text(json.dumps(costs_from_junit(Path(argv[0])), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
