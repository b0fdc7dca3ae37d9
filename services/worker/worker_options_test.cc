// Worker options: a config file's keys (sizes, durations), unknown keys refused, validation, and
// the default model path's order of precedence.

#include "services/worker/worker_options.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(WorkerOptionsTest, AConfigFileSetsWhatItNames) {
  auto config = Config::Parse(R"({
    // comments are allowed
    "engine": "null", "kv_pool_bytes": "64MiB", "block_tokens": 16, "max_running": 8,
    "watch_interval": "50ms", "drain_grace": "2s", "null_token_seconds": 0.02
  })",
                              "worker.json");
  ASSERT_TRUE(config.ok()) << config.status();
  WorkerOptions o;
  ASSERT_TRUE(ApplyWorkerConfig(*config, &o).ok());
  EXPECT_EQ(o.engine, "null");
  EXPECT_EQ(o.kv_pool_bytes, 64 << 20);
  EXPECT_EQ(o.block_tokens, 16);
  EXPECT_EQ(o.max_running, 8);
  EXPECT_EQ(o.watch_interval, absl::Milliseconds(50));
  EXPECT_EQ(o.drain_grace, absl::Seconds(2));
  EXPECT_EQ(o.null_token_seconds, 0.02);
  EXPECT_EQ(o.max_batch_tokens, 512);  // untouched
  EXPECT_TRUE(ValidateWorkerOptions(o).ok());

  auto typo = Config::Parse(R"({"max_runing": 8})", "worker.json");
  ASSERT_TRUE(typo.ok());
  WorkerOptions t;
  const absl::Status s = ApplyWorkerConfig(*typo, &t);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("max_runing"), std::string::npos) << s;
}

TEST(WorkerOptionsTest, ValidationNamesTheOption) {
  WorkerOptions o;
  o.engine = "fast";
  EXPECT_NE(ValidateWorkerOptions(o).message().find("--engine"), std::string::npos);
  o = WorkerOptions();
  o.weights = "q4";
  EXPECT_NE(ValidateWorkerOptions(o).message().find("--weights"), std::string::npos);
  o = WorkerOptions();
  o.block_tokens = 0;
  EXPECT_FALSE(ValidateWorkerOptions(o).ok());
  o = WorkerOptions();
  o.watch_heartbeat = absl::Milliseconds(10);  // shorter than the interval
  EXPECT_FALSE(ValidateWorkerOptions(o).ok());
}

TEST(WorkerOptionsTest, AWildcardListenerNeedsAnAdvertisedAddress) {
  WorkerOptions o;
  o.address = "0.0.0.0:50051";
  EXPECT_NE(ValidateWorkerOptions(o).message().find("--advertise_address"), std::string::npos);
  o.advertise_address = "10.0.0.7";
  EXPECT_TRUE(ValidateWorkerOptions(o).ok());
  o.transport = "grpc";
  o.transport_address = "[::]:0";  // the gRPC transport advertises its address too
  EXPECT_TRUE(ValidateWorkerOptions(o).ok());
  o.advertise_address = "";
  o.address = "10.0.0.7:50051";
  EXPECT_NE(ValidateWorkerOptions(o).message().find("--transport_address"), std::string::npos);
  o.transport = "ucx";  // UCX's address names its devices itself: not a listen address
  EXPECT_TRUE(ValidateWorkerOptions(o).ok());
  o.advertise_address = "10.0.0.7:50051";  // a host, not an address
  EXPECT_NE(ValidateWorkerOptions(o).message().find("--advertise_address"), std::string::npos);
}

TEST(WorkerOptionsTest, TheSimulatedEngineNeedsItsCalibration) {
  auto config = Config::Parse(
      R"({"engine": "sim", "sim_calibration": "cal.json", "sim_speed": 0.5})", "worker.json");
  ASSERT_TRUE(config.ok()) << config.status();
  WorkerOptions o;
  ASSERT_TRUE(ApplyWorkerConfig(*config, &o).ok());
  EXPECT_EQ(o.engine, "sim");
  EXPECT_EQ(o.sim_calibration, "cal.json");
  EXPECT_EQ(o.sim_speed, 0.5);
  EXPECT_TRUE(ValidateWorkerOptions(o).ok());
  o.sim_calibration = "";
  EXPECT_NE(ValidateWorkerOptions(o).message().find("--sim_calibration"), std::string::npos);
  o.sim_calibration = "cal.json";
  o.sim_speed = 0;
  EXPECT_NE(ValidateWorkerOptions(o).message().find("--sim_speed"), std::string::npos);
  o = WorkerOptions();
  o.engine = "null";
  o.sim_calibration = "cal.json";  // for the simulated engine only
  EXPECT_NE(ValidateWorkerOptions(o).message().find("--sim_calibration"), std::string::npos);
}

TEST(WorkerOptionsTest, TheCudaBackendServesEveryRoleAndStagesItsKv) {
  auto config = Config::Parse(
      R"({"backend": "cuda", "cuda_device": 1, "gpu_memory_bytes": "60GiB",
          "kv_staging_bytes": "2GiB"})",
      "worker.json");
  ASSERT_TRUE(config.ok()) << config.status();
  WorkerOptions o;
  ASSERT_TRUE(ApplyWorkerConfig(*config, &o).ok());
  EXPECT_EQ(o.backend, "cuda");
  EXPECT_EQ(o.cuda_device, 1);
  EXPECT_EQ(o.gpu_memory_bytes, int64_t{60} << 30);
  EXPECT_EQ(o.kv_staging, "auto");
  EXPECT_EQ(o.kv_staging_bytes, int64_t{2} << 30);
  EXPECT_TRUE(ValidateWorkerOptions(o).ok());
  // A GPU's KV moves through the staging area: P/D roles and the KV store are served.
  for (const char* role : {"prefill", "decode"}) {
    WorkerOptions r = o;
    r.role = role;
    r.kvstore = "127.0.0.1:1";
    EXPECT_TRUE(ValidateWorkerOptions(r).ok()) << role;
  }
  WorkerOptions staging = o;
  staging.kv_staging = "never";
  EXPECT_NE(ValidateWorkerOptions(staging).message().find("--kv_staging"), std::string::npos);
  staging = o;
  staging.kv_staging_bytes = -1;
  EXPECT_NE(ValidateWorkerOptions(staging).message().find("--kv_staging_bytes"), std::string::npos);
  WorkerOptions null = o;
  null.engine = "null";
  EXPECT_NE(ValidateWorkerOptions(null).message().find("--engine=real"), std::string::npos);
  WorkerOptions other = o;
  other.backend = "rocm";
  EXPECT_NE(ValidateWorkerOptions(other).message().find("--backend"), std::string::npos);
}

TEST(WorkerOptionsTest, TheDefaultModelIsWhereFerryPutsIt) {
  setenv("FERRY_MODEL_GGUF", "/m/explicit.gguf", 1);
  EXPECT_EQ(DefaultModelPath(), "/m/explicit.gguf");
  unsetenv("FERRY_MODEL_GGUF");
  setenv("FERRY_MODELS_DIR", "/models", 1);
  EXPECT_EQ(DefaultModelPath(), "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  unsetenv("FERRY_MODELS_DIR");
  setenv("FERRY_CACHE", "/cache", 1);
  EXPECT_EQ(DefaultModelPath(), "/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

}  // namespace
}  // namespace ferry
