#include "engine/grammar/token_matcher.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/grammar/gbnf_parser.h"
#include "gtest/gtest.h"

namespace ferry::grammar {
namespace {

// A hand-made vocabulary: 0 is EOS (special, no bytes), 1 another special token.
const std::vector<std::string> kVocab = {
    "",  "",  "{", "}",   "\"", "\":", "\"},{\"", "a",    "ab",   "abc", "1",   "12",  ",",
    " ", "[", "]", "],[", "[[", "é",   "\xc3",    "\xa9", "true", "tr",  "{\"", "\"}", "x"};

std::shared_ptr<const TokenTrie> Trie() {
  auto trie = TokenTrie::Build(kVocab);
  EXPECT_TRUE(trie.ok()) << trie.status();
  return *trie;
}

TokenMatcher Make(const std::string& gbnf) {
  absl::StatusOr<Grammar> g = ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status();
  auto m = TokenMatcher::Create(std::make_shared<const Grammar>(*std::move(g)), Trie(), {0});
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

std::set<std::string> Allowed(TokenMatcher& m) {
  std::vector<uint32_t> mask(TokenMatcher::MaskWords(kVocab.size()));
  std::vector<uint32_t> walked(mask.size());
  m.ComputeMask(absl::MakeSpan(mask));
  // The cached path (accepted + checked uncertain tokens) equals the plain trie walk.
  m.ComputeMaskByWalk(absl::MakeSpan(walked));
  EXPECT_EQ(mask, walked);
  std::set<std::string> out;
  for (uint32_t id = 0; id < kVocab.size(); ++id) {
    if ((mask[id / 32] >> (id % 32)) & 1) out.insert(id == 0 ? "<eos>" : kVocab[id]);
  }
  return out;
}

TEST(TokenTrieTest, PreorderWithSubtrees) {
  auto trie = Trie();
  EXPECT_EQ(trie->vocab_size(), kVocab.size());
  // Every non-empty token is in the trie exactly once.
  EXPECT_EQ(trie->token_ids().size(), kVocab.size() - 2);
  auto nodes = trie->nodes();
  EXPECT_EQ(nodes[0].subtree_end, trie->node_count());
  for (size_t i = 1; i < trie->node_count(); ++i) {
    EXPECT_GT(nodes[i].subtree_end, i);
    EXPECT_LE(nodes[i].subtree_end, trie->node_count());
  }
}

TEST(TokenMatcherTest, TokensCrossingStructure) {
  TokenMatcher m = Make(R"g(root ::= "[" obj ("," obj)* "]"
obj ::= "{" "\"" [a-c]+ "\":" [0-9]+ "}"
)g");
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"["}));
  ASSERT_TRUE(m.Accept(14).ok());  // [
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"{", "{\""}));
  ASSERT_TRUE(m.Accept(23).ok());  // {"
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"a", "ab", "abc"}));
  ASSERT_TRUE(m.Accept(9).ok());  // abc
  // A lone quote is allowed: it is a prefix of the structure that follows.
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"a", "ab", "abc", "\"", "\":"}));
  ASSERT_TRUE(m.Accept(5).ok());  // ":
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"1", "12"}));
  ASSERT_TRUE(m.Accept(11).ok());
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"1", "12", "}"}));
  EXPECT_EQ(m.Accept(7).code(), absl::StatusCode::kInvalidArgument);  // "a": not allowed
  ASSERT_TRUE(m.Accept(3).ok());
  EXPECT_EQ(Allowed(m), (std::set<std::string>{",", "]"}));
  EXPECT_EQ(m.Accept(0).code(), absl::StatusCode::kInvalidArgument);  // EOS too early
  ASSERT_TRUE(m.Accept(15).ok());
  EXPECT_TRUE(m.Accepting());
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"<eos>"}));
  ASSERT_TRUE(m.Accept(0).ok());
  EXPECT_TRUE(m.Stopped());
  EXPECT_EQ(Allowed(m), (std::set<std::string>{}));
  m.RollbackTokens(2);
  EXPECT_EQ(Allowed(m), (std::set<std::string>{",", "]"}));
}

TEST(TokenMatcherTest, PartialUtf8TokensAndSpecials) {
  TokenMatcher m = Make("root ::= \"é\"+ | \"true\"\n");
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"é", "\xc3", "tr", "true"}));
  ASSERT_TRUE(m.Accept(19).ok());  // \xc3
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"\xa9"}));
  EXPECT_EQ(m.Accept(1).code(), absl::StatusCode::kInvalidArgument);  // special, not a stop id
  ASSERT_TRUE(m.Accept(20).ok());
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"é", "\xc3", "<eos>"}));
}

TEST(TokenMatcherTest, NestedListsAndCheckpointsStayConsistent) {
  TokenMatcher m = Make("root ::= \"[\" (root (\",\" root)*)? \"]\"\n");
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"[", "[["}));
  ASSERT_TRUE(m.Accept(17).ok());  // [[
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"[", "[[", "]", "],["}));
  ASSERT_TRUE(m.Accept(15).ok());  // ]
  // "],[" would close the outer list and leave "," outside it.
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"]", ","}));
  m.RollbackTokens(1);
  ASSERT_TRUE(m.Accept(16).ok());  // ],[
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"[", "[[", "]", "],["}));
  ASSERT_TRUE(m.Accept(15).ok());
  ASSERT_TRUE(m.Accept(15).ok());
  EXPECT_EQ(Allowed(m), (std::set<std::string>{"<eos>"}));
  EXPECT_EQ(m.accepted_tokens(), 4u);
}

TEST(TokenMatcherTest, SharedCacheAcrossStreams) {
  absl::StatusOr<Grammar> g = ParseGbnf("root ::= \"[\" (root (\",\" root)*)? \"]\" | [a-c]+\n");
  ASSERT_TRUE(g.ok());
  auto grammar = std::make_shared<const Grammar>(*std::move(g));
  auto trie = Trie();
  auto cache = std::make_shared<MaskCache>(grammar, trie);
  auto a = TokenMatcher::Create(grammar, trie, {0}, {}, cache);
  auto b = TokenMatcher::Create(grammar, trie, {0}, {}, cache);
  ASSERT_TRUE(a.ok() && b.ok());
  for (uint32_t t : {17u, 7u, 12u, 14u}) ASSERT_TRUE(a->Accept(t).ok());  // [[a,[
  EXPECT_EQ(Allowed(*a), (std::set<std::string>{"[", "[[", "]", "],[", "a", "ab", "abc"}));
  size_t entries = cache->size();
  EXPECT_GT(entries, 0u);
  for (uint32_t t : {17u, 8u, 12u, 14u}) ASSERT_TRUE(b->Accept(t).ok());  // [[ab,[
  EXPECT_EQ(Allowed(*b), Allowed(*a));
  EXPECT_EQ(cache->size(), entries);  // the second stream met the same stack tops
}

}  // namespace
}  // namespace ferry::grammar
