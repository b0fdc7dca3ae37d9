#!/usr/bin/env bash
# GGUF reader conformance: our gguf_dump and the `gguf` Python package (llama.cpp's reader) must
# describe the same files identically: the test corpus and the default model's GGUF.
# Needs FERRY_REF_PYTHON and FERRY_MODEL_GGUF (`./ferry test` sets both).
set -euo pipefail
dump="$1"
reference="$2"
shift 2
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON FERRY_MODEL_GGUF
for file in "$@" "${FERRY_MODEL_GGUF}"; do
  "${dump}" "${file}" >"${TEST_TMPDIR}/ours.json"
  "${FERRY_REF_PYTHON}" "${reference}" "${file}" >"${TEST_TMPDIR}/ref.json"
  "${FERRY_REF_PYTHON}" - "${TEST_TMPDIR}/ours.json" "${TEST_TMPDIR}/ref.json" "${file}" <<'PY'
import json, sys
ours, ref = (json.load(open(p)) for p in sys.argv[1:3])
if ours != ref:
    for section in ("version", "metadata", "tensors"):
        if ours.get(section) != ref.get(section):
            if section == "metadata":
                for k in sorted(set(ours[section]) | set(ref[section])):
                    if ours[section].get(k) != ref[section].get(k):
                        print("metadata", k, "ours:", ours[section].get(k), "ref:", ref[section].get(k))
            elif section == "tensors":
                for a, b in zip(ours[section], ref[section]):
                    if a != b:
                        print("tensor ours:", a, "ref:", b)
                        break
                if len(ours[section]) != len(ref[section]):
                    print("tensor counts differ", len(ours[section]), len(ref[section]))
            else:
                print(section, ours.get(section), ref.get(section))
    sys.exit(f"{sys.argv[3]}: gguf_dump differs from the gguf package")
print(f"{sys.argv[3]}: {len(ours['metadata'])} keys, {len(ours['tensors'])} tensors match")
PY
done
