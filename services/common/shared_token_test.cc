// The shared token: loading (file with one or several tokens, environment, none, too short, not
// printable), the check on real calls (none, wrong, right, any accepted one; no token
// configured: anything goes), and a rotation through a polled file.

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
constexpr char kNewToken[] = "fedcba9876543210-token";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string Current(const absl::StatusOr<SharedToken>& token) {
  EXPECT_TRUE(token.ok()) << token.status();
  return token.ok() ? token->current() : "(error)";
}

TEST(SharedTokenTest, LoadsFromAFileOrTheEnvironment) {
  unsetenv("FERRY_TEST_TOKEN");
  EXPECT_TRUE(LoadSharedToken("", "FERRY_TEST_TOKEN")->empty());
  EXPECT_EQ(Current(LoadSharedToken(WriteFile("t", std::string("  ") + kToken + "\n"),
                                    "FERRY_TEST_TOKEN")),
            kToken);
  setenv("FERRY_TEST_TOKEN", kToken, 1);
  EXPECT_EQ(Current(LoadSharedToken("", "FERRY_TEST_TOKEN")), kToken);
  setenv("FERRY_TEST_TOKEN", "short", 1);
  EXPECT_EQ(LoadSharedToken("", "FERRY_TEST_TOKEN").status().code(),
            absl::StatusCode::kInvalidArgument);
  unsetenv("FERRY_TEST_TOKEN");
  EXPECT_FALSE(LoadSharedToken(WriteFile("e", "\n"), "FERRY_TEST_TOKEN").ok());  // empty file
  EXPECT_FALSE(LoadSharedToken(WriteFile("s", "0123456789 abcdefgh"), "FERRY_TEST_TOKEN").ok());
  EXPECT_EQ(LoadSharedToken("/nonexistent/token", "FERRY_TEST_TOKEN").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SharedTokenTest, AFileMayHoldSeveralTokensTheFirstIsSent) {
  auto tokens = ParseSharedTokens(absl::StrCat("\n ", kNewToken, " \n\n", kToken, "\n"), "f");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, std::vector<std::string>({kNewToken, kToken}));
  // One bad line spoils the file (the message names its line, never the token).
  auto bad = ParseSharedTokens(absl::StrCat(kToken, "\nshort-one\n"), "f");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 2"), absl::string_view::npos);
  EXPECT_EQ(bad.status().message().find("short-one"), absl::string_view::npos);
  EXPECT_FALSE(ParseSharedTokens("  \n\n", "f").ok());
  SharedToken token(*tokens);
  EXPECT_EQ(token.current(), kNewToken);
  EXPECT_EQ(token.accepted(), 2u);
  SharedToken copy = token;  // a handle: a change through one is seen by all
  copy.Set({kToken});
  EXPECT_EQ(token.current(), kToken);
}

// Echo that answers only callers with an accepted token.
class GuardedEcho final : public ferry::testing::v1::Echo::Service {
 public:
  explicit GuardedEcho(SharedToken token) : token_(std::move(token)) {}
  grpc::Status Echo(grpc::ServerContext* context, const ferry::testing::v1::EchoRequest* request,
                    ferry::testing::v1::EchoResponse* response) override {
    grpc::Status ok = CheckSharedToken(*context, token_);
    if (!ok.ok()) return ok;
    response->set_message(request->message());
    return grpc::Status::OK;
  }

 private:
  const SharedToken token_;
};

grpc::StatusCode Call(const std::string& address, const SharedToken& token) {
  auto stub = ferry::testing::v1::Echo::NewStub(NewChannel(address));
  auto context = NewClientContext(absl::Seconds(10));
  AttachSharedToken(context.get(), token);
  ferry::testing::v1::EchoRequest request;
  ferry::testing::v1::EchoResponse response;
  return stub->Echo(context.get(), request, &response).error_code();
}

grpc::StatusCode Call(const std::string& address, const std::string& token) {
  return Call(address, SharedToken(token));
}

TEST(SharedTokenTest, CallsWithoutTheRightTokenAreRefused) {
  GuardedEcho guarded{SharedToken(kToken)};
  GuardedEcho open{SharedToken()};
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

// The rotation the header describes, through a polled token file on both ends of a call.
TEST(SharedTokenTest, ARotationThroughThePolledFileNeverRefusesACall) {
  const std::string server_file = WriteFile("server_token", absl::StrCat(kToken, "\n"));
  const std::string client_file = WriteFile("client_token", absl::StrCat(kToken, "\n"));
  SharedTokenSource::Options options;
  options.file = server_file;
  options.poll_interval = absl::ZeroDuration();  // polled by hand below
  auto server = SharedTokenSource::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  options.file = client_file;
  auto client = SharedTokenSource::Start(options);
  ASSERT_TRUE(client.ok()) << client.status();
  GuardedEcho echo((*server)->token());
  auto grpc = *GrpcServer::Start({}, {&echo});
  const std::string address = grpc->address();
  auto step = [&](const std::string& server_text, const std::string& client_text) {
    std::ofstream(server_file) << server_text;
    std::ofstream(client_file) << client_text;
    EXPECT_TRUE((*server)->file()->Poll().ok());
    EXPECT_EQ(Call(address, (*client)->token()), grpc::StatusCode::OK);  // mid-roll
    EXPECT_TRUE((*client)->file()->Poll().ok());
    EXPECT_EQ(Call(address, (*client)->token()), grpc::StatusCode::OK);
  };
  const std::string old_token = kToken, new_token = kNewToken;
  step(old_token + "\n" + new_token + "\n", old_token + "\n" + new_token + "\n");  // add
  EXPECT_EQ(Call(address, new_token), grpc::StatusCode::OK);
  step(new_token + "\n" + old_token + "\n", new_token + "\n" + old_token + "\n");  // swap
  EXPECT_EQ((*client)->token().current(), new_token);
  step(new_token + "\n", new_token + "\n");  // drop
  EXPECT_EQ(Call(address, old_token), grpc::StatusCode::UNAUTHENTICATED);
  // A bad new content is refused: the tokens in force stay.
  std::ofstream(server_file) << "too-short\n";
  EXPECT_FALSE((*server)->file()->Poll().ok());
  EXPECT_EQ(Call(address, new_token), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace ferry
