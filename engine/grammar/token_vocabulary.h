// The bytes each token of a loaded tokenizer produces, the input of TokenTrie::Build.
//
// A token's bytes are what the tokenizer's decoder gives for that token alone (for byte-level
// BPE, such as SmolLM2's, the exact raw bytes, so partial UTF-8 tokens keep their bytes). Special
// tokens, and ids with no vocabulary entry, get "" (the grammar never produces them; stop ids
// are allowed by id), except the special tokens in `kept_special`, which get their text: the
// markers a request keeps as text (SamplingParams.keep_special_token_ids, e.g. Mistral's
// [TOOL_CALLS]) are then tokens a grammar can produce. Ids in `kept_special` that are not
// special change nothing. For SentencePiece-style decoders that strip a leading space when a token
// is decoded alone this is not a token's bytes in context: such vocabularies need a per-token
// rule that is not built yet.
//
// Thread-safe (pure function over a const tokenizer).

#ifndef FERRY_ENGINE_GRAMMAR_TOKEN_VOCABULARY_H_
#define FERRY_ENGINE_GRAMMAR_TOKEN_VOCABULARY_H_

#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry::grammar {

std::vector<std::string> TokenBytesOf(const Tokenizer& tokenizer,
                                      absl::Span<const TokenId> kept_special = {});

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_TOKEN_VOCABULARY_H_
