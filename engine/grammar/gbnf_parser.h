// GBNF parser: llama.cpp's grammar dialect (grammars/README.md in llama.cpp) -> a Grammar.
//
// The dialect: `name ::= alternatives` rules (names of ASCII letters, digits, '-' and '_'), `root`
// the start rule; "literals" and [character classes] with ranges and `^` negation, `.` for any
// character; escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH (code points); ( ) groups, `|`
// alternation, postfix * + ? {m} {m,} {m,n}; `#` comments to the end of the line. A rule ends at
// a newline except inside parentheses or right after `|`. Characters are Unicode code points
// matched as their UTF-8 bytes; the grammar text must be valid UTF-8.
//
// Differences from llama.cpp, all refusals with an error rather than other meanings: a rule
// defined twice (llama.cpp keeps the last), token references `<...>` (llama.cpp's token-level
// syntax), and left recursion (llama.cpp refuses it too).
//
// Errors are InvalidArgument "line L, column C: what is wrong" (columns count bytes from 1).
// Every size is bounded by GbnfLimits; exceeding one is InvalidArgument naming the limit.
// Thread-safe (pure function).

#ifndef FERRY_ENGINE_GRAMMAR_GBNF_PARSER_H_
#define FERRY_ENGINE_GRAMMAR_GBNF_PARSER_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"

namespace ferry::grammar {

struct GbnfLimits {
  size_t max_text_bytes = 1 << 20;
  // Rules including the generated ones (groups, repetitions, multi-byte classes).
  size_t max_rules = 50000;
  // Elements in all alternatives together, after lowering repetitions.
  size_t max_elements = 1 << 20;
  // The largest m or n in {m}, {m,}, {m,n}.
  size_t max_repetition = 10000;
  // Parentheses nested in parentheses.
  size_t max_nesting_depth = 64;
};

absl::StatusOr<Grammar> ParseGbnf(absl::string_view text, const GbnfLimits& limits = {});

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_GBNF_PARSER_H_
