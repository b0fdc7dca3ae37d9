#include "engine/backends/cpu/cpu_backend.h"

#include <sys/mman.h>

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
constexpr size_t kHugePage = size_t{2} << 20;
// MatMul work items: up to this many rows, and column panels whose packed weights fit in about
// kPanelBytes (so a group stays in the L2 cache while every row block of x passes over it).
constexpr int64_t kRowsPerItem = 48;
constexpr int64_t kPanelBytes = 256 * 1024;
// Attention work items: about this many query vectors (heads of a KV group x rows).
constexpr int64_t kAttentionQueries = 24;

template <typename T>
T* Row(const DeviceMatrix& m, int64_t r) {
  return reinterpret_cast<T*>(static_cast<char*>(m.data) +
                              r * m.stride * static_cast<int64_t>(DTypeBytes(m.dtype)));
}

float Load(const DeviceMatrix& m, int64_t r, int64_t c) {
  return m.dtype == DType::kF32 ? Row<float>(m, r)[c] : Bf16ToFloat(Row<uint16_t>(m, r)[c]);
}

// Keys of (block, kv head): head_dim rows of block_tokens (column-wise keys).
char* KeyBlock(const KvLayerView& kv, int32_t block, int32_t head) {
  return static_cast<char*>(kv.base) + static_cast<size_t>(block) * kv.block_bytes + kv.k_offset +
         static_cast<size_t>(head) * kv.head_dim * kv.block_tokens * DTypeBytes(kv.dtype);
}

// Value of (block, kv head, slot): head_dim elements.
char* ValueRow(const KvLayerView& kv, int32_t block, int32_t head, int32_t slot) {
  return static_cast<char*>(kv.base) + static_cast<size_t>(block) * kv.block_bytes + kv.v_offset +
         (static_cast<size_t>(head) * kv.block_tokens + slot) * kv.head_dim * DTypeBytes(kv.dtype);
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
    : isa_(isa),
      kernels_(CpuKernelsFor(isa)),
      quant_isa_(QuantIsaFor(isa)),
      quant_gemm_(QuantGemmFor(quant_isa_)),
      pool_(std::make_unique<ThreadPool>(threads)) {}

std::string CpuBackend::name() const {
  return absl::StrCat("cpu (", CpuIsaName(isa_), ", quantized ", QuantIsaName(quant_isa_), ", ",
                      pool_->threads(), " threads)");
}

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  // Buffers of a huge page or more (weights, the KV pool) are aligned to it and asked to be
  // backed by huge pages: streaming the weights every decode step then costs a TLB miss per
  // 2 MiB instead of per 4 KiB.
  const size_t alignment = bytes >= kHugePage ? kHugePage : kAlignment;
  const size_t rounded = std::max(alignment, (bytes + alignment - 1) / alignment * alignment);
  void* p = std::aligned_alloc(alignment, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
#ifdef MADV_HUGEPAGE
  if (alignment == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);  // advice only
#endif
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

absl::StatusOr<DeviceWeight> CpuBackend::UploadWeight(const void* host, DType dtype, int64_t rows,
                                                      int64_t cols) {
  if (rows <= 0 || cols <= 0) return absl::InvalidArgumentError("empty weight matrix");
  DeviceWeight w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  auto buffer = Allocate(
      (dtype == DType::kF32 ? PackedElements(rows, cols) : PackedElementsBf16(rows, cols)) *
      DTypeBytes(dtype));
  if (!buffer.ok()) return buffer.status();
  w.buffer = std::move(*buffer);
  const int64_t panels = (rows + kPanel - 1) / kPanel;
  pool_->ParallelFor(panels, [&](size_t p) {
    const int64_t first = p * kPanel, n = std::min<int64_t>(kPanel, rows - first);
    if (dtype == DType::kF32) {
      PackPanels(static_cast<const float*>(host) + first * cols, n, cols,
                 static_cast<float*>(w.buffer.data()) + first * cols);
    } else {
      PackPanelsBf16(static_cast<const uint16_t*>(host) + first * cols, n, cols,
                     static_cast<uint16_t*>(w.buffer.data()) + first * PairedK(cols));
    }
  });
  return w;
}

absl::StatusOr<DeviceWeight> CpuBackend::UploadQuantizedWeight(const uint8_t* host, size_t bytes,
                                                               WeightQuant quant, int64_t rows,
                                                               int64_t cols) {
  if (quant == WeightQuant::kNone) return absl::InvalidArgumentError("not a block format");
  if (rows <= 0 || cols <= 0) return absl::InvalidArgumentError("empty weight matrix");
  const int64_t block = GgmlQuantBlockElements(quant);
  if (cols % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(WeightQuantName(quant), " rows of ", cols,
                                                   " values are not whole blocks of ", block));
  }
  const int64_t row_bytes = cols / block * GgmlQuantBlockBytes(quant);
  if (static_cast<int64_t>(bytes) != rows * row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(WeightQuantName(quant), " data of ", bytes, " bytes for ", rows, " x ", cols));
  }
  DeviceWeight w;
  w.quant = quant;
  w.rows = rows;
  w.cols = cols;
  auto buffer = Allocate(PackedQuantBytes(quant, rows, cols));
  if (!buffer.ok()) return buffer.status();
  w.buffer = std::move(*buffer);
  const int64_t panels = (rows + kPanel - 1) / kPanel;
  const int64_t panel_bytes = QuantPanelBytes(quant, cols);
  pool_->ParallelFor(panels, [&](size_t p) {
    const int64_t first = p * kPanel, n = std::min<int64_t>(kPanel, rows - first);
    PackQuantPanel(quant, host + first * row_bytes, n, cols,
                   static_cast<uint8_t*>(w.buffer.data()) + p * panel_bytes);
  });
  return w;
}

void CpuBackend::Embed(const DeviceWeight& table, const std::vector<int32_t>& ids,
                       const DeviceMatrix& out) {
  CHECK_EQ(static_cast<int64_t>(ids.size()), out.rows);
  CHECK_EQ(table.cols, out.cols);
  const int64_t k = table.cols;
  pool_->ParallelFor(ids.size(), [&](size_t r) {
    CHECK(ids[r] >= 0 && ids[r] < table.rows);
    float* o = Row<float>(out, r);
    if (table.quant != WeightQuant::kNone) {
      DequantizePackedRow(table.quant, static_cast<const uint8_t*>(table.buffer.data()), ids[r], k,
                          o);
    } else if (table.dtype == DType::kF32) {
      const int64_t base = ids[r] / kPanel * kPanel * k, c = ids[r] % kPanel;
      const float* panel = static_cast<const float*>(table.buffer.data()) + base;
      for (int64_t i = 0; i < k; ++i) o[i] = panel[i * kPanel + c];
    } else {
      const uint16_t* packed = static_cast<const uint16_t*>(table.buffer.data());
      for (int64_t i = 0; i < k; ++i) o[i] = Bf16ToFloat(packed[PackedIndexBf16(ids[r], i, k)]);
    }
  });
}

void CpuBackend::NormRow(const float* in, const DeviceMatrix& weight, float eps, int64_t cols,
                         float* o) const {
  const int64_t group = weight.cols;
  for (int64_t g = 0; g < cols; g += group) {
    const float mean = kernels_.sum_squares(in + g, group) / static_cast<float>(group);
    const float inv = 1.0f / std::sqrt(mean + eps);
    if (weight.dtype == DType::kF32) {
      const float* w = Row<float>(weight, 0);
      for (int64_t i = 0; i < group; ++i) o[g + i] = w[i] * (in[g + i] * inv);
    } else {
      for (int64_t i = 0; i < group; ++i) o[g + i] = Load(weight, 0, i) * (in[g + i] * inv);
    }
  }
}

void CpuBackend::RmsNorm(const DeviceMatrix& x, const DeviceMatrix& weight, float eps,
                         const DeviceMatrix& out) {
  CHECK(weight.cols > 0 && x.cols % weight.cols == 0);
  CHECK(x.rows == out.rows && x.cols == out.cols);
  pool_->ParallelFor(x.rows, [&](size_t r) {
    NormRow(Row<float>(x, r), weight, eps, x.cols, Row<float>(out, r));
  });
}

void CpuBackend::AddRmsNorm(const DeviceMatrix& x, const DeviceMatrix& delta,
                            const DeviceMatrix& weight, float eps, const DeviceMatrix& out) {
  CHECK(x.rows == delta.rows && x.cols == delta.cols && x.cols == weight.cols);
  CHECK(x.rows == out.rows && x.cols == out.cols);
  pool_->ParallelFor(x.rows, [&](size_t r) {
    float* a = Row<float>(x, r);
    const float* d = Row<float>(delta, r);
    for (int64_t c = 0; c < x.cols; ++c) a[c] += d[c];
    NormRow(a, weight, eps, x.cols, Row<float>(out, r));
  });
}

void CpuBackend::MatMul(const DeviceMatrix& x, const DeviceWeight& w, const DeviceMatrix* bias,
                        const DeviceMatrix& out) {
  CHECK_EQ(x.cols, w.cols);
  CHECK(out.rows == x.rows && out.cols == w.rows);
  CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
  const int64_t m_rows = x.rows, n = w.rows, k = x.cols;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t panel_bytes = w.quant != WeightQuant::kNone
                                  ? QuantPanelBytes(w.quant, k)
                                  : kPanel * k * static_cast<int64_t>(DTypeBytes(w.dtype));
  // Column groups small enough for L2. Over many rows: a multiple of 3 panels (the row-block
  // tiles take 3 at a time), and there are plenty of items already. Over one row block (decode):
  // at least 4 groups per thread, split evenly in units of 4 panels, because a one-row tile's
  // accumulators are all the parallelism it has (one chain per column): a tile of fewer than 4
  // panels waits on its chain's latency instead of on memory.
  const int64_t by_cache = std::max<int64_t>(1, kPanelBytes / panel_bytes);
  const bool one_block = m_rows <= kRowsPerItem;
  const int64_t group = by_cache >= 3 ? by_cache - by_cache % 3 : by_cache;
  const int64_t units = (panels + 3) / 4;
  const int64_t groups = one_block
                             ? std::min(units, std::max((panels + by_cache - 1) / by_cache,
                                                        static_cast<int64_t>(4 * pool_->threads())))
                             : (panels + group - 1) / group;
  auto group_panels = [&](int64_t g) -> std::pair<int64_t, int64_t> {
    if (one_block) {
      return {4 * (g * units / groups), std::min(panels, 4 * ((g + 1) * units / groups))};
    }
    return {g * group, std::min(panels, (g + 1) * group)};
  };
  const int64_t row_blocks = (m_rows + kRowsPerItem - 1) / kRowsPerItem;
  // Activation conversions before the product: fn(begin, end) over the row blocks, inline when
  // there is only one.
  auto for_row_blocks = [&](auto&& fn) {
    if (m_rows < kRowsPerItem) {
      fn(int64_t{0}, m_rows);
    } else {
      pool_->ParallelFor(row_blocks, [&](size_t rb) {
        fn(static_cast<int64_t>(rb * kRowsPerItem),
           std::min<int64_t>(m_rows, (rb + 1) * kRowsPerItem));
      });
    }
  };
  // bf16 weights take bf16 activations (cpu_kernels.h), rounded once here.
  const uint16_t* activations = nullptr;
  if (w.dtype == DType::kBF16) {
    const int64_t k2 = PairedK(k);
    if (static_cast<int64_t>(activations_.size()) < m_rows * k2) activations_.resize(m_rows * k2);
    uint16_t* xb = activations_.data();
    for_row_blocks([&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) kernels_.round_bf16(Row<float>(x, m), k, xb + m * k2);
    });
    activations = xb;
  }
  // Block-format weights take activations quantized per block (cpu_quant.h), once here.
  QuantizedRows quantized;
  if (w.quant != WeightQuant::kNone) {
    const int64_t blocks = k / kQuantBlock;
    if (static_cast<int64_t>(quant_q_.size()) < m_rows * k) quant_q_.resize(m_rows * k);
    if (static_cast<int64_t>(quant_blocks_.size()) < m_rows * blocks) {
      quant_blocks_.resize(m_rows * blocks);
    }
    for_row_blocks([&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        QuantizeActivationRow(Row<float>(x, m), k, quant_q_.data() + m * k,
                              quant_blocks_.data() + m * blocks);
      }
    });
    quantized = {quant_q_.data(), quant_blocks_.data(), k};
  }
  pool_->ParallelFor(groups * row_blocks, [&](size_t item) {
    const int64_t g = item / row_blocks, rb = item % row_blocks;
    const auto [p0, p1] = group_panels(g);
    const int64_t m0 = rb * kRowsPerItem, rows = std::min(kRowsPerItem, m_rows - m0);
    const float* xr = Row<float>(x, m0);
    float* o = Row<float>(out, m0);
    if (w.quant != WeightQuant::kNone) {
      quant_gemm_(w.quant, quantized.From(m0), rows, static_cast<const uint8_t*>(w.buffer.data()),
                  p0, p1, n, o, out.stride);
    } else if (w.dtype == DType::kF32) {
      kernels_.gemm_f32(xr, x.stride, rows, k, static_cast<const float*>(w.buffer.data()), p0, p1,
                        n, o, out.stride);
    } else {
      const int64_t k2 = PairedK(k);
      kernels_.gemm_bf16(activations + m0 * k2, k2, rows, k2,
                         static_cast<const uint16_t*>(w.buffer.data()), p0, p1, n, o, out.stride);
    }
    if (bias != nullptr) {
      const int64_t c1 = std::min(n, p1 * kPanel);
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t c = p0 * kPanel; c < c1; ++c) o[m * out.stride + c] += Load(*bias, 0, c);
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

absl::Status CpuBackend::ArgMaxRows(const DeviceMatrix& logits, std::vector<int32_t>* tokens) {
  if (logits.dtype != DType::kF32) return absl::InvalidArgumentError("ArgMaxRows takes fp32");
  tokens->assign(static_cast<size_t>(logits.rows), 0);
  pool_->ParallelFor(logits.rows, [&](size_t r) {
    const float* x = Row<float>(logits, r);
    // The first maximum above -inf (NaN compares false: never taken); none: 0.
    float best = -std::numeric_limits<float>::infinity();
    int32_t best_i = 0;
    for (int64_t c = 0; c < logits.cols; ++c) {
      if (x[c] > best) {
        best = x[c];
        best_i = static_cast<int32_t>(c);
      }
    }
    (*tokens)[r] = best_i;
  });
  return absl::OkStatus();
}

void CpuBackend::GatherRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                            const DeviceMatrix& out) {
  CHECK(out.rows == static_cast<int64_t>(rows.size()) && out.cols == x.cols);
  CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i] >= 0 && rows[i] < x.rows);
    std::memcpy(Row<float>(out, i), Row<float>(x, rows[i]), x.cols * sizeof(float));
  }
}

void CpuBackend::AddScaledRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                               const std::vector<float>& scales, const DeviceMatrix& acc) {
  CHECK(x.rows == static_cast<int64_t>(rows.size()) && rows.size() == scales.size());
  CHECK(x.cols == acc.cols);
  pool_->ParallelFor(rows.size(), [&](size_t i) {
    CHECK(rows[i] >= 0 && rows[i] < acc.rows);
    const float* src = Row<float>(x, i);
    float* a = Row<float>(acc, rows[i]);
    const float s = scales[i];
    for (int64_t c = 0; c < x.cols; ++c) {
      const float product = s * src[c];
      a[c] += product;
    }
  });
}

void CpuBackend::SwiGlu(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& out) {
  CHECK(gate.rows == up.rows && gate.cols == up.cols);
  CHECK(out.rows == gate.rows && out.cols == gate.cols);
  pool_->ParallelFor(gate.rows, [&](size_t r) {
    kernels_.silu_mul(Row<float>(gate, r), Row<float>(up, r), Row<float>(out, r), gate.cols);
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
    const float* cos = cs;
    const float* sin = cs + half;
    float* row = Row<float>(x, r);
    for (int32_t h = 0; h < heads; ++h) {
      float* lo = row + h * head_dim;
      float* hi = lo + half;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = lo[i], x1 = hi[i];
        lo[i] = x0 * cos[i] - x1 * sin[i];
        hi[i] = x1 * cos[i] + x0 * sin[i];
      }
    }
  });
}

void CpuBackend::WriteKv(const DeviceMatrix& k, const DeviceMatrix& v, const KvLayerView& kv,
                         const StepLayout& layout) {
  CHECK(k.rows == layout.rows() && v.rows == layout.rows());
  CHECK(k.cols == kv.kv_heads * kv.head_dim && v.cols == k.cols);
  pool_->ParallelFor(k.rows, [&](size_t r) {
    if (!layout.writes(static_cast<int64_t>(r))) return;
    const auto& table = layout.block_tables[layout.row_sequence[r]];
    const int32_t pos = layout.positions[r];
    CHECK_LT(pos / kv.block_tokens, static_cast<int32_t>(table.size()));
    const int32_t block = table[pos / kv.block_tokens], slot = pos % kv.block_tokens;
    for (int32_t h = 0; h < kv.kv_heads; ++h) {
      const float* key = Row<float>(k, r) + h * kv.head_dim;
      const float* value = Row<float>(v, r) + h * kv.head_dim;
      char* kt = KeyBlock(kv, block, h);
      char* vr = ValueRow(kv, block, h, slot);
      if (kv.dtype == DType::kF32) {
        float* kd = reinterpret_cast<float*>(kt);
        for (int32_t d = 0; d < kv.head_dim; ++d) kd[d * kv.block_tokens + slot] = key[d];
        std::memcpy(vr, value, kv.head_dim * sizeof(float));
      } else {
        uint16_t* kd = reinterpret_cast<uint16_t*>(kt);
        uint16_t* vd = reinterpret_cast<uint16_t*>(vr);
        for (int32_t d = 0; d < kv.head_dim; ++d) {
          kd[d * kv.block_tokens + slot] = FloatToBf16(key[d]);
          vd[d] = FloatToBf16(value[d]);
        }
      }
    }
  });
}

void CpuBackend::Attention(const DeviceMatrix& q, const KvLayerView& kv, const StepLayout& layout,
                           float scale, int32_t window, const DeviceMatrix& out) {
  CHECK_EQ(q.rows, layout.rows());
  CHECK(out.rows == q.rows && out.cols == q.cols);
  CHECK_GE(window, 0);
  const int32_t head_dim = kv.head_dim, bt = kv.block_tokens;
  const int64_t heads = q.cols / head_dim;
  CHECK_EQ(heads % kv.kv_heads, 0);
  const int64_t group = heads / kv.kv_heads;
  const bool f32 = kv.dtype == DType::kF32;
  // Work items: (runs of up to `run` consecutive rows of one sequence, KV head). The group's heads
  // at those rows are the item's queries (about kAttentionQueries), so each key and value row read
  // serves all of them; the element order does not depend on how rows are grouped
  // (cpu_kernels.h).
  const int64_t run = std::max<int64_t>(1, kAttentionQueries / group);
  std::vector<int64_t> run_starts;
  for (int64_t r = 0; r < q.rows; ++r) {
    if (run_starts.empty() || r - run_starts.back() == run ||
        layout.row_sequence[r] != layout.row_sequence[r - 1]) {
      run_starts.push_back(r);
    }
  }
  const int64_t runs = static_cast<int64_t>(run_starts.size());
  run_starts.push_back(q.rows);
  // Later rows of a sequence attend to more keys: the costliest items go first.
  pool_->ParallelFor(runs * kv.kv_heads, [&](size_t item) {
    const int64_t index = runs - 1 - static_cast<int64_t>(item) / kv.kv_heads;
    const int32_t kv_head = static_cast<int32_t>(item % kv.kv_heads);
    const int64_t r0 = run_starts[index], r1 = run_starts[index + 1];
    const auto& table = layout.block_tables[layout.row_sequence[r0]];
    const int64_t queries = (r1 - r0) * group;
    // Query g = (row r0 + g / group, head kv_head * group + g % group) sees keys [first, end).
    thread_local std::vector<float> qs, scores, acc, sums;
    thread_local std::vector<int32_t> firsts, ends;
    qs.resize(queries * head_dim);
    acc.assign(queries * head_dim, 0.0f);
    firsts.resize(queries);
    ends.resize(queries);
    sums.resize(queries);
    int32_t most = 0, fewest = std::numeric_limits<int32_t>::max();
    int32_t lowest = std::numeric_limits<int32_t>::max(), highest = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t pos = layout.positions[r];
      CHECK_LT(pos / bt, static_cast<int32_t>(table.size()));
      const int32_t first = std::max(layout.first_key(layout.row_sequence[r]),
                                     window > 0 ? std::max(0, pos + 1 - window) : 0);
      CHECK_LE(first, pos);
      most = std::max(most, pos + 1);
      fewest = std::min(fewest, pos + 1);
      lowest = std::min(lowest, first);
      highest = std::max(highest, first);
      for (int64_t h = 0; h < group; ++h) {
        const int64_t g = (r - r0) * group + h;
        firsts[g] = first;
        ends[g] = pos + 1;
        std::memcpy(qs.data() + g * head_dim, Row<float>(q, r) + (kv_head * group + h) * head_dim,
                    head_dim * sizeof(float));
      }
    }
    // Scores against every key any query of the item sees (a query ignores the others).
    scores.resize(queries * most);
    for (int32_t j0 = lowest / bt * bt; j0 < most; j0 += bt) {
      const int32_t count = std::min(bt, most - j0);
      const char* kt = KeyBlock(kv, table[j0 / bt], kv_head);
      if (f32) {
        kernels_.dot_columns_f32(qs.data(), head_dim, queries, reinterpret_cast<const float*>(kt),
                                 bt, head_dim, count, scores.data() + j0, most);
      } else {
        kernels_.dot_columns_bf16(qs.data(), head_dim, queries,
                                  reinterpret_cast<const uint16_t*>(kt), bt, head_dim, count,
                                  scores.data() + j0, most);
      }
    }
    for (int64_t g = 0; g < queries; ++g) {
      float* s = scores.data() + g * most + firsts[g];
      const int32_t n = ends[g] - firsts[g];
      const float max_score = kernels_.scale_max(s, n, scale);
      sums[g] = kernels_.exp_sum(s, n, max_score);
    }
    // Weighted values, each query over its keys in increasing order: its own keys before the
    // range all queries share, that range for all of them at once, then its own keys after it.
    auto weigh = [&](int64_t g0, int64_t n, int32_t from, int32_t to) {
      for (int32_t j0 = from; j0 < to;) {
        const int32_t block = j0 / bt, slot = j0 % bt;
        const int32_t count = std::min(bt - slot, to - j0);
        const char* values = ValueRow(kv, table[block], kv_head, slot);
        if (f32) {
          kernels_.weighted_rows_f32(scores.data() + g0 * most + j0, most, n,
                                     reinterpret_cast<const float*>(values), head_dim, count,
                                     head_dim, acc.data() + g0 * head_dim, head_dim);
        } else {
          kernels_.weighted_rows_bf16(scores.data() + g0 * most + j0, most, n,
                                      reinterpret_cast<const uint16_t*>(values), head_dim, count,
                                      head_dim, acc.data() + g0 * head_dim, head_dim);
        }
        j0 += count;
      }
    };
    const int32_t shared_from = highest, shared_to = std::max(highest, fewest);
    for (int64_t g = 0; g < queries; ++g) weigh(g, 1, firsts[g], std::min(shared_from, ends[g]));
    weigh(0, queries, shared_from, shared_to);
    for (int64_t g = 0; g < queries; ++g) weigh(g, 1, std::max(shared_to, firsts[g]), ends[g]);
    for (int64_t g = 0; g < queries; ++g) {
      float* o = Row<float>(out, r0 + g / group) + (kv_head * group + g % group) * head_dim;
      const float* a = acc.data() + g * head_dim;
      for (int32_t d = 0; d < head_dim; ++d) o[d] = a[d] / sums[g];
    }
  });
}

}  // namespace ferry
