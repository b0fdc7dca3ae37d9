#include "router/auth/api_keys.h"

#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"
#include "router/auth/rate_limiter.h"

namespace ferry {
namespace {

constexpr char kFile[] = R"({
  "tenants": {"acme": {"traffic_class": "agent", "requests_per_minute": 2,
                       "tokens_per_minute": 600}},
  "keys": [{"key": "sk-acme-0123456789abcdef", "tenant": "acme"},
           {"key": "sk-acme-fedcba9876543210", "tenant": "acme"},
           {"key": "sk-lab-0123456789abcdef0", "tenant": "lab"}]})";

TEST(ApiKeysTest, KeysFindTheirTenant) {
  auto keys = ApiKeys::Parse(kFile);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ((*keys)->keys(), 3u);
  const Tenant* acme = (*keys)->Find("sk-acme-0123456789abcdef");
  ASSERT_NE(acme, nullptr);
  EXPECT_EQ(acme->name, "acme");
  EXPECT_EQ(acme->traffic_class, ferry::v1::TRAFFIC_CLASS_AGENT);
  EXPECT_EQ(acme->requests_per_minute, 2);
  EXPECT_EQ(acme->cache_salt, "acme");
  EXPECT_EQ((*keys)->Find("sk-acme-fedcba9876543210"), acme);
  const Tenant* lab = (*keys)->Find("sk-lab-0123456789abcdef0");
  ASSERT_NE(lab, nullptr);
  EXPECT_EQ(lab->traffic_class, ferry::v1::TRAFFIC_CLASS_CHAT);  // defaults
  EXPECT_EQ(lab->tokens_per_minute, 0);
  EXPECT_EQ((*keys)->Find("sk-acme-0123456789abcdeF"), nullptr);
  EXPECT_EQ((*keys)->Find(""), nullptr);
  EXPECT_EQ((*keys)->Find("sk-acme-0123456789abcde"), nullptr);
}

TEST(ApiKeysTest, BadFilesSayWhatIsWrongAndNeverShowAKey) {
  const char* bad[] = {
      "[]",
      R"({"keys": {}})",
      R"({"keys": [{"key": "short", "tenant": "a"}]})",
      R"({"keys": [{"key": "sk-has a space-0123456", "tenant": "a"}]})",
      R"({"keys": [{"key": "sk-0123456789abcdef", "tenant": "bad name"}]})",
      R"({"keys": [{"key": "sk-0123456789abcdef", "tenant": "a"},
                   {"key": "sk-0123456789abcdef", "tenant": "b"}]})",
      R"({"tenants": {"a": {"traffic_class": "vip"}}, "keys": []})",
      R"({"tenants": {"a": {"requests_per_minute": -1}}, "keys": []})",
      R"({"tenants": {"a": {"colour": 1}}, "keys": []})",
      R"({"keys": [], "extra": 1})",
  };
  for (const char* text : bad) {
    auto keys = ApiKeys::Parse(text);
    EXPECT_FALSE(keys.ok()) << text;
    EXPECT_EQ(std::string(keys.status().message()).find("0123456789abcdef"), std::string::npos)
        << keys.status();
  }
}

TEST(RateLimiterTest, RequestAndTokenBucketsRefillOverAMinute) {
  FakeClock clock;
  RateLimiter limiter(&clock);
  Tenant t;
  t.name = "acme";
  t.requests_per_minute = 2;
  t.tokens_per_minute = 600;
  EXPECT_TRUE(limiter.Admit(t, 100).admitted);
  EXPECT_TRUE(limiter.Admit(t, 100).admitted);
  RateLimiter::Decision d = limiter.Admit(t, 100);  // the third request in the minute
  EXPECT_FALSE(d.admitted);
  EXPECT_EQ(d.retry_after, absl::Seconds(30));
  clock.Advance(absl::Seconds(30));
  EXPECT_TRUE(limiter.Admit(t, 100).admitted);
  // The bucket refilled to its cap (600), less this prompt: 500. Completion tokens put it in
  // debt, 500 - 1000 = -500, and half a minute refills 300 of it.
  limiter.Charge(t, 1000);
  clock.Advance(absl::Seconds(30));  // +300 tokens, +1 request
  d = limiter.Admit(t, 1);
  EXPECT_FALSE(d.admitted);
  EXPECT_EQ(d.retry_after, absl::Seconds(20));  // 200 tokens of debt at 10 a second
  // Another tenant is not affected; an unlimited one never waits.
  Tenant other = t;
  other.name = "lab";
  EXPECT_TRUE(limiter.Admit(other, 100).admitted);
  Tenant free;
  free.name = "free";
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(limiter.Admit(free, 1000000).admitted);
  // A reload that drops a tenant forgets its buckets (it starts full if it comes back).
  limiter.Retain({other});
  EXPECT_TRUE(limiter.Admit(t, 1).admitted);
}

}  // namespace
}  // namespace ferry
