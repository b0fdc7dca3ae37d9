#include "tools/load/workload.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

std::vector<TokenId> Slice(const std::vector<TokenId>& v, size_t from, size_t to) {
  return std::vector<TokenId>(v.begin() + static_cast<std::ptrdiff_t>(from),
                              v.begin() + static_cast<std::ptrdiff_t>(to));
}

TEST(SharedPrefixTest, GroupsShareTheirSystemPromptAndNothingElse) {
  SharedPrefixSpec spec;
  spec.groups = 2;
  spec.prompts_per_group = 3;
  spec.system_tokens = 10;
  spec.question_tokens = 5;
  spec.output_tokens = 7;
  spec.order = "interleaved";
  const Workload w = MakeSharedPrefix(spec);
  EXPECT_EQ(w.kind, "shared_prefix");
  ASSERT_EQ(w.requests.size(), 6u);
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const LoadRequest& r = w.requests[i];
    EXPECT_EQ(r.id, static_cast<int64_t>(i));
    EXPECT_EQ(r.group, static_cast<int64_t>(i % 2));  // interleaved: 0, 1, 0, 1, ...
    EXPECT_EQ(r.session, -1);
    EXPECT_EQ(r.prompt.size(), 15u);
    EXPECT_EQ(r.max_tokens, 7);
    for (TokenId t : r.prompt) {
      EXPECT_GE(t, 1000u);
      EXPECT_LT(t, 21000u);
    }
  }
  // Same group: the first 10 ids equal, the questions differ.
  EXPECT_EQ(Slice(w.requests[0].prompt, 0, 10), Slice(w.requests[2].prompt, 0, 10));
  EXPECT_EQ(Slice(w.requests[0].prompt, 0, 10), Slice(w.requests[4].prompt, 0, 10));
  EXPECT_NE(Slice(w.requests[0].prompt, 10, 15), Slice(w.requests[2].prompt, 10, 15));
  // Other group: another system prompt.
  EXPECT_NE(Slice(w.requests[0].prompt, 0, 10), Slice(w.requests[1].prompt, 0, 10));
}

TEST(SharedPrefixTest, RandomOrderIsAPermutationFixedBySeed) {
  SharedPrefixSpec spec;
  spec.groups = 4;
  spec.prompts_per_group = 8;
  spec.system_tokens = 16;
  spec.question_tokens = 4;
  spec.order = "interleaved";
  const Workload interleaved = MakeSharedPrefix(spec);
  spec.order = "random";
  const Workload a = MakeSharedPrefix(spec), b = MakeSharedPrefix(spec);
  ASSERT_EQ(a.requests.size(), 32u);
  std::multiset<std::vector<TokenId>> want, got;
  std::vector<int64_t> groups_a, groups_b, groups_interleaved;
  for (size_t i = 0; i < 32; ++i) {
    want.insert(interleaved.requests[i].prompt);
    got.insert(a.requests[i].prompt);
    EXPECT_EQ(a.requests[i].id, static_cast<int64_t>(i));
    EXPECT_EQ(a.requests[i].prompt, b.requests[i].prompt);  // deterministic
    groups_a.push_back(a.requests[i].group);
    groups_interleaved.push_back(interleaved.requests[i].group);
  }
  EXPECT_EQ(want, got);
  EXPECT_NE(groups_a, groups_interleaved);
  spec.seed = 2;  // another seed: another order and other ids
  const Workload c = MakeSharedPrefix(spec);
  for (const LoadRequest& r : c.requests) EXPECT_EQ(want.count(r.prompt), 0u);
}

TEST(SessionsTest, EachTurnResendsTheHistoryPlusTheReplyStandInAndNewTokens) {
  SessionSpec spec;
  spec.sessions = 2;
  spec.turns = 3;
  spec.first_tokens = 10;
  spec.turn_tokens = 4;
  spec.output_tokens = 5;
  spec.think_s = 0.25;
  const Workload w = MakeSessions(spec);
  EXPECT_EQ(w.kind, "sessions");
  EXPECT_DOUBLE_EQ(w.think_s, 0.25);
  ASSERT_EQ(w.requests.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const LoadRequest& r = w.requests[i];
    EXPECT_EQ(r.id, static_cast<int64_t>(i));
    EXPECT_EQ(r.session, static_cast<int64_t>(i / 3));
    EXPECT_EQ(r.turn, static_cast<int>(i % 3));
    EXPECT_EQ(r.max_tokens, 5);
    // 10, then + 5 (reply stand-in) + 4 (new) a turn.
    EXPECT_EQ(r.prompt.size(), 10u + 9u * static_cast<size_t>(r.turn));
    if (r.turn > 0) {
      const auto& previous = w.requests[i - 1].prompt;
      EXPECT_EQ(Slice(r.prompt, 0, previous.size()), previous);
    }
  }
  EXPECT_NE(w.requests[0].prompt, w.requests[3].prompt);  // sessions do not share
  // Reply stand-ins differ from turn to turn.
  EXPECT_NE(Slice(w.requests[1].prompt, 10, 15), Slice(w.requests[2].prompt, 19, 24));
}

class TraceTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    const char* dir = std::getenv("TEST_TMPDIR");
    const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/trace.jsonl";
    std::ofstream(path) << text;
    return path;
  }
};

constexpr char kTrace[] =
    R"({"timestamp": 1000, "input_length": 1100, "output_length": 10, "hash_ids": [7, 8, 9]}
{"timestamp": 3000, "input_length": 1024, "output_length": 20, "hash_ids": [7, 8]}

{"timestamp": 4000, "input_length": 600, "output_length": 5, "hash_ids": [7, 11]}
{"timestamp": 5000, "input_length": 5000, "output_length": 100, "hash_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}
)";

TEST_F(TraceTest, EqualHashIdsAreEqualBlocksScaledToBlockTokens) {
  TraceSpec spec;
  spec.path = Write(kTrace);
  spec.time_scale = 0.5;
  spec.block_tokens = 64;
  spec.max_context = 600;
  spec.max_output = 15;
  auto w = LoadTrace(spec);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->kind, "trace");
  // The 4th: 9 x 64 + ceil(392 x 64 / 512) = 576 + 49 = 625 prompt + 15 (capped) > 600: dropped.
  ASSERT_EQ(w->requests.size(), 3u);
  EXPECT_EQ(w->dropped_requests, 1);
  const auto& r = w->requests;
  // 1100 = 512 + 512 + 76: 64 + 64 + ceil(76 x 64 / 512 = 9.5) = 138.
  EXPECT_EQ(r[0].prompt.size(), 138u);
  EXPECT_EQ(r[1].prompt.size(), 128u);
  EXPECT_EQ(r[2].prompt.size(), 64u + 11u);                         // 600 - 512 = 88: ceil(11) = 11
  EXPECT_EQ(Slice(r[0].prompt, 0, 128), r[1].prompt);               // ids 7, 8
  EXPECT_EQ(Slice(r[0].prompt, 0, 64), Slice(r[2].prompt, 0, 64));  // id 7
  EXPECT_NE(Slice(r[0].prompt, 64, 75), Slice(r[2].prompt, 64, 75));  // 8 vs 11
  // Time: (t - 1000 ms) x 0.5.
  EXPECT_DOUBLE_EQ(r[0].arrival_s, 0.0);
  EXPECT_DOUBLE_EQ(r[1].arrival_s, 1.0);
  EXPECT_DOUBLE_EQ(r[2].arrival_s, 1.5);
  EXPECT_EQ(r[0].max_tokens, 10);
  EXPECT_EQ(r[1].max_tokens, 15);  // 20 capped
  EXPECT_EQ(r[2].max_tokens, 5);
  // Cut: what the scaled trace asked for less what is sent: the dropped one's 625 + 100, and 5
  // output tokens of the second.
  EXPECT_EQ(w->cut_tokens, 730);
  EXPECT_NE(w->note.find("1 dropped"), std::string::npos) << w->note;
}

TEST_F(TraceTest, UnscaledBlocksKeepTheTraceLengthsAndLimitReadsTheFirstLines) {
  TraceSpec spec;
  spec.path = Write(kTrace);
  spec.block_tokens = 512;
  spec.max_context = 0;  // no limit
  spec.limit = 2;
  auto w = LoadTrace(spec);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->requests.size(), 2u);
  EXPECT_EQ(w->requests[0].prompt.size(), 1100u);
  EXPECT_EQ(w->requests[1].prompt.size(), 1024u);
  EXPECT_EQ(w->cut_tokens, 0);
  EXPECT_DOUBLE_EQ(w->requests[1].arrival_s, 2.0);
  // Another seed: the same structure on other ids.
  spec.seed = 9;
  auto other = LoadTrace(spec);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->requests[0].prompt, w->requests[0].prompt);
  EXPECT_EQ(Slice(other->requests[0].prompt, 0, 1024), other->requests[1].prompt);
}

TEST_F(TraceTest, BadLinesAndFilesAreErrors) {
  TraceSpec spec;
  spec.path = Write("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1}\nnot json\n");
  auto w = LoadTrace(spec);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("line 2"), std::string::npos) << w.status();
  spec.path = Write("{\"timestamp\": 0, \"input_length\": \"x\", \"output_length\": 1}\n");
  EXPECT_FALSE(LoadTrace(spec).ok());
  spec.path = "/nonexistent/trace.jsonl";
  EXPECT_EQ(LoadTrace(spec).status().code(), absl::StatusCode::kNotFound);
}

TEST(PoissonTest, ArrivalsHaveTheMeanRateAndAreFixedBySeed) {
  SharedPrefixSpec spec;
  spec.groups = 1;
  spec.prompts_per_group = 20000;
  spec.system_tokens = 1;
  spec.question_tokens = 1;
  Workload a = MakeSharedPrefix(spec), b = a;
  SetPoissonArrivals(&a, 50.0, 7);
  SetPoissonArrivals(&b, 50.0, 7);
  const auto& r = a.requests;
  EXPECT_EQ(r[0].arrival_s, 0.0);
  double sum = 0, sum_sq = 0;
  for (size_t i = 1; i < r.size(); ++i) {
    const double gap = r[i].arrival_s - r[i - 1].arrival_s;
    ASSERT_GT(gap, 0.0);
    sum += gap;
    sum_sq += gap * gap;
    ASSERT_EQ(r[i].arrival_s, b.requests[i].arrival_s);
  }
  const double n = static_cast<double>(r.size() - 1);
  const double mean = sum / n, sd = std::sqrt(sum_sq / n - mean * mean);
  // Exponential gaps: mean 1 / 50 = 20 ms and standard deviation equal to the mean (the standard
  // error of either over 20,000 gaps is under 1%).
  EXPECT_NEAR(mean, 0.02, 0.02 * 0.03);
  EXPECT_NEAR(sd / mean, 1.0, 0.05);
  SetPoissonArrivals(&b, 50.0, 8);
  EXPECT_NE(r[10].arrival_s, b.requests[10].arrival_s);
  SetPoissonArrivals(&b, 0, 8);
  EXPECT_EQ(b.requests[10].arrival_s, 0.0);
}

TEST(ConstantArrivalsTest, EvenlySpacedAndTurnsFollowTheirSession) {
  SessionSpec spec;
  spec.sessions = 3;
  spec.turns = 2;
  spec.first_tokens = 4;
  spec.turn_tokens = 2;
  Workload w = MakeSessions(spec);
  SetConstantArrivals(&w, 4.0);
  const std::vector<double> want = {0, 0, 0.25, 0, 0.5, 0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ(w.requests[i].arrival_s, want[i]) << i;
}

TEST(PoissonTest, LaterTurnsFollowTheirSession) {
  SessionSpec spec;
  spec.sessions = 3;
  spec.turns = 2;
  spec.first_tokens = 4;
  spec.turn_tokens = 2;
  Workload w = MakeSessions(spec);
  SetPoissonArrivals(&w, 10.0, 1);
  EXPECT_EQ(w.requests[0].arrival_s, 0.0);
  EXPECT_EQ(w.requests[1].arrival_s, 0.0);  // turn 1 of session 0
  EXPECT_GT(w.requests[2].arrival_s, 0.0);  // session 1 starts later
  EXPECT_EQ(w.requests[3].arrival_s, 0.0);
  EXPECT_GT(w.requests[4].arrival_s, w.requests[2].arrival_s);
}

}  // namespace
}  // namespace ferry
