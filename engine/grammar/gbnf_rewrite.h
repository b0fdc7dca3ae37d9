// Rewriting GBNF text (llama.cpp's dialect, gbnf_parser.h) so that grammars can be combined: every
// rule name given a prefix, so two grammars' rules never collide and a wrapper can refer to each
// one's start rule (`<prefix>root`).
//
// Names are recognised as the parser reads them (runs of ASCII letters, digits, '-' and '_')
// outside string literals, character classes, repetition bounds `{m,n}` and `#` comments; all
// of them are rule names (definitions and references). Pure functions; thread-safe. The text is
// not validated: a text the parser refuses stays one it refuses.

#ifndef FERRY_ENGINE_GRAMMAR_GBNF_REWRITE_H_
#define FERRY_ENGINE_GRAMMAR_GBNF_REWRITE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ferry::grammar {

// `gbnf` with `prefix` (letters, digits, '-') put before every rule name.
std::string PrefixGbnfRules(absl::string_view gbnf, absl::string_view prefix);

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_GBNF_REWRITE_H_
