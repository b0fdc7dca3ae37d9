#include "engine/tokenizer/bpe_model.h"

#include <queue>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/utf8.h"

namespace ferry {

BpeModel::BpeModel(BpeModel&& other) noexcept { *this = std::move(other); }

BpeModel& BpeModel::operator=(BpeModel&& other) noexcept {
  cache_ = std::move(other.cache_);
  vocab_ = std::move(other.vocab_);
  ids_ = std::move(other.ids_);
  merges_ = std::move(other.merges_);
  byte_ids_ = other.byte_ids_;
  fallback_ids_ = other.fallback_ids_;
  unk_id_ = other.unk_id_;
  options_ = other.options_;
  other.cache_ = std::make_unique<std::array<CacheShard, kCacheShards>>();
  return *this;
}

absl::StatusOr<BpeModel> BpeModel::Create(
    std::vector<std::string> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
    const BpeOptions& options) {
  BpeModel model;
  model.options_ = options;
  model.vocab_ = std::move(vocab);
  model.ids_.reserve(model.vocab_.size());
  for (size_t id = 0; id < model.vocab_.size(); ++id) {
    if (model.vocab_[id].empty()) continue;
    if (!model.ids_.emplace(model.vocab_[id], static_cast<TokenId>(id)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE vocabulary has the token '", model.vocab_[id], "' twice"));
    }
  }
  model.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = model.ids_.find(left), r = model.ids_.find(right);
    auto m = model.ids_.find(left + right);
    if (l == model.ids_.end() || r == model.ids_.end() || m == model.ids_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("BPE merge ", rank, " ('", left, "' '", right,
                                                     "') uses a token outside the vocabulary"));
    }
    // The first (lowest-rank) occurrence of a pair wins, as in HF.
    model.merges_.emplace(PairKey(l->second, r->second),
                          Merge{static_cast<uint32_t>(rank), m->second});
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(ByteToUnicode(static_cast<uint8_t>(b)), &ch);
    auto it = model.ids_.find(ch);
    model.byte_ids_[b] = it == model.ids_.end() ? int64_t{-1} : int64_t{it->second};
    auto fb = model.ids_.find(absl::StrFormat("<0x%02X>", b));
    model.fallback_ids_[b] = fb == model.ids_.end() ? int64_t{-1} : int64_t{fb->second};
  }
  if (options.unk_token.has_value()) {
    auto it = model.ids_.find(*options.unk_token);
    if (it == model.ids_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unk_token '", *options.unk_token, "' is not in the vocabulary"));
    }
    model.unk_id_ = it->second;
  }
  return model;
}

std::optional<TokenId> BpeModel::Find(absl::string_view token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::InitialSymbols(absl::string_view word, std::vector<TokenId>* symbols) const {
  symbols->clear();
  if (options_.byte_level) {
    // A byte whose character is not in the vocabulary becomes unk, or is dropped when there is
    // no unk token (as HF and llama.cpp do; SmolLM2's vocabulary lacks e.g. 0xC0 and 0xF5-0xFF).
    for (unsigned char c : word) {
      if (byte_ids_[c] >= 0) {
        symbols->push_back(static_cast<TokenId>(byte_ids_[c]));
      } else if (unk_id_ >= 0) {
        symbols->push_back(static_cast<TokenId>(unk_id_));
      }
    }
    return;
  }
  bool previous_unk = false;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t begin = pos;
    NextCodePoint(word, &pos);
    const absl::string_view ch = word.substr(begin, pos - begin);
    auto it = ids_.find(ch);
    if (it != ids_.end()) {
      symbols->push_back(it->second);
      previous_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char c : ch) all = all && fallback_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : ch) symbols->push_back(static_cast<TokenId>(fallback_ids_[c]));
        previous_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0 && !(options_.fuse_unk && previous_unk)) {
      symbols->push_back(static_cast<TokenId>(unk_id_));
    }
    previous_unk = unk_id_ >= 0;
  }
}

void BpeModel::ApplyMerges(std::vector<TokenId>* symbols) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  std::vector<TokenId>& ids = *symbols;
  std::vector<bool> alive(n, true);
  struct Candidate {
    uint32_t rank;
    int pos;
    TokenId left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(PairKey(ids[pos], ids[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, ids[pos], ids[next[pos]]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int right = next[c.pos];
    if (ids[c.pos] != c.left || ids[right] != c.right) continue;  // stale
    ids[c.pos] = merges_.find(PairKey(c.left, c.right))->second.merged;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  size_t out = 0;
  for (int i = 0; i >= 0; i = next[i]) ids[out++] = ids[i];
  ids.resize(out);
}

void BpeModel::EncodeWord(absl::string_view word, std::vector<TokenId>* out) const {
  if (word.empty()) return;
  CacheShard* shard = nullptr;
  if (word.size() < kMaxCachedWord) {
    shard = &(*cache_)[absl::HashOf(word) % kCacheShards];
    absl::MutexLock lock(&shard->mu);
    auto it = shard->words.find(word);
    if (it != shard->words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out->size();
  EncodeWordUncached(word, out);
  if (shard != nullptr) {
    absl::MutexLock lock(&shard->mu);
    if (shard->words.size() < kCacheEntriesPerShard) {
      shard->words.emplace(word, std::vector<TokenId>(out->begin() + start, out->end()));
    }
  }
}

void BpeModel::EncodeWordUncached(absl::string_view word, std::vector<TokenId>* out) const {
  if (options_.ignore_merges) {
    std::string mapped;
    if (options_.byte_level) {
      for (unsigned char c : word) AppendUtf8(ByteToUnicode(c), &mapped);
    } else {
      mapped = std::string(word);
    }
    auto it = ids_.find(mapped);
    if (it != ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<TokenId> symbols;
  InitialSymbols(word, &symbols);
  ApplyMerges(&symbols);
  out->insert(out->end(), symbols.begin(), symbols.end());
}

}  // namespace ferry
