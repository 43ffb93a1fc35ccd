#!/usr/bin/env bash
# Registers (on) or unregisters (off) the CUDA toolkit's libcuda stub with the dynamic linker.
# Building and import-checking Horovod needs libcuda.so; at run time the NVIDIA container
# runtime mounts the real driver library, which the stub must not shadow.
set -euo pipefail
conf=/etc/ld.so.conf.d/zz-cuda-stubs.conf
case "${1:-}" in
  on)
    stub="$(find /usr/local/cuda*/ -name libcuda.so -path '*stubs*' | head -1)"
    [[ -n "$stub" ]] || { echo "no libcuda.so stub under /usr/local/cuda*" >&2; exit 1; }
    dirname "$stub" >"$conf" ;;
  off) rm -f "$conf" ;;
  *) echo "usage: $0 on|off" >&2; exit 2 ;;
esac
ldconfig
