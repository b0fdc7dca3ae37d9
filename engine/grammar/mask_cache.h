// MaskCache: the context-independent part of token masks, per (grammar, vocabulary), shared by
// every stream that uses the grammar (xgrammar's adaptive token mask cache, in spirit).
//
// A mask is the union over the matcher's stacks of the tokens each stack allows. For a stack,
// only its top `depth` nodes are looked at: from those positions, with a boundary below, one trie
// walk sorts every token into accepted (all its bytes match without popping past the boundary,
// or popping to it exactly at the token's end), uncertain (some path pops to the boundary before
// the token's end, so the context below decides) and rejected (the rest). At run time the token
// matcher ORs the accepted masks of its stacks and checks only the uncertain tokens with the full
// matcher. Entries are keyed by the positions (not by node ids), so streams share them.
//
// The first use of a key costs one trie walk; entries are bounded (max_entries; beyond it an
// entry is computed and used but not kept). Thread-safe (entries immutable once made).

#ifndef FERRY_ENGINE_GRAMMAR_MASK_CACHE_H_
#define FERRY_ENGINE_GRAMMAR_MASK_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/token_trie.h"

namespace ferry::grammar {

struct MaskCacheOptions {
  // Stack nodes in a key (more: fewer uncertain tokens, more keys).
  size_t depth = 3;
  size_t max_entries = 4096;
  MatcherLimits limits;
};

class MaskCache {
 public:
  struct Entry {
    std::vector<uint32_t> accepted;   // bitmask words
    std::vector<uint32_t> uncertain;  // token ids, ascending
  };

  MaskCache(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
            const MaskCacheOptions& options = {});

  // The entry for a stack whose top positions are `positions` (top first), `truncated` when the
  // stack is deeper than them.
  absl::StatusOr<std::shared_ptr<const Entry>> Get(absl::Span<const uint32_t> positions,
                                                   bool truncated);

  const MaskCacheOptions& options() const { return options_; }
  size_t size() const;

 private:
  absl::StatusOr<std::shared_ptr<const Entry>> Compute(absl::Span<const uint32_t> positions,
                                                       bool truncated) const;

  const std::shared_ptr<const Grammar> grammar_;
  const std::shared_ptr<const TokenTrie> trie_;
  const MaskCacheOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_MASK_CACHE_H_
