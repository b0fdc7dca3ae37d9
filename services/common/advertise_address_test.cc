// --advertise_address: hosts of listen addresses, wildcards, the check a wildcard listener
// needs, and the advertised address (the bound port with the advertised host).

#include "services/common/advertise_address.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(AdvertiseAddressTest, HostsAndWildcards) {
  EXPECT_EQ(HostOfAddress("10.1.2.3:50051"), "10.1.2.3");
  EXPECT_EQ(HostOfAddress("0.0.0.0:0"), "0.0.0.0");
  EXPECT_EQ(HostOfAddress("[::]:7400"), "[::]");
  EXPECT_EQ(HostOfAddress(":7400"), "");
  EXPECT_EQ(HostOfAddress("fd00::1"), "fd00::1");
  for (const char* wild : {"", "0.0.0.0", "::", "[::]"}) EXPECT_TRUE(IsWildcardHost(wild)) << wild;
  for (const char* host : {"127.0.0.1", "localhost", "[fd00::1]"}) {
    EXPECT_FALSE(IsWildcardHost(host)) << host;
  }
}

TEST(AdvertiseAddressTest, AWildcardListenerNeedsAnAdvertisedHost) {
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", ":50051"}) {
    const absl::Status s = CheckAdvertisable("--address", address, "");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_NE(s.message().find("--advertise_address"), absl::string_view::npos) << s;
    EXPECT_TRUE(CheckAdvertisable("--address", address, "10.0.0.7").ok()) << address;
  }
  EXPECT_TRUE(CheckAdvertisable("--address", "127.0.0.1:0", "").ok());
}

// A loopback listener advertised as a pod's IP (e.g. the gRPC KV transport's default
// --transport_address=127.0.0.1:0 in a pod): no peer could reach it.
TEST(AdvertiseAddressTest, ALoopbackListenerIsNotAdvertisedAsAnotherAddress) {
  EXPECT_EQ(CheckAdvertisable("--transport_address", "127.0.0.1:0", "10.0.0.7").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckAdvertisable("--address", "[::1]:50051", "fd00::7").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckAdvertisable("--address", "127.0.0.5:50051", "127.0.0.5").ok());
  EXPECT_TRUE(CheckAdvertisable("--address", "10.0.0.7:50051", "10.0.0.7").ok());
  EXPECT_TRUE(CheckAdvertisable("--address", "127.0.0.1:50051", "worker-0.example").ok());
}

TEST(AdvertiseAddressTest, ValidatesTheAdvertisedHost) {
  for (const char* good : {"10.0.0.7", "ferry-kvstore-0.ferry-kvstore", "fd00::7", "[fd00::7]"}) {
    EXPECT_TRUE(ValidateAdvertiseHost("--advertise_address", good).ok()) << good;
  }
  for (const char* bad : {"0.0.0.0", "::", "10.0.0.7:50051", "a b", "$(POD_IP)"}) {
    EXPECT_FALSE(ValidateAdvertiseHost("--advertise_address", bad).ok()) << bad;
  }
}

TEST(AdvertiseAddressTest, TheBoundPortWithTheAdvertisedHost) {
  EXPECT_EQ(AdvertisedAddress("0.0.0.0:43121", "10.0.0.7"), "10.0.0.7:43121");
  EXPECT_EQ(AdvertisedAddress("[::]:43121", "fd00::7"), "[fd00::7]:43121");
  EXPECT_EQ(AdvertisedAddress("[::]:43121", "[fd00::7]"), "[fd00::7]:43121");
  EXPECT_EQ(AdvertisedAddress("127.0.0.1:43121", ""), "127.0.0.1:43121");
}

}  // namespace
}  // namespace ferry
