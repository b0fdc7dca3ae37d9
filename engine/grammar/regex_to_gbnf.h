// Regular expressions lowered to GBNF (docs/design/grammar.md, "Regex subset"): the "regex"
// constraint (a full match of the whole output) and JSON Schema's `pattern` (a search inside a
// JSON string's content, written in its JSON encoding).
//
// The subset, with Python `re` (str patterns, no flags) as the reference semantics except where
// noted: literals; escapes \d \D \w \W \s \S (ASCII meaning, as ECMA-262 defines them: \d is
// [0-9], \w is [A-Za-z0-9_], \s is [ \t\n\r\f\v]), \n \t \r \f \v \0 \xHH \uHHHH \UHHHHHHHH and
// any escaped punctuation; character classes with ranges, negation and the class escapes; `.`
// (any character but \n); groups, non-capturing (?:...) and named (?P<n>...) (?<n>...) groups;
// alternation; the quantifiers * + ? {m} {m,} {m,n} {,n}, lazy forms included (a lazy
// quantifier matches the same language); anchors ^ and $ at the start and end of a top-level
// alternative only ($ means the end of the string, not "before a final newline").
// Refused with InvalidArgument: backreferences, lookaround, word boundaries (\b \B), \A \Z,
// inline flags, conditionals, possessive quantifiers, Unicode properties (\p), anchors anywhere
// else, unknown escapes, and patterns beyond the limits below.
//
// Pure functions; thread-safe.

#ifndef FERRY_ENGINE_GRAMMAR_REGEX_TO_GBNF_H_
#define FERRY_ENGINE_GRAMMAR_REGEX_TO_GBNF_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry::grammar {

struct RegexLimits {
  // Bytes of pattern text.
  int max_pattern_bytes = 4096;
  // Nesting of groups.
  int max_depth = 64;
  // The largest bound in a counted repetition {m,n}.
  int max_repeat = 1000;
  // The matched-length budget: the sum over the pattern of each atom's width times the product
  // of the bounds it sits under (an unbounded * counts once). Stops (a{1000}){1000}.
  long long max_expanded_size = 100000;
};

// Where the regex's characters are matched.
enum class RegexTarget {
  // Raw text: each character as its UTF-8 bytes.
  kRawText,
  // The content of a JSON string: each character in its canonical JSON encoding (as
  // json.dumps(ensure_ascii=False) writes it: \" \\ \n ... and \u00xx for other controls).
  kJsonStringContent,
};

// A GBNF expression (no rule definitions) matching the strings `pattern` fully matches; anchors
// at the ends are allowed and change nothing.
absl::StatusOr<std::string> RegexToGbnfExpression(absl::string_view pattern, RegexTarget target,
                                                  const RegexLimits& limits = {});

// A GBNF expression for JSON Schema's `pattern`: the JSON string contents (without quotes) whose
// decoded text contains a match of `pattern` (re.search), unless anchored by ^ / $.
// `any_json_char` names the rule (or expression) for any one JSON string character, escapes
// included, used for the unanchored sides.
absl::StatusOr<std::string> PatternToGbnfJsonContent(absl::string_view pattern,
                                                     absl::string_view any_json_char,
                                                     const RegexLimits& limits = {});

// A whole grammar (`root ::= ...`) for the regex constraint: raw output text fully matching
// `pattern`.
absl::StatusOr<std::string> RegexToGbnf(absl::string_view pattern, const RegexLimits& limits = {});

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_REGEX_TO_GBNF_H_
