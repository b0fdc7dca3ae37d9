#!/usr/bin/env bash
# Block hash and model fingerprint conformance: random cases computed by the Python reference
# (written from the specification) must match the C++ implementation bit for bit.
# Needs the reference virtualenv's python in FERRY_REF_PYTHON (`./ferry test` sets it).
set -euo pipefail
conformance="$1"
reference="$2"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON
cases="${TEST_TMPDIR:-/tmp}/block_hash_cases.json"
for seed in 1 2 3; do
  "${FERRY_REF_PYTHON}" "${reference}" cases 200 "${seed}" > "${cases}"
  "${conformance}" "${cases}"
done
