// GGUF files name their pre-tokenizer (`tokenizer.ggml.pre`) instead of storing its rules; this
// table maps the names to the split rules, as llama.cpp defines them for the same names. Unknown
// names are an error listing the known ones.

#ifndef FERRY_ENGINE_TOKENIZER_GGUF_PRE_TOKENIZERS_H_
#define FERRY_ENGINE_TOKENIZER_GGUF_PRE_TOKENIZERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/pre_tokenizer.h"

namespace ferry {

// The regexes applied in order (each splits the pieces of the previous, matches isolated).
absl::StatusOr<std::vector<std::string>> GgufPreTokenizerPatterns(absl::string_view name);

absl::StatusOr<PreTokenizer> GgufPreTokenizer(absl::string_view name);

std::vector<std::string> KnownGgufPreTokenizers();

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_GGUF_PRE_TOKENIZERS_H_
