#!/usr/bin/env bash
# ferry-gpu-check where there is no GPU (CI): exit status 2 and a JSON line that says so, with no
# figure made up. On a machine with a GPU the check runs in full and must pass.
set -uo pipefail
out=$("$1" 2>/tmp/gpu_check_stderr.$$)
rc=$?
cat /tmp/gpu_check_stderr.$$ >&2
rm -f /tmp/gpu_check_stderr.$$
echo "$out"
line=$(tail -n 1 <<<"$out")
python3 - "$line" "$rc" <<'PY'
import json, sys
line, rc = json.loads(sys.argv[1]), int(sys.argv[2])
assert line["bench"] == "gpu", line
if line["device"] is None:
    assert rc == 2, f"no device must exit 2, got {rc}"
    for key in ("attention_bw_ratio", "deterministic_gemm_vs_cublas", "decode_b1_bw_ratio"):
        assert line[key] is None, (key, line[key])
    assert line["kernels_checked"] == 0 and line["notes"], line
else:
    assert rc == 0, f"the GPU check failed (exit {rc}): {line}"
    assert line["kernels_checked"] > 0 and line["kernels_failed"] == 0, line
PY
