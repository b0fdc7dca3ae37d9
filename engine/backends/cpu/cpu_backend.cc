#include "engine/backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/common/float_math.h"
#include "engine/common/log.h"

namespace ferry {
namespace {

constexpr size_t kAlignment = 64;
// Output columns per MatMul work item: a slice of weight rows that stays in cache while every
// row of x passes over it.
constexpr int64_t kColumnsPerItem = 16;

template <typename T>
T* Row(const DeviceMatrix& m, int64_t r) {
  return reinterpret_cast<T*>(static_cast<char*>(m.data) +
                              r * m.stride * static_cast<int64_t>(DTypeBytes(m.dtype)));
}

float Load(const DeviceMatrix& m, int64_t r, int64_t c) {
  return m.dtype == DType::kF32 ? Row<float>(m, r)[c] : Bf16ToFloat(Row<uint16_t>(m, r)[c]);
}

// Address of (block, kv head, slot) of K (`value` false) or V in a layer view.
char* KvRow(const KvLayerView& kv, int32_t block, int32_t head, int32_t slot, bool value) {
  const size_t elem = DTypeBytes(kv.dtype);
  return static_cast<char*>(kv.base) + static_cast<size_t>(block) * kv.block_bytes +
         (value ? kv.v_offset : kv.k_offset) +
         (static_cast<size_t>(head) * kv.block_tokens + slot) * kv.head_dim * elem;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const CpuBackendOptions& options) {
  CpuIsa isa;
  if (options.isa.has_value()) {
    if (!CpuSupports(*options.isa)) {
      return absl::FailedPreconditionError(
          absl::StrCat("this CPU does not support ", CpuIsaName(*options.isa)));
    }
    isa = *options.isa;
  } else {
    auto selected = SelectCpuIsa();
    if (!selected.ok()) return selected.status();
    isa = *selected;
  }
  if (options.threads < 0) return absl::InvalidArgumentError("threads must be >= 0");
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::unique_ptr<CpuBackend>(new CpuBackend(threads, isa));
}

CpuBackend::CpuBackend(int threads, CpuIsa isa)
    : isa_(isa), kernels_(CpuKernelsFor(isa)), pool_(std::make_unique<ThreadPool>(threads)) {}

std::string CpuBackend::name() const {
  return absl::StrCat("cpu (", CpuIsaName(isa_), ", ", pool_->threads(), " threads)");
}

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  const size_t rounded =
      std::max<size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return DeviceBuffer(this, p, bytes);
}

void CpuBackend::Free(void* data, size_t) { std::free(data); }

void CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
void CpuBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void CpuBackend::Embed(const DeviceMatrix& table, const std::vector<int32_t>& ids,
                       const DeviceMatrix& out) {
  CHECK_EQ(static_cast<int64_t>(ids.size()), out.rows);
  CHECK_EQ(table.cols, out.cols);
  pool_->ParallelFor(ids.size(), [&](size_t r) {
    CHECK(ids[r] >= 0 && ids[r] < table.rows);
    float* o = Row<float>(out, r);
    for (int64_t c = 0; c < out.cols; ++c) o[c] = Load(table, ids[r], c);
  });
}

void CpuBackend::RmsNorm(const DeviceMatrix& x, const DeviceMatrix& weight, float eps,
                         const DeviceMatrix& out) {
  CHECK_EQ(x.cols, weight.cols);
  CHECK(x.rows == out.rows && x.cols == out.cols);
  const int64_t n = x.cols;
  pool_->ParallelFor(x.rows, [&](size_t r) {
    const float* in = Row<float>(x, r);
    float* o = Row<float>(out, r);
    const float mean = kernels_.dot_f32(in, in, n) / static_cast<float>(n);
    const float inv = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) o[i] = Load(weight, 0, i) * (in[i] * inv);
  });
}

void CpuBackend::MatMul(const DeviceMatrix& x, const DeviceMatrix& w, const DeviceMatrix* bias,
                        const DeviceMatrix& out) {
  CHECK_EQ(x.cols, w.cols);
  CHECK(out.rows == x.rows && out.cols == w.rows);
  CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
  const int64_t m_rows = x.rows, n_cols = w.rows, k = x.cols;
  const int64_t items = (n_cols + kColumnsPerItem - 1) / kColumnsPerItem;
  pool_->ParallelFor(items, [&](size_t item) {
    const int64_t n0 = item * kColumnsPerItem;
    const int64_t n1 = std::min(n_cols, n0 + kColumnsPerItem);
    for (int64_t m = 0; m < m_rows; ++m) {
      const float* xr = Row<float>(x, m);
      float* o = Row<float>(out, m);
      for (int64_t n = n0; n < n1; ++n) {
        float v = w.dtype == DType::kF32 ? kernels_.dot_f32(xr, Row<float>(w, n), k)
                                         : kernels_.dot_bf16(xr, Row<uint16_t>(w, n), k);
        if (bias != nullptr) v += Load(*bias, 0, n);
        o[n] = v;
      }
    }
  });
}

void CpuBackend::Add(const DeviceMatrix& acc, const DeviceMatrix& x) {
  CHECK(acc.rows == x.rows && acc.cols == x.cols);
  pool_->ParallelFor(acc.rows, [&](size_t r) {
    float* a = Row<float>(acc, r);
    const float* b = Row<float>(x, r);
    for (int64_t c = 0; c < acc.cols; ++c) a[c] += b[c];
  });
}

void CpuBackend::SwiGlu(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& out) {
  CHECK(gate.rows == up.rows && gate.cols == up.cols);
  CHECK(out.rows == gate.rows && out.cols == gate.cols);
  pool_->ParallelFor(gate.rows, [&](size_t r) {
    const float* g = Row<float>(gate, r);
    const float* u = Row<float>(up, r);
    float* o = Row<float>(out, r);
    for (int64_t c = 0; c < gate.cols; ++c) o[c] = (g[c] / (1.0f + Exp(-g[c]))) * u[c];
  });
}

void CpuBackend::Rope(const DeviceMatrix& x, int32_t heads, const std::vector<int32_t>& positions,
                      const RopeTable& rope) {
  CHECK_EQ(static_cast<int64_t>(positions.size()), x.rows);
  CHECK_EQ(x.cols % heads, 0);
  const int64_t head_dim = x.cols / heads, half = head_dim / 2;
  CHECK_EQ(rope.table.cols, head_dim);
  pool_->ParallelFor(x.rows, [&](size_t r) {
    CHECK(positions[r] >= 0 && positions[r] < rope.table.rows);
    const float* cs = Row<float>(rope.table, positions[r]);
    float* row = Row<float>(x, r);
    for (int32_t h = 0; h < heads; ++h) {
      float* v = row + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half], c = cs[i], s = cs[half + i];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x1 * c + x0 * s;
      }
    }
  });
}

void CpuBackend::WriteKv(const DeviceMatrix& k, const DeviceMatrix& v, const KvLayerView& kv,
                         const StepLayout& layout) {
  CHECK(k.rows == layout.rows() && v.rows == layout.rows());
  CHECK(k.cols == kv.kv_heads * kv.head_dim && v.cols == k.cols);
  pool_->ParallelFor(k.rows, [&](size_t r) {
    const auto& table = layout.block_tables[layout.row_sequence[r]];
    const int32_t pos = layout.positions[r];
    CHECK_LT(pos / kv.block_tokens, static_cast<int32_t>(table.size()));
    const int32_t block = table[pos / kv.block_tokens], slot = pos % kv.block_tokens;
    for (int32_t h = 0; h < kv.kv_heads; ++h) {
      for (int which = 0; which < 2; ++which) {
        const float* src = Row<float>(which == 0 ? k : v, r) + h * kv.head_dim;
        char* dst = KvRow(kv, block, h, slot, which == 1);
        if (kv.dtype == DType::kF32) {
          std::memcpy(dst, src, kv.head_dim * sizeof(float));
        } else {
          uint16_t* d = reinterpret_cast<uint16_t*>(dst);
          for (int32_t i = 0; i < kv.head_dim; ++i) d[i] = FloatToBf16(src[i]);
        }
      }
    }
  });
}

void CpuBackend::Attention(const DeviceMatrix& q, const KvLayerView& kv, const StepLayout& layout,
                           float scale, const DeviceMatrix& out) {
  CHECK_EQ(q.rows, layout.rows());
  CHECK(out.rows == q.rows && out.cols == q.cols);
  const int32_t head_dim = kv.head_dim;
  const int64_t heads = q.cols / head_dim;
  CHECK_EQ(heads % kv.kv_heads, 0);
  const int64_t group = heads / kv.kv_heads;
  pool_->ParallelFor(q.rows * heads, [&](size_t item) {
    const int64_t r = item / heads, h = item % heads;
    const int32_t kv_head = static_cast<int32_t>(h / group);
    const auto& table = layout.block_tables[layout.row_sequence[r]];
    const int32_t pos = layout.positions[r];
    CHECK_LT(pos / kv.block_tokens, static_cast<int32_t>(table.size()));
    const float* qh = Row<float>(q, r) + h * head_dim;
    thread_local std::vector<float> scores;
    thread_local std::vector<float> acc;
    scores.resize(pos + 1);
    acc.assign(head_dim, 0.0f);
    float max_score = -std::numeric_limits<float>::infinity();
    for (int32_t j = 0; j <= pos; ++j) {
      const char* key = KvRow(kv, table[j / kv.block_tokens], kv_head, j % kv.block_tokens, false);
      const float dot =
          kv.dtype == DType::kF32
              ? kernels_.dot_f32(qh, reinterpret_cast<const float*>(key), head_dim)
              : kernels_.dot_bf16(qh, reinterpret_cast<const uint16_t*>(key), head_dim);
      scores[j] = dot * scale;
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0;
    for (int32_t j = 0; j <= pos; ++j) {
      const float e = Exp(scores[j] - max_score);
      sum += e;
      const char* value = KvRow(kv, table[j / kv.block_tokens], kv_head, j % kv.block_tokens, true);
      if (kv.dtype == DType::kF32) {
        kernels_.axpy_f32(e, reinterpret_cast<const float*>(value), acc.data(), head_dim);
      } else {
        kernels_.axpy_bf16(e, reinterpret_cast<const uint16_t*>(value), acc.data(), head_dim);
      }
    }
    float* o = Row<float>(out, r) + h * head_dim;
    for (int32_t d = 0; d < head_dim; ++d) o[d] = acc[d] / sum;
  });
}

}  // namespace ferry
