#!/usr/bin/env bash
# The encoder pool of the local stack (issue 48): `./ferry up --aggregated --encoder 1` on the tiny
# LLaVA-style model that tools/make_tiny_vlm writes (the reference virtualenv's transformers), one
# chat request with a data: URL PNG through the router. The encoder must have encoded it
# (ferry_encoder_images_encoded_total), the router must count it encoded there
# (ferry_router_encodes_total{result="ok"}) and the worker must have fetched its rows by handle;
# `./ferry status` lists the encoder, and `./ferry down` must leave no process.
#
# Run by `./ferry test` after tests/stack/planner_test.sh (it needs `up`'s fixed ports: 7400, 7500,
# 7600 and the API port below). Outside CI it skips when those ports are taken (a stack of yours
# runs); under CI=true it fails instead. Needs FERRY_REF_PYTHON (./ferry test sets it). Waits poll
# the router's metrics under a deadline.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "${root}"
export FERRY_STATE
FERRY_STATE=$(mktemp -d /tmp/ferry-encoder-test.XXXXXX)
export FERRY_DRAIN_GRACE=2s
port=18433
out="${FERRY_STATE}/test"
mkdir -p "${out}"
fail() {
  echo "encoder_test: FAIL: $*" >&2
  for log in "${FERRY_STATE}"/logs/*.log; do
    [[ -f "${log}" ]] || continue
    echo "--- the end of ${log}" >&2
    tail -n 15 "${log}" >&2
  done
  exit 1
}
cleanup() {
  ./ferry down >/dev/null 2>&1 || true
  rm -rf "${FERRY_STATE}"
}
trap cleanup EXIT

[[ -x "${FERRY_REF_PYTHON:-}" ]] ||
  fail "FERRY_REF_PYTHON (the reference virtualenv's python, which makes the tiny VLM) is not set"
for p in 7400 7500 7600 "${port}"; do
  if ! /usr/bin/python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",int(sys.argv[1])))' "${p}" 2>/dev/null; then
    if [[ "${CI:-}" == true ]]; then fail "port ${p} is taken"; fi
    echo "encoder_test: SKIPPED: port ${p} is taken (a stack of yours runs?)" >&2
    exit 0
  fi
done

# The tiny VLM (56 px tower, 16 rows per image) and a PNG to send.
model="${FERRY_STATE}/tiny-vlm"
"${FERRY_REF_PYTHON}" tools/make_tiny_vlm/make_tiny_vlm.py "${model}" --size tiny --text llama \
  >"${out}/make.log" 2>&1 || { cat "${out}/make.log" >&2; fail "make_tiny_vlm"; }
"${FERRY_REF_PYTHON}" - "${out}/image.png" <<'EOF' || fail "writing the PNG"
import sys
from PIL import Image
Image.new("RGB", (40, 30), (200, 30, 90)).save(sys.argv[1])
EOF

./ferry up --aggregated --encoder 1 --model "${model}" --port "${port}" >"${out}/up.log" 2>&1 ||
  { cat "${out}/up.log" >&2; fail "./ferry up --aggregated --encoder 1"; }
grep -q -- "--encoder 1" "${FERRY_STATE}/up.conf" || fail "up.conf does not record --encoder 1"
[[ -f "${FERRY_STATE}/pids/encoder0.pid" ]] || fail "no encoder0 was started"
[[ -s "${FERRY_STATE}/logs/encoder0.log" ]] || fail "the encoder's log is not in ${FERRY_STATE}/logs"
./ferry status >"${out}/status.log" 2>&1 || { cat "${out}/status.log" >&2; fail "./ferry status"; }
grep -qE '^encoder0 +[0-9]+ +ready ' "${out}/status.log" ||
  { cat "${out}/status.log" >&2; fail "./ferry status does not list encoder0 ready"; }
router_admin=$(cat "${FERRY_STATE}/pids/router.admin_port")
encoder_admin=$(cat "${FERRY_STATE}/pids/encoder0.admin_port")
worker_admin=$(cat "${FERRY_STATE}/pids/worker0.admin_port")
metric() {  # the sum of a service's metric samples whose line matches $3: metric PORT NAME [MATCH]
  curl -sf --max-time 5 "http://127.0.0.1:$1/metrics" |
    awk -v name="$2" -v want="${3:-}" 'index($0, name) == 1 && index($0, want) { s += $NF } END { print s + 0 }'
}
# The router sends images to an encoder once it has its status (its Watch stream).
deadline=$((SECONDS + 60))
until [[ "$(metric "${router_admin}" ferry_router_encoder_up 'encoder="127.0.0.1:7600"')" == 1 ]]; do
  ((SECONDS < deadline)) || fail "the router does not list the encoder 127.0.0.1:7600 up after 60 s"
  sleep 0.2
done

body="${out}/request.json"
/usr/bin/python3 - "${out}/image.png" "$(basename "${model}")" >"${body}" <<'EOF'
import base64, json, sys
with open(sys.argv[1], "rb") as f:
    url = "data:image/png;base64," + base64.b64encode(f.read()).decode()
print(json.dumps({"model": sys.argv[2], "max_tokens": 4, "temperature": 0, "messages": [
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                 {"type": "text", "text": "What is in the picture?"}]}]}))
EOF
code=$(curl -sS --max-time 120 -o "${out}/reply.json" -w '%{http_code}' \
  -H 'Content-Type: application/json' --data-binary "@${body}" \
  "http://127.0.0.1:${port}/v1/chat/completions") || fail "the chat request failed"
[[ "${code}" == 200 ]] || { cat "${out}/reply.json" >&2; fail "the chat request answered HTTP ${code}"; }
prompt_tokens=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' \
  "${out}/reply.json") || fail "no usage in the reply: $(cat "${out}/reply.json")"
((prompt_tokens > 16)) || fail "usage counts ${prompt_tokens} prompt tokens, fewer than the image's 16"

encoded=$(metric "${encoder_admin}" ferry_encoder_images_encoded_total)
[[ "${encoded}" == 1 ]] || fail "the encoder counts ${encoded} images encoded, not 1"
ok=$(metric "${router_admin}" ferry_router_encodes_total 'result="ok"')
[[ "${ok}" == 1 ]] || fail "the router counts ${ok} images encoded (result=\"ok\"), not 1"
fetched=$(metric "${worker_admin}" ferry_worker_image_fetches_total 'outcome="fetched"')
[[ "${fetched}" == 1 ]] || fail "the worker fetched ${fetched} images' rows by handle, not 1"

pids=$(cat "${FERRY_STATE}"/pids/*.pid)
./ferry down >"${out}/down.log" 2>&1 || { cat "${out}/down.log" >&2; fail "./ferry down"; }
grep -q "encoder0: stopped" "${out}/down.log" || { cat "${out}/down.log" >&2; fail "./ferry down did not stop encoder0"; }
for pid in ${pids}; do
  ! kill -0 "${pid}" 2>/dev/null || fail "process ${pid} of the stack is left: $(ps -o args= -p "${pid}")"
done
echo "encoder_test: ok: one image through ./ferry up --aggregated --encoder 1 (encoded once by the encoder, fetched by handle by the worker, ${prompt_tokens} prompt tokens); ./ferry down left no process"
