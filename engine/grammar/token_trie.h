// TokenTrie: a vocabulary's tokens as a byte trie, built once per vocabulary and shared by every
// constrained stream of a model (immutable).
//
// Nodes are stored in preorder, each with its depth and the end of its subtree, so a mask walk is
// a loop over an array that skips a rejected subtree in one step (llguidance's toktrie layout).
// Tokens with no bytes (special tokens: EOS, tool-call markers, ...) are not in the trie; the
// token matcher allows them by id (stop ids) and never through the grammar.
//
// Thread-safe (const after Build).

#ifndef FERRY_ENGINE_GRAMMAR_TOKEN_TRIE_H_
#define FERRY_ENGINE_GRAMMAR_TOKEN_TRIE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ferry::grammar {

struct TokenTrieLimits {
  size_t max_tokens = 1 << 20;
  size_t max_token_bytes = 1024;
};

class TokenTrie {
 public:
  struct Node {
    uint32_t subtree_end;   // index one past the last node of this node's subtree
    uint32_t tokens_begin;  // tokens ending here: token_ids()[tokens_begin, next node's)
    uint16_t depth;         // bytes from the root (the root is 0)
    uint8_t byte;
  };

  // `token_bytes[id]` is the bytes token `id` produces ("" for special tokens).
  static absl::StatusOr<std::shared_ptr<const TokenTrie>> Build(
      std::vector<std::string> token_bytes, const TokenTrieLimits& limits = {});

  size_t vocab_size() const { return token_bytes_.size(); }
  const std::string& TokenBytes(uint32_t id) const { return token_bytes_[id]; }
  // nodes()[0] is the root; a sentinel follows the last node (its tokens_begin ends the last).
  absl::Span<const Node> nodes() const { return nodes_; }
  size_t node_count() const { return nodes_.size() - 1; }
  absl::Span<const uint32_t> token_ids() const { return token_ids_; }

 private:
  TokenTrie() = default;
  std::vector<std::string> token_bytes_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> token_ids_;
};

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_TOKEN_TRIE_H_
