// The CUDA backend's launch arithmetic: grid sizes, the attention tiling and the key range a row
// sees, written once for the host (which sizes grids and scratch) and the kernels
// (FERRY_HOST_DEVICE), and unit-tested on the host.
//
// Attention tiles are aligned to absolute key positions (tile t holds keys [t * kAttentionTile,
// (t + 1) * kAttentionTile)), never to the batch or the split count, so a row's partial results
// and their fold are the same whether the row is computed alone or in a batch, in one CTA or
// split across several (attention.cu). No state.

#ifndef FERRY_ENGINE_BACKENDS_CUDA_LAUNCH_SHAPES_H_
#define FERRY_ENGINE_BACKENDS_CUDA_LAUNCH_SHAPES_H_

#include <cstdint>

#include "engine/common/host_device.h"

namespace ferry::cuda {

// Keys per attention tile, and threads per attention CTA (one thread per key of a tile).
constexpr int kAttentionTile = 256;
constexpr int kAttentionThreads = 256;
// Threads per CTA of the row-wise kernels (norms, argmax) and the elementwise ones.
constexpr int kRowThreads = 256;
constexpr int kElementThreads = 256;
// The quantized GEMV: one warp per output row, kGemvWarps warps per CTA, and up to kGemvRows
// activation rows per CTA (weights are read once per group of rows).
constexpr int kGemvWarps = 4;
constexpr int kGemvRows = 8;

FERRY_HOST_DEVICE inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The keys a row at `position` sees: [first, position], first = max(first_key, position - window
// + 1) with a window (> 0), else first_key.
struct KeyRange {
  int32_t first;
  int32_t last;  // inclusive; first > last: none
};
FERRY_HOST_DEVICE inline KeyRange VisibleKeys(int32_t position, int32_t first_key, int32_t window) {
  int32_t first = first_key;
  if (window > 0 && position - window + 1 > first) first = position - window + 1;
  return KeyRange{first, position};
}

// The tiles [first_tile, last_tile] a key range touches (empty range: last_tile < first_tile).
FERRY_HOST_DEVICE inline int32_t FirstTile(const KeyRange& r) { return r.first / kAttentionTile; }
FERRY_HOST_DEVICE inline int32_t LastTile(const KeyRange& r) {
  return r.last < r.first ? r.first / kAttentionTile - 1 : r.last / kAttentionTile;
}

// Elements per thread and grid size of an elementwise kernel over n elements (grid.x capped; the
// kernels loop with a grid stride).
FERRY_HOST_DEVICE inline int64_t ElementwiseBlocks(int64_t n) {
  const int64_t blocks = CeilDiv(n, kElementThreads);
  return blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks;
}

// CTAs of the quantized GEMV for an M x N output: x covers output rows in groups of kGemvWarps,
// y activation rows in groups of kGemvRows.
struct GemvGrid {
  int64_t x;
  int64_t y;
};
FERRY_HOST_DEVICE inline GemvGrid QuantGemvGrid(int64_t m, int64_t n) {
  return GemvGrid{CeilDiv(n, kGemvWarps), CeilDiv(m, kGemvRows)};
}

}  // namespace ferry::cuda

#endif  // FERRY_ENGINE_BACKENDS_CUDA_LAUNCH_SHAPES_H_
