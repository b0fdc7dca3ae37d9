#include "services/common/grpc_status.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(GrpcStatusTest, EveryCodeRoundTripsWithItsMessage) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code),
                              code == 0 ? "" : "message for code");
    const grpc::Status wire = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    const absl::Status back = FromGrpcStatus(wire);
    EXPECT_EQ(back, status) << code;
  }
}

TEST(GrpcStatusTest, SpecificCodes) {
  EXPECT_EQ(ToGrpcStatus(absl::DeadlineExceededError("slow")).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("full")).error_message(), "full");
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")),
            absl::UnavailableError("down"));
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, OutOfRangeCodesBecomeUnknown) {
  const absl::Status status =
      FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd peer"));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(status.message(), "odd peer");
}

}  // namespace
}  // namespace ferry
