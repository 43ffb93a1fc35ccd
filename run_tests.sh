#!/usr/bin/env bash
# The test command of the README and of CI: installs what is missing, then the static checks
# (the import layering of pyproject's [tool.importlinter], ruff's lint and format, mypy), then
# the whole suite.
#   ./run_tests.sh            everything (what CI runs: .ci/run)
#   ./run_tests.sh --quick    the static checks and the unit tier only: no Spark, no horovodrun,
#                             no test marked slow (pyproject's markers), for the inner loop
# Other arguments go to pytest (for example: ./run_tests.sh -k thresholds -x).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
QUICK=0
if [[ "${1:-}" == "--quick" ]]; then
  QUICK=1
  shift
fi
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
# Each check fails the run before any test starts: a broken layering contract, a lint finding,
# an unformatted file, a type error.
"$ROOT/.venv/bin/lint-imports"
"$ROOT/.venv/bin/ruff" check --no-cache .
"$ROOT/.venv/bin/ruff" format --no-cache --check .
"$ROOT/.venv/bin/mypy"
# The project's bytecode, written once: with PYTHONDONTWRITEBYTECODE set (as on these
# machines) every process the suite starts would otherwise compile the modules it imports.
"$ROOT/.venv/bin/python" -m compileall -q -j 0 dlrm_contracts spark_jobs converters trainer pipeline >/dev/null
TIER=()
if [[ $QUICK -eq 1 ]]; then
  TIER=(-m "not spark and not horovod and not slow")
fi
set +e
# Two workers (pytest-xdist), each given whole files so that a module's fixtures run once, the
# heavy files first (tests/conftest.py); `-n 0` among the arguments runs in this one process.
"$ROOT/.venv/bin/python" -m pytest -n 2 --dist loadfile --no-loadscope-reorder "${TIER[@]}" "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "run_tests.sh: pytest collected no tests; that is a failure, not a pass" >&2
  exit 1
fi
exit $status
