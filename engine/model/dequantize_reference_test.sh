#!/usr/bin/env bash
# GGUF dequantization conformance: Ferry's fp32 and bf16 conversions of every tensor must be
# bit-identical to the `gguf` package's NumPy dequantizer, on the default model (Q4_1, Q8_0, F32)
# and on a file of F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 tensors that the gguf package quantizes here,
# plus Q4_K, Q5_K and Q6_K tensors of random blocks (the gguf package only dequantizes K-quants):
# random quants and integer scales, fp16 scales of ordinary magnitudes.
set -euo pipefail
check="$1"
reference="$2"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON FERRY_MODEL_GGUF
t="${TEST_TMPDIR}"
"${FERRY_REF_PYTHON}" - "${t}/types.gguf" <<'PY'
import sys
import numpy as np
import gguf
from gguf.quants import quantize
rng = np.random.default_rng(3)
w = gguf.GGUFWriter(sys.argv[1], "llama")
for name, qtype in [("f16", gguf.GGMLQuantizationType.F16), ("bf16", gguf.GGMLQuantizationType.BF16),
                    ("q8_0", gguf.GGMLQuantizationType.Q8_0), ("q4_0", gguf.GGMLQuantizationType.Q4_0),
                    ("q4_1", gguf.GGMLQuantizationType.Q4_1), ("q5_0", gguf.GGMLQuantizationType.Q5_0),
                    ("q5_1", gguf.GGMLQuantizationType.Q5_1)]:
    data = (rng.standard_normal((64, 256)) * rng.choice([1e-3, 1.0, 300.0])).astype(np.float32)
    data[0, :4] = [0.0, -0.0, 65504.0, 1e-7]  # zeros, the f16 maximum, an f16 subnormal
    w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
for name, qtype, nbytes, halves in [("q4_k", gguf.GGMLQuantizationType.Q4_K, 144, [0, 2]),
                                    ("q5_k", gguf.GGMLQuantizationType.Q5_K, 176, [0, 2]),
                                    ("q6_k", gguf.GGMLQuantizationType.Q6_K, 210, [208])]:
    blocks = rng.integers(0, 256, size=(64, nbytes), dtype=np.uint8)
    for at in halves:
        scale = (rng.standard_normal(64) * rng.choice([1e-4, 1e-2, 1.0])).astype(np.float16)
        blocks[:, at:at + 2] = scale.view(np.uint8).reshape(64, 2)
    # 64 rows of one 256-value block each.
    w.add_tensor(name, blocks, raw_dtype=qtype)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
PY
for file in "${t}/types.gguf" "${FERRY_MODEL_GGUF}"; do
  "${FERRY_REF_PYTHON}" "${reference}" "${file}" >"${t}/reference.json"
  "${check}" "${file}" "${t}/reference.json"
done
