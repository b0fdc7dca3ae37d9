#!/usr/bin/env bash
# Discovery by DNS with real processes (dns_discovery_test.py): Debian's dnsmasq on a loopback port
# answers from a hosts file the test rewrites; null workers on a tiny test model's tokenizer.
#   dns_discovery_test.sh FERRY_ROUTER FERRY_WORKER FERRY_KVSTORE MAKE_TINY_MODEL SCRIPT
set -euo pipefail
router="$1"; worker="$2"; kvstore="$3"; make_tiny_model="$4"; script="$5"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON FERRY_REF_PYTHON
"${FERRY_REF_PYTHON}" "${make_tiny_model}" models "${TEST_TMPDIR}/models" >"${TEST_TMPDIR}/make.log" 2>&1 ||
  { cat "${TEST_TMPDIR}/make.log" >&2; exit 1; }
exec "${FERRY_CLIENT_PYTHON}" "${script}" "${router}" "${worker}" "${kvstore}" \
  "${TEST_TMPDIR}/models/llama_gqa_bf16"
