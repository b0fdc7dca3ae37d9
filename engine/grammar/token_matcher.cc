#include "engine/grammar/token_matcher.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/common/status.h"

namespace ferry::grammar {

absl::StatusOr<TokenMatcher> TokenMatcher::Create(std::shared_ptr<const Grammar> grammar,
                                                  std::shared_ptr<const TokenTrie> trie,
                                                  std::vector<uint32_t> stop_ids,
                                                  const MatcherLimits& limits,
                                                  std::shared_ptr<MaskCache> cache) {
  if (trie == nullptr) return absl::InvalidArgumentError("token matcher needs a token trie");
  for (uint32_t id : stop_ids) {
    if (id >= trie->vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop id ", id, " is outside the vocabulary of ", trie->vocab_size()));
    }
  }
  if (cache == nullptr) {
    MaskCacheOptions options;
    options.limits = limits;
    cache = std::make_shared<MaskCache>(grammar, trie, options);
  }
  ASSIGN_OR_RETURN(GrammarMatcher matcher, GrammarMatcher::Create(std::move(grammar), limits));
  return TokenMatcher(std::move(matcher), std::move(trie), std::move(stop_ids), std::move(cache));
}

void TokenMatcher::AddStopIds(absl::Span<uint32_t> mask) const {
  if (matcher_.Accepting()) {
    for (uint32_t id : stop_ids_) mask[id >> 5] |= uint32_t{1} << (id & 31);
  }
}

void TokenMatcher::ComputeMask(absl::Span<uint32_t> mask) {
  CHECK(mask.size() >= MaskWords(trie_->vocab_size())) << "mask of " << mask.size() << " words";
  std::memset(mask.data(), 0, mask.size() * sizeof(uint32_t));
  if (stopped_) return;
  absl::Span<const uint32_t> stacks = matcher_.Stacks();
  stacks_.assign(stacks.begin(), stacks.end());
  entries_.clear();
  for (uint32_t h : stacks_) {
    if (h <= GrammarMatcher::kBoundaryNode) continue;
    bool truncated = false;
    matcher_.StackPositions(h, cache_->options().depth, &positions_, &truncated);
    absl::StatusOr<std::shared_ptr<const MaskCache::Entry>> entry =
        cache_->Get(positions_, truncated);
    if (!entry.ok()) {  // over a limit in the local walk: the plain walk decides
      ComputeMaskByWalk(mask);
      return;
    }
    const std::vector<uint32_t>& accepted = (*entry)->accepted;
    for (size_t w = 0; w < mask.size() && w < accepted.size(); ++w) mask[w] |= accepted[w];
    entries_.push_back(*std::move(entry));
  }
  const size_t base = matcher_.Checkpoint();
  for (const auto& entry : entries_) {
    for (uint32_t id : entry->uncertain) {
      if ((mask[id >> 5] >> (id & 31)) & 1) continue;
      if (matcher_.AdvanceBytes(trie_->TokenBytes(id)) == GrammarMatcher::Step::kOk) {
        mask[id >> 5] |= uint32_t{1} << (id & 31);
        matcher_.Rollback(base);
      }
    }
  }
  AddStopIds(mask);
}

void TokenMatcher::ComputeMaskByWalk(absl::Span<uint32_t> mask) {
  CHECK(mask.size() >= MaskWords(trie_->vocab_size())) << "mask of " << mask.size() << " words";
  std::memset(mask.data(), 0, mask.size() * sizeof(uint32_t));
  if (stopped_) return;
  absl::Span<const TokenTrie::Node> nodes = trie_->nodes();
  absl::Span<const uint32_t> ids = trie_->token_ids();
  const size_t base = matcher_.Checkpoint();
  const size_t end = trie_->node_count();
  size_t i = 1;
  while (i < end) {
    const TokenTrie::Node& node = nodes[i];
    size_t parent_depth = base + node.depth - 1;
    if (matcher_.Checkpoint() > parent_depth) matcher_.Rollback(parent_depth);
    if (matcher_.NextBytes().Contains(node.byte) &&
        matcher_.Advance(node.byte) == GrammarMatcher::Step::kOk) {
      for (uint32_t t = node.tokens_begin; t < nodes[i + 1].tokens_begin; ++t) {
        uint32_t id = ids[t];
        mask[id >> 5] |= uint32_t{1} << (id & 31);
      }
      ++i;
    } else {
      i = node.subtree_end;
    }
  }
  matcher_.Rollback(base);
  AddStopIds(mask);
}

absl::Status TokenMatcher::Accept(uint32_t token) {
  if (stopped_) return absl::InvalidArgumentError("the grammar already ended (stop token)");
  if (token >= trie_->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("token ", token, " is outside the vocabulary"));
  }
  const std::string& bytes = trie_->TokenBytes(token);
  if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
    if (matcher_.Accepting()) {
      token_checkpoints_.push_back(matcher_.Checkpoint());
      stopped_ = true;
      return absl::OkStatus();
    }
    // A stop id with bytes may still be text the grammar takes (the mask allows it so).
    if (bytes.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token ", token, " before the grammar is complete"));
    }
  }
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " has no bytes (a special token) and is not a stop id"));
  }
  size_t before = matcher_.Checkpoint();
  switch (matcher_.AdvanceBytes(bytes)) {
    case GrammarMatcher::Step::kOk:
      token_checkpoints_.push_back(before);
      return absl::OkStatus();
    case GrammarMatcher::Step::kRejected:
      return absl::InvalidArgumentError(
          absl::StrCat("token ", token, " is not allowed by the grammar here"));
    case GrammarMatcher::Step::kLimit:
      break;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("token ", token, " exceeds the grammar matcher's limits"));
}

void TokenMatcher::RollbackTokens(size_t n) {
  n = std::min(n, token_checkpoints_.size());
  if (n == 0) return;
  size_t cp = token_checkpoints_[token_checkpoints_.size() - n];
  token_checkpoints_.resize(token_checkpoints_.size() - n);
  matcher_.Rollback(cp);
  stopped_ = false;
}

}  // namespace ferry::grammar
