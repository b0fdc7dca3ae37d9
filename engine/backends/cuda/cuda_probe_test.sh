#!/usr/bin/env bash
# Runs ferry-cuda-probe. Without a GPU it must say so and exit 0; with one, every device's
# self-check (sm_90 kernel + cuBLAS GEMM against the CPU) must pass.
set -uo pipefail
out=$("$1" 2>&1)
rc=$?
echo "$out"
if [[ $rc -ne 0 ]]; then
  echo "ferry-cuda-probe exited $rc" >&2
  exit 1
fi
if grep -q "^cuda: no usable device" <<<"$out"; then
  exit 0
fi
grep -q "self-check passed" <<<"$out" && ! grep -q "FAILED" <<<"$out"
