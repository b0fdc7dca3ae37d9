#!/usr/bin/env bash
# ferry bench kvstore [--dir DIR] [--jobs N] [--mib-per-size M] [--reps R] [--sizes LIST]: the KV
# store library (kvstore/kv_store.h) and its gRPC service (in-process, on loopback, through the
# sharding client) against fio in the same run, on the same directory, with the same block sizes
# (256 KiB, 1 MiB, 4 MiB), I/O mode (direct I/O unless the store fell back to buffered) and
# concurrency (N clients, default 4, vs fio --numjobs=N --iodepth=1 --ioengine=psync); see
# tools/bench/kvstore_bench.cc for what is measured and why fio --fdatasync=1 is the write
# baseline. First, kvstore_open_bench: how long opening takes per million objects (sealed
# segments whose footers are read; their record areas are sparse holes).
#   --dir DIR           the filesystem to measure: the bench works in a fresh directory under DIR
#                       and removes it afterwards (default: under ${TMPDIR:-/var/tmp}, or
#                       /var/tmp when that is a tmpfs)
#   --jobs N            concurrent clients (default 4)
#   --mib-per-size M    MiB the library (and the service) put per object size (default 1024), fio
#                       writes the same
#   --reps R            rounds of every measurement, the best counting (default 3)
#   --sizes LIST        object sizes, of 256k,1m,4m (default all; the JSON's goal figures need 1m)
set -euo pipefail
bench_bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
open_bin="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
shift 2
usage() {
  echo "usage: ferry bench kvstore [--dir DIR] [--jobs N] [--mib-per-size M] [--reps R]" \
    "[--sizes 256k,1m,4m]" >&2
  exit 2
}
base=""
jobs=4
mib=1024
reps=3
sizes=256k,1m,4m
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || usage
  case "$1" in
    --dir) base="$2" ;;
    --jobs) jobs="$2" ;;
    --mib-per-size) mib="$2" ;;
    --reps) reps="$2" ;;
    --sizes) sizes="$2" ;;
    *) usage ;;
  esac
  shift 2
done
fio=$(command -v fio) || { echo "kvstore: fio not found (./ferry setup installs it)" >&2; exit 1; }

if [[ -z "${base}" ]]; then
  base="${TMPDIR:-/var/tmp}"
  if [[ "$(stat -f -c %T "${base}")" == tmpfs && "${base}" != /var/tmp ]]; then
    echo "kvstore: ${base} is a tmpfs (memory, not a disk): using /var/tmp" >&2
    base=/var/tmp
  fi
elif [[ "${base}" != /* && -n "${BUILD_WORKING_DIRECTORY:-}" ]]; then
  base="${BUILD_WORKING_DIRECTORY}/${base}"  # `bazel run` starts elsewhere
fi
[[ -d "${base}" ]] || { echo "kvstore: --dir ${base}: not a directory" >&2; exit 1; }
if [[ "$(stat -f -c %T "${base}")" == tmpfs ]]; then
  echo "kvstore: NOTE: ${base} is a tmpfs: this measures memory, not a disk" >&2
fi
# At most one object size's two stores (library, service) and fio's files at a time, plus slack.
need_kb=$((mib * 1024 * 7 / 2))
avail_kb=$(df -k --output=avail "${base}" | tail -1 | tr -d ' ')
if [[ "${avail_kb}" -lt "${need_kb}" ]]; then
  echo "kvstore: ${base} has $((avail_kb / 1024)) MiB free, the bench needs $((need_kb / 1024))" >&2
  exit 1
fi
work=$(mktemp -d "${base}/ferry-kvbench.XXXXXX")
trap 'rm -rf "${work}"' EXIT
echo "kvstore: working in ${work} ($(stat -f -c %T "${work}"), $((avail_kb / 1024)) MiB free)" >&2
"${open_bin}" "${work}/open" 1000000 >"${work}/open.json"
"${bench_bin}" --dir "${work}" --jobs "${jobs}" --mib-per-size "${mib}" --reps "${reps}" \
  --sizes "${sizes}" --fio "${fio}" --open-json "${work}/open.json"
