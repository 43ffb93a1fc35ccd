#!/usr/bin/env bash
# Builds the project's images with every version ARG taken from pyproject.toml.
#   docker/build.sh [--print] [--release] [preprocess|preprocess-gpu|train|serving|all] [extra docker build args...]
# Examples:
#   docker/build.sh all
#   docker/build.sh preprocess-gpu --build-arg RAPIDS_VERSION=25.08.0 \
#       --build-arg CUDA_BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
#   docker/build.sh --print train        # show the docker command instead of running it
# Images are tagged criteo-dlrm-<name>:<project version> (prefix with IMAGE_PREFIX=registry/…).
# DOCKER selects the client (docker, podman, "docker buildx build --push" users: DOCKER_BUILD).
# Base image digests and the RAPIDS jar's checksum come from docker/digests.env (DIGESTS=FILE
# for another); --release refuses to build an image whose base is not pinned by digest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DOCKER_BUILD="${DOCKER_BUILD:-${DOCKER:-docker} build}"
DIGESTS="${DIGESTS:-$ROOT/docker/digests.env}"
PRINT=0 RELEASE=0
while [[ "${1:-}" == --print || "${1:-}" == --release ]]; do
  [[ "$1" == --print ]] && PRINT=1 || RELEASE=1
  shift
done
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

# NAME=VALUE lines of the digests file (comments and blank lines skipped).
[[ -f "$DIGESTS" ]] || { echo "build.sh: $DIGESTS not found" >&2; exit 2; }
declare -A PINNED=()
while IFS= read -r line; do
  [[ "$line" =~ ^([A-Z0-9_]+)=(.*)$ ]] || continue
  name="${BASH_REMATCH[1]}" value="${BASH_REMATCH[2]}"
  [[ -z "$value" || "$value" =~ ^sha256:[0-9a-f]{64}$ || "$value" =~ ^[0-9a-f]{64}$ ]] \
    || { echo "build.sh: $DIGESTS: $name='$value' is neither empty nor a sha256" >&2; exit 2; }
  PINNED["$name"]="$value"
done <"$DIGESTS"

for image in "${IMAGES[@]}"; do
  dockerfile="$ROOT/docker/Dockerfile.$image"
  # The digest ARGs this Dockerfile declares, filled from the digests file.
  DIGEST_ARGS=()
  for name in $(sed -n 's/^ARG \([A-Z0-9_]*_\(DIGEST\|SHA256\)\)=.*/\1/p' "$dockerfile"); do
    value="${PINNED[$name]:-}"
    if [[ -z "$value" && $RELEASE -eq 1 && "$name" == *_DIGEST ]]; then
      echo "build.sh: --release: $name is empty in $DIGESTS: a release image's base must be pinned by digest" >&2
      exit 2
    fi
    [[ -n "$value" ]] && DIGEST_ARGS+=(--build-arg "$name=$value")
  done
  cmd=($DOCKER_BUILD -f "$dockerfile" -t "${IMAGE_PREFIX:-}criteo-dlrm-$image:$VERSION"
       "${BUILD_ARGS[@]}" ${DIGEST_ARGS[@]+"${DIGEST_ARGS[@]}"} "$@" "$ROOT")
  if [[ $PRINT -eq 1 ]]; then
    printf '%q ' "${cmd[@]}"; echo
  else
    echo "build.sh: ${cmd[*]}" >&2
    DOCKER_BUILDKIT=1 "${cmd[@]}"
  fi
done
