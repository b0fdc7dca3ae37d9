// The simulated engine (`--engine=sim`) over real processes: a prefill and a decode worker on the
// tiny dense model's tokenizer with a calibration whose link is slow (10 kB of KV a token at
// 2 MB/s: 100 tokens take half a second). The test plays the router (Generate on the decode
// worker, Prefill on the prefill worker with its reservation) and checks, with lower bounds only
// (the machine may be slower, never faster, than the model): the answer streams; the decode
// worker receives the KV; the prefill worker's puts were on the wire at least the modeled
// transfer; both workers' step times are at least the modeled steps; the pool holds
// kv_pool_bytes of the simulated model's KV; a repeated prompt reports its cached tokens and
// pushes only what the decode worker lacks. A sim worker without a calibration refuses to start,
// naming the flag.

#include <csignal>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/sim_timing.h"
#include "gtest/gtest.h"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

constexpr int kPromptTokens = 100;
constexpr int kMaxTokens = 8;

SimCalibration SlowLink() {
  SimCalibration c;
  c.name = "sim_engine_test: a slow link";
  c.source = "tests/integration/sim_engine_test.cc";
  c.kv_bytes_per_token = 10000;
  c.step_overhead_s = 0.001;
  c.prefill_token_s = 0.0005;  // 100 tokens: 50 ms
  c.prefill_attention_s = 1e-7;
  c.decode_step_s = 0.004;
  c.decode_row_s = 0.001;
  c.decode_kv_token_s = 1e-6;
  c.link_bandwidth_bytes_per_s = 2e6;
  c.link_latency_s = 0.005;
  return c;
}

std::string WriteCalibration(const SimCalibration& c) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/sim_calibration.json");
  std::ofstream out(path);
  out << SimCalibrationJson(c);
  return path;
}

std::vector<std::string> Plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

double Metric(const ServiceProcess& p, const std::string& name) {
  return MetricValue(p.admin_port(), name);
}

TEST(SimEngineTest, APrefillDecodePairTakesAtLeastTheModeledTime) {
  const SimTiming timing(SlowLink());
  const std::string calibration = WriteCalibration(SlowLink());
  const std::string model = TinyModel("llama_gqa_bf16");
  const std::vector<std::string> sim = {"--engine=sim", "--sim_calibration=" + calibration,
                                        "--kv_pool_bytes=16MiB", "--transport=grpc"};
  auto p = StartWorker(model, Plus(sim, {"--role=prefill"}));
  auto d = StartWorker(model, Plus(sim, {"--role=decode"}));
  ASSERT_TRUE(p->ready() && d->ready());
  WorkerClient prefill(p->address()), decode(d->address());
  const std::vector<TokenId> prompt = RandomPrompt(kPromptTokens, 5, 200);
  Sampling greedy;
  greedy.ignore_eos = true;
  greedy.max_tokens = kMaxTokens;

  const absl::Time start = absl::Now();
  PdResult got = RunPd(decode, d->address(), prefill, MakeRequest("first", prompt, greedy));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  ASSERT_TRUE(got.prefill.ok()) << got.prefill.error_message() << p->LogTail();
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message() << d->LogTail();
  ASSERT_EQ(got.stream.choices.size(), 1u);
  EXPECT_EQ(got.stream.choices[0].tokens.size(), static_cast<size_t>(kMaxTokens));
  EXPECT_FALSE(got.stream.choices[0].text.empty());
  EXPECT_EQ(got.stream.usage.prompt_tokens(), static_cast<uint32_t>(kPromptTokens));
  EXPECT_EQ(got.stream.usage.cached_tokens(), 0u);
  // The KV went to the decode worker, no faster than the link carries 100 tokens' worth.
  EXPECT_EQ(got.reservation.cached_prefix_blocks(), 0u);
  EXPECT_GT(got.response.bytes_transferred(), 0u);
  const double transfer = timing.TransferSeconds(kPromptTokens);
  EXPECT_GE(transfer, 0.5);
  EXPECT_GE(got.response.wire_us(), transfer * 1e6);
  EXPECT_GE(seconds, timing.StepSeconds({{0, kPromptTokens}}) + transfer);
  EXPECT_EQ(Metric(*d, "ferry_worker_kv_reservations_total{outcome=\"landed\"}"), 1);
  EXPECT_EQ(Metric(*p, "ferry_worker_kv_pushes_total{outcome=\"ok\"}"), 1);
  // Steps: the prompt's on P, the decodes on D (each at least a lone row's step).
  EXPECT_GE(Metric(*p, "ferry_worker_step_seconds_sum{kind=\"prefill\"}"),
            timing.StepSeconds({{0, kPromptTokens}}));
  const double decode_steps = Metric(*d, "ferry_worker_step_seconds_count{kind=\"decode\"}");
  EXPECT_GE(decode_steps, kMaxTokens - 1);
  EXPECT_GE(Metric(*d, "ferry_worker_step_seconds_sum{kind=\"decode\"}"),
            decode_steps * timing.StepSeconds({{0, 1}}));

  // The same prompt again: P reuses its 96 cached tokens, D holds them too (from the first
  // request), so only the last block's 4 tokens go over the link.
  got = RunPd(decode, d->address(), prefill, MakeRequest("again", prompt, greedy));
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message();
  EXPECT_EQ(got.stream.choices[0].tokens.size(), static_cast<size_t>(kMaxTokens));
  EXPECT_EQ(got.stream.usage.cached_tokens(), 96u);
  EXPECT_EQ(got.reservation.cached_prefix_blocks(), 6u);
  EXPECT_GE(got.response.wire_us(), timing.TransferSeconds(kPromptTokens - 96) * 1e6);
  EXPECT_GE(Metric(*p, "ferry_worker_step_seconds_sum{kind=\"prefill\"}"),
            timing.StepSeconds({{0, kPromptTokens}}) + timing.StepSeconds({{96, 4}}));
  EXPECT_EQ(Metric(*d, "ferry_worker_kv_reservations_total{outcome=\"landed\"}"), 2);

  // 16 MiB of 10 kB tokens in blocks of 16: 104 blocks (the gauge follows the Watch ticks).
  EXPECT_EQ(WaitForMetric(d->admin_port(), "ferry_worker_kv_pool_blocks", 104), 104);
  EXPECT_EQ(WaitForMetric(p->admin_port(), "ferry_worker_kv_pool_blocks", 104), 104);

  for (auto* w : {p.get(), d.get()}) {
    w->Signal(SIGTERM);
    EXPECT_EQ(w->WaitForExit(absl::Seconds(30)), 0) << w->LogTail();
  }
}

TEST(SimEngineTest, ASimWorkerWithoutACalibrationSaysWhatItNeeds) {
  ServiceProcess worker(WorkerBinary(), {"--model=" + TinyModel("llama_gqa_bf16"), "--engine=sim"},
                        absl::Seconds(30));
  EXPECT_FALSE(worker.ready());
  EXPECT_NE(worker.WaitForExit(absl::Seconds(30)), 0);
  EXPECT_NE(worker.LogTail().find("--sim_calibration"), std::string::npos) << worker.LogTail();
}

}  // namespace
}  // namespace ferry
