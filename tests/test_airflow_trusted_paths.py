"""The Airflow DAG's administrator settings that name code (criteo_dlrm_python,
criteo_dlrm_home): absolute, owned by the Airflow user or root, writable by no one else.

The helper is standard library only (the DAG loads it beside itself), so it is tested here
without Airflow; tests/test_airflow_dag.py runs the DAG itself.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HELPER = REPO / "pipeline" / "dags" / "trusted_paths.py"


def _helper():
    spec = importlib.util.spec_from_file_location("trusted_paths_under_test", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    (home / "pipeline").mkdir(parents=True)
    (home / "bin").mkdir()
    python = home / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    for path in (tmp_path, home, home / "pipeline", home / "bin"):
        path.chmod(0o755)
    python.chmod(0o755)
    return home, python


def test_owned_and_closed_paths_are_accepted_and_links_are_followed(tmp_path):
    trusted = _helper()
    home, python = _tree(tmp_path)
    assert trusted.check_trusted_path("criteo_dlrm_home", str(home), "directory") == home
    assert trusted.check_trusted_path("criteo_dlrm_python", str(python), "executable") == python
    link = home / "bin" / "python3"
    link.symlink_to(python)
    trusted.check_trusted_path("criteo_dlrm_python", str(link), "executable")
    trusted.check_trusted_path("criteo_dlrm_python", sys.executable, "executable")


@pytest.mark.parametrize(
    "case",
    [
        "relative",
        "group-writable file",
        "world-writable dir",
        "foreign owner",
        "not executable",
        "link to a writable file",
    ],
)
def test_paths_others_could_change_are_refused(tmp_path, case):
    trusted = _helper()
    home, python = _tree(tmp_path)
    setting, value, kind = "criteo_dlrm_python", str(python), "executable"
    if case == "relative":
        value = "bin/python"
    elif case == "group-writable file":
        python.chmod(0o775)
    elif case == "world-writable dir":
        setting, value, kind = "criteo_dlrm_home", str(home), "directory"
        home.chmod(0o777)
    elif case == "foreign owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a file to another user")
        os.chown(python, 12345, 12345)
    elif case == "not executable":
        python.chmod(0o644)
    else:
        other = tmp_path / "writable"
        other.mkdir(mode=0o755)
        target = other / "python"
        target.write_text("#!/bin/sh\n")
        target.chmod(0o757)
        link = home / "bin" / "link"
        link.symlink_to(target)
        value = str(link)
    with pytest.raises(trusted.UntrustedPathError, match=setting):
        trusted.check_trusted_path(setting, value, kind)


def test_the_dag_checks_both_settings_before_running_anything():
    """The DAG's settings step calls the helper for both Variables (the DAG itself needs
    Airflow: tests/test_airflow_dag.py)."""
    text = (REPO / "pipeline" / "dags" / "criteo_dlrm_daily.py").read_text()
    body = text[text.index("def from_variables") : text.index("def argv")]
    assert "_check_code_settings(home, python)" in body
    for call in (
        'check_trusted_path("criteo_dlrm_home", str(home), "directory")',
        'check_trusted_path("criteo_dlrm_python", python, "executable")',
    ):
        assert call in text
