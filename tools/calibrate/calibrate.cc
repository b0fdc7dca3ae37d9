#include "tools/calibrate/calibrate.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/status.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/host_weights.h"
#include "engine/model/model_files.h"
#include "engine/model/transformer.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/worker/worker_options.h"
#include "tools/calibrate/cpu_contention.h"
#include "tools/calibrate/fit.h"
#include "tools/calibrate/link_probe.h"
#include "tools/calibrate/step_probe.h"
#include "tools/calibrate/store_probe.h"

namespace ferry {
namespace {

// The pool's bytes before any step: finite, normal values in bf16 (0x3c3c, about 0.0115) and in
// f32 (0x3c3c3c3c), as KV is; never-written memory would be the zero page, read from the cache.
constexpr int kPoolFillByte = 0x3c;

// /proc/cpuinfo's "model name" ("unknown CPU" without one).
std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown CPU";
}

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100 * fraction); }

std::string Seconds(double s) {
  if (s >= 1) return absl::StrFormat("%.3f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.2f ms", s * 1e3);
  return absl::StrFormat("%.1f us", s * 1e6);
}

std::string Rate(double bytes_per_s) {
  return bytes_per_s > 0 ? absl::StrFormat("%.2f GB/s", bytes_per_s / 1e9) : "instant";
}

struct LoadedModel {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Transformer> model;
  std::string name;  // the file's or directory's
};

// As WorkerEngine builds the real engine's model.
absl::StatusOr<LoadedModel> LoadModel(const CalibrateOptions& options, const std::string& path) {
  ASSIGN_OR_RETURN(const WeightDType dtype, ParseWeightDType(options.weights));
  if (options.kv_dtype != "bf16" && options.kv_dtype != "f32") {
    return absl::InvalidArgumentError("--kv_dtype: bf16 or f32");
  }
  LoadedModel m;
  CpuBackendOptions backend_options;
  backend_options.threads = options.threads;
  ASSIGN_OR_RETURN(m.backend, CpuBackend::Create(backend_options));
  ASSIGN_OR_RETURN(ModelFiles files, ModelFiles::Open(path));
  ASSIGN_OR_RETURN(const HostWeights weights, files.LoadWeights(dtype, options.kv_dtype));
  m.tokenizer = files.TakeTokenizer();
  m.name = files.name();
  ASSIGN_OR_RETURN(m.model, Transformer::Create(weights, m.backend.get()));
  return m;
}

// The report warns that the figures are slower than the machine when other processes took more
// than the cores the engine left idle plus this share of all CPUs during the compute measurement
// (with every core an engine thread: 10% of the machine).
constexpr double kContentionWarning = 0.1;

struct ComputeResult {
  std::vector<ShapeTiming> shapes;
  StepFit fit;
  double seconds = 0;       // the measurement's wall time
  double others_share = 0;  // of the CPUs, taken by other processes meanwhile
};

absl::StatusOr<ComputeResult> MeasureCompute(const CalibrateOptions& options, LoadedModel& loaded,
                                             std::ostream& report) {
  const StepPlan plan = DefaultStepPlan(options.quick);
  const KvBlockLayout layout = loaded.model->KvLayoutFor(options.block_tokens);
  const int64_t blocks = KvBlocksNeeded(plan, options.block_tokens);
  BackendKvAllocator allocator(loaded.backend.get());
  ASSIGN_OR_RETURN(std::unique_ptr<KvBlockPool> pool,
                   KvBlockPool::Create(layout, blocks, &allocator, loaded.backend.get()));
  std::memset(pool->region().address, kPoolFillByte, pool->region().length);
  report << absl::StrFormat(
      "compute: %d prefill, %d decode and %d mixed shapes on %d KV blocks (%.2f GB)\n",
      plan.prefill.size(), plan.decode.size(), plan.mixed.size(), blocks,
      pool->region().length / 1e9);
  report.flush();
  ComputeResult out;
  const auto start = std::chrono::steady_clock::now();
  CpuContention contention;
  ASSIGN_OR_RETURN(out.shapes,
                   MeasureStepShapes(loaded.model.get(), pool.get(), loaded.tokenizer.get(), plan,
                                     [&](const ShapeTiming& t) {
                                       report << absl::StrFormat(
                                           "  %-34s %10s forward, %10s step  (%d steps)\n",
                                           t.shape.Label(), Seconds(t.median_seconds),
                                           Seconds(t.median_step_seconds), t.steps);
                                       report.flush();
                                     }));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.others_share = contention.OthersShare();
  std::vector<StepSample> samples;
  for (const ShapeTiming& t : out.shapes) samples.push_back({t.terms, t.median_seconds});
  ASSIGN_OR_RETURN(out.fit, FitStepCoefficients(samples));
  return out;
}

// The forward's time (measured, fitted, error) and the whole step's beside it: the difference is
// the engine's own work, which the simulated engine runs for real rather than models.
void PrintFitTable(const ComputeResult& c, const SimTiming& timing, std::ostream& report) {
  report << absl::StrFormat("\n%-34s %6s %11s %11s %8s %11s\n", "shape", "steps", "forward",
                            "fitted", "error", "whole step");
  double worst_check = 0;
  for (const ShapeTiming& t : c.shapes) {
    const double fitted = PredictStepSeconds(c.fit.coefficients, t.terms);
    report << absl::StrFormat("%-34s %6d %11s %11s %8s %11s\n", t.shape.Label(), t.steps,
                              Seconds(t.median_seconds), Seconds(fitted),
                              Percent((fitted - t.median_seconds) / t.median_seconds),
                              Seconds(t.median_step_seconds));
    // The simulator's own formula on a real batch agrees with the fit's terms.
    const double mine = PredictStepSeconds(c.fit.coefficients, StepTermsOf(t.first_rows));
    const double sim = timing.StepSeconds(t.first_rows);
    worst_check = std::max(worst_check, std::abs(sim - mine) / std::max(mine, 1e-12));
  }
  report << absl::StrFormat("fit over %d shapes: mean |error| %s, max |error| %s\n",
                            c.shapes.size(), Percent(c.fit.mean_abs_relative_error),
                            Percent(c.fit.max_abs_relative_error));
  if (worst_check > 1e-6) {
    report << absl::StrFormat(
        "WARNING: SimTiming::StepSeconds differs from the fit's terms by up to %s on the measured "
        "batches (engine/model/sim_timing.cc and tools/calibrate/fit.cc disagree on the model)\n",
        Percent(worst_check));
  }
  for (int i = 0; i < kStepCoefficients; ++i) {
    report << absl::StrFormat("  %-20s %.6g\n", kStepCoefficientNames[i], c.fit.coefficients[i]);
  }
}

void PrintMovement(const char* what, const std::vector<MovementSample>& samples,
                   const MovementFit& fit, std::ostream& report) {
  report << absl::StrFormat("\n%s: latency %s, bandwidth %s (fit mean |error| %s)\n", what,
                            Seconds(fit.latency_s), Rate(fit.bytes_per_s),
                            Percent(fit.mean_abs_relative_error));
  for (const MovementSample& s : samples) {
    const double fitted = fit.latency_s + (fit.bytes_per_s > 0 ? s.bytes / fit.bytes_per_s : 0);
    report << absl::StrFormat("  %12.0f bytes %11s  fitted %11s\n", s.bytes, Seconds(s.seconds),
                              Seconds(fitted));
  }
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("--out ", path, ": cannot write it"));
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("--out ", path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimCalibration> RunCalibration(const CalibrateOptions& options,
                                              std::ostream& report) {
  const std::string path = options.model.empty() ? DefaultModelPath() : options.model;
  const std::string date = absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone());
  SimCalibration cal;
  cal.gpus_per_worker = options.gpus_per_worker;
  std::vector<std::string> sources = {absl::StrCat("ferry-calibrate (tools/calibrate) ", date)};

  ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(options, path));
  const KvBlockLayout layout = loaded.model->KvLayoutFor(options.block_tokens);
  cal.kv_bytes_per_token = static_cast<double>(layout.block_bytes()) / layout.block_tokens;
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = loaded.backend->threads();
  cal.name = !options.name.empty()
                 ? options.name
                 : absl::StrFormat("%s (%d CPUs, %d engine thread%s)/%s weights %s, KV %s",
                                   CpuModelName(), cpus, threads, threads == 1 ? "" : "s",
                                   loaded.name, options.weights, options.kv_dtype);
  report << "calibrating " << cal.name << "\n"
         << "backend " << loaded.backend->name() << "; KV " << layout.DebugString() << ": "
         << cal.kv_bytes_per_token << " bytes per token\n";
  sources.push_back(absl::StrFormat(
      "kv_bytes_per_token: the model's KV layout (%d layers x 2 x %d KV heads x %d head_dim x %s)",
      layout.num_layers, layout.num_kv_heads, layout.head_dim, options.kv_dtype));

  if (options.compute) {
    ASSIGN_OR_RETURN(ComputeResult c, MeasureCompute(options, loaded, report));
    SetCoefficients(c.fit.coefficients, &cal);
    PrintFitTable(c, SimTiming(cal), report);
    report << absl::StrFormat(
        "(measured in %.0f s; other processes took %s of the CPUs meanwhile)\n", c.seconds,
        Percent(c.others_share));
    const double idle_share = static_cast<double>(std::max(0, cpus - threads)) / std::max(1, cpus);
    if (c.others_share > idle_share + kContentionWarning) {
      report << "WARNING: other processes computed during the measurement: the step times are "
                "slower than this machine's; calibrate again on a quiet machine\n";
    }
    sources.push_back(absl::StrFormat(
        "compute: fitted (non-negative least squares on relative error) to the median times of "
        "the model's forward pass within the real engine's steps (the simulated engine runs the "
        "rest of a step for real) on %d batch shapes%s (%s), %d compute threads; fit "
        "mean |error| %s, max %s; other processes took %s of the CPUs meanwhile",
        c.shapes.size(), options.quick ? " (--quick)" : "",
        DescribeStepPlan(DefaultStepPlan(options.quick)), threads,
        Percent(c.fit.mean_abs_relative_error), Percent(c.fit.max_abs_relative_error),
        Percent(c.others_share)));
  } else {
    sources.push_back("compute: not measured (--nocompute): every step coefficient is 0");
  }

  if (options.link_bandwidth >= 0 || options.link_latency >= 0) {
    cal.link_bandwidth_bytes_per_s = std::max(0.0, options.link_bandwidth);
    cal.link_latency_s = std::max(0.0, options.link_latency);
    sources.push_back("link: given on the command line (--link_bandwidth, --link_latency)");
  } else if (options.link) {
    LinkProbeOptions lo;
    lo.kind = options.link_kind;
    lo.ucx_tls = options.link_tls;
    lo.block_bytes = layout.block_bytes();
    if (options.quick) lo.repeats = 3;
    ASSIGN_OR_RETURN(LinkTiming link, MeasureLink(lo));
    PrintMovement(absl::StrCat("link (", link.transport, ", loopback)").c_str(), link.samples,
                  link.fit, report);
    cal.link_bandwidth_bytes_per_s = link.fit.bytes_per_s;
    cal.link_latency_s = link.fit.latency_s;
    sources.push_back(absl::StrFormat(
        "link: KV transport %s over loopback in one process, scattered puts of 1..64 KV blocks of "
        "%d bytes and a 4 KiB put, fitted latency + bytes/bandwidth (mean |error| %s)",
        link.transport, layout.block_bytes(), Percent(link.fit.mean_abs_relative_error)));
  } else {
    sources.push_back("link: not measured (--nolink): instant");
  }

  if (options.store_bandwidth >= 0 || options.store_latency >= 0) {
    cal.store_read_bytes_per_s = std::max(0.0, options.store_bandwidth);
    cal.store_latency_s = std::max(0.0, options.store_latency);
    sources.push_back("store: given on the command line (--store_bandwidth, --store_latency)");
  } else if (options.store) {
    StoreProbeOptions so;
    const char* tmp = std::getenv("TMPDIR");
    so.parent_dir = !options.store_dir.empty()       ? options.store_dir
                    : tmp != nullptr && *tmp != '\0' ? tmp
                                                     : "/tmp";
    so.block_bytes = layout.block_bytes();
    if (options.quick) so.repeats = 3;
    ASSIGN_OR_RETURN(StoreTiming store, MeasureStore(so));
    PrintMovement(absl::StrCat("store (", so.parent_dir,
                               store.direct_io ? ", O_DIRECT" : ", page cache: no O_DIRECT", ")")
                      .c_str(),
                  store.samples, store.fit, report);
    cal.store_read_bytes_per_s = store.fit.bytes_per_s;
    cal.store_latency_s = store.fit.latency_s;
    sources.push_back(absl::StrFormat(
        "store: the KV store library on a temporary directory of %s (%s), reads of 1..64 "
        "KV-block objects over %d concurrent Gets, fitted latency + bytes/bandwidth (mean |error| "
        "%s)",
        so.parent_dir, store.direct_io ? "O_DIRECT" : "buffered: the page cache's speed",
        so.streams, Percent(store.fit.mean_abs_relative_error)));
  } else {
    sources.push_back("store: not measured (--nostore): instant");
  }

  cal.source = absl::StrJoin(sources, "; ");
  const std::string json = SimCalibrationJson(cal);
  ASSIGN_OR_RETURN(const SimCalibration back, ParseSimCalibration(json));
  if (SimCalibrationJson(back) != json) {
    return absl::InternalError("the calibration does not read back as it was written");
  }
  if (!options.out.empty()) {
    RETURN_IF_ERROR(WriteFile(options.out, json));
    report << "\nwrote " << options.out << "\n";
  } else {
    report << "\n" << json << "\n";
  }
  return cal;
}

}  // namespace ferry
