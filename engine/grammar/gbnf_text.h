// Writing GBNF text (llama.cpp's grammar dialect, see docs/design/grammar.md): quoting literals,
// character classes over Unicode code point ranges, the JSON string character rules the JSON
// Schema and regex compilers share, rules for free text around a marker (what a tool-call or
// reasoning parser looks for), and renaming rules so that several grammars share one text. GBNF
// characters are Unicode code points; this module writes printable ASCII as itself, other ASCII
// as \xXX (\n \t \r by name) and non-ASCII code points as their UTF-8 (llguidance's GBNF
// reader mangles \u and \U escapes of fewer significant digits, and raw UTF-8 is plain GBNF).
//
// Pure functions over values; thread-safe. Nothing here fails: callers validate their input
// (code points in [0, 0x10FFFF], non-empty range sets where a class is asked for).

#ifndef FERRY_ENGINE_GRAMMAR_GBNF_TEXT_H_
#define FERRY_ENGINE_GRAMMAR_GBNF_TEXT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace ferry::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// A set of code points as sorted, disjoint, non-adjacent closed ranges [first, second].
using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorts and merges overlapping or adjacent ranges.
CodePointRanges NormalizeRanges(CodePointRanges ranges);

// The complement within [0, kMaxCodePoint], leaving out the surrogates D800-DFFF (which UTF-8
// cannot carry). `ranges` must be normalized.
CodePointRanges ComplementRanges(const CodePointRanges& ranges);

// `a` minus `b`; both normalized.
CodePointRanges SubtractRanges(const CodePointRanges& a, const CodePointRanges& b);

// A GBNF literal for the UTF-8 string `text` (decoded as code points; invalid bytes are written as
// \xXX of the byte, which GBNF reads as that code point, so pass valid UTF-8): "...".
std::string GbnfLiteral(absl::string_view text);

// The GBNF literal for the one code point `cp`.
std::string GbnfCodePointLiteral(uint32_t cp);

// A GBNF character class matching exactly `ranges` (normalized, non-empty): [a-z0-9].
std::string GbnfClass(const CodePointRanges& ranges);

// The canonical JSON encoding of one code point inside a string, as Python's
// json.dumps(ensure_ascii=False) writes it: `"` -> \", `\` -> \\, \b \f \n \r \t, other control
// characters -> \u00xx (lower-case hex), everything else as itself (UTF-8).
std::string JsonEncodedChar(uint32_t cp);

// A GBNF expression matching the canonical JSON encodings (JsonEncodedChar) of exactly the code
// points in `ranges` (normalized, non-empty): one class for the characters written as
// themselves, plus an alternative per escaped character.
std::string GbnfJsonCharsIn(const CodePointRanges& ranges);

// Rules (GBNF text, one `name ::= ...` line per state, rules named `name` and `name-N`) for any
// text that ends at the first occurrence of `marker` (non-empty, valid UTF-8): the text before it
// never contains it, and the marker itself is the rule's last bytes. Built from the marker's KMP
// automaton over code points, so it is exact for any marker: one rule per state (the length of
// the marker's prefix the text ends with), each alternative a class of characters and the next
// state ("any other character" is the complement class and goes back to `name`).
std::string GbnfTextUntilRules(absl::string_view name, absl::string_view marker);

// Rules as above for any text (the empty text included) in which `marker` does not occur.
std::string GbnfTextWithoutRules(absl::string_view name, absl::string_view marker);

// The same for several markers (Aho-Corasick's automaton, of which KMP's is the one-marker case),
// for a parser that looks for the first of several: text that ends at the first occurrence of
// `marker` and contains none of `others` before; text that contains none of `markers`. Where two
// markers end at the same character, the longer one (which began first) counts.
std::string GbnfTextUntilRules(absl::string_view name, absl::string_view marker,
                               const std::vector<std::string>& others);
std::string GbnfTextWithoutAnyRules(absl::string_view name,
                                    const std::vector<std::string>& markers);

// `gbnf` with rule `from` renamed `to`, at its definition and every reference (names outside
// literals, classes, repetition counts and comments); `to` must not be a rule of `gbnf` already.
std::string RenameGbnfRule(absl::string_view gbnf, absl::string_view from, absl::string_view to);

// `gbnf` with every rule name `n` renamed `prefix` + `n` (as RenameGbnfRule, in one pass): to put
// several grammars in one text (`prefix` ends in '-' by convention: "t0-root").
std::string PrefixGbnfRules(absl::string_view gbnf, absl::string_view prefix);

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_GBNF_TEXT_H_
