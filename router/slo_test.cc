// JudgeSlo: which requests count for each objective, and met / missed at the boundaries.

#include "router/slo.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

SloRecord Streamed(double ttft, double decode, int64_t after_first) {
  SloRecord r;
  r.dispatched = true;
  r.first_token = true;
  r.ttft_seconds = ttft;
  r.decode_seconds = decode;
  r.tokens_after_first = after_first;
  return r;
}

TEST(SloTest, TtftAndMeanItlAgainstTheObjectives) {
  SloObjectives o;  // 2 s, 200 ms
  SloJudgement j = JudgeSlo(Streamed(2.0, 2.0, 10), o);
  EXPECT_EQ(j.ttft, SloResult::kMet);  // at the objective: met
  EXPECT_EQ(j.itl, SloResult::kMet);   // 200 ms per token
  j = JudgeSlo(Streamed(2.5, 2.5, 10), o);
  EXPECT_EQ(j.ttft, SloResult::kMissed);
  EXPECT_EQ(j.itl, SloResult::kMissed);  // 250 ms per token
}

TEST(SloTest, WhichRequestsAreJudged) {
  SloObjectives o;
  SloRecord refused;  // bad input, rate limit: never reached the dispatcher
  refused.failed = true;
  EXPECT_EQ(JudgeSlo(refused, o).ttft, SloResult::kNotJudged);
  SloRecord failed;  // no worker, queue full, timed out in the queue
  failed.dispatched = true;
  failed.failed = true;
  EXPECT_EQ(JudgeSlo(failed, o).ttft, SloResult::kMissed);
  EXPECT_EQ(JudgeSlo(failed, o).itl, SloResult::kNotJudged);
  SloRecord left;  // the client left before a token
  left.dispatched = true;
  EXPECT_EQ(JudgeSlo(left, o).ttft, SloResult::kNotJudged);
  // One token: a TTFT, no gap to judge.
  const SloJudgement one = JudgeSlo(Streamed(0.1, 0, 0), o);
  EXPECT_EQ(one.ttft, SloResult::kMet);
  EXPECT_EQ(one.itl, SloResult::kNotJudged);
}

}  // namespace
}  // namespace ferry
