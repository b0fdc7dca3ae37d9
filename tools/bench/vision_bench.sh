#!/usr/bin/env bash
# ferry bench vision: the vision tower and projector on the CPU backend (tools/bench/vision_bench.cc):
# images/s of a 224^2 and a 448^2 tower and the 448^2 tower's FLOP/s against the peak `ferry bench
# engine` quotes, measured in the same process. The two ~100M-parameter random-weight LLaVA-style
# models are written here by make_tiny_vlm --size bench (reference venv, a few seconds each) into
# a temporary directory, removed at exit.
#
#   ferry bench vision [--images N]     (N images per tower after one warm-up, the fastest counts; default 4)
set -euo pipefail
bench_bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
make_vlm="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
shift 2
: "${FERRY_REF_PYTHON:?run through ./ferry bench vision}"
images=4
while [[ $# -gt 0 ]]; do
  case "$1" in
    --images) images="$2"; shift 2 ;;
    *) echo "usage: ferry bench vision [--images N]" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT
for size in 224 448; do
  echo "vision: writing the ${size}^2 bench model (make_tiny_vlm --size bench)..." >&2
  "${FERRY_REF_PYTHON}" "${make_vlm}" "${work}/vlm${size}" --size bench --image_size "${size}" >&2
done
echo "vision: timing the towers and measuring the peak, $(nproc) threads..." >&2
"${bench_bin}" "${work}/vlm224" "${work}/vlm448" --images "${images}"
