#!/usr/bin/env bash
# Builds the project's images with every version ARG taken from pyproject.toml.
#   docker/build.sh [--print] [preprocess|preprocess-gpu|train|serving|all] [extra docker build args...]
# Examples:
#   docker/build.sh all
#   docker/build.sh preprocess-gpu --build-arg RAPIDS_VERSION=25.08.0 \
#       --build-arg CUDA_BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
#   docker/build.sh --print train        # show the docker command instead of running it
# Images are tagged criteo-dlrm-<name>:<project version> (prefix with IMAGE_PREFIX=registry/…).
# DOCKER selects the client (docker, podman, "docker buildx build --push" users: DOCKER_BUILD).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DOCKER_BUILD="${DOCKER_BUILD:-${DOCKER:-docker} build}"
PRINT=0
if [[ "${1:-}" == "--print" ]]; then PRINT=1; shift; fi
TARGET="${1:-all}"
[[ $# -gt 0 ]] && shift

case "$TARGET" in
  all) IMAGES=(preprocess preprocess-gpu train serving) ;;
  preprocess|preprocess-gpu|train|serving) IMAGES=("$TARGET") ;;
  *) echo "build.sh: unknown image '$TARGET' (preprocess, preprocess-gpu, train, serving, all)" >&2; exit 2 ;;
esac

# Not `mapfile < <(...)`: a failing pins.py there would go unnoticed (set -e does not see it).
pins_out="$("$PYTHON" "$ROOT/docker/pins.py" build-args)" \
  || { echo "build.sh: $PYTHON docker/pins.py build-args failed (needs Python >= 3.11; set PYTHON=...)" >&2; exit 2; }
mapfile -t PINS <<<"$pins_out"
BUILD_ARGS=()
VERSION=""
for pin in "${PINS[@]}"; do
  BUILD_ARGS+=(--build-arg "$pin")
  [[ "$pin" == PROJECT_VERSION=* ]] && VERSION="${pin#PROJECT_VERSION=}"
done
[[ -n "$VERSION" ]] || { echo "build.sh: docker/pins.py build-args gave no PROJECT_VERSION" >&2; exit 2; }

for image in "${IMAGES[@]}"; do
  cmd=($DOCKER_BUILD -f "$ROOT/docker/Dockerfile.$image" -t "${IMAGE_PREFIX:-}criteo-dlrm-$image:$VERSION"
       "${BUILD_ARGS[@]}" "$@" "$ROOT")
  if [[ $PRINT -eq 1 ]]; then
    printf '%q ' "${cmd[@]}"; echo
  else
    echo "build.sh: ${cmd[*]}" >&2
    DOCKER_BUILDKIT=1 "${cmd[@]}"
  fi
done
