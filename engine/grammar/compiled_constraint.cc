#include "engine/grammar/compiled_constraint.h"

#include <utility>

#include "engine/grammar/token_vocabulary.h"

namespace ferry::grammar {

absl::StatusOr<std::shared_ptr<const TokenTrie>> CompiledConstraint::BuildVocabulary(
    const Tokenizer& tokenizer, absl::Span<const TokenId> kept_special) {
  return TokenTrie::Build(TokenBytesOf(tokenizer, kept_special));
}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompiledConstraint::Create(
    absl::string_view gbnf, std::shared_ptr<const TokenTrie> vocabulary,
    const ConstraintOptions& options) {
  if (vocabulary == nullptr) return absl::InvalidArgumentError("a constraint needs a vocabulary");
  absl::StatusOr<Grammar> grammar = ParseGbnf(gbnf, options.gbnf);
  if (!grammar.ok()) return grammar.status();
  std::shared_ptr<CompiledConstraint> c(new CompiledConstraint);
  c->grammar_ = std::make_shared<const Grammar>(*std::move(grammar));
  c->vocabulary_ = std::move(vocabulary);
  MaskCacheOptions cache_options = options.mask_cache;
  cache_options.limits = options.matcher;
  c->cache_ = std::make_shared<MaskCache>(c->grammar_, c->vocabulary_, cache_options);
  c->limits_ = options.matcher;
  return std::shared_ptr<const CompiledConstraint>(std::move(c));
}

absl::StatusOr<TokenMatcher> CompiledConstraint::NewMatcher(std::vector<uint32_t> stop_ids) const {
  return TokenMatcher::Create(grammar_, vocabulary_, std::move(stop_ids), limits_, cache_);
}

absl::Status CompiledConstraint::WarmStart() const {
  absl::StatusOr<TokenMatcher> m = NewMatcher({});
  if (!m.ok()) return m.status();
  std::vector<uint32_t> mask(TokenMatcher::MaskWords(vocabulary_->vocab_size()));
  m->ComputeMask(absl::MakeSpan(mask));
  return absl::OkStatus();
}

size_t CompiledConstraint::EstimatedBytes() const {
  size_t ir = sizeof(Grammar) + grammar_->elements.capacity() * sizeof(Element) +
              grammar_->byte_sets.capacity() * sizeof(ByteSet) + grammar_->nullable.size() / 8;
  for (const Rule& rule : grammar_->rules) {
    ir += sizeof(Rule) + rule.name.capacity() + rule.alternatives.capacity() * sizeof(uint32_t);
  }
  // A cache entry: its accepted mask, the entry and its key (a few positions) in the map.
  const size_t entry = TokenMatcher::MaskWords(vocabulary_->vocab_size()) * sizeof(uint32_t) +
                       sizeof(MaskCache::Entry) + 128;
  return ir + cache_->options().max_entries * entry;
}

}  // namespace ferry::grammar
