// Images in the prompt (prompt_image.h) on small synthetic models (dense, and a hybrid of
// sliding-window and full-attention layers with its window layers in a pool of their own): an
// image's embedding rows change the output; a request with images gives bit-identical tokens and
// logits alone, in a batch of other requests, under prefill chunks that start and end inside an
// image, with its prefix from the cache (hot: the image's blocks reused), after preemption under
// KV pressure and with a window replay over an image; a different image at the same place reuses
// only the blocks before it; a decode-only request preempted after a hand-off recomputes with its
// images; bad images are refused with InvalidArgument.

#include <cstring>
#include <map>
#include <random>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/engine_test_harness.h"
#include "engine/model/synthetic_model.h"
#include "engine/model/transformer.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using engine_testing::ExpectSame;
using engine_testing::Harness;
using engine_testing::Output;
using engine_testing::Prompt;

const SyntheticVariant kDense{"llama_gqa_f32"};
const SyntheticVariant kHybridTwoPools{"hybrid_window_24_two_pools",
                                       false,
                                       false,
                                       false,
                                       8,
                                       WeightDType::kF32,
                                       "bf16",
                                       0,
                                       2,
                                       false,
                                       24};
constexpr int64_t kHidden = 32;      // SyntheticModel's hidden size
constexpr TokenId kPlaceholder = 5;  // the image token the placeholders carry

// An image of `rows` deterministic pseudo-random embedding rows, named by `seed`.
PromptImageInput Image(int64_t start, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto values = std::make_shared<std::vector<float>>(rows * kHidden);
  for (float& v : *values) v = normal(rng);
  PromptImageInput image;
  image.content_hash = {0x1000u + seed, 0x2000u + seed};
  image.placeholder_start = start;
  image.placeholder_length = rows;
  image.embeddings = std::move(values);
  return image;
}

// A request for `prompt` with `images`, its placeholder positions set to kPlaceholder.
EngineRequest Req(const std::string& id, std::vector<TokenId> prompt,
                  std::vector<PromptImageInput> images, int64_t max_tokens, bool sampled) {
  EngineRequest r;
  r.id = id;
  for (const PromptImageInput& image : images) {
    for (int64_t i = 0; i < image.placeholder_length; ++i) {
      prompt[image.placeholder_start + i] = kPlaceholder;
    }
  }
  r.prompt = std::move(prompt);
  r.images = std::move(images);
  r.max_tokens = max_tokens;
  r.sampling.temperature = sampled ? 0.9f : 0.0f;
  if (sampled) r.sampling.seed = 42;
  return r;
}

// Two images: the first from 40 (inside block 2) over blocks 2..4, the second 110..140 (blocks
// 6..8, inside the last 23 positions of the 9 full blocks a window replay recomputes).
std::vector<PromptImageInput> TwoImages() { return {Image(40, 37, 1), Image(110, 30, 2)}; }

EngineOptions Whole() {
  EngineOptions o;
  o.prefill_chunk = 512;
  o.max_batch_tokens = 512;
  return o;
}

Output RunAlone(const SyntheticVariant& v, const EngineRequest& r, bool two_pools) {
  Harness h(v, 64, Whole(), 16, two_pools ? 64 : 0);
  EngineRequest copy = r;
  EXPECT_TRUE(h.Submit(std::move(copy)).ok());
  h.Drain();
  return h.out(r.id);
}

TEST(EngineImageTest, AnImagesEmbeddingsChangeTheOutput) {
  const std::vector<TokenId> prompt = Prompt(150, 7);
  const EngineRequest with = Req("r", prompt, TwoImages(), 8, false);
  EngineRequest tokens_only = with;  // the same placeholder tokens, embedded by the table
  tokens_only.images.clear();
  EngineRequest other = with;  // another image at the same place
  other.images[1] = Image(110, 30, 3);
  const Output a = RunAlone(kDense, with, false), b = RunAlone(kDense, tokens_only, false),
               c = RunAlone(kDense, other, false);
  ASSERT_EQ(a.logits.size(), 8u);
  EXPECT_NE(0, std::memcmp(a.logits[0].data(), b.logits[0].data(), 97 * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.logits[0].data(), c.logits[0].data(), 97 * sizeof(float)));
}

class EngineImageDeterminismTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(EngineImageDeterminismTest, SameTokensAndLogitsHoweverTheRequestRuns) {
  const bool two_pools = std::get<0>(GetParam()), sampled = std::get<1>(GetParam());
  const SyntheticVariant& v = two_pools ? kHybridTwoPools : kDense;
  const int64_t window_blocks = two_pools ? 128 : 0;
  const std::vector<TokenId> prompt = Prompt(150, 7);
  const EngineRequest request = Req("r", prompt, TwoImages(), 24, sampled);
  const Output want = RunAlone(v, request, two_pools);
  ASSERT_EQ(want.tokens.size(), 24u);

  // In a batch of other requests (one with an image of its own), chunks of 7 (every chunk
  // boundary inside an image somewhere), 16 and 64.
  for (int64_t chunk : {7, 16, 64}) {
    EngineOptions options;
    options.prefill_chunk = chunk;
    options.max_batch_tokens = 3 * chunk;
    Harness batch(v, 128, options, 16, window_blocks);
    for (int i = 0; i < 5; ++i) {
      std::vector<PromptImageInput> images;
      if (i == 2) images.push_back(Image(3, 20, 9));
      ASSERT_TRUE(batch
                      .Submit(Req("o" + std::to_string(i), Prompt(30 + 29 * i, 100 + i),
                                  std::move(images), 10, i % 2))
                      .ok());
    }
    EngineRequest copy = request;
    ASSERT_TRUE(batch.Submit(std::move(copy)).ok());
    batch.Drain();
    ExpectSame(batch.out("r"), want, "batch, chunk " + std::to_string(chunk));
  }

  // Prefix cache cold, then hot: the second run reuses all 9 full blocks, images included.
  Harness cached(v, 64, Whole(), 16, window_blocks);
  EngineRequest warm = request;
  warm.id = "warm";
  warm.max_tokens = 2;
  ASSERT_TRUE(cached.Submit(std::move(warm)).ok());
  cached.Drain();
  EXPECT_EQ(cached.out("warm").cached_tokens, 0);
  EngineRequest copy = request;
  ASSERT_TRUE(cached.Submit(std::move(copy)).ok());
  cached.Drain();
  EXPECT_EQ(cached.out("r").cached_tokens, 144);
  ExpectSame(cached.out("r"), want, "prefix from the cache");

  // Another image at the same place, same placeholder tokens: only the blocks before it (0 and
  // 1; the first image begins inside block 2) are reused, and the output is its own cold run's.
  EngineRequest other = request;
  other.id = "other";
  other.images[0] = Image(40, 37, 4);
  const Output other_cold = RunAlone(v, other, two_pools);
  ASSERT_TRUE(cached.Submit(std::move(other)).ok());
  cached.Drain();
  EXPECT_EQ(cached.out("other").cached_tokens, 32);
  ExpectSame(cached.out("other"), other_cold, "another image, same placeholders");
  EXPECT_NE(other_cold.logits[0], want.logits[0]);

  if (two_pools) {
    // Without the window cache the full layers' prefix is reused with a window replay of its
    // last 23 positions (121..143: inside the second image): exact.
    EngineOptions no_window_cache = Whole();
    no_window_cache.window_cache_bytes = 0;
    Harness replay(v, 64, no_window_cache, 16, window_blocks);
    EngineRequest first = request;
    first.id = "warm";
    first.max_tokens = 2;
    ASSERT_TRUE(replay.Submit(std::move(first)).ok());
    replay.Drain();
    EngineRequest again = request;
    ASSERT_TRUE(replay.Submit(std::move(again)).ok());
    replay.Drain();
    EXPECT_EQ(replay.out("r").cached_tokens, 144);
    EXPECT_EQ(replay.out("r").replayed_tokens, 23);
    ExpectSame(replay.out("r"), want, "window replay over an image");
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, EngineImageDeterminismTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "hybrid_two_pools"
                                                                      : "dense") +
                                  (std::get<1>(info.param) ? "_sampled" : "_greedy");
                         });

TEST(EngineImageTest, PreemptionUnderKvPressureGivesTheSameOutput) {
  for (const bool two_pools : {false, true}) {
    const SyntheticVariant& v = two_pools ? kHybridTwoPools : kDense;
    EngineOptions options;
    options.prefill_chunk = 64;
    options.max_batch_tokens = 256;
    options.prefix_cache_bytes = 0;  // nothing kept: recompute from scratch
    options.window_cache_bytes = 0;
    std::vector<EngineRequest> requests;
    for (int i = 0; i < 4; ++i) {
      requests.push_back(Req("r" + std::to_string(i), Prompt(40 + i, 50 + i),
                             {Image(3 + i, 20, 20 + i)}, 40, i % 2));
    }
    std::vector<Output> want;
    for (const EngineRequest& r : requests) {
      Harness alone(v, 64, options, 16, two_pools ? 64 : 0);
      EngineRequest copy = r;
      ASSERT_TRUE(alone.Submit(std::move(copy)).ok());
      alone.Drain();
      want.push_back(alone.out(r.id));
    }
    // Four requests that need 6 blocks each at the end, in a pool of 12.
    Harness tight(v, 12, options, 16, two_pools ? 12 : 0);
    for (const EngineRequest& r : requests) {
      EngineRequest copy = r;
      ASSERT_TRUE(tight.Submit(std::move(copy)).ok());
    }
    tight.Drain();
    EXPECT_GT(tight.engine_->stats().preemptions, 0) << two_pools;
    for (int i = 0; i < 4; ++i) {
      ExpectSame(tight.out(requests[i].id), want[i], "preempted " + std::to_string(i));
    }
  }
}

// A prefill-only request hands its KV to a decode-only one in another pool, which is then
// preempted (the lowest priority in a pool too small for all) and recomputes the prompt, images
// included, from the embeddings it holds: the same tokens and logits as the request alone.
TEST(EngineImageTest, ADecodeOnlyRequestPreemptedAfterAHandoffRecomputesWithItsImages) {
  EngineOptions options;
  options.prefill_chunk = 64;
  options.max_batch_tokens = 256;
  options.prefix_cache_bytes = 0;
  const EngineRequest request = Req("r", Prompt(40, 60), {Image(3, 20, 30)}, 40, true);
  const Output want = RunAlone(kDense, request, false);

  Harness prefill(kDense, 64, options);
  EngineRequest p = request;
  p.role = EngineRole::kPrefillOnly;
  ASSERT_TRUE(prefill.Submit(std::move(p)).ok());
  prefill.Drain();
  const Output first = prefill.out("r");
  ASSERT_EQ(first.finish, FinishReason::kHandoff);
  ASSERT_EQ(first.tokens.size(), 1u);
  const int64_t prompt_blocks = prefill.pool_->layout().BlocksFor(40);
  const std::vector<BlockId> handed(first.blocks.begin(), first.blocks.begin() + prompt_blocks);
  std::vector<char> bytes(handed.size() * prefill.pool_->layout().block_bytes());
  ASSERT_TRUE(prefill.pool_->ExportToHost(handed, bytes.data(), bytes.size()).ok());

  Harness decode(kDense, 12, options);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(decode
                    .Submit(Req("o" + std::to_string(i), Prompt(40 + i, 70 + i),
                                {Image(1 + i, 10, 40 + i)}, 40, false))
                    .ok());
  }
  const std::vector<BlockId> imported = *decode.pool_->Allocate(prompt_blocks);
  ASSERT_TRUE(decode.pool_->Import(imported, bytes.data(), bytes.size()).ok());
  EngineRequest d = request;
  d.role = EngineRole::kDecodeOnly;
  d.priority = -1;
  d.imported_blocks = imported;
  d.resume = {ResumePoint{first.tokens, first.sampler_state, ""}};
  ASSERT_TRUE(decode.Submit(std::move(d)).ok());
  decode.Drain();
  EXPECT_GT(decode.engine_->stats().preemptions, 0);
  Output joined = first;
  const Output& rest = decode.out("r");
  joined.tokens.insert(joined.tokens.end(), rest.tokens.begin(), rest.tokens.end());
  joined.logits.insert(joined.logits.end(), rest.logits.begin(), rest.logits.end());
  ExpectSame(joined, want, "prefill-only + decode-only, preempted");
  prefill.engine_->ReleaseHandoff("r");
  prefill.Drain();
}

// Images sent without rows (null embeddings: the router predicted their positions cached,
// prompt_image.h): with the prefix cached, the same output as with the rows; not cached, or a
// window replay reaching into one: the request fails
// Unavailable (its caller resends it with the image) and the engine goes on.
TEST(EngineImageTest, AnImageWithoutRowsNeedsItsPositionsCached) {
  for (const bool two_pools : {false, true}) {
    const SyntheticVariant& v = two_pools ? kHybridTwoPools : kDense;
    const int64_t window_blocks = two_pools ? 128 : 0;
    const EngineRequest request = Req("r", Prompt(150, 7), TwoImages(), 12, false);
    const Output want = RunAlone(v, request, two_pools);
    auto without_rows = [](EngineRequest r, const std::string& id) {
      r.id = id;
      for (PromptImageInput& image : r.images) image.embeddings = nullptr;
      return r;
    };

    // Cold: nothing cached, the first chunk needs the first image. Failed, and the engine serves
    // the next request.
    Harness h(v, 64, Whole(), 16, window_blocks);
    ASSERT_TRUE(h.Submit(without_rows(request, "cold")).ok());
    h.Drain();
    EXPECT_EQ(h.out("cold").finish, FinishReason::kError);
    EXPECT_EQ(h.out("cold").error_code, absl::StatusCode::kUnavailable);
    EXPECT_NE(h.out("cold").error.find("image 0"), std::string::npos) << h.out("cold").error;
    EXPECT_TRUE(h.out("cold").tokens.empty());
    EXPECT_EQ(h.engine_->stats().absent_image_rows, 1);
    EXPECT_EQ(h.held_blocks(), 0) << "a failed request frees what it held";

    // Warm (the request with its rows ran): all 9 full blocks reused, the rows never needed.
    EngineRequest warm = request;
    warm.id = "warm";
    warm.max_tokens = 2;
    ASSERT_TRUE(h.Submit(std::move(warm)).ok());
    h.Drain();
    ASSERT_TRUE(h.Submit(without_rows(request, "hot")).ok());
    h.Drain();
    EXPECT_EQ(h.out("hot").cached_tokens, 144);
    ExpectSame(h.out("hot"), want, "rows absent, prefix cached");
    EXPECT_EQ(h.engine_->stats().absent_image_rows, 1);

    if (two_pools) {
      // No window cache: the reuse replays positions 121..143, inside the second image.
      EngineOptions no_window_cache = Whole();
      no_window_cache.window_cache_bytes = 0;
      Harness replay(v, 64, no_window_cache, 16, window_blocks);
      EngineRequest first = request;
      first.id = "warm";
      first.max_tokens = 2;
      ASSERT_TRUE(replay.Submit(std::move(first)).ok());
      replay.Drain();
      ASSERT_TRUE(replay.Submit(without_rows(request, "replayed")).ok());
      replay.Drain();
      EXPECT_EQ(replay.out("replayed").error_code, absl::StatusCode::kUnavailable);
      EXPECT_NE(replay.out("replayed").error.find("image 1"), std::string::npos)
          << replay.out("replayed").error;
      // Only the second image's rows absent: the replay has what it needs.
      EngineRequest second = request;
      second.id = "first_absent";
      second.images[0].embeddings = nullptr;
      ASSERT_TRUE(replay.Submit(std::move(second)).ok());
      replay.Drain();
      EXPECT_EQ(replay.out("first_absent").replayed_tokens, 23);
      ExpectSame(replay.out("first_absent"), want, "first image's rows absent, replayed");
    }
  }
}

TEST(EngineImageTest, BadImagesAreRefused) {
  Harness h(kDense, 64, Whole());
  const std::vector<TokenId> prompt = Prompt(50, 3);
  auto refused = [&](std::vector<PromptImageInput> images, const std::string& what) {
    EngineRequest r;
    r.id = "bad";
    r.prompt = prompt;
    r.images = std::move(images);
    const absl::Status s = h.engine_->Submit(std::move(r));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
    return std::string(s.message());
  };
  refused({Image(40, 11, 1)}, "past the prompt's end");
  refused({Image(-1, 4, 1)}, "negative start");
  refused({Image(4, 0, 1)}, "no placeholders");
  refused({Image(10, 10, 1), Image(15, 10, 2)}, "overlapping");
  refused({Image(20, 5, 1), Image(10, 5, 2)}, "unsorted");
  PromptImageInput narrow = Image(10, 4, 1);
  narrow.embeddings = std::make_shared<std::vector<float>>(4 * (kHidden - 1));
  EXPECT_NE(refused({narrow}, "rows of the wrong width").find("hidden size"), std::string::npos);
  // A good one is taken: an image may end at the prompt's last token.
  EngineRequest r;
  r.id = "good";
  r.prompt = prompt;
  r.images = {Image(0, 10, 1), Image(10, 40, 2)};
  EXPECT_TRUE(h.engine_->Submit(std::move(r)).ok());
  h.Drain();
}

}  // namespace
}  // namespace ferry
