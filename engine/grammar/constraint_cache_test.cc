#include "engine/grammar/constraint_cache.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ferry::grammar {
namespace {

std::shared_ptr<const TokenTrie> Vocabulary() {
  std::vector<std::string> tokens = {"", "a", "b", "c", "ab", "{", "}", "\"", "1"};
  auto trie = TokenTrie::Build(tokens);
  EXPECT_TRUE(trie.ok()) << trie.status();
  return *trie;
}

// The real compile, counted, optionally held until `release` (the first call only).
struct CountingCompile {
  std::atomic<int> calls{0};
  absl::Notification started, release;
  bool hold = false;

  ConstraintCache::CompileFn Fn(const ConstraintOptions& options = {}) {
    return [this, options](absl::string_view gbnf, std::shared_ptr<const TokenTrie> vocabulary)
               -> absl::StatusOr<std::shared_ptr<const CompiledConstraint>> {
      const bool first = calls.fetch_add(1) == 0;
      if (hold && first) {
        started.Notify();
        release.WaitForNotification();
      }
      return CompiledConstraint::Create(gbnf, std::move(vocabulary), options);
    };
  }
};

Hash128 HashOf(const std::string& gbnf) { return Xxh3Hash128(gbnf); }

size_t BytesOf(const std::string& gbnf, const std::shared_ptr<const TokenTrie>& vocabulary) {
  auto c = CompiledConstraint::Create(gbnf, vocabulary);
  EXPECT_TRUE(c.ok()) << c.status();
  return (*c)->EstimatedBytes();
}

TEST(ConstraintCacheTest, MissThenHitSharesTheConstraint) {
  auto vocabulary = Vocabulary();
  CountingCompile compile;
  ConstraintCache cache({}, compile.Fn());
  const std::string g = "root ::= \"ab\"";
  ConstraintLookup first, second;
  auto a = cache.Get(HashOf(g), g, vocabulary, &first);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(first.result, ConstraintLookup::Result::kMiss);
  EXPECT_GT(first.compile_seconds, 0);
  auto b = cache.Get(HashOf(g), g, vocabulary, &second);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(second.result, ConstraintLookup::Result::kHit);
  EXPECT_EQ(second.compile_seconds, 0);
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(compile.calls, 1);
  EXPECT_EQ(cache.entries(), 1u);
  EXPECT_EQ(cache.bytes(), (*a)->EstimatedBytes());
  // Another vocabulary (same bytes, another trie) is another key.
  auto c = cache.Get(HashOf(g), g, Vocabulary());
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->get(), c->get());
  EXPECT_EQ(compile.calls, 2);
}

TEST(ConstraintCacheTest, EstimatedBytesCountTheMaskCacheCap) {
  auto vocabulary = Vocabulary();
  ConstraintOptions small, large;
  small.mask_cache.max_entries = 16;
  large.mask_cache.max_entries = 1024;
  auto s = CompiledConstraint::Create("root ::= \"a\"", vocabulary, small);
  auto l = CompiledConstraint::Create("root ::= \"a\"", vocabulary, large);
  ASSERT_TRUE(s.ok() && l.ok());
  // One mask word (9 tokens) per entry at least.
  EXPECT_GE((*l)->EstimatedBytes() - (*s)->EstimatedBytes(), (1024 - 16) * sizeof(uint32_t));
  // A bigger grammar has a bigger IR.
  auto big =
      CompiledConstraint::Create("root ::= (\"a\" | \"b\" | \"c\"){0,50}", vocabulary, small);
  ASSERT_TRUE(big.ok());
  EXPECT_GT((*big)->EstimatedBytes(), (*s)->EstimatedBytes());
}

TEST(ConstraintCacheTest, BoundedByBytesLeastRecentlyUsedGoes) {
  auto vocabulary = Vocabulary();
  const std::string a = "root ::= \"a\"", b = "root ::= \"b\"", c = "root ::= \"c\"";
  const size_t one = BytesOf(a, vocabulary);
  ASSERT_EQ(BytesOf(b, vocabulary), one);
  ASSERT_EQ(BytesOf(c, vocabulary), one);
  ConstraintCacheOptions options;
  options.max_bytes = 2 * one + one / 2;  // room for two
  CountingCompile compile;
  ConstraintCache cache(options, compile.Fn());
  ASSERT_TRUE(cache.Get(HashOf(a), a, vocabulary).ok());
  ASSERT_TRUE(cache.Get(HashOf(b), b, vocabulary).ok());
  ASSERT_TRUE(cache.Get(HashOf(a), a, vocabulary).ok());  // a used after b
  EXPECT_EQ(compile.calls, 2);
  ASSERT_TRUE(cache.Get(HashOf(c), c, vocabulary).ok());  // b goes
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_EQ(cache.bytes(), 2 * one);
  EXPECT_LE(cache.bytes(), options.max_bytes);
  ConstraintLookup lookup;
  ASSERT_TRUE(cache.Get(HashOf(a), a, vocabulary, &lookup).ok());
  EXPECT_EQ(lookup.result, ConstraintLookup::Result::kHit);
  ASSERT_TRUE(cache.Get(HashOf(c), c, vocabulary, &lookup).ok());
  EXPECT_EQ(lookup.result, ConstraintLookup::Result::kHit);
  ASSERT_TRUE(cache.Get(HashOf(b), b, vocabulary, &lookup).ok());
  EXPECT_EQ(lookup.result, ConstraintLookup::Result::kMiss);
  EXPECT_EQ(compile.calls, 4);
  EXPECT_EQ(cache.entries(), 2u);
}

TEST(ConstraintCacheTest, LargerThanTheBudgetIsReturnedNotKept) {
  auto vocabulary = Vocabulary();
  ConstraintCacheOptions options;
  options.max_bytes = 100;
  ConstraintCache cache(options);
  const std::string g = "root ::= \"a\"";
  auto c = cache.Get(HashOf(g), g, vocabulary);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(*c, nullptr);
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
}

TEST(ConstraintCacheTest, ErrorsAreReportedAndNotCached) {
  auto vocabulary = Vocabulary();
  CountingCompile compile;
  ConstraintCache cache({}, compile.Fn());
  const std::string bad = "root ::= foo";
  for (int i = 0; i < 2; ++i) {
    ConstraintLookup lookup;
    auto c = cache.Get(HashOf(bad), bad, vocabulary, &lookup);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("undefined rule 'foo'"), std::string::npos) << c.status();
    EXPECT_EQ(lookup.result, ConstraintLookup::Result::kError);
  }
  EXPECT_EQ(compile.calls, 2);  // compiled again: errors are not kept
  EXPECT_EQ(cache.entries(), 0u);
  // The compile's limits hold.
  ConstraintCacheOptions limited;
  limited.constraint.gbnf.max_text_bytes = 8;
  ConstraintCache small(limited);
  const std::string long_text = "root ::= \"abcabcabc\"";
  auto c = small.Get(HashOf(long_text), long_text, vocabulary);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  // A start state over the matcher's limits (more live stacks than allowed) is the grammar's
  // fault too.
  ConstraintCacheOptions few_stacks;
  few_stacks.constraint.matcher.max_stacks = 2;
  ConstraintCache strict(few_stacks);
  const std::string wide = "root ::= \"a\" | \"b\" | \"c\" | \"ab\"";
  auto w = strict.Get(HashOf(wide), wide, vocabulary);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  EXPECT_NE(w.status().message().find("start state"), std::string::npos) << w.status();
}

// Callers of one key while its compile runs wait for that compile (one compile), and the cache's
// lock is not held meanwhile: another key compiles on this thread while the first is held.
TEST(ConstraintCacheTest, SingleFlightWithoutHoldingTheLock) {
  auto vocabulary = Vocabulary();
  CountingCompile compile;
  compile.hold = true;
  ConstraintCache cache({}, compile.Fn());
  const std::string g = "root ::= \"a\"+";
  constexpr int kCallers = 4;
  std::vector<absl::StatusOr<std::shared_ptr<const CompiledConstraint>>> results(kCallers);
  std::vector<ConstraintLookup> lookups(kCallers);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { results[0] = cache.Get(HashOf(g), g, vocabulary, &lookups[0]); });
  compile.started.WaitForNotification();
  for (int i = 1; i < kCallers; ++i) {
    threads.emplace_back([&, i] { results[i] = cache.Get(HashOf(g), g, vocabulary, &lookups[i]); });
  }
  cache.AwaitWaitersForTest(kCallers - 1);
  const std::string other = "root ::= \"b\"";
  ConstraintLookup other_lookup;
  ASSERT_TRUE(cache.Get(HashOf(other), other, vocabulary, &other_lookup).ok());
  EXPECT_EQ(other_lookup.result, ConstraintLookup::Result::kMiss);
  compile.release.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(compile.calls, 2);  // g once, other once
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_EQ(lookups[0].result, ConstraintLookup::Result::kMiss);
  for (int i = 1; i < kCallers; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(results[i]->get(), results[0]->get());
    EXPECT_EQ(lookups[i].result, ConstraintLookup::Result::kHit);
    EXPECT_EQ(lookups[i].compile_seconds, 0);
  }
}

TEST(ConstraintCacheTest, WaitersOfAFailedCompileGetItsError) {
  auto vocabulary = Vocabulary();
  CountingCompile compile;
  compile.hold = true;
  ConstraintCache cache({}, compile.Fn());
  const std::string bad = "root ::= (\"a\"";
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> first, second;
  ConstraintLookup first_lookup, second_lookup;
  std::thread a([&] { first = cache.Get(HashOf(bad), bad, vocabulary, &first_lookup); });
  compile.started.WaitForNotification();
  std::thread b([&] { second = cache.Get(HashOf(bad), bad, vocabulary, &second_lookup); });
  cache.AwaitWaitersForTest(1);
  compile.release.Notify();
  a.join();
  b.join();
  EXPECT_EQ(compile.calls, 1);
  ASSERT_FALSE(first.ok());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(first.status(), second.status());
  EXPECT_EQ(first_lookup.result, ConstraintLookup::Result::kError);
  EXPECT_EQ(second_lookup.result, ConstraintLookup::Result::kError);
  EXPECT_EQ(cache.entries(), 0u);
}

// The default compile warms the start state: the first mask finds its entries cached.
TEST(ConstraintCacheTest, CompileWarmsTheStartState) {
  auto vocabulary = Vocabulary();
  ConstraintCache cache({});
  const std::string g = "root ::= \"{\" [a-c]* \"}\"";
  auto c = cache.Get(HashOf(g), g, vocabulary);
  ASSERT_TRUE(c.ok()) << c.status();
  auto cold = CompiledConstraint::Create(g, vocabulary);
  ASSERT_TRUE(cold.ok());
  EXPECT_GT((*c)->cached_masks(), 0u);
  EXPECT_EQ((*cold)->cached_masks(), 0u);
  const size_t warmed = (*c)->cached_masks();
  // Both give the same first mask (the warm one from its cache).
  for (const auto& constraint : {*c, *cold}) {
    auto m = constraint->NewMatcher({0});
    ASSERT_TRUE(m.ok());
    std::vector<uint32_t> mask(TokenMatcher::MaskWords(vocabulary->vocab_size()));
    m->ComputeMask(absl::MakeSpan(mask));
    EXPECT_EQ(mask[0], uint32_t{1} << 5) << "only '{'";
  }
  EXPECT_EQ((*c)->cached_masks(), warmed);  // the first mask needed nothing new
}

}  // namespace
}  // namespace ferry::grammar
