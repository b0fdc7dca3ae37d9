#include "router/fetch/image_url.h"

#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(ImageUrlTest, ParsesHostPortAndTarget) {
  auto u = ParseImageUrl("https://Images.Example.COM/a/b.png?size=2&x=%20#frag");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_TRUE(u->https);
  EXPECT_EQ(u->host, "images.example.com");
  EXPECT_FALSE(u->ip.has_value());
  EXPECT_EQ(u->port, 443);
  EXPECT_FALSE(u->explicit_port);
  EXPECT_EQ(u->target, "/a/b.png?size=2&x=%20");
  EXPECT_EQ(u->HostHeader(), "images.example.com");
  EXPECT_EQ(u->ToString(), "https://images.example.com/a/b.png?size=2&x=%20");

  u = ParseImageUrl("HTTP://example.com:8080");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_FALSE(u->https);
  EXPECT_EQ(u->port, 8080);
  EXPECT_EQ(u->target, "/");
  EXPECT_EQ(u->HostHeader(), "example.com:8080");

  u = ParseImageUrl("http://example.com.?q");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "example.com");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->target, "/?q");
}

TEST(ImageUrlTest, IpLiterals) {
  auto u = ParseImageUrl("http://93.184.216.34/x.jpg");
  ASSERT_TRUE(u.ok()) << u.status();
  ASSERT_TRUE(u->ip.has_value());
  EXPECT_FALSE(u->ip->v6);
  EXPECT_EQ(u->host, "93.184.216.34");

  u = ParseImageUrl("https://[2001:DB8:0:0::1]:8443/x");
  ASSERT_TRUE(u.ok()) << u.status();
  ASSERT_TRUE(u->ip.has_value());
  EXPECT_TRUE(u->ip->v6);
  EXPECT_EQ(u->host, "2001:db8::1");
  EXPECT_EQ(u->HostHeader(), "[2001:db8::1]:8443");

  u = ParseImageUrl("http://[::ffff:127.0.0.1]/");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "::ffff:127.0.0.1");  // parsed; the address check refuses it
}

TEST(ImageUrlTest, RefusesWithTheRule) {
  const struct {
    const char* url;
    const char* why;  // a piece of the message
  } cases[] = {
      {"ftp://example.com/a.png", "scheme"},
      {"file:///etc/passwd", "scheme"},
      {"data:image/png;base64,AAAA", "scheme"},
      {"gopher://example.com/", "scheme"},
      {"example.com/a.png", "scheme"},
      {"http:example.com", "'//'"},
      {"http:/example.com", "'//'"},
      {"http://", "empty"},
      {"http:///a.png", "empty"},
      {"http://:80/", "empty"},
      {"http://user@example.com/", "user info"},
      {"http://user:pw@example.com/", "user info"},
      {"http://example.com@evil.com/", "user info"},
      {"http://exa mple.com/", "whitespace"},
      {"http://example.com/a b.png", "whitespace"},
      {"http://example.com/a\tb", "whitespace"},
      {"http://example.com/\r\nHost: evil", "whitespace"},
      {"http://example.com\\@evil.com/", "backslash"},
      {"http://ex%61mple.com/", "percent-encoded host"},
      {"http://example.com/%zz", "two hex"},
      {"http://example.com/%4", "two hex"},
      {"http://b\xc3\xbc"
       "cher.de/",
       "IDNA"},
      {"http://example.com/\xc3\xa9.png", "percent-encode"},
      {"http://exam_ple.com/", "holds '_'"},
      {"http://-example.com/", "'-'"},
      {"http://example-.com/", "'-'"},
      {"http://example..com/", "empty label"},
      {"http://.example.com/", "empty label"},
      {"http://example.com:/", "port"},
      {"http://example.com:0/", "port"},
      {"http://example.com:65536/", "port"},
      {"http://example.com:+80/", "port"},
      {"http://example.com:0x50/", "port"},
      {"http://example.com:123456/", "port"},
      {"http://example.com:80:80/", "IPv6 host must be in brackets"},
      {"http://::1/", "IPv6 host must be in brackets"},
      {"http://[::1/", "must end with ']'"},
      {"http://[fe80::1%25eth0]/", "percent-encoded host"},
      {"http://[127.0.0.1]/", "not an IPv6 address"},
      {"http://[example.com]/", "not an IPv6 address"},
      {"http://2130706433/", "canonical dotted-quad"},
      {"http://0x7f.1/", "canonical dotted-quad"},
      {"http://0x7f000001/", "canonical dotted-quad"},
      {"http://127.1/", "canonical dotted-quad"},
      {"http://0177.0.0.1/", "canonical dotted-quad"},
      {"http://127.0.0.01/", "canonical dotted-quad"},
      {"http://1.2.3.4.5/", "canonical dotted-quad"},
      {"http://256.0.0.1/", "canonical dotted-quad"},
      {"http://example.0x10/", "canonical dotted-quad"},
      {"http://example.123/", "canonical dotted-quad"},
  };
  for (const auto& c : cases) {
    auto u = ParseImageUrl(c.url);
    ASSERT_FALSE(u.ok()) << c.url << " parsed to " << u->ToString();
    EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument) << c.url;
    EXPECT_NE(u.status().message().find(c.why), absl::string_view::npos)
        << c.url << ": " << u.status().message();
  }
}

TEST(ImageUrlTest, RefusesControlBytesAndOverlongUrls) {
  EXPECT_FALSE(ParseImageUrl(std::string("http://example.com/a\0b", 22)).ok());
  EXPECT_FALSE(ParseImageUrl("http://example.com/\x7f").ok());
  const std::string long_path(kMaxImageUrlLength, 'a');
  auto u = ParseImageUrl("http://example.com/" + long_path);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("over 8192"), absl::string_view::npos);
  EXPECT_TRUE(ParseImageUrl("http://example.com/" + long_path.substr(100)).ok());
  const std::string label(64, 'a');
  EXPECT_FALSE(ParseImageUrl("http://" + label + ".com/").ok());
  EXPECT_TRUE(ParseImageUrl("http://" + label.substr(1) + ".com/").ok());
}

}  // namespace
}  // namespace ferry
