// CompiledConstraint: one grammar compiled for one vocabulary, what a constrained request carries
// into the engine (EngineRequest::constraint). It holds the parsed Grammar, the vocabulary's
// TokenTrie (built once per tokenizer, shared by every grammar of that tokenizer) and the
// grammar's MaskCache (shared by every stream of that grammar), and makes one TokenMatcher per
// generation stream (per choice).
//
// Ownership: immutable once made and shared by shared_ptr<const CompiledConstraint> among the
// requests that use the grammar; the mask cache inside is thread-safe (mask_cache.h), so streams
// on any thread may use it. Errors: Create returns the parser's InvalidArgument (with line and
// column) for a bad grammar; NewMatcher returns ResourceExhausted when the start state alone
// exceeds the matcher's limits.

#ifndef FERRY_ENGINE_GRAMMAR_COMPILED_CONSTRAINT_H_
#define FERRY_ENGINE_GRAMMAR_COMPILED_CONSTRAINT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/mask_cache.h"
#include "engine/grammar/token_matcher.h"
#include "engine/grammar/token_trie.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry::grammar {

struct ConstraintOptions {
  GbnfLimits gbnf;
  MatcherLimits matcher;
  MaskCacheOptions mask_cache;
};

class CompiledConstraint {
 public:
  // The vocabulary of `tokenizer` (token_vocabulary.h) as a trie, the special tokens in
  // `kept_special` with their text as bytes: build it once per tokenizer and kept set.
  static absl::StatusOr<std::shared_ptr<const TokenTrie>> BuildVocabulary(
      const Tokenizer& tokenizer, absl::Span<const TokenId> kept_special = {});

  // Parses `gbnf` (llama.cpp's dialect, gbnf_parser.h) for `vocabulary`.
  static absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Create(
      absl::string_view gbnf, std::shared_ptr<const TokenTrie> vocabulary,
      const ConstraintOptions& options = {});

  // A matcher at the grammar's start for one stream whose stop ids (end of sequence and the
  // request's stop tokens) are `stop_ids`.
  absl::StatusOr<TokenMatcher> NewMatcher(std::vector<uint32_t> stop_ids) const;

  // Fills the mask cache's entries for the grammar's start state (the first mask of every
  // stream), so that the first token of a new grammar does not pay for them on the engine
  // thread. ResourceExhausted as NewMatcher's.
  absl::Status WarmStart() const;

  // An upper bound of the memory this constraint may come to hold of its own (not the shared
  // vocabulary): the grammar's IR plus its mask cache when full (max_entries accepted masks of
  // the vocabulary's size; the uncertain lists, tokens whose bytes reach past a stack's top
  // nodes, are short and not counted).
  size_t EstimatedBytes() const;
  // Entries in the grammar's mask cache now.
  size_t cached_masks() const { return cache_->size(); }

  const std::shared_ptr<const TokenTrie>& vocabulary() const { return vocabulary_; }
  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }

 private:
  CompiledConstraint() = default;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> vocabulary_;
  std::shared_ptr<MaskCache> cache_;  // thread-safe; shared by the grammar's streams
  MatcherLimits limits_;
};

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_COMPILED_CONSTRAINT_H_
