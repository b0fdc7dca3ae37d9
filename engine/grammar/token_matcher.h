// TokenMatcher: a grammar constraint at token granularity for one generation stream: the mask of
// tokens allowed next, and Accept(token) to advance by a sampled token.
//
// ComputeMask walks the shared TokenTrie with the stream's GrammarMatcher, advancing one byte per
// trie edge and rolling back, skipping every subtree whose first byte the matcher refuses; a token
// is allowed when all its bytes are accepted, so tokens that cross grammar structure (`":"`,
// `"},{"`) are handled exactly. Stop ids (EOS and the request's stop tokens) are allowed only when
// the matcher is accepting; tokens without bytes that are not stop ids are never allowed.
//
// Mask layout: bit (id % 32) of word (id / 32), vocab_size rounded up to 32-bit words (as
// llguidance's and xgrammar's bitmasks).
//
// Thread-compatible (one per stream); the trie and grammar are shared, immutable.

#ifndef FERRY_ENGINE_GRAMMAR_TOKEN_MATCHER_H_
#define FERRY_ENGINE_GRAMMAR_TOKEN_MATCHER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/mask_cache.h"
#include "engine/grammar/token_trie.h"

namespace ferry::grammar {

class TokenMatcher {
 public:
  // `cache` (made for the same grammar and trie) is shared by the grammar's streams; null makes
  // a private one.
  static absl::StatusOr<TokenMatcher> Create(std::shared_ptr<const Grammar> grammar,
                                             std::shared_ptr<const TokenTrie> trie,
                                             std::vector<uint32_t> stop_ids,
                                             const MatcherLimits& limits = {},
                                             std::shared_ptr<MaskCache> cache = nullptr);

  static size_t MaskWords(size_t vocab_size) { return (vocab_size + 31) / 32; }

  // Fills `mask` (at least MaskWords(vocab_size) words; fewer is a programming error, CHECKed): the
  // cache's accepted tokens of each stack, then the uncertain ones checked with the matcher. After
  // a stop token nothing is allowed.
  void ComputeMask(absl::Span<uint32_t> mask);
  // The same mask by walking the whole trie with the matcher (no cache): the reference the
  // cached path is tested against, and the fallback when the cache fails.
  void ComputeMaskByWalk(absl::Span<uint32_t> mask);

  // Advances by `token`: InvalidArgument when the mask would not allow it (state unchanged),
  // ResourceExhausted when a matcher limit was hit (the cached mask can allow a token whose
  // full check hits a limit: the cache walks shorter stacks).
  absl::Status Accept(uint32_t token);
  // Undoes the last `n` accepted tokens (n <= accepted_tokens()).
  void RollbackTokens(size_t n);

  bool Accepting() const { return !stopped_ && matcher_.Accepting(); }
  // True after a stop token was accepted.
  bool Stopped() const { return stopped_; }
  size_t accepted_tokens() const { return token_checkpoints_.size(); }
  const GrammarMatcher& matcher() const { return matcher_; }

 private:
  TokenMatcher(GrammarMatcher matcher, std::shared_ptr<const TokenTrie> trie,
               std::vector<uint32_t> stop_ids, std::shared_ptr<MaskCache> cache)
      : matcher_(std::move(matcher)),
        trie_(std::move(trie)),
        stop_ids_(std::move(stop_ids)),
        cache_(std::move(cache)) {}
  void AddStopIds(absl::Span<uint32_t> mask) const;

  GrammarMatcher matcher_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<uint32_t> stop_ids_;
  std::shared_ptr<MaskCache> cache_;
  std::vector<uint32_t> stacks_;     // reused: the stacks' ids during ComputeMask
  std::vector<uint32_t> positions_;  // reused: a stack's top positions
  std::vector<std::shared_ptr<const MaskCache::Entry>> entries_;  // reused
  std::vector<size_t> token_checkpoints_;  // byte checkpoint before each accepted token
  bool stopped_ = false;
};

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_TOKEN_MATCHER_H_
