// ferry-gpu-check: every GPU check of the CUDA backend in one run (tools/gpu/check.sh runs it on
// a machine with a GPU; docs/tools/gpu-check.md). Prints a table to stderr and one JSON line to
// stdout:
//   {"bench": "gpu", "device": ..., "kernels_checked": N, "kernels_failed": N,
//    "attention_bw_ratio": x, "deterministic_gemm_vs_cublas": x, "decode_b1_bw_ratio": x, ...}
// A figure that was not measured is null, with the reason in "notes".
//
// Checks, each against the CPU backend (the reference) on the same inputs:
//   kernels  embedding (bf16, Q8_0, Q4_K: exact), RmsNorm and AddRmsNorm (fp32 rounding),
//            MatMul (bf16 through cuBLAS: fp32-accumulation tolerance; Q8_0 and Q4_K: exact),
//            SwiGLU, RoPE, Add, GatherRows, AddScaledRows, the KV write (exact), paged attention
//            (prefill, decode, sliding window, first key: tolerance; split or not, a row alone or
//            in a batch: the same bits), the device argmax (exact).
//   models   synthetic SmolLM2-shaped models (bf16, Q8_0, Q4_K weights; one with sliding-window
//            layers): a prompt and greedy decode steps on both backends, logits within the bf16
//            tolerance, greedy tokens equal wherever the CPU's margin exceeds the difference.
//   speed    decode attention's bandwidth against the copy kernel's, and decode tokens/s of a
//            Llama-3-8B-shaped model at batch 1 against the bytes-read limit.
// Exit status: 0 when every check passed, 1 when one failed, 2 when there is no usable GPU.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backends/backend.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/cuda/cuda_backend.h"
#include "engine/common/float_math.h"
#include "engine/common/log.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/host_weights.h"
#include "engine/model/synthetic_model.h"
#include "engine/model/transformer.h"
#include "engine/parallel/nccl_communicator.h"
#include "engine/sampling/sampler.h"
#include "tools/gpu/copy_kernel.h"

namespace ferry {
namespace {

struct Result {
  std::string name;
  bool ok = false;
  double error = 0;      // the measured error (max |got - want| / max(|want|, 1))
  double tolerance = 0;  // what it may be
  std::string note;
};

std::vector<Result> results;

void Record(const std::string& name, bool ok, double error, double tolerance,
            const std::string& note = "") {
  results.push_back({name, ok, error, tolerance, note});
  std::fprintf(stderr, "%-44s %s  error %.3g (tolerance %.3g) %s\n", name.c_str(),
               ok ? "ok    " : "FAILED", error, tolerance, note.c_str());
}

// The JSON line (always the last line of stdout), printed at the end or by Bail.
void PrintJson(const std::string& device, double attention_bw_ratio, double gemm_ratio,
               double decode_b1_bw_ratio, double decode_b1_tokens_per_s, double copy_gb_per_s,
               const std::vector<std::string>& notes);
size_t kernel_results = 0;  // results[0, kernel_results) are the kernel checks (set after them)
std::string device_name;

// An error no check can go on from (an allocation, a device fault, a model that failed): the
// results so far, the error as a failure and a note, the JSON line, exit 1.
[[noreturn]] void Bail(const absl::Status& s, const char* what) {
  Record(std::string("aborted at ") + what, false, INFINITY, 0, s.ToString());
  if (kernel_results == 0) kernel_results = results.size();
  PrintJson(device_name, NAN, NAN, NAN, NAN, NAN, {std::string(what) + ": " + s.ToString()});
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Bail(v.status(), what);
  return *std::move(v);
}

void MustOk(const absl::Status& s, const char* what) {
  if (!s.ok()) Bail(s, what);
}

// A host matrix of fp32 values.
struct HostMat {
  int64_t rows = 0, cols = 0;
  std::vector<float> v;
};

HostMat Random(int64_t rows, int64_t cols, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  HostMat m{rows, cols, std::vector<float>(rows * cols)};
  for (float& x : m.v) x = normal(rng);
  return m;
}

// A matrix on a backend, owning its memory.
struct DevMat {
  DeviceBuffer buffer;
  DeviceMatrix m;
};

DevMat Put(Backend& b, const HostMat& h, DType dtype = DType::kF32) {
  DevMat d;
  d.buffer = Must(b.Allocate(std::max<size_t>(h.v.size() * DTypeBytes(dtype), 4)), "Allocate");
  d.m = DeviceMatrix::Dense(d.buffer.data(), dtype, h.rows, h.cols);
  if (dtype == DType::kF32) {
    b.CopyToDevice(d.buffer.data(), h.v.data(), h.v.size() * 4);
  } else {
    std::vector<uint16_t> bf(h.v.size());
    for (size_t i = 0; i < bf.size(); ++i) bf[i] = FloatToBf16(h.v[i]);
    b.CopyToDevice(d.buffer.data(), bf.data(), bf.size() * 2);
  }
  return d;
}

DevMat Zeros(Backend& b, int64_t rows, int64_t cols, DType dtype = DType::kF32) {
  return Put(b, HostMat{rows, cols, std::vector<float>(rows * cols, 0.0f)}, dtype);
}

HostMat Get(Backend& b, const DeviceMatrix& m) {
  HostMat h{m.rows, m.cols, std::vector<float>(m.rows * m.cols)};
  const size_t bytes =
      static_cast<size_t>(m.rows > 0 ? (m.rows - 1) * m.stride + m.cols : 0) * DTypeBytes(m.dtype);
  std::vector<char> raw(bytes);
  b.CopyToHost(raw.data(), m.data, bytes);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const int64_t i = r * m.stride + c;
      float x;
      if (m.dtype == DType::kF32) {
        std::memcpy(&x, raw.data() + i * 4, 4);
      } else {
        uint16_t u;
        std::memcpy(&u, raw.data() + i * 2, 2);
        x = Bf16ToFloat(u);
      }
      h.v[r * m.cols + c] = x;
    }
  }
  return h;
}

// max |got - want| / max(max |want|, 1e-30); NaN where either has a NaN the other lacks.
double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i])) return NAN;
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return diff / scale;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void Compare(const std::string& name, const HostMat& got, const HostMat& want, double tolerance) {
  const double e = RelError(got.v, want.v);
  Record(name, e <= tolerance, e, tolerance);
}

// ---- Kernels ----

// Weights of n x k in `quant` blocks (Q8_0 / Q4_K via the synthetic model's quantizers) or bf16.
HostTensor RandomWeight(int64_t n, int64_t k, WeightQuant quant, uint32_t seed) {
  SyntheticVariant v;
  v.name = "w";
  v.layers = 0;  // the embedding table is the weight; nothing else is made
  v.hidden = k;
  v.intermediate = k;
  v.heads = 1;
  v.kv_heads = 1;
  v.head_dim = k;
  v.vocab = n;
  v.tied = true;
  v.all_blocks = quant;
  v.weights = WeightDType::kBF16;
  v.seed = seed;
  HostWeights w = SyntheticModel(v);
  return w.tensors.at("model.embed_tokens.weight");
}

absl::StatusOr<DeviceWeight> Upload(Backend& b, const HostTensor& t) {
  if (t.quant != WeightQuant::kNone) {
    return b.UploadQuantizedWeight(t.blocks.data(), t.blocks.size(), t.quant, t.shape[0],
                                   t.shape[1]);
  }
  return b.UploadWeight(t.bf16.data(), DType::kBF16, t.shape[0], t.shape[1]);
}

void CheckEmbedAndMatMul(CpuBackend& cpu, CudaBackend& gpu) {
  for (WeightQuant quant : {WeightQuant::kNone, WeightQuant::kQ8_0, WeightQuant::kQ4_K}) {
    const char* qn = WeightQuantName(quant);
    const int64_t n = 1000, k = 1536;
    const HostTensor t = RandomWeight(n, k, quant, 5);
    DeviceWeight wc = Must(Upload(cpu, t), "UploadWeight");
    DeviceWeight wg = Must(Upload(gpu, t), "UploadWeight");
    const std::vector<int32_t> ids = {0, 999, 17, 17, 512};
    DevMat ec = Zeros(cpu, ids.size(), k), eg = Zeros(gpu, ids.size(), k);
    cpu.Embed(wc, ids, ec.m);
    gpu.Embed(wg, ids, eg.m);
    const HostMat want = Get(cpu, ec.m), got = Get(gpu, eg.m);
    Record(absl::StrCat("embed ", qn), SameBits(got.v, want.v), RelError(got.v, want.v), 0);
    for (int64_t m : {1, 7, 64}) {
      const HostMat x = Random(m, k, 7 + m);
      DevMat xc = Put(cpu, x), xg = Put(gpu, x);
      DevMat oc = Zeros(cpu, m, n), og = Zeros(gpu, m, n);
      cpu.MatMul(xc.m, wc, nullptr, oc.m);
      gpu.MatMul(xg.m, wg, nullptr, og.m);
      const HostMat w = Get(cpu, oc.m), g = Get(gpu, og.m);
      const std::string name = absl::StrCat("matmul ", qn, " m=", m, " k=", k, " n=", n);
      if (quant == WeightQuant::kNone) {
        // Both round x to bf16 and accumulate in fp32, in different orders (about 1e-6 of the
        // largest output); a GPU that skipped the rounding of x would be off by about 1e-3.
        Compare(name, g, w, 1e-4);
      } else {
        Record(name, SameBits(g.v, w.v), RelError(g.v, w.v), 0, "bit-identical by definition");
      }
    }
  }
  // Bias, and an output view inside a wider matrix (a stacked weight's columns).
  const HostTensor t = RandomWeight(256, 512, WeightQuant::kNone, 9);
  DeviceWeight wc = Must(Upload(cpu, t), "UploadWeight");
  DeviceWeight wg = Must(Upload(gpu, t), "UploadWeight");
  const HostMat x = Random(5, 512, 3), bias = Random(1, 256, 4);
  DevMat xc = Put(cpu, x), xg = Put(gpu, x), bc = Put(cpu, bias), bg = Put(gpu, bias);
  DevMat oc = Zeros(cpu, 5, 400), og = Zeros(gpu, 5, 400);
  cpu.MatMul(xc.m, wc, &bc.m, oc.m.ColRange(100, 256));
  gpu.MatMul(xg.m, wg, &bg.m, og.m.ColRange(100, 256));
  Compare("matmul bf16 + bias into columns 100..355", Get(gpu, og.m), Get(cpu, oc.m), 1e-4);
}

void CheckElementwise(CpuBackend& cpu, CudaBackend& gpu) {
  const int64_t rows = 9, cols = 576;
  const HostMat x = Random(rows, cols, 1), d = Random(rows, cols, 2), w = Random(1, cols, 3);
  {
    DevMat xc = Put(cpu, x), xg = Put(gpu, x), wc = Put(cpu, w), wg = Put(gpu, w);
    DevMat oc = Zeros(cpu, rows, cols), og = Zeros(gpu, rows, cols);
    cpu.RmsNorm(xc.m, wc.m, 1e-5f, oc.m);
    gpu.RmsNorm(xg.m, wg.m, 1e-5f, og.m);
    Compare("rmsnorm", Get(gpu, og.m), Get(cpu, oc.m), 1e-6);
    // Per-head groups (Qwen3's q/k norm): 9 groups of 64.
    const HostMat hw = Random(1, 64, 4);
    DevMat hc = Put(cpu, hw), hg = Put(gpu, hw);
    cpu.RmsNorm(xc.m, hc.m, 1e-6f, oc.m);
    gpu.RmsNorm(xg.m, hg.m, 1e-6f, og.m);
    Compare("rmsnorm per head", Get(gpu, og.m), Get(cpu, oc.m), 1e-6);
  }
  {
    DevMat xc = Put(cpu, x), xg = Put(gpu, x), dc = Put(cpu, d), dg = Put(gpu, d);
    DevMat wc = Put(cpu, w), wg = Put(gpu, w);
    cpu.AddRmsNorm(xc.m, dc.m, wc.m, 1e-5f, dc.m);  // out aliases delta, as the model calls it
    gpu.AddRmsNorm(xg.m, dg.m, wg.m, 1e-5f, dg.m);
    Compare("add_rmsnorm: residual", Get(gpu, xg.m), Get(cpu, xc.m), 0);
    Compare("add_rmsnorm: norm", Get(gpu, dg.m), Get(cpu, dc.m), 1e-6);
  }
  {
    DevMat gc = Put(cpu, x), gg = Put(gpu, x), uc = Put(cpu, d), ug = Put(gpu, d);
    DevMat oc = Zeros(cpu, rows, cols), og = Zeros(gpu, rows, cols);
    cpu.SwiGlu(gc.m, uc.m, oc.m);
    gpu.SwiGlu(gg.m, ug.m, og.m);
    Compare("swiglu", Get(gpu, og.m), Get(cpu, oc.m), 1e-6);
    cpu.Add(oc.m, gc.m);
    gpu.Add(og.m, gg.m);
    Compare("add", Get(gpu, og.m), Get(cpu, oc.m), 1e-6);
  }
  {
    const std::vector<int32_t> pick = {8, 0, 3};
    const std::vector<float> scales = {0.5f, -2.0f, 0.125f};
    DevMat xc = Put(cpu, x), xg = Put(gpu, x);
    DevMat oc = Zeros(cpu, 3, cols), og = Zeros(gpu, 3, cols);
    cpu.GatherRows(xc.m, pick, oc.m);
    gpu.GatherRows(xg.m, pick, og.m);
    Compare("gather_rows", Get(gpu, og.m), Get(cpu, oc.m), 0);
    DevMat ac = Put(cpu, d), ag = Put(gpu, d);
    cpu.AddScaledRows(oc.m, pick, scales, ac.m);
    gpu.AddScaledRows(og.m, pick, scales, ag.m);
    Compare("add_scaled_rows", Get(gpu, ag.m), Get(cpu, ac.m), 1e-6);
  }
  {
    // RoPE over 9 heads of 64 at positions up to 4000.
    const int64_t hd = 64, positions = 4096;
    HostMat table{positions, hd, std::vector<float>(positions * hd)};
    for (int64_t p = 0; p < positions; ++p) {
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double f = std::pow(10000.0, -2.0 * i / hd);
        table.v[p * hd + i] = static_cast<float>(std::cos(p * f));
        table.v[p * hd + hd / 2 + i] = static_cast<float>(std::sin(p * f));
      }
    }
    DevMat tc = Put(cpu, table), tg = Put(gpu, table);
    DevMat xc = Put(cpu, x), xg = Put(gpu, x);
    const std::vector<int32_t> pos = {0, 1, 2, 100, 101, 2047, 2048, 3999, 7};
    cpu.Rope(xc.m, 9, pos, RopeTable{tc.m});
    gpu.Rope(xg.m, 9, pos, RopeTable{tg.m});
    Compare("rope", Get(gpu, xg.m), Get(cpu, xc.m), 1e-6);
  }
  {
    HostMat logits = Random(7, 49152, 8);
    logits.v[3 * 49152 + 77] = 1e9f;  // ties: the lowest index wins
    logits.v[3 * 49152 + 78] = 1e9f;
    logits.v[4 * 49152 + 5] = NAN;  // NaN never wins
    // Nothing above -inf (a NaN first, then -inf): token 0, as the host sampler.
    for (int64_t c = 0; c < 49152; ++c) logits.v[6 * 49152 + c] = -INFINITY;
    logits.v[6 * 49152] = NAN;
    DevMat lg = Put(gpu, logits), lc = Put(cpu, logits);
    std::vector<int32_t> got, want;
    const absl::Status s = gpu.ArgMaxRows(lg.m, &got);
    bool ok =
        s.ok() && cpu.ArgMaxRows(lc.m, &want).ok() && got == want && want[6] == 0 && want[3] == 77;
    Record("argmax (ties, NaN)", ok, ok ? 0 : 1, 0);
  }
}

// One layer's KV in its own blocks on a backend.
struct KvHolder {
  DeviceBuffer memory;
  KvLayerView view;
};

KvHolder MakeKv(Backend& b, int32_t blocks, int32_t block_tokens, int32_t kv_heads,
                int32_t head_dim, DType dtype) {
  KvHolder h;
  const size_t half = static_cast<size_t>(kv_heads) * head_dim * block_tokens * DTypeBytes(dtype);
  h.memory = Must(b.Allocate(half * 2 * blocks), "Allocate KV");
  std::vector<char> zeros(half * 2 * blocks, 0);
  b.CopyToDevice(h.memory.data(), zeros.data(), zeros.size());
  h.view = KvLayerView{h.memory.data(), half * 2, 0, half, block_tokens, kv_heads, head_dim, dtype};
  return h;
}

// A step of three sequences: a prefill chunk at 0..299, a decode row at 700, a decode row at 1500
// whose history starts at key 200 (first_keys), in blocks of 16 handed out in a scattered order.
StepLayout ThreeSequences(int32_t block_tokens) {
  StepLayout l;
  int32_t next = 0;
  auto table = [&](int32_t positions) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i * block_tokens < positions; ++i) t.push_back(next++);
    std::reverse(t.begin(), t.end());  // not in order in the pool
    return t;
  };
  l.block_tables = {table(300), table(701), table(1501)};
  for (int32_t p = 0; p < 300; ++p) {
    l.positions.push_back(p);
    l.row_sequence.push_back(0);
  }
  l.positions.push_back(700);
  l.row_sequence.push_back(1);
  l.positions.push_back(1500);
  l.row_sequence.push_back(2);
  l.first_keys = {0, 0, 200};
  return l;
}

void CheckAttention(CpuBackend& cpu, CudaBackend& gpu) {
  const int32_t bt = 16, kvh = 3, hd = 64, heads = 9;
  // Fill every cached position of the three sequences: one WriteKv of all positions.
  StepLayout fill = ThreeSequences(bt);
  const StepLayout step = fill;
  fill.positions.clear();
  fill.row_sequence.clear();
  for (int32_t s = 0; s < 3; ++s) {
    const int32_t end = s == 0 ? 300 : s == 1 ? 701 : 1501;
    for (int32_t p = 0; p < end; ++p) {
      fill.positions.push_back(p);
      fill.row_sequence.push_back(s);
    }
  }
  const int64_t n = fill.rows();
  const HostMat k = Random(n, kvh * hd, 11), v = Random(n, kvh * hd, 12);
  const int32_t blocks = 300 / bt + 1 + 701 / bt + 1 + 1501 / bt + 1;
  for (DType kv_dtype : {DType::kBF16, DType::kF32}) {
    KvHolder kc = MakeKv(cpu, blocks, bt, kvh, hd, kv_dtype);
    KvHolder kg = MakeKv(gpu, blocks, bt, kvh, hd, kv_dtype);
    DevMat kcm = Put(cpu, k), kgm = Put(gpu, k), vcm = Put(cpu, v), vgm = Put(gpu, v);
    cpu.WriteKv(kcm.m, vcm.m, kc.view, fill);
    gpu.WriteKv(kgm.m, vgm.m, kg.view, fill);
    std::vector<char> cache_c(kc.memory.bytes()), cache_g(kg.memory.bytes());
    cpu.CopyToHost(cache_c.data(), kc.memory.data(), cache_c.size());
    gpu.CopyToHost(cache_g.data(), kg.memory.data(), cache_g.size());
    Record(absl::StrCat("write_kv ", DTypeName(kv_dtype)), cache_c == cache_g,
           cache_c == cache_g ? 0 : 1, 0);

    const HostMat q = Random(step.rows(), heads * hd, 13);
    DevMat qc = Put(cpu, q), qg = Put(gpu, q);
    const float scale = 0.125f;
    for (int32_t window : {0, 128}) {
      DevMat oc = Zeros(cpu, step.rows(), heads * hd);
      DevMat split = Zeros(gpu, step.rows(), heads * hd);
      DevMat whole = Zeros(gpu, step.rows(), heads * hd);
      cpu.Attention(qc.m, kc.view, step, scale, window, oc.m);
      gpu.AttentionWith(qg.m, kg.view, step, scale, window, true, split.m);
      gpu.AttentionWith(qg.m, kg.view, step, scale, window, false, whole.m);
      const std::string name =
          absl::StrCat("attention ", DTypeName(kv_dtype), window > 0 ? " window 128" : "");
      const HostMat want = Get(cpu, oc.m), got = Get(gpu, split.m), got_whole = Get(gpu, whole.m);
      Compare(name, got, want, 1e-5);
      Record(name + ": split == one CTA per row", SameBits(got.v, got_whole.v),
             RelError(got.v, got_whole.v), 0);
      // Each decode row alone: the same bits as in the batch.
      bool alone_same = true;
      for (int32_t s = 1; s < 3; ++s) {
        StepLayout one = step;
        one.positions = {step.positions[299 + s]};
        one.row_sequence = {s};
        DevMat q1 = Put(gpu, HostMat{1, heads * hd,
                                     std::vector<float>(q.v.begin() + (299 + s) * heads * hd,
                                                        q.v.begin() + (300 + s) * heads * hd)});
        DevMat o1 = Zeros(gpu, 1, heads * hd);
        gpu.Attention(q1.m, kg.view, one, scale, window, o1.m);
        const HostMat alone = Get(gpu, o1.m);
        alone_same =
            alone_same &&
            std::memcmp(alone.v.data(), got.v.data() + (299 + s) * heads * hd, heads * hd * 4) == 0;
      }
      Record(name + ": a row alone == in the batch", alone_same, alone_same ? 0 : 1, 0);
    }
  }
}

// NCCL with one rank (more where a machine has several GPUs): the all-reduce of one matrix is
// itself, and the all-gather puts it in place.
void CheckNccl(CudaBackend& gpu) {
  auto group = NcclCommunicator::CreateGroup({&gpu});
  if (!group.ok()) {
    Record("nccl: one rank", false, INFINITY, 0, group.status().ToString());
    return;
  }
  Communicator& c = *(*group)[0];
  const HostMat x = Random(3, 100, 21);
  DevMat a = Put(gpu, x), b = Put(gpu, x, DType::kBF16), o = Zeros(gpu, 3, 100);
  const absl::Status s1 = c.AllReduceSum(a.m), s2 = c.AllReduceSum(b.m), s3 = c.AllGather(a.m, o.m);
  const HostMat ga = Get(gpu, a.m), gb = Get(gpu, b.m), go = Get(gpu, o.m);
  HostMat xb = x;
  for (float& v : xb.v) v = RoundToBf16(v);
  const bool ok = s1.ok() && s2.ok() && s3.ok() && SameBits(ga.v, x.v) && SameBits(gb.v, xb.v) &&
                  SameBits(go.v, x.v);
  Record("nccl: one rank all-reduce and all-gather", ok, ok ? 0 : 1, 0,
         s1.ok() && s2.ok() && s3.ok() ? "" : (s1.ok() ? (s2.ok() ? s3 : s2) : s1).ToString());
}

double Seconds(const std::function<void()>& f, CudaBackend& gpu, int repeat);

// The backend's stream, for the check's own kernels (copy, fill): ordered with the backend's.
CUstream_st* Stream(CudaBackend& b) { return static_cast<CUstream_st*>(b.stream()); }

SyntheticVariant SmolLm2Shaped(const std::string& name) {
  SyntheticVariant v;
  v.name = name;
  v.layers = 4;  // of SmolLM2's 30: the shapes matter, not the depth
  v.hidden = 576;
  v.intermediate = 1536;
  v.heads = 9;
  v.kv_heads = 3;
  v.head_dim = 64;
  v.vocab = 49152;
  v.max_positions = 2048;
  v.tied = true;
  v.weights = WeightDType::kBF16;
  v.kv = "bf16";
  return v;
}

// --deterministic: the batch-invariant GEMM against the CPU's bf16 product, and each row alone
// against the same row in batches of 1..64; then speed against cuBLAS on the same shapes.
void CheckDeterministicGemm(CpuBackend& cpu, CudaBackend& det) {
  const int64_t n = 1536, k = 576;
  const HostTensor t = RandomWeight(n, k, WeightQuant::kNone, 31);
  DeviceWeight wc = Must(Upload(cpu, t), "UploadWeight");
  DeviceWeight wg = Must(Upload(det, t), "UploadWeight");
  const HostMat x = Random(64, k, 32);
  DevMat xc = Put(cpu, x), xg = Put(det, x, DType::kBF16);
  DevMat oc = Zeros(cpu, 64, n), og = Zeros(det, 64, n);
  cpu.MatMul(xc.m, wc, nullptr, oc.m);
  det.MatMul(xg.m, wg, nullptr, og.m);
  const HostMat want = Get(cpu, oc.m), batch = Get(det, og.m);
  Compare("deterministic gemm m=64 against the CPU", batch, want, 1e-4);
  bool same = true;
  for (int64_t m : {1, 2, 3, 17, 63}) {
    DevMat o = Zeros(det, m, n);
    det.MatMul(xg.m.RowRange(0, m), wg, nullptr, o.m);
    const HostMat got = Get(det, o.m);
    same = same && std::memcmp(got.v.data(), batch.v.data(), got.v.size() * 4) == 0;
  }
  // Row 40 alone (a different tile position from row 0's).
  DevMat one = Zeros(det, 1, n);
  det.MatMul(xg.m.RowRange(40, 1), wg, nullptr, one.m);
  const HostMat alone = Get(det, one.m);
  same = same && std::memcmp(alone.v.data(), batch.v.data() + 40 * n, n * 4) == 0;
  Record("deterministic gemm: rows alone == in batches of 1..64", same, same ? 0 : 1, 0);
}

// The deterministic model: a prompt whole and in chunks, and decode rows alone and in batches,
// give the same bits.
void CheckDeterministicModel(CudaBackend& det) {
  const HostWeights w = SyntheticModel(SmolLm2Shaped("deterministic"));
  BackendKvAllocator allocator(&det);
  auto model = Transformer::Create(w, &det);
  if (!model.ok()) {
    Record("deterministic model", false, INFINITY, 0, model.status().ToString());
    return;
  }
  auto pool = Must(KvBlockPool::Create((*model)->KvLayoutFor(16), 4096, &allocator, &det),
                   "KvBlockPool::Create");
  std::mt19937 rng(8);
  auto prompt_of = [&](int n) {
    std::vector<TokenId> p(n);
    for (TokenId& t : p) t = static_cast<TokenId>(rng() % w.config.vocab_size);
    return p;
  };
  const std::vector<TokenId> prompt = prompt_of(300);
  auto run = [&](int64_t chunk) {
    auto blocks = Must(pool->Allocate(pool->layout().BlocksFor(300)), "KV blocks");
    std::vector<float> logits;
    for (int64_t b = 0; b < 300; b += chunk) {
      const int64_t len = std::min<int64_t>(chunk, 300 - b);
      MustOk((*model)->Forward({{absl::MakeConstSpan(prompt).subspan(b, len), b, blocks, true}},
                               *pool, &logits),
             "Forward");
    }
    MustOk(pool->Release(blocks), "Release");
    return logits;
  };
  const std::vector<float> whole = run(300);
  bool same = true;
  for (int64_t chunk : {1, 7, 64, 256}) same = same && SameBits(run(chunk), whole);
  Record("deterministic model: prompt whole == in chunks of 1, 7, 64, 256", same, same ? 0 : 1, 0);

  // 64 sequences with prompts of different lengths; then one decode step of sequence 0 alone and
  // in batches of 2..64.
  std::vector<std::vector<TokenId>> prompts;
  std::vector<std::vector<BlockId>> tables;
  for (int s = 0; s < 64; ++s) {
    prompts.push_back(prompt_of(20 + 3 * s));
    tables.push_back(
        Must(pool->Allocate(pool->layout().BlocksFor(prompts.back().size() + 1)), "KV blocks"));
    std::vector<float> ignored;
    MustOk((*model)->Forward({{prompts.back(), 0, tables.back(), false}}, *pool, &ignored),
           "Forward");
  }
  const std::vector<TokenId> next = {7};
  std::vector<float> alone;
  MustOk((*model)->Forward({{next, static_cast<int64_t>(prompts[0].size()), tables[0], false}},
                           *pool, &alone),
         "Forward");
  bool batch_same = true;
  for (int size : {2, 5, 16, 64}) {
    std::vector<ForwardSequence> batch;
    for (int s = 0; s < size; ++s) {
      batch.push_back({next, static_cast<int64_t>(prompts[s].size()), tables[s], false});
    }
    std::vector<float> logits;
    MustOk((*model)->Forward(batch, *pool, &logits), "Forward");
    batch_same =
        batch_same && std::memcmp(logits.data(), alone.data(), alone.size() * sizeof(float)) == 0;
  }
  for (auto& t : tables) MustOk(pool->Release(t), "Release");
  Record("deterministic model: a decode row alone == in batches of 2..64", batch_same,
         batch_same ? 0 : 1, 0);
}

// Decode steps as CUDA graphs (engine/model/recorded_step.h): 16 sequences decoding in batches of
// 16, 9, 3 and 16 rows (run padded to 16, 16, 4 and 16), three rounds, give the bits the same
// steps give without graphs on the deterministic backend (padding changes no row there), and
// most of them were replays. Then a decode step of one sequence of the SmolLM2-shaped model on
// the default backend, with and without graphs (a note).
void CheckGraphs(CudaBackend& det, CudaBackend& g, std::vector<std::string>* notes) {
  const HostWeights w = SyntheticModel(SmolLm2Shaped("graphs"));
  auto decode = [&](CudaBackend& b, bool graphs) {
    b.set_graphs(graphs);
    BackendKvAllocator allocator(&b);
    auto model = Must(Transformer::Create(w, &b), "Transformer");
    auto pool = Must(KvBlockPool::Create(model->KvLayoutFor(16), 1024, &allocator, &b), "pool");
    std::mt19937 rng(9);
    std::vector<std::vector<TokenId>> tokens;
    std::vector<std::vector<BlockId>> tables;
    for (int s = 0; s < 16; ++s) {
      std::vector<TokenId> p(10 + 7 * s);
      for (TokenId& t : p) t = static_cast<TokenId>(rng() % w.config.vocab_size);
      tokens.push_back(p);
      tables.push_back(Must(pool->Allocate(pool->layout().BlocksFor(p.size() + 64)), "blocks"));
      std::vector<float> ignored;
      MustOk(model->Forward({{tokens.back(), 0, tables.back(), false}}, *pool, &ignored),
             "Forward");
    }
    std::vector<float> all;
    const std::vector<std::vector<int>> shapes = {
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
        {0, 2, 4, 6, 8, 10, 12, 14, 15},
        {1, 5, 9},
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}};
    for (int round = 0; round < 3; ++round) {
      for (const std::vector<int>& members : shapes) {
        std::vector<ForwardSequence> batch;
        for (int s : members) {
          const int64_t n = static_cast<int64_t>(tokens[s].size());
          batch.push_back({absl::MakeConstSpan(tokens[s]).last(1), n - 1, tables[s], false});
        }
        std::vector<float> logits;
        MustOk(model->Forward(batch, *pool, &logits), "Forward");
        for (size_t i = 0; i < members.size(); ++i) {
          const float* row = logits.data() + i * w.config.vocab_size;
          tokens[members[i]].push_back(
              static_cast<TokenId>(std::max_element(row, row + w.config.vocab_size) - row));
        }
        all.insert(all.end(), logits.begin(), logits.end());
      }
    }
    for (auto& t : tables) MustOk(pool->Release(t), "Release");
    return all;
  };
  const std::vector<float> eager = decode(det, false);
  const int64_t replayed = det.graph_stats().replayed;
  const std::vector<float> graphed = decode(det, true);
  const int64_t replays = det.graph_stats().replayed - replayed;
  const bool same = SameBits(eager, graphed);
  Record(absl::StrCat("graphs: 12 decode steps of 3..16 rows replayed == run as they come (",
                      replays, " replays)"),
         same && replays >= 6, same ? 0 : 1, 0);

  // One sequence's decode step, timed, with and without graphs (cuBLAS products).
  double ms[2] = {NAN, NAN};
  for (int graphs = 0; graphs < 2; ++graphs) {
    g.set_graphs(graphs == 1);
    BackendKvAllocator allocator(&g);
    auto model = Must(Transformer::Create(w, &g), "Transformer");
    auto pool = Must(KvBlockPool::Create(model->KvLayoutFor(16), 64, &allocator, &g), "pool");
    std::vector<TokenId> prompt(100, 5);
    auto blocks = Must(pool->Allocate(pool->layout().BlocksFor(101)), "blocks");
    std::vector<float> logits;
    MustOk(model->Forward({{prompt, 0, blocks, false}}, *pool, &logits), "Forward");
    auto step = [&] {
      logits.clear();
      MustOk(model->Forward({{absl::MakeConstSpan(prompt).last(1), 99, blocks, false}}, *pool,
                            &logits),
             "Forward");
    };
    for (int i = 0; i < 5; ++i) step();  // run, recorded, replayed
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 50; ++i) step();
    ms[graphs] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count() /
                 50;
    MustOk(pool->Release(blocks), "Release");
  }
  g.set_graphs(true);
  det.set_graphs(true);
  notes->push_back(absl::StrFormat(
      "decode step b=1, SmolLM2 shapes, logits to the host: %.3f ms as it comes, %.3f ms as a "
      "CUDA graph (%.2fx)",
      ms[0], ms[1], ms[0] / ms[1]));
}

// Time of the deterministic GEMM over cuBLAS's on the same shapes (K = N = 4096; M = 1, 64,
// 4096): each shape's ratio cuBLAS time / ours, and their geometric mean.
double GemmSpeedRatio(CudaBackend& gpu, CudaBackend& det) {
  const int64_t k = 4096, n = 4096;
  double log_sum = 0;
  int shapes = 0;
  for (int64_t m : {1, 64, 4096}) {
    auto weight = [&](CudaBackend& b) {
      DeviceWeight w;
      w.buffer = Must(b.Allocate(n * k * 2), "Allocate weight");
      w.dtype = DType::kBF16;
      w.rows = n;
      w.cols = k;
      gpu_check::LaunchFillBf16(w.buffer.data(), n * k, 0.02f, 5, Stream(b));
      return w;
    };
    DeviceWeight wg = weight(gpu), wd = weight(det);
    cudaDeviceSynchronize();
    DevMat xg = Put(gpu, Random(m, k, 1), DType::kBF16),
           xd = Put(det, Random(m, k, 1), DType::kBF16);
    DevMat og = Zeros(gpu, m, n, DType::kBF16), od = Zeros(det, m, n, DType::kBF16);
    const double t_cublas = Seconds([&] { gpu.MatMul(xg.m, wg, nullptr, og.m); }, gpu, 20);
    const double t_det = Seconds([&] { det.MatMul(xd.m, wd, nullptr, od.m); }, det, 20);
    const double ratio = t_cublas / t_det;
    std::fprintf(stderr,
                 "gemm m=%lld k=n=4096: cuBLAS %.1f us (%.0f TFLOP/s), deterministic %.1f us "
                 "(%.0f TFLOP/s), ratio %.2f\n",
                 static_cast<long long>(m), t_cublas * 1e6, 2.0 * m * n * k / t_cublas / 1e12,
                 t_det * 1e6, 2.0 * m * n * k / t_det / 1e12, ratio);
    log_sum += std::log(ratio);
    ++shapes;
  }
  return std::exp(log_sum / shapes);
}

// ---- Models ----

struct ModelOnBackend {
  std::unique_ptr<BackendKvAllocator> allocator;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<KvBlockPool> pool;
};

ModelOnBackend Load(const HostWeights& w, Backend* b) {
  ModelOnBackend m;
  m.allocator = std::make_unique<BackendKvAllocator>(b);
  auto model = Transformer::Create(w, b);
  if (!model.ok()) {
    std::fprintf(stderr, "Transformer::Create: %s\n", model.status().ToString().c_str());
    return m;
  }
  m.model = std::move(*model);
  m.pool = Must(KvBlockPool::Create(m.model->KvLayoutFor(16), 64, m.allocator.get(), b),
                "KvBlockPool::Create");
  return m;
}

void CheckModelWeights(const std::string& name, const HostWeights& w, CpuBackend& cpu,
                       CudaBackend& gpu) {
  ModelOnBackend c = Load(w, &cpu), g = Load(w, &gpu);
  if (c.model == nullptr || g.model == nullptr) {
    Record("model " + name, false, INFINITY, 0, "did not load");
    return;
  }
  std::mt19937 rng(3);
  std::vector<TokenId> tokens(200);
  for (TokenId& t : tokens) t = static_cast<TokenId>(rng() % w.config.vocab_size);
  auto bc = Must(c.pool->Allocate(c.pool->layout().BlocksFor(260)), "KV blocks");
  auto bg = Must(g.pool->Allocate(g.pool->layout().BlocksFor(260)), "KV blocks");
  double worst = 0;
  int64_t greedy_checked = 0, greedy_equal = 0;
  bool failed = false;
  int64_t position = 0;
  std::vector<TokenId> step_tokens = tokens;
  for (int step = 0; step < 9 && !failed; ++step) {
    std::vector<float> lc, lg;
    const ForwardSequence sc{step_tokens, position, bc, false};
    const ForwardSequence sg{step_tokens, position, bg, false};
    const absl::Status s1 = c.model->Forward({sc}, *c.pool, &lc);
    const absl::Status s2 = g.model->Forward({sg}, *g.pool, &lg);
    if (!s1.ok() || !s2.ok()) {
      Record("model " + name, false, INFINITY, 0, s2.ok() ? s1.ToString() : s2.ToString());
      return;
    }
    const double e = RelError(lg, lc);
    worst = std::max(worst, std::isnan(e) ? INFINITY : e);
    // Greedy: the CPU's argmax, and whether the GPU's agrees where the margin allows.
    int64_t best = 0, second = -1;
    for (int64_t i = 1; i < static_cast<int64_t>(lc.size()); ++i) {
      if (lc[i] > lc[best]) {
        second = best;
        best = i;
      } else if (second < 0 || lc[i] > lc[second]) {
        second = i;
      }
    }
    const int64_t gpu_best = std::max_element(lg.begin(), lg.end()) - lg.begin();
    double scale = 0;
    for (float x : lc) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    if (lc[best] - lc[second] > 2 * e * scale) {
      ++greedy_checked;
      greedy_equal += gpu_best == best ? 1 : 0;
    }
    position += static_cast<int64_t>(step_tokens.size());
    step_tokens = {static_cast<TokenId>(best)};
  }
  // bf16 activations between kernels (the CPU keeps fp32): about 2^-8 relative per rounding,
  // compounding over layers.
  const double tolerance = 3e-2;
  Record("model " + name + ": logits", worst <= tolerance, worst, tolerance);
  Record("model " + name + ": greedy tokens", greedy_equal == greedy_checked,
         static_cast<double>(greedy_checked - greedy_equal), 0,
         absl::StrCat(greedy_checked, " of 9 steps had a margin to check"));
}

void CheckModel(const std::string& name, const SyntheticVariant& v, CpuBackend& cpu,
                CudaBackend& gpu) {
  CheckModelWeights(name, SyntheticModel(v), cpu, gpu);
}

// Real weights: the GGUF check.sh sliced from SmolLM2-135M-Instruct (its first blocks), in the
// file's block formats (the GPU computes Q8_0 in blocks, the Q4_1 and Q6_K matrices in bf16) and
// converted to bf16.
void CheckGguf(const std::string& path, CpuBackend& cpu, CudaBackend& gpu) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) {
    Record("model " + path, false, INFINITY, 0, file.status().ToString());
    return;
  }
  for (WeightDType dtype : {WeightDType::kNative, WeightDType::kBF16}) {
    absl::StatusOr<HostWeights> w = LoadGgufModel(**file, dtype);
    if (!w.ok()) {
      Record("model " + path, false, INFINITY, 0, w.status().ToString());
      return;
    }
    CheckModelWeights(absl::StrCat("sliced SmolLM2 (", w->config.num_layers, " blocks, ",
                                   WeightDTypeName(dtype), ")"),
                      *w, cpu, gpu);
  }
}

// ---- Speed ----

double Seconds(const std::function<void()>& f, CudaBackend& gpu, int repeat) {
  f();  // warm
  gpu.Synchronize();
  cudaDeviceSynchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeat; ++i) f();
  gpu.Synchronize();
  cudaDeviceSynchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeat;
}

struct Speed {
  double copy_bw = 0;  // bytes moved (read + written) per second
  double attention_bw_ratio = NAN;
  double decode_b1_bw_ratio = NAN;
  double decode_b1_tokens_per_s = NAN;
};

void MeasureSpeed(CudaBackend& gpu, Speed* out, std::vector<std::string>* notes) {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer a = Must(gpu.Allocate(bytes), "Allocate copy buffer");
  DeviceBuffer b = Must(gpu.Allocate(bytes), "Allocate copy buffer");
  gpu.Synchronize();
  cudaMemset(a.data(), 1, bytes);
  cudaDeviceSynchronize();
  const double t =
      Seconds([&] { gpu_check::LaunchCopy(a.data(), b.data(), bytes, Stream(gpu)); }, gpu, 10);
  out->copy_bw = 2.0 * bytes / t;
  a.Reset();
  b.Reset();
  std::fprintf(stderr, "copy kernel: %.0f GB/s (read + write)\n", out->copy_bw / 1e9);

  // Decode attention: 8 rows at 8192 positions, Llama-3-8B's 32 heads over 8 KV heads of 128.
  {
    const int32_t bt = 16, kvh = 8, hd = 128, heads = 32, ctx = 8192, rows = 8;
    const int32_t per_seq = ctx / bt;
    KvHolder kv = MakeKv(gpu, per_seq * rows, bt, kvh, hd, DType::kBF16);
    StepLayout l;
    for (int32_t s = 0; s < rows; ++s) {
      std::vector<int32_t> t(per_seq);
      for (int32_t i = 0; i < per_seq; ++i) t[i] = s * per_seq + i;
      l.block_tables.push_back(t);
      l.positions.push_back(ctx - 1);
      l.row_sequence.push_back(s);
    }
    DevMat q = Put(gpu, Random(rows, heads * hd, 1), DType::kBF16);
    DevMat o = Zeros(gpu, rows, heads * hd, DType::kBF16);
    const double secs = Seconds([&] { gpu.Attention(q.m, kv.view, l, 0.088f, 0, o.m); }, gpu, 20);
    const double kv_bytes = static_cast<double>(rows) * ctx * kvh * hd * 2 * 2;
    out->attention_bw_ratio = (kv_bytes / secs) / (out->copy_bw / 2);
    std::fprintf(stderr, "decode attention: %.0f GB/s of KV read, %.2f of the copy's read rate\n",
                 kv_bytes / secs / 1e9, out->attention_bw_ratio);
  }
  // Llama-3-8B-shaped decode at batch 1: every layer's kernels on device-filled bf16 weights.
  {
    const int64_t h = 4096, f = 14336, heads = 32, kvh = 8, hd = 128, vocab = 128256, layers = 32;
    const int32_t ctx = 512, bt = 16;
    auto weight = [&](int64_t rows, int64_t cols, unsigned seed) {
      DeviceWeight w;
      w.buffer = Must(gpu.Allocate(rows * cols * 2), "Allocate weight");
      w.dtype = DType::kBF16;
      w.rows = rows;
      w.cols = cols;
      gpu_check::LaunchFillBf16(w.buffer.data(), rows * cols, 0.02f, seed, Stream(gpu));
      return w;
    };
    struct Layer {
      DeviceWeight qkv, o, gate_up, down;
    };
    std::vector<Layer> ls;
    double weight_bytes = 0;
    for (int64_t i = 0; i < layers; ++i) {
      ls.push_back({weight((heads + 2 * kvh) * hd, h, 4 * i), weight(h, heads * hd, 4 * i + 1),
                    weight(2 * f, h, 4 * i + 2), weight(h, f, 4 * i + 3)});
      weight_bytes += 2.0 * ((heads + 2 * kvh) * hd * h + h * heads * hd + 2 * f * h + h * f);
    }
    DeviceWeight head = weight(vocab, h, 999);
    weight_bytes += 2.0 * vocab * h;
    cudaDeviceSynchronize();
    DevMat norm = Put(gpu, HostMat{1, h, std::vector<float>(h, 1.0f)});
    DevMat x = Put(gpu, Random(1, h, 2)), hb = Zeros(gpu, 1, h, DType::kBF16);
    DevMat qkv = Zeros(gpu, 1, (heads + 2 * kvh) * hd, DType::kBF16);
    DevMat attn = Zeros(gpu, 1, heads * hd, DType::kBF16);
    DevMat gu = Zeros(gpu, 1, 2 * f, DType::kBF16), logits = Zeros(gpu, 1, vocab);
    HostMat table{ctx + 1, hd, std::vector<float>((ctx + 1) * hd, 0.5f)};
    DevMat rope = Put(gpu, table);
    std::vector<KvHolder> kv;
    for (int64_t i = 0; i < layers; ++i)
      kv.push_back(MakeKv(gpu, ctx / bt + 1, bt, kvh, hd, DType::kBF16));
    StepLayout l;
    l.positions = {ctx - 1};
    l.row_sequence = {0};
    std::vector<int32_t> t(ctx / bt);
    for (int32_t i = 0; i < ctx / bt; ++i) t[i] = i;
    l.block_tables = {t};
    const DeviceMatrix q = qkv.m.ColRange(0, heads * hd), k = qkv.m.ColRange(heads * hd, kvh * hd);
    const DeviceMatrix v = qkv.m.ColRange((heads + kvh) * hd, kvh * hd);
    auto step = [&] {
      gpu.RmsNorm(x.m, norm.m, 1e-5f, hb.m);
      for (int64_t i = 0; i < layers; ++i) {
        gpu.MatMul(hb.m, ls[i].qkv, nullptr, qkv.m);
        gpu.Rope(q, heads, l.positions, RopeTable{rope.m});
        gpu.Rope(k, kvh, l.positions, RopeTable{rope.m});
        gpu.WriteKv(k, v, kv[i].view, l);
        gpu.Attention(q, kv[i].view, l, 0.088f, 0, attn.m);
        gpu.MatMul(attn.m, ls[i].o, nullptr, hb.m);
        gpu.AddRmsNorm(x.m, hb.m, norm.m, 1e-5f, hb.m);
        gpu.MatMul(hb.m, ls[i].gate_up, nullptr, gu.m);
        gpu.SwiGlu(gu.m.ColRange(0, f), gu.m.ColRange(f, f), gu.m.ColRange(0, f));
        gpu.MatMul(gu.m.ColRange(0, f), ls[i].down, nullptr, hb.m);
        gpu.AddRmsNorm(x.m, hb.m, norm.m, 1e-5f, hb.m);
      }
      gpu.MatMul(hb.m, head, nullptr, logits.m);
    };
    const double secs = Seconds(step, gpu, 10);
    out->decode_b1_tokens_per_s = 1.0 / secs;
    out->decode_b1_bw_ratio = (weight_bytes / secs) / (out->copy_bw / 2);
    std::fprintf(stderr,
                 "decode b=1, Llama-3-8B shapes (bf16): %.1f tokens/s, %.0f GB/s of weights, "
                 "%.2f of the copy's read rate\n",
                 1.0 / secs, weight_bytes / secs / 1e9, out->decode_b1_bw_ratio);
  }
}

// The host sampler's cost per row on SmolLM2's vocabulary (49152): sampling other than greedy
// stays on the host, over the logits the forward pass copies back. Milliseconds per row at
// temperature 0.7 with top-p 0.9, and greedy (an argmax) for comparison.
void MeasureHostSampling(double* sampled_ms, double* greedy_ms) {
  const HostMat logits = Random(64, 49152, 77, 3.0f);
  const PromptTokenSet prompt;
  const SamplerState state;
  SamplingParams sampled;
  sampled.temperature = 0.7f;
  sampled.top_p = 0.9f;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto per_row = [&](const SamplingParams& p) {
    int64_t sink = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 4; ++rep) {
      for (int64_t r = 0; r < logits.rows; ++r) {
        sink += Sample(absl::MakeConstSpan(logits.v).subspan(r * 49152, 49152), p, prompt, state,
                       static_cast<uint64_t>(r))
                    .token;
      }
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sink == -1) std::fprintf(stderr, " ");  // keeps the loop
    return s / (4.0 * logits.rows) * 1e3;
  };
  *sampled_ms = per_row(sampled);
  *greedy_ms = per_row(greedy);
  std::fprintf(stderr,
               "host sampler, 49152 logits: %.3f ms/row (temperature 0.7, top-p 0.9), "
               "%.3f ms/row greedy\n",
               *sampled_ms, *greedy_ms);
}

std::string Json(double x) { return std::isfinite(x) ? absl::StrFormat("%.4g", x) : "null"; }

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void PrintJson(const std::string& device, double attention_bw_ratio, double gemm_ratio,
               double decode_b1_bw_ratio, double decode_b1_tokens_per_s, double copy_gb_per_s,
               const std::vector<std::string>& notes) {
  size_t failed = 0, kernel_failed = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok) {
      ++failed;
      if (i < kernel_results) ++kernel_failed;
    }
  }
  std::string note_list;
  for (const std::string& n : notes) note_list += (note_list.empty() ? "" : ", ") + Quote(n);
  std::fflush(stderr);
  std::printf(
      "{\"bench\": \"gpu\", \"device\": %s, \"kernels_checked\": %zu, \"kernels_failed\": %zu, "
      "\"models_checked\": %zu, \"models_failed\": %zu, \"attention_bw_ratio\": %s, "
      "\"deterministic_gemm_vs_cublas\": %s, \"decode_b1_bw_ratio\": %s, "
      "\"decode_b1_tokens_per_s\": %s, \"copy_gb_per_s\": %s, \"notes\": [%s]}\n",
      device.empty() ? "null" : Quote(device).c_str(), kernel_results, kernel_failed,
      results.size() - kernel_results, failed - kernel_failed, Json(attention_bw_ratio).c_str(),
      Json(gemm_ratio).c_str(), Json(decode_b1_bw_ratio).c_str(),
      Json(decode_b1_tokens_per_s).c_str(), Json(copy_gb_per_s).c_str(), note_list.c_str());
  std::fflush(stdout);
}

// After each group of checks: a device fault makes every later GPU result meaningless (copies
// stop, buffers read as zeros), so it is a failure of its own and the run stops there.
void DeviceStillWell(CudaBackend& g, CudaBackend& det, const char* after) {
  for (CudaBackend* b : {&g, &det}) {
    if (!b->status().ok()) Bail(b->status(), after);
  }
}

int Main(int argc, char** argv) {
  // --gguf PATH: also check a model of real weights (check.sh slices one).
  std::string gguf;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--gguf") gguf = argv[i + 1];
  }
  // Two backends on the one GPU, the default and the deterministic one, each under 40% of it.
  size_t free_bytes = 0, total_bytes = 0;
  CudaBackendOptions options;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    options.memory_bytes = total_bytes / 10 * 4;
  }
  absl::StatusOr<std::unique_ptr<CudaBackend>> gpu = CudaBackend::Create(options);
  if (!gpu.ok()) {
    PrintJson("", NAN, NAN, NAN, NAN, NAN, {gpu.status().ToString()});
    return 2;
  }
  CudaBackend& g = **gpu;
  device_name = g.name();
  options.deterministic = true;
  const std::unique_ptr<CudaBackend> det_owner =
      Must(CudaBackend::Create(options), "the deterministic backend");
  CudaBackend& det = *det_owner;
  CpuBackendOptions cpu_options;
  // One thread per core of the machine, not of a container's host.
  cpu_options.threads =
      static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  std::unique_ptr<CpuBackend> cpu = Must(CpuBackend::Create(cpu_options), "CpuBackend");
  std::fprintf(stderr, "device: %s; CPU reference: %s\n", g.name().c_str(), cpu->name().c_str());

  CheckEmbedAndMatMul(*cpu, g);
  DeviceStillWell(g, det, "embedding and MatMul");
  CheckElementwise(*cpu, g);
  DeviceStillWell(g, det, "elementwise kernels");
  CheckAttention(*cpu, g);
  DeviceStillWell(g, det, "attention");
  CheckNccl(g);
  DeviceStillWell(g, det, "NCCL");
  CheckDeterministicGemm(*cpu, det);
  DeviceStillWell(g, det, "the deterministic GEMM");
  kernel_results = results.size();
  CheckDeterministicModel(det);
  DeviceStillWell(g, det, "the deterministic model");
  CheckModel("smollm2-shaped bf16", SmolLm2Shaped("bf16"), *cpu, g);
  SyntheticVariant q8 = SmolLm2Shaped("q8_0");
  q8.all_blocks = WeightQuant::kQ8_0;
  CheckModel("smollm2-shaped q8_0", q8, *cpu, g);
  SyntheticVariant q4k = SmolLm2Shaped("q4_k");
  q4k.hidden = 512;  // Q4_K: rows of whole 256-value super-blocks
  q4k.heads = 8;
  q4k.kv_heads = 2;
  q4k.all_blocks = WeightQuant::kQ4_K;
  CheckModel("512-wide q4_k", q4k, *cpu, g);
  SyntheticVariant swa = SmolLm2Shaped("swa");
  swa.window = 64;
  CheckModel("smollm2-shaped, window 64 on even layers", swa, *cpu, g);
  if (!gguf.empty()) CheckGguf(gguf, *cpu, g);
  DeviceStillWell(g, det, "the models");

  std::vector<std::string> notes;
  CheckGraphs(det, g, &notes);
  DeviceStillWell(g, det, "the graphs");
  Speed speed;
  MeasureSpeed(g, &speed, &notes);
  const double gemm_ratio = GemmSpeedRatio(g, det);
  DeviceStillWell(g, det, "the speed runs");
  double sampled_ms = NAN, greedy_ms = NAN;
  MeasureHostSampling(&sampled_ms, &greedy_ms);
  notes.push_back(
      absl::StrFormat("host sampler per row: %.3f ms (temperature 0.7, top-p 0.9), "
                      "%.3f ms (greedy)",
                      sampled_ms, greedy_ms));
  PrintJson(g.name(), speed.attention_bw_ratio, gemm_ratio, speed.decode_b1_bw_ratio,
            speed.decode_b1_tokens_per_s, speed.copy_bw / 1e9, notes);
  for (const Result& r : results) {
    if (!r.ok) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
