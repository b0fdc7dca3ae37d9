// Fuzz target for the GBNF parser, the matcher and token masks.
//
// Input: grammar text, a NUL byte, then bytes to match. The grammar must parse or be refused with
// InvalidArgument (never crash or hang; small limits keep each input fast); a parsed grammar's
// matcher consumes the bytes until one is refused or a limit is hit, rollback must restore the
// accepting state, and on a small vocabulary the cached mask must equal the plain trie walk's.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "engine/common/log.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/token_matcher.h"

namespace {

using ferry::grammar::GrammarMatcher;

std::shared_ptr<const ferry::grammar::TokenTrie> SmallTrie() {
  static const auto* trie = [] {
    std::vector<std::string> vocab = {"",   "a", "b",    "ab",   "ba",  "[",  "]",   "[[",
                                      "]]", ",", " ",    "\"",   "\":", "{",  "}",   "0",
                                      "12", "x", "\xc3", "\xa9", "é",   "\n", "aaa", "abc"};
    auto t = ferry::grammar::TokenTrie::Build(vocab);
    CHECK_OK(t.status());
    return new std::shared_ptr<const ferry::grammar::TokenTrie>(*t);
  }();
  return *trie;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view all(reinterpret_cast<const char*>(data), size);
  size_t nul = all.find('\0');
  absl::string_view text = all.substr(0, nul);
  absl::string_view input = nul == absl::string_view::npos ? "" : all.substr(nul + 1);
  ferry::grammar::GbnfLimits limits;
  limits.max_text_bytes = 4096;
  limits.max_rules = 2000;
  limits.max_elements = 20000;
  limits.max_repetition = 50;
  auto grammar = ferry::grammar::ParseGbnf(text, limits);
  if (!grammar.ok()) {
    CHECK(grammar.status().code() == absl::StatusCode::kInvalidArgument) << grammar.status();
    return 0;
  }
  auto shared = std::make_shared<const ferry::grammar::Grammar>(*std::move(grammar));
  ferry::grammar::MatcherLimits matcher_limits;
  matcher_limits.max_stacks = 256;
  matcher_limits.max_expansions = 4096;
  matcher_limits.max_nodes = 1 << 16;
  auto matcher = GrammarMatcher::Create(shared, matcher_limits);
  if (!matcher.ok()) return 0;
  bool accepting0 = matcher->Accepting();
  for (char c : input) {
    if (matcher->Advance(static_cast<uint8_t>(c)) != GrammarMatcher::Step::kOk) break;
  }
  matcher->Rollback(0);
  CHECK(matcher->Accepting() == accepting0);
  CHECK(matcher->Checkpoint() == 0);

  auto tokens = ferry::grammar::TokenMatcher::Create(shared, SmallTrie(), {0}, matcher_limits);
  if (!tokens.ok()) return 0;
  std::vector<uint32_t> mask(1), walked(1);
  for (int step = 0; step < 8; ++step) {
    tokens->ComputeMask(absl::MakeSpan(mask));
    size_t hits = tokens->matcher().limit_hits();
    tokens->ComputeMaskByWalk(absl::MakeSpan(walked));
    // A walk that hit a matcher limit refused tokens for it; the cache's shorter stacks may not.
    bool limited = tokens->matcher().limit_hits() != hits;
    CHECK(limited || mask == walked) << "cached mask " << mask[0] << " walk " << walked[0]
                                     << " at step " << step << " for grammar:\n"
                                     << text << "\ninput: " << absl::CHexEscape(input);
    // Follow the input: its bytes pick which allowed token to take.
    uint32_t pick = step < static_cast<int>(input.size()) ? static_cast<uint8_t>(input[step]) : 0;
    uint32_t taken = 0;
    for (uint32_t id = 1, seen = 0; id < SmallTrie()->vocab_size(); ++id) {
      if ((mask[0] >> id) & 1) {
        if (seen++ == pick % 32) taken = id;
        if (taken == 0) taken = id;
      }
    }
    if (taken == 0 || !tokens->Accept(taken).ok()) break;
  }
  return 0;
}
