// ./ferry bench planner: what the planner (services/planner) saves, in the discrete-event
// simulator (tools/sim) on the GPU calibration (deploy/sim/h200-llama3-8b.json), over a
// compressed day: a 4:1 sinusoid of arrivals starting at its trough, built (tools/load/envelope.h)
// from two workloads:
//   trace     ../shared/data/traces/synthetic_trace.jsonl (Mooncake format, 512-token hash ids),
//             looped with a salt per loop, its arrivals time-warped to the day's rate
//   sessions  agent sessions: long first prompts shared by every later turn, short outputs, a
//             jittered think time between turns (mean kThinkS), sessions arriving at the day's rate
// Each on prefill/decode pools with prefix-aware routing and the KV store, judged against the SLO
// (TTFT 2 s, TPOT 100 ms: attainment = the fraction of requests within both):
//   (a) static    the smallest static P/D split that meets the SLO at the peak (an attainment
//                 within kMeets of what kMaxPool + kMaxPool workers attain there: on any cluster
//                 some prompts are too long to compute within the TTFT target): a bounded
//                 staircase search over (prefill, decode) on a flat load at the peak rate (each
//                 candidate kSearchS simulated seconds)
//   (b) 1:1       a static split of the same size, half prefill and half decode
//   planner       the planner sizing both pools every kIntervalS (new workers ready kStartupS
//                 after they are asked for; scale-in drains with hand-off, kDrainGraceS), from
//                 the size the trough needs, (a) x trough/peak rounded up
//   ideal         computed: a planner that tracked the envelope continuously with no start-up
//                 and no integer rounding: (a)'s GPUs x rate(t) / peak, so it saves
//                 1 - mean(rate) / peak (0.375 for a whole 4:1 sinusoid)
// GPU-hours are integrated over every worker's life (starting, ready, draining).
// Goals: gpu_hours_saved_min >= 0.75 x ideal_gpu_hours_saved and slo_attainment_delta_max
// (static (a)'s attainment minus the planner's, the worse workload) <= 0.01.
// A table, then one JSON line. --quick: a shorter day, for a smoke run.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tools/load/envelope.h"
#include "tools/sim/sim_run.h"

namespace ferry {
namespace {

// Pinned settings (printed with the results).
constexpr double kPeriodS = 3600;   // one day, compressed 24x
constexpr double kRatio = 4;        // peak over trough
constexpr double kTracePeak = 12;   // requests/s at the peak (~3x the trace's own rate)
constexpr double kSessionPeak = 5;  // sessions/s at the peak
constexpr double kStartupS = 90;    // a new worker's start-up (model load, readiness)
constexpr double kCooldownS = 60;
constexpr double kIntervalS = 10;
constexpr double kDrainGraceS = 30;
constexpr double kSearchS = 240;  // each static candidate's flat load at the peak
constexpr double kMeets = 0.01;  // meets the SLO at the peak: attainment within this of its ceiling
constexpr int kMaxPool = 24;     // the search's bound per pool
// Sessions.
constexpr int64_t kTurns = 6, kFirstTokens = 12288, kTurnTokens = 512, kOutputTokens = 64;
constexpr double kThinkS = 8;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "planner_bench: %s\n", why.c_str());
  std::exit(1);
}

struct Settings {
  SimCalibration calibration;
  std::string trace;
  double period_s = kPeriodS;
  double search_s = kSearchS;
  bool log = false;                         // every planner decision but a steady hold, on stderr
  std::string only;                         // one workload only ("trace" or "sessions")
  int split_prefill = 0, split_decode = 0;  // a given static split instead of the search
  // The planner's options beyond the pinned ones (--planner_KEY=VALUE: target_utilisation,
  // scale_in_window_s, scale_in_tolerance, forecast_window_s, max_scale_in_step), to explore.
  std::map<std::string, double> planner;
};

ClusterOptions Cluster(const Settings& s, int prefill, int decode) {
  ClusterOptions c;
  c.calibration = s.calibration;
  c.policy = "prefix_aware";
  c.store = true;
  c.prefill = prefill;
  c.decode = decode;
  c.drain_grace_s = kDrainGraceS;
  c.slo.ttft = absl::Seconds(2);
  c.slo.itl = absl::Milliseconds(100);
  return c;
}

SimRunOptions Run() {
  SimRunOptions r;
  r.mode = "open";
  r.slo.ttft_s = 2;
  r.slo.tpot_s = 0.1;
  r.startup_s = kStartupS;
  r.max_sim_seconds = 4 * kPeriodS;
  return r;
}

// The base workload of `kind`, in the simulated model's ids.
Workload Base(const Settings& s, const std::string& kind) {
  WorkloadOptions w;
  ClusterOptions c;
  w.tokens.token_base = 1;
  w.tokens.token_range = static_cast<TokenId>(c.worker.vocab_size - 1);
  if (kind == "trace") {
    w.kind = "trace";
    w.trace.path = s.trace;
    w.trace.block_tokens = 512;
    w.trace.max_context = 131072;
  } else {
    w.kind = "sessions";
    w.sessions.sessions = 64;
    w.sessions.turns = kTurns;
    w.sessions.first_tokens = kFirstTokens;
    w.sessions.turn_tokens = kTurnTokens;
    w.sessions.output_tokens = kOutputTokens;
    w.sessions.think_s = kThinkS;
    w.rate = 1;  // replaced by the envelope's times
  }
  auto made = MakeWorkload(w, /*open_loop=*/true);
  if (!made.ok()) Die(std::string(made.status().message()));
  return *std::move(made);
}

// The envelope of the day (flat: the same rate throughout, the peak's).
EnvelopeSpec Envelope(double peak, double duration_s, double period_s, bool flat) {
  EnvelopeSpec e;
  e.shape = "sine";
  e.ratio = flat ? 1 : kRatio;
  e.peak = peak;
  e.period_s = period_s;
  e.duration_s = duration_s;
  return e;
}

Workload Shaped(const Workload& base, const EnvelopeSpec& e) {
  Workload w = base;
  TokenSpace space;
  ClusterOptions c;
  space.token_base = 1;
  space.token_range = static_cast<TokenId>(c.worker.vocab_size - 1);
  const absl::Status applied = ApplyEnvelope(e, space, &w);
  if (!applied.ok()) Die(applied.ToString());
  return w;
}

double Attainment(const SimRunResult& r) {
  return r.summary.requests > 0
             ? static_cast<double>(r.summary.within_slo) / static_cast<double>(r.summary.requests)
             : 0;
}

SimRunResult Simulate(const ClusterOptions& c, const Workload& w, const SimRunOptions& o) {
  auto r = RunSimulation(c, w, o);
  if (!r.ok()) Die(r.status().ToString());
  return *std::move(r);
}

struct Split {
  int prefill = 0, decode = 0;
  double attainment = 0;
  int total() const { return prefill + decode; }
};

// The smallest (prefill + decode) that meets the SLO at the flat peak: an attainment within
// kMeets of the attainment's ceiling there (kMaxPool + kMaxPool workers: some requests miss the
// TTFT target on any cluster, e.g. a prompt too long to compute within it). Attainment grows with
// either pool, so the frontier is a staircase: the fewest prefill workers that meet with the most
// decode workers (a binary search), the fewest decode workers for them (another), then one more
// prefill worker at a time, each with the fewest decode workers that still meet, never more than
// the previous count's, while a smaller total is possible. Each probe is one simulation.
Split SearchStatic(const Settings& s, const Workload& peak, int* probes, double* ceiling) {
  std::map<std::pair<int, int>, double> seen;
  auto attainment = [&](int p, int d) {
    auto it = seen.find({p, d});
    if (it == seen.end()) {
      SimRunResult r = Simulate(Cluster(s, p, d), peak, Run());
      it = seen.emplace(std::make_pair(p, d), Attainment(r)).first;
      ++*probes;
      std::fprintf(stderr, "  search %dP+%dD: attainment %.3f\n", p, d, it->second);
    }
    return it->second;
  };
  *ceiling = attainment(kMaxPool, kMaxPool);
  auto meets = [&](int p, int d) { return attainment(p, d) >= *ceiling - kMeets; };
  // The fewest n in [1, kMaxPool] for which ok(n) holds (ok(kMaxPool) does).
  auto fewest = [](int lo, int hi, const std::function<bool(int)>& ok) {
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (ok(mid)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  };
  const int p_min = fewest(1, kMaxPool, [&](int p) { return meets(p, kMaxPool); });
  int d = fewest(1, kMaxPool, [&](int d) { return meets(p_min, d); });
  Split best{p_min, d, seen[{p_min, d}]};
  for (int p = p_min + 1; p + 1 < best.total() && p <= kMaxPool; ++p) {
    while (d > 1 && meets(p, d - 1)) --d;
    if (p + d < best.total()) best = {p, d, seen[{p, d}]};
  }
  return best;
}

struct Outcome {
  std::string name;
  SimRunResult result;
  double gpu_hours() const { return result.gpu_seconds / 3600; }
};

struct WorkloadResult {
  std::string workload;
  Split a;
  int probes = 0;
  double ceiling = 0;  // the attainment at the peak with kMaxPool + kMaxPool workers
  Outcome static_a, one_to_one, planned;
  double ideal_saved = 0;
  double saved() const { return 1 - planned.gpu_hours() / static_a.gpu_hours(); }
  double delta() const { return Attainment(static_a.result) - Attainment(planned.result); }
};

// The ideal's saving over the simulated day: 1 - mean(rate) / peak of the envelope run.
double IdealSaved(const EnvelopeSpec& e) {
  return 1 - EnvelopeCount(e, e.duration()) / e.duration() / e.peak;
}

WorkloadResult Evaluate(const Settings& s, const std::string& kind, double peak_rate) {
  WorkloadResult out;
  out.workload = kind;
  const Workload base = Base(s, kind);
  // The flat peak covers at least one whole loop of the base (a trace's load is not even over
  // its length: the bundled one's prompt tokens per minute double from its start to its end).
  size_t units = 0;
  for (const LoadRequest& r : base.requests) units += r.turn == 0 ? 1 : 0;
  const double search_s = std::max(s.search_s, static_cast<double>(units) / peak_rate);
  const Workload flat = Shaped(base, Envelope(peak_rate, search_s, s.period_s, true));
  std::fprintf(stderr, "%s: searching the smallest static split at the peak (%.2f/s)\n",
               kind.c_str(), peak_rate);
  if (s.split_prefill > 0) {
    out.a = {s.split_prefill, s.split_decode, 0};
  } else {
    out.a = SearchStatic(s, flat, &out.probes, &out.ceiling);
  }
  const EnvelopeSpec envelope = Envelope(peak_rate, s.period_s, s.period_s, false);
  const Workload day = Shaped(base, envelope);
  std::fprintf(stderr, "%s: the day (%zu requests): static %dP+%dD\n", kind.c_str(),
               day.requests.size(), out.a.prefill, out.a.decode);
  out.static_a = {"static", Simulate(Cluster(s, out.a.prefill, out.a.decode), day, Run())};
  const int half = out.a.total() / 2;
  out.one_to_one = {"1:1", Simulate(Cluster(s, out.a.total() - half, half), day, Run())};
  // The planner starts at what the trough needs by (a)'s measure.
  const int p0 = std::max(1, static_cast<int>(std::ceil(out.a.prefill / kRatio)));
  const int d0 = std::max(1, static_cast<int>(std::ceil(out.a.decode / kRatio)));
  SimRunOptions run = Run();
  PlannerOptions planner;
  planner.ttft_target_s = 2;
  planner.itl_target_s = 0.1;
  planner.interval_s = kIntervalS;
  planner.startup_s = kStartupS;
  planner.cooldown_s = kCooldownS;
  for (PoolLimits& l : planner.limits) {
    l.min_replicas = 1;
    l.max_replicas = kMaxPool;
  }
  for (const auto& [key, value] : s.planner) {
    if (key == "target_utilisation") {
      planner.target_utilisation = value;
    } else if (key == "scale_in_window_s") {
      planner.scale_in_window_s = value;
    } else if (key == "scale_in_tolerance") {
      planner.scale_in_tolerance = value;
    } else if (key == "forecast_window_s") {
      planner.forecast_window_s = value;
    } else if (key == "max_scale_in_step") {
      planner.max_scale_in_step = value;
    } else {
      Die("unknown --planner_" + key);
    }
  }
  if (const absl::Status valid = planner.Validate(); !valid.ok()) Die(valid.ToString());
  run.planner = planner;
  if (s.log) {
    run.on_plan = [](const Plan& plan) {
      for (const PoolDecision& d : plan.pools) {
        if (d.action != PlanAction::kHold || d.reason != "steady") {
          std::fprintf(stderr, "  %7.0f s %s\n", plan.time_s, d.detail.c_str());
        }
      }
    };
  }
  std::fprintf(stderr, "%s: the day with the planner from %dP+%dD\n", kind.c_str(), p0, d0);
  out.planned = {"planner", Simulate(Cluster(s, p0, d0), day, run)};
  out.ideal_saved = IdealSaved(envelope);
  if (s.log) {
    // Attainment per two minutes of arrivals, static against planner, and the planner's pools.
    const double bucket = 120;
    const int n = static_cast<int>(std::ceil(s.period_s / bucket));
    std::vector<std::array<int, 4>> b(n, {0, 0, 0, 0});
    auto add = [&](const SimRunResult& r, int which) {
      for (const RequestRecord& rec : r.records) {
        const int i = std::min(n - 1, static_cast<int>(rec.start_s / bucket));
        b[i][which * 2] += 1;
        b[i][which * 2 + 1] += WithinSlo(rec, Run().slo) ? 1 : 0;
      }
    };
    add(out.static_a.result, 0);
    add(out.planned.result, 1);
    for (int i = 0; i < n; ++i) {
      int prefill = 0, decode = 0;
      for (const TimelinePoint& t : out.planned.result.timeline) {
        if (t.time_s < (i + 0.5) * bucket) {
          prefill = t.pools[0].ready;
          decode = t.pools[1].ready;
        }
      }
      std::fprintf(stderr, "  %5.0f s: %5d requests, static %.3f, planner %.3f (%dP+%dD ready)\n",
                   i * bucket, b[i][0], b[i][0] ? 1.0 * b[i][1] / b[i][0] : 0.0,
                   b[i][2] ? 1.0 * b[i][3] / b[i][2] : 0.0, prefill, decode);
    }
  }
  return out;
}

void PrintRow(const Outcome& o, const Outcome& base) {
  const RunSummary& m = o.result.summary;
  std::printf("  %-8s %8.2f %7.1f%% %9.3f %8.3f %8.3f %7lld %6lld\n", o.name.c_str(), o.gpu_hours(),
              100 * (1 - o.gpu_hours() / base.gpu_hours()), Attainment(o.result), m.ttft_s.p90,
              m.tpot_s.mean, static_cast<long long>(m.failed), static_cast<long long>(m.requests));
}

int Main(int argc, char** argv) {
  if (argc < 3)
    Die("usage: planner_bench CALIBRATION TRACE [--quick] [--log] [--only=W] [--split=P,D]");
  Settings s;
  auto cal = LoadSimCalibration(argv[1]);
  if (!cal.ok()) Die(cal.status().ToString());
  s.calibration = *cal;
  s.trace = argv[2];
  bool quick = false;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--log") {
      s.log = true;
    } else if (a.rfind("--planner_", 0) == 0 && a.find('=') != std::string::npos) {
      s.planner[a.substr(10, a.find('=') - 10)] = std::atof(a.c_str() + a.find('=') + 1);
    } else if (a.rfind("--only=", 0) == 0) {
      s.only = a.substr(7);
    } else if (a.rfind("--split=", 0) == 0 &&
               std::sscanf(a.c_str() + 8, "%d,%d", &s.split_prefill, &s.split_decode) == 2 &&
               s.split_prefill > 0 && s.split_decode > 0) {
    } else {
      Die("unknown flag " + a + " (--quick, --log, --only=WORKLOAD, --split=P,D)");
    }
  }
  if (quick) {
    s.period_s = 600;
    s.search_s = 120;
  }
  const auto start = std::chrono::steady_clock::now();
  std::printf(
      "planner bench: H200 calibration, prefix_aware + store, SLO TTFT 2 s / TPOT 100 ms; a %.0f s "
      "day, 4:1 sine from its trough; start-up %.0f s, cooldown %.0f s, interval %.0f s, drain "
      "grace %.0f s; the static split meets %.2f at the peak (%.0f s flat)\n",
      s.period_s, kStartupS, kCooldownS, kIntervalS, kDrainGraceS, kMeets, s.search_s);
  std::vector<WorkloadResult> results;
  if (s.only.empty() || s.only == "trace") results.push_back(Evaluate(s, "trace", kTracePeak));
  if (s.only.empty() || s.only == "sessions") {
    results.push_back(Evaluate(s, "sessions", kSessionPeak));
  }
  nlohmann::json j;
  j["bench"] = "planner";
  double saved_min = 1, delta_max = -1, ideal = 1;
  int64_t events = 0, blocked = 0;
  for (const WorkloadResult& w : results) {
    std::printf(
        "\n%s (peak %.2f/s): static split %dP+%dD found in %d probes (attainment at the peak %.3f, "
        "ceiling %.3f)\n",
        w.workload.c_str(), w.workload == "trace" ? kTracePeak : kSessionPeak, w.a.prefill,
        w.a.decode, w.probes, w.a.attainment, w.ceiling);
    std::printf("  %-8s %8s %8s %9s %8s %8s %7s %6s\n", "set-up", "GPU-h", "saved", "within",
                "p90TTFT", "TPOT", "failed", "reqs");
    PrintRow(w.static_a, w.static_a);
    PrintRow(w.one_to_one, w.static_a);
    PrintRow(w.planned, w.static_a);
    const PlannerCounts& c = w.planned.result.planner;
    std::printf(
        "  planner: %lld scale-outs, %lld scale-ins, %lld scale-ins blocked above 0.8; "
        "ideal saving %.3f\n",
        static_cast<long long>(c.scale_out), static_cast<long long>(c.scale_in),
        static_cast<long long>(c.scale_in_blocked_by_utilisation), w.ideal_saved);
    const std::string k = w.workload;
    j["gpu_hours_saved_" + k] = w.saved();
    j["slo_attainment_delta_" + k] = w.delta();
    j["slo_attainment_" + k] = {{"static", Attainment(w.static_a.result)},
                                {"one_to_one", Attainment(w.one_to_one.result)},
                                {"planner", Attainment(w.planned.result)}};
    j["gpu_hours_" + k] = {{"static", w.static_a.gpu_hours()},
                           {"one_to_one", w.one_to_one.gpu_hours()},
                           {"planner", w.planned.gpu_hours()}};
    j["static_split_" + k] = absl::StrCat(w.a.prefill, "P+", w.a.decode, "D");
    j["peak_attainment_" + k] = {{"static", w.a.attainment}, {"ceiling", w.ceiling}};
    j["slo_attainment_delta_one_to_one_" + k] =
        Attainment(w.one_to_one.result) - Attainment(w.planned.result);
    j["failed_" + k] = {{"static", w.static_a.result.summary.failed},
                        {"one_to_one", w.one_to_one.result.summary.failed},
                        {"planner", w.planned.result.summary.failed}};
    saved_min = std::min(saved_min, w.saved());
    delta_max = std::max(delta_max, w.delta());
    ideal = std::min(ideal, w.ideal_saved);
    events += c.scale_out + c.scale_in;
    blocked += c.scale_in_blocked_by_utilisation;
  }
  j["gpu_hours_saved_min"] = saved_min;
  j["ideal_gpu_hours_saved"] = ideal;
  j["slo_attainment_delta_max"] = delta_max;
  j["scale_events"] = events;
  j["scale_in_blocked_by_utilisation"] = blocked;
  j["goal_gpu_hours_saved"] = saved_min >= 0.75 * ideal;
  j["goal_slo_attainment_delta"] = delta_max <= 0.01;
  j["settings"] = {{"period_s", s.period_s},       {"ratio", kRatio},
                   {"trace_peak_rps", kTracePeak}, {"sessions_peak_per_s", kSessionPeak},
                   {"startup_s", kStartupS},       {"cooldown_s", kCooldownS},
                   {"interval_s", kIntervalS},     {"drain_grace_s", kDrainGraceS},
                   {"static_meets", kMeets},       {"search_s", s.search_s}};
  j["wall_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "\ngoals: gpu_hours_saved_min %.3f >= 0.75 x ideal %.3f = %.3f: %s; "
      "slo_attainment_delta_max %.4f <= 0.01: %s\n",
      saved_min, ideal, 0.75 * ideal, saved_min >= 0.75 * ideal ? "met" : "MISSED", delta_max,
      delta_max <= 0.01 ? "met" : "MISSED");
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
