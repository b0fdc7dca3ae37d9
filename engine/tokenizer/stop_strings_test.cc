#include "engine/tokenizer/stop_strings.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(StopStringsTest, MatchesAcrossDeltasAndHoldsBackPossibleStarts) {
  StopStringMatcher m({"</answer>", "STOP"});
  std::string shown;
  for (const char* delta : {"The ans", "wer is 4", "2.</", "ans"}) shown += m.Push(delta);
  EXPECT_EQ(shown, "The answer is 42.");  // "</ans" held back
  EXPECT_EQ(m.held(), "</ans");
  shown += m.Push("wer> and more");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</answer>");
  EXPECT_EQ(shown, "The answer is 42.");
  EXPECT_EQ(m.Push("ignored"), "");

  StopStringMatcher n({"STOP"});
  EXPECT_EQ(n.Push("ST"), "");
  EXPECT_EQ(n.Push("O"), "");
  EXPECT_EQ(n.Push("OP"), "STOOP");  // no suffix of "STOOP" starts "STOP"
  EXPECT_EQ(n.Push("a ST"), "a ");
  EXPECT_EQ(n.Finish(), "ST");
  EXPECT_FALSE(n.stopped());

  // The earliest match wins; at one position the longest.
  StopStringMatcher o({"b", "ab", "abc"});
  EXPECT_EQ(o.Push("xxabcd"), "xx");
  EXPECT_EQ(o.matched(), "abc");

  // Restored held-back text continues exactly.
  StopStringMatcher p({"STOP"});
  p.Restore("ST");
  EXPECT_EQ(p.Push("OP!"), "");
  EXPECT_TRUE(p.stopped());

  EXPECT_FALSE(StopStringMatcher::Validate({""}).ok());
  EXPECT_FALSE(StopStringMatcher::Validate({std::string(kMaxStopStringBytes + 1, 'a')}).ok());
  EXPECT_FALSE(
      StopStringMatcher::Validate(std::vector<std::string>(kMaxStopStrings + 1, "a")).ok());
  EXPECT_TRUE(StopStringMatcher::Validate({"a", "bc"}).ok());
}

TEST(StopStringsTest, TextThatMayNotStopNeverEndsTheStream) {
  // min_tokens: "STOP" inside text pushed with may_stop = false is shown; one that ends in later
  // text stops, even when it began in the text that could not.
  StopStringMatcher m({"STOP"});
  std::string shown = m.Push("a STOP b ST", /*may_stop=*/false);
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(shown, "a STOP b ");  // "ST" may begin a stop string that ends later
  shown += m.Push("OP c", /*may_stop=*/true);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(shown, "a STOP b ");

  // A complete match in the early text stays text after the matcher may stop.
  StopStringMatcher n({"ab", "xabq"});
  EXPECT_EQ(n.Push("xab", false), "");  // held: a prefix of "xabq"
  EXPECT_EQ(n.Push("c", true), "xabc");
  EXPECT_FALSE(n.stopped());
  EXPECT_EQ(n.Push("ab", true), "");
  EXPECT_TRUE(n.stopped());

  // Restored as text that could not stop.
  StopStringMatcher p({"STOP"});
  p.Restore("STOP", /*may_stop=*/false);
  EXPECT_EQ(p.Push("!", true), "STOP!");
}

}  // namespace
}  // namespace ferry
