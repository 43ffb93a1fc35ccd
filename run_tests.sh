#!/usr/bin/env bash
# The test command of the README and of CI: installs what is missing, checks the import layering
# (pyproject's [tool.importlinter]), then runs the whole suite.
# Extra arguments go to pytest (for example: ./run_tests.sh -k thresholds -x).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
# A broken layering contract fails the run before any test starts.
"$ROOT/.venv/bin/lint-imports"
set +e
"$ROOT/.venv/bin/python" -m pytest "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "run_tests.sh: pytest collected no tests; that is a failure, not a pass" >&2
  exit 1
fi
exit $status
