#include "engine/tokenizer/tokenizer.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/common/thread_pool.h"
#include "engine/tokenizer/gguf_pre_tokenizers.h"
#include "engine/tokenizer/utf8.h"

namespace ferry {

namespace {

constexpr size_t kParallelChunkBytes = 16 * 1024;

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Patterns whose matches never span "X\nL" (X not whitespace, L an ASCII letter) and whose
// lookahead cannot see across it differently: a piece never continues from a newline into a
// letter, and the newline before the letter is always a piece of its own or the end of one.
bool IsKnownSafePattern(const std::string& pattern) {
  static const auto* known = [] {
    auto* set = new std::vector<std::string>{kGpt2Pattern, "\\p{N}"};
    for (const char* name : {"llama-bpe", "qwen2"}) {
      const absl::StatusOr<std::vector<std::string>> patterns = GgufPreTokenizerPatterns(name);
      for (const std::string& p : *patterns) set->push_back(p);
    }
    return set;
  }();
  for (const std::string& k : *known) {
    if (k == pattern) return true;
  }
  // The same Llama-3 / Qwen2 patterns as HF files spell them, with (?i:...).
  return pattern ==
             "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
             "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" ||
         pattern ==
             "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
             "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
}

}  // namespace

absl::Status Tokenizer::Finish() {
  token_strings_.assign(model_->vocab_size(), std::string());
  for (size_t id = 0; id < model_->vocab_size(); ++id) {
    token_strings_[id] = model_->token(static_cast<TokenId>(id));
  }
  for (const AddedToken& token : added_) {
    if (token.content.empty()) return absl::InvalidArgumentError("an added token is empty");
    if (token.id >= token_strings_.size()) token_strings_.resize(token.id + 1);
    token_strings_[token.id] = token.content;
    if (token.special) special_ids_.insert(token.id);
    const auto first = static_cast<unsigned char>(token.content[0]);
    first_byte_any_[first] = true;
    if (!token.special) first_byte_plain_[first] = true;
  }
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  parallel_safe_ = normalizer_.unicode_forms_only();
  for (const PreTokenizerStep& step : pre_tokenizer_.steps()) {
    const bool safe_split = step.kind == PreTokenizerStep::Kind::kSplit &&
                            step.behavior == SplitBehavior::kIsolated && !step.invert &&
                            IsKnownSafePattern(step.regex->pattern());
    const bool safe_byte_level =
        step.kind == PreTokenizerStep::Kind::kByteLevel && !step.add_prefix_space &&
        (step.regex == nullptr || IsKnownSafePattern(step.regex->pattern()));
    if (!safe_split && !safe_byte_level) parallel_safe_ = false;
  }
  byte_fallback_tokens_.assign(token_strings_.size(), false);
  if (decoder_.has_byte_fallback()) {
    for (size_t id = 0; id < token_strings_.size(); ++id) {
      byte_fallback_tokens_[id] = ByteFallbackValue(token_strings_[id]) >= 0;
    }
  }
  if (decoder_.byte_level_only()) {
    byte_level_bytes_.resize(token_strings_.size());
    for (size_t id = 0; id < token_strings_.size(); ++id) {
      byte_level_bytes_[id] = ByteLevelTokenBytes(token_strings_[id]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Normalize(absl::string_view text) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("input is not valid UTF-8");
  if (normalizer_.empty()) return std::string(text);
  return normalizer_.Normalize(text);
}

const std::string& Tokenizer::TokenString(TokenId id) const {
  static const std::string* const kEmpty = new std::string();
  return id < token_strings_.size() ? token_strings_[id] : *kEmpty;
}

std::vector<size_t> Tokenizer::ParallelBoundaries(absl::string_view text,
                                                  size_t chunk_bytes) const {
  std::vector<size_t> cuts;
  size_t target = chunk_bytes;
  while (target + 2 < text.size()) {
    size_t i = std::max<size_t>(target, 2);
    while (i < text.size() &&
           !(text[i - 1] == '\n' && IsAsciiLetter(text[i]) && !IsAsciiSpace(text[i - 2]))) {
      ++i;
    }
    if (i >= text.size()) break;
    cuts.push_back(i);
    target = i + chunk_bytes;
  }
  return cuts;
}

absl::Status Tokenizer::EncodeText(absl::string_view text, bool at_start,
                                   std::vector<TokenId>* out) const {
  if (text.empty()) return absl::OkStatus();
  if (parallel_safe_ && parallel_threshold_ > 0 && text.size() > parallel_threshold_) {
    std::vector<size_t> cuts = ParallelBoundaries(text, kParallelChunkBytes);
    if (!cuts.empty()) {
      cuts.insert(cuts.begin(), 0);
      cuts.push_back(text.size());
      const size_t chunks = cuts.size() - 1;
      std::vector<std::vector<TokenId>> ids(chunks);
      std::vector<absl::Status> statuses(chunks);
      ThreadPool::Shared().ParallelFor(chunks, [&](size_t c) {
        statuses[c] =
            EncodePlain(text.substr(cuts[c], cuts[c + 1] - cuts[c]), at_start && c == 0, &ids[c]);
      });
      for (size_t c = 0; c < chunks; ++c) {
        RETURN_IF_ERROR(statuses[c]);
        out->insert(out->end(), ids[c].begin(), ids[c].end());
      }
      return absl::OkStatus();
    }
  }
  return EncodePlain(text, at_start, out);
}

absl::Status Tokenizer::EncodePlain(absl::string_view text, bool at_start,
                                    std::vector<TokenId>* out) const {
  std::string normalized;
  if (!normalizer_.empty()) {
    ASSIGN_OR_RETURN(normalized, normalizer_.Normalize(text));
    text = normalized;
  }
  if (pre_tokenizer_.splits_only()) {
    std::vector<std::pair<size_t, size_t>> ranges;
    RETURN_IF_ERROR(pre_tokenizer_.SplitRanges(text, &ranges));
    for (const auto& [begin, end] : ranges)
      model_->EncodeWord(text.substr(begin, end - begin), out);
    return absl::OkStatus();
  }
  std::vector<std::string> pieces;
  RETURN_IF_ERROR(pre_tokenizer_.Split(text, at_start, &pieces));
  for (const std::string& piece : pieces) model_->EncodeWord(piece, out);
  return absl::OkStatus();
}

namespace {

// The plain text between two added tokens, gathered over segments: HF tokenizes the whole string,
// so the pre-tokenizer and BPE must see the text on both sides of a segment boundary together
// (a template's "USER: " and the user's "Say" give " Say", not " " and "Say"). Views while the
// text is one piece; a copy once it spans two.
class PendingText {
 public:
  void Append(absl::string_view text) {
    if (text.empty()) return;
    if (pieces_ == 0) {
      view_ = text;
    } else {
      if (pieces_ == 1) joined_.assign(view_.data(), view_.size());
      joined_.append(text.data(), text.size());
    }
    ++pieces_;
  }
  absl::string_view text() const { return pieces_ > 1 ? absl::string_view(joined_) : view_; }
  void Clear() {
    pieces_ = 0;
    view_ = {};
    joined_.clear();
  }

 private:
  int pieces_ = 0;
  absl::string_view view_;
  std::string joined_;
};

}  // namespace

absl::StatusOr<std::vector<TokenId>> Tokenizer::Encode(absl::string_view text,
                                                       bool allow_special) const {
  const TextSegment segment{text, allow_special};
  return Encode(absl::MakeConstSpan(&segment, 1));
}

absl::StatusOr<std::vector<TokenId>> Tokenizer::Encode(
    absl::Span<const TextSegment> segments) const {
  std::vector<TokenId> ids;
  PendingText pending;
  bool at_start = true;  // no added token yet: the pending text begins the input
  for (const TextSegment& segment : segments) {
    const absl::string_view text = segment.text;
    const size_t valid = ValidUtf8Prefix(text);
    if (valid != text.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input is not valid UTF-8 (at byte ", valid, ")"));
    }
    // Leftmost-longest match of the added tokens this segment may contain (added_ is sorted
    // longest first, so the first hit at a position is the longest). A match never crosses a
    // segment boundary: user text cannot complete a control token the template began.
    const std::array<bool, 256>& first_bytes =
        segment.allow_special ? first_byte_any_ : first_byte_plain_;
    size_t start = 0;  // beginning of this segment's pending plain text
    size_t pos = 0;
    while (pos < text.size()) {
      if (!first_bytes[static_cast<unsigned char>(text[pos])]) {
        ++pos;
        continue;
      }
      const AddedToken* hit = nullptr;
      for (const AddedToken& token : added_) {
        if (token.special && !segment.allow_special) continue;
        if (text.compare(pos, token.content.size(), token.content) == 0) {
          hit = &token;
          break;
        }
      }
      if (hit == nullptr) {
        ++pos;
        continue;
      }
      pending.Append(text.substr(start, pos - start));
      RETURN_IF_ERROR(EncodeText(pending.text(), at_start, &ids));
      pending.Clear();
      at_start = false;
      ids.push_back(hit->id);
      pos += hit->content.size();
      start = pos;
    }
    pending.Append(text.substr(start));
  }
  RETURN_IF_ERROR(EncodeText(pending.text(), at_start, &ids));
  return ids;
}

absl::StatusOr<std::string> Tokenizer::DecodeBytes(absl::Span<const TokenId> ids,
                                                   bool skip_special) const {
  for (TokenId id : ids) {
    if (id >= token_strings_.size() || token_strings_[id].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
  }
  if (!byte_level_bytes_.empty()) {
    std::string bytes;
    for (TokenId id : ids) {
      if (skip_special && special_ids_.contains(id)) continue;
      bytes += byte_level_bytes_[id];
    }
    return bytes;
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (TokenId id : ids) {
    if (skip_special && special_ids_.contains(id)) continue;
    tokens.push_back(token_strings_[id]);
  }
  return decoder_.DecodeToBytes(std::move(tokens));
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const TokenId> ids,
                                              bool skip_special) const {
  ASSIGN_OR_RETURN(std::string bytes, DecodeBytes(ids, skip_special));
  return Utf8Lossy(bytes);
}

}  // namespace ferry
