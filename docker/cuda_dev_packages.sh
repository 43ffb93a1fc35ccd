#!/usr/bin/env bash
# Installs what building Horovod with NCCL needs on top of a TensorFlow GPU runtime image: nvcc,
# the CUDA runtime and driver headers/stubs, and NCCL, matching the CUDA release already in the
# image (from the image's own cuda-cudart package, or CUDA_PKG_SUFFIX such as 12-5 when given).
set -euo pipefail
suffix="${CUDA_PKG_SUFFIX:-}"
if [[ -z "$suffix" ]]; then
  suffix="$(dpkg-query -W -f='${Package}\n' 'cuda-cudart-[0-9]*' 2>/dev/null \
            | sed -n 's/^cuda-cudart-\([0-9]*-[0-9]*\)$/\1/p' | sort -V | tail -1)"
fi
[[ -n "$suffix" ]] || { echo "cannot tell the image's CUDA release: pass --build-arg CUDA_PKG_SUFFIX=12-5" >&2; exit 1; }
apt-get update
apt-get install -y --no-install-recommends "cuda-nvcc-$suffix" "cuda-cudart-dev-$suffix" \
  "cuda-driver-dev-$suffix" libnccl2 libnccl-dev
rm -rf /var/lib/apt/lists/*
