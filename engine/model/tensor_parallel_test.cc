// Tensor parallelism on the CPU backend (tensor_parallel.h): two ranks, each a thread with its own
// backend and pool, against one rank. The split sums each row-split product in two halves, so
// TP=2 differs from TP=1 by fp32 rounding only (tolerance 1e-5 of the largest logit, greedy
// tokens equal); TP=2 is itself deterministic (chunked prefill, repeated runs: the same bits on
// every rank); and splits the model cannot take are clear errors.

#include "engine/model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/log.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/synthetic_model.h"
#include "engine/model/transformer.h"
#include "engine/parallel/local_communicator.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

// One rank: its backend, model and pool.
struct Rank {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<BackendKvAllocator> allocator;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<KvBlockPool> pool;
};

struct Group {
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<Rank> ranks;
};

Group MakeGroup(const HostWeights& w, int size) {
  Group g;
  g.comms = LocalCommunicatorGroup::Create(size);
  g.ranks.resize(size);
  for (int r = 0; r < size; ++r) {
    Rank& k = g.ranks[r];
    k.backend = *CpuBackend::Create({1});
    k.allocator = std::make_unique<BackendKvAllocator>(k.backend.get());
    auto model = Transformer::Create(w, k.backend.get(), size > 1 ? g.comms[r].get() : nullptr);
    CHECK_OK(model.status());
    k.model = std::move(*model);
    k.pool = *KvBlockPool::Create(k.model->KvLayoutFor(16), 64, k.allocator.get(), k.backend.get());
  }
  return g;
}

// Every prompt position's logits, the prompt in steps of `chunk`, then `decode` greedy steps (one
// logits row each); every rank's result, which must agree.
std::vector<std::vector<float>> RunSteps(Group& g, const std::vector<TokenId>& prompt,
                                         int64_t chunk, int decode) {
  std::vector<std::vector<float>> out(g.ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < g.ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      Rank& k = g.ranks[r];
      const int64_t n = prompt.size();
      auto blocks = *k.pool->Allocate(k.pool->layout().BlocksFor(n + decode));
      std::vector<float>& logits = out[r];
      for (int64_t b = 0; b < n; b += chunk) {
        const int64_t len = std::min(chunk, n - b);
        const ForwardSequence seq{absl::MakeConstSpan(prompt).subspan(b, len), b, blocks, true};
        CHECK_OK(k.model->Forward({seq}, *k.pool, &logits));
      }
      const int64_t vocab = k.model->config().vocab_size;
      for (int step = 0; step < decode; ++step) {
        const float* last = logits.data() + logits.size() - vocab;
        const TokenId next = static_cast<TokenId>(std::max_element(last, last + vocab) - last);
        const std::vector<TokenId> one = {next};
        CHECK_OK(k.model->Forward({{one, n + step, blocks, true}}, *k.pool, &logits));
      }
      CHECK_OK(k.pool->Release(blocks));
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

std::vector<TokenId> Prompt(int64_t n) {
  std::mt19937 rng(5);
  std::vector<TokenId> t(n);
  for (TokenId& id : t) id = rng() % 97;
  return t;
}

class TensorParallelTest : public ::testing::TestWithParam<SyntheticVariant> {};

TEST_P(TensorParallelTest, TwoRanksAgreeWithOne) {
  const HostWeights w = SyntheticModel(GetParam());
  const auto prompt = Prompt(70);
  Group one = MakeGroup(w, 1), two = MakeGroup(w, 2);
  const std::vector<float> want = RunSteps(one, prompt, 70, 8)[0];
  const auto got = RunSteps(two, prompt, 70, 8);
  ASSERT_TRUE(SameBits(got[0], got[1])) << "the ranks disagree";
  ASSERT_EQ(got[0].size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[0][i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  EXPECT_LE(diff, 1e-5 * scale) << "max |tp2 - tp1| " << diff << " of " << scale;
  std::printf("%s: max |tp2 - tp1| / max |tp1| = %.3g\n", GetParam().name.c_str(), diff / scale);
  // The greedy tokens: each decode row's argmax (the next step's input) is the same.
  const int64_t vocab = 97;
  for (int64_t row = 70; row < 78; ++row) {
    const float* a = want.data() + row * vocab;
    const float* b = got[0].data() + row * vocab;
    EXPECT_EQ(std::max_element(a, a + vocab) - a, std::max_element(b, b + vocab) - b) << row;
  }
  // Deterministic in itself: chunked prefill gives the same bits as the whole prompt.
  Group again = MakeGroup(w, 2);
  EXPECT_TRUE(SameBits(RunSteps(again, prompt, 16, 8)[0], got[0]));
  // A rank's KV blocks hold half the heads: its own fingerprint, never the whole model's.
  EXPECT_NE(two.ranks[0].model->fingerprint(), one.ranks[0].model->fingerprint());
  EXPECT_NE(two.ranks[0].model->fingerprint(), two.ranks[1].model->fingerprint());
  EXPECT_EQ(two.ranks[0].pool->layout().num_kv_heads * 2, one.ranks[0].pool->layout().num_kv_heads);
}

std::vector<SyntheticVariant> Variants() {
  std::vector<SyntheticVariant> v(5);
  v[0].name = "llama_gqa_f32";
  v[1].name = "qwen2_bias_bf16_kv";
  v[1].bias = true;
  v[1].kv = "bf16";
  v[2].name = "qwen3_qknorm_head_dim_16";
  v[2].qk_norm = true;
  v[2].head_dim = 16;
  v[3].name = "bf16_weights_tied";
  v[3].weights = WeightDType::kBF16;
  v[3].tied = true;
  v[4].name = "hybrid_window_8";
  v[4].window = 8;
  v[4].layers = 4;
  return v;
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

TEST(TensorParallelErrorsTest, SplitsTheModelCannotTake) {
  SyntheticVariant v;
  v.name = "w";
  const HostWeights w = SyntheticModel(v);  // 4 heads over 2 KV heads
  EXPECT_NE(ShardWeights(w, 0, 4).status().message().find("divisible"), absl::string_view::npos);
  EXPECT_FALSE(ShardWeights(w, 2, 2).ok());  // no rank 2 of 2
  SyntheticVariant moe = v;
  moe.experts = 4;
  EXPECT_FALSE(ShardWeights(SyntheticModel(moe), 0, 2).ok());
  // Block-format down projection of 256 columns (one Q6_K block): halves would cut the block.
  SyntheticVariant native = v;
  native.native = true;
  native.weights = WeightDType::kNative;
  const absl::Status s = ShardWeights(SyntheticModel(native), 0, 2).status();
  EXPECT_NE(s.message().find("cut its blocks"), absl::string_view::npos) << s;
}

TEST(TensorParallelBlocksTest, BlockFormatsSplitAlongWholeBlocks) {
  // Every matrix in Q8_0, with widths whose halves are whole 32-value blocks: o has 4 heads of 16
  // (64 columns, 32 per rank), down has 128 (64 per rank).
  SyntheticVariant v;
  v.name = "q8";
  v.hidden = 64;
  v.intermediate = 128;
  v.head_dim = 16;  // 4 heads of 16: o has 64 columns, 32 per rank
  v.all_blocks = WeightQuant::kQ8_0;
  const HostWeights w = SyntheticModel(v);
  Group one = MakeGroup(w, 1), two = MakeGroup(w, 2);
  const auto prompt = Prompt(20);
  const std::vector<float> want = RunSteps(one, prompt, 20, 2)[0];
  const auto got = RunSteps(two, prompt, 20, 2);
  ASSERT_TRUE(SameBits(got[0], got[1]));
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[0][i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  EXPECT_LE(diff, 1e-5 * scale);
}

}  // namespace
}  // namespace ferry
