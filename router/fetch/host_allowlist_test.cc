#include "router/fetch/host_allowlist.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(HostAllowlistTest, ExactAndSuffixPatterns) {
  auto list =
      HostAllowlist::Create({"images.example.com", "*.cdn.example.net", "Photos.Example.ORG.",
                             "203.0.113.7", "2001:db8::1", "[2001:db8::2]"});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_FALSE(list->empty());
  EXPECT_TRUE(list->Allows("images.example.com"));
  EXPECT_FALSE(list->Allows("example.com"));
  EXPECT_FALSE(list->Allows("x.images.example.com"));  // exact means exact
  EXPECT_FALSE(list->Allows("images.example.com.evil.com"));
  EXPECT_TRUE(list->Allows("a.cdn.example.net"));
  EXPECT_TRUE(list->Allows("a.b.cdn.example.net"));
  EXPECT_FALSE(list->Allows("cdn.example.net"));  // "*." needs a label before the suffix
  EXPECT_FALSE(list->Allows("evilcdn.example.net"));
  EXPECT_FALSE(list->Allows("a.cdn.example.net.evil.com"));
  EXPECT_TRUE(list->Allows("photos.example.org"));  // patterns are normalized as hosts are
  EXPECT_TRUE(list->Allows("203.0.113.7"));
  EXPECT_FALSE(list->Allows("203.0.113.8"));
  EXPECT_TRUE(list->Allows("2001:db8::1"));
  EXPECT_TRUE(list->Allows("2001:db8::2"));
}

TEST(HostAllowlistTest, EmptyAllowsNothing) {
  auto list = HostAllowlist::Create({});
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  EXPECT_FALSE(list->Allows("example.com"));
  EXPECT_FALSE(list->Allows(""));
}

TEST(HostAllowlistTest, RefusesBadPatterns) {
  for (const char* bad : {"", "*", "*.", "*.com", "**.example.com", "a.*.example.com",
                          "http://example.com", "example.com/", "example.com:443", "user@host",
                          "*.1.2.3.4", "127.1", "exa mple.com", "*example.com"}) {
    auto list = HostAllowlist::Create({bad});
    EXPECT_FALSE(list.ok()) << "'" << bad << "' was taken";
    if (!list.ok()) {
      EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace ferry
