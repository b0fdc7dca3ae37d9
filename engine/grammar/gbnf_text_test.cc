#include "engine/grammar/gbnf_text.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace ferry::grammar {
namespace {

using CodePoints = std::vector<uint32_t>;

CodePoints Decode(const std::string& s) {
  // The test's markers and alphabets are valid UTF-8 written in the source.
  CodePoints out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string Utf8(uint32_t cp) {
  std::string out;
  AppendUtf8(cp, &out);
  return out;
}

// The reference, straight from the definitions: the first character at which some marker ends
// (a code point index, or -1) and which one: the longest ending there, i.e. the one that began
// first, as a parser's search finds it.
struct Hit {
  long end = -1;
  int marker = -1;
};
Hit FirstHit(const CodePoints& s, const std::vector<CodePoints>& markers) {
  for (size_t end = 1; end <= s.size(); ++end) {
    Hit hit;
    for (size_t i = 0; i < markers.size(); ++i) {
      const CodePoints& m = markers[i];
      if (m.size() > end || (hit.marker >= 0 && m.size() <= markers[hit.marker].size())) continue;
      if (std::equal(m.begin(), m.end(), s.begin() + (end - m.size()))) {
        hit = {static_cast<long>(end), static_cast<int>(i)};
      }
    }
    if (hit.marker >= 0) return hit;
  }
  return {};
}

// Until (markers[0] ends the text, the others are refused): `s` is in the language when the
// first hit is markers[0] at its end; a prefix can still be completed when nothing hit yet or it
// is in the language. Without: nothing hits (nor in any prefix, then).
struct MarkerCase {
  bool until;
  std::vector<CodePoints> markers;
  std::unique_ptr<GrammarMatcher> matcher;
  size_t checked = 0;

  bool Accepts(const CodePoints& s) const {
    const Hit hit = FirstHit(s, markers);
    return until ? hit.marker == 0 && hit.end == static_cast<long>(s.size()) : hit.marker < 0;
  }
  bool Viable(const CodePoints& s) const { return FirstHit(s, markers).marker < 0 || Accepts(s); }
};

std::unique_ptr<GrammarMatcher> MatcherFor(const std::string& gbnf) {
  absl::StatusOr<Grammar> g = ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << gbnf;
  if (!g.ok()) return nullptr;
  absl::StatusOr<GrammarMatcher> m =
      GrammarMatcher::Create(std::make_shared<const Grammar>(*std::move(g)));
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  return std::make_unique<GrammarMatcher>(*std::move(m));
}

MarkerCase Build(const std::vector<std::string>& markers, bool until) {
  MarkerCase c;
  c.until = until;
  for (const std::string& m : markers) c.markers.push_back(Decode(m));
  std::string rules;
  if (markers.size() == 1) {
    rules =
        until ? GbnfTextUntilRules("text", markers[0]) : GbnfTextWithoutRules("text", markers[0]);
  } else if (until) {
    rules = GbnfTextUntilRules("text", markers[0],
                               std::vector<std::string>(markers.begin() + 1, markers.end()));
  } else {
    rules = GbnfTextWithoutAnyRules("text", markers);
  }
  c.matcher = MatcherFor("root ::= text\n" + rules);
  return c;
}

// Every string over `alphabet` up to `max_len` code points, depth first: the matcher takes the
// next character exactly when the reference says the text can still end in the language, and
// accepts exactly the texts in it.
void Enumerate(MarkerCase* c, const CodePoints& alphabet, size_t max_len, CodePoints* s) {
  for (uint32_t cp : alphabet) {
    s->push_back(cp);
    const size_t checkpoint = c->matcher->Checkpoint();
    const bool took = c->matcher->AdvanceBytes(Utf8(cp)) == GrammarMatcher::Step::kOk;
    ++c->checked;
    ASSERT_EQ(took, c->Viable(*s)) << "after " << s->size() << " characters";
    if (took) {
      ASSERT_EQ(c->matcher->Accepting(), c->Accepts(*s)) << "after " << s->size();
      if (s->size() < max_len) Enumerate(c, alphabet, max_len, s);
      c->matcher->Rollback(checkpoint);
    }
    s->pop_back();
  }
}

// One text, character by character, against the reference.
void CheckText(MarkerCase* c, const CodePoints& text) {
  c->matcher->Rollback(0);
  CodePoints s;
  for (uint32_t cp : text) {
    s.push_back(cp);
    const bool took = c->matcher->AdvanceBytes(Utf8(cp)) == GrammarMatcher::Step::kOk;
    ASSERT_EQ(took, c->Viable(s));
    if (!took) return;
    ASSERT_EQ(c->matcher->Accepting(), c->Accepts(s));
  }
}

// The markers' characters and one other; strings up to a length that keeps the count near
// 200,000 (at most 9), then random texts made of the markers' prefixes (which reach lengths the
// enumeration cannot for long markers).
void CheckMarkers(const std::vector<std::string>& markers) {
  for (bool until : {true, false}) {
    SCOPED_TRACE(
        absl::StrCat(until ? "until " : "without ", markers[0], " (", markers.size(), " markers)"));
    MarkerCase c = Build(markers, until);
    ASSERT_NE(c.matcher, nullptr);
    EXPECT_EQ(c.matcher->Accepting(), !until);  // the empty text
    CodePoints alphabet;
    for (const CodePoints& m : c.markers) alphabet.insert(alphabet.end(), m.begin(), m.end());
    std::sort(alphabet.begin(), alphabet.end());
    alphabet.erase(std::unique(alphabet.begin(), alphabet.end()), alphabet.end());
    uint32_t other = 'x';
    while (std::binary_search(alphabet.begin(), alphabet.end(), other)) ++other;
    alphabet.push_back(other);
    size_t max_len = 1;
    for (size_t n = alphabet.size(); max_len < 9 && n * alphabet.size() < 200000;) {
      n *= alphabet.size();
      ++max_len;
    }
    CodePoints s;
    Enumerate(&c, alphabet, max_len, &s);
    EXPECT_GT(c.checked, 500u);

    std::mt19937 rng(49);
    for (int round = 0; round < 2000; ++round) {
      CodePoints text;
      const int pieces = 1 + static_cast<int>(rng() % 6);
      for (int p = 0; p < pieces; ++p) {
        const CodePoints& m = c.markers[rng() % c.markers.size()];
        const size_t len = rng() % (m.size() + 1);
        text.insert(text.end(), m.begin(), m.begin() + len);
        text.push_back(alphabet[rng() % alphabet.size()]);
      }
      if (round % 3 == 0) {
        const CodePoints& m = c.markers[round % 2 == 0 ? 0 : rng() % c.markers.size()];
        text.insert(text.end(), m.begin(), m.end());
      }
      CheckText(&c, text);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

void CheckMarker(const std::string& marker) { CheckMarkers({marker}); }

TEST(GbnfMarkerRulesTest, ShapeOfTheRules) {
  EXPECT_EQ(GbnfTextUntilRules("u", "ab"),
            "u ::= [^a] u | \"a\" u-1\n"
            "u-1 ::= [^ab] u | \"a\" u-1 | \"b\"\n");
  EXPECT_EQ(GbnfTextWithoutRules("w", "ab"),
            "w ::= [^a] w | \"a\" w-1 | \"\"\n"
            "w-1 ::= [^ab] w | \"a\" w-1 | \"\"\n");
}

TEST(GbnfMarkerRulesTest, ThinkEndMarker) { CheckMarker("</think>"); }
TEST(GbnfMarkerRulesTest, SelfOverlappingMarkers) {
  CheckMarker("aab");
  CheckMarker("abab");
  CheckMarker("aaa");
}
TEST(GbnfMarkerRulesTest, ToolCallMarker) { CheckMarker("<tool_call>"); }
TEST(GbnfMarkerRulesTest, NonAsciiMarkers) {
  CheckMarker("日本日");
  CheckMarker("<｜tool▁sep｜>");
  CheckMarker("é\"]\\^-[");  // the class specials, escaped in the rules
}

TEST(GbnfMarkerRulesTest, SeveralMarkers) {
  CheckMarkers({"ab", "ba"});
  CheckMarkers({"abc", "bc"});   // the other is the marker's suffix: the marker began first
  CheckMarkers({"bc", "abc"});   // the marker is the other's suffix: the other began first
  CheckMarkers({"abcd", "bc"});  // the other ends inside the marker: it can never end the text
  CheckMarkers({"ab", "abab", "b"});
  CheckMarkers({"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"});
}

TEST(RenameGbnfRuleTest, NamesOnlyNotLiteralsClassesCountsOrComments) {
  const std::string gbnf =
      "root ::= a \"a\" [a] a-1 ab # a here\n"
      "a ::= \"\\\"a\" [\\]a] a{2} (a | \"x\")\n"
      "a-1 ::= \"b\"\n"
      "ab ::= \"c\"\n";
  const std::string renamed = RenameGbnfRule(gbnf, "a", "t-a");
  EXPECT_EQ(renamed,
            "root ::= t-a \"a\" [a] a-1 ab # a here\n"
            "t-a ::= \"\\\"a\" [\\]a] t-a{2} (t-a | \"x\")\n"
            "a-1 ::= \"b\"\n"
            "ab ::= \"c\"\n");
  EXPECT_TRUE(ParseGbnf(renamed).ok());

  const std::string prefixed = PrefixGbnfRules(gbnf, "p-");
  EXPECT_EQ(prefixed,
            "p-root ::= p-a \"a\" [a] p-a-1 p-ab # a here\n"
            "p-a ::= \"\\\"a\" [\\]a] p-a{2} (p-a | \"x\")\n"
            "p-a-1 ::= \"b\"\n"
            "p-ab ::= \"c\"\n");
  EXPECT_TRUE(ParseGbnf("root ::= p-root\n" + prefixed).ok());
}

}  // namespace
}  // namespace ferry::grammar
