// The CUDA backend (ARCHITECTURE.md §4): the Backend interface on one NVIDIA GPU (sm_90: H100,
// H200), with the kernels of this package and cuBLAS.
//
// What runs where:
//   memory       a DevicePool of slabs (device_pool.h) under a byte limit; one stream.
//   weights      bf16 (fp32 files are rounded to bf16 at upload), row-major N x K; Q8_0 and Q4_K
//                blocks kept in GGML's layout and computed in place. Other block formats are
//                Unimplemented at UploadQuantizedWeight (the model then uploads them as bf16).
//   activations  bf16 between kernels (activation_dtype()); the transformer keeps its residual
//                stream and the logits in fp32. Every kernel accepts either type.
//   MatMul       bf16 weights: cublasGemmEx (or det_gemm.cu when deterministic), bf16 inputs,
//                fp32 accumulation, output in the output's type; block weights: quant_gemv.cu,
//                bit-identical to the CPU backend.
//   attention    attention.cu, batch-invariant (tiles aligned to key positions).
//   host vectors token ids, positions and step layouts are copied to the device when they change
//                (the per-layer calls of one step reuse one copy).
//   graphs       decode steps (backend.h "Recorded steps"; the Transformer pads them to
//                recorded_step.h's shapes) are CUDA graphs: a step's inputs go to the device in
//                one transfer from pinned memory into a buffer that stays put, a key's first step
//                runs as it comes, its second is captured (cudaStreamBeginCapture, relaxed mode),
//                and later ones launch the graph. StepGraphBook keeps at most max_graphs and
//                drops them all when a buffer the kernels read is remade (a scratch buffer grew).
//                A capture that meets something it cannot hold (a host copy, a vector that is not
//                the step's input) is dropped and the step issued again as it comes.
//
// Determinism: by default not claimed (deterministic() is false): cuBLAS chooses its algorithm by
// shape, so a row's bf16 products may differ in the last bits with the batch. With
// CudaBackendOptions::deterministic the bf16 products are Ferry's own batch-invariant GEMM
// (det_gemm.cu) and every kernel is batch-invariant: the quantized products, the norms and
// attention are on their own. Then a row's logits are the same bits alone or in any batch, in one
// chunk or several (not the CPU backend's bits: the arithmetic differs).
//
// Errors: a failed launch or copy is sticky (a CUDA context that faulted stays unusable):
// status() reports the first, and the model's Forward returns it.
//
// Threading: one thread at a time drives a CudaBackend (the engine's, not necessarily the one
// that created it: every method binds the backend's device first); DeviceBuffers may be freed
// from any thread (the pool locks). CopyBeside, PinHostMemory and UnpinHostMemory may be called
// from any thread at any time: the copies run on a stream of their own, one at a time, after an
// event recorded on the engine's stream; never while a graph is being captured (the capture
// holds their lock).

#ifndef FERRY_ENGINE_BACKENDS_CUDA_CUDA_BACKEND_H_
#define FERRY_ENGINE_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/backends/backend.h"
#include "engine/backends/cuda/cuda_kernels.h"
#include "engine/backends/cuda/device_pool.h"
#include "engine/backends/cuda/step_upload.h"
#include "engine/backends/step_graph_book.h"

namespace ferry {

struct CudaBackendOptions {
  int device = 0;
  // The most device memory the backend may hold (weights, KV, scratch); 0: 90% of what is free
  // when it starts.
  size_t memory_bytes = 0;
  // Batch-invariant products of Ferry's own (det_gemm.cu) instead of cuBLAS: then every kernel
  // is batch-invariant and deterministic() is true.
  bool deterministic = false;
  // Decode steps as CUDA graphs (of at most max_graph_rows rows; at most max_graphs kept).
  bool graphs = true;
  int64_t max_graph_rows = 256;
  size_t max_graphs = 64;
};

// What the worker reports about its device (Watch, metrics).
struct CudaDeviceSummary {
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_bytes = 0;
  size_t limit_bytes = 0;  // the pool's limit
};

class CudaBackend : public Backend {
 public:
  // FailedPrecondition when there is no usable device (no driver, no GPU, not sm_90).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override;
  bool deterministic() const override { return deterministic_; }
  bool host_memory() const override { return false; }
  DType activation_dtype() const override { return DType::kBF16; }
  absl::Status status() const override { return status_; }
  MemoryReport memory() const override {
    return {pool_->stats().in_use_bytes, device_.limit_bytes, device_.total_bytes};
  }
  // Activations in bf16; bf16 products through cuBLAS, or Ferry's batch-invariant GEMM.
  std::string fingerprint_tag() const override {
    return deterministic_ ? "cuda:bf16-activations:deterministic" : "cuda:bf16-activations:cublas";
  }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  void CopyToDevice(void* device_dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* device_src, size_t bytes) override;
  void CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) override;
  absl::Status CopyBeside(absl::Span<const BesideCopy> copies, bool to_device) override;
  absl::Status PinHostMemory(void* host, size_t bytes) override;
  void UnpinHostMemory(void* host) override;

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
  void Synchronize() override;

  int64_t max_recorded_rows() const override { return graphs_ ? max_graph_rows_ : 0; }
  // A capture holds beside_mu_ from BeginStep to EndStep.
  StepMode BeginStep(const StepInputs& inputs) override ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::StatusOr<bool> EndStep(bool complete) override ABSL_NO_THREAD_SAFETY_ANALYSIS;
  const StepGraphBook::Stats& graph_stats() const { return book_->stats(); }
  // Turns graphs on or off (off: the graphs kept are destroyed), e.g. to compare the two.
  void set_graphs(bool on);

  // On the device (argmax.cu): only the tokens come back, never the logits.
  absl::Status ArgMaxRows(const DeviceMatrix& logits, std::vector<int32_t>* tokens) override;
  // Attention with the split chosen by the caller (the check compares both ways).
  void AttentionWith(const DeviceMatrix& q, const KvLayerView& kv, const StepLayout& layout,
                     float scale, int32_t window, bool split, const DeviceMatrix& out);

  const CudaDeviceSummary& device() const { return device_; }
  int device_index() const { return device_index_; }
  // The stream every kernel and copy of this backend is ordered on (a cudaStream_t), for work
  // that must be ordered with them (NCCL collectives).
  void* stream() const { return stream_; }
  cuda::DevicePool::Stats memory_stats() const { return pool_->stats(); }

 protected:
  void Free(void* data, size_t bytes) override;

 private:
  // A device copy of a host vector, remade only when the vector changes.
  struct Upload {
    std::vector<char> host;
    DeviceBuffer device;
    bool valid = false;
  };

  CudaBackend() = default;
  absl::Status Init(const CudaBackendOptions& options);
  // Makes this backend's GPU the calling thread's current device: the engine's thread is not the
  // one that created the backend, and CUDA's current device is per thread. Every public method
  // starts with it.
  void Bind() const;
  // Records the first error; returns whether `err` (a cudaError_t) was success.
  bool Check(int err, const char* what);
  // `bytes` of `data` on the device through `slot`.
  const void* UploadVector(Upload& slot, const void* data, size_t bytes);
  // A scratch buffer of at least `bytes` (grown by replacement; one stream orders every use).
  // `in_graphs`: kernels of a step read it, so remaking it makes every graph stale.
  void* Scratch(DeviceBuffer& buffer, size_t bytes, bool in_graphs = true);
  cuda::DeviceStep UploadStep(const StepLayout& layout);
  // Within a step (BeginStep..EndStep): the device copy of a step input equal to `given`, or
  // null; while capturing, a vector that is none marks the capture as one to drop.
  const int32_t* StepVector(const std::vector<int32_t>& given, int32_t part);
  // Whether a host copy or wait may run now; while capturing it may not, and marks the capture.
  bool HostCallAllowed();
  // Lets go of graphs the book dropped.
  void DestroyGraphs(const std::vector<void*>& graphs);

  CudaDeviceSummary device_;
  int device_index_ = 0;
  int multiprocessors_ = 0;
  bool deterministic_ = false;
  std::unique_ptr<cuda::DevicePool> pool_;  // destroyed last of the memory holders below
  cuda::Stream stream_ = nullptr;
  // CopyBeside's: its stream, and the event that orders it after the engine's stream.
  absl::Mutex beside_mu_;
  cuda::Stream beside_stream_ = nullptr;
  void* beside_event_ = nullptr;  // cudaEvent_t
  void* cublas_ = nullptr;        // cublasHandle_t
  absl::Status status_;
  DeviceBuffer cublas_workspace_, gemm_input_, quant_scratch_, attention_partials_, argmax_out_;
  Upload ids_, positions_, rows_, scales_, steps_[2];
  int next_step_slot_ = 0;

  // Recorded steps (graphs). generation_ counts the remaking of buffers the kernels read.
  bool graphs_ = false;
  int64_t max_graph_rows_ = 0;
  uint64_t generation_ = 0;
  std::unique_ptr<StepGraphBook> book_;
  DeviceBuffer step_device_;   // the step's inputs (cuda::StepInputWords), at a fixed address
  void* step_host_ = nullptr;  // their pinned staging (cudaHostAlloc)
  size_t step_host_bytes_ = 0;
  void* step_uploaded_ = nullptr;  // cudaEvent_t: the staging's last upload has been read
  struct Step {
    bool active = false;
    StepGraphBook::Action action = StepGraphBook::Action::kRun;
    uint64_t key = 0;
    uint64_t generation = 0;  // at the capture's start
    bool broken = false;      // the capture met something it cannot hold
    void* graph = nullptr;    // the key's cudaGraphExec_t (kReplay)
    cuda::StepInputWords inputs;
    std::vector<cuda::StepWords> layouts;  // as flattened, to recognize them
  };
  Step step_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_CUDA_CUDA_BACKEND_H_
