#include "engine/common/units.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(UnitsTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("0"), 0u);
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("4096B"), 4096u);
  EXPECT_EQ(*ParseByteSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseByteSize("512MB"), 512'000'000u);
  EXPECT_EQ(*ParseByteSize(" 64GiB "), 64ull << 30);
  EXPECT_EQ(*ParseByteSize("64 GiB"), 64ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(*ParseByteSize("16777215TiB"), 16777215ull << 40);
}

TEST(UnitsTest, BadByteSizes) {
  for (const char* bad : {"", "GiB", "-1", "1 gib", "12XB", "1.2.3MB", "16777216TiB",
                          "18446744073709551616", "1e3", "nan"}) {
    auto parsed = ParseByteSize(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(parsed.status().message().find("invalid byte size"), absl::string_view::npos);
    }
  }
}

TEST(UnitsTest, FormatByteSize) {
  EXPECT_EQ(FormatByteSize(0), "0 B");
  EXPECT_EQ(FormatByteSize(1023), "1023 B");
  EXPECT_EQ(FormatByteSize(1536), "1.5 KiB");
  EXPECT_EQ(FormatByteSize(64ull << 30), "64.0 GiB");
}

TEST(UnitsTest, Durations) {
  EXPECT_EQ(*ParseConfigDuration("3d"), absl::Hours(72));
  EXPECT_EQ(*ParseConfigDuration("1d12h"), absl::Hours(36));
  EXPECT_EQ(*ParseConfigDuration("72h"), absl::Hours(72));
  EXPECT_EQ(*ParseConfigDuration("1h30m"), absl::Minutes(90));
  EXPECT_EQ(*ParseConfigDuration("250ms"), absl::Milliseconds(250));
  EXPECT_EQ(*ParseConfigDuration("0"), absl::ZeroDuration());
  for (const char* bad : {"", "-5s", "inf", "3 days", "d", "5", "1h-30m", "99999999d"}) {
    EXPECT_FALSE(ParseConfigDuration(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace ferry
