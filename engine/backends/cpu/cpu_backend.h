// The CPU backend: the reference implementation of the Backend interface, deterministic by
// construction (ARCHITECTURE.md §4). Every output element is computed by one thread in the
// canonical order of cpu_kernels.h; threads split output rows and columns only (no split-K), and
// the same code serves one row and many. Device memory is host memory (64-byte aligned).
//
// Kernel notes (the order of operations, which the determinism tests rely on; "product" is the
// one-accumulator order of cpu_kernels.h):
//   MatMul      out[m][n] = product(x[m], w[n]) (+ bias[n], added after); with bf16 weights the
//               bf16 product of cpu_kernels.h (activations rounded to bf16, pairs, DAZ + FTZ);
//               with block-format weights the product of cpu_quant.h (activations quantized
//               per block of 32, integer block sums)
//   RmsNorm     inv = 1 / sqrt(SumSquares(g) / cols + eps); out[i] = w[i] * (g[i] * inv)
//   SwiGlu      out = (g / (1 + Exp(-g))) * u
//   Attention   per (row, head): s_j = product(q, k_j) * scale for j = 0..pos; e_j =
//               Exp(s_j - max); sum of e_j in increasing j; acc[d] = fma(e_j, v_j[d], acc[d]) in
//               increasing j; out = acc / sum.
// Work is split into items of output rows x column panels (MatMul) or rows x KV heads
// (attention) and spread over a ThreadPool created once with the backend.

#ifndef FERRY_ENGINE_BACKENDS_CPU_CPU_BACKEND_H_
#define FERRY_ENGINE_BACKENDS_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/backend.h"
#include "engine/backends/cpu/cpu_kernels.h"
#include "engine/backends/cpu/cpu_quant.h"
#include "engine/common/thread_pool.h"

namespace ferry {

struct CpuBackendOptions {
  int threads = 0;  // 0: one per available core
  // Unset: SelectCpuIsa() (FERRY_CPU_ISA or the widest the CPU has).
  std::optional<CpuIsa> isa;
};

class CpuBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const CpuBackendOptions& options = {});

  std::string name() const override;
  bool host_memory() const override { return true; }
  bool deterministic() const override { return true; }
  CpuIsa isa() const { return isa_; }
  QuantIsa quant_isa() const { return quant_isa_; }
  int threads() const { return pool_->threads(); }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  void CopyToDevice(void* device_dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* device_src, size_t bytes) override;
  void CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) override;

  absl::StatusOr<DeviceWeight> UploadWeight(const void* host, DType dtype, int64_t rows,
                                            int64_t cols) override;
  absl::StatusOr<DeviceWeight> UploadQuantizedWeight(const uint8_t* host, size_t bytes,
                                                     WeightQuant quant, int64_t rows,
                                                     int64_t cols) override;
  void Embed(const DeviceWeight& table, const std::vector<int32_t>& ids,
             const DeviceMatrix& out) override;
  void RmsNorm(const DeviceMatrix& x, const DeviceMatrix& weight, float eps,
               const DeviceMatrix& out) override;
  void AddRmsNorm(const DeviceMatrix& x, const DeviceMatrix& delta, const DeviceMatrix& weight,
                  float eps, const DeviceMatrix& out) override;
  void MatMul(const DeviceMatrix& x, const DeviceWeight& w, const DeviceMatrix* bias,
              const DeviceMatrix& out) override;
  void Add(const DeviceMatrix& acc, const DeviceMatrix& x) override;
  void GatherRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                  const DeviceMatrix& out) override;
  void AddScaledRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                     const std::vector<float>& scales, const DeviceMatrix& acc) override;
  void SwiGlu(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& out) override;
  void Rope(const DeviceMatrix& x, int32_t heads, const std::vector<int32_t>& positions,
            const RopeTable& rope) override;
  void WriteKv(const DeviceMatrix& k, const DeviceMatrix& v, const KvLayerView& kv,
               const StepLayout& layout) override;
  void Attention(const DeviceMatrix& q, const KvLayerView& kv, const StepLayout& layout,
                 float scale, int32_t window, const DeviceMatrix& out) override;
  absl::Status ArgMaxRows(const DeviceMatrix& logits, std::vector<int32_t>* tokens) override;
  void Synchronize() override {}

 protected:
  void Free(void* data, size_t bytes) override;

 private:
  CpuBackend(int threads, CpuIsa isa);
  // RMSNorm of row r of x (already summed) into out, in groups of weight.cols.
  void NormRow(const float* x, const DeviceMatrix& weight, float eps, int64_t cols,
               float* out) const;

  const CpuIsa isa_;
  const CpuKernels& kernels_;
  const QuantIsa quant_isa_;
  const QuantGemmFn quant_gemm_;
  std::unique_ptr<ThreadPool> pool_;
  // MatMul's bf16 activations (grown on demand; the backend serves one caller at a time).
  std::vector<uint16_t> activations_;
  // MatMul's quantized activations (likewise).
  std::vector<int8_t> quant_q_;
  std::vector<ActivationBlock> quant_blocks_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_CPU_CPU_BACKEND_H_
