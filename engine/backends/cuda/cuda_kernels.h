// The CUDA backend's kernels, as host functions that launch them on a stream (the .cu files of
// this package). CudaBackend (cuda_backend.h) calls them; nothing else does. Plain C++ so that
// C++ code compiled by the host compiler includes this header and nvcc never sees Abseil.
//
// Conventions: every launch is asynchronous on `stream` and returns the launch's error (0 is
// cudaSuccess); matrices are row-major views (rows x cols, `stride` elements apart) of fp32 or
// bf16 elements; host-side vectors (token ids, positions, step layouts) have already been copied
// to the device by the caller. Arithmetic follows backend.h's definitions; where a kernel claims
// batch invariance it says how.

#ifndef FERRY_ENGINE_BACKENDS_CUDA_CUDA_KERNELS_H_
#define FERRY_ENGINE_BACKENDS_CUDA_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "engine/backends/cuda/step_upload.h"

struct CUstream_st;

namespace ferry::cuda {

using Stream = CUstream_st*;

// Element types, with backend.h's DType values.
enum class Elem : uint8_t { kF32 = 0, kBF16 = 1 };

struct Matrix {
  void* data = nullptr;
  Elem elem = Elem::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
};

// backend.h's KvLayerView.
struct KvView {
  void* base = nullptr;
  size_t block_bytes = 0;
  size_t k_offset = 0;
  size_t v_offset = 0;
  int32_t block_tokens = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  Elem elem = Elem::kBF16;
};

// The step words (step_upload.h) on the device, with their offsets.
struct DeviceStep {
  const int32_t* words = nullptr;
  StepOffsets offsets;
};

// Weight formats the quantized product takes.
enum class QuantFormat : uint8_t { kQ8_0 = 0, kQ4_K = 1 };

// out row r = table row ids[r]; table rows of `table_elem` (dense) or GGML blocks.
int LaunchEmbedDense(const void* table, Elem table_elem, int64_t cols, const int32_t* ids,
                     const Matrix& out, Stream stream);
int LaunchEmbedQuant(const uint8_t* table, QuantFormat format, int64_t cols, const int32_t* ids,
                     const Matrix& out, Stream stream);
// RmsNorm over groups of `group` columns (backend.h). With `delta`: x += delta first (x is then
// the residual), the norm of the sum. out may alias x (no delta) or delta.
int LaunchRmsNorm(const Matrix& x, const Matrix* delta, const Matrix& weight, float eps,
                  const Matrix& out, Stream stream);
int LaunchAdd(const Matrix& acc, const Matrix& x, Stream stream);
int LaunchSwiGlu(const Matrix& gate, const Matrix& up, const Matrix& out, Stream stream);
// out row i = x row rows[i].
int LaunchGatherRows(const Matrix& x, const int32_t* rows, const Matrix& out, Stream stream);
// acc row rows[i] += scales[i] * x row i.
int LaunchAddScaledRows(const Matrix& x, const int32_t* rows, const float* scales,
                        const Matrix& acc, Stream stream);
// out[r] = x[r] + bias (one row broadcast).
int LaunchAddBias(const Matrix& out, const Matrix& bias, Stream stream);
// Copies and converts (fp32 <-> bf16) a matrix.
int LaunchConvert(const Matrix& in, const Matrix& out, Stream stream);
// RoPE, rotate-half, in place: x is rows x heads*head_dim; table rows are positions (cos | sin).
int LaunchRope(const Matrix& x, int32_t heads, const int32_t* positions, const Matrix& table,
               Stream stream);
// K and V rows to their cache slots (rows the step marks as not writing are skipped).
int LaunchWriteKv(const Matrix& k, const Matrix& v, const KvView& kv, const DeviceStep& step,
                  Stream stream);

// Paged attention (backend.h's Attention). Each row's keys are cut into tiles aligned to
// absolute positions (launch_shapes.h); a tile's partial result (max, sum, unnormalized output)
// is computed the same way wherever it runs, and the partials fold in increasing tile order
// with one formula. `split`: each tile of each row in its own CTA, folded by a second kernel
// (decode: many CTAs over long contexts); else one CTA per row folds as it goes (prefill). The
// two give the same bits. `partials`: device scratch of AttentionPartialBytes(...) bytes, used
// when split.
size_t AttentionPartialBytes(int64_t rows, int32_t heads, int32_t head_dim, int32_t max_tiles);
int LaunchAttention(const Matrix& q, int32_t heads, const KvView& kv, const DeviceStep& step,
                    float scale, int32_t window, bool split, int32_t max_tiles, float* partials,
                    const Matrix& out, Stream stream);

// out = x * w^T on GGML blocks (ggml_blocks.h's arithmetic: bit-identical to the CPU backend).
// x: M x K fp32 or bf16 rows (K a multiple of the format's block); w: N rows of blocks; out
// M x N. `scratch`: QuantScratchBytes(M, K) bytes of device memory for the quantized activations.
size_t QuantScratchBytes(int64_t m, int64_t k);
int LaunchQuantMatMul(const Matrix& x, const uint8_t* w, QuantFormat format, int64_t n,
                      void* scratch, const Matrix& out, Stream stream);

// out = x * w^T on tensor cores, batch-invariant (det_gemm.cu: every output element accumulated
// over k in increasing steps of 16 by one fragment, whatever M is): x M x K bf16, w N x K bf16
// row-major (dense), out M x N fp32 or bf16. --deterministic mode's product.
int LaunchDeterministicGemm(const Matrix& x, const uint16_t* w, int64_t n, const Matrix& out,
                            Stream stream);

// The greedy token of each row of fp32 logits: the index of the largest value, the lowest index
// among equals (NaN never wins), 0 when nothing is above -inf. out: rows int32 values.
int LaunchArgMax(const Matrix& logits, int32_t* out, Stream stream);

// Converts a host-layout weight (fp32 or bf16, rows x cols) to the backend's bf16 layout, on the
// device: in and out may not alias.
int LaunchToBf16(const void* in, Elem in_elem, int64_t count, uint16_t* out, Stream stream);

}  // namespace ferry::cuda

#endif  // FERRY_ENGINE_BACKENDS_CUDA_CUDA_KERNELS_H_
