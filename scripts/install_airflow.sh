#!/usr/bin/env bash
# Creates the virtualenv that runs Apache Airflow for pipeline/dags/criteo_dlrm_daily.py.
#
#   scripts/install_airflow.sh            # install (fast when already done)
#   scripts/install_airflow.sh --freeze   # resolve AIRFLOW_VERSION afresh, rewrite the constraints
#
# Airflow gets its own virtualenv (default .venv-airflow, CRITEO_DLRM_AIRFLOW_VENV overrides):
# its hundred-odd pinned dependencies must not move the product's (.venv, scripts/install.sh),
# and the DAG calls the product's Python as a child process, so neither imports the other.
# Every version comes from scripts/airflow-constraints-<python>.txt, Airflow's constraints
# approach: the whole resolved set, written by --freeze from an install that passed
# tests/test_airflow_dag.py. The wheels are kept per machine under
# ${CRITEO_DLRM_CACHE:-~/.cache/criteo-dlrm}/wheels, keyed by the constraints' content, so a
# new virtualenv installs from disk without the network; a stamp keyed on the constraints and
# this script skips everything when the virtualenv is already right.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CRITEO_DLRM_AIRFLOW_VENV:-$ROOT/.venv-airflow}"
CACHE="${CRITEO_DLRM_CACHE:-$HOME/.cache/criteo-dlrm}"
PYTHON_BIN="${PYTHON:-}"
# The release --freeze resolves; an install takes the version from the constraints file.
FREEZE_VERSION="${AIRFLOW_VERSION:-3.3.2}"
log() { printf '[install_airflow] %s\n' "$*" >&2; }
die() { printf '[install_airflow] ERROR: %s\n' "$*" >&2; exit 1; }

FREEZE=0
case "${1:-}" in
  "") ;;
  --freeze) FREEZE=1 ;;
  *) die "unknown argument '$1' (only --freeze)" ;;
esac

constraints_of() { echo "$ROOT/scripts/airflow-constraints-$1.txt"; }
minor_of() { "$1" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")'; }

pick_python() {
  if [[ -n "$PYTHON_BIN" ]]; then echo "$PYTHON_BIN"; return; fi
  # A Python with a constraints file first (python3.11: the product's own), then any 3.10-3.13
  # (only --freeze can use one without a file).
  local candidate
  for candidate in python3.11 python3.12 python3.10 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else 1)' &&
       { [[ $FREEZE -eq 1 ]] || [[ -f "$(constraints_of "$(minor_of "$candidate")")" ]]; }; then
      echo "$candidate"; return
    fi
  done
  die "need a Python 3.10-3.13 with a constraints file in scripts/ (python3.11 has one); set PYTHON=/path/to/python"
}

if [[ -x "$VENV/bin/python" ]]; then
  PY_MINOR="$(minor_of "$VENV/bin/python")"
else
  PY="$(pick_python)"
  PY_MINOR="$(minor_of "$PY")"
fi
CONSTRAINTS="$(constraints_of "$PY_MINOR")"

stamp_value() {
  cat "$CONSTRAINTS" "$ROOT/scripts/install_airflow.sh" | sha256sum | cut -c1-16
}

STAMP="$VENV/.criteo-dlrm-airflow-installed"
if [[ $FREEZE -eq 0 && -f "$CONSTRAINTS" && -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_value)" &&
      -x "$VENV/bin/airflow" ]]; then
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# Best effort: with the wheels cached, the install below needs no network, and neither must this.
"${PIP[@]}" install -q --upgrade "pip>=24" "setuptools>=68" wheel 2>/dev/null ||
  log "pip, setuptools and wheel not upgraded (no network?); going on with the virtualenv's own"

if [[ $FREEZE -eq 1 ]]; then
  log "resolving apache-airflow==$FREEZE_VERSION afresh on Python $PY_MINOR"
  "${PIP[@]}" install -q "apache-airflow==$FREEZE_VERSION"
  {
    echo "# The resolved set of apache-airflow==$FREEZE_VERSION on Python $PY_MINOR, written by"
    echo "# scripts/install_airflow.sh --freeze; every install of Airflow for the DAG uses it."
    "${PIP[@]}" freeze --exclude-editable | grep -v -E '^(pip|setuptools|wheel)=='
  } >"$CONSTRAINTS.tmp"
  mv "$CONSTRAINTS.tmp" "$CONSTRAINTS"
  log "wrote $CONSTRAINTS ($(grep -c '==' "$CONSTRAINTS") pins)"
fi

[[ -f "$CONSTRAINTS" ]] || die "no $CONSTRAINTS: Python $PY_MINOR has no pinned set; use python3.11 (PYTHON=...), or write one with --freeze"
AIRFLOW_PIN="$(grep -E '^apache-airflow==' "$CONSTRAINTS" || true)"
[[ -n "$AIRFLOW_PIN" ]] || die "$CONSTRAINTS pins no apache-airflow"

KEY="$(sha256sum "$CONSTRAINTS" | cut -c1-12)"
WHEELS="$CACHE/wheels/airflow-${AIRFLOW_PIN#apache-airflow==}-py$PY_MINOR-$(uname -m)-$KEY"
if [[ ! -f "$WHEELS/.complete" ]]; then
  log "downloading and building the wheels of $AIRFLOW_PIN into $WHEELS (once per machine)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "${PIP[@]}" wheel -q -w "$work" -c "$CONSTRAINTS" "$AIRFLOW_PIN"
  mkdir -p "$(dirname "$WHEELS")"
  rm -rf "$WHEELS"
  mv "$work" "$WHEELS"
  trap - EXIT
  touch "$WHEELS/.complete"
fi
log "installing $AIRFLOW_PIN from $WHEELS"
"${PIP[@]}" install -q --no-index --find-links "$WHEELS" -c "$CONSTRAINTS" "$AIRFLOW_PIN"

# Imported in a throw-away AIRFLOW_HOME: Airflow writes its default config into the one it is given.
probe_home="$(mktemp -d)"
VERSION="$(AIRFLOW_HOME="$probe_home" "$VENV/bin/python" -c \
  'import importlib.metadata as m, airflow.sdk; print(m.version("apache-airflow"))')" \
  || { rm -rf "$probe_home"; die "airflow does not import in $VENV"; }
rm -rf "$probe_home"
[[ "$VERSION" == "${AIRFLOW_PIN#apache-airflow==}" ]] || die "airflow version says '$VERSION', the constraints pin $AIRFLOW_PIN"
stamp_value >"$STAMP"
log "Airflow $VERSION ready: $VENV/bin/airflow"
