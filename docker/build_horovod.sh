#!/usr/bin/env bash
# Builds Horovod from its sdist against the installed TensorFlow with NCCL (GPU collectives),
# Gloo and MPI, for the training image. Same two source fixes as scripts/install.sh:
#   1. TensorFlow moved its XLA headers: drop the XLA MPI ops (unused) from the build;
#   2. CMake 4 refuses Horovod's old cmake_minimum_required: cmake<4 (the caller puts the one
#      of docker/requirements/build-tools.lock on PATH) and CMAKE_POLICY_VERSION_MINIMUM=3.5.
# Usage (inside the image, from the project root): build_horovod.sh PYTHON
# Needs HOROVOD_VERSION (from pyproject.toml via docker/pins.py; the Dockerfile checks it) and
# HOROVOD_LOCK, the lock whose sha256 the sdist must have (pip refuses any other file).
# Then installs the rest of that lock (Horovod's runtime dependencies among it).
set -euo pipefail
PY="${1:?usage: build_horovod.sh PYTHON}"
: "${HOROVOD_VERSION:?HOROVOD_VERSION is not set (docker/build.sh passes it from pyproject.toml)}"
: "${HOROVOD_LOCK:?HOROVOD_LOCK is not set (docker/requirements/train.lock)}"
PIP=("$PY" -m pip --disable-pip-version-check --no-cache-dir)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" docker/pins.py locked "$HOROVOD_LOCK" horovod >"$work/horovod.txt"
grep -q "^horovod==$HOROVOD_VERSION " "$work/horovod.txt" \
  || { echo "build_horovod.sh: $HOROVOD_LOCK does not lock horovod==$HOROVOD_VERSION (docker/update_locks.sh)" >&2; exit 1; }
"${PIP[@]}" download -q --no-deps --no-binary :all: --require-hashes -r "$work/horovod.txt" -d "$work"
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"
sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"   # fix 1
command -v cmake >/dev/null || { echo "build_horovod.sh: cmake is not on PATH (build-tools.lock)" >&2; exit 1; }

# Links against libcuda.so: the caller registers the toolkit's stub first (docker/cuda_stubs.sh on).
(
  cd "$src"
  export CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" PATH="$(dirname "$PY"):$PATH"
  "${PIP[@]}" install -q --no-build-isolation --no-deps .
)
# Every other package (Horovod's runtime dependencies included) from the same lock: Horovod and
# the base image's TensorFlow are already there, so pip keeps them.
"${PIP[@]}" install -q --require-hashes --no-deps -r "$HOROVOD_LOCK"

check="$("$(dirname "$PY")/horovodrun" --check-build)"
echo "$check"
for feature in TensorFlow NCCL Gloo MPI; do
  grep -q "\[X\] $feature" <<<"$check" || { echo "Horovod was built without $feature" >&2; exit 1; }
done
