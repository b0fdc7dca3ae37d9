// The BPE model: vocabulary, merge ranks, and the merge loop that turns one pre-token into ids.
//
// Two alphabets, as in HF `tokenizers`:
// - byte-level (GPT-2, Llama-3, Qwen, SmolLM): a pre-token's bytes map one-to-one onto 256
//   printable characters (utf8.h ByteToUnicode); a byte whose character the vocabulary lacks
//   becomes the unknown token, or is dropped when there is none (as in HF and llama.cpp);
// - character-level (SentencePiece-style, Llama-2, Mistral): a pre-token's UTF-8 characters are
//   the initial symbols; characters outside the vocabulary become <0xXX> byte tokens
//   (byte_fallback) or the unknown token.
// Merges apply lowest rank first, leftmost first among equal ranks (a heap over a linked list of
// symbols: O(n log n) even for pathological pre-tokens of thousands of characters).

#ifndef FERRY_ENGINE_TOKENIZER_BPE_MODEL_H_
#define FERRY_ENGINE_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/token_id.h"

namespace ferry {

struct BpeOptions {
  bool byte_level = true;
  bool byte_fallback = false;
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  // Llama-3: a pre-token that is itself in the vocabulary is emitted as is.
  bool ignore_merges = false;
};

// Immutable after Create() apart from its word cache; thread-safe.
class BpeModel {
 public:
  BpeModel() = default;
  BpeModel(BpeModel&& other) noexcept;
  BpeModel& operator=(BpeModel&& other) noexcept;

  // `vocab[id]` is the token string of id (empty strings are holes); `merges` in rank order.
  static absl::StatusOr<BpeModel> Create(
      std::vector<std::string> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options);

  // Appends the ids of one pre-token (raw text bytes; mapped to the byte-level alphabet inside).
  void EncodeWord(absl::string_view word, std::vector<TokenId>* out) const;

  size_t vocab_size() const { return vocab_.size(); }
  const std::string& token(TokenId id) const { return vocab_[id]; }
  std::optional<TokenId> Find(absl::string_view token) const;
  const BpeOptions& options() const { return options_; }

 private:
  struct Merge {
    uint32_t rank;
    TokenId merged;
  };
  static uint64_t PairKey(TokenId a, TokenId b) { return (uint64_t{a} << 32) | b; }
  void InitialSymbols(absl::string_view word, std::vector<TokenId>* symbols) const;
  void ApplyMerges(std::vector<TokenId>* symbols) const;
  void EncodeWordUncached(absl::string_view word, std::vector<TokenId>* out) const;

  // Results for pre-tokens seen before (shorter than kMaxCachedWord bytes), as HF caches them.
  // Sharded to keep parallel encoders apart; each shard stops growing at its capacity (no
  // eviction: the first words seen are the common ones), so memory stays bounded.
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheEntriesPerShard = 8192;
  static constexpr size_t kMaxCachedWord = 64;
  // (Programs turn Debian Abseil's deadlock detector off, engine/common/mutex_mode.h: with it on,
  // a lock costs more than the cached BPE itself.)
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<TokenId>> words ABSL_GUARDED_BY(mu);
  };
  std::unique_ptr<std::array<CacheShard, kCacheShards>> cache_ =
      std::make_unique<std::array<CacheShard, kCacheShards>>();

  std::vector<std::string> vocab_;
  absl::flat_hash_map<std::string, TokenId> ids_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int64_t, 256> byte_ids_{};      // byte-level: id of each byte's character, or -1
  std::array<int64_t, 256> fallback_ids_{};  // byte_fallback: id of <0xXX>, or -1
  int64_t unk_id_ = -1;
  BpeOptions options_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_BPE_MODEL_H_
