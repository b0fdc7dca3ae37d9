// Register-tile plumbing shared by the CPU backend's product kernels (cpu_gemm.cc, the fp32
// and bf16 products; cpu_quant.cc, the block-format products): walking panels in tiles sized at
// compile time and storing a tile's 16-column rows, clipped at the matrix's last column.
// Internal to engine/backends/cpu; header-only, no state.

#ifndef FERRY_ENGINE_BACKENDS_CPU_CPU_TILES_H_
#define FERRY_ENGINE_BACKENDS_CPU_CPU_TILES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/backends/cpu/cpu_kernels.h"  // kPanel

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// The loops over a register tile's rows and panels must be unrolled fully, or the compiler keeps
// the accumulators in memory (GCC does at -O2 without it).
#define FERRY_UNROLL _Pragma("GCC unroll 16")

namespace ferry {
namespace cpu_internal {

// Copies the valid columns of a computed 16-wide tile row.
inline void StoreColumns(const float* tile, int64_t first_col, int64_t n, float* out) {
  const int64_t valid = std::min<int64_t>(kPanel, n - first_col);
  std::memcpy(out + first_col, tile, valid * sizeof(float));
}

// Calls tile(std::integral_constant<int, W>{}, p) over panels [p0, p1): tiles of NP panels, the
// rest with narrower ones (NP/2 rounded up, down to one panel), so a remainder still runs as
// few, wide tiles as fit.
template <int NP, typename F>
inline void ForPanelTiles(int64_t p0, int64_t p1, F&& tile) {
  int64_t p = p0;
  for (; p + NP <= p1; p += NP) tile(std::integral_constant<int, NP>{}, p);
  if constexpr (NP > 1) {
    if (p < p1) ForPanelTiles<(NP + 1) / 2>(p, p1, tile);
  }
}

#if defined(__x86_64__)
// Stores an MR x NP tile of 16-lane accumulators (panel p of row r at column first_col + 16p of
// out row r, rows `os` floats apart), clipping the panel that runs past column n.
template <int MR, int NP>
__attribute__((target("avx512f"))) inline void StoreTile512(const __m512 (&acc)[MR][NP],
                                                            int64_t first_col, int64_t n,
                                                            float* out, int64_t os) {
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const int64_t col = first_col + p * kPanel;
      if (col + kPanel <= n) {
        _mm512_storeu_ps(out + r * os + col, acc[r][p]);
      } else {
        alignas(64) float tile[kPanel];
        _mm512_store_ps(tile, acc[r][p]);
        StoreColumns(tile, col, n, out + r * os);
      }
    }
  }
}
#endif

}  // namespace cpu_internal
}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_CPU_CPU_TILES_H_
