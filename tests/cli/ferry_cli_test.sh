#!/usr/bin/env bash
# The ferry CLI's own behaviour: help, unknown commands, the benchmark list and dispatch errors,
# model paths, `up`'s and `scale`'s argument checks (--encoder among them), and
# `down`/`status`/`scale` with nothing running. Runs the script from the test's runfiles with a
# private cache, so nothing is installed or downloaded.
set -uo pipefail
ferry="$1"
export FERRY_CACHE="${TEST_TMPDIR}/cache" FERRY_STATE="${TEST_TMPDIR}/state"
failures=0
check() {  # check DESCRIPTION EXPECTED_RC PATTERN -- COMMAND...
  local what=$1 want_rc=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ ${rc} -ne ${want_rc} ]] || ! grep -qE -- "${pattern}" <<<"${out}"; then
    echo "FAIL: ${what}: rc=${rc} (want ${want_rc}), output:"
    echo "${out}" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: ${what}"
  fi
}
check "help lists every command" 0 "setup.*" -- "${ferry}" help
for c in setup build test up status down scale bench fmt worker calibrate load sim "models pull"; do
  check "help mentions '${c}'" 0 "^  ${c} " -- "${ferry}" help
done
check "unknown command fails" 1 "unknown command 'frobnicate'" -- "${ferry}" frobnicate
check "bench lists block_hash" 0 "^  block_hash +chained block hashing" -- "${ferry}" bench
check "bench lists load" 0 "^  load +ferry-load vs aiperf" -- "${ferry}" bench
check "unknown benchmark fails" 1 "no benchmark named 'nope'" -- "${ferry}" bench nope
check "models path follows FERRY_MODELS_DIR" 0 "^/models/here/SmolLM2-135M-Instruct.Q4_1.gguf$" \
  -- env FERRY_MODELS_DIR=/models/here "${ferry}" models path
check "models without a verb fails" 1 "usage: ferry models" -- "${ferry}" models
check "worker without a command fails" 1 "usage: ferry worker" -- "${ferry}" worker
check "down with nothing running" 0 "nothing is running" -- "${ferry}" down
check "status with nothing running" 3 "nothing is running" -- "${ferry}" status
check "up --help lists its flags" 0 "--workers N" -- "${ferry}" up --help
check "up refuses an unknown flag" 1 "unknown argument '--bogus'" -- "${ferry}" up --bogus
check "up --help names the disaggregated flags" 0 "--prefill N" -- "${ferry}" up --help
check "up refuses zero workers" 1 "--workers must be 1..99" -- "${ferry}" up --aggregated --workers 0
check "up refuses --workers without --aggregated" 1 "add --aggregated" -- "${ferry}" up --workers 2
check "up refuses --prefill with --aggregated" 1 "not with --aggregated" -- "${ferry}" up --aggregated --prefill 2
check "up refuses zero decode workers" 1 "--prefill and --decode must be 1..49" -- "${ferry}" up --decode 0
check "up refuses a bad port" 1 "--port must be 1..65535" -- "${ferry}" up --port 70000
check "up refuses a missing model" 1 "--model: no such file" -- "${ferry}" up --model /nonexistent.gguf
check "up --help names the simulated engine" 0 "--engine sim" -- "${ferry}" up --help
check "up refuses an unknown engine" 1 "--engine must be real or sim" -- "${ferry}" up --engine fast
check "up refuses a calibration for the real engine" 1 "--calibration is for --engine sim" -- "${ferry}" up --calibration c.json
check "up refuses a missing calibration" 1 "--calibration: no such file" -- "${ferry}" up --engine sim --calibration /nonexistent.json
check "up --help names the encoders" 0 "--encoder N" -- "${ferry}" up --help
check "up refuses --encoder for a text-only model" 1 "--encoder needs a vision model" -- "${ferry}" up --encoder 1
check "up refuses a bad encoder count" 1 "--encoder must be 0..49" -- "${ferry}" up --encoder 50
check "up refuses --encoder with the simulated engine" 1 "--encoder is for the real engine" -- "${ferry}" up --encoder 1 --engine sim
check "scale refuses the encoders" 1 "the encoders are not scaled" -- "${ferry}" scale encoder 2
check "scale --help names its arguments" 0 "usage: ./ferry scale POOL N" -- "${ferry}" scale --help
check "scale refuses zero workers" 1 "N must be at least 1" -- "${ferry}" scale decode 0
check "scale refuses an unknown pool" 1 "POOL must be decode, prefill or worker" -- "${ferry}" scale gpu 2
check "scale refuses a bad grace" 1 "--grace must be a duration" -- "${ferry}" scale decode 1 --grace soon
check "scale with nothing running" 1 "the local stack is not running" -- "${ferry}" scale decode 2
# A stale pid file of a process that is gone is cleaned up, not an error.
mkdir -p "${FERRY_STATE}/pids"
echo 999999 >"${FERRY_STATE}/pids/ghost.pid"
check "down cleans stale pid files" 0 "" -- "${ferry}" down
[[ ! -e "${FERRY_STATE}/pids/ghost.pid" ]] || { echo "FAIL: stale pid file left"; failures=$((failures + 1)); }
echo "${failures} failure(s)"
[[ ${failures} -eq 0 ]]
