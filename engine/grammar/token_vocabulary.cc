#include "engine/grammar/token_vocabulary.h"

#include <algorithm>
#include <string>
#include <vector>

namespace ferry::grammar {

std::vector<std::string> TokenBytesOf(const Tokenizer& tokenizer,
                                      absl::Span<const TokenId> kept_special) {
  std::vector<std::string> bytes(tokenizer.vocab_size());
  for (size_t id = 0; id < bytes.size(); ++id) {
    TokenId t = static_cast<TokenId>(id);
    if (tokenizer.IsSpecial(t) &&
        std::find(kept_special.begin(), kept_special.end(), t) == kept_special.end()) {
      continue;
    }
    absl::StatusOr<std::string> b = tokenizer.DecodeBytes({t});
    // An id without a vocabulary entry (a hole) stays "": never allowed.
    if (b.ok()) bytes[id] = *std::move(b);
  }
  return bytes;
}

}  // namespace ferry::grammar
