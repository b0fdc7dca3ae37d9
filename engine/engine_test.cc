// The scheduler's promises on small synthetic models (dense, a mixture of experts, a hybrid of
// sliding-window and full-attention layers, the hybrid also with its window layers in a pool of
// their own): a request's tokens and the logits they were chosen from are bit-identical alone,
// inside a batch of mixed requests, under any prefill chunk size, with its prefix from the cache,
// after preemption under KV pressure, resumed after k tokens, and split into prefill-only +
// decode-only (several choices, a subset of them, a choice resumed on the prefill side); greedy
// and seeded sampling; a dense model also with block-format (Q4_1 / Q8_0) weights. Abort frees
// every block; a long request is not starved by a flood of short ones; a window pool stays
// bounded by the window.

#include "engine/engine.h"

#include <cmath>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/block_hash.h"
#include "engine/common/fake_clock.h"
#include "engine/engine_test_harness.h"
#include "engine/model/synthetic_model.h"
#include "engine/model/transformer.h"
#include "engine/sampling/sampling.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using engine_testing::ExpectSame;
using engine_testing::Harness;
using engine_testing::Output;
using engine_testing::Prompt;

EngineRequest Req(const std::string& id, std::vector<TokenId> prompt, int64_t max_tokens,
                  bool sampled) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  if (sampled) {
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.top_k = 40;
    r.sampling.frequency_penalty = 0.3f;
    r.sampling.repetition_penalty = 1.1f;
    r.sampling.seed = 42;
  } else {
    r.sampling.temperature = 0;
  }
  return r;
}

// A table's blocks to host bytes and into another engine's pool (kNoBlock entries stay).
std::vector<BlockId> MoveBlocks(KvBlockPool& from, KvBlockPool& to,
                                const std::vector<BlockId>& table) {
  std::vector<BlockId> held, imported(table.size(), kNoBlock);
  for (BlockId b : table) {
    if (b != kNoBlock) held.push_back(b);
  }
  std::vector<char> bytes(held.size() * from.layout().block_bytes());
  EXPECT_TRUE(from.ExportToHost(held, bytes.data(), bytes.size()).ok());
  auto fresh = *to.Allocate(static_cast<int64_t>(held.size()));
  EXPECT_TRUE(to.Import(fresh, bytes.data(), bytes.size()).ok());
  for (size_t i = 0, j = 0; i < table.size(); ++i) {
    if (table[i] != kNoBlock) imported[i] = fresh[j++];
  }
  return imported;
}

const SyntheticVariant kVariants[] = {
    {"llama_gqa_f32"},
    {"qwen2_bias_bf16_weights_bf16_kv", true, false, false, 8, WeightDType::kBF16, "bf16"},
    {"moe_8x2_shared_bf16", false, false, false, 8, WeightDType::kBF16, "bf16", 8, 2, true},
    {"hybrid_window_24_bf16_kv", false, false, false, 8, WeightDType::kF32, "bf16", 0, 2, false,
     24},
    {"hybrid_window_24_two_pools", false, false, false, 8, WeightDType::kF32, "bf16", 0, 2, false,
     24},
    {"llama_tied_q4_1_q6_k_q8_0_native", false, false, true, 8, WeightDType::kNative, "bf16", 0, 2,
     false, 0, 2, true},
};
// The last variant keeps its window layer in a pool of its own (as many blocks as the other).
bool TwoPools(const SyntheticVariant& v) { return v.name == "hybrid_window_24_two_pools"; }

// A harness for `variant`: one pool, or two pools of `blocks` each.
Harness Make(const SyntheticVariant& v, int64_t blocks, const EngineOptions& options) {
  return Harness(v, blocks, options, 16, TwoPools(v) ? blocks : 0);
}

// The chain of the first `blocks` full blocks of `prompt`, as the engine hashes it (no salt).
std::vector<Hash128> Chain(const ForwardModel& model, const std::vector<TokenId>& prompt,
                           int64_t blocks, int32_t block_tokens = 16) {
  const Hash128 root = RootBlockHash({model.fingerprint(), "", ""});
  std::vector<Hash128> chain;
  for (int64_t b = 0; b < blocks; ++b) {
    chain.push_back(
        NextBlockHash(b == 0 ? root : chain.back(),
                      absl::MakeConstSpan(prompt).subspan(b * block_tokens, block_tokens), {}));
  }
  return chain;
}

absl::StatusOr<KvReservation> ReserveImport(Harness& h, std::vector<Hash128> chain,
                                            int64_t max_fresh) {
  absl::StatusOr<KvReservation> got = absl::UnknownError("not run");
  h.engine_->ReserveImport(std::move(chain), max_fresh,
                           [&](absl::StatusOr<KvReservation> r) { got = std::move(r); });
  h.Drain();
  return got;
}

class EngineDeterminismTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(EngineDeterminismTest, SameTokensAndLogitsHoweverTheRequestRuns) {
  const SyntheticVariant& variant = kVariants[std::get<0>(GetParam())];
  const bool sampled = std::get<1>(GetParam());
  const std::vector<TokenId> prompt = Prompt(150, 7);
  const int64_t max_tokens = 24;
  EngineOptions whole;
  whole.prefill_chunk = 512;
  whole.max_batch_tokens = 512;

  // Alone, the whole prompt in one step.
  Harness alone = Make(variant, 64, whole);
  ASSERT_TRUE(alone.Submit(Req("r", prompt, max_tokens, sampled)).ok());
  alone.Drain();
  const Output want = alone.out("r");
  ASSERT_EQ(want.tokens.size(), static_cast<size_t>(max_tokens));
  ASSERT_EQ(want.finish, FinishReason::kLength);

  // Inside a batch of 8 mixed requests (prompts of several lengths, greedy and sampled,
  // priorities), under chunk sizes 16 and 64.
  for (int64_t chunk : {16, 64}) {
    EngineOptions options;
    options.prefill_chunk = chunk;
    options.max_batch_tokens = 3 * chunk;
    Harness batch = Make(variant, 128, options);
    for (int i = 0; i < 7; ++i) {
      EngineRequest r = Req("o" + std::to_string(i), Prompt(20 + 37 * i, 100 + i), 10 + i, i % 2);
      r.priority = i % 3 - 1;
      ASSERT_TRUE(batch.Submit(std::move(r)).ok());
    }
    ASSERT_TRUE(batch.Submit(Req("r", prompt, max_tokens, sampled)).ok());
    batch.Drain();
    ExpectSame(batch.out("r"), want, "batch, chunk " + std::to_string(chunk));
    for (int i = 0; i < 7; ++i)
      EXPECT_EQ(batch.out("o" + std::to_string(i)).finish, FinishReason::kLength);
  }

  // With its prefix from the cache: a first request leaves the prompt's full blocks there.
  Harness cached = Make(variant, 64, whole);
  ASSERT_TRUE(cached.Submit(Req("warm", prompt, 2, false)).ok());
  cached.Drain();
  const int64_t before = cached.engine_->stats().cached_tokens;
  ASSERT_TRUE(cached.Submit(Req("r", prompt, max_tokens, sampled)).ok());
  cached.Drain();
  EXPECT_EQ(cached.engine_->stats().cached_tokens - before, 144);  // 9 full blocks of 16
  ExpectSame(cached.out("r"), want, "prefix from the cache");
  if (TwoPools(variant)) {
    // Without the window layers' blocks in the window cache the full layers' prefix is used with
    // a replay of its last 23 positions (the window layer sees 23 before each row): exact.
    EngineOptions no_window_cache = whole;
    no_window_cache.window_cache_bytes = 0;
    Harness uncached = Make(variant, 64, no_window_cache);
    ASSERT_TRUE(uncached.Submit(Req("warm", prompt, 2, false)).ok());
    uncached.Drain();
    EXPECT_GT(uncached.engine_->stats().cached_blocks, 0);
    EXPECT_EQ(uncached.engine_->stats().window_cached_blocks, 0);
    ASSERT_TRUE(uncached.Submit(Req("r", prompt, max_tokens, sampled)).ok());
    uncached.Drain();
    EXPECT_EQ(uncached.engine_->stats().cached_tokens, 144);
    EXPECT_EQ(uncached.out("r").replayed_tokens, 23);
    EXPECT_EQ(uncached.engine_->stats().window_replays, 1);
    ExpectSame(uncached.out("r"), want, "full layers' prefix cached, window layers' replayed");
  }

  // Resumed after k tokens: the first k, then a request that continues from them.
  const int64_t k = 10;
  Harness resumed = Make(variant, 64, whole);
  ASSERT_TRUE(resumed.Submit(Req("first", prompt, k, sampled)).ok());
  resumed.Drain();
  const Output& head = resumed.out("first");
  ASSERT_EQ(head.tokens.size(), static_cast<size_t>(k));
  EngineRequest rest = Req("rest", prompt, max_tokens, sampled);
  rest.resume = {ResumePoint{head.tokens, head.sampler_state, ""}};
  ASSERT_TRUE(resumed.Submit(std::move(rest)).ok());
  resumed.Drain();
  Output joined = head;
  const Output& tail = resumed.out("rest");
  joined.tokens.insert(joined.tokens.end(), tail.tokens.begin(), tail.tokens.end());
  joined.logits.insert(joined.logits.end(), tail.logits.begin(), tail.logits.end());
  ExpectSame(joined, want, "resumed after 10 tokens");

  // Prefill-only hands over the KV; decode-only continues from it in another pool.
  Harness prefill = Make(variant, 64, whole);
  EngineRequest p = Req("r", prompt, max_tokens, sampled);
  p.role = EngineRole::kPrefillOnly;
  ASSERT_TRUE(prefill.Submit(std::move(p)).ok());
  prefill.Drain();
  const Output& first = prefill.out("r");
  ASSERT_EQ(first.finish, FinishReason::kHandoff);
  ASSERT_EQ(first.tokens.size(), 1u);
  const int64_t prompt_blocks = prefill.pool_->layout().BlocksFor(150);
  Harness decode = Make(variant, 64, whole);
  const std::vector<BlockId> handed(first.blocks.begin(), first.blocks.begin() + prompt_blocks);
  const std::vector<BlockId> imported = MoveBlocks(*prefill.pool_, *decode.pool_, handed);
  std::vector<BlockId> imported_window;
  if (TwoPools(variant)) {
    ASSERT_EQ(first.window_blocks.size(), static_cast<size_t>(prompt_blocks));
    // Only the window (positions 127.. of 150) is handed over: blocks 7..9.
    EXPECT_EQ(first.window_blocks[6], kNoBlock);
    imported_window = MoveBlocks(*prefill.window_pool_, *decode.window_pool_, first.window_blocks);
  } else {
    EXPECT_TRUE(first.window_blocks.empty());
  }
  prefill.engine_->ReleaseHandoff("r");
  EngineRequest d = Req("r", prompt, max_tokens, sampled);
  d.role = EngineRole::kDecodeOnly;
  d.imported_blocks = imported;
  d.imported_window_blocks = imported_window;
  d.resume = {ResumePoint{first.tokens, first.sampler_state, ""}};
  ASSERT_TRUE(decode.Submit(std::move(d)).ok());
  decode.Drain();
  Output handoff = first;
  handoff.tokens.insert(handoff.tokens.end(), decode.out("r").tokens.begin(),
                        decode.out("r").tokens.end());
  handoff.logits.insert(handoff.logits.end(), decode.out("r").logits.begin(),
                        decode.out("r").logits.end());
  ExpectSame(handoff, want, "prefill-only + decode-only");
  prefill.Drain();  // the release
  EXPECT_EQ(prefill.pool_->num_free() + prefill.engine_->stats().cached_blocks,
            prefill.pool_->num_blocks());
  if (TwoPools(variant)) {
    EXPECT_EQ(prefill.window_pool_->num_free() + prefill.engine_->stats().window_cached_blocks,
              prefill.window_pool_->num_blocks());
  }
  // Parked mid-decode (a drain's hand-off): the KV of every position but the last token's is
  // handed over; decode-only continues from it in another pool.
  {
    Harness source = Make(variant, 64, whole);
    ASSERT_TRUE(source.Submit(Req("r", prompt, max_tokens, sampled)).ok());
    for (int i = 0; i < 200 && source.out("r").tokens.size() < 9; ++i) {
      ASSERT_TRUE(source.engine_->Step().ok());
    }
    source.engine_->Park("r");
    source.engine_->Park("unknown");  // ignored
    ASSERT_TRUE(source.engine_->Step().ok());
    const Output parked = source.out("r");
    ASSERT_EQ(parked.finish, FinishReason::kHandoff);
    ASSERT_EQ(parked.finishes, 1);
    const int64_t g = static_cast<int64_t>(parked.tokens.size());
    ASSERT_GE(g, 9);
    ASSERT_LT(g, max_tokens);
    const int64_t table = source.pool_->layout().BlocksFor(150 + g - 1);
    ASSERT_EQ(parked.blocks.size(), static_cast<size_t>(table));
    Harness target = Make(variant, 64, whole);
    EngineRequest d = Req("r", prompt, max_tokens, sampled);
    d.role = EngineRole::kDecodeOnly;
    d.imported_blocks = MoveBlocks(*source.pool_, *target.pool_, parked.blocks);
    if (TwoPools(variant)) {
      d.imported_window_blocks =
          MoveBlocks(*source.window_pool_, *target.window_pool_, parked.window_blocks);
    }
    source.engine_->ReleaseHandoff("r");
    d.resume = {ResumePoint{parked.tokens, parked.sampler_state, ""}};
    ASSERT_TRUE(target.Submit(std::move(d)).ok());
    target.Drain();
    Output joined = parked;
    joined.tokens.insert(joined.tokens.end(), target.out("r").tokens.begin(),
                         target.out("r").tokens.end());
    joined.logits.insert(joined.logits.end(), target.out("r").logits.begin(),
                         target.out("r").logits.end());
    ExpectSame(joined, want, "parked after " + std::to_string(g) + " tokens, then decode-only");
    source.Drain();  // the release
    EXPECT_EQ(source.held_blocks(), 0);
    EXPECT_FALSE(source.engine_->IsLive("r"));
  }
  // Pre-copied while it decodes (a drain's pre-copy, one pool): its first full blocks, held
  // by HoldComputedBlocks, go into another engine's prefix cache (CacheBlocks); the hand-off's
  // reservation there finds them cached and takes only the rest from the parked table.
  if (!TwoPools(variant)) {
    Harness source = Make(variant, 64, whole);
    ASSERT_TRUE(source.Submit(Req("r", prompt, max_tokens, sampled)).ok());
    for (int i = 0; i < 200 && source.out("r").tokens.size() < 5; ++i) {
      ASSERT_TRUE(source.engine_->Step().ok());
    }
    absl::StatusOr<std::vector<BlockId>> held = absl::UnknownError("not run");
    auto hold = [&](const std::string& id, int64_t n) {
      held = absl::UnknownError("not run");
      source.engine_->HoldComputedBlocks(
          id, n, [&](absl::StatusOr<std::vector<BlockId>> got) { held = std::move(got); });
      ASSERT_TRUE(source.engine_->Step().ok());
    };
    hold("unknown", 1);
    EXPECT_EQ(held.status().code(), absl::StatusCode::kNotFound);
    hold("r", 40);  // past what is computed
    EXPECT_EQ(held.status().code(), absl::StatusCode::kFailedPrecondition);
    hold("r", 9);  // 150 prompt tokens and 5 more: 9 full blocks of 16 computed
    ASSERT_TRUE(held.ok()) << held.status();
    ASSERT_EQ(held->size(), 9u);
    std::vector<TokenId> so_far = prompt;
    so_far.insert(so_far.end(), source.out("r").tokens.begin(), source.out("r").tokens.end());
    Harness target = Make(variant, 64, whole);
    auto landing = ReserveImport(target, Chain(*target.model_, so_far, 9), 9);
    ASSERT_TRUE(landing.ok()) << landing.status();
    ASSERT_EQ(landing->blocks.size(), 9u);
    std::vector<char> bytes(9 * source.pool_->layout().block_bytes());
    ASSERT_TRUE(source.pool_->ExportToHost(*held, bytes.data(), bytes.size()).ok());
    ASSERT_TRUE(target.pool_->Import(landing->blocks, bytes.data(), bytes.size()).ok());
    ASSERT_TRUE(source.pool_->Release(*held).ok());
    target.engine_->CacheBlocks(Chain(*target.model_, so_far, 9), landing->blocks);
    target.Drain();
    EXPECT_EQ(target.engine_->stats().cached_blocks, 9);
    EXPECT_EQ(target.held_blocks(), 0);  // the cache's alone

    for (int i = 0; i < 200 && source.out("r").tokens.size() < 12; ++i) {
      ASSERT_TRUE(source.engine_->Step().ok());
    }
    source.engine_->Park("r");
    ASSERT_TRUE(source.engine_->Step().ok());
    const Output parked = source.out("r");
    ASSERT_EQ(parked.finish, FinishReason::kHandoff);
    const int64_t positions = 150 + static_cast<int64_t>(parked.tokens.size()) - 1;
    std::vector<TokenId> computed = prompt;
    computed.insert(computed.end(), parked.tokens.begin(), parked.tokens.end() - 1);
    absl::StatusOr<KvReservation> reserved = absl::UnknownError("not run");
    target.engine_->Reserve(Chain(*target.model_, computed, positions / 16), positions,
                            [&](absl::StatusOr<KvReservation> r) { reserved = std::move(r); });
    target.Drain();
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    ASSERT_EQ(reserved->cached_blocks, 9);
    ASSERT_EQ(reserved->blocks.size(), parked.blocks.size());
    const std::vector<BlockId> tail(parked.blocks.begin() + 9, parked.blocks.end());
    std::vector<char> rest(tail.size() * source.pool_->layout().block_bytes());
    ASSERT_TRUE(source.pool_->ExportToHost(tail, rest.data(), rest.size()).ok());
    const std::vector<BlockId> fresh(reserved->blocks.begin() + 9, reserved->blocks.end());
    ASSERT_TRUE(target.pool_->Import(fresh, rest.data(), rest.size()).ok());
    source.engine_->ReleaseHandoff("r");
    EngineRequest d = Req("r", prompt, max_tokens, sampled);
    d.role = EngineRole::kDecodeOnly;
    d.imported_blocks = reserved->blocks;
    d.resume = {ResumePoint{parked.tokens, parked.sampler_state, ""}};
    ASSERT_TRUE(target.Submit(std::move(d)).ok());
    target.Drain();
    Output joined = parked;
    joined.tokens.insert(joined.tokens.end(), target.out("r").tokens.begin(),
                         target.out("r").tokens.end());
    joined.logits.insert(joined.logits.end(), target.out("r").logits.begin(),
                         target.out("r").logits.end());
    ExpectSame(joined, want, "pre-copied 9 blocks, parked, the rest handed off");
    source.Drain();
    EXPECT_EQ(source.held_blocks(), 0);
    // A request still prefilling is parked once its prompt is computed and it has a token; one
    // of several choices is never parked: it runs to its end.
    EngineOptions chunked = whole;
    chunked.prefill_chunk = 16;
    Harness later = Make(variant, 64, chunked);
    ASSERT_TRUE(later.Submit(Req("p", prompt, max_tokens, sampled)).ok());
    EngineRequest two = Req("two", Prompt(40, 9), 12, sampled);
    two.n = 2;
    ASSERT_TRUE(later.Submit(std::move(two)).ok());
    ASSERT_TRUE(later.engine_->Step().ok());
    ASSERT_TRUE(later.out("p").tokens.empty());
    later.engine_->Park("p");
    later.engine_->Park("two");
    later.Drain();
    EXPECT_EQ(later.out("p").finish, FinishReason::kHandoff);
    EXPECT_GE(later.out("p").tokens.size(), 1u);
    EXPECT_EQ(later.out("p").blocks.size(),
              static_cast<size_t>(later.pool_->layout().BlocksFor(
                  150 + static_cast<int64_t>(later.out("p").tokens.size()) - 1)));
    for (int32_t c = 0; c < 2; ++c) {
      EXPECT_EQ(later.out("two", c).finish, FinishReason::kLength);
      EXPECT_EQ(later.out("two", c).tokens.size(), 12u);
    }
    later.engine_->ReleaseHandoff("p");
    later.Drain();
    EXPECT_EQ(later.held_blocks(), 0);
  }

  // A mixture of experts counts the tokens each expert received: experts_per_token per token of
  // its one sparse layer (the prompt's 150 and the 23 decoded after the first token).
  const auto& experts = alone.engine_->stats().expert_tokens;
  if (variant.experts > 0) {
    ASSERT_EQ(experts.size(), static_cast<size_t>(variant.experts));
    int64_t total = 0;
    for (int64_t n : experts) total += n;
    EXPECT_EQ(total, variant.experts_per_token * (150 + max_tokens - 1));
  } else {
    EXPECT_TRUE(experts.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, EngineDeterminismTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3, 4, 5), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(kVariants[std::get<0>(info.param)].name) +
                                  (std::get<1>(info.param) ? "_sampled" : "_greedy");
                         });

TEST(EngineTest, PreemptionUnderKvPressureGivesTheSameOutput) {
  for (const SyntheticVariant& variant : kVariants) {
    EngineOptions options;
    options.prefill_chunk = 64;
    options.max_batch_tokens = 256;
    options.prefix_cache_bytes = 0;  // nothing kept: recompute from scratch
    options.window_cache_bytes = 0;
    // Alone, with room to spare.
    std::vector<Output> want;
    for (int i = 0; i < 4; ++i) {
      Harness alone = Make(variant, 64, options);
      ASSERT_TRUE(
          alone.Submit(Req("r" + std::to_string(i), Prompt(40 + i, 50 + i), 40, i % 2)).ok());
      alone.Drain();
      want.push_back(alone.out("r" + std::to_string(i)));
    }
    // Four requests that need 6 blocks each at the end, in a pool of 12.
    Harness tight = Make(variant, 12, options);
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(
          tight.Submit(Req("r" + std::to_string(i), Prompt(40 + i, 50 + i), 40, i % 2)).ok());
    }
    tight.Drain();
    EXPECT_GT(tight.engine_->stats().preemptions, 0) << variant.name;
    for (int i = 0; i < 4; ++i) {
      ExpectSame(tight.out("r" + std::to_string(i)), want[i],
                 variant.name + ": preempted " + std::to_string(i));
    }
    EXPECT_EQ(tight.pool_->num_free(), tight.pool_->num_blocks()) << variant.name;
    if (tight.window_pool_ != nullptr) {
      EXPECT_EQ(tight.window_pool_->num_free(), tight.window_pool_->num_blocks());
    }
  }
}

TEST(EngineTest, AWindowPoolHoldsOnlyTheWindowAndChangesNoBit) {
  const SyntheticVariant& variant = kVariants[4];  // window 24 on layer 0
  ASSERT_TRUE(TwoPools(variant));
  EngineOptions options;
  options.prefill_chunk = 16;
  options.max_batch_tokens = 64;
  struct Case {
    std::string id;
    int64_t prompt;
    int32_t n;
  };
  const std::vector<Case> cases = {{"a", 150, 1}, {"b", 120, 1}, {"c", 90, 1}, {"n3", 37, 3}};
  auto submit_all = [&](Harness& h) {
    for (size_t i = 0; i < cases.size(); ++i) {
      EngineRequest r = Req(cases[i].id, Prompt(cases[i].prompt, 30 + i), 40, i % 2 == 1);
      r.n = cases[i].n;
      if (r.n > 1) r.sampling = Req("", {}, 1, true).sampling;
      ASSERT_TRUE(h.Submit(std::move(r)).ok());
    }
  };
  Harness one(variant, 64, options);  // every layer in one pool
  submit_all(one);
  one.Drain();

  const int64_t per = Engine::WindowBlocksPerSequence(*one.model_, options, 16);
  EXPECT_EQ(per, 4);  // ceil((24 - 2 + 16) / 16) + 1
  // Room for the windows of all six sequences (n3 has three) with the window cache off and on
  // (on: it fills the pool and gives blocks back under pressure), then room for one sequence's
  // window only (the others wait or are preempted).
  for (const auto& [window_blocks, cache_bytes] : std::vector<std::pair<int64_t, int64_t>>{
           {6 * per, 0}, {6 * per, int64_t{1} << 30}, {per, 0}}) {
    EngineOptions o = options;
    o.window_cache_bytes = cache_bytes;
    Harness two(variant, 64, o, 16, window_blocks);
    submit_all(two);
    two.Drain();
    const std::string what = "window pool of " + std::to_string(window_blocks) + ", cache " +
                             std::to_string(cache_bytes);
    for (const Case& c : cases) {
      for (int32_t choice = 0; choice < c.n; ++choice) {
        ExpectSame(two.out(c.id, choice), one.out(c.id, choice), what + ": " + c.id);
      }
    }
    EXPECT_LE(two.window_peak_, window_blocks) << what;
    if (window_blocks == 6 * per) EXPECT_EQ(two.engine_->stats().preemptions, 0) << what;
    if (cache_bytes > 0) EXPECT_GT(two.engine_->stats().window_cached_blocks, 0) << what;
    two.engine_->ClearPrefixCache();
    two.Drain();
    EXPECT_EQ(two.window_pool_->num_free(), window_blocks) << what;
  }
}

TEST(EngineTest, CreateRefusesPoolsThatDoNotFitTheModel) {
  const SyntheticVariant& hybrid = kVariants[4];
  Harness h(hybrid, 8, EngineOptions{}, 16, 32);
  EngineOptions options;
  options.prefill_chunk = 64;
  // 64-token chunks need ceil((24 - 2 + 64) / 16) + 1 = 7 window blocks.
  auto small = *KvBlockPool::Create(h.model_->WindowKvLayoutFor(16), 6, h.allocator_.get(),
                                    h.backend_.get());
  auto status = Engine::Create(h.model_.get(), h.pool_.get(), nullptr, options, small.get());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.status().message().find("one sequence's window (7 blocks)"), std::string::npos)
      << status.status();
  // One pool of the full layers' layout without a window pool.
  EXPECT_FALSE(Engine::Create(h.model_.get(), h.pool_.get(), nullptr, options).ok());
  // A model without sliding-window layers has no use for a window pool.
  Harness dense(kVariants[0], 8, EngineOptions{});
  EXPECT_FALSE(
      Engine::Create(dense.model_.get(), dense.pool_.get(), nullptr, options, h.window_pool_.get())
          .ok());
  // A decode-only import must bring the window layers' table on a window pool, and only there.
  EngineRequest d = Req("d", Prompt(40, 1), 4, false);
  d.role = EngineRole::kDecodeOnly;
  d.imported_blocks = *h.pool_->Allocate(3);
  SamplerState state;
  state.Observe(5);
  d.resume = {ResumePoint{{5}, state, ""}};
  EXPECT_EQ(h.engine_->Submit(d).code(), absl::StatusCode::kInvalidArgument);
  d.imported_window_blocks = {kNoBlock, kNoBlock, kNoBlock};  // the window (17..) is missing
  EXPECT_EQ(h.engine_->Submit(d).code(), absl::StatusCode::kInvalidArgument);
  d.imported_window_blocks = *h.window_pool_->Allocate(3);
  d.imported_window_blocks[0] = kNoBlock;  // before the window: may be gone
  EXPECT_TRUE(h.Submit(d).ok());
  h.Drain();
  EXPECT_EQ(h.out("d").tokens.size(), 3u);
  d.imported_blocks = *dense.pool_->Allocate(3);
  EXPECT_EQ(dense.engine_->Submit(d).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(dense.pool_->Release(d.imported_blocks).ok());
}

TEST(EngineTest, AbortAtAnyPointFreesEveryBlock) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  for (int steps_before_abort : {0, 1, 3, 9}) {
    EngineOptions options;
    options.prefill_chunk = 16;
    Harness h(variant, 64, options);
    for (int i = 0; i < 5; ++i) {
      EngineRequest r = Req("r" + std::to_string(i), Prompt(30 + 10 * i, i), 50, false);
      r.n = i == 2 ? 3 : 1;
      ASSERT_TRUE(h.Submit(std::move(r)).ok());
    }
    for (int s = 0; s < steps_before_abort; ++s) ASSERT_TRUE(h.engine_->Step().ok());
    for (int i = 0; i < 5; ++i) h.engine_->Abort("r" + std::to_string(i));
    h.Drain();
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(h.out("r" + std::to_string(i)).finish, FinishReason::kAbort) << steps_before_abort;
    }
    h.engine_->ClearPrefixCache();
    h.Drain();
    EXPECT_EQ(h.pool_->num_free(), h.pool_->num_blocks()) << "after " << steps_before_abort;
    EXPECT_EQ(h.engine_->stats().running + h.engine_->stats().waiting, 0);
    // The ids are free again.
    EXPECT_TRUE(h.Submit(Req("r0", Prompt(5, 1), 1, false)).ok());
  }
}

TEST(EngineTest, LongRequestIsNotStarvedByAFloodOfShortOnes) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  EngineOptions options;
  options.prefill_chunk = 32;
  options.max_batch_tokens = 64;
  options.max_running = 8;
  Harness h(variant, 256, options);
  ASSERT_TRUE(h.Submit(Req("long", Prompt(300, 3), 4, false)).ok());
  int next = 0;
  for (int step = 0; step < 60; ++step) {
    for (int j = 0; j < 3; ++j) {
      ASSERT_TRUE(h.Submit(Req("s" + std::to_string(next++), Prompt(8, next), 3, false)).ok());
    }
    ASSERT_TRUE(h.engine_->Step().ok());
    ++h.steps_;
  }
  // 300 tokens at up to 32 per step: its first token within ~10 steps despite the flood.
  EXPECT_EQ(h.out("long").tokens.size(), 4u);
  EXPECT_LE(h.out("long").first_token_step, 12);
  h.Drain();
}

TEST(EngineTest, ChoicesDifferUnderOneSeedAndChoiceZeroIsTheSingleRequest) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness h(variant, 64, EngineOptions{});
  EngineRequest r = Req("n4", Prompt(37, 9), 12, true);
  r.n = 4;
  ASSERT_TRUE(h.Submit(std::move(r)).ok());
  ASSERT_TRUE(h.Submit(Req("n1", Prompt(37, 9), 12, true)).ok());
  h.Drain();
  ExpectSame(h.out("n4", 0), h.out("n1", 0), "choice 0");
  std::set<std::vector<TokenId>> distinct;
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(h.out("n4", c).tokens.size(), 12u);
    distinct.insert(h.out("n4", c).tokens);
  }
  EXPECT_EQ(distinct.size(), 4u);
  h.engine_->ClearPrefixCache();
  h.Drain();
  EXPECT_EQ(h.pool_->num_free(), h.pool_->num_blocks());
}

TEST(EngineTest, EventsCarryLogprobsOfTheLogitsTheTokenCameFrom) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness h(variant, 64, EngineOptions{});
  std::vector<TokenEvent> events;
  EngineRequest r = Req("lp", Prompt(30, 8), 6, true);
  r.sampling.top_logprobs = 3;
  r.keep_logits = true;
  r.on_event = [&](const TokenEvent& e) { events.push_back(e); };
  ASSERT_TRUE(h.engine_->Submit(std::move(r)).ok());
  h.Drain();
  ASSERT_EQ(events.size(), 6u);
  for (const TokenEvent& e : events) {
    ASSERT_TRUE(e.has_token);
    // log-softmax of the raw logits, in double.
    double max = -1e300, sum = 0;
    for (float v : e.logits) max = std::max(max, double{v});
    for (float v : e.logits) sum += std::exp(v - max);
    auto lp = [&](TokenId t) { return e.logits[t] - max - std::log(sum); };
    EXPECT_NEAR(e.logprob, lp(e.token), 1e-5);
    ASSERT_EQ(e.top_logprobs.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(e.top_logprobs[i].second, lp(e.top_logprobs[i].first), 1e-5);
      if (i > 0) EXPECT_GE(e.top_logprobs[i - 1].second, e.top_logprobs[i].second);
    }
    for (size_t t = 0; t < e.logits.size(); ++t) {
      EXPECT_LE(lp(static_cast<TokenId>(t)), e.top_logprobs[0].second + 1e-6);
    }
  }
  EXPECT_EQ(events.back().finish, FinishReason::kLength);
}

// Greedy rows whose logits nothing else reads are chosen by the backend (Backend::ArgMaxRows):
// the same tokens as the sampler's choice from the logits, alone or beside rows that need them.
TEST(EngineTest, GreedyTokensTheBackendChoosesAreTheSamplersOwn) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness h(variant, 64, EngineOptions{});
  // Kept logits: the sampler chooses from them (and they show what it chose from).
  std::vector<TokenEvent> kept;
  EngineRequest with_logits = Req("kept", Prompt(30, 9), 8, false);
  with_logits.keep_logits = true;
  with_logits.on_event = [&](const TokenEvent& e) { kept.push_back(e); };
  // The same request, greedy and nothing else: its tokens come from the backend.
  std::vector<TokenId> tokens;
  EngineRequest plain = Req("plain", Prompt(30, 9), 8, false);
  plain.on_event = [&](const TokenEvent& e) {
    if (e.has_token) tokens.push_back(e.token);
  };
  ASSERT_TRUE(h.engine_->Submit(std::move(with_logits)).ok());
  ASSERT_TRUE(h.engine_->Submit(std::move(plain)).ok());
  // After it in the batch, another row whose logits come back: the same bits as alone.
  ASSERT_TRUE(h.Submit(Req("after", Prompt(30, 10), 8, false)).ok());
  h.Drain();
  Harness alone(variant, 64, EngineOptions{});
  ASSERT_TRUE(alone.Submit(Req("after", Prompt(30, 10), 8, false)).ok());
  alone.Drain();
  ExpectSame(h.out("after"), alone.out("after"), "after, beside a backend-greedy row");
  ASSERT_EQ(kept.size(), 8u);
  ASSERT_EQ(tokens.size(), 8u);
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].token, tokens[i]) << i;
    EXPECT_EQ(kept[i].token, ArgMax(kept[i].logits)) << i;
  }
  // Every step's row of "plain" (8 tokens), none of "kept"'s.
  EXPECT_EQ(h.engine_->stats().greedy_rows_on_backend, 8);
}

TEST(EngineTest, StopTokensAndValidation) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness h(variant, 64, EngineOptions{});
  ASSERT_TRUE(h.Submit(Req("free", Prompt(20, 4), 8, false)).ok());
  h.Drain();
  const TokenId third = h.out("free").tokens[2];
  EngineRequest r = Req("stop", Prompt(20, 4), 8, false);
  r.stop_token_ids = {third};
  ASSERT_TRUE(h.Submit(std::move(r)).ok());
  h.Drain();
  const auto& got = h.out("stop").tokens;
  EXPECT_EQ(got.back(), third);
  EXPECT_LE(got.size(), 3u);
  EXPECT_EQ(h.out("stop").finish, FinishReason::kStop);

  auto bad = [&](auto mutate) {
    EngineRequest q = Req("bad", Prompt(5, 1), 4, false);
    mutate(q);
    return h.engine_->Submit(std::move(q));
  };
  EXPECT_EQ(bad([](EngineRequest& q) { q.prompt.clear(); }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(bad([](EngineRequest& q) { q.prompt[0] = 97; }).ok());
  EXPECT_FALSE(bad([](EngineRequest& q) { q.n = 0; }).ok());
  EXPECT_FALSE(bad([](EngineRequest& q) { q.max_tokens = 0; }).ok());
  EXPECT_FALSE(bad([](EngineRequest& q) { q.sampling.top_p = 2; }).ok());
  EXPECT_FALSE(bad([](EngineRequest& q) { q.stop = {"x"}; }).ok());  // no tokenizer
  EXPECT_FALSE(bad([](EngineRequest& q) { q.prompt.assign(600, 1); }).ok());
  EXPECT_FALSE(bad([](EngineRequest& q) {
                 q.resume = {ResumePoint{{1, 2}, SamplerState(), ""}};
               }).ok());
  EXPECT_FALSE(bad([](EngineRequest& q) { q.role = EngineRole::kDecodeOnly; }).ok());
  EXPECT_FALSE(bad([](EngineRequest& q) { q.id.clear(); }).ok());
  ASSERT_TRUE(h.Submit(Req("dup", Prompt(5, 1), 4, false)).ok());
  EXPECT_EQ(h.Submit(Req("dup", Prompt(5, 1), 4, false)).code(), absl::StatusCode::kAlreadyExists);
  h.Drain();
}

class EngineSplitTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(EngineSplitTest, SeveralChoicesASubsetAndAResumedChoiceSplitExactly) {
  const SyntheticVariant& variant = kVariants[std::get<0>(GetParam())];
  const bool sampled = std::get<1>(GetParam());
  const std::vector<TokenId> prompt = Prompt(100, 11);  // 6 full blocks and a partial one
  const int64_t max_tokens = 12;
  const int32_t n = 3;
  EngineOptions options;
  auto request = [&](EngineRole role) {
    EngineRequest r = Req("r", prompt, max_tokens, sampled);
    r.n = n;
    r.role = role;
    return r;
  };
  Harness alone = Make(variant, 64, options);
  ASSERT_TRUE(alone.Submit(request(EngineRole::kPrefillAndDecode)).ok());
  alone.Drain();

  // Prefill-only with n = 3: one prompt computation, every choice's first token, one table.
  Harness prefill = Make(variant, 64, options);
  ASSERT_TRUE(prefill.Submit(request(EngineRole::kPrefillOnly)).ok());
  prefill.Drain();
  const std::vector<BlockId> table = prefill.out("r", 0).blocks;
  ASSERT_EQ(table.size(), 7u);
  for (int32_t c = 0; c < n; ++c) {
    const Output& first = prefill.out("r", c);
    ASSERT_EQ(first.finish, FinishReason::kHandoff) << c;
    ASSERT_EQ(first.tokens.size(), 1u);
    EXPECT_EQ(first.tokens[0], alone.out("r", c).tokens[0]) << c;
    EXPECT_EQ(first.blocks, table) << "every choice names the request's table";
  }
  EXPECT_EQ(prefill.engine_->stats().prompt_tokens_computed, 100);
  EXPECT_TRUE(prefill.engine_->IsLive("r"));
  const std::vector<BlockId> window_table = prefill.out("r", 0).window_blocks;

  // Decode-only, all three choices from the one imported table; then only choice 2.
  for (const std::vector<int32_t>& run : {std::vector<int32_t>{0, 1, 2}, {2}}) {
    Harness decode = Make(variant, 64, options);
    EngineRequest d = request(EngineRole::kDecodeOnly);
    d.imported_blocks = MoveBlocks(*prefill.pool_, *decode.pool_, table);
    if (TwoPools(variant)) {
      d.imported_window_blocks =
          MoveBlocks(*prefill.window_pool_, *decode.window_pool_, window_table);
    }
    for (int32_t c : run) {
      const Output& first = prefill.out("r", c);
      d.resume.push_back(ResumePoint{first.tokens, first.sampler_state, "", c});
    }
    ASSERT_TRUE(decode.Submit(std::move(d)).ok());
    decode.Drain();
    for (int32_t c = 0; c < n; ++c) {
      const bool ran = std::find(run.begin(), run.end(), c) != run.end();
      if (!ran) {
        EXPECT_EQ(decode.outputs_.count({"r", c}), 0u) << "choice " << c << " was not resumed";
        continue;
      }
      Output joined = prefill.out("r", c);
      joined.tokens.insert(joined.tokens.end(), decode.out("r", c).tokens.begin(),
                           decode.out("r", c).tokens.end());
      joined.logits.insert(joined.logits.end(), decode.out("r", c).logits.begin(),
                           decode.out("r", c).logits.end());
      ExpectSame(joined, alone.out("r", c), "split, choice " + std::to_string(c));
    }
    decode.engine_->ClearPrefixCache();
    decode.Drain();
    EXPECT_EQ(decode.pool_->num_free(), decode.pool_->num_blocks());
  }
  prefill.engine_->ReleaseHandoff("r");
  prefill.Drain();
  EXPECT_FALSE(prefill.engine_->IsLive("r"));
  EXPECT_EQ(prefill.held_blocks(), 0);

  // A choice resumed on the prefill side (after 5 tokens): the handoff covers the prompt and
  // those 5, the decode side continues after the 6th.
  const Output& want = alone.out("r", 1);
  const int64_t k = 5;
  SamplerState after_k;
  for (int64_t i = 0; i < k; ++i) after_k.Observe(want.tokens[i]);
  EngineRequest p = request(EngineRole::kPrefillOnly);
  p.resume = {ResumePoint{{want.tokens.begin(), want.tokens.begin() + k}, after_k, "", 1}};
  ASSERT_TRUE(prefill.Submit(std::move(p)).ok());
  prefill.Drain();
  const Output& sixth = prefill.out("r", 1);
  ASSERT_EQ(sixth.finish, FinishReason::kHandoff);
  ASSERT_EQ(sixth.tokens.size(), 2u);  // (the 1st from before, then the 6th)
  EXPECT_EQ(sixth.tokens[1], want.tokens[k]);
  ASSERT_EQ(sixth.blocks.size(), static_cast<size_t>(prefill.pool_->layout().BlocksFor(100 + k)));
  Harness decode = Make(variant, 64, options);
  EngineRequest d = request(EngineRole::kDecodeOnly);
  d.imported_blocks = MoveBlocks(*prefill.pool_, *decode.pool_, sixth.blocks);
  if (TwoPools(variant)) {
    d.imported_window_blocks =
        MoveBlocks(*prefill.window_pool_, *decode.window_pool_, sixth.window_blocks);
  }
  d.resume = {
      ResumePoint{{want.tokens.begin(), want.tokens.begin() + k + 1}, sixth.sampler_state, "", 1}};
  // Blocks for the prompt alone are refused: they do not cover the 5 tokens.
  EngineRequest short_table = d;
  short_table.imported_blocks.pop_back();
  EXPECT_EQ(decode.engine_->Submit(short_table).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(decode.Submit(std::move(d)).ok());
  decode.Drain();
  std::vector<TokenId> joined(want.tokens.begin(), want.tokens.begin() + k + 1);
  joined.insert(joined.end(), decode.out("r", 1).tokens.begin(), decode.out("r", 1).tokens.end());
  EXPECT_EQ(joined, want.tokens);
  prefill.engine_->Abort("r");  // Abort releases a handoff too
  prefill.Drain();
  EXPECT_FALSE(prefill.engine_->IsLive("r"));
  EXPECT_EQ(prefill.held_blocks(), 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, EngineSplitTest,
                         ::testing::Combine(::testing::Range(0, 6), ::testing::Bool()));

TEST(EngineTest, AnIdIsFreeFromItsLastFinishEventOn) {
  Harness h(kVariants[0], 64, EngineOptions());
  EngineRequest r = Req("r", Prompt(20, 7), 3, false);
  r.n = 2;
  std::vector<bool> live_at_finish;
  ASSERT_TRUE(h.Submit(std::move(r)).ok());
  // Whether the id was live when each choice's finish came.
  EngineRequest probe = Req("probe", Prompt(20, 8), 3, false);
  probe.n = 2;
  probe.on_event = [&](const TokenEvent& e) {
    if (e.finish != FinishReason::kNone) live_at_finish.push_back(h.engine_->IsLive("probe"));
  };
  ASSERT_TRUE(h.engine_->Submit(std::move(probe)).ok());
  h.Drain();
  // Live while a choice runs; free by the time the last finish event is seen.
  ASSERT_EQ(live_at_finish.size(), 2u);
  EXPECT_TRUE(live_at_finish[0]);
  EXPECT_FALSE(live_at_finish[1]);
  EXPECT_FALSE(h.engine_->IsLive("r"));
  EXPECT_EQ(h.out("r", 0).tokens.size(), 3u);
  EXPECT_EQ(h.out("r", 1).tokens.size(), 3u);
  ASSERT_TRUE(h.Submit(Req("r", Prompt(20, 7), 3, false)).ok()) << "the id is reusable";
  h.Drain();
}

TEST(EngineTest, EventsSayHowLongTheRequestWaitedForAdmission) {
  FakeClock clock;
  EngineOptions options;
  options.clock = &clock;
  options.max_running = 1;
  Harness h(kVariants[0], 64, options);
  ASSERT_TRUE(h.Submit(Req("a", Prompt(40, 1), 4, false)).ok());
  ASSERT_TRUE(h.Submit(Req("b", Prompt(40, 2), 4, false)).ok());
  clock.Advance(absl::Seconds(2));
  ASSERT_TRUE(h.engine_->Step().ok());  // admits a; b waits for a's slot
  clock.Advance(absl::Seconds(3));
  h.Drain();
  EXPECT_EQ(h.out("a").queued, absl::Seconds(2));
  EXPECT_EQ(h.out("b").queued, absl::Seconds(5));
  ASSERT_EQ(h.out("b").tokens.size(), 4u);
}

TEST(EngineTest, AHandoffNobodyReleasesIsFreedAfterItsTtl) {
  FakeClock clock;
  EngineOptions options;
  options.clock = &clock;
  options.handoff_ttl = absl::Seconds(30);
  Harness h(kVariants[0], 16, options);
  EngineRequest p = Req("p", Prompt(40, 3), 8, false);
  p.role = EngineRole::kPrefillOnly;
  ASSERT_TRUE(h.Submit(std::move(p)).ok());
  h.Drain();
  ASSERT_EQ(h.out("p").finish, FinishReason::kHandoff);
  EXPECT_EQ(h.pool_->num_free(), 16 - 3);  // its 3 blocks (2 full ones also in the cache)
  EXPECT_EQ(h.Submit(Req("p", Prompt(40, 3), 8, false)).code(), absl::StatusCode::kAlreadyExists)
      << "the id stays live while its handoff is held";
  clock.Advance(absl::Seconds(29));
  h.Drain();
  EXPECT_EQ(h.pool_->num_free(), 16 - 3);
  clock.Advance(absl::Seconds(1));
  h.Drain();
  EXPECT_EQ(h.held_blocks(), 0);
  EXPECT_FALSE(h.engine_->IsLive("p"));
  h.engine_->ReleaseHandoff("p");  // late: nothing
  h.Drain();
  EXPECT_EQ(h.held_blocks(), 0);
  // With max_tokens 1 nothing is handed off: the request ends and its blocks go.
  EngineRequest one = Req("one", Prompt(40, 4), 1, false);
  one.role = EngineRole::kPrefillOnly;
  one.n = 2;
  ASSERT_TRUE(h.Submit(std::move(one)).ok());
  h.Drain();
  EXPECT_EQ(h.out("one", 0).finish, FinishReason::kLength);
  EXPECT_EQ(h.out("one", 1).finish, FinishReason::kLength);
  EXPECT_FALSE(h.engine_->IsLive("one"));
  EXPECT_EQ(h.held_blocks(), 0);
}

TEST(EngineTest, StreamedKvNamesCompleteBlocksThatNeverChangeAgain) {
  EngineOptions options;
  options.prefill_chunk = 24;  // 100 tokens in 5 steps: 24, 48, 72, 96, 100
  Harness h(kVariants[1], 64, options);
  const size_t block_bytes = h.pool_->layout().block_bytes();
  struct Progress {
    std::vector<BlockId> blocks;
    std::vector<char> bytes;  // as they were when reported
  };
  std::vector<Progress> progress;
  std::vector<BlockId> table;
  auto submit = [&](const std::string& id, bool stream) {
    EngineRequest r = Req(id, Prompt(100, 5), 8, false);
    r.role = EngineRole::kPrefillOnly;
    r.stream_kv = stream;
    r.on_event = [&](const TokenEvent& e) {
      if (e.finish == FinishReason::kHandoff) table = e.blocks;
      if (e.has_token || e.finish != FinishReason::kNone) return;
      Progress p{e.blocks, std::vector<char>(e.blocks.size() * block_bytes)};
      ASSERT_TRUE(h.pool_->ExportToHost(p.blocks, p.bytes.data(), p.bytes.size()).ok());
      progress.push_back(std::move(p));
    };
    ASSERT_TRUE(h.engine_->Submit(std::move(r)).ok());
    h.Drain();
  };
  submit("plain", false);
  EXPECT_TRUE(progress.empty()) << "no progress events without stream_kv";
  h.engine_->ReleaseHandoff("plain");
  h.engine_->ClearPrefixCache();
  h.Drain();

  submit("streamed", true);
  ASSERT_EQ(table.size(), 7u);
  ASSERT_EQ(progress.size(), 4u) << "one per step that completed blocks, none for the last";
  const size_t want[] = {1, 3, 4, 6};
  std::vector<char> now(table.size() * block_bytes);
  ASSERT_TRUE(h.pool_->ExportToHost(table, now.data(), now.size()).ok());
  for (size_t i = 0; i < progress.size(); ++i) {
    ASSERT_EQ(progress[i].blocks.size(), want[i]) << i;
    EXPECT_TRUE(std::equal(progress[i].blocks.begin(), progress[i].blocks.end(), table.begin()))
        << "a prefix of the handed-off table";
    EXPECT_EQ(0, std::memcmp(progress[i].bytes.data(), now.data(), progress[i].bytes.size()))
        << "the KV of blocks reported complete never changes";
  }
  h.engine_->ReleaseHandoff("streamed");
  h.Drain();

  // A cached prefix (6 of the 7 blocks) is complete at the admission: one progress event names
  // it before the one step left computes the last block and hands off.
  progress.clear();
  submit("cached", true);
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_EQ(progress[0].blocks.size(), 6u);
  EXPECT_EQ(table.size(), 7u);
  EXPECT_TRUE(std::equal(progress[0].blocks.begin(), progress[0].blocks.end(), table.begin()));
  h.engine_->ReleaseHandoff("cached");
  h.Drain();
  EXPECT_EQ(h.held_blocks(), 0);
}

TEST(EngineTest, ASequenceThatOutgrowsThePoolEndsWithAnErrorNotAHang) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness h(variant, 4, EngineOptions{});  // 64 positions in all
  ASSERT_TRUE(h.Submit(Req("big", Prompt(40, 2), 100, false)).ok());
  h.Drain();
  EXPECT_EQ(h.out("big").finish, FinishReason::kError);
  EXPECT_EQ(h.out("big").tokens.size(), 64u - 40u + 1);  // from positions 39..63
  h.engine_->ClearPrefixCache();
  h.Drain();
  EXPECT_EQ(h.pool_->num_free(), h.pool_->num_blocks());
}

TEST(EngineTest, TheEngineThreadServesConcurrentSubmitters) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness h(variant, 64, EngineOptions{});
  Harness ref(variant, 64, EngineOptions{});
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(ref.Submit(Req("t" + std::to_string(i), Prompt(25 + i, 20 + i), 9, i % 2)).ok());
  }
  ref.Drain();
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::map<std::string, std::vector<TokenId>> got;
  h.engine_->Start();
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      EngineRequest r = Req("t" + std::to_string(i), Prompt(25 + i, 20 + i), 9, i % 2);
      r.on_event = [&, i](const TokenEvent& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (e.has_token) got["t" + std::to_string(i)].push_back(e.token);
        if (e.finish != FinishReason::kNone) {
          ++finished;
          cv.notify_all();
        }
      };
      ASSERT_TRUE(h.engine_->Submit(std::move(r)).ok());
    });
  }
  for (auto& t : clients) t.join();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished == 6; }));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(got["t" + std::to_string(i)], ref.out("t" + std::to_string(i)).tokens);
  }
  lock.unlock();
  h.engine_->Stop();
}

// What a service posts to an idle engine thread is served without other work to wake it: a
// drain's pre-copy asks for a request's blocks (HoldComputedBlocks) after the engine has run out
// of requests, and a service caches blocks (CacheBlocks) on a worker that has nothing to run.
TEST(EngineTest, AnIdleEngineThreadServesHoldsAndCaches) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness h(variant, 64, EngineOptions{});
  h.engine_->Start();
  // A hold of a request the engine does not run: NotFound, from the engine thread.
  auto hold = [&](const std::string& what) {
    absl::Notification held;
    absl::Status status = absl::UnknownError("not run");
    h.engine_->HoldComputedBlocks("gone", 1, [&](absl::StatusOr<std::vector<BlockId>> got) {
      status = got.status();
      held.Notify();
    });
    ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(30))) << what;
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << what;
  };
  for (int round = 0; round < 3; ++round) hold(absl::StrCat("hold ", round));
  // Two blocks into the prefix cache with nothing else posted. The holds after it are served
  // by the same pass and the next: by the second's answer, the first pass has published.
  absl::StatusOr<std::vector<BlockId>> blocks = h.pool_->Allocate(2);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  h.engine_->CacheBlocks(Chain(*h.model_, Prompt(32, 3), 2), *blocks);
  hold("the hold after the cache");
  hold("the next hold");
  EXPECT_EQ(h.engine_->stats().cached_blocks, 2);
  h.engine_->Stop();
}

TEST(EngineTest, TheModelsEndOfSequenceStopsUnlessIgnoredAndMinTokensHoldsStopsBack) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness free(variant, 64, EngineOptions{});
  ASSERT_TRUE(free.Submit(Req("free", Prompt(20, 4), 12, false)).ok());
  free.Drain();
  const std::vector<TokenId> want = free.out("free").tokens;
  ASSERT_EQ(want.size(), 12u);
  const TokenId eos = want[3];
  const size_t first_eos = std::find(want.begin(), want.end(), eos) - want.begin();

  Harness h(variant, 64, EngineOptions{}, 16, 0, {eos});
  EXPECT_EQ(h.engine_->eos_token_ids(), std::vector<TokenId>{eos});
  ASSERT_TRUE(h.Submit(Req("eos", Prompt(20, 4), 12, false)).ok());
  EngineRequest ignore = Req("ignore", Prompt(20, 4), 12, false);
  ignore.ignore_eos = true;
  ASSERT_TRUE(h.Submit(std::move(ignore)).ok());
  h.Drain();
  EXPECT_EQ(h.out("eos").finish, FinishReason::kStop);
  EXPECT_TRUE(h.out("eos").stop_token);
  EXPECT_EQ(h.out("eos").tokens,
            std::vector<TokenId>(want.begin(), want.begin() + first_eos + 1));  // eos included
  EXPECT_EQ(h.out("ignore").tokens, want);
  EXPECT_EQ(h.out("ignore").finish, FinishReason::kLength);

  // min_tokens = 6: the end-of-sequence id is not sampled for the first 6 tokens (greedy takes
  // the next best there), and may end the choice from the 7th on.
  EngineRequest min = Req("min", Prompt(20, 4), 40, false);
  min.min_tokens = 6;
  min.keep_logits = true;
  ASSERT_TRUE(h.Submit(std::move(min)).ok());
  h.Drain();
  const Output& got = h.out("min");
  ASSERT_GE(got.tokens.size(), 7u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NE(got.tokens[i], eos) << i;
    // The best token other than eos.
    const std::vector<float>& l = got.logits[i];
    TokenId best = eos == 0 ? 1 : 0;
    for (TokenId t = 0; t < l.size(); ++t) {
      if (t != eos && l[t] > l[best]) best = t;
    }
    EXPECT_EQ(got.tokens[i], best) << i;
  }
  if (got.finish == FinishReason::kStop) EXPECT_EQ(got.tokens.back(), eos);
  EngineRequest bad = Req("bad", Prompt(20, 4), 4, false);
  bad.min_tokens = 5;
  EXPECT_EQ(h.engine_->Submit(std::move(bad)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineTest, HigherPriorityIsAdmittedFirstAndTheQueueIsBounded) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  EngineOptions options;
  options.max_running = 1;
  options.max_queued = 3;
  Harness h(variant, 64, options);
  for (int i = 0; i < 3; ++i) {
    EngineRequest r = Req("p" + std::to_string(i), Prompt(10, i), 2, false);
    r.priority = i;  // p2 first, then p1, then p0
    ASSERT_TRUE(h.Submit(std::move(r)).ok());
  }
  EXPECT_EQ(h.Submit(Req("over", Prompt(10, 9), 2, false)).code(),
            absl::StatusCode::kResourceExhausted);
  h.Drain();
  EXPECT_LT(h.out("p2").first_token_step, h.out("p1").first_token_step);
  EXPECT_LT(h.out("p1").first_token_step, h.out("p0").first_token_step);
  EXPECT_TRUE(h.Submit(Req("later", Prompt(10, 9), 2, false)).ok());  // room again
  h.Drain();
}

TEST(EngineTest, AnAbortBeforeTheForkEndsEveryChoice) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness h(variant, 64, EngineOptions{});
  EngineRequest r = Req("n3", Prompt(30, 3), 8, true);
  r.n = 3;
  ASSERT_TRUE(h.Submit(std::move(r)).ok());
  h.engine_->Abort("n3");
  h.Drain();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(h.out("n3", c).finish, FinishReason::kAbort) << c;
    EXPECT_EQ(h.out("n3", c).finishes, 1) << c;
  }
  EXPECT_FALSE(h.engine_->IsLive("n3"));
  EXPECT_EQ(h.held_blocks(), 0);
}

TEST(EngineTest, EventsAndStatsCountCachedTokensQueuesAndSteps) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  EngineOptions options;
  int64_t steps = 0, prefill = 0, decode = 0;
  options.on_step = [&](const StepInfo& info) {
    ++steps;
    prefill += info.prefill_tokens;
    decode += info.decode_tokens;
    EXPECT_GT(info.seconds, 0);
  };
  Harness h(variant, 64, options);
  const std::vector<TokenId> prompt = Prompt(70, 5);
  ASSERT_TRUE(h.Submit(Req("a", prompt, 5, false)).ok());
  EngineStats queued = h.engine_->stats();
  EXPECT_EQ(queued.waiting, 1);
  EXPECT_EQ(queued.queued_tokens, 70);
  h.Drain();
  EXPECT_EQ(h.out("a").cached_tokens, 0);
  EXPECT_EQ(prefill, 70);
  EXPECT_EQ(decode, 4);
  EXPECT_EQ(steps, h.engine_->stats().steps);
  ASSERT_TRUE(h.Submit(Req("b", prompt, 5, false)).ok());
  ASSERT_TRUE(h.engine_->Step().ok());  // admitted with 4 blocks of 16 from the cache
  const EngineStats running = h.engine_->stats();
  EXPECT_EQ(running.running, 1);
  EXPECT_EQ(running.running_tokens, 71);
  EXPECT_EQ(running.queued_tokens, 0);
  h.Drain();
  EXPECT_EQ(h.out("b").cached_tokens, 64);
  EXPECT_EQ(h.out("b").tokens, h.out("a").tokens);
  const EngineStats done = h.engine_->stats();
  EXPECT_EQ(done.total_blocks, 64);
  EXPECT_GT(done.cached_blocks, 0);
  EXPECT_EQ(done.free_blocks + done.cached_blocks, 64);
  EXPECT_GT(done.busy_seconds, 0);
}

TEST(EngineTest, TheJournalReproducesThePrefixCaches) {
  for (const SyntheticVariant& variant : {kVariants[0], kVariants[4]}) {
    EngineOptions options;
    const size_t block_bytes = Make(variant, 64, EngineOptions{}).pool_->layout().block_bytes();
    options.prefix_cache_bytes = 12 * static_cast<int64_t>(block_bytes);  // evictions too
    Harness h = Make(variant, 64, options);
    const KvEventJournal& journal = h.engine_->kv_events();
    const JournalSnapshot empty = journal.Snapshot();
    EXPECT_TRUE(empty.hashes.empty());
    for (int i = 0; i < 12; ++i) {
      ASSERT_TRUE(h.Submit(Req("r" + std::to_string(i), Prompt(40 + 9 * i, i % 4), 6, false)).ok());
    }
    h.Drain();
    std::set<Hash128> held, window;
    std::vector<JournalEvent> events;
    ASSERT_TRUE(journal.EventsAfter(empty.sequence, 1 << 20, &events));
    bool evicted = false;
    for (const JournalEvent& e : events) {
      std::set<Hash128>& set = e.window ? window : held;
      if (e.kind == KvCacheEvent::Kind::kStored) {
        set.insert(e.hash);
      } else {
        set.erase(e.hash);
        evicted = true;
      }
    }
    EXPECT_TRUE(evicted) << variant.name;
    const JournalSnapshot now = journal.Snapshot();
    EXPECT_EQ(std::vector<Hash128>(held.begin(), held.end()), now.hashes) << variant.name;
    EXPECT_EQ(std::vector<Hash128>(window.begin(), window.end()), now.window_hashes);
    EXPECT_EQ(static_cast<int64_t>(now.hashes.size()), h.engine_->stats().cached_blocks);
    EXPECT_EQ(TwoPools(variant), !now.window_hashes.empty()) << variant.name;
    // The prefix hint agrees with the snapshot: the chain of the last request's prompt.
    const std::vector<TokenId> p = Prompt(40 + 9 * 11, 11 % 4);
    std::vector<Hash128> chain;
    for (int64_t b = 0; b < 8; ++b) {
      chain.push_back(
          NextBlockHash(b == 0 ? RootBlockHash({h.model_->fingerprint(), "", ""}) : chain.back(),
                        absl::MakeConstSpan(p).subspan(b * 16, 16), {}));
    }
    int64_t want = 0;
    while (want < 8 && std::binary_search(now.hashes.begin(), now.hashes.end(), chain[want])) {
      ++want;
    }
    EXPECT_GT(want, 0) << variant.name;  // the most recent blocks stay cached
    EXPECT_EQ(journal.CachedPrefix(chain), want);
    h.engine_->ClearPrefixCache();
    h.Drain();
    EXPECT_TRUE(journal.Snapshot().hashes.empty());
    EXPECT_TRUE(journal.Snapshot().window_hashes.empty());
    EXPECT_EQ(h.engine_->stats().free_blocks, 64);
  }
}

TEST(EngineTest, ReservationsTakeTheCachedPrefixAndBlocksFreedElsewhereWakeTheEngine) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  EngineOptions options;
  Harness h(variant, 12, options);
  const std::vector<TokenId> prompt = Prompt(70, 6);
  ASSERT_TRUE(h.Submit(Req("warm", prompt, 2, false)).ok());
  h.Drain();
  // The request's chain, as the engine computes it.
  const Hash128 root = RootBlockHash({h.model_->fingerprint(), "", ""});
  std::vector<Hash128> chain;
  for (int64_t b = 0; b < 4; ++b) {
    chain.push_back(NextBlockHash(b == 0 ? root : chain.back(),
                                  absl::MakeConstSpan(prompt).subspan(b * 16, 16), {}));
  }
  EXPECT_EQ(h.engine_->kv_events().CachedPrefix(chain), 4);
  absl::StatusOr<KvReservation> got = absl::UnknownError("not run");
  h.engine_->Reserve(chain, 70, [&](absl::StatusOr<KvReservation> r) { got = std::move(r); });
  h.Drain();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->cached_blocks, 4);
  ASSERT_EQ(got->blocks.size(), 5u);  // 70 positions
  EXPECT_TRUE(got->window_blocks.empty());
  // More than the pool can give: refused, nothing held.
  absl::StatusOr<KvReservation> refused;
  h.engine_->Reserve({}, 16 * 13, [&](absl::StatusOr<KvReservation> r) { refused = std::move(r); });
  h.Drain();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(h.engine_->stats().free_blocks, 7);

  // A request that needs the reserved blocks waits for them, on the engine thread, until
  // another thread releases them on the pool.
  absl::StatusOr<KvReservation> all;
  h.engine_->Reserve({}, 16 * 7,  // the 7 blocks left
                     [&](absl::StatusOr<KvReservation> r) { all = std::move(r); });
  h.Drain();
  ASSERT_TRUE(all.ok()) << all.status();
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  EngineRequest r = Req("waits", Prompt(40, 8), 3, false);
  r.on_event = [&](const TokenEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.finish != FinishReason::kNone) finished = true;
    cv.notify_all();
  };
  h.engine_->Start();
  ASSERT_TRUE(h.engine_->Submit(std::move(r)).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_FALSE(cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return finished; }));
  }
  ASSERT_TRUE(h.pool_->Release(all->blocks).ok());
  ASSERT_TRUE(h.pool_->Release(got->blocks).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished; }));
  }
  h.engine_->Stop();
}

TEST(EngineTest, AReservationOnTwoPoolsHoldsTheWindowOnlyAndFeedsADecodeOnlyRequest) {
  const SyntheticVariant& hybrid = kVariants[4];  // window 24
  Harness h(hybrid, 32, EngineOptions{}, 16, 32);
  absl::StatusOr<KvReservation> got = absl::UnknownError("not run");
  h.engine_->Reserve({}, 70, [&](absl::StatusOr<KvReservation> r) { got = std::move(r); });
  h.Drain();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->blocks.size(), 5u);
  // The row at 70 sees positions 47..: blocks 2.. of the window layers.
  EXPECT_EQ(got->window_blocks,
            (std::vector<BlockId>{kNoBlock, kNoBlock, got->window_blocks[2], got->window_blocks[3],
                                  got->window_blocks[4]}));
  for (size_t i = 2; i < 5; ++i) EXPECT_NE(got->window_blocks[i], kNoBlock);
  EXPECT_EQ(h.window_pool_->num_free(), 32 - 3);
  EngineRequest d = Req("d", Prompt(70, 3), 4, false);
  d.role = EngineRole::kDecodeOnly;
  d.imported_blocks = got->blocks;
  d.imported_window_blocks = got->window_blocks;
  SamplerState state;
  state.Observe(5);
  d.resume = {ResumePoint{{5}, state, ""}};
  ASSERT_TRUE(h.Submit(std::move(d)).ok());
  h.Drain();
  EXPECT_EQ(h.out("d").tokens.size(), 3u);
  h.engine_->ClearPrefixCache();
  h.Drain();
  EXPECT_EQ(h.pool_->num_free(), 32);
  EXPECT_EQ(h.window_pool_->num_free(), 32);
}

// Collects what a request offers, each block with a reference of its own (released by the
// destructor), and reads blocks back as a KV store would have them.
class Offered {
 public:
  explicit Offered(KvBlockPool* pool) : pool_(pool) {}
  ~Offered() {
    for (const ComputedBlock& b : blocks_) EXPECT_TRUE(pool_->Release({b.block}).ok());
  }
  std::function<void(absl::Span<const ComputedBlock>)> Sink() {
    return [this](absl::Span<const ComputedBlock> blocks) {
      for (const ComputedBlock& b : blocks) {
        EXPECT_TRUE(pool_->AddRef({b.block}).ok());
        blocks_.push_back(b);
      }
    };
  }
  const std::vector<ComputedBlock>& blocks() const { return blocks_; }
  std::vector<int64_t> indexes() const {
    std::vector<int64_t> out;
    for (const ComputedBlock& b : blocks_) out.push_back(b.index);
    return out;
  }
  // The bytes of the blocks with table indexes [first, end), in order.
  std::vector<char> Bytes(int64_t end, int64_t first = 0) const {
    std::vector<BlockId> ids;
    for (int64_t i = first; i < end; ++i) {
      for (const ComputedBlock& b : blocks_) {
        if (b.index == i) {
          ids.push_back(b.block);
          break;
        }
      }
    }
    EXPECT_EQ(static_cast<int64_t>(ids.size()), end - first);
    std::vector<char> bytes(ids.size() * pool_->layout().block_bytes());
    EXPECT_TRUE(pool_->ExportToHost(ids, bytes.data(), bytes.size()).ok());
    return bytes;
  }

 private:
  KvBlockPool* const pool_;
  std::vector<ComputedBlock> blocks_;
};

TEST(EngineTest, ImportedBlocksAreReusedAndOnlyBlocksComputedHereAreOffered) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  Harness a(variant, 64, EngineOptions{});
  const std::vector<TokenId> prompt = Prompt(100, 21);  // 6 full blocks before its last token
  Offered from_a(a.pool_.get());
  EngineRequest ra = Req("r", prompt, 12, true);
  ra.on_computed_blocks = from_a.Sink();
  ASSERT_TRUE(a.Submit(std::move(ra)).ok());
  a.Drain();
  // Every full block it computed: 112 tokens, 111 positions with KV: blocks 0..5.
  const std::vector<Hash128> chain = Chain(*a.model_, prompt, 6);
  ASSERT_EQ(from_a.indexes(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(from_a.blocks()[i].hash, chain[i]);

  // Another engine imports the first four blocks (a KV store's), computes the rest.
  Harness b(variant, 64, EngineOptions{});
  auto reserved = ReserveImport(b, {chain.begin(), chain.begin() + 4}, 16);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(reserved->cached_blocks, 0);
  ASSERT_EQ(reserved->blocks.size(), 4u);
  EXPECT_TRUE(reserved->window_blocks.empty());
  const std::vector<char> bytes = from_a.Bytes(4);
  ASSERT_TRUE(b.pool_->Import(reserved->blocks, bytes.data(), bytes.size()).ok());
  Offered from_b(b.pool_.get());
  EngineRequest rb = Req("r", prompt, 12, true);
  rb.imported_blocks = reserved->blocks;
  rb.on_computed_blocks = from_b.Sink();
  ASSERT_TRUE(b.Submit(std::move(rb)).ok());
  b.Drain();
  ExpectSame(b.out("r"), a.out("r"), "with an imported prefix");
  EXPECT_EQ(b.out("r").cached_tokens, 64);
  EXPECT_EQ(b.out("r").imported_tokens, 64);
  EXPECT_EQ(from_b.indexes(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(b.engine_->stats().imported_tokens, 64);
  EXPECT_EQ(b.engine_->stats().prompt_tokens_computed, 36);

  // All six are b's own now: a reservation finds them cached and asks for nothing fresh, and an
  // import of cached blocks supplies no token of its own.
  reserved = ReserveImport(b, chain, 16);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(reserved->cached_blocks, 6);
  ASSERT_EQ(reserved->blocks.size(), 6u);
  EngineRequest again = Req("again", prompt, 12, true);
  again.imported_blocks = reserved->blocks;
  again.imported_cached_blocks = 6;
  Offered from_again(b.pool_.get());
  again.on_computed_blocks = from_again.Sink();
  ASSERT_TRUE(b.Submit(std::move(again)).ok());
  b.Drain();
  ExpectSame(b.out("again"), a.out("r"), "cached");
  EXPECT_EQ(b.out("again").cached_tokens, 96);
  EXPECT_EQ(b.out("again").imported_tokens, 0);
  EXPECT_TRUE(from_again.blocks().empty());

  // Bad imports are refused and stay the caller's.
  EngineRequest bad = Req("bad", prompt, 2, false);
  bad.imported_blocks = {0, 1, 2, 3, 4, 5, 6};  // the 7th would hold the last token's block
  EXPECT_EQ(b.engine_->Submit(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.imported_blocks = {63};  // not allocated
  EXPECT_EQ(b.engine_->Submit(bad).code(), absl::StatusCode::kInvalidArgument);

  // A decode-only request offers only the blocks it completes: its first computed position is
  // 100 (the prompt's KV came from the prefill side), so blocks 6 and 7 of 130 tokens.
  EngineRequest p = Req("p", Prompt(100, 22), 30, false);
  p.role = EngineRole::kPrefillOnly;
  ASSERT_TRUE(a.Submit(std::move(p)).ok());
  a.Drain();
  Harness d(variant, 64, EngineOptions{});
  const std::vector<BlockId> imported = MoveBlocks(*a.pool_, *d.pool_, a.out("p").blocks);
  a.engine_->ReleaseHandoff("p");
  EngineRequest dr = Req("p", Prompt(100, 22), 30, false);
  dr.role = EngineRole::kDecodeOnly;
  dr.imported_blocks = imported;
  dr.resume = {ResumePoint{a.out("p").tokens, a.out("p").sampler_state, ""}};
  Offered from_d(d.pool_.get());
  dr.on_computed_blocks = from_d.Sink();
  ASSERT_TRUE(d.Submit(std::move(dr)).ok());
  d.Drain();
  EXPECT_EQ(d.out("p").tokens.size(), 29u);
  EXPECT_EQ(from_d.indexes(), (std::vector<int64_t>{6, 7}));
}

TEST(EngineTest, ImportsAreHeldUntilAdmissionAndLetGoOnAbortOrUnderPressure) {
  const SyntheticVariant variant{"llama_gqa_f32"};
  EngineOptions tiny_cache;
  tiny_cache.prefix_cache_bytes = 0;  // nothing unreferenced stays cached
  const std::vector<TokenId> prompt = Prompt(70, 23), long_prompt = Prompt(150, 24);
  Harness a(variant, 64, tiny_cache);
  Offered from_a(a.pool_.get());
  EngineRequest ra = Req("short", prompt, 8, false);
  ra.on_computed_blocks = from_a.Sink();
  ASSERT_TRUE(a.Submit(std::move(ra)).ok());
  ASSERT_TRUE(a.Submit(Req("long", long_prompt, 20, false)).ok());
  a.Drain();
  const std::vector<Hash128> chain = Chain(*a.model_, prompt, 2);
  const std::vector<char> bytes = from_a.Bytes(2);
  auto import = [&](Harness& h) {
    auto reserved = ReserveImport(h, chain, 8);
    EXPECT_TRUE(reserved.ok()) << reserved.status();
    EXPECT_TRUE(h.pool_->Import(reserved->blocks, bytes.data(), bytes.size()).ok());
    EngineRequest r = Req("short", prompt, 8, false);
    r.imported_blocks = reserved->blocks;
    return r;
  };

  // Held: a cache that keeps nothing unreferenced still has them at the admission.
  Harness b(variant, 64, tiny_cache);
  ASSERT_TRUE(b.Submit(import(b)).ok());
  b.Drain();
  ExpectSame(b.out("short"), a.out("short"), "held imports");
  EXPECT_EQ(b.out("short").imported_tokens, 32);
  EXPECT_EQ(b.pool_->num_free(), 64);

  // Aborted before its admission: nothing stays held.
  EngineRequest gone = import(b);
  gone.id = "gone";
  ASSERT_TRUE(b.Submit(std::move(gone)).ok());
  b.engine_->Abort("gone");
  b.Drain();
  EXPECT_EQ(b.pool_->num_free(), 64);
  EXPECT_EQ(b.engine_->stats().unused_imported_blocks, 2);

  // Pressure: one running request needs every block (11 for 170 positions of 12) while the
  // imports of one that waits hold two: they are let go, and both finish as computed.
  EngineOptions one;
  one.prefix_cache_bytes = 0;
  one.max_running = 1;
  Harness c(variant, 12, one);
  ASSERT_TRUE(c.Submit(Req("long", long_prompt, 20, false)).ok());
  ASSERT_TRUE(c.engine_->Step().ok());  // admitted: 10 blocks
  ASSERT_TRUE(c.Submit(import(c)).ok());
  c.Drain();
  ExpectSame(c.out("long"), a.out("long"), "the running request");
  ExpectSame(c.out("short"), a.out("short"), "the one whose imports were let go");
  EXPECT_EQ(c.out("short").imported_tokens, 0);
  EXPECT_EQ(c.engine_->stats().unused_imported_blocks, 2);
  EXPECT_EQ(c.pool_->num_free(), 12);
}

// Four layers, windows of 24 on layers 0 and 2: an exact replay is 2 x 23 positions.
const SyntheticVariant kHybrid4{
    "hybrid4_window_24", false, false, false, 8, WeightDType::kF32, "bf16", 0, 2, false, 24, 4};

TEST(EngineTest, AnExactReplayAfterTheWindowCacheExpiredChangesNoBit) {
  FakeClock clock;
  EngineOptions options;
  options.clock = &clock;
  options.prefill_chunk = 64;
  Harness h(kHybrid4, 64, options, 16, 64);
  ASSERT_EQ(h.model_->exact_replay_tokens(), 46);
  const std::vector<TokenId> prompt = Prompt(150, 31);
  std::vector<TokenId> longer = prompt;
  for (TokenId t : Prompt(30, 32)) longer.push_back(t);  // 180 tokens: 11 full blocks
  Harness fresh(kHybrid4, 64, options, 16, 64);
  ASSERT_TRUE(fresh.Submit(Req("ref", longer, 12, true)).ok());
  fresh.Drain();

  Offered first(h.pool_.get());
  EngineRequest r = Req("first", prompt, 4, false);
  r.on_computed_blocks = first.Sink();
  ASSERT_TRUE(h.Submit(std::move(r)).ok());
  h.Drain();
  // While the window cache holds the window blocks: a hit, no replay.
  Offered warm_blocks(h.pool_.get());
  r = Req("warm", longer, 12, true);
  r.on_computed_blocks = warm_blocks.Sink();
  ASSERT_TRUE(h.Submit(std::move(r)).ok());
  h.Drain();
  ExpectSame(h.out("warm"), fresh.out("ref"), "window cache hit");
  EXPECT_EQ(h.out("warm").cached_tokens, 144);
  EXPECT_EQ(h.out("warm").replayed_tokens, 0);
  EXPECT_EQ(h.engine_->stats().window_hits, 1);

  // Expired: the full-attention blocks are still cached, the window layers are replayed from
  // 176 - 46.
  clock.Advance(absl::Seconds(181));
  ASSERT_TRUE(h.Submit(Req("replayed", longer, 12, true)).ok());
  h.Drain();
  EXPECT_GT(h.engine_->stats().window_expired_blocks, 0);
  ExpectSame(h.out("replayed"), fresh.out("ref"), "exact replay");
  EXPECT_EQ(h.out("replayed").cached_tokens, 176);
  EXPECT_EQ(h.out("replayed").replayed_tokens, 46);
  EXPECT_FALSE(h.out("replayed").approximate_kv);
  EXPECT_EQ(h.engine_->stats().window_replays, 1);
  EXPECT_EQ(h.engine_->stats().replayed_tokens, 46);

  // A KV store's case: another engine imports only the full-attention blocks and replays.
  Harness b(kHybrid4, 64, options, 16, 64);
  const std::vector<Hash128> chain = Chain(*h.model_, longer, 11);
  auto reserved = ReserveImport(b, chain, 16);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  ASSERT_EQ(reserved->blocks.size(), 11u);
  std::vector<char> bytes = first.Bytes(9), more = warm_blocks.Bytes(11, 9);
  bytes.insert(bytes.end(), more.begin(), more.end());
  ASSERT_TRUE(b.pool_->Import(reserved->blocks, bytes.data(), bytes.size()).ok());
  r = Req("imported", longer, 12, true);
  r.imported_blocks = reserved->blocks;
  ASSERT_TRUE(b.Submit(std::move(r)).ok());
  b.Drain();
  ExpectSame(b.out("imported"), fresh.out("ref"), "imported full-attention KV, exact replay");
  EXPECT_EQ(b.out("imported").imported_tokens, 176);
  EXPECT_EQ(b.out("imported").replayed_tokens, 46);
  b.engine_->ClearPrefixCache();
  b.Drain();
  EXPECT_EQ(b.pool_->num_free(), 64);
  EXPECT_EQ(b.window_pool_->num_free(), 64);
}

TEST(EngineTest, ABoundedReplayIsApproximateSharesNothingAndItsFloorTravelsToTheDecodeSide) {
  FakeClock clock;
  EngineOptions options;
  options.clock = &clock;
  options.swa_replay = EngineOptions::SwaReplay::kBounded;
  options.swa_replay_tokens = 8;
  Harness h(kHybrid4, 96, options, 16, 96);
  EngineOptions exact_options;
  exact_options.clock = &clock;
  Harness exact(kHybrid4, 96, exact_options, 16, 96);
  // Token agreement with the exact replay over many prompts: reported, not asserted (an
  // approximation on a random model).
  int64_t agree = 0, total = 0;
  for (int i = 0; i < 100; ++i) {
    const std::vector<TokenId> prompt = Prompt(120 + i % 40, 100 + i);
    const std::string id = absl::StrCat("p", i);
    for (Harness* e : {&h, &exact}) {
      ASSERT_TRUE(e->Submit(Req(id + "-warm", prompt, 1, false)).ok());
      e->Drain();
    }
    clock.Advance(absl::Seconds(181));
    for (Harness* e : {&h, &exact}) {
      ASSERT_TRUE(e->Submit(Req(id, prompt, 16, false)).ok());
      e->Drain();
      e->engine_->ClearPrefixCache();
      e->Drain();
    }
    const Output& got = h.out(id);
    ASSERT_EQ(got.replayed_tokens, 8) << id;
    ASSERT_TRUE(got.approximate_kv);
    ASSERT_EQ(got.window_floor, (static_cast<int64_t>(prompt.size()) - 1) / 16 * 16 - 8);
    const Output& want = exact.out(id);
    ASSERT_EQ(want.replayed_tokens, 46 < (static_cast<int64_t>(prompt.size()) - 1) / 16 * 16
                                        ? 46
                                        : (static_cast<int64_t>(prompt.size()) - 1) / 16 * 16);
    for (size_t t = 0; t < std::min(got.tokens.size(), want.tokens.size()); ++t) {
      agree += got.tokens[t] == want.tokens[t];
    }
    total += static_cast<int64_t>(std::max(got.tokens.size(), want.tokens.size()));
  }
  std::cout << "bounded replay (8 of 46 positions) vs exact: " << agree << " of " << total
            << " tokens agree (" << 100.0 * agree / total << "%)\n";
  EXPECT_EQ(h.engine_->stats().replayed_tokens, 800);

  // Nothing an approximation computes is cached or offered.
  const std::vector<TokenId> prompt = Prompt(150, 41);
  ASSERT_TRUE(h.Submit(Req("warm", prompt, 1, false)).ok());
  h.Drain();
  clock.Advance(absl::Seconds(181));
  h.Drain();
  const EngineStats before = h.engine_->stats();
  Offered offered(h.pool_.get());
  EngineRequest r = Req("bounded", prompt, 40, false);
  r.on_computed_blocks = offered.Sink();
  ASSERT_TRUE(h.Submit(std::move(r)).ok());
  h.Drain();
  EXPECT_TRUE(offered.blocks().empty());
  EXPECT_EQ(h.engine_->stats().cached_blocks, before.cached_blocks);
  EXPECT_EQ(h.engine_->stats().window_cached_blocks, 0);
  EXPECT_EQ(h.out("bounded").window_floor, 136);

  // Split: the prefill side hands off with the floor, the decode side continues with it: the
  // same tokens as the aggregated run.
  EngineRequest p = Req("split", prompt, 40, false);
  p.role = EngineRole::kPrefillOnly;
  ASSERT_TRUE(h.Submit(std::move(p)).ok());
  h.Drain();
  const Output& handed = h.out("split");
  ASSERT_EQ(handed.finish, FinishReason::kHandoff);
  EXPECT_TRUE(handed.approximate_kv);
  EXPECT_EQ(handed.window_floor, 136);
  Harness d(kHybrid4, 96, EngineOptions{}, 16, 96);
  EngineRequest dr = Req("split", prompt, 40, false);
  dr.role = EngineRole::kDecodeOnly;
  dr.imported_blocks = MoveBlocks(*h.pool_, *d.pool_, handed.blocks);
  dr.imported_window_blocks = MoveBlocks(*h.window_pool_, *d.window_pool_, handed.window_blocks);
  dr.window_floor = handed.window_floor;
  dr.approximate_kv = true;
  dr.resume = {ResumePoint{handed.tokens, handed.sampler_state, ""}};
  h.engine_->ReleaseHandoff("split");
  ASSERT_TRUE(d.Submit(std::move(dr)).ok());
  d.Drain();
  std::vector<TokenId> split = handed.tokens;
  for (TokenId t : d.out("split").tokens) split.push_back(t);
  EXPECT_EQ(split, h.out("bounded").tokens);
  EXPECT_EQ(d.engine_->stats().cached_blocks, 0) << "the decode side shares nothing either";
}

}  // namespace
}  // namespace ferry
