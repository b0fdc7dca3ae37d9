#include "engine/tokenizer/gguf_pre_tokenizers.h"

#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status.h"

namespace ferry {
namespace {

// Llama-3 (and its derivatives): letters with one leading non-letter, numbers in groups of up
// to three, punctuation runs with trailing newlines, newline runs, other whitespace.
constexpr char kLlama3Pattern[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Qwen2: as Llama-3 but every digit on its own.
constexpr char kQwen2Pattern[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const std::map<std::string, std::vector<std::string>>& Table() {
  static const auto* table = new std::map<std::string, std::vector<std::string>>{
      {"gpt-2", {kGpt2Pattern}},
      {"gpt2", {kGpt2Pattern}},
      // StarCoder-family vocabularies: digits split individually, then GPT-2.
      {"smollm", {"\\p{N}", kGpt2Pattern}},
      {"starcoder", {"\\p{N}", kGpt2Pattern}},
      {"refact", {"\\p{N}", kGpt2Pattern}},
      {"llama-bpe", {kLlama3Pattern}},
      {"llama3", {kLlama3Pattern}},
      {"qwen2", {kQwen2Pattern}},
  };
  return *table;
}

}  // namespace

std::vector<std::string> KnownGgufPreTokenizers() {
  std::vector<std::string> names;
  for (const auto& [name, patterns] : Table()) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<std::string>> GgufPreTokenizerPatterns(absl::string_view name) {
  auto it = Table().find(std::string(name));
  if (it == Table().end()) {
    return absl::UnimplementedError(absl::StrCat(
        "unknown GGUF pre-tokenizer '", name,
        "' (tokenizer.ggml.pre); known: ", absl::StrJoin(KnownGgufPreTokenizers(), ", ")));
  }
  return it->second;
}

absl::StatusOr<PreTokenizer> GgufPreTokenizer(absl::string_view name) {
  ASSIGN_OR_RETURN(const std::vector<std::string> patterns, GgufPreTokenizerPatterns(name));
  std::vector<PreTokenizerStep> steps;
  for (const std::string& pattern : patterns) {
    ASSIGN_OR_RETURN(PreTokenizerStep step,
                     PreTokenizer::SplitStep(pattern, SplitBehavior::kIsolated, false));
    steps.push_back(std::move(step));
  }
  return PreTokenizer(std::move(steps));
}

}  // namespace ferry
