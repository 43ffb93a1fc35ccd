#!/usr/bin/env bash
# Builds Horovod from its sdist against the installed TensorFlow with NCCL (GPU collectives),
# Gloo and MPI, for the training image. Same two source fixes as scripts/install.sh:
#   1. TensorFlow moved its XLA headers: drop the XLA MPI ops (unused) from the build;
#   2. CMake 4 refuses Horovod's old cmake_minimum_required: pin cmake<4 and set
#      CMAKE_POLICY_VERSION_MINIMUM=3.5.
# Usage (inside the image, from the project root): build_horovod.sh PYTHON
# Needs HOROVOD_VERSION (from pyproject.toml via docker/pins.py; the Dockerfile checks it).
set -euo pipefail
PY="${1:?usage: build_horovod.sh PYTHON}"
: "${HOROVOD_VERSION:?HOROVOD_VERSION is not set (docker/build.sh passes it from pyproject.toml)}"
PIP=("$PY" -m pip --disable-pip-version-check --no-cache-dir)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${PIP[@]}" download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"
sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"   # fix 1
"${PIP[@]}" install -q "cmake<4"                                        # fix 2 (with the env below)

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
"${PIP[@]}" install -q cloudpickle cffi packaging

check="$("$(dirname "$PY")/horovodrun" --check-build)"
echo "$check"
for feature in TensorFlow NCCL Gloo MPI; do
  grep -q "\[X\] $feature" <<<"$check" || { echo "Horovod was built without $feature" >&2; exit 1; }
done
