#!/usr/bin/env bash
# The main job: with no arguments, the embedded default end to end (generate, preprocess,
# convert, train on 2 ranks, eval). All logic lives in `python -m pipeline`; see --help.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$ROOT/scripts/install.sh"
exec "$ROOT/.venv/bin/python" -m pipeline "$@"
