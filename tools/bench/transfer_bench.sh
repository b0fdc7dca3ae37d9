#!/usr/bin/env bash
# ferry bench transfer [--quick] [--sizes LIST] [--min-seconds S] [--rounds R] [--perftest-runs N]
#                      [--no-grpc]
# The KV transport (services/transfer/kv_transport.h) between two processes on this machine, against
# ucx_perftest in the same run with the same UCX_TLS, sizes and error mode, and memcpy.
#
# For UCX_TLS=tcp and UCX_TLS=shm: transfer_bench (tools/bench/transfer_bench.cc: an initiator
# that starts its own target process) measures, per size, puts of one segment per transfer
# (batch 1), of 64 segments per transfer (batch 64) and gets of one segment, and the
# request-shaped transfer (64 scattered blocks of 1,474,560 bytes, the bf16 KV of a 4,096-token
# SmolLM2-135M request) against the same bytes as one segment, and the same transfer as a
# hand-off meets it (one at a time after the transport idled, blocks not in any cache). Then ucx_perftest -t ucp_put_bw,
# server and client on 127.0.0.1, same UCX_TLS, -e (endpoints with peer error handling, as the
# transport's; where UCX refuses it, as for shm in UCX 1.13, without), per size, ~0.5 s runs. Then
# the gRPC transport on loopback for reference (no perftest equivalent); memcpy of each size
# (single thread) first. Prints a table per transport, the goals, then one JSON line.
#   --quick           sizes 4k,256k,1m,64m, 0.1 s per point, one round, one perftest run
#   --sizes LIST      transfer sizes (default 4k,16k,64k,256k,1m,4m,16m,64m)
#   --min-seconds S   seconds per measured round of each of our points (default 0.3)
#   --rounds R        rounds per point of ours; the best counts (default 2)
#   --perftest-runs N ucx_perftest runs per point; the best counts (default 3)
#   --no-grpc         skip the gRPC reference rows
# MB/s is 10^6 bytes per second everywhere; ucx_perftest prints MiB/s ("MB/s" in its header), so
# its figure is recomputed here as bytes over its per-iteration time.
set -euo pipefail
bench_bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
shift
usage() {
  echo "usage: ferry bench transfer [--quick] [--sizes 4k,...,64m] [--min-seconds S]" \
    "[--rounds R] [--perftest-runs N] [--no-grpc]" >&2
  exit 2
}
sizes=4k,16k,64k,256k,1m,4m,16m,64m
min_seconds=0.3
rounds=2
perftest_runs=3
grpc=1
quick=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick)
      quick=1; sizes=4k,256k,1m,64m; min_seconds=0.1; rounds=1; perftest_runs=1; shift; continue ;;
    --no-grpc) grpc=0; shift; continue ;;
  esac
  [[ $# -ge 2 ]] || usage
  case "$1" in
    --sizes) sizes="$2" ;;
    --min-seconds) min_seconds="$2" ;;
    --rounds) rounds="$2" ;;
    --perftest-runs) perftest_runs="$2" ;;
    *) usage ;;
  esac
  shift 2
done
perftest=$(command -v ucx_perftest) ||
  { echo "transfer: ucx_perftest not found (./ferry setup installs ucx-utils)" >&2; exit 1; }

started=$(date +%s.%N)
read -r load_start _ </proc/loadavg
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-transferbench.XXXXXX")
results="${work}/results.txt"  # every figure, one "result ..." or "error ..." line each
: >"${results}"
server_pid=""
client_pid=""
bench_pid=""
cleanup() {
  # Only what this script started, by pid (each a `timeout`, which passes the signal on).
  local pid
  for pid in "${server_pid}" "${client_pid}" "${bench_pid}"; do
    if [[ -n "${pid}" ]]; then kill "${pid}" 2>/dev/null || true; fi
  done
  # FERRY_TRANSFER_BENCH_KEEP=FILE keeps the raw result lines (for debugging the parsing).
  if [[ -n "${FERRY_TRANSFER_BENCH_KEEP:-}" ]]; then cp "${results}" "${FERRY_TRANSFER_BENCH_KEEP}"; fi
  rm -rf "${work}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Byte counts of the size list ("4k" -> 4096).
to_bytes() {
  local s=$1 n unit=1
  case "${s}" in
    *[kK]) unit=1024 ;;
    *[mM]) unit=1048576 ;;
    *[gG]) unit=1073741824 ;;
  esac
  n=${s%[kKmMgG]}
  [[ "${n}" =~ ^[0-9]+$ ]] || { echo "transfer: bad size '${s}'" >&2; exit 2; }
  echo $((n * unit))
}
size_bytes=()
IFS=, read -r -a size_list <<<"${sizes}"
for s in "${size_list[@]}"; do size_bytes+=("$(to_bytes "${s}")"); done
[[ ${#size_bytes[@]} -gt 0 ]] || usage

# One of our runs: result lines into the results file, progress on stderr; bounded in time.
run_ours() {
  local rc=0
  timeout 300 "${bench_bin}" --sizes "${sizes}" --min_seconds "${min_seconds}" \
    --rounds "${rounds}" "$@" >>"${results}" &
  bench_pid=$!
  wait "${bench_pid}" || rc=$?
  bench_pid=""
  return "${rc}"
}

port_in_use() {
  local hex
  hex=$(printf ':%04X ' "$1")
  grep -q "${hex}" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
# Whether some socket listens on TCP port $1 (state 0A in /proc/net/tcp{,6}).
listening() {
  local hex
  hex=$(printf '%04X' "$1")
  awk -v p="${hex}" '$4 == "0A" && substr($2, length($2) - 3) == p {found = 1} END {exit !found}' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
pick_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 40000))
    if ! port_in_use "${p}"; then
      echo "${p}"
      return 0
    fi
  done
  echo "transfer: no free TCP port found for ucx_perftest" >&2
  return 1
}

# perftest_once TLS SIZE ITERS WARMUP ERRFLAG: one ucx_perftest server + client run on 127.0.0.1.
# Writes "ok OVERALL_USEC_PER_ITER CLIENT_WALL_SECONDS" or "fail MESSAGE" to ${work}/perftest.
# Runs in this shell (not a subshell), so that the EXIT trap knows the pids to stop.
perftest_once() {
  local tls=$1 size=$2 iters=$3 warmup=$4 eflag=$5 port out srv line msg t0 t1 res
  res="${work}/perftest"
  port=$(pick_port) || { echo "fail no free port" >"${res}"; return 0; }
  srv="${work}/perftest_server.log"
  out="${work}/perftest_client.log"
  local args=(-t ucp_put_bw -s "${size}" -n "${iters}" -w "${warmup}" -p "${port}" -f)
  [[ -z "${eflag}" ]] || args+=("${eflag}")
  UCX_TLS="${tls}" timeout 300 "${perftest}" "${args[@]}" >"${srv}" 2>&1 &
  server_pid=$!
  # Until the server listens (its own output is block-buffered into the file, so not from that).
  for _ in $(seq 500); do
    listening "${port}" && break
    kill -0 "${server_pid}" 2>/dev/null || break
    sleep 0.01
  done
  t0=$(date +%s.%N)
  UCX_TLS="${tls}" timeout 120 "${perftest}" 127.0.0.1 "${args[@]}" >"${out}" 2>&1 &
  client_pid=$!
  wait "${client_pid}" || true
  client_pid=""
  t1=$(date +%s.%N)
  for _ in $(seq 100); do
    kill -0 "${server_pid}" 2>/dev/null || break
    sleep 0.1
  done
  kill "${server_pid}" 2>/dev/null || true
  wait "${server_pid}" 2>/dev/null || true
  server_pid=""
  # The final line: iterations; usec p50, average, overall; MiB/s average, overall; msg/s x2.
  line=$(awk 'NF == 8 && $1 ~ /^[0-9]+$/ {l = $0} END {print l}' "${out}")
  if [[ -n "${line}" ]]; then
    awk -v a="${t0}" -v b="${t1}" '{printf "ok %s %.3f\n", $4, b - a}' <<<"${line}" >"${res}"
  else
    # awk reads the logs itself: a grep | head pipeline fails under pipefail (SIGPIPE, or no match).
    msg=$(awk '/ERROR/ && !/Failed to|failed:/ { sub(/.*UCX  ERROR */, ""); sub(/^ */, ""); print; exit }' \
      "${out}" "${srv}")
    [[ -n "${msg}" ]] || msg=$(awk '/ERROR/ { sub(/.*ERROR */, ""); print; exit }' "${out}" "${srv}")
    echo "fail ${msg:-ucx_perftest printed no result (timed out?)}" >"${res}"
  fi
}

# perftest TLS SIZE ERRFLAG GUESS_MB_S: ucx_perftest's put bandwidth for one size, from its
# "overall" time per iteration (SIZE / usec = 10^6 bytes/s; the MB/s it prints are MiB/s). A first
# run sized for a tenth of the target time (0.5 s) at the guessed rate (ours) is a probe: under
# half the target it does not count, and every later run is sized from the last one for the target
# (so that perftest's slow cases, multi-MiB puts over tcp, stay short); best of --perftest-runs
# counted runs (over tcp, one run to the next of the same size can differ by 5x). Appends a result
# (or error) line; returns 1 on failure.
perftest() {
  local tls=$1 size=$2 eflag=$3 guess=$4 mode=none target=0.5 r=0 probe=1 iters w
  local status usec wall rest secs best_usec="" best_iters="" best_wall=""
  [[ -z "${eflag}" ]] || mode=peer
  [[ ${quick} -eq 0 ]] || target=0.15
  iters=$(awk -v g="${guess}" -v s="${size}" -v t="${target}" \
    'BEGIN {n = int(g * 1e6 * t / 10 / s); if (n < 2) n = 2; if (n > 20000000) n = 20000000; print n}')
  while [[ ${r} -lt ${perftest_runs} ]]; do
    w=$((iters / 10 > 1000 ? 1000 : (iters / 10 < 1 ? 1 : iters / 10)))
    perftest_once "${tls}" "${size}" "${iters}" "${w}" "${eflag}"
    read -r status usec wall rest <"${work}/perftest"
    if [[ "${status}" != ok ]]; then
      echo "error kind=perftest tls=${tls} errmode=${mode} size=${size} message=${usec} ${wall} ${rest}" \
        >>"${results}"
      return 1
    fi
    secs=$(awk -v u="${usec}" -v n="${iters}" 'BEGIN {printf "%.6f", u * n / 1e6}')
    if [[ ${probe} -eq 0 ]] || awk -v s="${secs}" -v t="${target}" 'BEGIN {exit !(s >= t / 2)}'
    then
      r=$((r + 1))
      if [[ -z "${best_usec}" ]] || awk -v a="${usec}" -v b="${best_usec}" 'BEGIN {exit !(a < b)}'
      then
        best_usec=${usec}
        best_iters=${iters}
        best_wall=${wall}
      fi
    fi
    probe=0
    # perftest's slow cases (multi-MiB puts over tcp): one counted run is enough to show them.
    if [[ ${r} -ge 1 ]] && awk -v s="${secs}" 'BEGIN {exit !(s > 2)}'; then break; fi
    iters=$(awk -v n="${iters}" -v s="${secs}" -v t="${target}" 'BEGIN {
      m = int(n * t / (s > 1e-4 ? s : 1e-4)) + 1; if (m < 2) m = 2; if (m > 20000000) m = 20000000
      print m}')
  done
  awk -v tls="${tls}" -v e="${mode}" -v s="${size}" -v u="${best_usec}" -v n="${best_iters}" \
    -v wall="${best_wall}" 'BEGIN {
      printf "result kind=perftest tls=%s transport=perftest errmode=%s case=perftest " \
        "segment_bytes=%d segments=1 transfers=%d seconds=%.6f mb_s=%.2f us_per_transfer=%s " \
        "client_wall_s=%s\n", tls, e, s, n, u * n / 1e6, s / u, u, wall
      printf "transfer: ucx_perftest %s errmode %s %d B: %.1f MB/s (%d iterations, %.2f s; " \
        "client process %.2f s)\n", tls, e, s, s / u, n, u * n / 1e6, wall > "/dev/stderr"
    }' >>"${results}"
}

# Our MB/s for a case and size on a transport, from the results so far (empty if none).
ours_mb_s() {
  awk -v k="$1" -v t="$2" -v c="$3" -v s="$4" '$1 == "result" {
      delete kv; for (i = 2; i <= NF; i++) { j = index($i, "="); kv[substr($i, 1, j - 1)] = substr($i, j + 1) }
      if (kv["kind"] == k && kv["tls"] == t && kv["case"] == c && kv["segment_bytes"] == s) v = kv["mb_s"]
    } END {print v}' "${results}"
}

# Progress on stderr, with the seconds since the start.
phase() {
  awk -v a="${started}" -v b="$(date +%s.%N)" -v m="$*" 'BEGIN {printf "transfer: [%.0f s] %s\n", b - a, m}' >&2
}

phase "memcpy"
run_ours --memcpy_only || echo "error kind=memcpy tls=- message=memcpy run failed" >>"${results}"

for tls in tcp shm; do
  phase "ucx over ${tls}"
  export UCX_TLS="${tls}"  # also what the transport's --ucx_tls says
  run_ours --kind ucx --ucx_tls "${tls}" ||
    grep -q "^error kind=ucx tls=${tls}" "${results}" ||
    echo "error kind=ucx tls=${tls} message=transfer_bench exited with an error" >>"${results}"
  # ucx_perftest, same UCX_TLS and error mode (-e: peer error handling). UCX 1.13 refuses -e
  # where no transport of UCX_TLS has a peer failure handler (shm: sysv and posix have none, cma
  # has no active messages); the transport then connects without UCX error handling, and so does
  # perftest here (the table says so). A failure at one size is that size's, not the mode's.
  phase "ucx_perftest over ${tls}"
  eflag=-e
  for b in "${size_bytes[@]}"; do
    guess=$(ours_mb_s ucx "${tls}" put_b64 "${b}")
    [[ -n "${guess}" ]] || guess=$([[ "${tls}" == tcp ]] && echo 1000 || echo 10000)
    if ! perftest "${tls}" "${b}" "${eflag}" "${guess}" && [[ "${eflag}" == -e ]] &&
      grep -q "^error kind=perftest tls=${tls} errmode=peer .*no peer failure handler" \
        "${results}"; then
      eflag=""
      perftest "${tls}" "${b}" "" "${guess}" || true
    fi
  done
done

unset UCX_TLS

if [[ ${grpc} -eq 1 ]]; then
  phase "grpc on loopback"
  run_ours --kind grpc || grep -q "^error kind=grpc" "${results}" ||
    echo "error kind=grpc tls=- message=transfer_bench exited with an error" >>"${results}"
fi

phase "done"
elapsed=$(awk -v a="${started}" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')

# The report: a table per transport, the goals, then one JSON line.
read -r load_end _ </proc/loadavg
awk -v sizes="$(IFS=,; echo "${size_bytes[*]}")" -v elapsed="${elapsed}" -v quick="${quick}" \
  -v load_start="${load_start}" -v load_end="${load_end}" -v cores="$(nproc)" \
  -v min_seconds="${min_seconds}" -v rounds="${rounds}" -v pruns="${perftest_runs}" '
function label(b) {
  if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
  if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
  return b " B"
}
function key(b) {
  if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) "m"
  if (b >= 1024 && b % 1024 == 0) return (b / 1024) "k"
  return b ""
}
function has(k, t, c, s) { return ((k, t, c, s) in mb) }
function get(k, t, c, s) { return has(k, t, c, s) ? mb[k, t, c, s] : "" }
function f1(x) { return x == "" ? "-" : sprintf("%.1f", x) }
function f2(x) { return x == "" ? "-" : sprintf("%.2f", x) }
function fus(x) { return x == "" ? "-" : sprintf(x < 10 ? "%.3f" : "%.1f", x) }
function ratio(a, b) { return (a != "" && b != "" && b > 0) ? a / b : "" }
function num(x, d) { return x == "" ? "null" : sprintf("%." d "f", x) }
function str(x) { gsub(/\\/, "\\\\", x); gsub(/"/, "\\\"", x); gsub(/\t/, " ", x); return "\"" x "\"" }
function opt(arr, i) { return (i in arr) ? str(arr[i]) : "null" }
$1 == "result" || $1 == "error" || $1 == "info" {
  delete kv
  msg = ""
  for (i = 2; i <= NF; i++) {
    j = index($i, "=")
    f = substr($i, 1, j - 1)
    if (f == "message") { msg = substr($0, index($0, "message=") + 8); break }
    kv[f] = substr($i, j + 1)
  }
  k = kv["kind"]; t = kv["tls"]
  if ($1 == "result") {
    c = kv["case"]; s = kv["segment_bytes"]
    mb[k, t, c, s] = kv["mb_s"]; us[k, t, c, s] = kv["us_per_transfer"]; segs[k, t, c, s] = kv["segments"]
    if (k == "perftest") pmode[t] = kv["errmode"]
  } else if ($1 == "info") {
    if ("transport" in kv) path[k, t] = kv["transport"]
  } else if (k == "perftest") {
    if (!((t, kv["errmode"]) in perr)) perr[t, kv["errmode"]] = msg " (at " label(kv["size"]) ")"
  } else if (!((k, t) in err)) {
    err[k, t] = msg
  }
}
END {
  n = split(sizes, S, ",")
  printf "transfer: KvTransport between two processes on this machine (%d cores) vs ucx_perftest -t ucp_put_bw (same UCX_TLS, sizes, error mode) and memcpy\n", cores
  printf "  MB/s = 10^6 bytes/s. Ours: one warm-up transfer, then transfers back to back for >= %s s, best of %s rounds, each transfer complete in the target'"'"'s memory;\n", min_seconds, rounds
  printf "  perftest: best of %s runs of ~0.5 s (over tcp its runs of one size can differ 5x).\n", pruns
  printf "  b1: one segment per transfer, each waited for; b64: 64 segments of SIZE per transfer at distinct offsets (fewer, n, where 64 do not fit the\n"
  printf "  256 MiB target region); b1 us: microseconds per batch-1 transfer. perftest: ucp_put_bw on one reused buffer, its overall time per\n"
  printf "  iteration (pt us), converted to 10^6 bytes/s (it prints MiB/s). memcpy: one thread, source and destination of SIZE.\n"
  printf "  Load average %s at the start, %s at the end.\n", load_start, load_end
  if (load_start + 0 > 0.7) printf "  NOTE: the machine was busy when the bench started: the figures are noisy.\n"
  for (ti = 1; ti <= 2; ti++) {
    t = (ti == 1 ? "tcp" : "shm")
    printf "\n  ucx, UCX_TLS=%s: peer transport %s\n", t, ((("ucx", t) in path) ? path["ucx", t] : "-")
    if (("ucx", t) in err) printf "    OUR TRANSPORT FAILED: %s\n", err["ucx", t]
    if ((t, "peer") in perr) printf "    ucx_perftest -e failed: %s\n", perr[t, "peer"]
    if ((t, "none") in perr) printf "    ucx_perftest without -e failed: %s\n", perr[t, "none"]
    if (pmode[t] == "none") printf "    so perftest ran WITHOUT -e (no UCX peer error handling), as the transport'"'"'s shared-memory endpoints do\n"
    printf "  %-8s %9s %8s %9s %3s %9s %9s %8s %6s %6s %9s\n", "size", "put b1", "b1 us", "put b64", "n", "get b1", "perftest", "pt us", "b1/pt", "b64/pt", "memcpy"
    for (i = 1; i <= n; i++) {
      s = S[i]
      p = get("perftest", t, "perftest", s)
      r1 = ratio(get("ucx", t, "put_b1", s), p); r64 = ratio(get("ucx", t, "put_b64", s), p)
      printf "  %-8s %9s %8s %9s %3s %9s %9s %8s %6s %6s %9s\n", label(s), f1(get("ucx", t, "put_b1", s)),
        (has("ucx", t, "put_b1", s) ? fus(us["ucx", t, "put_b1", s]) : "-"),
        f1(get("ucx", t, "put_b64", s)), (has("ucx", t, "put_b64", s) ? segs["ucx", t, "put_b64", s] : "-"),
        f1(get("ucx", t, "get_b1", s)), f1(p), (p != "" ? fus(us["perftest", t, "perftest", s]) : "-"), f2(r1), f2(r64),
        f1(get("memcpy", "-", "memcpy", s))
      if (s >= 262144) {
        if (r64 == "") miss64[t] = 1; else if (!(t in min64) || r64 < min64[t]) min64[t] = r64
        if (r1 == "") miss1[t] = 1; else if (!(t in min1) || r1 < min1[t]) min1[t] = r1
      }
    }
    sc[t] = get("ucx", t, "scatter_put", 1474560); co[t] = get("ucx", t, "contig_put", 94371840)
    b64m = get("ucx", t, "put_b1", 67108864)
    scat[t] = ratio(sc[t], co[t]); scat64[t] = ratio(sc[t], b64m)
    sg = get("ucx", t, "scatter_get", 1474560); cg = get("ucx", t, "contig_get", 94371840)
    if (sc[t] != "") {
      printf "  request-shaped put, 64 scattered blocks of 1,474,560 B (90 MiB in all): %s MB/s; the same 90 MiB as one segment: %s MB/s: %sx", f1(sc[t]), f1(co[t]), f2(scat[t])
      if (b64m != "") printf " (%sx the 64 MiB b1 put)", f2(scat64[t])
      printf "\n"
    }
    if (sg != "") printf "  request-shaped get: scattered %s MB/s; one segment %s MB/s: %sx\n", f1(sg), f1(cg), f2(ratio(sg, cg))
    cold[t] = get("ucx", t, "scatter_put_cold", 1474560)
    if (cold[t] != "") printf "  request-shaped put as a hand-off meets it (one at a time after 250 ms idle, blocks not in any cache; median): %s MB/s\n", f1(cold[t])
  }
  printf "\n  grpc on loopback (reference; no perftest equivalent): peer transport %s\n", ((("grpc", "-") in path) ? path["grpc", "-"] : "-")
  if (("grpc", "-") in err) printf "    FAILED: %s\n", err["grpc", "-"]
  printf "  %-8s %9s %8s %9s %3s %9s %9s\n", "size", "put b1", "b1 us", "put b64", "n", "get b1", "memcpy"
  for (i = 1; i <= n; i++) {
    s = S[i]
    printf "  %-8s %9s %8s %9s %3s %9s %9s\n", label(s), f1(get("grpc", "-", "put_b1", s)),
      (has("grpc", "-", "put_b1", s) ? fus(us["grpc", "-", "put_b1", s]) : "-"),
      f1(get("grpc", "-", "put_b64", s)), (has("grpc", "-", "put_b64", s) ? segs["grpc", "-", "put_b64", s] : "-"),
      f1(get("grpc", "-", "get_b1", s)), f1(get("memcpy", "-", "memcpy", s))
  }
  gsc = get("grpc", "-", "scatter_put", 1474560); gco = get("grpc", "-", "contig_put", 94371840)
  if (gsc != "") printf "  request-shaped put: scattered %s MB/s; one segment %s MB/s: %sx\n", f1(gsc), f1(gco), f2(ratio(gsc, gco))

  # Goals: >= 0.8x perftest at >= 256 KiB (batch 64, the minimum over those sizes) on each
  # transport; scattered >= 0.5x contiguous on tcp. A missing figure is null and fails the goal.
  for (ti = 1; ti <= 2; ti++) {
    t = (ti == 1 ? "tcp" : "shm")
    g64[t] = ((t in min64) && !(t in miss64)) ? min64[t] : ""
    g1[t] = ((t in min1) && !(t in miss1)) ? min1[t] : ""
  }
  goal = (g64["tcp"] != "" && g64["tcp"] >= 0.8 && g64["shm"] != "" && g64["shm"] >= 0.8 && scat["tcp"] != "" && scat["tcp"] >= 0.5)
  verdict_tcp = (g64["tcp"] != "" && g64["tcp"] >= 0.8) ? "met" : "NOT met"
  verdict_shm = (g64["shm"] != "" && g64["shm"] >= 0.8) ? "met" : "NOT met"
  verdict_scat = (scat["tcp"] != "" && scat["tcp"] >= 0.5) ? "met" : "NOT met"
  printf "\n  goals: ucx put >= 0.8x ucx_perftest at >= 256 KiB (put b64 / perftest, the minimum over those sizes): tcp %s (%s), shm %s (%s)%s\n", f2(g64["tcp"]), verdict_tcp, f2(g64["shm"]), verdict_shm, (pmode["shm"] == "none" ? " (perftest without -e)" : "")
  printf "         (put b1 / perftest, same rule: tcp %s, shm %s)\n", f2(g1["tcp"]), f2(g1["shm"])
  # perftest rewrites one cache-resident buffer; batch 64 writes 64 distinct segments. At 64 MiB
  # both run from DRAM: the like-for-like figure.
  pt64 = get("perftest", "shm", "perftest", 67108864)
  b64_64 = get("ucx", "shm", "put_b64", 67108864)
  dram_shm = ratio(b64_64, pt64)
  printf "         shm at 64 MiB, where neither fits in cache: put b64 / perftest %s\n", f2(dram_shm)
  printf "         request-shaped scattered put >= 0.5x the same bytes as one segment, tcp: %s (%s; shm %s)\n", f2(scat["tcp"]), verdict_scat, f2(scat["shm"])
  printf "  whole bench: %s s\n", elapsed

  j = "{\"bench\":\"transfer\""
  j = j ",\"ucx_vs_perftest_256k_tcp\":" num(g64["tcp"], 3)
  j = j ",\"ucx_vs_perftest_256k_shm\":" num(g64["shm"], 3)
  j = j ",\"scatter_vs_contiguous_tcp\":" num(scat["tcp"], 3)
  j = j ",\"goal_met\":" (goal ? "true" : "false")
  j = j ",\"ucx_vs_perftest_64m_shm\":" num(dram_shm, 3)
  j = j ",\"ratio_rule\":\"put batch 64 / ucx_perftest ucp_put_bw delivered MB/s, minimum over sizes >= 256 KiB\""
  j = j ",\"ucx_b1_vs_perftest_256k_tcp\":" num(g1["tcp"], 3)
  j = j ",\"ucx_b1_vs_perftest_256k_shm\":" num(g1["shm"], 3)
  j = j ",\"scatter_vs_contiguous_shm\":" num(scat["shm"], 3)
  j = j ",\"scatter_vs_put_b1_64m_tcp\":" num(scat64["tcp"], 3)
  j = j ",\"scatter_vs_put_b1_64m_shm\":" num(scat64["shm"], 3)
  for (ti = 1; ti <= 2; ti++) {
    t = (ti == 1 ? "tcp" : "shm")
    j = j ",\"transport_" t "\":" opt(path, "ucx" SUBSEP t)
    j = j ",\"error_" t "\":" opt(err, "ucx" SUBSEP t)
    j = j ",\"perftest_errmode_" t "\":" opt(pmode, t)
    j = j ",\"perftest_e_error_" t "\":" opt(perr, t SUBSEP "peer")
    j = j ",\"scatter_put_mb_s_" t "\":" num(sc[t], 1)
    j = j ",\"scatter_put_cold_mb_s_" t "\":" num(cold[t], 1)
    j = j ",\"contig_put_mb_s_" t "\":" num(co[t], 1)
    j = j ",\"scatter_get_mb_s_" t "\":" num(get("ucx", t, "scatter_get", 1474560), 1)
    j = j ",\"contig_get_mb_s_" t "\":" num(get("ucx", t, "contig_get", 94371840), 1)
    for (i = 1; i <= n; i++) {
      s = S[i]; k = key(s)
      j = j ",\"ucx_put_b1_mb_s_" t "_" k "\":" num(get("ucx", t, "put_b1", s), 1)
      j = j ",\"ucx_put_b64_mb_s_" t "_" k "\":" num(get("ucx", t, "put_b64", s), 1)
      j = j ",\"ucx_get_b1_mb_s_" t "_" k "\":" num(get("ucx", t, "get_b1", s), 1)
      j = j ",\"perftest_mb_s_" t "_" k "\":" num(get("perftest", t, "perftest", s), 1)
    }
  }
  j = j ",\"transport_grpc\":" opt(path, "grpc" SUBSEP "-")
  j = j ",\"error_grpc\":" opt(err, "grpc" SUBSEP "-")
  j = j ",\"grpc_scatter_put_mb_s\":" num(gsc, 1) ",\"grpc_contig_put_mb_s\":" num(gco, 1)
  for (i = 1; i <= n; i++) {
    s = S[i]; k = key(s)
    j = j ",\"grpc_put_b1_mb_s_" k "\":" num(get("grpc", "-", "put_b1", s), 1)
    j = j ",\"grpc_put_b64_mb_s_" k "\":" num(get("grpc", "-", "put_b64", s), 1)
    j = j ",\"grpc_get_b1_mb_s_" k "\":" num(get("grpc", "-", "get_b1", s), 1)
  }
  for (i = 1; i <= n; i++) j = j ",\"memcpy_mb_s_" key(S[i]) "\":" num(get("memcpy", "-", "memcpy", S[i]), 1)
  j = j ",\"load_average_start\":" load_start ",\"quick\":" (quick ? "true" : "false") ",\"seconds\":" elapsed "}"
  print j
}' "${results}"
# Our UCX rows are the point of the bench: fail when they are missing.
! grep -q "^error kind=ucx" "${results}"
