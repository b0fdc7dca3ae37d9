// The simulated engine's timing model against values computed by hand from sim_timing.h's
// formulas, and its calibration files: read back exactly, refused naming the bad key.

#include "engine/model/sim_timing.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr double kTolerance = 1e-12;

SimCalibration Calibration() {
  SimCalibration c;
  c.name = "test";
  c.kv_bytes_per_token = 1000;
  c.step_overhead_s = 0.001;
  c.prefill_token_s = 0.0001;
  c.prefill_attention_s = 1e-7;
  c.decode_step_s = 0.002;
  c.decode_row_s = 0.0003;
  c.decode_kv_token_s = 1e-6;
  c.link_bandwidth_bytes_per_s = 1e6;
  c.link_latency_s = 0.01;
  c.store_read_bytes_per_s = 2e6;
  c.store_latency_s = 0.005;
  return c;
}

TEST(SimTimingTest, PrefillRowsPayTheirTokensAndAttentionPairs) {
  const SimTiming timing(Calibration());
  // 10 new tokens after 32: pairs = 10 x 32 + 10 x 11 / 2 = 375.
  // 0.001 + 0.0001 x 10 + 1e-7 x 375 = 0.0020375.
  EXPECT_NEAR(timing.StepSeconds({{32, 10}}), 0.0020375, kTolerance);
  // From position 0: pairs = 4 x 5 / 2 = 10: 0.001 + 0.0004 + 1e-6.
  EXPECT_NEAR(timing.StepSeconds({{0, 4}}), 0.001401, kTolerance);
  // Two prefill rows add up; the overhead is paid once.
  EXPECT_NEAR(timing.StepSeconds({{32, 10}, {0, 4}}), 0.0020375 + 0.000401, kTolerance);
  // No decode cost without a decoding row.
  SimCalibration no_decode = Calibration();
  no_decode.decode_step_s = 5;
  EXPECT_NEAR(SimTiming(no_decode).StepSeconds({{32, 10}}), 0.0020375, kTolerance);
}

TEST(SimTimingTest, DecodeRowsPayTheStepTheRowsAndTheKvTheyRead) {
  const SimTiming timing(Calibration());
  // Rows at 99 and 9 read 100 + 10 KV tokens:
  // 0.001 + 0.002 + 0.0003 x 2 + 1e-6 x 110 = 0.00371.
  EXPECT_NEAR(timing.StepSeconds({{99, 1}, {9, 1}}), 0.00371, kTolerance);
  // One row at position 0 reads its own.
  EXPECT_NEAR(timing.StepSeconds({{0, 1}}), 0.001 + 0.002 + 0.0003 + 1e-6, kTolerance);
}

TEST(SimTimingTest, MixedStepsAddBothAndTheSpeedFactorScalesCompute) {
  const SimTiming timing(Calibration());
  const std::vector<SimRow> mixed = {{99, 1}, {32, 10}, {9, 1}};
  // 0.001 + (0.001 + 0.0000375) + (0.002 + 0.0006 + 0.00011) = 0.0047475.
  EXPECT_NEAR(timing.StepSeconds(mixed), 0.0047475, kTolerance);
  // A GPU half as fast takes twice as long; one twice as fast half.
  EXPECT_NEAR(SimTiming(Calibration(), 0.5).StepSeconds(mixed), 0.009495, kTolerance);
  EXPECT_NEAR(SimTiming(Calibration(), 2).StepSeconds(mixed), 0.00237375, kTolerance);
  EXPECT_EQ(SimTiming(Calibration(), 0.5).speed(), 0.5);
  // Rows with no tokens count for nothing.
  EXPECT_NEAR(timing.StepSeconds({{5, 0}}), 0.001, kTolerance);
}

TEST(SimTimingTest, TransfersShareTheLinkAndIgnoreTheSpeedFactor) {
  const SimTiming timing(Calibration());
  // 100 tokens = 100 kB at 1 MB/s: 0.1 s, plus 0.01 s latency.
  EXPECT_NEAR(timing.TransferSeconds(100), 0.11, kTolerance);
  EXPECT_NEAR(timing.TransferSeconds(100, 1), 0.11, kTolerance);
  // Four transfers on the link: each gets a quarter of the bandwidth; latency once.
  EXPECT_NEAR(timing.TransferSeconds(100, 4), 0.41, kTolerance);
  EXPECT_NEAR(timing.TransferSeconds(100, 0), 0.11, kTolerance);  // sharing below 1: alone
  EXPECT_NEAR(SimTiming(Calibration(), 0.25).TransferSeconds(100, 4), 0.41, kTolerance);
  EXPECT_EQ(timing.TransferSeconds(0), 0);
  // Bandwidth 0: the bytes cost nothing; the latency stays.
  SimCalibration instant = Calibration();
  instant.link_bandwidth_bytes_per_s = 0;
  EXPECT_NEAR(SimTiming(instant).TransferSeconds(100000, 8), 0.01, kTolerance);
}

TEST(SimTimingTest, StoreReadsAndKvSizes) {
  const SimTiming timing(Calibration());
  // 100 kB at 2 MB/s: 0.05 s, plus 0.005 s.
  EXPECT_NEAR(timing.StoreReadSeconds(100), 0.055, kTolerance);
  EXPECT_NEAR(SimTiming(Calibration(), 0.5).StoreReadSeconds(100), 0.055, kTolerance);
  EXPECT_EQ(timing.StoreReadSeconds(0), 0);
  SimCalibration instant = Calibration();
  instant.store_read_bytes_per_s = 0;
  EXPECT_NEAR(SimTiming(instant).StoreReadSeconds(100), 0.005, kTolerance);
  EXPECT_EQ(timing.KvBytes(100), 100000);
  // 1 MiB of 1000-byte tokens: 1048 whole tokens.
  EXPECT_EQ(timing.KvTokens(int64_t{1} << 20), 1048);
  EXPECT_EQ(timing.KvTokens(999), 0);
  EXPECT_EQ(timing.KvTokens(1000), 1);
  EXPECT_EQ(timing.KvTokens(-5), 0);
  // SmolLM2-135M in bf16: 2 x 30 layers x 3 KV heads x 64 x 2 bytes = 23040 bytes a token.
  SimCalibration smol = Calibration();
  smol.kv_bytes_per_token = 23040;
  EXPECT_EQ(SimTiming(smol).KvTokens(int64_t{1} << 30), 46603);
}

TEST(SimCalibrationTest, JsonReadsBackExactly) {
  SimCalibration c = Calibration();
  c.name = "cpu-2core/SmolLM2-135M \"bf16\"";
  c.source = "a fit; see tools/calibrate";
  c.gpus_per_worker = 8;
  c.prefill_token_s = 1.0 / 3;
  c.prefill_attention_s = 2.5e-9 / 7;
  c.decode_kv_token_s = 0.1 + 0.2;
  c.link_bandwidth_bytes_per_s = 123456789.123456789;
  c.store_latency_s = 5e-324;  // the smallest subnormal
  const std::string text = SimCalibrationJson(c);
  absl::StatusOr<SimCalibration> back = ParseSimCalibration(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(back->name, c.name);
  EXPECT_EQ(back->source, c.source);
  EXPECT_EQ(back->gpus_per_worker, c.gpus_per_worker);
  EXPECT_EQ(back->kv_bytes_per_token, c.kv_bytes_per_token);
  EXPECT_EQ(back->step_overhead_s, c.step_overhead_s);
  EXPECT_EQ(back->prefill_token_s, c.prefill_token_s);
  EXPECT_EQ(back->prefill_attention_s, c.prefill_attention_s);
  EXPECT_EQ(back->decode_step_s, c.decode_step_s);
  EXPECT_EQ(back->decode_row_s, c.decode_row_s);
  EXPECT_EQ(back->decode_kv_token_s, c.decode_kv_token_s);
  EXPECT_EQ(back->link_bandwidth_bytes_per_s, c.link_bandwidth_bytes_per_s);
  EXPECT_EQ(back->link_latency_s, c.link_latency_s);
  EXPECT_EQ(back->store_read_bytes_per_s, c.store_read_bytes_per_s);
  EXPECT_EQ(back->store_latency_s, c.store_latency_s);
  EXPECT_EQ(SimCalibrationJson(*back), text);
  // Every field is written, in the struct's order.
  EXPECT_LT(text.find("\"name\""), text.find("\"kv_bytes_per_token\""));
  EXPECT_LT(text.find("\"kv_bytes_per_token\""), text.find("\"store_latency_s\""));
}

TEST(SimCalibrationTest, AbsentFieldsAreZeroButKvBytesPerTokenIsRequired) {
  absl::StatusOr<SimCalibration> c =
      ParseSimCalibration(R"({"kv_bytes_per_token": 512, "decode_step_s": 0.01})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_bytes_per_token, 512);
  EXPECT_EQ(c->decode_step_s, 0.01);
  EXPECT_EQ(c->prefill_token_s, 0);
  EXPECT_EQ(c->gpus_per_worker, 1);
  // Comments are allowed, as in the other config files.
  EXPECT_TRUE(ParseSimCalibration("// measured\n{\"kv_bytes_per_token\": 1}").ok());
  for (const char* text : {R"({"decode_step_s": 0.01})", R"({"kv_bytes_per_token": 0})"}) {
    absl::StatusOr<SimCalibration> bad = ParseSimCalibration(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("kv_bytes_per_token"), std::string::npos) << bad.status();
  }
}

TEST(SimCalibrationTest, BadFilesAreRefusedNamingTheKey) {
  struct Case {
    std::string text, key;
  };
  const Case cases[] = {
      {R"({"kv_bytes_per_token": 1, "prefill_token_seconds": 0.1})", "prefill_token_seconds"},
      {R"({"kv_bytes_per_token": 1, "decode_step_s": "0.01"})", "decode_step_s"},
      {R"({"kv_bytes_per_token": 1, "decode_row_s": null})", "decode_row_s"},
      {R"({"kv_bytes_per_token": 1, "link_latency_s": -0.001})", "link_latency_s"},
      {R"({"kv_bytes_per_token": -1})", "kv_bytes_per_token"},
      {R"({"kv_bytes_per_token": 1, "store_read_bytes_per_s": -1e9})", "store_read_bytes_per_s"},
      {R"({"kv_bytes_per_token": 1, "gpus_per_worker": 1.5})", "gpus_per_worker"},
      {R"({"kv_bytes_per_token": 1, "gpus_per_worker": 0})", "gpus_per_worker"},
      {R"({"kv_bytes_per_token": 1, "name": 7})", "name"},
      {R"({"kv_bytes_per_token": 1, "source": ["a"]})", "source"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SimCalibration> got = ParseSimCalibration(c.text);
    ASSERT_FALSE(got.ok()) << c.text;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(got.status().message().find("\"" + c.key + "\""), std::string::npos) << got.status();
  }
  EXPECT_FALSE(ParseSimCalibration("{").ok());
  EXPECT_FALSE(ParseSimCalibration("[1, 2]").ok());
  EXPECT_FALSE(ParseSimCalibration("").ok());
}

TEST(SimCalibrationTest, LoadsFilesAndNamesThePathOnErrors) {
  const std::string dir =
      std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string path = dir + "/sim_timing_test.json";
  {
    std::ofstream out(path);
    out << SimCalibrationJson(Calibration());
  }
  absl::StatusOr<SimCalibration> loaded = LoadSimCalibration(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->link_latency_s, 0.01);
  {
    std::ofstream out(path);
    out << R"({"kv_bytes_per_token": 1, "typo_s": 1})";
  }
  loaded = LoadSimCalibration(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find(path), std::string::npos) << loaded.status();
  EXPECT_NE(loaded.status().message().find("typo_s"), std::string::npos) << loaded.status();
  std::remove(path.c_str());
  EXPECT_EQ(LoadSimCalibration(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ferry
