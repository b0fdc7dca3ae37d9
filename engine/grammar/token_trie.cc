#include "engine/grammar/token_trie.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry::grammar {

absl::StatusOr<std::shared_ptr<const TokenTrie>> TokenTrie::Build(
    std::vector<std::string> token_bytes, const TokenTrieLimits& limits) {
  if (token_bytes.size() > limits.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocabulary of ", token_bytes.size(), " tokens is above the limit of ", limits.max_tokens));
  }
  size_t max_bytes = std::min<size_t>(limits.max_token_bytes, 0xFFFF);
  std::vector<uint32_t> order;
  for (uint32_t id = 0; id < token_bytes.size(); ++id) {
    if (token_bytes[id].size() > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("token ", id, " has ", token_bytes[id].size(),
                                                     " bytes, above the limit of ", max_bytes));
    }
    if (!token_bytes[id].empty()) order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return token_bytes[a] < token_bytes[b]; });
  std::shared_ptr<TokenTrie> trie(new TokenTrie());
  std::vector<Node>& nodes = trie->nodes_;
  std::vector<uint32_t>& ids = trie->token_ids_;
  nodes.push_back(Node{0, 0, 0, 0});
  std::vector<uint32_t> path = {0};  // path[d] is the node at depth d
  const std::string* prev = nullptr;
  for (uint32_t id : order) {
    const std::string& s = token_bytes[id];
    size_t lcp = 0;
    if (prev != nullptr) {
      size_t n = std::min(prev->size(), s.size());
      while (lcp < n && (*prev)[lcp] == s[lcp]) ++lcp;
    }
    while (path.size() > lcp + 1) {
      nodes[path.back()].subtree_end = static_cast<uint32_t>(nodes.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(static_cast<uint32_t>(nodes.size()));
      nodes.push_back(Node{0, static_cast<uint32_t>(ids.size()), static_cast<uint16_t>(d + 1),
                           static_cast<uint8_t>(s[d])});
    }
    ids.push_back(id);
    prev = &s;
  }
  while (!path.empty()) {
    nodes[path.back()].subtree_end = static_cast<uint32_t>(nodes.size());
    path.pop_back();
  }
  nodes.push_back(Node{0, static_cast<uint32_t>(ids.size()), 0, 0});  // sentinel
  trie->token_bytes_ = std::move(token_bytes);
  return std::shared_ptr<const TokenTrie>(std::move(trie));
}

}  // namespace ferry::grammar
