#!/usr/bin/env bash
# media/image against PIL's decoding and transformers' CLIP and SigLIP image processors
# (media/image/preprocess_reference.py says what is compared and within what tolerance).
set -euo pipefail
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON
"${FERRY_REF_PYTHON}" "$2" "$1" "${TEST_TMPDIR}/work"
