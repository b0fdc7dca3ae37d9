#include "router/fetch/ip_address.h"

#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

AddressClass Of(const std::string& text) {
  std::optional<IpAddress> ip = ParseIpAddress(text);
  EXPECT_TRUE(ip.has_value()) << text;
  return ip.has_value() ? ClassifyAddress(*ip) : AddressClass::kPublic;
}

TEST(IpAddressTest, ParsesOnlyCanonicalForms) {
  for (const char* good : {"1.2.3.4", "0.0.0.0", "255.255.255.255", "::", "::1", "2001:db8::1",
                           "::ffff:127.0.0.1", "64:ff9b::7f00:1"}) {
    EXPECT_TRUE(ParseIpAddress(good).has_value()) << good;
  }
  for (const char* bad : {"", "127.1", "0x7f.0.0.1", "2130706433", "0177.0.0.1", "127.0.0.01",
                          "1.2.3.4.5", "256.1.1.1", " 1.2.3.4", "1.2.3.4 ", "fe80::1%eth0", "[::1]",
                          "localhost", "1.2.3.", ":::"}) {
    EXPECT_FALSE(ParseIpAddress(bad).has_value()) << bad;
  }
  EXPECT_EQ(ParseIpAddress("::ffff:7f00:1")->ToString(), "::ffff:127.0.0.1");
  EXPECT_EQ(ParseIpAddress("2001:DB8:0::1")->ToString(), "2001:db8::1");
}

TEST(IpAddressTest, ClassifiesIpv4) {
  const struct {
    const char* ip;
    AddressClass cls;
  } cases[] = {
      {"8.8.8.8", AddressClass::kPublic},
      {"1.1.1.1", AddressClass::kPublic},
      {"93.184.216.34", AddressClass::kPublic},
      {"0.0.0.0", AddressClass::kUnspecified},
      {"0.255.1.2", AddressClass::kUnspecified},
      {"10.0.0.1", AddressClass::kPrivate},
      {"10.255.255.255", AddressClass::kPrivate},
      {"11.0.0.1", AddressClass::kPublic},
      {"100.63.255.255", AddressClass::kPublic},
      {"100.64.0.1", AddressClass::kSharedCgnat},
      {"100.127.255.255", AddressClass::kSharedCgnat},
      {"100.128.0.0", AddressClass::kPublic},
      {"127.0.0.1", AddressClass::kLoopback},
      {"127.255.255.254", AddressClass::kLoopback},
      {"169.254.169.254", AddressClass::kLinkLocal},
      {"169.254.0.1", AddressClass::kLinkLocal},
      {"172.15.255.255", AddressClass::kPublic},
      {"172.16.0.1", AddressClass::kPrivate},
      {"172.31.255.255", AddressClass::kPrivate},
      {"172.32.0.0", AddressClass::kPublic},
      {"192.0.0.8", AddressClass::kReserved},
      {"192.0.2.1", AddressClass::kDocumentation},
      {"192.88.99.1", AddressClass::kReserved},
      {"192.168.1.1", AddressClass::kPrivate},
      {"192.169.0.1", AddressClass::kPublic},
      {"198.17.255.255", AddressClass::kPublic},
      {"198.18.0.1", AddressClass::kBenchmarking},
      {"198.19.255.255", AddressClass::kBenchmarking},
      {"198.20.0.0", AddressClass::kPublic},
      {"198.51.100.7", AddressClass::kDocumentation},
      {"203.0.113.9", AddressClass::kDocumentation},
      {"223.255.255.255", AddressClass::kPublic},
      {"224.0.0.1", AddressClass::kMulticast},
      {"239.255.255.250", AddressClass::kMulticast},
      {"240.0.0.1", AddressClass::kReserved},
      {"255.255.255.254", AddressClass::kReserved},
      {"255.255.255.255", AddressClass::kBroadcast},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Of(c.ip), c.cls) << c.ip << " is " << AddressClassName(Of(c.ip));
  }
}

TEST(IpAddressTest, ClassifiesIpv6AndTheIpv4ItCarries) {
  const struct {
    const char* ip;
    AddressClass cls;
  } cases[] = {
      {"2606:4700:4700::1111", AddressClass::kPublic},
      {"2a00:1450:4001:80b::200e", AddressClass::kPublic},
      {"::", AddressClass::kUnspecified},
      {"::1", AddressClass::kLoopback},
      {"fc00::1", AddressClass::kPrivate},
      {"fd12:3456::1", AddressClass::kPrivate},
      {"fe80::1", AddressClass::kLinkLocal},
      {"febf::1", AddressClass::kLinkLocal},
      {"fec0::1", AddressClass::kReserved},
      {"ff02::1", AddressClass::kMulticast},
      {"2001:db8::1", AddressClass::kDocumentation},
      {"2001::1", AddressClass::kReserved},       // Teredo
      {"2001:2::1", AddressClass::kReserved},     // benchmarking
      {"2001:10::1", AddressClass::kReserved},    // ORCHID
      {"2001:200::1", AddressClass::kPublic},     // just past 2001::/23
      {"100::1", AddressClass::kReserved},        // discard-only
      {"::2", AddressClass::kReserved},           // IPv4-compatible ::0.0.0.2
      {"::8.8.8.8", AddressClass::kReserved},     // IPv4-compatible (deprecated): refused
      {"3fff::1", AddressClass::kPublic},         // still in 2000::/3
      {"4000::1", AddressClass::kReserved},       // outside 2000::/3
      {"64:ff9b:1::1", AddressClass::kReserved},  // local-use NAT64
      // IPv4-mapped: the IPv4 address decides.
      {"::ffff:127.0.0.1", AddressClass::kLoopback},
      {"::ffff:7f00:1", AddressClass::kLoopback},
      {"::ffff:169.254.169.254", AddressClass::kLinkLocal},
      {"::ffff:10.1.2.3", AddressClass::kPrivate},
      {"::ffff:0.0.0.0", AddressClass::kUnspecified},
      {"::ffff:8.8.8.8", AddressClass::kPublic},
      // NAT64 well-known prefix.
      {"64:ff9b::127.0.0.1", AddressClass::kLoopback},
      {"64:ff9b::a9fe:a9fe", AddressClass::kLinkLocal},
      {"64:ff9b::192.168.0.1", AddressClass::kPrivate},
      {"64:ff9b::8.8.8.8", AddressClass::kPublic},
      // 6to4: the IPv4 address in bits 16..47.
      {"2002:7f00:1::1", AddressClass::kLoopback},
      {"2002:a9fe:a9fe::", AddressClass::kLinkLocal},
      {"2002:c0a8:101::1", AddressClass::kPrivate},
      {"2002:6440::1", AddressClass::kSharedCgnat},
      {"2002:808:808::1", AddressClass::kPublic},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Of(c.ip), c.cls) << c.ip << " is " << AddressClassName(Of(c.ip));
  }
}

TEST(IpAddressTest, EveryClassHasAName) {
  for (int c = 0; c <= static_cast<int>(AddressClass::kDocumentation); ++c) {
    EXPECT_NE(AddressClassName(static_cast<AddressClass>(c)), "unknown");
  }
}

}  // namespace
}  // namespace ferry
