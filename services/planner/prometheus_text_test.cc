#include "services/planner/prometheus_text.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

const std::set<std::string, std::less<>> kWanted = {"a_total", "b", "c_sum"};

TEST(PrometheusTextTest, ReadsTheWantedSamplesAndSkipsTheRest) {
  const std::string text =
      "# HELP a_total A counter.\n"
      "# TYPE a_total counter\n"
      "a_total{code=\"200\",endpoint=\"/v1/x\"} 64\n"
      "a_total{code=\"500\", endpoint=\"/v1/x\",} 1.5e3 1700000000000\r\n"
      "a_total_other 7\n"
      "unknown{this is not even a line\n"
      "  b 3\n"
      "c_sum{pool=\"de\\\"co\\\\de\\n\"} NaN\n"
      "c_sum +Inf\n";
  auto samples = ParsePrometheusText(text, kWanted);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 5u);
  EXPECT_EQ((*samples)[0].name, "a_total");
  EXPECT_EQ((*samples)[0].Label("code"), "200");
  EXPECT_EQ((*samples)[0].Label("endpoint"), "/v1/x");
  EXPECT_EQ((*samples)[0].Label("missing"), "");
  EXPECT_EQ((*samples)[0].value, 64);
  EXPECT_EQ((*samples)[1].value, 1500);  // a timestamp after the value is allowed
  EXPECT_EQ((*samples)[1].Label("code"), "500");
  EXPECT_EQ((*samples)[2].name, "b");
  EXPECT_EQ((*samples)[2].value, 3);
  EXPECT_EQ((*samples)[3].Label("pool"), "de\"co\\de\n");
  EXPECT_TRUE(std::isnan((*samples)[3].value));
  EXPECT_TRUE(std::isinf((*samples)[4].value));
}

TEST(PrometheusTextTest, ABadWantedLineIsAnErrorNamingIt) {
  for (const char* line : {
           "a_total{code=\"200\" 1",   // unterminated labels
           "a_total{code=200} 1",      // unquoted value
           "a_total{code=\"2} 1",      // unterminated value
           "a_total{code=\"\\x\"} 1",  // bad escape
           "a_total{=\"x\"} 1",        // no label name
           "a_total",                  // no value
           "a_total 1 2 3",            // too many fields
           "a_total{} one",            // not a number
           "a_total 0x1q",             // half a number
       }) {
    auto samples = ParsePrometheusText(std::string(line) + "\n", kWanted);
    ASSERT_FALSE(samples.ok()) << line;
    EXPECT_EQ(samples.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(samples.status().message().find("line 1 (a_total)"), std::string::npos)
        << samples.status();
  }
  // Too many labels.
  std::string many = "a_total{";
  for (int i = 0; i < 65; ++i) many += "l" + std::to_string(i) + "=\"v\",";
  many += "} 1\n";
  EXPECT_FALSE(ParsePrometheusText(many, kWanted).ok());
}

TEST(PrometheusTextTest, EmptyAndCommentOnlyTextsHaveNoSamples) {
  for (const char* text : {"", "\n\n", "# HELP a_total x\n# TYPE a_total counter\n"}) {
    auto samples = ParsePrometheusText(text, kWanted);
    ASSERT_TRUE(samples.ok());
    EXPECT_TRUE(samples->empty());
  }
}

}  // namespace
}  // namespace ferry
