// The worker's proto <-> engine conversions: presence defaults, ranges, the router's view checked
// (fingerprint, block size, block hashes), resume states in both directions, chunks.

#include "services/worker/worker_wire.h"

#include <cstring>

#include "absl/strings/match.h"
#include "engine/common/block_hash.h"
#include "engine/grammar/constraint_cache.h"
#include "gtest/gtest.h"
#include "kvstore/wire.h"

namespace ferry {
namespace {

WireLimits Limits() {
  WireLimits l;
  l.model_fingerprint = Hash128{7, 9};
  l.block_tokens = 4;
  l.max_positions = 64;
  l.vocab_size = 100;
  l.hidden_size = 3;
  return l;
}

v1::TokenizedRequest Request() {
  v1::TokenizedRequest r;
  r.mutable_context()->set_request_id("r1");
  for (uint32_t t : {1, 2, 3, 4, 5, 6, 7, 8, 9}) r.add_prompt_token_ids(t);
  return r;
}

TEST(WorkerWireTest, UnsetFieldsMeanTheDefaultsNotZero) {
  std::vector<int64_t> first;
  auto r = ToEngineRequest(Request(), Limits(), &first);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.temperature, 1.0f);
  EXPECT_EQ(r->sampling.top_p, 1.0f);
  EXPECT_EQ(r->sampling.repetition_penalty, 1.0f);
  EXPECT_EQ(r->sampling.top_logprobs, -1);
  EXPECT_EQ(r->n, 1);
  EXPECT_EQ(r->max_tokens, 64 - 9);  // what the context leaves
  EXPECT_EQ(first, std::vector<int64_t>{0});

  v1::TokenizedRequest q = Request();
  q.mutable_sampling()->set_temperature(0);
  q.mutable_sampling()->set_top_p(0.5f);
  q.mutable_sampling()->set_max_tokens(5);
  q.mutable_sampling()->set_min_tokens(2);
  q.mutable_sampling()->set_n(3);
  q.mutable_sampling()->set_logprobs(true);
  q.mutable_sampling()->set_top_logprobs(4);
  q.mutable_sampling()->set_ignore_eos(true);
  q.mutable_sampling()->add_stop_strings("\n\n");
  q.mutable_sampling()->add_stop_token_ids(3);
  q.mutable_context()->set_priority(5);
  q.mutable_context()->set_cache_salt("tenant");
  r = ToEngineRequest(q, Limits(), &first);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.temperature, 0.0f);
  EXPECT_EQ(r->sampling.top_p, 0.5f);
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_EQ(r->min_tokens, 2);
  EXPECT_EQ(r->n, 3);
  EXPECT_EQ(r->sampling.top_logprobs, 4);
  EXPECT_TRUE(r->ignore_eos);
  EXPECT_EQ(r->stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(r->stop_token_ids, std::vector<TokenId>{3});
  EXPECT_EQ(r->priority, 5);
  EXPECT_EQ(r->cache_salt, "tenant");
  EXPECT_EQ(first.size(), 3u);
}

TEST(WorkerWireTest, BadRequestsAndForeignViewsAreRefused) {
  std::vector<int64_t> first;
  auto code = [&](const v1::TokenizedRequest& q) {
    return ToEngineRequest(q, Limits(), &first).status().code();
  };
  v1::TokenizedRequest q = Request();
  q.mutable_context()->clear_request_id();
  EXPECT_EQ(code(q), absl::StatusCode::kInvalidArgument);
  q = Request();
  q.clear_prompt_token_ids();
  EXPECT_EQ(code(q), absl::StatusCode::kInvalidArgument);
  q = Request();
  q.add_prompt_token_ids(100);
  EXPECT_EQ(code(q), absl::StatusCode::kInvalidArgument);
  q = Request();
  q.mutable_sampling()->set_top_logprobs(3);  // without logprobs
  EXPECT_EQ(code(q), absl::StatusCode::kInvalidArgument);
  q = Request();
  for (int i = 0; i < 60; ++i) q.add_prompt_token_ids(1);  // no room left
  EXPECT_EQ(code(q), absl::StatusCode::kInvalidArgument);

  // The router's view of the model and of the block hashes must be this worker's.
  q = Request();
  q.mutable_model()->mutable_fingerprint()->set_lo(1);
  EXPECT_EQ(code(q), absl::StatusCode::kFailedPrecondition);
  q = Request();
  const std::vector<TokenId> prompt(q.prompt_token_ids().begin(), q.prompt_token_ids().end());
  const std::vector<Hash128> hashes =
      ComputeBlockHashes({Limits().model_fingerprint, "", ""}, prompt, 4);
  ASSERT_EQ(hashes.size(), 2u);
  q.set_block_tokens(4);
  for (const Hash128& h : hashes) {
    v1::Hash128* p = q.add_block_hashes();
    p->set_lo(h.lo);
    p->set_hi(h.hi);
  }
  EXPECT_TRUE(ToEngineRequest(q, Limits(), &first).ok());
  q.mutable_context()->set_cache_salt("other tenant");
  EXPECT_EQ(code(q), absl::StatusCode::kFailedPrecondition);
  q.mutable_context()->clear_cache_salt();
  q.set_block_tokens(8);
  EXPECT_EQ(code(q), absl::StatusCode::kFailedPrecondition);
}

TEST(WorkerWireTest, ResumeStatesCrossBothWays) {
  SamplerState state;
  for (TokenId t : {5, 9, 5}) state.Observe(t);
  v1::SamplerState proto;
  SamplerStateToProto(state, 42, 1, "ST", &proto);
  EXPECT_EQ(proto.seed(), 42u);
  EXPECT_EQ(proto.choice_index(), 1u);
  EXPECT_EQ(proto.output_count(), 3u);
  EXPECT_EQ(proto.stop_string_tail(), "ST");
  auto back = SamplerStateFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, state);

  v1::TokenizedRequest q = Request();
  q.mutable_sampling()->set_seed(42);
  q.mutable_sampling()->set_n(2);
  for (uint32_t c = 0; c < 2; ++c) {
    v1::ResumedChoice* choice = q.mutable_resume()->add_choices();
    for (TokenId t : {5, 9, 5}) choice->add_generated_token_ids(t);
    SamplerStateToProto(state, 42, c, c == 1 ? "ST" : "", choice->mutable_sampler_state());
  }
  std::vector<int64_t> first;
  auto r = ToEngineRequest(q, Limits(), &first);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->resume.size(), 2u);
  EXPECT_EQ(r->resume[1].held_text, "ST");
  EXPECT_EQ(r->resume[0].sampler_state, state);
  EXPECT_EQ(first, (std::vector<int64_t>{3, 3}));
  // A state that does not add up, a wrong seed, a wrong choice index.
  v1::TokenizedRequest bad = q;
  bad.mutable_resume()->mutable_choices(0)->mutable_sampler_state()->set_output_count(4);
  EXPECT_EQ(ToEngineRequest(bad, Limits(), &first).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = q;
  bad.mutable_resume()->mutable_choices(1)->mutable_sampler_state()->set_seed(1);
  EXPECT_FALSE(ToEngineRequest(bad, Limits(), &first).ok());
  bad = q;
  bad.mutable_resume()->mutable_choices(1)->mutable_sampler_state()->set_choice_index(0);
  EXPECT_FALSE(ToEngineRequest(bad, Limits(), &first).ok());
}

TEST(WorkerWireTest, ChunksCarryTokensTextLogprobsAndTheStop) {
  v1::TokenChunk chunk;
  TokenEvent e;
  e.has_token = true;
  e.token = 7;
  e.text = "he";
  e.logprob = -0.5f;
  e.top_logprobs = {{7, -0.5f}, {8, -1.5f}};
  AppendToChunk(e, true, &chunk);
  e.token = 0;  // a stop token with id 0: still reported
  e.text = "";
  e.finish = FinishReason::kStop;
  e.stop_token = true;
  AppendToChunk(e, true, &chunk);
  EXPECT_EQ(chunk.token_ids_size(), 2);
  EXPECT_EQ(chunk.text(), "he");
  ASSERT_EQ(chunk.logprobs_size(), 2);
  EXPECT_EQ(chunk.logprobs(0).top_alternatives_size(), 2);
  EXPECT_EQ(chunk.finish_reason(), v1::FINISH_REASON_STOP);
  ASSERT_TRUE(chunk.has_matched_stop_token_id());
  EXPECT_EQ(chunk.matched_stop_token_id(), 0u);
  v1::TokenChunk plain;
  TokenEvent s;
  s.finish = FinishReason::kStop;
  s.matched_stop = "END";
  AppendToChunk(s, false, &plain);
  EXPECT_FALSE(plain.has_matched_stop_token_id());
  EXPECT_EQ(plain.matched_stop_string(), "END");
  EXPECT_EQ(plain.logprobs_size(), 0);
}

// An image over placeholders [start, start + rows) with inline rows of width `cols`, value
// v = row * 10 + col.
v1::PromptImage InlineImage(uint32_t start, uint32_t rows, uint32_t cols, uint64_t hash) {
  v1::PromptImage image;
  kv::HashToProto(Hash128{hash, hash + 1}, image.mutable_content_hash());
  image.set_placeholder_start(start);
  image.set_placeholder_length(rows);
  image.set_embedding_rows(rows);
  image.set_embedding_cols(cols);
  std::string bytes;
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t c = 0; c < cols; ++c) {
      const float f = static_cast<float>(r * 10 + c);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<char>(u >> (8 * k)));
    }
  }
  image.set_embeddings(bytes);
  return image;
}

TEST(WorkerWireTest, InlineImageEmbeddingsBecomeTheEnginesImagesAndEnterTheBlockHashes) {
  v1::TokenizedRequest q = Request();
  *q.add_images() = InlineImage(1, 2, 3, 40);
  *q.add_images() = InlineImage(5, 4, 3, 50);  // ends at the prompt's last token
  std::vector<int64_t> first;
  auto r = ToEngineRequest(q, Limits(), &first);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->images.size(), 2u);
  EXPECT_EQ(r->images[1].placeholder_start, 5);
  EXPECT_EQ(r->images[1].placeholder_length, 4);
  EXPECT_EQ(r->images[1].content_hash, (Hash128{50, 51}));
  EXPECT_EQ(*r->images[1].embeddings,
            (std::vector<float>{0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32}));
  // The router's block hashes must cover the images; text-only ones are another prefix's.
  const std::vector<TokenId> prompt(q.prompt_token_ids().begin(), q.prompt_token_ids().end());
  const std::vector<Hash128> with =
      ComputeBlockHashes({Limits().model_fingerprint, "", ""}, prompt, 4,
                         {{Hash128{40, 41}, 1, 2}, {Hash128{50, 51}, 5, 4}});
  q.set_block_tokens(4);
  for (const Hash128& h : with) kv::HashToProto(h, q.add_block_hashes());
  EXPECT_TRUE(ToEngineRequest(q, Limits(), &first).ok());
  q.clear_block_hashes();
  for (const Hash128& h : ComputeBlockHashes({Limits().model_fingerprint, "", ""}, prompt, 4)) {
    kv::HashToProto(h, q.add_block_hashes());
  }
  EXPECT_EQ(ToEngineRequest(q, Limits(), &first).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(WorkerWireTest, BadImagesAreRefusedWithAClearMessage) {
  struct Case {
    std::string what;
    std::vector<v1::PromptImage> images;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
    std::string says;
  };
  std::vector<Case> cases = {
      {"wrong width", {InlineImage(1, 2, 4, 1)}, absl::StatusCode::kInvalidArgument, "hidden size"},
      {"outside the prompt",
       {InlineImage(8, 2, 3, 1)},
       absl::StatusCode::kInvalidArgument,
       "outside the prompt"},
      {"overlapping",
       {InlineImage(1, 3, 3, 1), InlineImage(3, 2, 3, 2)},
       absl::StatusCode::kInvalidArgument,
       "overlap"},
      {"unsorted",
       {InlineImage(5, 2, 3, 1), InlineImage(1, 2, 3, 2)},
       absl::StatusCode::kInvalidArgument,
       "sorted"},
      {"empty span", {InlineImage(1, 0, 3, 1)}, absl::StatusCode::kInvalidArgument, "empty"},
  };
  v1::PromptImage rows_mismatch = InlineImage(1, 2, 3, 1);
  rows_mismatch.set_placeholder_length(3);
  cases.push_back(
      {"rows not the placeholders", {rows_mismatch}, absl::StatusCode::kInvalidArgument, "rows"});
  v1::PromptImage short_bytes = InlineImage(1, 2, 3, 1);
  short_bytes.mutable_embeddings()->pop_back();
  cases.push_back(
      {"short bytes", {short_bytes}, absl::StatusCode::kInvalidArgument, "rows x cols x 4"});
  v1::PromptImage nan = InlineImage(1, 1, 3, 1);
  (*nan.mutable_embeddings())[3] = static_cast<char>(0x7f);
  (*nan.mutable_embeddings())[2] = static_cast<char>(0xc0);
  cases.push_back({"not finite", {nan}, absl::StatusCode::kInvalidArgument, "finite"});
  v1::PromptImage bytes_only;
  bytes_only.set_placeholder_start(1);
  bytes_only.set_placeholder_length(2);
  bytes_only.set_image_data("\x89PNG");
  cases.push_back(
      {"image bytes", {bytes_only}, absl::StatusCode::kInvalidArgument, "vision model"});
  v1::PromptImage handle = bytes_only;
  handle.clear_image_data();
  handle.set_embeddings_handle("h");
  cases.push_back({"handle", {handle}, absl::StatusCode::kInvalidArgument, "vision model"});
  v1::PromptImage handle_and_rows = InlineImage(1, 2, 3, 1);
  handle_and_rows.set_embeddings_handle("h");
  cases.push_back(
      {"handle and rows", {handle_and_rows}, absl::StatusCode::kInvalidArgument, "exclusive"});
  v1::PromptImage expected_with_rows = InlineImage(1, 2, 3, 1);
  expected_with_rows.set_expect_cached(true);
  cases.push_back({"expect_cached and rows",
                   {expected_with_rows},
                   absl::StatusCode::kInvalidArgument,
                   "sends nothing"});
  v1::PromptImage expected = bytes_only;
  expected.clear_image_data();
  expected.set_expect_cached(true);
  cases.push_back({"expect_cached without a vision model",
                   {expected},
                   absl::StatusCode::kInvalidArgument,
                   "vision model"});
  for (const Case& c : cases) {
    v1::TokenizedRequest q = Request();
    for (const v1::PromptImage& image : c.images) *q.add_images() = image;
    std::vector<int64_t> first;
    const absl::Status s = ToEngineRequest(q, Limits(), &first).status();
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s;
    EXPECT_NE(s.message().find(c.says), absl::string_view::npos) << c.what << ": " << s;
  }
  // Bounded: all images' bytes together.
  WireLimits small = Limits();
  small.max_image_embedding_bytes = 2 * 3 * 4 + 3 * 4;
  v1::TokenizedRequest q = Request();
  *q.add_images() = InlineImage(1, 2, 3, 1);
  *q.add_images() = InlineImage(4, 2, 3, 2);
  std::vector<int64_t> first;
  EXPECT_EQ(ToEngineRequest(q, small, &first).status().code(), absl::StatusCode::kInvalidArgument);
  q.mutable_images()->RemoveLast();
  EXPECT_TRUE(ToEngineRequest(q, small, &first).ok());
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// A constraint through the wire: its hash checked, compiled by the limits' compiler (a real
// compile cache over a small vocabulary) with the request's kept special tokens.
class WireConstraintTest : public ::testing::Test {
 protected:
  WireConstraintTest() : cache_(grammar::ConstraintCacheOptions{}) {
    auto trie = grammar::TokenTrie::Build({"", "a", "b", "ab"});
    EXPECT_TRUE(trie.ok());
    vocabulary_ = *trie;
    limits_ = Limits();
    limits_.compile_constraint = [this](const Hash128& hash, absl::string_view gbnf,
                                        absl::Span<const TokenId> kept) {
      kept_.assign(kept.begin(), kept.end());
      ++compiles_;
      return cache_.Get(hash, gbnf, vocabulary_);
    };
  }

  static v1::TokenizedRequest With(const std::string& gbnf) {
    v1::TokenizedRequest q = Request();
    v1::OutputConstraint* c = q.mutable_sampling()->mutable_constraint();
    c->set_kind(v1::CONSTRAINT_KIND_GRAMMAR);
    c->set_grammar(gbnf);
    kv::HashToProto(Xxh3Hash128(gbnf), c->mutable_hash());
    return q;
  }

  grammar::ConstraintCache cache_;
  std::shared_ptr<const grammar::TokenTrie> vocabulary_;
  WireLimits limits_;
  std::vector<TokenId> kept_;
  int compiles_ = 0;
};

TEST_F(WireConstraintTest, AGoodGrammarIsCompiledAndShared) {
  std::vector<int64_t> first;
  v1::TokenizedRequest q = With("root ::= \"a\"+ \"b\"");
  q.mutable_sampling()->add_keep_special_token_ids(0);
  auto r = ToEngineRequest(q, limits_, &first);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(r->constraint, nullptr);
  EXPECT_EQ(r->constraint->vocabulary(), vocabulary_);
  EXPECT_EQ(kept_, std::vector<TokenId>{0});
  auto again = ToEngineRequest(q, limits_, &first);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->constraint, r->constraint);  // the cache's one
  EXPECT_EQ(compiles_, 2);
  EXPECT_EQ(cache_.entries(), 1u);
  // No constraint: none compiled.
  auto plain = ToEngineRequest(Request(), limits_, &first);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->constraint, nullptr);
  EXPECT_EQ(compiles_, 2);
}

TEST_F(WireConstraintTest, AWrongHashIsRefusedBeforeAnyCompile) {
  std::vector<int64_t> first;
  v1::TokenizedRequest q = With("root ::= \"a\"");
  q.mutable_sampling()->mutable_constraint()->mutable_hash()->set_lo(12345);
  auto r = ToEngineRequest(q, limits_, &first);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "constraint hash ")) << r.status();
  EXPECT_NE(r.status().message().find(Xxh3Hash128("root ::= \"a\"").ToHex()), std::string::npos)
      << r.status();
  q.mutable_sampling()->mutable_constraint()->clear_hash();
  EXPECT_EQ(ToEngineRequest(q, limits_, &first).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(compiles_, 0);
  v1::TokenizedRequest empty = With("");
  auto e = ToEngineRequest(empty, limits_, &first);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("grammar is empty"), std::string::npos) << e.status();
}

TEST_F(WireConstraintTest, ABadGrammarIsRefusedWithTheParsersMessage) {
  std::vector<int64_t> first;
  auto r = ToEngineRequest(With("root ::= foo"), limits_, &first);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "constraint: line 1, column 10: undefined rule 'foo'");
  // A worker without a compiler refuses constraints.
  WireLimits none = Limits();
  auto n = ToEngineRequest(With("root ::= \"a\""), none, &first);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
