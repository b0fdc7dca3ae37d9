#include "engine/backends/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/backends/cuda/ggml_blocks.h"
#include "engine/backends/cuda/launch_shapes.h"
#include "engine/backends/cuda/step_upload.h"
#include "engine/common/float_math.h"
#include "engine/common/status.h"

namespace ferry {
namespace {

constexpr size_t kSlabBytes = size_t{256} << 20;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

cuda::Elem ElemOf(DType t) { return t == DType::kF32 ? cuda::Elem::kF32 : cuda::Elem::kBF16; }

cuda::Matrix ToMatrix(const DeviceMatrix& m) {
  cuda::Matrix out;
  out.data = m.data;
  out.elem = ElemOf(m.dtype);
  out.rows = m.rows;
  out.cols = m.cols;
  out.stride = m.stride;
  return out;
}

cuda::KvView ToKv(const KvLayerView& kv) {
  cuda::KvView out;
  out.base = kv.base;
  out.block_bytes = kv.block_bytes;
  out.k_offset = kv.k_offset;
  out.v_offset = kv.v_offset;
  out.block_tokens = kv.block_tokens;
  out.kv_heads = kv.kv_heads;
  out.head_dim = kv.head_dim;
  out.elem = ElemOf(kv.dtype);
  return out;
}

std::string CudaMessage(const char* what, int err) {
  const cudaError_t e = static_cast<cudaError_t>(err);
  return absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend());
  const absl::Status s = backend->Init(options);
  if (!s.ok()) return s;
  return backend;
}

absl::Status CudaBackend::Init(const CudaBackendOptions& options) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device (",
                     err != cudaSuccess ? CudaMessage("cudaGetDeviceCount", err) : "none found",
                     "): run with --backend=cpu"));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " visible)"));
  }
  device_index_ = options.device;
  deterministic_ = options.deterministic;
  graphs_ = options.graphs && options.max_graph_rows > 0;
  max_graph_rows_ = options.max_graph_rows;
  book_ = std::make_unique<StepGraphBook>(options.max_graphs);
  cudaDeviceProp prop;
  err = cudaGetDeviceProperties(&prop, device_index_);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(CudaMessage("cudaGetDeviceProperties", err));
  }
  if (prop.major != 9) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device_index_, " (", prop.name, ") is sm_", prop.major,
                     prop.minor, "; Ferry's kernels are built for sm_90 (H100, H200)"));
  }
  device_.name = prop.name;
  device_.compute_major = prop.major;
  device_.compute_minor = prop.minor;
  device_.total_bytes = prop.totalGlobalMem;
  multiprocessors_ = prop.multiProcessorCount;
  if ((err = cudaSetDevice(device_index_)) != cudaSuccess) {
    return absl::FailedPreconditionError(CudaMessage("cudaSetDevice", err));
  }
  size_t free_bytes = 0, total_bytes = 0;
  if ((err = cudaMemGetInfo(&free_bytes, &total_bytes)) != cudaSuccess) {
    return absl::FailedPreconditionError(CudaMessage("cudaMemGetInfo", err));
  }
  device_.limit_bytes = options.memory_bytes > 0 ? options.memory_bytes : free_bytes / 10 * 9;
  if (device_.limit_bytes > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("asked for ", device_.limit_bytes,
                                                     " bytes of device memory; ", free_bytes,
                                                     " are free on ", device_.name));
  }
  const int device = device_index_;
  cuda::DevicePool::Source source;
  source.reserve = [device](size_t bytes) -> void* {
    cudaSetDevice(device);
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  };
  source.release = [device](void* p, size_t) {
    cudaSetDevice(device);
    cudaFree(p);
  };
  pool_ = std::make_unique<cuda::DevicePool>(std::move(source), kSlabBytes, device_.limit_bytes);
  cudaStream_t stream = nullptr;
  if ((err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
    return absl::FailedPreconditionError(CudaMessage("cudaStreamCreate", err));
  }
  stream_ = stream;
  if ((err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
    return absl::FailedPreconditionError(CudaMessage("cudaStreamCreate", err));
  }
  beside_stream_ = stream;
  cudaEvent_t event = nullptr;
  if ((err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming)) != cudaSuccess) {
    return absl::FailedPreconditionError(CudaMessage("cudaEventCreate", err));
  }
  beside_event_ = event;
  if ((err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming)) != cudaSuccess) {
    return absl::FailedPreconditionError(CudaMessage("cudaEventCreate", err));
  }
  step_uploaded_ = event;
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    return absl::FailedPreconditionError("cublasCreate failed");
  }
  cublas_ = handle;
  cublasSetStream(handle, stream);
  // Split-K partial sums in fp32 even when the output is bf16.
  cublasSetMathMode(handle,
                    static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  // A workspace of our own: cuBLAS then allocates nothing during a step (CUDA graphs need that).
  absl::StatusOr<DeviceBuffer> workspace = Allocate(kCublasWorkspaceBytes);
  if (!workspace.ok()) return workspace.status();
  cublas_workspace_ = std::move(*workspace);
  cublasSetWorkspace(handle, cublas_workspace_.data(), cublas_workspace_.bytes());
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (book_ != nullptr) {
    std::vector<void*> graphs;
    book_->Clear(&graphs);
    DestroyGraphs(graphs);
  }
  if (step_host_ != nullptr) cudaFreeHost(step_host_);
  if (step_uploaded_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(step_uploaded_));
  if (cublas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (beside_stream_ != nullptr) cudaStreamDestroy(beside_stream_);
  if (beside_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(beside_event_));
  // The buffers below free into pool_, which is destroyed after them.
}

std::string CudaBackend::name() const {
  return absl::StrCat("cuda:", device_.name, " sm_", device_.compute_major, device_.compute_minor);
}

bool CudaBackend::Check(int err, const char* what) {
  if (err == 0) return true;
  if (step_.active && step_.action == StepGraphBook::Action::kRecord) {
    // Within a capture a launch fails when the capture does (it met something it cannot
    // hold): the capture is dropped and the step issued again; the device is not at fault.
    step_.broken = true;
    return false;
  }
  if (status_.ok()) status_ = absl::InternalError(CudaMessage(what, err));
  return false;
}

absl::StatusOr<DeviceBuffer> CudaBackend::Allocate(size_t bytes) {
  Bind();
  void* p = pool_->Allocate(bytes);
  if (p == nullptr) {
    const cuda::DevicePool::Stats s = pool_->stats();
    return absl::ResourceExhaustedError(
        absl::StrCat("device memory: ", bytes, " bytes wanted, ", s.in_use_bytes, " in use of a ",
                     device_.limit_bytes, "-byte limit on ", device_.name));
  }
  return DeviceBuffer(this, p, bytes);
}

void CudaBackend::Free(void* data, size_t) { pool_->Free(data); }

void CudaBackend::CopyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  Bind();
  if (bytes == 0 || !HostCallAllowed()) return;
  // From pageable memory the call returns once the source has been read: the caller may reuse
  // it at once. Ordered on the stream after the work before it.
  Check(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync to device");
}

void CudaBackend::CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  Bind();
  if (bytes == 0 || !HostCallAllowed()) return;
  if (Check(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync to host")) {
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
}

void CudaBackend::CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) {
  Bind();
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync on device");
}

absl::Status CudaBackend::CopyBeside(absl::Span<const BesideCopy> copies, bool to_device) {
  if (copies.empty()) return absl::OkStatus();
  absl::MutexLock lock(&beside_mu_);
  Bind();
  auto fail = [](const char* what, cudaError_t err) {
    return absl::InternalError(CudaMessage(what, err));
  };
  // After every kernel issued so far on the engine's stream (a block's last writes and reads).
  const auto event = static_cast<cudaEvent_t>(beside_event_);
  cudaError_t err = cudaEventRecord(event, stream_);
  if (err != cudaSuccess) return fail("cudaEventRecord", err);
  if ((err = cudaStreamWaitEvent(beside_stream_, event, 0)) != cudaSuccess) {
    return fail("cudaStreamWaitEvent", err);
  }
  const cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  for (const BesideCopy& c : copies) {
    if (c.bytes == 0) continue;
    if ((err = cudaMemcpyAsync(c.dst, c.src, c.bytes, kind, beside_stream_)) != cudaSuccess) {
      // Those issued still run: wait for them before the host memory may be reused.
      cudaStreamSynchronize(beside_stream_);
      return fail("cudaMemcpyAsync beside the engine", err);
    }
  }
  if ((err = cudaStreamSynchronize(beside_stream_)) != cudaSuccess) {
    return fail("cudaStreamSynchronize beside the engine", err);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::PinHostMemory(void* host, size_t bytes) {
  Bind();
  const cudaError_t err = cudaHostRegister(host, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) return absl::InternalError(CudaMessage("cudaHostRegister", err));
  return absl::OkStatus();
}

void CudaBackend::UnpinHostMemory(void* host) {
  Bind();
  cudaHostUnregister(host);
}

void CudaBackend::Synchronize() {
  Bind();
  if (!HostCallAllowed()) return;
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBackend::Bind() const { cudaSetDevice(device_index_); }

const void* CudaBackend::UploadVector(Upload& slot, const void* data, size_t bytes) {
  if (!HostCallAllowed()) return nullptr;
  if (slot.valid && slot.host.size() == bytes &&
      (bytes == 0 || std::memcmp(slot.host.data(), data, bytes) == 0)) {
    return slot.device.data();
  }
  if (slot.device.bytes() < bytes || slot.device.data() == nullptr) {
    // Freed into the pool while earlier kernels may still read it: safe, because whatever the
    // pool hands the memory to next is also ordered on this one stream.
    slot.device.Reset();
    absl::StatusOr<DeviceBuffer> grown = Allocate(std::max<size_t>(bytes * 2, 4096));
    if (!grown.ok()) {
      if (status_.ok()) status_ = grown.status();
      slot.valid = false;
      return nullptr;
    }
    slot.device = std::move(*grown);
  }
  slot.host.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  slot.valid = true;
  CopyToDevice(slot.device.data(), data, bytes);
  return slot.device.data();
}

void* CudaBackend::Scratch(DeviceBuffer& buffer, size_t bytes, bool in_graphs) {
  if (buffer.data() != nullptr && buffer.bytes() >= bytes) return buffer.data();
  if (in_graphs) ++generation_;  // graphs that read the old buffer are stale
  buffer.Reset();
  absl::StatusOr<DeviceBuffer> grown = Allocate(std::max<size_t>(bytes, 1 << 16));
  if (!grown.ok()) {
    if (status_.ok()) status_ = grown.status();
    return nullptr;
  }
  buffer = std::move(*grown);
  return buffer.data();
}

cuda::DeviceStep CudaBackend::UploadStep(const StepLayout& layout) {
  cuda::StepWords words;
  cuda::DeviceStep step;
  if (!cuda::FlattenStep(layout.positions, layout.row_sequence, layout.block_tables,
                         layout.first_keys, layout.no_write, &words)) {
    if (status_.ok()) status_ = absl::InvalidArgumentError("inconsistent StepLayout");
    return step;
  }
  if (step_.active) {  // one of the step's layouts: its device copy, with the step's bound
    for (size_t i = 0; i < step_.layouts.size(); ++i) {
      if (step_.layouts[i].words == words.words) {
        step.words = static_cast<const int32_t*>(step_device_.data()) + step_.inputs.layouts[i];
        step.offsets = step_.inputs.offsets[i];
        return step;
      }
    }
  }
  // Two slots: a hybrid model alternates between its full and window layouts within a step.
  const size_t bytes = words.words.size() * sizeof(int32_t);
  for (Upload& slot : steps_) {
    if (slot.valid && slot.host.size() == bytes &&
        std::memcmp(slot.host.data(), words.words.data(), bytes) == 0) {
      step.words = static_cast<const int32_t*>(slot.device.data());
      step.offsets = words.offsets;
      return step;
    }
  }
  Upload& slot = steps_[next_step_slot_];
  next_step_slot_ = 1 - next_step_slot_;
  step.words = static_cast<const int32_t*>(UploadVector(slot, words.words.data(), bytes));
  step.offsets = words.offsets;
  return step;
}

absl::StatusOr<DeviceWeight> CudaBackend::UploadWeight(const void* host, DType dtype, int64_t rows,
                                                       int64_t cols) {
  Bind();
  if (rows <= 0 || cols <= 0) return absl::InvalidArgumentError("empty weight matrix");
  const size_t count = static_cast<size_t>(rows * cols);
  std::vector<uint16_t> converted;
  const void* source = host;
  if (dtype == DType::kF32) {
    converted.resize(count);
    const float* f = static_cast<const float*>(host);
    for (size_t i = 0; i < count; ++i) converted[i] = FloatToBf16(f[i]);
    source = converted.data();
  }
  DeviceWeight w;
  ASSIGN_OR_RETURN(w.buffer, Allocate(count * 2));
  CopyToDevice(w.buffer.data(), source, count * 2);
  w.dtype = DType::kBF16;
  w.rows = rows;
  w.cols = cols;
  RETURN_IF_ERROR(status_);
  return w;
}

absl::StatusOr<DeviceWeight> CudaBackend::UploadQuantizedWeight(const uint8_t* host, size_t bytes,
                                                                WeightQuant quant, int64_t rows,
                                                                int64_t cols) {
  Bind();
  int64_t block_elements = 0, block_bytes = 0;
  if (quant == WeightQuant::kQ8_0) {
    block_elements = 32;
    block_bytes = cuda::kQ8_0BlockBytes;
  } else if (quant == WeightQuant::kQ4_K) {
    block_elements = 256;
    block_bytes = cuda::kQ4_KBlockBytes;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA backend computes q8_0 and q4_k blocks, not ", WeightQuantName(quant)));
  }
  if (rows <= 0 || cols <= 0 || cols % block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(WeightQuantName(quant), " weight of ", rows,
                                                   " x ", cols, ": rows must be whole blocks of ",
                                                   block_elements));
  }
  const size_t want = static_cast<size_t>(rows * (cols / block_elements) * block_bytes);
  if (bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat(WeightQuantName(quant), " weight of ", rows,
                                                   " x ", cols, " has ", bytes, " bytes, not ",
                                                   want));
  }
  DeviceWeight w;
  ASSIGN_OR_RETURN(w.buffer, Allocate(bytes));
  CopyToDevice(w.buffer.data(), host, bytes);
  w.quant = quant;
  w.rows = rows;
  w.cols = cols;
  RETURN_IF_ERROR(status_);
  return w;
}

void CudaBackend::Embed(const DeviceWeight& table, const std::vector<int32_t>& ids,
                        const DeviceMatrix& out) {
  Bind();
  const void* d_ids = StepVector(ids, step_.inputs.ids);
  if (d_ids == nullptr) d_ids = UploadVector(ids_, ids.data(), ids.size() * sizeof(int32_t));
  if (d_ids == nullptr) return;
  const auto* device_ids = static_cast<const int32_t*>(d_ids);
  if (table.quant == WeightQuant::kNone) {
    Check(cuda::LaunchEmbedDense(table.buffer.data(), ElemOf(table.dtype), table.cols, device_ids,
                                 ToMatrix(out), stream_),
          "Embed");
  } else {
    Check(cuda::LaunchEmbedQuant(static_cast<const uint8_t*>(table.buffer.data()),
                                 table.quant == WeightQuant::kQ8_0 ? cuda::QuantFormat::kQ8_0
                                                                   : cuda::QuantFormat::kQ4_K,
                                 table.cols, device_ids, ToMatrix(out), stream_),
          "Embed");
  }
}

void CudaBackend::RmsNorm(const DeviceMatrix& x, const DeviceMatrix& weight, float eps,
                          const DeviceMatrix& out) {
  Bind();
  Check(cuda::LaunchRmsNorm(ToMatrix(x), nullptr, ToMatrix(weight), eps, ToMatrix(out), stream_),
        "RmsNorm");
}

void CudaBackend::AddRmsNorm(const DeviceMatrix& x, const DeviceMatrix& delta,
                             const DeviceMatrix& weight, float eps, const DeviceMatrix& out) {
  Bind();
  const cuda::Matrix d = ToMatrix(delta);
  Check(cuda::LaunchRmsNorm(ToMatrix(x), &d, ToMatrix(weight), eps, ToMatrix(out), stream_),
        "AddRmsNorm");
}

void CudaBackend::MatMul(const DeviceMatrix& x, const DeviceWeight& w, const DeviceMatrix* bias,
                         const DeviceMatrix& out) {
  Bind();
  if (x.rows == 0) return;
  if (w.quant != WeightQuant::kNone) {
    void* scratch = Scratch(quant_scratch_, cuda::QuantScratchBytes(x.rows, x.cols));
    if (scratch == nullptr) return;
    Check(cuda::LaunchQuantMatMul(
              ToMatrix(x), static_cast<const uint8_t*>(w.buffer.data()),
              w.quant == WeightQuant::kQ8_0 ? cuda::QuantFormat::kQ8_0 : cuda::QuantFormat::kQ4_K,
              w.rows, scratch, ToMatrix(out), stream_),
          "quantized MatMul");
  } else {
    // cuBLAS is column-major: out^T (N x M) = W (K x N, transposed) * x^T (K x M).
    cuda::Matrix input = ToMatrix(x);
    if (x.dtype != DType::kBF16) {
      void* converted = Scratch(gemm_input_, static_cast<size_t>(x.rows * x.cols) * 2);
      if (converted == nullptr) return;
      cuda::Matrix bf16{converted, cuda::Elem::kBF16, x.rows, x.cols, x.cols};
      if (!Check(cuda::LaunchConvert(input, bf16, stream_), "MatMul input conversion")) return;
      input = bf16;
    }
    if (deterministic_) {
      if (!Check(cuda::LaunchDeterministicGemm(input, static_cast<const uint16_t*>(w.buffer.data()),
                                               w.rows, ToMatrix(out), stream_),
                 "deterministic MatMul")) {
        return;
      }
      if (bias != nullptr) {
        Check(cuda::LaunchAddBias(ToMatrix(out), ToMatrix(*bias), stream_), "bias");
      }
      return;
    }
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t s = cublasGemmEx(
        static_cast<cublasHandle_t>(cublas_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows),
        static_cast<int>(x.rows), static_cast<int>(x.cols), &alpha, w.buffer.data(), CUDA_R_16BF,
        static_cast<int>(w.cols), input.data, CUDA_R_16BF, static_cast<int>(input.stride), &beta,
        out.data, out.dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(out.stride),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      if (status_.ok()) {
        status_ = absl::InternalError(absl::StrCat("cublasGemmEx: ", cublasGetStatusString(s)));
      }
      return;
    }
  }
  if (bias != nullptr) Check(cuda::LaunchAddBias(ToMatrix(out), ToMatrix(*bias), stream_), "bias");
}

void CudaBackend::Add(const DeviceMatrix& acc, const DeviceMatrix& x) {
  Bind();
  Check(cuda::LaunchAdd(ToMatrix(acc), ToMatrix(x), stream_), "Add");
}

void CudaBackend::GatherRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                             const DeviceMatrix& out) {
  Bind();
  const void* d_rows = UploadVector(rows_, rows.data(), rows.size() * sizeof(int32_t));
  if (d_rows == nullptr) return;
  Check(cuda::LaunchGatherRows(ToMatrix(x), static_cast<const int32_t*>(d_rows), ToMatrix(out),
                               stream_),
        "GatherRows");
}

void CudaBackend::AddScaledRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                                const std::vector<float>& scales, const DeviceMatrix& acc) {
  Bind();
  const void* d_rows = UploadVector(rows_, rows.data(), rows.size() * sizeof(int32_t));
  const void* d_scales = UploadVector(scales_, scales.data(), scales.size() * sizeof(float));
  if (d_rows == nullptr || d_scales == nullptr) return;
  Check(cuda::LaunchAddScaledRows(ToMatrix(x), static_cast<const int32_t*>(d_rows),
                                  static_cast<const float*>(d_scales), ToMatrix(acc), stream_),
        "AddScaledRows");
}

void CudaBackend::SwiGlu(const DeviceMatrix& gate, const DeviceMatrix& up,
                         const DeviceMatrix& out) {
  Bind();
  Check(cuda::LaunchSwiGlu(ToMatrix(gate), ToMatrix(up), ToMatrix(out), stream_), "SwiGlu");
}

void CudaBackend::Rope(const DeviceMatrix& x, int32_t heads, const std::vector<int32_t>& positions,
                       const RopeTable& rope) {
  Bind();
  const void* d_positions = StepVector(positions, step_.inputs.positions);
  if (d_positions == nullptr) {
    d_positions = UploadVector(positions_, positions.data(), positions.size() * sizeof(int32_t));
  }
  if (d_positions == nullptr) return;
  Check(cuda::LaunchRope(ToMatrix(x), heads, static_cast<const int32_t*>(d_positions),
                         ToMatrix(rope.table), stream_),
        "Rope");
}

void CudaBackend::WriteKv(const DeviceMatrix& k, const DeviceMatrix& v, const KvLayerView& kv,
                          const StepLayout& layout) {
  Bind();
  const cuda::DeviceStep step = UploadStep(layout);
  if (step.words == nullptr) return;
  Check(cuda::LaunchWriteKv(ToMatrix(k), ToMatrix(v), ToKv(kv), step, stream_), "WriteKv");
}

void CudaBackend::Attention(const DeviceMatrix& q, const KvLayerView& kv, const StepLayout& layout,
                            float scale, int32_t window, const DeviceMatrix& out) {
  // Split tiles over CTAs when rows x KV heads alone would leave the GPU idle (decode); the
  // result is the same bits either way.
  const bool split = q.rows * kv.kv_heads < 2 * static_cast<int64_t>(multiprocessors_);
  AttentionWith(q, kv, layout, scale, window, split, out);
}

void CudaBackend::AttentionWith(const DeviceMatrix& q, const KvLayerView& kv,
                                const StepLayout& layout, float scale, int32_t window, bool split,
                                const DeviceMatrix& out) {
  Bind();
  if (q.rows == 0) return;
  const cuda::DeviceStep step = UploadStep(layout);
  if (step.words == nullptr) return;
  const int32_t heads = static_cast<int32_t>(q.cols / kv.head_dim);
  const int32_t max_tiles = step.offsets.max_position / cuda::kAttentionTile + 1;
  float* partials = nullptr;
  if (split && max_tiles > 1) {
    // The partials' scratch, grown on demand; where the pool cannot give it, the one-CTA-per-row
    // path (the same bits, no scratch) instead of an error.
    const size_t bytes = cuda::AttentionPartialBytes(q.rows, heads, kv.head_dim, max_tiles);
    if (attention_partials_.bytes() < bytes) {
      ++generation_;
      attention_partials_.Reset();
      absl::StatusOr<DeviceBuffer> grown = Allocate(bytes);
      if (grown.ok()) attention_partials_ = std::move(*grown);
    }
    partials = static_cast<float*>(attention_partials_.data());
    split = partials != nullptr && attention_partials_.bytes() >= bytes;
  } else {
    split = false;
  }
  Check(cuda::LaunchAttention(ToMatrix(q), heads, ToKv(kv), step, scale, window, split, max_tiles,
                              partials, ToMatrix(out), stream_),
        "Attention");
}

bool CudaBackend::HostCallAllowed() {
  if (!step_.active || step_.action != StepGraphBook::Action::kRecord) return true;
  step_.broken = true;
  return false;
}

const int32_t* CudaBackend::StepVector(const std::vector<int32_t>& given, int32_t part) {
  if (!step_.active) return nullptr;
  const int32_t rows = step_.inputs.positions;  // ids and positions both have the step's rows
  if (static_cast<int32_t>(given.size()) == rows &&
      std::equal(given.begin(), given.end(), step_.inputs.words.begin() + part)) {
    return static_cast<const int32_t*>(step_device_.data()) + part;
  }
  return nullptr;
}

void CudaBackend::set_graphs(bool on) {
  Bind();
  graphs_ = on && max_graph_rows_ > 0;
  if (!graphs_) {
    std::vector<void*> graphs;
    book_->Clear(&graphs);
    DestroyGraphs(graphs);
  }
}

void CudaBackend::DestroyGraphs(const std::vector<void*>& graphs) {
  for (void* g : graphs) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
}

Backend::StepMode CudaBackend::BeginStep(const StepInputs& inputs) {
  Bind();
  step_ = Step();
  if (!graphs_ || !status_.ok() || inputs.ids == nullptr || inputs.positions == nullptr) {
    return StepMode::kEager;
  }
  // The inputs in one array: flattened layouts (kept to recognize them), ids and positions.
  step_.layouts.resize(inputs.layouts.size());
  std::vector<const cuda::StepWords*> flat;
  for (size_t i = 0; i < inputs.layouts.size(); ++i) {
    const StepLayout& l = *inputs.layouts[i];
    if (!cuda::FlattenStep(l.positions, l.row_sequence, l.block_tables, l.first_keys, l.no_write,
                           &step_.layouts[i])) {
      return StepMode::kEager;
    }
    flat.push_back(&step_.layouts[i]);
  }
  if (!cuda::PackStepInputs(*inputs.ids, *inputs.positions, flat, inputs.max_position,
                            &step_.inputs)) {
    return StepMode::kEager;
  }
  const size_t bytes = step_.inputs.words.size() * sizeof(int32_t);
  // The device buffer stays put while it is large enough (graphs hold its address); the pinned
  // staging is reused once the last upload has read it.
  if (step_device_.data() == nullptr || step_device_.bytes() < bytes) {
    ++generation_;
    step_device_.Reset();
    absl::StatusOr<DeviceBuffer> grown = Allocate(std::max<size_t>(2 * bytes, 1 << 16));
    if (!grown.ok()) return StepMode::kEager;  // the step runs with ordinary uploads
    step_device_ = std::move(*grown);
  }
  const auto uploaded = static_cast<cudaEvent_t>(step_uploaded_);
  if (!Check(cudaEventSynchronize(uploaded), "cudaEventSynchronize")) return StepMode::kEager;
  if (step_host_bytes_ < bytes) {
    if (step_host_ != nullptr) cudaFreeHost(step_host_);
    step_host_ = nullptr;
    step_host_bytes_ = 0;
    if (cudaHostAlloc(&step_host_, step_device_.bytes(), cudaHostAllocDefault) != cudaSuccess) {
      step_host_ = nullptr;
      return StepMode::kEager;
    }
    step_host_bytes_ = step_device_.bytes();
  }
  std::memcpy(step_host_, step_.inputs.words.data(), bytes);
  if (!Check(
          cudaMemcpyAsync(step_device_.data(), step_host_, bytes, cudaMemcpyHostToDevice, stream_),
          "step inputs to device") ||
      !Check(cudaEventRecord(uploaded, stream_), "cudaEventRecord")) {
    return StepMode::kEager;
  }
  step_.active = true;
  step_.key = inputs.key;
  std::vector<void*> dropped;
  step_.action = book_->Next(inputs.key, generation_, &step_.graph, &dropped);
  DestroyGraphs(dropped);
  switch (step_.action) {
    case StepGraphBook::Action::kRun:
      return StepMode::kEager;
    case StepGraphBook::Action::kReplay:
      return StepMode::kReplayed;
    case StepGraphBook::Action::kRecord:
      break;
  }
  // No copy beside the engine may touch the engine's stream while it is captured.
  beside_mu_.Lock();
  step_.generation = generation_;
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    beside_mu_.Unlock();
    cudaGetLastError();
    book_->NotRecorded(inputs.key, /*failed=*/true);
    step_.action = StepGraphBook::Action::kRun;
    return StepMode::kEager;
  }
  return StepMode::kRecording;
}

absl::StatusOr<bool> CudaBackend::EndStep(bool complete) {
  Bind();
  if (!step_.active) return true;
  const StepGraphBook::Action action = step_.action;
  step_.action = StepGraphBook::Action::kRun;  // a step issued again runs as it comes
  if (action == StepGraphBook::Action::kRun ||
      (!complete && action == StepGraphBook::Action::kReplay)) {
    step_.active = false;
    return true;
  }
  if (action == StepGraphBook::Action::kRecord) {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    beside_mu_.Unlock();
    cudaGraphExec_t exec = nullptr;
    bool made = complete && ended == cudaSuccess && graph != nullptr && !step_.broken &&
                step_.generation == generation_;
    if (made) made = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!made) {
      cudaGetLastError();  // a failed capture or instantiation is not the device's fault
      // Something it cannot hold: never again for this key; a buffer that grew: next time.
      book_->NotRecorded(step_.key, /*failed=*/step_.broken || ended != cudaSuccess);
      if (!complete) step_.active = false;
      return complete ? false : true;  // nothing ran: the caller issues the step again
    }
    book_->Recorded(step_.key, exec);
    step_.graph = exec;
  }
  step_.active = false;
  Check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(step_.graph), stream_), "cudaGraphLaunch");
  RETURN_IF_ERROR(status_);
  return true;
}

absl::Status CudaBackend::ArgMaxRows(const DeviceMatrix& logits, std::vector<int32_t>* tokens) {
  Bind();
  tokens->assign(logits.rows, 0);
  if (logits.rows == 0) return status_;
  void* out = Scratch(argmax_out_, logits.rows * sizeof(int32_t), /*in_graphs=*/false);
  if (out == nullptr) return status_;
  Check(cuda::LaunchArgMax(ToMatrix(logits), static_cast<int32_t*>(out), stream_), "ArgMax");
  CopyToHost(tokens->data(), out, logits.rows * sizeof(int32_t));
  return status_;
}

}  // namespace ferry
