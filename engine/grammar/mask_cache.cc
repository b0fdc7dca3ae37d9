#include "engine/grammar/mask_cache.h"

#include <string>
#include <utility>
#include <vector>

#include "engine/common/status.h"

namespace ferry::grammar {

MaskCache::MaskCache(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                     const MaskCacheOptions& options)
    : grammar_(std::move(grammar)), trie_(std::move(trie)), options_(options) {}

size_t MaskCache::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

absl::StatusOr<std::shared_ptr<const MaskCache::Entry>> MaskCache::Get(
    absl::Span<const uint32_t> positions, bool truncated) {
  std::string key(reinterpret_cast<const char*>(positions.data()),
                  positions.size() * sizeof(uint32_t));
  key.push_back(truncated ? 1 : 0);
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const Entry> entry, Compute(positions, truncated));
  absl::MutexLock lock(&mu_);
  if (entries_.size() < options_.max_entries) entries_.emplace(std::move(key), entry);
  return entry;
}

absl::StatusOr<std::shared_ptr<const MaskCache::Entry>> MaskCache::Compute(
    absl::Span<const uint32_t> positions, bool truncated) const {
  ASSIGN_OR_RETURN(GrammarMatcher m,
                   GrammarMatcher::CreateAt(grammar_, positions, truncated, options_.limits));
  auto entry = std::make_shared<Entry>();
  entry->accepted.assign((trie_->vocab_size() + 31) / 32, 0);
  absl::Span<const TokenTrie::Node> nodes = trie_->nodes();
  absl::Span<const uint32_t> ids = trie_->token_ids();
  const size_t end = trie_->node_count();
  // seen[d]: a stack popped to the boundary within the first d bytes of the current path.
  std::vector<uint8_t> seen(1, 0);
  size_t i = 1;
  while (i < end) {
    const TokenTrie::Node& node = nodes[i];
    size_t d = node.depth;
    if (m.Checkpoint() > d - 1) m.Rollback(d - 1);
    GrammarMatcher::Step step = GrammarMatcher::Step::kRejected;
    if (m.NextBytes().Contains(node.byte)) step = m.Advance(node.byte);
    if (step == GrammarMatcher::Step::kOk) {
      for (uint32_t t = node.tokens_begin; t < nodes[i + 1].tokens_begin; ++t) {
        entry->accepted[ids[t] >> 5] |= uint32_t{1} << (ids[t] & 31);
      }
      if (seen.size() <= d) seen.resize(d + 1);
      seen[d] = seen[d - 1] | (m.Boundary() ? 1 : 0);
      ++i;
      continue;
    }
    // Refused here: the subtree's tokens are rejected unless the context could take over
    // (a boundary on the way), or a limit stopped the local walk.
    if (seen[d - 1] || step == GrammarMatcher::Step::kLimit) {
      for (uint32_t t = node.tokens_begin; t < nodes[node.subtree_end].tokens_begin; ++t) {
        entry->uncertain.push_back(ids[t]);
      }
    }
    i = node.subtree_end;
  }
  std::sort(entry->uncertain.begin(), entry->uncertain.end());
  return std::shared_ptr<const Entry>(std::move(entry));
}

}  // namespace ferry::grammar
