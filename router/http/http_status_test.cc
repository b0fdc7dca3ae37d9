#include "router/http/http_status.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

TEST(HttpStatusTest, CodesMapToHttp) {
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kOk), 200);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kOutOfRange), 400);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kUnimplemented), 501);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusCode(absl::StatusCode::kDataLoss), 500);
}

TEST(HttpStatusTest, HttpMapsBackToTheSameClass) {
  for (int code = 1; code <= 16; ++code) {
    const auto absl_code = static_cast<absl::StatusCode>(code);
    const int http = HttpStatusCode(absl_code);
    // Mapping back lands on a code with the same HTTP status (the mapping is many-to-one).
    EXPECT_EQ(HttpStatusCode(StatusCodeFromHttp(http)), http) << code;
  }
  EXPECT_EQ(StatusCodeFromHttp(204), absl::StatusCode::kOk);
  EXPECT_EQ(StatusCodeFromHttp(418), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(StatusCodeFromHttp(502), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusCodeFromHttp(599), absl::StatusCode::kInternal);
}

TEST(HttpStatusTest, OpenAiErrorBodyHasTheFieldsClientsParse) {
  const std::string body = OpenAiErrorBody(
      absl::InvalidArgumentError("'max_tokens' must be at most 4096"), "trace-123", "max_tokens");
  const nlohmann::json parsed = nlohmann::json::parse(body);
  ASSERT_TRUE(parsed.contains("error"));
  const nlohmann::json& error = parsed["error"];
  EXPECT_EQ(error["message"], "'max_tokens' must be at most 4096");
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_EQ(error["param"], "max_tokens");
  EXPECT_EQ(error["code"], "invalid_argument");
  EXPECT_EQ(error["trace_id"], "trace-123");

  const nlohmann::json limited =
      nlohmann::json::parse(OpenAiErrorBody(absl::ResourceExhaustedError("queue full"), ""));
  EXPECT_EQ(limited["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(limited["error"]["param"].is_null());
  EXPECT_FALSE(limited["error"].contains("trace_id"));
}

TEST(HttpStatusTest, InvalidUtf8InMessagesDoesNotBreakTheBody) {
  const std::string body =
      OpenAiErrorBody(absl::InvalidArgumentError("bad byte \xff in input"), "t");
  const nlohmann::json parsed = nlohmann::json::parse(body);
  EXPECT_NE(parsed["error"]["message"].get<std::string>().find("bad byte"), std::string::npos);
}

}  // namespace
}  // namespace ferry
