// RecordingModel under the real Engine: every step's batch and its Forward's time, taken in the
// engine's on_step, as ferry-calibrate takes them.

#include "tools/calibrate/recording_model.h"

#include <memory>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/model/null_model.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

struct Recorded {
  std::vector<SimRow> rows;
  int calls = 0;
  double forward_seconds = 0;
  double step_seconds = 0;
};

TEST(RecordingModelTest, EachStepComesWithItsBatchAndItsForwardTime) {
  constexpr double kForwardSeconds = 0.02;  // the null model sleeps this long in every Forward
  NullModelOptions options;
  options.config.vocab_size = 500;
  options.config.max_position_embeddings = 4096;
  options.step_overhead_seconds = kForwardSeconds;
  std::unique_ptr<NullModel> model = *NullModel::Create(options);
  RecordingModel recorder(model.get());
  std::unique_ptr<CpuBackend> backend = *CpuBackend::Create({1, std::nullopt});
  BackendKvAllocator allocator(backend.get());
  std::unique_ptr<KvBlockPool> pool =
      *KvBlockPool::Create(recorder.KvLayoutFor(16), 64, &allocator, backend.get());
  std::vector<Recorded> steps;
  EngineOptions engine_options;
  engine_options.on_step = [&](const StepInfo& info) {
    Recorded r;
    r.rows = recorder.TakeRows(&r.calls, &r.forward_seconds);
    r.step_seconds = info.seconds;
    steps.push_back(std::move(r));
  };
  std::unique_ptr<Engine> engine = *Engine::Create(&recorder, pool.get(), nullptr, engine_options);
  EngineRequest request;
  request.id = "r";
  request.prompt.assign(40, 7);
  request.max_tokens = 3;
  request.ignore_eos = true;
  request.sampling.temperature = 0;
  ASSERT_TRUE(engine->Submit(std::move(request)).ok());
  while (*engine->Step()) {
  }

  // The prompt in one row, then a decode row a step: (start, tokens).
  ASSERT_GE(steps.size(), 3u);
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 40}, {40, 1}, {41, 1}};
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(steps[i].calls, 1);
    ASSERT_EQ(steps[i].rows.size(), 1u);
    EXPECT_EQ(steps[i].rows[0].start, want[i].first);
    EXPECT_EQ(steps[i].rows[0].tokens, want[i].second);
    // The Forward's own time: at least the model's sleep, and within the engine's step.
    EXPECT_GE(steps[i].forward_seconds, kForwardSeconds);
    EXPECT_LE(steps[i].forward_seconds, steps[i].step_seconds);
  }
  // Steps that ran no Forward (the engine releasing the finished request) record nothing.
  for (size_t i = want.size(); i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].calls, 0);
    EXPECT_EQ(steps[i].forward_seconds, 0);
    EXPECT_TRUE(steps[i].rows.empty());
  }
}

}  // namespace
}  // namespace ferry
