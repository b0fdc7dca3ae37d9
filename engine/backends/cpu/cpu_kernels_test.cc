// The CPU backend's kernels: every instruction-set variant gives bit-identical results (the
// canonical order of cpu_kernels.h), the engine's Exp is accurate, and each backend kernel agrees
// with a direct double-precision computation written here from its definition.

#include "engine/backends/cpu/cpu_kernels.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/float_math.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

// Distance in units in the last place between two finite floats of the same sign.
int64_t UlpDistance(float a, float b) {
  const int64_t ia = Bits(a), ib = Bits(b);
  return std::llabs(ia - ib);
}

TEST(ExpTest, WithinTwoUlpsOfCorrectlyRoundedOverTheRange) {
  int64_t worst = 0;
  for (float x = -103.0f; x <= 88.7f; x += 0.0137f) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t d = UlpDistance(Exp(x), want);
    worst = std::max(worst, d);
    ASSERT_LE(d, 2) << "x=" << x;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-20.0f, 20.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = dist(rng);
    ASSERT_LE(UlpDistance(Exp(x), static_cast<float>(std::exp(static_cast<double>(x)))), 2)
        << "x=" << x;
  }
  RecordProperty("worst_ulp", static_cast<int>(worst));
}

TEST(ExpTest, SpecialValues) {
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(-0.0f), 1.0f);
  EXPECT_EQ(Exp(89.0f), INFINITY);
  EXPECT_EQ(Exp(INFINITY), INFINITY);
  EXPECT_EQ(Exp(-INFINITY), 0.0f);
  EXPECT_EQ(Exp(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(Exp(NAN)));
  // Subnormal results are rounded once.
  const float sub = Exp(-100.0f);
  EXPECT_GT(sub, 0.0f);
  EXPECT_LE(UlpDistance(sub, static_cast<float>(std::exp(-100.0))), 1);
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + 0x1.0p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3f81);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

std::vector<float> Packed(const std::vector<float>& w, int64_t n, int64_t k) {
  std::vector<float> out(PackedElements(n, k));
  PackPanels(w.data(), n, k, out.data());
  return out;
}

std::vector<uint16_t> Packed(const std::vector<uint16_t>& w, int64_t n, int64_t k) {
  std::vector<uint16_t> out(PackedElementsBf16(n, k));
  PackPanelsBf16(w.data(), n, k, out.data());
  return out;
}

// Rows of x as the bf16 product reads them.
std::vector<uint16_t> Activations(const std::vector<float>& x, int64_t rows, int64_t k) {
  std::vector<uint16_t> out(rows * PairedK(k));
  for (int64_t m = 0; m < rows; ++m) {
    RoundActivationsBf16(x.data() + m * k, k, out.data() + m * PairedK(k));
  }
  return out;
}

TEST(CpuKernelsTest, EveryVariantIsBitIdenticalToTheScalarDefinition) {
  const CpuKernels& ref = CpuKernelsFor(CpuIsa::kScalar);
  for (CpuIsa isa : SupportedCpuIsas()) {
    const CpuKernels& kern = CpuKernelsFor(isa);
    // Matrix products, every row count the tiles distinguish, ragged column counts.
    for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17}) {
      for (int64_t n : {1, 16, 37, 100}) {
        const int64_t k = 19 + rows;
        auto x = RandomFloats(rows * k, rows), w = RandomFloats(n * k, n);
        if (rows % 4 == 1) {
          // Tiny values: products and sums in the subnormal range (flushed in the bf16 product).
          for (float& v : x) v = std::ldexp(v, -60);
          for (float& v : w) v = std::ldexp(v, -66);
        }
        const auto pf = Packed(w, n, k);
        const auto pb = Packed(ToBf16(w), n, k);
        const int64_t panels = (n + kPanel - 1) / kPanel;
        std::vector<float> a(rows * n, -1), b(rows * n, -1);
        kern.gemm_f32(x.data(), k, rows, k, pf.data(), 0, panels, n, a.data(), n);
        ref.gemm_f32(x.data(), k, rows, k, pf.data(), 0, panels, n, b.data(), n);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
            << CpuIsaName(isa) << " f32 rows=" << rows << " n=" << n;
        const auto xb = Activations(x, rows, k);
        const int64_t k2 = PairedK(k);
        kern.gemm_bf16(xb.data(), k2, rows, k2, pb.data(), 0, panels, n, a.data(), n);
        ref.gemm_bf16(xb.data(), k2, rows, k2, pb.data(), 0, panels, n, b.data(), n);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
            << CpuIsaName(isa) << " bf16 rows=" << rows << " n=" << n;
      }
    }
    for (int64_t n : {1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 576, 1537}) {
      const auto x = RandomFloats(n, 1 + n), w = RandomFloats(n, 2 + n, 3.0f);
      const auto wb = ToBf16(w);
      EXPECT_EQ(Bits(kern.sum_squares(x.data(), n)), Bits(ref.sum_squares(x.data(), n)));
      // Softmax pieces over a wide range including the edges: scale + max, Exp + sum.
      std::vector<float> e = RandomFloats(n, 4 + n, 40.0f);
      if (n > 4) e[0] = 89.0f, e[1] = -104.0f, e[2] = NAN, e[3] = -0.0f, e[4] = -100.0f;
      std::vector<float> ea = e, eb = e;
      const float ma = kern.scale_max(ea.data(), n, 1.25f), mb = ref.scale_max(eb.data(), n, 1.25f);
      EXPECT_EQ(ma, mb) << CpuIsaName(isa) << " max n=" << n;
      EXPECT_EQ(0, std::memcmp(ea.data(), eb.data(), n * 4)) << CpuIsaName(isa) << " scale";
      // Subtracting 0 keeps the edge values: overflow, underflow, NaN, -0.
      EXPECT_EQ(Bits(kern.exp_sum(ea.data(), n, 0.0f)), Bits(ref.exp_sum(eb.data(), n, 0.0f)))
          << CpuIsaName(isa) << " exp sum n=" << n;
      EXPECT_EQ(0, std::memcmp(ea.data(), eb.data(), n * 4)) << CpuIsaName(isa) << " exp";
      ea = e, eb = e;
      EXPECT_EQ(Bits(kern.exp_sum(ea.data(), n, 3.5f)), Bits(ref.exp_sum(eb.data(), n, 3.5f)));
      EXPECT_EQ(0, std::memcmp(ea.data(), eb.data(), n * 4)) << CpuIsaName(isa) << " exp";
      kern.silu_mul(e.data(), x.data(), ea.data(), n);
      ref.silu_mul(e.data(), x.data(), eb.data(), n);
      EXPECT_EQ(0, std::memcmp(ea.data(), eb.data(), n * 4)) << CpuIsaName(isa) << " silu";
    }
    // Weighted sums of value rows for 1..14 queries at once (the register tiles' sizes and
    // their remainders), dims around the vector and chunk widths.
    for (int64_t dims : {8, 24, 32, 64, 72, 80, 128, 136}) {
      for (int64_t queries : {1, 2, 3, 4, 5, 6, 7, 9, 12, 14}) {
        const int64_t count = 13, ld = dims + 5, ps = count + 2, as = dims + 3;
        const auto p = RandomFloats(queries * ps, 7), v = RandomFloats(count * ld, 8);
        const auto vb = ToBf16(v);
        std::vector<float> a = RandomFloats(queries * as, 9), b = a;
        kern.weighted_rows_f32(p.data(), ps, queries, v.data(), ld, count, dims, a.data(), as);
        ref.weighted_rows_f32(p.data(), ps, queries, v.data(), ld, count, dims, b.data(), as);
        kern.weighted_rows_bf16(p.data(), ps, queries, vb.data(), ld, count, dims, a.data(), as);
        ref.weighted_rows_bf16(p.data(), ps, queries, vb.data(), ld, count, dims, b.data(), as);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
            << CpuIsaName(isa) << " dims=" << dims << " queries=" << queries;
      }
      const int64_t count = 13, ld = dims + 5;
      const auto v = RandomFloats(count * ld, 8);
      std::vector<uint16_t> ra(count * ld + 1), rb(count * ld + 1);
      std::vector<float> odd = v;
      odd[3] = NAN;
      odd[4] = std::ldexp(1.0f, -130);
      kern.round_bf16(odd.data(), count * ld, ra.data());
      ref.round_bf16(odd.data(), count * ld, rb.data());
      EXPECT_EQ(ra, rb) << CpuIsaName(isa);
    }
    // Attention scores over column-wise keys (ld larger than the count, as in a partial block),
    // for 1..13 queries at once.
    for (int64_t count : {1, 7, 8, 15, 16, 17, 31, 32, 40, 64, 65, 100}) {
      for (int64_t queries : {1, 2, 3, 5, 6, 7, 8, 9, 13}) {
        const int64_t dims = 24, ld = count + 3, qs = dims + 1, ss = count + 4;
        const auto q = RandomFloats(queries * qs, 5), kt = RandomFloats(dims * ld, 6);
        const auto ktb = ToBf16(kt);
        std::vector<float> a(queries * ss, -1), b(queries * ss, -1);
        kern.dot_columns_f32(q.data(), qs, queries, kt.data(), ld, dims, count, a.data(), ss);
        ref.dot_columns_f32(q.data(), qs, queries, kt.data(), ld, dims, count, b.data(), ss);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
            << CpuIsaName(isa) << " count=" << count << " queries=" << queries;
        kern.dot_columns_bf16(q.data(), qs, queries, ktb.data(), ld, dims, count, a.data(), ss);
        ref.dot_columns_bf16(q.data(), qs, queries, ktb.data(), ld, dims, count, b.data(), ss);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
            << CpuIsaName(isa) << " count=" << count << " queries=" << queries;
      }
    }
  }
}

TEST(CpuKernelsTest, ProductsFollowTheDocumentedOrder) {
  // Written out here from the header's description: one accumulator, fma in increasing k.
  const int64_t n = 3, k = 45;
  const auto x = RandomFloats(k, 11), w = RandomFloats(n * k, 12);
  const auto packed = Packed(w, n, k);
  for (CpuIsa isa : SupportedCpuIsas()) {
    std::vector<float> out(n);
    CpuKernelsFor(isa).gemm_f32(x.data(), k, 1, k, packed.data(), 0, 1, n, out.data(), n);
    for (int64_t c = 0; c < n; ++c) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) acc = std::fma(x[i], w[c * k + i], acc);
      EXPECT_EQ(Bits(out[c]), Bits(acc)) << CpuIsaName(isa);
    }
    // bf16: activations rounded, pairs, odd element first.
    const auto wb = ToBf16(w);
    const auto pb = Packed(wb, n, k);
    const auto xb = Activations(x, 1, k);
    CpuKernelsFor(isa).gemm_bf16(xb.data(), PairedK(k), 1, PairedK(k), pb.data(), 0, 1, n,
                                 out.data(), n);
    for (int64_t c = 0; c < n; ++c) {
      float acc = 0.0f;
      for (int64_t i = 0; i + 1 < PairedK(k); i += 2) {
        const float x1 = i + 1 < k ? RoundToBf16(x[i + 1]) : 0.0f;
        const float w1 = i + 1 < k ? Bf16ToFloat(wb[c * k + i + 1]) : 0.0f;
        acc = std::fma(x1, w1, acc);
        acc = std::fma(RoundToBf16(x[i]), Bf16ToFloat(wb[c * k + i]), acc);
      }
      EXPECT_EQ(Bits(out[c]), Bits(acc)) << CpuIsaName(isa);
    }
    float a[16] = {};
    for (int64_t i = 0; i < k; ++i) a[i % 16] = std::fma(x[i], x[i], a[i % 16]);
    for (int j = 0; j < 8; ++j) a[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; ++j) a[j] = a[j] + a[j + 4];
    for (int j = 0; j < 2; ++j) a[j] = a[j] + a[j + 2];
    EXPECT_EQ(Bits(CpuKernelsFor(isa).sum_squares(x.data(), k)), Bits(a[0] + a[1]));
    // The softmax denominator: Exp(x - sub) added to partial i mod 16, the same tree.
    float e[16] = {};
    for (int64_t i = 0; i < k; ++i) e[i % 16] = e[i % 16] + Exp(x[i] - 0.5f);
    for (int j = 0; j < 8; ++j) e[j] = e[j] + e[j + 8];
    for (int j = 0; j < 4; ++j) e[j] = e[j] + e[j + 4];
    for (int j = 0; j < 2; ++j) e[j] = e[j] + e[j + 2];
    std::vector<float> ex = x;
    EXPECT_EQ(Bits(CpuKernelsFor(isa).exp_sum(ex.data(), k, 0.5f)), Bits(e[0] + e[1]));
    for (int64_t i = 0; i < k; ++i) EXPECT_EQ(Bits(ex[i]), Bits(Exp(x[i] - 0.5f)));
  }
}

TEST(CpuKernelsTest, ForcedIsaThroughTheEnvironment) {
  setenv("FERRY_CPU_ISA", "scalar", 1);
  auto isa = SelectCpuIsa();
  ASSERT_TRUE(isa.ok());
  EXPECT_EQ(*isa, CpuIsa::kScalar);
  setenv("FERRY_CPU_ISA", "sse9", 1);
  EXPECT_EQ(SelectCpuIsa().status().code(), absl::StatusCode::kInvalidArgument);
  unsetenv("FERRY_CPU_ISA");
  ASSERT_TRUE(SelectCpuIsa().ok());
}

// ---- Backend kernels against direct double-precision computations. ----

class CpuBackendTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    CpuBackendOptions options;
    options.threads = 2;
    options.isa = GetParam();
    auto b = CpuBackend::Create(options);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }
  // Host vectors double as device memory on the CPU backend.
  static DeviceMatrix M(std::vector<float>& v, int64_t rows, int64_t cols) {
    return DeviceMatrix::Dense(v.data(), DType::kF32, rows, cols);
  }
  std::unique_ptr<CpuBackend> backend_;
};

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * scale + 1e-30) << "element " << i;
  }
}

TEST_P(CpuBackendTest, MatMulWithBiasF32AndBf16) {
  const int64_t m = 5, n = 37, k = 70;
  auto x = RandomFloats(m * k, 1), w = RandomFloats(n * k, 2), bias = RandomFloats(n, 3);
  auto wb = ToBf16(w);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<float> out(m * n);
    auto wm = *backend_->UploadWeight(
        dt == DType::kF32 ? static_cast<const void*>(w.data()) : wb.data(), dt, n, k);
    const DeviceMatrix bm = M(bias, 1, n);
    backend_->MatMul(M(x, m, k), wm, &bm, M(out, m, n));
    std::vector<double> want(m * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = bias[j];
        for (int64_t t = 0; t < k; ++t) {
          s += dt == DType::kF32 ? double{x[i * k + t]} * w[j * k + t]
                                 : double{RoundToBf16(x[i * k + t])} * Bf16ToFloat(wb[j * k + t]);
        }
        want[i * n + j] = s;
      }
    }
    ExpectClose(out, want, 1e-5);
    // One row alone gives the same bits as inside the batch.
    std::vector<float> row(n);
    backend_->MatMul(M(x, m, k).RowRange(3, 1), wm, &bm, M(row, 1, n));
    EXPECT_EQ(0, std::memcmp(row.data(), out.data() + 3 * n, n * 4));
  }
}

TEST_P(CpuBackendTest, RmsNormSwiGluAddEmbed) {
  const int64_t rows = 3, cols = 24;
  auto x = RandomFloats(rows * cols, 4), w = RandomFloats(cols, 5);
  std::vector<float> out(rows * cols);
  backend_->RmsNorm(M(x, rows, cols), M(w, 1, cols), 1e-5f, M(out, rows, cols));
  std::vector<double> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += double{x[r * cols + c]} * x[r * cols + c];
    const double inv = 1 / std::sqrt(ss / cols + 1e-5);
    for (int64_t c = 0; c < cols; ++c) want[r * cols + c] = x[r * cols + c] * inv * w[c];
  }
  ExpectClose(out, want, 1e-6);

  auto g = RandomFloats(rows * cols, 6, 4.0f), u = RandomFloats(rows * cols, 7);
  backend_->SwiGlu(M(g, rows, cols), M(u, rows, cols), M(out, rows, cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    want[i] = g[i] / (1 + std::exp(-double{g[i]})) * u[i];
  }
  ExpectClose(out, want, 1e-6);

  std::vector<float> acc = x;
  backend_->Add(M(acc, rows, cols), M(u, rows, cols));
  for (int64_t i = 0; i < rows * cols; ++i) EXPECT_EQ(acc[i], x[i] + u[i]);

  auto table = RandomFloats(20 * cols, 8);
  auto tb = ToBf16(table);
  backend_->Embed(*backend_->UploadWeight(tb.data(), DType::kBF16, 20, cols), {7, 0, 17},
                  M(out, rows, cols));
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_EQ(out[c], Bf16ToFloat(tb[7 * cols + c]));
    EXPECT_EQ(out[cols + c], Bf16ToFloat(tb[c]));
    EXPECT_EQ(out[2 * cols + c], Bf16ToFloat(tb[17 * cols + c]));
  }
  // Grouped RMSNorm (per head) and the fused residual + norm.
  std::vector<float> wg = RandomFloats(8, 13);
  backend_->RmsNorm(M(x, rows, cols), M(wg, 1, 8), 1e-5f, M(out, rows, cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols; g += 8) {
      double ss = 0;
      for (int64_t c = 0; c < 8; ++c) ss += double{x[r * cols + g + c]} * x[r * cols + g + c];
      for (int64_t c = 0; c < 8; ++c) {
        EXPECT_NEAR(out[r * cols + g + c], x[r * cols + g + c] / std::sqrt(ss / 8 + 1e-5) * wg[c],
                    1e-5);
      }
    }
  }
  std::vector<float> res = x, delta = u, normed(rows * cols);
  backend_->AddRmsNorm(M(res, rows, cols), M(delta, rows, cols), M(w, 1, cols), 1e-5f,
                       M(delta, rows, cols));
  std::vector<float> summed = x;
  for (int64_t i = 0; i < rows * cols; ++i) summed[i] = x[i] + u[i];
  backend_->RmsNorm(M(summed, rows, cols), M(w, 1, cols), 1e-5f, M(normed, rows, cols));
  EXPECT_EQ(res, summed);
  EXPECT_EQ(0, std::memcmp(delta.data(), normed.data(), normed.size() * 4));
}

TEST_P(CpuBackendTest, RopeRotatesPairsHalfApart) {
  const int64_t heads = 2, d = 8, positions = 16;
  std::vector<float> table(positions * d);
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < d / 2; ++i) {
      table[p * d + i] = static_cast<float>(std::cos(p * 0.3 * (i + 1)));
      table[p * d + d / 2 + i] = static_cast<float>(std::sin(p * 0.3 * (i + 1)));
    }
  }
  auto x = RandomFloats(2 * heads * d, 9);
  auto y = x;
  backend_->Rope(M(y, 2, heads * d), heads, {0, 5}, RopeTable{M(table, positions, d)});
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d; ++i) EXPECT_EQ(y[h * d + i], x[h * d + i]);  // position 0
    const float* in = &x[heads * d + h * d];
    const float* out = &y[heads * d + h * d];
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = 5 * 0.3 * (i + 1);
      EXPECT_NEAR(out[i], in[i] * std::cos(a) - in[i + d / 2] * std::sin(a), 1e-5);
      EXPECT_NEAR(out[i + d / 2], in[i + d / 2] * std::cos(a) + in[i] * std::sin(a), 1e-5);
    }
  }
}

// Paged attention over two sequences with scattered block tables, against softmax(q k^T) v
// computed directly from the K/V rows (rounded to the cache dtype as the cache holds them).
TEST_P(CpuBackendTest, PagedAttentionMatchesDirectSoftmax) {
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    const int32_t block_tokens = 4, kv_heads = 2, heads = 4, d = 8, num_blocks = 8;
    const size_t elem = DTypeBytes(kv_dtype);
    const size_t head_bytes = block_tokens * d * elem;
    KvLayerView view;
    view.block_bytes = 2 * kv_heads * head_bytes;
    view.k_offset = 0;
    view.v_offset = kv_heads * head_bytes;
    view.block_tokens = block_tokens;
    view.kv_heads = kv_heads;
    view.head_dim = d;
    view.dtype = kv_dtype;
    std::vector<char> pool(num_blocks * view.block_bytes);
    view.base = pool.data();
    // Sequence 0: 7 tokens in blocks {5, 1}; sequence 1: 3 tokens in block {6}.
    StepLayout layout;
    layout.block_tables = {{5, 1}, {6}};
    for (int32_t p = 0; p < 7; ++p) {
      layout.positions.push_back(p);
      layout.row_sequence.push_back(0);
    }
    for (int32_t p = 0; p < 3; ++p) {
      layout.positions.push_back(p);
      layout.row_sequence.push_back(1);
    }
    const int64_t rows = layout.rows();
    auto k = RandomFloats(rows * kv_heads * d, 10), v = RandomFloats(rows * kv_heads * d, 11);
    auto q = RandomFloats(rows * heads * d, 12);
    backend_->WriteKv(M(k, rows, kv_heads * d), M(v, rows, kv_heads * d), view, layout);
    for (int32_t window : {0, 3, 5}) {
      std::vector<float> out(rows * heads * d);
      backend_->Attention(M(q, rows, heads * d), view, layout, 0.35f, window,
                          M(out, rows, heads * d));
      auto cached = [&](float f) { return kv_dtype == DType::kF32 ? f : RoundToBf16(f); };
      std::vector<double> want(rows * heads * d);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t seq_first = layout.row_sequence[r] == 0 ? 0 : 7;  // the sequence's first row
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t kh = h / (heads / kv_heads);
          std::vector<double> s;
          double mx = -1e300;
          const int64_t first = window > 0 ? std::max(0, layout.positions[r] + 1 - window) : 0;
          for (int64_t j = first; j <= layout.positions[r]; ++j) {
            double dot = 0;
            for (int64_t i = 0; i < d; ++i) {
              dot += double{q[(r * heads + h) * d + i]} *
                     cached(k[((seq_first + j) * kv_heads + kh) * d + i]);
            }
            s.push_back(dot * 0.35);
            mx = std::max(mx, s.back());
          }
          double sum = 0;
          for (double& e : s) sum += (e = std::exp(e - mx));
          for (int64_t i = 0; i < d; ++i) {
            double o = 0;
            for (size_t j = 0; j < s.size(); ++j) {
              o += s[j] / sum * cached(v[((seq_first + first + j) * kv_heads + kh) * d + i]);
            }
            want[(r * heads + h) * d + i] = o;
          }
        }
      }
      ExpectClose(out, want, 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuBackendTest, ::testing::ValuesIn(SupportedCpuIsas()),
                         [](const auto& info) { return std::string(CpuIsaName(info.param)); });

}  // namespace
}  // namespace ferry
