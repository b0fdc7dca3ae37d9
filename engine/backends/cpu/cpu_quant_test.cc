// The quantized products of cpu_quant.h: packing keeps every block's values (GGML's dequantizer,
// which dequantize_reference_test checks against the `gguf` package, gives the same bits from the
// file's blocks as from the packed panels); every instruction-set variant reproduces the scalar
// definition bit for bit; and the scalar definition is within the activation-quantization bound
// of an fp64 product of the dequantized weights with the unquantized activations.

#include "engine/backends/cpu/cpu_quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/float_math.h"
#include "engine/model/dequantize.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr WeightQuant kFormats[] = {WeightQuant::kQ8_0, WeightQuant::kQ4_0, WeightQuant::kQ4_1,
                                    WeightQuant::kQ5_0, WeightQuant::kQ5_1, WeightQuant::kQ4_K,
                                    WeightQuant::kQ5_K, WeightQuant::kQ6_K};

bool IsK(WeightQuant q) {
  return q == WeightQuant::kQ4_K || q == WeightQuant::kQ5_K || q == WeightQuant::kQ6_K;
}

// Row lengths to test a format on: whole GGML blocks, one and several.
std::vector<int64_t> Lengths(WeightQuant q) {
  return IsK(q) ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 96, 576};
}

// A random fp16 of magnitude 2^(lo-15)..2^(hi-15), either sign when `signed_`.
uint16_t RandomHalf(std::mt19937& rng, int lo, int hi, bool signed_) {
  const uint16_t exponent = static_cast<uint16_t>(lo + rng() % (hi - lo + 1));
  const uint16_t mantissa = static_cast<uint16_t>(rng() & 0x3ff);
  const uint16_t sign = signed_ && (rng() & 1) ? 0x8000 : 0;
  return static_cast<uint16_t>(sign | exponent << 10 | mantissa);
}

// n rows of k / GgmlQuantBlockElements GGML blocks of `q`: random quants and integer scales,
// scales d around 2^-6 (K-quants: 2^-9, times a 6-bit sub-block scale), minimums around 2^-3
// (K-quants: dmin around 2^-9, times a 6-bit minimum).
std::vector<uint8_t> RandomBlocks(WeightQuant q, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t bytes = GgmlQuantBlockBytes(q);
  std::vector<uint8_t> out(n * (k / GgmlQuantBlockElements(q)) * bytes);
  for (size_t b = 0; b < out.size() / bytes; ++b) {
    uint8_t* block = out.data() + b * bytes;
    for (int64_t i = 0; i < bytes; ++i) block[i] = static_cast<uint8_t>(rng());
    if (q == WeightQuant::kQ6_K) {
      const uint16_t d = RandomHalf(rng, 3, 9, false);
      std::memcpy(block + 208, &d, 2);
    } else if (IsK(q)) {
      const uint16_t d = RandomHalf(rng, 3, 9, false), dmin = RandomHalf(rng, 3, 9, false);
      std::memcpy(block, &d, 2);
      std::memcpy(block + 2, &dmin, 2);
    } else {
      const uint16_t d = RandomHalf(rng, 6, 12, false);
      std::memcpy(block, &d, 2);
    }
    if (q == WeightQuant::kQ4_1 || q == WeightQuant::kQ5_1) {
      const uint16_t m = RandomHalf(rng, 10, 14, true);
      std::memcpy(block + 2, &m, 2);
    }
  }
  return out;
}

std::vector<uint8_t> Pack(WeightQuant q, const std::vector<uint8_t>& blocks, int64_t n, int64_t k) {
  std::vector<uint8_t> packed(PackedQuantBytes(q, n, k));
  const int64_t row_bytes = k / GgmlQuantBlockElements(q) * GgmlQuantBlockBytes(q);
  const int64_t panel_bytes = QuantPanelBytes(q, k);
  for (int64_t p = 0; p * kPanel < n; ++p) {
    PackQuantPanel(q, blocks.data() + p * kPanel * row_bytes, std::min(kPanel, n - p * kPanel), k,
                   packed.data() + p * panel_bytes);
  }
  return packed;
}

std::vector<float> RandomActivations(int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(rows * k);
  for (float& v : x) v = dist(rng);
  // Some blocks of zeros and some with one large value (the scale's extremes).
  if (rows * k >= 64) {
    std::fill(x.begin(), x.begin() + 32, 0.0f);
    x[40] = 300.0f;
  }
  return x;
}

struct Quantized {
  std::vector<int8_t> q;
  std::vector<ActivationBlock> blocks;
  QuantizedRows rows;
};

Quantized QuantizeRows(const std::vector<float>& x, int64_t rows, int64_t k) {
  Quantized a;
  const int64_t blocks = k / kQuantBlock;
  a.q.resize(rows * k);
  a.blocks.resize(rows * blocks);
  for (int64_t m = 0; m < rows; ++m) {
    QuantizeActivationRow(x.data() + m * k, k, a.q.data() + m * k, a.blocks.data() + m * blocks);
  }
  a.rows = {a.q.data(), a.blocks.data(), k};
  return a;
}

std::vector<QuantIsa> Variants() {
  std::vector<QuantIsa> out;
  for (QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (QuantIsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

TEST(CpuQuantTest, PackedRowsDequantizeAsGgmlDoes) {
  for (WeightQuant q : kFormats) {
    const int64_t n = 37, k = IsK(q) ? 512 : 96;
    const std::vector<uint8_t> blocks = RandomBlocks(q, n, k, 11);
    std::vector<float> want(n * k);
    ASSERT_TRUE(
        DequantizeToF32(GgmlTypeOfWeightQuant(q), blocks.data(), blocks.size(), n * k, want.data())
            .ok());
    const std::vector<uint8_t> packed = Pack(q, blocks, n, k);
    std::vector<float> got(k);
    for (int64_t r = 0; r < n; ++r) {
      DequantizePackedRow(q, packed.data(), r, k, got.data());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data() + r * k, k * 4))
          << WeightQuantName(q) << " row " << r;
    }
  }
}

TEST(CpuQuantTest, ActivationQuantizationFollowsItsDefinition) {
  const int64_t k = 128;
  const std::vector<float> x = RandomActivations(1, k, 5);
  const Quantized a = QuantizeRows(x, 1, k);
  for (int64_t b = 0; b < k / kQuantBlock; ++b) {
    int32_t total = 0, total_lo = 0;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f;
    const ActivationBlock& block = a.blocks[b];
    EXPECT_EQ(block.d, HalfToFloat(FloatToHalf(d)));
    EXPECT_LE(std::fabs(block.d - d), d * 0x1.0p-11f);
    for (int i = 0; i < 32; ++i) {
      const int8_t q = a.q[b * 32 + i];
      total += q;
      if (i < 16) total_lo += q;
      EXPECT_LE(std::abs(static_cast<int>(q)), 127);
      EXPECT_LE(std::fabs(x[b * 32 + i] - d * q), d * 0.5f * (1 + 1e-5f));
    }
    EXPECT_EQ(block.sum, total);
    EXPECT_EQ(block.sum_lo, total_lo);
    EXPECT_EQ(block.s, HalfToFloat(FloatToHalf(d * static_cast<float>(total))));
  }
  // The first block is all zeros: scale 0, quants 0.
  EXPECT_EQ(a.blocks[0].d, 0.0f);
  EXPECT_EQ(a.blocks[0].sum, 0);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t HardwareHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, 0));
}
__attribute__((target("f16c"))) float HardwareWiden(uint16_t h) { return _cvtsh_ss(h); }

TEST(FloatMathTest, HalfConversionsAreF16cs) {
  if (!CpuHasF16c()) GTEST_SKIP() << "no F16C here";
  std::mt19937 rng(3);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = rng();
    if (i % 2 == 0) bits = (bits & 0x807fffff) | ((96 + bits % 48) << 23);  // near fp16's range
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), HardwareHalf(f)) << std::hexfloat << f;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = HardwareWiden(static_cast<uint16_t>(h)), got = HalfToFloat(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(0, std::memcmp(&want, &got, 4)) << h;
    }
  }
}
#endif

TEST(CpuQuantTest, EveryVariantReproducesTheScalarDefinition) {
  const std::vector<QuantIsa> variants = Variants();
  RecordProperty("variants", static_cast<int>(variants.size()));
  for (WeightQuant q : kFormats) {
    for (int64_t k : Lengths(q)) {
      for (int64_t n : {16, 37, 100}) {
        const std::vector<uint8_t> packed = Pack(q, RandomBlocks(q, n, k, 7 + n + k), n, k);
        const int64_t panels = (n + kPanel - 1) / kPanel;
        for (int64_t rows : {1, 2, 3, 5, 7, 13}) {
          const Quantized a = QuantizeRows(RandomActivations(rows, k, 3 * rows + k), rows, k);
          std::vector<float> want(rows * n, -1.0f);
          QuantGemmFor(QuantIsa::kScalar)(q, a.rows, rows, packed.data(), 0, panels, n, want.data(),
                                          n);
          for (QuantIsa isa : variants) {
            std::vector<float> got(rows * n, -2.0f);
            // Two panel ranges, as the backend splits columns over threads.
            const int64_t mid = panels / 2;
            QuantGemmFor(isa)(q, a.rows, rows, packed.data(), 0, mid, n, got.data(), n);
            QuantGemmFor(isa)(q, a.rows, rows, packed.data(), mid, panels, n, got.data(), n);
            ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
                << WeightQuantName(q) << " " << QuantIsaName(isa) << " k=" << k << " n=" << n
                << " rows=" << rows;
          }
        }
      }
    }
  }
}

TEST(CpuQuantTest, ScalarDefinitionIsWithinTheActivationRoundingOfAnExactProduct) {
  const int64_t n = 40, rows = 3;
  for (WeightQuant q : kFormats) {
    const int64_t k = IsK(q) ? 768 : 576;
    const std::vector<uint8_t> blocks = RandomBlocks(q, n, k, 21);
    std::vector<float> w(n * k);
    ASSERT_TRUE(
        DequantizeToF32(GgmlTypeOfWeightQuant(q), blocks.data(), blocks.size(), n * k, w.data())
            .ok());
    const std::vector<float> x = RandomActivations(rows, k, 9);
    const Quantized a = QuantizeRows(x, rows, k);
    std::vector<float> got(rows * n);
    QuantGemmFor(QuantIsa::kScalar)(q, a.rows, rows, Pack(q, blocks, n, k).data(), 0,
                                    (n + kPanel - 1) / kPanel, n, got.data(), n);
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t c = 0; c < n; ++c) {
        double exact = 0, bound = 0, magnitude = 0;
        for (int64_t i = 0; i < k; ++i) {
          exact += static_cast<double>(w[c * k + i]) * x[m * k + i];
          magnitude += std::fabs(static_cast<double>(w[c * k + i]) * x[m * k + i]);
          // |x - dx q| <= d / 2 + 127 |d - dx| <= dx (1/2 + 127 * 2^-10) per element (d within
          // 2^-11 of dx): the activation quantization's whole error.
          bound += std::fabs(static_cast<double>(w[c * k + i])) *
                   a.blocks[m * (k / 32) + i / 32].d * (0.5 + 127.0 / 1024);
        }
        // Plus fp32 rounding of the per-block products and sums (a few ulps of the magnitude).
        bound += 1e-5 * magnitude + 1e-30;
        ASSERT_LE(std::fabs(got[m * n + c] - exact), bound)
            << WeightQuantName(q) << " row " << m << " col " << c;
      }
    }
  }
}

// The backend's MatMul on quantized weights: the same bits for one row alone and within a batch,
// whatever the thread count, and equal to the kernel called directly.
TEST(CpuQuantTest, BackendMatMulIsTheKernelsProductForAnyBatch) {
  const int64_t n = 200;
  for (WeightQuant q :
       {WeightQuant::kQ4_1, WeightQuant::kQ8_0, WeightQuant::kQ5_0, WeightQuant::kQ6_K}) {
    const int64_t k = IsK(q) ? 512 : 192;
    const int64_t row_bytes = k / GgmlQuantBlockElements(q) * GgmlQuantBlockBytes(q);
    const std::vector<uint8_t> blocks = RandomBlocks(q, n, k, 31);
    const std::vector<float> x = RandomActivations(9, k, 17);
    std::vector<float> want(9 * n);
    {
      const Quantized a = QuantizeRows(x, 9, k);
      QuantGemmFor(QuantIsa::kScalar)(q, a.rows, 9, Pack(q, blocks, n, k).data(), 0,
                                      (n + kPanel - 1) / kPanel, n, want.data(), n);
    }
    for (int threads : {1, 2, 3}) {
      auto backend = CpuBackend::Create({threads, std::nullopt});
      ASSERT_TRUE(backend.ok());
      auto weight = (*backend)->UploadQuantizedWeight(blocks.data(), blocks.size(), q, n, k);
      ASSERT_TRUE(weight.ok()) << weight.status();
      for (int64_t rows : {1, 9}) {
        std::vector<float> xin(x.begin(), x.begin() + rows * k), out(rows * n);
        (*backend)->MatMul(DeviceMatrix::Dense(xin.data(), DType::kF32, rows, k), *weight, nullptr,
                           DeviceMatrix::Dense(out.data(), DType::kF32, rows, n));
        ASSERT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * 4))
            << WeightQuantName(q) << " threads " << threads << " rows " << rows;
      }
      // Embedding rows of a quantized table are its dequantized rows.
      std::vector<float> row(k), embedded(k);
      ASSERT_TRUE(DequantizeToF32(GgmlTypeOfWeightQuant(q), blocks.data() + 5 * row_bytes,
                                  row_bytes, k, row.data())
                      .ok());
      (*backend)->Embed(*weight, {5}, DeviceMatrix::Dense(embedded.data(), DType::kF32, 1, k));
      ASSERT_EQ(0, std::memcmp(row.data(), embedded.data(), k * 4));
    }
  }
}

TEST(CpuQuantTest, UploadRejectsBadShapes) {
  auto backend = CpuBackend::Create({1, std::nullopt});
  ASSERT_TRUE(backend.ok());
  std::vector<uint8_t> blocks(20 * 4);
  EXPECT_FALSE((*backend)
                   ->UploadQuantizedWeight(blocks.data(), blocks.size(), WeightQuant::kQ4_1, 2, 48)
                   .ok());  // not whole blocks
  EXPECT_FALSE((*backend)
                   ->UploadQuantizedWeight(blocks.data(), blocks.size(), WeightQuant::kQ4_1, 3, 32)
                   .ok());  // bytes do not match
  EXPECT_FALSE((*backend)
                   ->UploadQuantizedWeight(blocks.data(), blocks.size(), WeightQuant::kNone, 4, 32)
                   .ok());
  EXPECT_TRUE((*backend)
                  ->UploadQuantizedWeight(blocks.data(), blocks.size(), WeightQuant::kQ4_1, 4, 32)
                  .ok());
  std::vector<uint8_t> k_blocks(144 * 2);
  EXPECT_FALSE(
      (*backend)
          ->UploadQuantizedWeight(k_blocks.data(), k_blocks.size(), WeightQuant::kQ4_K, 8, 64)
          .ok());  // a K-quant row is whole super-blocks of 256
  EXPECT_TRUE(
      (*backend)
          ->UploadQuantizedWeight(k_blocks.data(), k_blocks.size(), WeightQuant::kQ4_K, 2, 256)
          .ok());
}

}  // namespace
}  // namespace ferry
