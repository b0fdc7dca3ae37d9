#include "engine/common/status.h"

#include <errno.h>

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status CheckEven(int x) { return Half(x).status(); }

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(const int quarter, Half(half));
  return quarter;
}

absl::Status Chain(int x, int* out) {
  RETURN_IF_ERROR(CheckEven(x));
  RETURN_IF_ERROR(Half(x));            // also accepts a StatusOr
  ASSIGN_OR_RETURN(*out, Quarter(x));  // an existing variable as the target
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int v) { return std::make_unique<int>(v); }

absl::StatusOr<int> Unbox(int v) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(v));  // move-only values
  return *box;
}

TEST(StatusTest, AssignOrReturn) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(7).status().message(), "odd");
  EXPECT_EQ(*Unbox(5), 5);
}

TEST(StatusTest, ReturnIfError) {
  int out = -1;
  EXPECT_TRUE(Chain(12, &out).ok());
  EXPECT_EQ(out, 3);
  out = -1;
  EXPECT_EQ(Chain(3, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, -1);
}

TEST(StatusTest, MacrosEvaluateOnce) {
  int calls = 0;
  auto counted = [&]() -> absl::StatusOr<int> {
    ++calls;
    return 4;
  };
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(counted());
    ASSIGN_OR_RETURN(int v, counted());
    EXPECT_EQ(v, 4);
    return absl::OkStatus();
  };
  EXPECT_TRUE(run().ok());
  EXPECT_EQ(calls, 2);
}

TEST(StatusTest, ErrnoStatus) {
  const absl::Status not_found = ErrnoStatus(ENOENT, "open /x");
  EXPECT_EQ(not_found.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(not_found.message(), "open /x: No such file or directory");
  EXPECT_EQ(ErrnoStatus(EACCES, "open").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(ENOSPC, "write").code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ferry
