#!/usr/bin/env bash
# The planner on the local stack (issue 46): `./ferry up --engine sim --planner` (the simulated
# engine; decode workers with --max_running=4, so that a few requests fill one), a load step from
# `./ferry load`: high (8 users), then low (1 user). The planner's local actuator (`./ferry scale`)
# must grow the decode pool under the high load and shrink it after the load drops, within 2
# minutes of the step, with no failed request (the load's own count and the router's), and
# `./ferry down` must leave no process, the workers the planner started included.
#
# Run by `./ferry test` after tests/stack/scale_test.sh (it needs `up`'s fixed ports: 7400,
# 7500..7502, 7550 and the API port below). Outside CI it skips when those ports are taken (a
# stack of yours runs); under CI=true it fails instead. Waits poll the router's GET /workers under
# deadlines.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "${root}"
export FERRY_STATE
FERRY_STATE=$(mktemp -d /tmp/ferry-planner-test.XXXXXX)
export FERRY_DRAIN_GRACE=2s
export FERRY_WORKER_FLAGS="--max_running=4"
# Decide every second; only the decode pool, 1..3 workers; short cooldown and hysteresis, so that
# the step shows within the test's two minutes.
export FERRY_PLANNER_FLAGS="--interval=1s --pools=decode --decode_replicas=1:3 --cooldown=4s
  --scale_in_window=5s --startup=5s --forecast_window=10s --rate_half_life=2s
  --max_scale_in_step=0.5"
FERRY_PLANNER_FLAGS=$(tr '\n' ' ' <<<"${FERRY_PLANNER_FLAGS}")
port=18432
out="${FERRY_STATE}/test"
mkdir -p "${out}"
fail() {
  echo "planner_test: FAIL: $*" >&2
  [[ -n "${planner_admin:-}" ]] &&
    curl -sf --max-time 5 "http://127.0.0.1:${planner_admin}/plan" >&2 && echo >&2
  for log in "${FERRY_STATE}"/logs/*.log; do
    [[ -f "${log}" ]] || continue
    echo "--- the end of ${log}" >&2
    tail -n 15 "${log}" >&2
  done
  exit 1
}
cleanup() {
  [[ -n "${load_pid:-}" ]] && kill "${load_pid}" 2>/dev/null
  ./ferry down >/dev/null 2>&1 || true
  rm -rf "${FERRY_STATE}"
}
trap cleanup EXIT

for p in 7400 7500 7501 7502 7550 "${port}"; do
  if ! /usr/bin/python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",int(sys.argv[1])))' "${p}" 2>/dev/null; then
    if [[ "${CI:-}" == true ]]; then fail "port ${p} is taken"; fi
    echo "planner_test: SKIPPED: port ${p} is taken (a stack of yours runs?)" >&2
    exit 0
  fi
done

./ferry up --engine sim --prefill 1 --decode 1 --planner --port "${port}" >"${out}/up.log" 2>&1 ||
  { cat "${out}/up.log" >&2; fail "./ferry up --planner"; }
router_admin=$(cat "${FERRY_STATE}/pids/router.admin_port")
planner_admin=$(cat "${FERRY_STATE}/pids/planner.admin_port")
metric() {  # the sum of a service's metric samples whose line matches $3: metric PORT NAME [MATCH]
  curl -sf --max-time 5 "http://127.0.0.1:$1/metrics" |
    awk -v name="$2" -v want="${3:-}" 'index($0, name) == 1 && index($0, want) { s += $NF } END { print s + 0 }'
}
# Decode workers the router lists up and serving.
decode_serving() {
  curl -sf --max-time 5 "http://127.0.0.1:${router_admin}/workers" | /usr/bin/python3 -c '
import json, sys
print(sum(1 for w in json.load(sys.stdin) if w.get("role") == "decode" and w["state"] == "up"
          and w.get("drain_state") == "DRAIN_STATE_SERVING"))' 2>/dev/null || echo -1
}
# wait_decode OP COUNT SECONDS: until decode_serving OP COUNT (-ge, -lt), or fail.
wait_decode() {
  local deadline=$((SECONDS + $3)) n
  while ((SECONDS < deadline)); do
    n=$(decode_serving)
    if [[ "${n}" -ge 0 ]] && [ "${n}" "$1" "$2" ]; then
      echo "${n}"
      return 0
    fi
    sleep 0.5
  done
  return 1
}
# run_load NAME CONCURRENCY REQUESTS: ./ferry load in the background (load_pid); its summary is
# ${out}/NAME.json.
run_load() {
  ./ferry load --url "http://127.0.0.1:${port}" --mode closed --concurrency "$2" \
    --workload shared_prefix --groups 1 --prompts_per_group "$3" --system_tokens 256 \
    --question_tokens 32 --output_tokens 200 --progress=false \
    >"${out}/$1.json" 2>"${out}/$1.log" &
  load_pid=$!
}
# check_load NAME: waits for it; every request succeeded (their count in load_requests).
check_load() {
  wait "${load_pid}"
  local rc=$? summary requests failed
  load_pid=""
  [[ ${rc} -eq 0 ]] || { cat "${out}/$1.log" >&2; fail "./ferry load ($1) exited ${rc}"; }
  summary=$(tail -n 1 "${out}/$1.json")
  requests=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["requests"])' "${summary}")
  failed=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["failed"])' "${summary}")
  [[ "${requests}" -gt 0 && "${failed}" -eq 0 ]] ||
    fail "the $1 load saw ${failed} failed of ${requests} requests: ${summary}"
  load_requests=${requests}
}

[[ $(decode_serving) -eq 1 ]] || fail "the stack does not start with one decode worker"
failed_before=$(metric "${router_admin}" ferry_router_failed_requests_total)
step=${SECONDS}

# High: 8 users on a pool of one decode worker that runs 4 at once.
run_load high 8 48
grew=$(wait_decode -ge 2 60) || fail "the decode pool did not grow within 60 s of the high load"
grew_after=$((SECONDS - step))
check_load high
high_requests=${load_requests}
peak=$(decode_serving)
((peak >= grew)) || peak=${grew}

# Low: 1 user, well inside one worker.
run_load low 1 12
shrunk=$(wait_decode -lt "${peak}" $((120 - (SECONDS - step)))) ||
  fail "the decode pool did not shrink from ${peak} within 2 minutes of the step"
shrunk_after=$((SECONDS - step))
check_load low
low_requests=${load_requests}

failed_after=$(metric "${router_admin}" ferry_router_failed_requests_total)
[[ "${failed_after}" == "${failed_before}" ]] ||
  fail "the router counts $((failed_after - failed_before)) failed requests"
outs=$(metric "${planner_admin}" ferry_planner_decisions_total 'action="scale_out"')
ins=$(metric "${planner_admin}" ferry_planner_decisions_total 'action="scale_in"')
errors=$(metric "${planner_admin}" ferry_planner_actuator_errors_total)
[[ "${outs}" -ge 1 && "${ins}" -ge 1 ]] ||
  fail "the planner counts ${outs} scale-out and ${ins} scale-in decisions"
[[ "${errors}" -eq 0 ]] || fail "the planner counts ${errors} actuator errors"
pids=$(cat "${FERRY_STATE}"/pids/*.pid)
./ferry down >"${out}/down.log" 2>&1 || fail "./ferry down"
for pid in ${pids}; do
  ! kill -0 "${pid}" 2>/dev/null || fail "process ${pid} of the stack is left: $(ps -o args= -p "${pid}")"
done
echo "planner_test: ok: decode 1 -> ${grew} (${grew_after} s after the step; peak ${peak}) -> ${shrunk} (${shrunk_after} s), ${high_requests} + ${low_requests} requests, none failed (${outs} scale-out, ${ins} scale-in decisions)"
