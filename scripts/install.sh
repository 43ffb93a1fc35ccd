#!/usr/bin/env bash
# Creates .venv with the project's pinned packages and a Horovod built against TensorFlow + Gloo.
#
# Idempotent and fast when already done: a stamp keyed on pyproject.toml and this script skips
# everything. The Horovod wheel (a ~10-minute build on 2 cores) is cached per machine under
# ${CRITEO_DLRM_CACHE:-~/.cache/criteo-dlrm}, keyed by Horovod, TensorFlow and Python versions.
# Every version comes from pyproject.toml: this script holds none of its own.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CRITEO_DLRM_VENV:-$ROOT/.venv}"
CACHE="${CRITEO_DLRM_CACHE:-$HOME/.cache/criteo-dlrm}"
PYTHON_BIN="${PYTHON:-}"
log() { printf '[install] %s\n' "$*" >&2; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

pick_python() {
  if [[ -n "$PYTHON_BIN" ]]; then echo "$PYTHON_BIN"; return; fi
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)'; then
      echo "$candidate"; return
    fi
  done
  die "need Python 3.10-3.12 (TensorFlow 2.21 wheels); set PYTHON=/path/to/python"
}

stamp_value() {
  cat "$ROOT/pyproject.toml" "$ROOT/scripts/install.sh" | sha256sum | cut -c1-16
}

# Azurite, the Azure Storage emulator the cloud tests run against (tests/cloud_emulators.py):
# a Node program from the npm registry at the versions scripts/azurite/package-lock.json pins,
# installed in .tools/azurite (npm's own cache keeps the downloads). Quick when that lock is
# the one installed; without npm, a warning (the Azure tests then skip, saying so).
install_azurite() {
  local tools="$ROOT/.tools/azurite" lock="$ROOT/scripts/azurite/package-lock.json"
  if cmp -s "$lock" "$tools/package-lock.json" && [[ -x "$tools/node_modules/.bin/azurite-blob" ]]; then
    return
  fi
  if ! command -v npm >/dev/null 2>&1; then
    log "WARNING: npm not found: Azurite is not installed and the Azure storage tests will skip (Node.js 18+ brings npm)"
    return
  fi
  log "installing Azurite into $tools"
  mkdir -p "$tools"
  cp "$ROOT/scripts/azurite/package.json" "$lock" "$tools/"
  (cd "$tools" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci of Azurite failed in $tools"
}

# The Spark driver JVM's class-data archive (spark_jobs/build_archive.py, docs/spark_jobs.md):
# built once per Java build and set of Spark jars, into the venv; a second or so when it is
# there. Without it jobs start as before, so a failed build is a warning.
build_class_archive() {
  (cd "$ROOT" && "$VENV/bin/python" -m spark_jobs.build_archive >/dev/null) ||
    log "WARNING: the Spark class-data archive was not built: Spark jobs start without it"
}

STAMP="$VENV/.criteo-dlrm-installed"
# --record-installed: the environment was installed another way (the train image's build stage,
# from hash-pinned locks, docker/Dockerfile.train): only check Horovod is there and stamp it.
if [[ "${1:-}" == "--record-installed" ]]; then
  [[ -x "$VENV/bin/horovodrun" ]] || die "--record-installed: $VENV has no horovodrun"
  stamp_value >"$STAMP"
  log "recorded $VENV as installed"
  exit 0
fi
install_azurite
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_value)" && -x "$VENV/bin/horovodrun" ]]; then
  build_class_archive
  exit 0
fi

command -v java >/dev/null 2>&1 || die "Java 17+ is required by PySpark 4 (apt-get install openjdk-17-jre-headless)"

if [[ ! -x "$VENV/bin/python" ]]; then
  PY="$(pick_python)"
  log "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24" "setuptools>=68" wheel

log "installing pinned packages from pyproject.toml"
"${PIP[@]}" install -q -e "$ROOT[dev,object-store]"

read -r HOROVOD_PIN < <("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as fh:
    project = tomllib.load(fh)["project"]
print(next(p for p in project["optional-dependencies"]["distributed"] if p.startswith("horovod==")))
PY
)
HOROVOD_VERSION="${HOROVOD_PIN#horovod==}"
TF_VERSION="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow"))')"
PY_TAG="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
WHEEL_DIR="$CACHE/wheels/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG-$(uname -m)"

build_horovod_wheel() {
  local work; work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION with Gloo (about 10 minutes, once per machine)"
  "${PIP[@]}" download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
  tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
  local src="$work/horovod-$HOROVOD_VERSION"
  # TensorFlow moved its XLA headers; the XLA MPI ops do not build and are not needed with Gloo.
  sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  "${PIP[@]}" install -q "cmake<4" 2>/dev/null || true
  (
    cd "$src"
    export CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      MAKEFLAGS="-j$(nproc)" PATH="$VENV/bin:$PATH"
    "${PIP[@]}" wheel -q --no-build-isolation --no-deps -w "$work/dist" .
  )
  mkdir -p "$WHEEL_DIR"
  mv "$work"/dist/horovod-*.whl "$WHEEL_DIR/"
}

if ! "$VENV/bin/python" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    build_horovod_wheel
  else
    log "using cached Horovod wheel from $WHEEL_DIR"
  fi
  "${PIP[@]}" install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
  # Horovod's own runtime dependencies (cloudpickle, psutil, pyyaml, packaging, cffi) without touching TF.
  "${PIP[@]}" install -q cloudpickle cffi packaging
fi

CHECK="$("$VENV/bin/horovodrun" --check-build 2>&1)" || die "horovodrun --check-build failed: $CHECK"
grep -q '\[X\] TensorFlow' <<<"$CHECK" || die "Horovod was not built with TensorFlow:"$'\n'"$CHECK"
grep -q '\[X\] Gloo' <<<"$CHECK" || die "Horovod was not built with Gloo:"$'\n'"$CHECK"
log "Horovod $HOROVOD_VERSION reports TensorFlow and Gloo"

stamp_value >"$STAMP"
build_class_archive
log "environment ready: $VENV"
