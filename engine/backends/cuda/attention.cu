// Paged attention over the KV pool's block tables, for prefill (chunked) and decode rows alike
// (cuda_kernels.h's LaunchAttention).
//
// A CTA serves one row and one KV head, and with it the group of query heads that share the KV
// head (GQA), so each key and value is read once per group. A row's visible keys are cut into
// tiles of kAttentionTile keys aligned to absolute positions. For one tile and each query head:
//   scores s_j = (fma over d, in order, of q[d] * k_j[d]) * scale      (one thread per key)
//   m_t = max s_j; e_j = Exp(s_j - m_t); l_t = the fixed-tree sum of e_j (invisible keys 0)
//   o_t[d] = fma over the tile's visible keys j, in order, of e_j * v_j[d]
// (the CPU backend's fused multiply-adds; a tile whose scores are all -inf has l_t = 0)
// Tiles fold in increasing order, starting from the first tile's (m, l, o):
//   m' = max(m, m_t); a = Exp(m - m'); b = Exp(m_t - m'); l = l*a + l_t*b; o = o*a + o_t*b
// and the output is o / l. Split mode computes every tile in its own CTA and a second kernel
// folds them; otherwise one CTA folds as it goes. Every operation above is the same in both, so
// a row's result depends only on its own query and keys: batch-invariant, chunk-invariant and
// the same split or not. Exp is engine/common/float_math.h's, so the GPU's exponentials are the
// CPU backend's bits.
//
// Limits (checked at launch): heads / kv_heads <= kMaxGroup, head_dim <= kMaxHeadDim.

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backends/cuda/cuda_kernels.h"
#include "engine/backends/cuda/device_access.cuh"
#include "engine/backends/cuda/launch_shapes.h"
#include "engine/common/float_math.h"

namespace ferry::cuda {
namespace {

constexpr int kMaxGroup = 16;
constexpr int kMaxHeadDim = 256;

struct RowKeys {
  KeyRange range;
  int32_t sequence;
};

__device__ RowKeys KeysOfRow(const DeviceStep& step, int64_t r, int32_t window) {
  const StepOffsets& o = step.offsets;
  const int32_t p = step.words[o.positions + r], s = step.words[o.row_sequence + r];
  return RowKeys{VisibleKeys(p, step.words[o.first_keys + s], window), s};
}

// Shared memory of one CTA: the group's queries, the tile's scores (then weights), each key's
// block, the tile's per-head max and sum, and the running fold.
struct TileShared {
  float* q;         // [group][head_dim]
  float* weights;   // [group][kAttentionTile]
  int32_t* blocks;  // [kAttentionTile]
  float* scratch;   // [kAttentionThreads]
  float* tile_m;    // [group]
  float* tile_l;    // [group]
};

// Computes tile t's partial for every head of the group: tile_m, tile_l in shared memory; the
// unnormalized output o_t[g][d] through `emit(g, d, value)`, called once per (g, d) by one
// thread.
template <typename Emit>
__device__ void ComputeTile(const KvView& kv, const DeviceStep& step, const RowKeys& keys,
                            int32_t kv_head, int32_t group, float scale, int32_t t, TileShared& sh,
                            Emit emit) {
  const StepOffsets& o = step.offsets;
  const int32_t tid = threadIdx.x, hd = kv.head_dim, bt = kv.block_tokens;
  const int32_t key = t * kAttentionTile + tid;
  const bool visible = key >= keys.range.first && key <= keys.range.last;
  const int32_t* table = step.words + o.tables + step.words[o.table_offsets + keys.sequence];
  int32_t block = visible ? table[key / bt] : 0;
  sh.blocks[tid] = block;
  // Constant indices (the unrolled loops, guarded by g < group) keep s in registers.
  float s[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) s[g] = 0.0f;
  if (visible) {
    const uint8_t* kbase = static_cast<const uint8_t*>(kv.base) +
                           static_cast<size_t>(block) * kv.block_bytes + kv.k_offset;
    const int64_t first = static_cast<int64_t>(kv_head) * hd * bt + key % bt;
    for (int32_t d = 0; d < hd; ++d) {
      const float k = LoadElem(kbase, kv.elem, first + static_cast<int64_t>(d) * bt);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) s[g] = fmaf(sh.q[g * hd + d], k, s[g]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    const float score = visible ? s[g] * scale : -INFINITY;
    const float m = CtaMax<kAttentionThreads>(score, sh.scratch);
    // A tile whose visible scores are all -inf adds nothing (its l is 0), rather than NaN.
    const float e = visible && m != -INFINITY ? Exp(score - m) : 0.0f;
    sh.weights[g * kAttentionTile + tid] = e;
    const float l = CtaSum<kAttentionThreads>(e, sh.scratch);
    if (tid == 0) {
      sh.tile_m[g] = m;
      sh.tile_l[g] = l;
    }
  }
  __syncthreads();
  const int32_t lo = max(keys.range.first - t * kAttentionTile, 0);
  const int32_t hi = min(keys.range.last - t * kAttentionTile, kAttentionTile - 1);
  for (int32_t pair = tid; pair < group * hd; pair += kAttentionThreads) {
    const int32_t g = pair / hd, d = pair % hd;
    float acc = 0.0f;
    for (int32_t j = lo; j <= hi; ++j) {
      const int32_t key_j = t * kAttentionTile + j;
      const uint8_t* vbase = static_cast<const uint8_t*>(kv.base) +
                             static_cast<size_t>(sh.blocks[j]) * kv.block_bytes + kv.v_offset;
      const int64_t vi = (static_cast<int64_t>(kv_head) * bt + key_j % bt) * hd + d;
      acc = fmaf(sh.weights[g * kAttentionTile + j], LoadElem(vbase, kv.elem, vi), acc);
    }
    emit(g, d, acc);
  }
  __syncthreads();
}

__device__ void LoadQueries(const Matrix& q, int64_t r, int32_t kv_head, int32_t group, int32_t hd,
                            float* out) {
  for (int32_t i = threadIdx.x; i < group * hd; i += kAttentionThreads) {
    out[i] = At(q, r, static_cast<int64_t>(kv_head) * group * hd + i);
  }
  __syncthreads();
}

size_t SharedBytes(int32_t group, int32_t hd, bool fold) {
  size_t floats = static_cast<size_t>(group) * hd + static_cast<size_t>(group) * kAttentionTile +
                  kAttentionThreads + 2 * group;
  if (fold) floats += static_cast<size_t>(group) * hd + 2 * group;
  return floats * 4 + kAttentionTile * 4;
}

__device__ TileShared CarveShared(char* base, int32_t group, int32_t hd) {
  TileShared sh;
  float* f = reinterpret_cast<float*>(base);
  sh.q = f;
  f += group * hd;
  sh.weights = f;
  f += group * kAttentionTile;
  sh.scratch = f;
  f += kAttentionThreads;
  sh.tile_m = f;
  f += group;
  sh.tile_l = f;
  f += group;
  sh.blocks = reinterpret_cast<int32_t*>(f);
  return sh;
}

// Split mode, pass 1: grid (rows, kv_heads, max_tiles); tile blockIdx.z of the row, if visible,
// to partials[((r * heads + h) * max_tiles + t) * (hd + 2)]: m, l, o[hd].
__global__ void AttentionTileKernel(Matrix q, int32_t heads, KvView kv, DeviceStep step,
                                    float scale, int32_t window, int32_t max_tiles,
                                    float* partials) {
  extern __shared__ __align__(16) char shared[];
  const int64_t r = blockIdx.x;
  const int32_t kv_head = blockIdx.y, t = blockIdx.z, hd = kv.head_dim;
  const int32_t group = heads / kv.kv_heads;
  const RowKeys keys = KeysOfRow(step, r, window);
  if (t < FirstTile(keys.range) || t > LastTile(keys.range)) return;
  TileShared sh = CarveShared(shared, group, hd);
  LoadQueries(q, r, kv_head, group, hd, sh.q);
  auto slot = [&](int32_t g) {
    const int64_t h = static_cast<int64_t>(kv_head) * group + g;
    return partials + ((r * heads + h) * max_tiles + t) * (hd + 2);
  };
  ComputeTile(kv, step, keys, kv_head, group, scale, t, sh,
              [&](int32_t g, int32_t d, float v) { slot(g)[2 + d] = v; });
  if (threadIdx.x < group) {
    slot(threadIdx.x)[0] = sh.tile_m[threadIdx.x];
    slot(threadIdx.x)[1] = sh.tile_l[threadIdx.x];
  }
}

// Split mode, pass 2: grid (rows, heads), threads over d: the fold, then o / l.
__global__ void AttentionFoldKernel(int32_t heads, int32_t hd, DeviceStep step, int32_t window,
                                    int32_t max_tiles, const float* partials, Matrix out) {
  const int64_t r = blockIdx.x, h = blockIdx.y;
  const RowKeys keys = KeysOfRow(step, r, window);
  const int32_t first = FirstTile(keys.range), last = LastTile(keys.range);
  for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float m = 0.0f, l = 0.0f, o = 0.0f;
    for (int32_t t = first; t <= last; ++t) {
      const float* p = partials + ((r * heads + h) * max_tiles + t) * (hd + 2);
      if (t == first) {
        m = p[0];
        l = p[1];
        o = p[2 + d];
        continue;
      }
      const float mt = p[0];
      const float mn = fmaxf(m, mt);
      const float a = Exp(m - mn), b = Exp(mt - mn);
      l = l * a + p[1] * b;
      o = o * a + p[2 + d] * b;
      m = mn;
    }
    Put(out, r, h * hd + d, last < first ? 0.0f : o / l);
  }
}

// Fold mode: grid (rows, kv_heads); the row's tiles in order, folded in shared memory.
__global__ void AttentionRowKernel(Matrix q, int32_t heads, KvView kv, DeviceStep step, float scale,
                                   int32_t window, Matrix out) {
  extern __shared__ __align__(16) char shared[];
  const int64_t r = blockIdx.x;
  const int32_t kv_head = blockIdx.y, hd = kv.head_dim;
  const int32_t group = heads / kv.kv_heads;
  const RowKeys keys = KeysOfRow(step, r, window);
  const int32_t first = FirstTile(keys.range), last = LastTile(keys.range);
  TileShared sh = CarveShared(shared, group, hd);
  float* run_o = reinterpret_cast<float*>(sh.blocks + kAttentionTile);  // [group][hd]
  float* run_m = run_o + group * hd;
  float* run_l = run_m + group;
  LoadQueries(q, r, kv_head, group, hd, sh.q);
  for (int32_t t = first; t <= last; ++t) {
    // The tile's o_t goes into run_o directly for the first tile; later tiles fold per element
    // (each (g, d) is owned by one thread, which reads the tile's m and l only after
    // ComputeTile's barrier, so the fold below runs after the tile's statistics exist).
    if (t == first) {
      ComputeTile(kv, step, keys, kv_head, group, scale, t, sh,
                  [&](int32_t g, int32_t d, float v) { run_o[g * hd + d] = v; });
    } else {
      ComputeTile(kv, step, keys, kv_head, group, scale, t, sh, [&](int32_t g, int32_t d, float v) {
        const float m = run_m[g], mt = sh.tile_m[g];
        const float mn = fmaxf(m, mt);
        const float a = Exp(m - mn), b = Exp(mt - mn);
        run_o[g * hd + d] = run_o[g * hd + d] * a + v * b;
      });
    }
    // Per head: m and l, after every thread has used the old m.
    if (static_cast<int32_t>(threadIdx.x) < group) {
      const int32_t g = threadIdx.x;
      if (t == first) {
        run_m[g] = sh.tile_m[g];
        run_l[g] = sh.tile_l[g];
      } else {
        const float m = run_m[g], mt = sh.tile_m[g];
        const float mn = fmaxf(m, mt);
        const float a = Exp(m - mn), b = Exp(mt - mn);
        run_l[g] = run_l[g] * a + sh.tile_l[g] * b;
        run_m[g] = mn;
      }
    }
    __syncthreads();
  }
  for (int32_t pair = threadIdx.x; pair < group * hd; pair += kAttentionThreads) {
    const int32_t g = pair / hd, d = pair % hd;
    const int64_t h = static_cast<int64_t>(kv_head) * group + g;
    Put(out, r, h * hd + d, last < first ? 0.0f : run_o[pair] / run_l[g]);
  }
}

}  // namespace

size_t AttentionPartialBytes(int64_t rows, int32_t heads, int32_t head_dim, int32_t max_tiles) {
  return static_cast<size_t>(rows) * heads * max_tiles * (head_dim + 2) * sizeof(float);
}

int LaunchAttention(const Matrix& q, int32_t heads, const KvView& kv, const DeviceStep& step,
                    float scale, int32_t window, bool split, int32_t max_tiles, float* partials,
                    const Matrix& out, Stream stream) {
  if (q.rows == 0) return 0;
  const int32_t group = heads / kv.kv_heads;
  if (group < 1 || group > kMaxGroup || kv.head_dim > kMaxHeadDim || heads % kv.kv_heads != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  // Above 48 KiB a kernel must opt in to more dynamic shared memory (Hopper allows 227 KiB).
  const size_t row_shared = SharedBytes(group, kv.head_dim, true);
  if (row_shared > 48 * 1024) {
    cudaFuncSetAttribute(AttentionTileKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(row_shared));
    cudaFuncSetAttribute(AttentionRowKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(row_shared));
  }
  if (split) {
    const size_t shared = SharedBytes(group, kv.head_dim, false);
    const dim3 grid(static_cast<unsigned>(q.rows), static_cast<unsigned>(kv.kv_heads),
                    static_cast<unsigned>(max_tiles));
    AttentionTileKernel<<<grid, kAttentionThreads, shared, stream>>>(q, heads, kv, step, scale,
                                                                     window, max_tiles, partials);
    const int err = LaunchError();
    if (err != 0) return err;
    const dim3 fold_grid(static_cast<unsigned>(q.rows), static_cast<unsigned>(heads));
    AttentionFoldKernel<<<fold_grid, kAttentionThreads, 0, stream>>>(
        heads, kv.head_dim, step, window, max_tiles, partials, out);
    return LaunchError();
  }
  const dim3 grid(static_cast<unsigned>(q.rows), static_cast<unsigned>(kv.kv_heads));
  AttentionRowKernel<<<grid, kAttentionThreads, row_shared, stream>>>(q, heads, kv, step, scale,
                                                                      window, out);
  return LaunchError();
}

}  // namespace ferry::cuda
