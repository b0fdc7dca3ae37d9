// The interface between the engine's model code and the hardware that runs it
// (ARCHITECTURE.md §4 "Backends"). Model and KV code hold only device pointers and call kernels
// through a Backend; they never read or write device memory themselves. The CPU backend
// (engine/backends/cpu) is the deterministic reference; a CUDA backend implements the same
// methods with stream-ordered kernels.
//
// Memory: DeviceBuffer owns memory obtained from a Backend and returns it on destruction.
// DeviceMatrix is a non-owning 2-D row-major view (rows x cols elements, `stride` elements between
// rows) of fp32 or bf16 data in device memory. DeviceWeight is a weight matrix in the backend's
// own layout (the CPU backend packs it into column panels), made once at load by UploadWeight.
//
// Kernels take host-side step descriptions (token ids, positions, KV slots, block tables) by
// value or pointer; a device backend uploads what it needs. Results are available to the host
// after CopyToHost, which waits for the kernels before it.
//
// Determinism contract for every backend that claims it (the CPU backend always does): each
// output element is reduced in one fixed order that depends only on the element's own inputs
// (never on the number of rows M in the call, the thread count, or the instruction set), so a
// row's result is the same whether it is computed alone or in a batch, in one chunk or several.

#ifndef FERRY_ENGINE_BACKENDS_BACKEND_H_
#define FERRY_ENGINE_BACKENDS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ferry {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1 };

inline size_t DTypeBytes(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) { return t == DType::kF32 ? "f32" : "bf16"; }

// Weights computed in place in one of GGML's block formats (the GGUF file's own quantization:
// blocks of 32 values, or for the K-quants super-blocks of 256; engine/backends/cpu/cpu_quant.h
// defines the arithmetic). kNone: a DType weight.
enum class WeightQuant : uint8_t {
  kNone = 0,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

// "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"; "none".
const char* WeightQuantName(WeightQuant q);

class Backend;

// Device memory owned by a backend; move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* owner, void* data, size_t bytes)
      : owner_(owner), data_(data), bytes_(bytes) {}
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Frees the memory now.
  void Reset();

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A row-major view of device memory.
struct DeviceMatrix {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements from one row to the next

  static DeviceMatrix Dense(void* data, DType dtype, int64_t rows, int64_t cols) {
    return DeviceMatrix{data, dtype, rows, cols, cols};
  }
  // Rows [begin, begin + count).
  DeviceMatrix RowRange(int64_t begin, int64_t count) const;
  // Columns [begin, begin + count) of every row (same stride).
  DeviceMatrix ColRange(int64_t begin, int64_t count) const;
  bool dense() const { return stride == cols; }
};

// A weight matrix (rows = outputs, cols = inputs) in a backend's own layout; owns its memory.
// With quant != kNone it holds blocks of that format (dtype is then meaningless).
struct DeviceWeight {
  DeviceBuffer buffer;
  DType dtype = DType::kF32;
  WeightQuant quant = WeightQuant::kNone;
  int64_t rows = 0;
  int64_t cols = 0;
};

// One layer's K and V inside a paged KV pool (engine/kv). Within each block of `block_bytes`,
// this layer's keys start at `k_offset`, laid out [kv_heads][head_dim][block_tokens] (each head's
// keys column-wise, so a vector load reads one dimension of adjacent keys), and its values at
// `v_offset`, laid out [kv_heads][block_tokens][head_dim]; elements of `dtype`.
struct KvLayerView {
  void* base = nullptr;  // block 0 of the pool
  size_t block_bytes = 0;
  size_t k_offset = 0;
  size_t v_offset = 0;
  int32_t block_tokens = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;
};

// Which cache slot each row's K/V goes to and what each row attends to, for one step. Row r
// belongs to sequence `row_sequence[r]` at absolute position `positions[r]`; it attends to the
// keys at positions 0..positions[r] of that sequence (causal), read through the sequence's block
// table: position p lives in block block_tables[s][p / block_tokens], slot p % block_tokens.
//
// Two optional per-sequence settings serve a replay of sliding-window layers (engine.h "SWA
// replay"): a sequence sees no key before first_keys[s] (its history before that is not in this
// layer's cache), and its rows r with no_write[r] leave the cache as it is (their K/V there,
// computed earlier, is what attention reads). Empty vectors: 0 and write every row.
struct StepLayout {
  std::vector<int32_t> positions;
  std::vector<int32_t> row_sequence;
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<int32_t> first_keys;  // per sequence
  std::vector<uint8_t> no_write;    // per row
  int64_t rows() const { return static_cast<int64_t>(positions.size()); }
  int32_t first_key(int32_t sequence) const {
    return first_keys.empty() ? 0 : first_keys[sequence];
  }
  bool writes(int64_t row) const { return no_write.empty() || no_write[row] == 0; }
};

// Rotary embedding tables: row p holds cos(p * inv_freq[i]) in columns [0, head_dim/2) and
// sin(p * inv_freq[i]) in columns [head_dim/2, head_dim), fp32, one row per position.
struct RopeTable {
  DeviceMatrix table;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  // Whether results are bit-identical by construction (see the contract above).
  virtual bool deterministic() const = 0;
  // Whether Allocate's buffers are host memory the caller may touch directly.
  virtual bool host_memory() const = 0;
  // The element type the model keeps its activations in between kernels (fp32 on the CPU
  // backend, bf16 on the CUDA backend). The residual stream and the logits are fp32 on every
  // backend, so a backend's kernels take fp32 and its activation type (the CPU's: fp32 only).
  virtual DType activation_dtype() const { return DType::kF32; }
  // What a model fingerprint adds for this backend's arithmetic: KV computed by backends whose
  // numerics differ must never be shared by accident (a KV store block, a P/D push). Empty for
  // the CPU backend, the reference every fingerprint was defined on; others name themselves and
  // their mode ("cuda:cublas-bf16").
  virtual std::string fingerprint_tag() const { return ""; }
  // Device memory held and allowed, and the device's size, for reports (Watch, metrics); zeros
  // for host memory, which a backend does not account (the CPU backend). Thread-safe.
  struct MemoryReport {
    uint64_t used_bytes = 0;
    uint64_t limit_bytes = 0;
    uint64_t device_bytes = 0;
  };
  virtual MemoryReport memory() const { return {}; }
  // The first device error since creation (a failed launch or copy; sticky, since a device
  // context that faulted stays unusable). The CPU backend has none.
  virtual absl::Status status() const { return absl::OkStatus(); }

  // --- Memory ---
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual void CopyToDevice(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual void CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) = 0;

  // --- KV movement beside the engine (engine/kv/kv_staging.h) ---
  struct BesideCopy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  // Copies between device memory and host memory (all `to_device`, or all from it) from any
  // thread, while the engine's thread goes on driving the backend, and returns once every byte
  // has moved (the host memory may be reused at once). The copies are ordered after every kernel
  // issued before the call; the caller makes sure none issued meanwhile touches the device
  // ranges (referenced KV blocks that nothing computes). The default, for a backend of host
  // memory: memcpy. (Defined here: Backend has no key function, so no translation unit owns its
  // type information, which a plugin and the binary loading it would otherwise both define.)
  virtual absl::Status CopyBeside(absl::Span<const BesideCopy> copies, bool to_device) {
    if (!host_memory()) {
      return absl::UnimplementedError(name() + " has no copy beside the engine");
    }
    for (const BesideCopy& c : copies) {
      if (c.bytes > 0) std::memcpy(c.dst, c.src, c.bytes);
    }
    return absl::OkStatus();
  }
  // Page-locks host memory the backend copies to and from often (the KV staging area), so that
  // copies run at the link's speed; Unpin before the memory is freed. The default: nothing.
  virtual absl::Status PinHostMemory(void* host, size_t bytes) { return absl::OkStatus(); }
  virtual void UnpinHostMemory(void* host) {}

  // --- Kernels. Activations are fp32 or bf16 (activation_dtype()); weights fp32, bf16 or blocks.

  // A weight matrix (`rows` x `cols`, row-major host data of `dtype`) in this backend's layout.
  virtual absl::StatusOr<DeviceWeight> UploadWeight(const void* host, DType dtype, int64_t rows,
                                                    int64_t cols) = 0;
  // A weight matrix kept in a block format: `host` holds `rows` rows of cols / 32 (K-quants:
  // cols / 256) blocks each in GGML's layout (`bytes` in all). Unimplemented where the backend has
  // no kernels for it.
  virtual absl::StatusOr<DeviceWeight> UploadQuantizedWeight(const uint8_t* host, size_t bytes,
                                                             WeightQuant quant, int64_t rows,
                                                             int64_t cols) = 0;

  // out[r] = table row ids[r] (in out's type). ids are host values, each < table.rows.
  virtual void Embed(const DeviceWeight& table, const std::vector<int32_t>& ids,
                     const DeviceMatrix& out) = 0;
  // RMSNorm of each group of weight.cols columns of each row (a whole row when weight.cols ==
  // x.cols; each head for Qwen3's q/k norm): g / sqrt(mean(g^2) + eps) * weight. out may alias x.
  virtual void RmsNorm(const DeviceMatrix& x, const DeviceMatrix& weight, float eps,
                       const DeviceMatrix& out) = 0;
  // x += delta, then out = RmsNorm(x) (whole rows): the residual step between sublayers. out may
  // alias delta.
  virtual void AddRmsNorm(const DeviceMatrix& x, const DeviceMatrix& delta,
                          const DeviceMatrix& weight, float eps, const DeviceMatrix& out) = 0;
  // out = x * w^T (+ bias): x is M x K, w is N x K, bias 1 x N or null, out M x N.
  // Quantized weights take activations quantized per block (cpu_quant.h).
  virtual void MatMul(const DeviceMatrix& x, const DeviceWeight& w, const DeviceMatrix* bias,
                      const DeviceMatrix& out) = 0;
  // acc += x, elementwise.
  virtual void Add(const DeviceMatrix& acc, const DeviceMatrix& x) = 0;
  // out row i = x row rows[i] (mixture-of-experts: the tokens routed to one expert), converted to
  // out's type where x's differs (a backend whose activations are not fp32).
  virtual void GatherRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                          const DeviceMatrix& out) = 0;
  // acc row rows[i] += scales[i] * x row i (the product rounded, then added), for distinct rows.
  virtual void AddScaledRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                             const std::vector<float>& scales, const DeviceMatrix& acc) = 0;
  // out = silu(gate) * up, elementwise, silu(g) = g / (1 + e^-g).
  virtual void SwiGlu(const DeviceMatrix& gate, const DeviceMatrix& up,
                      const DeviceMatrix& out) = 0;
  // Rotates x (rows x heads*head_dim, in place) by position, the "rotate half" convention of HF
  // models: for i < head_dim/2, (x[i], x[i + head_dim/2]) is rotated by angle positions[r] *
  // inv_freq[i].
  virtual void Rope(const DeviceMatrix& x, int32_t heads, const std::vector<int32_t>& positions,
                    const RopeTable& rope) = 0;
  // Writes row r of k and v (rows x kv_heads*head_dim) to the cache at the slot of
  // (layout.row_sequence[r], layout.positions[r]), rounded to the cache dtype; rows the layout
  // marks no_write are skipped.
  virtual void WriteKv(const DeviceMatrix& k, const DeviceMatrix& v, const KvLayerView& kv,
                       const StepLayout& layout) = 0;
  // Causal attention of q (rows x heads*head_dim) over the cached keys and values of each row's
  // sequence (see StepLayout); heads share KV heads in groups of heads / kv.kv_heads. Scores are
  // scaled by `scale`. With window > 0 (sliding-window layers) a row at position p sees the keys
  // at positions max(0, p - window + 1)..p only; none before its sequence's first_key either.
  // A row's result depends only on the keys it sees. out: rows x heads*head_dim.
  virtual void Attention(const DeviceMatrix& q, const KvLayerView& kv, const StepLayout& layout,
                         float scale, int32_t window, const DeviceMatrix& out) = 0;

  // The greedy token of each row of fp32 `logits`, as the host sampler's greedy choice: the
  // largest value, the lowest index among equals, NaN never; 0 when no value is above -inf.
  // Waits for the kernels before it. Unimplemented where the backend has none (the engine then
  // reads the logits and chooses on the host).
  virtual absl::Status ArgMaxRows(const DeviceMatrix& logits, std::vector<int32_t>* tokens) {
    return absl::UnimplementedError(name() + " has no argmax of its own");
  }

  // --- Recorded steps (CUDA graphs): a decode step's kernels recorded once, then replayed ---
  //
  // A backend that records steps takes a step's per-step inputs once (BeginStep: uploaded into
  // device buffers whose addresses stay fixed), and the kernels the caller then issues read
  // them from there: kernels given vectors equal to the inputs read the uploaded copies. Steps of
  // one `key` (the caller's promise: the same kernels on the same buffers, with the same row
  // counts and the same launch shapes) are run as they are the first time, recorded the next,
  // then replayed with only the upload: BeginStep says which. The caller always ends a step with
  // EndStep, which returns whether the step's work has been issued; false (a recording had to be
  // dropped) means: issue the same kernels again, as they come, then call EndStep again. A
  // caller that could not issue the whole step says so (`complete` false): a recording is then
  // dropped and nothing launched.
  struct StepInputs {
    const std::vector<int32_t>* ids = nullptr;        // Embed's
    const std::vector<int32_t>* positions = nullptr;  // Rope's
    std::vector<const StepLayout*> layouts;           // WriteKv's and Attention's: 1 or 2
    // At least every row's position and the last position every block table can hold: the
    // launch shapes of a recorded step (its tiles of keys) do not follow the step's own.
    int32_t max_position = 0;
    uint64_t key = 0;
  };
  enum class StepMode { kEager, kRecording, kReplayed };
  // The most rows a recorded step may have; 0: this backend records none (the CPU backend).
  virtual int64_t max_recorded_rows() const { return 0; }
  virtual StepMode BeginStep(const StepInputs& inputs) { return StepMode::kEager; }
  virtual absl::StatusOr<bool> EndStep(bool complete = true) { return true; }

  // Waits until all issued work has finished.
  virtual void Synchronize() = 0;

 protected:
  friend class DeviceBuffer;
  virtual void Free(void* data, size_t bytes) = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_BACKEND_H_
