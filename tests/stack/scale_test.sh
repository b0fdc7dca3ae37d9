#!/usr/bin/env bash
# The local stack as its user runs it (issue 28): `./ferry up` (the simulated engine: the real
# router and workers with the compute replaced by a timing model, cheap on two cores), steady load
# from `./ferry load`, then `./ferry scale decode 1` (a decode worker drained: its requests handed
# off with their KV) and `./ferry scale decode 2` under it. Every request of the load must
# succeed, the router must count no failed request, and `./ferry down` must leave no process.
#
# Run by `./ferry test` after the Bazel tests (it needs `up`'s fixed ports: 7400, 7500, 7501, 7550
# and the API port below). Outside CI it skips when those ports are taken (a stack of yours runs);
# under CI=true it fails instead.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "${root}"
export FERRY_STATE
FERRY_STATE=$(mktemp -d /tmp/ferry-scale-test.XXXXXX)
export FERRY_DRAIN_GRACE=2s
port=18431
out="${FERRY_STATE}/test"
mkdir -p "${out}"
fail() {
  echo "scale_test: FAIL: $*" >&2
  for log in "${FERRY_STATE}"/logs/*.log; do
    [[ -f "${log}" ]] || continue
    echo "--- the end of ${log}" >&2
    tail -n 15 "${log}" >&2
  done
  exit 1
}
cleanup() {
  ./ferry down >/dev/null 2>&1 || true
  [[ -n "${load_pid:-}" ]] && kill "${load_pid}" 2>/dev/null
  rm -rf "${FERRY_STATE}"
}
trap cleanup EXIT

for p in 7400 7500 7501 7550 "${port}"; do
  if ! /usr/bin/python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",int(sys.argv[1])))' "${p}" 2>/dev/null; then
    if [[ "${CI:-}" == true ]]; then fail "port ${p} is taken"; fi
    echo "scale_test: SKIPPED: port ${p} is taken (a stack of yours runs?)" >&2
    exit 0
  fi
done

./ferry up --engine sim --prefill 1 --decode 2 --port "${port}" >"${out}/up.log" 2>&1 ||
  { cat "${out}/up.log" >&2; fail "./ferry up"; }
router_admin=$(cat "${FERRY_STATE}/pids/router.admin_port")
metric() {  # the sum of a router metric's samples whose line matches $2
  curl -sf "http://127.0.0.1:${router_admin}/metrics" |
    awk -v name="$1" -v want="${2:-}" 'index($0, name) == 1 && index($0, want) { s += $NF } END { print s + 0 }'
}
failed_before=$(metric ferry_router_failed_requests_total)

# Steady load: 8 users, each sending its next request at once, long enough to span both scales;
# each request outlasts the drain's grace, so the drained worker hands some off with their KV.
./ferry load --url "http://127.0.0.1:${port}" --mode closed --concurrency 8 \
  --workload shared_prefix --groups 4 --prompts_per_group 8 --system_tokens 512 \
  --question_tokens 32 --output_tokens 400 --progress=false >"${out}/load.json" 2>"${out}/load.log" &
load_pid=$!
sleep 3
kill -0 "${load_pid}" 2>/dev/null || { cat "${out}/load.log" >&2; fail "the load ended too early"; }
./ferry scale decode 1 >"${out}/scale1.log" 2>&1 || { cat "${out}/scale1.log" >&2; fail "./ferry scale decode 1"; }
kill -0 "${load_pid}" 2>/dev/null || fail "the load ended before the second scale"
./ferry scale decode 2 >"${out}/scale2.log" 2>&1 || { cat "${out}/scale2.log" >&2; fail "./ferry scale decode 2"; }
wait "${load_pid}"
rc=$?
load_pid=""
[[ ${rc} -eq 0 ]] || { cat "${out}/load.log" >&2; fail "./ferry load exited ${rc}"; }
summary=$(tail -n 1 "${out}/load.json")
requests=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["requests"])' "${summary}")
failed=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["failed"])' "${summary}")
[[ "${requests}" -gt 0 && "${failed}" -eq 0 ]] ||
  { cat "${out}/load.log" >&2; fail "the load saw ${failed} failed of ${requests} requests: ${summary}"; }
failed_after=$(metric ferry_router_failed_requests_total)
[[ "${failed_after}" == "${failed_before}" ]] || fail "the router counts $((failed_after - failed_before)) failed requests"
handoffs=$(metric ferry_router_handoffs_total 'outcome="completed"')
migrations=$(curl -sf "http://127.0.0.1:${router_admin}/metrics" |
  grep -E '^ferry_router_(migrations|handoffs)_total' | grep -v ' 0$' | tr '\n' ' ')
[[ "${handoffs}" -ge 1 ]] || fail "no request was handed off with its KV (${migrations:-no migration})"
pids=$(cat "${FERRY_STATE}"/pids/*.pid)
./ferry down >"${out}/down.log" 2>&1 || fail "./ferry down"
for pid in ${pids}; do
  ! kill -0 "${pid}" 2>/dev/null || fail "process ${pid} of the stack is left: $(ps -o args= -p "${pid}")"
done
echo "scale_test: ok: ${requests} requests, none failed, across scale decode 1 and 2 (${handoffs} hand-offs with KV; ${migrations:-no migration})"
