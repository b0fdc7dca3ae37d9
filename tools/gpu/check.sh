#!/usr/bin/env bash
# The CUDA backend's GPU check in one prepared run (docs/tools/gpu-check.md).
#
#   tools/gpu/check.sh package [DIR]   here, where Bazel and the toolkit are: builds
#                                      ferry-gpu-check and puts it in DIR (.gpu) with the shared
#                                      libraries a bare GPU machine lacks (Abseil, xxhash) and the
#                                      first 4 blocks of SmolLM2's GGUF (about 40 MB); the CUDA
#                                      libraries are not carried (the GPU machine has its own)
#   tools/gpu/check.sh run [DIR]       on the GPU machine: runs the check under a 280 s limit and
#                                      prints its table, then its one JSON line (the last line)
#
# With the device tool: package here, then run `tools/gpu/check.sh run` there with `.gpu` carried
# and a 300 s timeout, so a rerun fits in the session's GPU time.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-}
dir=${2:-.gpu}

case "$mode" in
  package)
    bazel build //tools/gpu:ferry-gpu-check
    rm -rf "$dir"
    mkdir -p "$dir/lib"
    cp bazel-bin/tools/gpu/ferry-gpu-check "$dir/"
    chmod u+w "$dir/ferry-gpu-check"
    # Shared libraries outside the C/C++ runtime and the CUDA toolkit.
    ldd bazel-bin/tools/gpu/ferry-gpu-check | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so* | libm.so* | libgcc_s.so* | libstdc++.so* | librt.so* | libpthread.so* | \
          libdl.so* | ld-linux*) ;;
        libcublas* | libcudart* | libnccl*) ;;
        *) cp -L "$lib" "$dir/lib/" ;;
      esac
    done
    # A model of real weights: SmolLM2-135M-Instruct's first 4 blocks (the whole file is over what
    # travels), sliced with the reference virtualenv's `gguf` package.
    model=${FERRY_MODEL_GGUF:-$(./ferry models path 2>/dev/null || true)}
    python=${FERRY_REF_PYTHON:-}
    if [[ -f "$model" && -n "$python" ]] && "$python" -c 'import gguf' 2>/dev/null; then
      "$python" tools/gpu/slice_gguf.py "$model" "$dir/model.gguf" 4
    else
      echo "check.sh: no GGUF model or no FERRY_REF_PYTHON with gguf: the real-weights check is left out" >&2
    fi
    # What was packaged: `run` prints it, so a stale .gpu/ shows.
    echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo -dirty)" >"$dir/COMMIT"
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
    du -sh "$dir"
    echo "packaged $(cat "$dir/COMMIT")"
    ;;
  run)
    [[ -x "$dir/ferry-gpu-check" ]] || {
      echo "check.sh: no $dir/ferry-gpu-check; run 'tools/gpu/check.sh package' first" >&2
      exit 2
    }
    # cuBLAS and NCCL: the toolkit's, else the ones PyTorch's wheels bring.
    cuda_libs=""
    wheels=$(python3 -c 'import os, nvidia
for p in nvidia.__path__:
    for d in ("cublas", "nccl", "cu13"):
        print(os.path.join(p, d, "lib"))' 2>/dev/null || true)
    for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/lib/x86_64-linux-gnu $wheels; do
      if compgen -G "$d/libcublas.so.13*" >/dev/null || compgen -G "$d/libnccl.so.2*" >/dev/null; then
        cuda_libs="$cuda_libs:$d"
      fi
    done
    export LD_LIBRARY_PATH="$dir/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # Everything below but the JSON line goes to stderr: the JSON line is stdout's last.
    echo "check.sh: ferry-gpu-check of $(cat "$dir/COMMIT" 2>/dev/null || echo '(unknown commit)')" >&2
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 2>/dev/null || true
    fallback() {  # the JSON line when the program itself could not give one
      printf '{"bench": "gpu", "device": null, "kernels_checked": 0, "kernels_failed": 0, '
      printf '"models_checked": 0, "models_failed": 0, "attention_bw_ratio": null, '
      printf '"deterministic_gemm_vs_cublas": null, "decode_b1_bw_ratio": null, '
      printf '"decode_b1_tokens_per_s": null, "copy_gb_per_s": null, "notes": ["%s"]}\n' "$1"
    }
    missing=$(ldd "$dir/ferry-gpu-check" 2>&1 | awk '/not found/ {print $1}' | xargs)
    if [[ -n "$missing" ]]; then
      echo "check.sh: libraries not found: $missing (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)" >&2
      fallback "libraries not found: $missing"
      exit 2
    fi
    start=$(date +%s)
    set +e
    args=()
    [[ -f "$dir/model.gguf" ]] && args=(--gguf "$dir/model.gguf")
    timeout 280 "$dir/ferry-gpu-check" "${args[@]}"
    rc=$?
    set -e
    echo "check.sh: ferry-gpu-check exited $rc after $(($(date +%s) - start)) s" >&2
    case $rc in
      0 | 1 | 2) ;;
      124) fallback "timed out after 280 s" ;;
      *) fallback "ferry-gpu-check exited $rc (crashed?)" ;;
    esac
    exit $rc
    ;;
  *)
    sed -n 2,13p "$0" >&2
    exit 2
    ;;
esac
