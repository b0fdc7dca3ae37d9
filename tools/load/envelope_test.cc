#include "tools/load/envelope.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tools/load/workload.h"

namespace ferry {
namespace {

EnvelopeSpec Sine(double period, double peak, double duration, const std::string& arrivals) {
  EnvelopeSpec e;
  e.shape = "sine";
  e.period_s = period;
  e.ratio = 4;
  e.peak = peak;
  e.duration_s = duration;
  e.arrivals = arrivals;
  e.seed = 7;
  return e;
}

TokenSpace Space() {
  TokenSpace s;
  s.token_base = 1;
  s.token_range = 63;
  return s;
}

// Heads (requests, or sessions' first turns) arriving in [from, to).
int64_t Arrivals(const Workload& w, double from, double to) {
  int64_t n = 0;
  for (const LoadRequest& r : w.requests) {
    if (r.session >= 0 && r.turn > 0) continue;
    n += r.arrival_s >= from && r.arrival_s < to ? 1 : 0;
  }
  return n;
}

TEST(EnvelopeTest, TheSineStartsAtTheTroughAndPeaksAtHalfThePeriod) {
  const EnvelopeSpec e = Sine(100, 8, 0, "poisson");
  EXPECT_DOUBLE_EQ(EnvelopeRate(e, 0), 2);
  EXPECT_DOUBLE_EQ(EnvelopeRate(e, 50), 8);
  EXPECT_NEAR(EnvelopeCount(e, 100), 0.625 * 8 * 100, 1e-9);  // mean over peak: 0.625 at 4:1
  EXPECT_DOUBLE_EQ(e.duration(), 100);
}

// Arrivals per window follow the shape: constant base gaps leave only the rounding (one arrival
// a window), Poisson ones the process's noise.
TEST(EnvelopeTest, ArrivalsPerWindowFollowTheShape) {
  SharedPrefixSpec spec;
  spec.groups = 4;
  spec.prompts_per_group = 8;
  spec.system_tokens = 64;
  spec.question_tokens = 8;
  for (const std::string arrivals : {"constant", "poisson"}) {
    const EnvelopeSpec e = Sine(200, 10, 400, arrivals);
    Workload w = MakeSharedPrefix(spec, Space());
    ASSERT_TRUE(ApplyEnvelope(e, Space(), &w).ok());
    const double expected_total = EnvelopeCount(e, 400);  // 2,500
    EXPECT_NEAR(static_cast<double>(w.requests.size()), expected_total,
                arrivals == "constant" ? 1.5 : 4 * std::sqrt(expected_total));
    double chi2 = 0;
    int windows = 0;
    for (double t = 0; t < 400; t += 20) {
      const double want = EnvelopeCount(e, t + 20) - EnvelopeCount(e, t);
      const double got = static_cast<double>(Arrivals(w, t, t + 20));
      if (arrivals == "constant") {
        EXPECT_NEAR(got, want, 1.5) << "window at " << t;
      } else {
        EXPECT_NEAR(got, want, 5 * std::sqrt(want)) << "window at " << t;
        chi2 += (got - want) * (got - want) / want;
        ++windows;
      }
    }
    if (windows > 0) EXPECT_LT(chi2 / windows, 3.0);  // about 1 for a Poisson process
    // The peak rate is what was asked (10/s; 9.98 over the 10 s around it), the trough a quarter
    // of it (2.5/s; 2.52).
    const double peak = static_cast<double>(Arrivals(w, 95, 105)) / 10;
    const double trough = static_cast<double>(Arrivals(w, 195, 205)) / 10;
    EXPECT_NEAR(peak, 9.98, arrivals == "constant" ? 0.15 : 2.0);
    EXPECT_NEAR(trough, 2.52, arrivals == "constant" ? 0.15 : 1.0);
    // Ids renumbered in arrival order.
    for (size_t i = 0; i < w.requests.size(); ++i) {
      EXPECT_EQ(w.requests[i].id, static_cast<int64_t>(i));
      if (i > 0) EXPECT_GE(w.requests[i].arrival_s, w.requests[i - 1].arrival_s);
    }
  }
}

// Loops share no prefix: the base's groups reappear in every loop (their prompts equal within a
// loop) with ids of their own, and no two loops have a first block in common.
TEST(EnvelopeTest, LoopsShareNoPrefix) {
  SharedPrefixSpec spec;
  spec.groups = 2;
  spec.prompts_per_group = 4;
  spec.system_tokens = 128;
  spec.question_tokens = 8;
  Workload w = MakeSharedPrefix(spec, Space());
  ASSERT_TRUE(ApplyEnvelope(Sine(10, 4, 10, "constant"), Space(), &w).ok());
  ASSERT_GT(w.requests.size(), 3 * 8u);  // 25 requests: four loops at least
  std::set<std::vector<TokenId>> prefixes;
  std::set<int64_t> groups;
  for (const LoadRequest& r : w.requests) {
    const std::vector<TokenId> prefix(r.prompt.begin(), r.prompt.begin() + 64);
    groups.insert(r.group);
    prefixes.insert(prefix);
    for (TokenId t : r.prompt) {
      EXPECT_GE(t, 1);
      EXPECT_LT(t, 64);
    }
  }
  EXPECT_GT(groups.size(), 2 * 3u);           // the base's 2 groups, in 3 loops and more
  EXPECT_EQ(prefixes.size(), groups.size());  // one system prompt a group a loop
  // Within a loop a group's prompts share the system prompt.
  for (size_t i = 0; i + 1 < w.requests.size(); ++i) {
    for (size_t j = i + 1; j < w.requests.size(); ++j) {
      const bool same_group = w.requests[i].group == w.requests[j].group;
      const bool same_prefix =
          std::equal(w.requests[i].prompt.begin(), w.requests[i].prompt.begin() + 128,
                     w.requests[j].prompt.begin());
      EXPECT_EQ(same_group, same_prefix) << i << " " << j;
    }
  }
}

// Sessions: the rate counts sessions; later turns follow their session (arrival 0), sessions get
// ids of their own per loop, and a loop's session resends its own history.
TEST(EnvelopeTest, SessionsAreTheUnitsOfASessionsWorkload) {
  SessionSpec spec;
  spec.sessions = 3;
  spec.turns = 3;
  spec.first_tokens = 64;
  spec.turn_tokens = 16;
  spec.output_tokens = 4;
  spec.think_s = 1;
  Workload w = MakeSessions(spec, Space());
  ASSERT_TRUE(ApplyEnvelope(Sine(20, 2, 20, "constant"), Space(), &w).ok());
  const int64_t sessions = static_cast<int64_t>(EnvelopeCount(Sine(20, 2, 20, "constant"), 20));
  EXPECT_NEAR(static_cast<double>(w.requests.size()) / 3, static_cast<double>(sessions), 1);
  EXPECT_DOUBLE_EQ(w.think_s, 1);
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const LoadRequest& r = w.requests[i];
    EXPECT_EQ(r.session, static_cast<int64_t>(i / 3));
    EXPECT_EQ(r.turn, static_cast<int>(i % 3));
    if (r.turn > 0) {
      EXPECT_EQ(r.arrival_s, 0);
      const LoadRequest& prev = w.requests[i - 1];
      EXPECT_TRUE(std::equal(prev.prompt.begin(), prev.prompt.end(), r.prompt.begin()));
    }
  }
}

// A trace's loops follow each other a mean gap apart and keep its shape (its bursts) scaled to the
// envelope's rate; the bad specs are refused.
TEST(EnvelopeTest, ATraceIsLoopedAndWarped) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/trace.jsonl";
  {
    std::ofstream out(path);
    for (int i = 0; i < 10; ++i) {
      out << "{\"timestamp\": " << i * 1000 << ", \"input_length\": 600, \"output_length\": 4, "
          << "\"hash_ids\": [" << i % 3 << ", " << 100 + i << "]}\n";
    }
  }
  TraceSpec spec;
  spec.path = path;
  auto base = LoadTrace(spec, Space());
  ASSERT_TRUE(base.ok()) << base.status();
  Workload w = *base;
  const EnvelopeSpec e = Sine(100, 1, 100, "poisson");
  ASSERT_TRUE(ApplyEnvelope(e, Space(), &w).ok());
  // The base: 10 requests over 10 s (a mean gap of 1 s between loops): rate 1, warped to 62.5.
  EXPECT_NEAR(static_cast<double>(w.requests.size()), EnvelopeCount(e, 100), 1);
  EXPECT_EQ(w.requests[0].arrival_s, 0);
  // Requests 0 and 3 share their first block (hash id 0) in the same loop, never across loops.
  EXPECT_TRUE(std::equal(w.requests[0].prompt.begin(), w.requests[0].prompt.begin() + 64,
                         w.requests[3].prompt.begin()));
  EXPECT_FALSE(std::equal(w.requests[0].prompt.begin(), w.requests[0].prompt.begin() + 64,
                          w.requests[10].prompt.begin()));
  Workload bad = *base;
  EnvelopeSpec no_peak = e;
  no_peak.peak = 0;
  EXPECT_EQ(ApplyEnvelope(no_peak, Space(), &bad).code(), absl::StatusCode::kInvalidArgument);
  EnvelopeSpec shape = e;
  shape.shape = "square";
  EXPECT_EQ(ApplyEnvelope(shape, Space(), &bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.requests.size(), base->requests.size());
  // Through the options: the open loop only, and not with a rate.
  WorkloadOptions o;
  o.kind = "trace";
  o.trace = spec;
  o.tokens = Space();
  o.envelope = e;
  EXPECT_TRUE(MakeWorkload(o, /*open_loop=*/true).ok());
  EXPECT_EQ(MakeWorkload(o, /*open_loop=*/false).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.rate = 3;
  EXPECT_EQ(MakeWorkload(o, /*open_loop=*/true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
