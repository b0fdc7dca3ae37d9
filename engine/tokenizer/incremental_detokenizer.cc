#include "engine/tokenizer/incremental_detokenizer.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "engine/common/status.h"
#include "engine/tokenizer/utf8.h"

namespace ferry {

// The window ids_[prefix_offset_, size) is decoded whole each time, so start-of-text rules
// (Strip, Metaspace) act on it as they act on a full decode, and only the part after
// ids_[prefix_offset_, read_offset_) is new. Text is emitted only when the whole window ends on a
// complete character; then the window slides.
absl::StatusOr<std::string> IncrementalDetokenizer::Push(TokenId id) {
  if (id >= tokenizer_.vocab_size() || tokenizer_.TokenString(id).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
  }
  ++pushed_;
  // A skipped special token adds nothing (as Decode with skip_special leaves it out).
  if (skip_special_ && tokenizer_.IsSpecial(id) &&
      std::find(keep_.begin(), keep_.end(), id) == keep_.end()) {
    return std::string();
  }
  ids_.push_back(id);
  if (tokenizer_.IsByteFallbackToken(id)) return std::string();  // the byte group may go on
  const absl::Span<const TokenId> ids(ids_);
  ASSIGN_OR_RETURN(
      const std::string before,
      tokenizer_.DecodeBytes(ids.subspan(prefix_offset_, read_offset_ - prefix_offset_), false));
  ASSIGN_OR_RETURN(const std::string now,
                   tokenizer_.DecodeBytes(ids.subspan(prefix_offset_), false));
  // Held back: an incomplete UTF-8 tail (byte-level), a U+FFFD tail (a byte-fallback chain
  // renders incomplete characters so), or a window whose start changed (never for HF decoders).
  const bool incomplete = IncompleteUtf8Suffix(now) > 0 ||
                          (now.size() >= 3 && now.compare(now.size() - 3, 3, "\xef\xbf\xbd") == 0);
  if (incomplete || now.size() <= before.size() || now.compare(0, before.size(), before) != 0) {
    return std::string();
  }
  std::string delta = Utf8Lossy(absl::string_view(now).substr(before.size()));
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  emitted_ += delta;
  return delta;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Finish() {
  ASSIGN_OR_RETURN(const std::string all, tokenizer_.Decode(ids_, false));
  if (all.compare(0, emitted_.size(), emitted_) != 0) {
    return absl::InternalError("incremental detokenization diverged from the full decode");
  }
  std::string rest = all.substr(emitted_.size());
  emitted_ = all;
  return rest;
}

}  // namespace ferry
