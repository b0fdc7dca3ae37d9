// The CUDA backend's block arithmetic (ggml_blocks.h), run on the host: its dequantization and
// its block-by-block product on Q8_0 and Q4_K reproduce the CPU backend's (cpu_quant.h) bit for
// bit, and its activation quantization is the CPU's. The GPU runs these same functions, so the
// GPU's quantized products equal the CPU backend's; tools/gpu/check.sh confirms it on a GPU.

#include "engine/backends/cuda/ggml_blocks.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "engine/backends/cpu/cpu_quant.h"
#include "engine/common/float_math.h"
#include "gtest/gtest.h"

namespace ferry::cuda {
namespace {

uint16_t RandomHalf(std::mt19937& rng, int lo, int hi) {
  const uint16_t exponent = static_cast<uint16_t>(lo + rng() % (hi - lo + 1));
  return static_cast<uint16_t>(exponent << 10 | (rng() & 0x3ff));
}

// n rows of k values in GGML blocks of `q` (random quants, scales of moderate size).
std::vector<uint8_t> RandomRows(WeightQuant q, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t bytes = GgmlQuantBlockBytes(q);
  std::vector<uint8_t> out(n * (k / GgmlQuantBlockElements(q)) * bytes);
  for (size_t b = 0; b < out.size() / bytes; ++b) {
    uint8_t* block = out.data() + b * bytes;
    for (int64_t i = 0; i < bytes; ++i) block[i] = static_cast<uint8_t>(rng());
    const uint16_t d = RandomHalf(rng, 3, 12), dmin = RandomHalf(rng, 3, 9);
    std::memcpy(block, &d, 2);
    if (q == WeightQuant::kQ4_K) std::memcpy(block + 2, &dmin, 2);
  }
  return out;
}

std::vector<uint8_t> Pack(WeightQuant q, const std::vector<uint8_t>& rows, int64_t n, int64_t k) {
  std::vector<uint8_t> packed(PackedQuantBytes(q, n, k));
  const int64_t row_bytes = k / GgmlQuantBlockElements(q) * GgmlQuantBlockBytes(q);
  for (int64_t p = 0; p * kPanel < n; ++p) {
    PackQuantPanel(q, rows.data() + p * kPanel * row_bytes,
                   std::min<int64_t>(kPanel, n - p * kPanel), k,
                   packed.data() + p * QuantPanelBytes(q, k));
  }
  return packed;
}

std::vector<float> RandomActivations(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(count);
  for (float& v : x) v = normal(rng);
  // A block of zeros and one with a single large value: the edges of the quantization.
  std::fill(x.begin(), x.begin() + 32, 0.0f);
  if (count >= 64) x[40] = 1e4f;
  return x;
}

struct Case {
  WeightQuant quant;
  int64_t k;
};

class GgmlBlocksTest : public ::testing::TestWithParam<Case> {};

TEST_P(GgmlBlocksTest, DequantizationIsTheCpuBackends) {
  const auto [quant, k] = GetParam();
  const int64_t n = 19;
  const std::vector<uint8_t> rows = RandomRows(quant, n, k, 7);
  const std::vector<uint8_t> packed = Pack(quant, rows, n, k);
  const int64_t row_bytes = k / GgmlQuantBlockElements(quant) * GgmlQuantBlockBytes(quant);
  std::vector<float> want(k);
  for (int64_t r = 0; r < n; ++r) {
    DequantizePackedRow(quant, packed.data(), r, k, want.data());
    const uint8_t* row = rows.data() + r * row_bytes;
    for (int64_t e = 0; e < k; ++e) {
      const float got =
          quant == WeightQuant::kQ8_0
              ? Q8_0Value(row + (e / 32) * kQ8_0BlockBytes, static_cast<int>(e % 32))
              : Q4KValue(row + (e / 256) * kQ4_KBlockBytes, static_cast<int>(e % 256));
      ASSERT_EQ(FloatBits(got), FloatBits(want[e])) << "row " << r << " element " << e;
    }
  }
}

TEST_P(GgmlBlocksTest, ProductIsTheCpuBackends) {
  const auto [quant, k] = GetParam();
  const int64_t n = 21, m = 5, blocks = k / kActivationBlock;
  const std::vector<uint8_t> rows = RandomRows(quant, n, k, 11);
  const std::vector<float> x = RandomActivations(m * k, 13);

  // The CPU backend's definition: its activation quantization and its scalar product.
  std::vector<int8_t> cpu_q(m * k);
  std::vector<ActivationBlock> cpu_blocks(m * blocks);
  for (int64_t r = 0; r < m; ++r) {
    QuantizeActivationRow(x.data() + r * k, k, cpu_q.data() + r * k,
                          cpu_blocks.data() + r * blocks);
  }
  const std::vector<uint8_t> packed = Pack(quant, rows, n, k);
  std::vector<float> want(m * n);
  QuantGemmFor(QuantIsa::kScalar)(quant, QuantizedRows{cpu_q.data(), cpu_blocks.data(), k}, m,
                                  packed.data(), 0, (n + kPanel - 1) / kPanel, n, want.data(), n);

  // This header's, as the GPU kernel runs it: quantize per block, terms per block, fold in order.
  std::vector<int8_t> q(m * k);
  std::vector<ActivationScales> scales(m * blocks);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t i = r * blocks + b;
      scales[i] = QuantizeActivationBlock(x.data() + r * k + b * 32, q.data() + r * k + b * 32);
      ASSERT_EQ(FloatBits(scales[i].d), FloatBits(cpu_blocks[i].d));
      ASSERT_EQ(FloatBits(scales[i].s), FloatBits(cpu_blocks[i].s));
      ASSERT_EQ(scales[i].sum, cpu_blocks[i].sum);
    }
  }
  ASSERT_EQ(q, cpu_q);
  const int64_t row_bytes = k / GgmlQuantBlockElements(quant) * GgmlQuantBlockBytes(quant);
  const bool has_min = quant == WeightQuant::kQ4_K;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      const uint8_t* row = rows.data() + c * row_bytes;
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int8_t* qb = q.data() + r * k + b * 32;
        const ActivationScales& a = scales[r * blocks + b];
        const BlockTerms t = has_min ? Q4KTerms(row, b, qb, a) : Q8_0Terms(row, b, qb, a);
        acc = FoldBlock(t, has_min, acc);
      }
      ASSERT_EQ(FloatBits(acc), FloatBits(want[r * n + c])) << "m " << r << " n " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GgmlBlocksTest,
                         ::testing::Values(Case{WeightQuant::kQ8_0, 32},
                                           Case{WeightQuant::kQ8_0, 576},
                                           Case{WeightQuant::kQ4_K, 256},
                                           Case{WeightQuant::kQ4_K, 1536}));

}  // namespace
}  // namespace ferry::cuda
