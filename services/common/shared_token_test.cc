// The shared token: loading (file, environment, none, too short, not printable) and the check on
// real calls (none, wrong, right; no token configured: anything goes).

#include "services/common/shared_token.h"

#include <cstdlib>
#include <fstream>

#include "ferry/testing/v1/echo.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_server.h"

namespace ferry {
namespace {

constexpr char kToken[] = "0123456789abcdef-token";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(SharedTokenTest, LoadsFromAFileOrTheEnvironment) {
  unsetenv("FERRY_TEST_TOKEN");
  EXPECT_EQ(*LoadSharedToken("", "FERRY_TEST_TOKEN"), "");
  EXPECT_EQ(*LoadSharedToken(WriteFile("t", std::string("  ") + kToken + "\n"), "FERRY_TEST_TOKEN"),
            kToken);
  setenv("FERRY_TEST_TOKEN", kToken, 1);
  EXPECT_EQ(*LoadSharedToken("", "FERRY_TEST_TOKEN"), kToken);
  setenv("FERRY_TEST_TOKEN", "short", 1);
  EXPECT_EQ(LoadSharedToken("", "FERRY_TEST_TOKEN").status().code(),
            absl::StatusCode::kInvalidArgument);
  unsetenv("FERRY_TEST_TOKEN");
  EXPECT_FALSE(LoadSharedToken(WriteFile("e", "\n"), "FERRY_TEST_TOKEN").ok());  // empty file
  EXPECT_FALSE(LoadSharedToken(WriteFile("s", "0123456789 abcdefgh"), "FERRY_TEST_TOKEN").ok());
  EXPECT_EQ(LoadSharedToken("/nonexistent/token", "FERRY_TEST_TOKEN").status().code(),
            absl::StatusCode::kNotFound);
}

// Echo that answers only callers with the token.
class GuardedEcho final : public ferry::testing::v1::Echo::Service {
 public:
  explicit GuardedEcho(std::string token) : token_(std::move(token)) {}
  grpc::Status Echo(grpc::ServerContext* context, const ferry::testing::v1::EchoRequest* request,
                    ferry::testing::v1::EchoResponse* response) override {
    grpc::Status ok = CheckSharedToken(*context, token_);
    if (!ok.ok()) return ok;
    response->set_message(request->message());
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

grpc::StatusCode Call(const std::string& address, const std::string& token) {
  auto stub = ferry::testing::v1::Echo::NewStub(NewChannel(address));
  auto context = NewClientContext(absl::Seconds(10));
  AttachSharedToken(context.get(), token);
  ferry::testing::v1::EchoRequest request;
  ferry::testing::v1::EchoResponse response;
  return stub->Echo(context.get(), request, &response).error_code();
}

TEST(SharedTokenTest, CallsWithoutTheRightTokenAreRefused) {
  GuardedEcho guarded(kToken);
  GuardedEcho open("");
  auto guarded_server = *GrpcServer::Start({}, {&guarded});
  auto open_server = *GrpcServer::Start({}, {&open});
  EXPECT_EQ(Call(guarded_server->address(), ""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(guarded_server->address(), "0123456789abcdef-tokeN"),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(guarded_server->address(), "0123456789abcdef-token-longer"),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(guarded_server->address(), kToken), grpc::StatusCode::OK);
  EXPECT_EQ(Call(open_server->address(), ""), grpc::StatusCode::OK);
  EXPECT_EQ(Call(open_server->address(), kToken), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace ferry
