#include "services/common/shared_token.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace ferry {
namespace {

constexpr char kMetadataKey[] = "authorization";
constexpr char kBearer[] = "Bearer ";

}  // namespace

bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  // The length is not secret (the minimum is public); the bytes are compared in full.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

absl::StatusOr<std::vector<std::string>> ParseSharedTokens(absl::string_view text,
                                                           absl::string_view source) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (line.size() < kMinSharedTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat("the shared token on line ", line_number,
                                                     " of ", source, " is shorter than ",
                                                     kMinSharedTokenBytes, " bytes"));
    }
    for (char c : line) {
      if (c < 0x21 || c > 0x7e) {
        return absl::InvalidArgumentError(absl::StrCat("the shared token on line ", line_number,
                                                       " of ", source,
                                                       " must be printable ASCII without spaces"));
      }
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, " holds no shared token"));
  }
  return tokens;
}

SharedToken::SharedToken() : state_(std::make_shared<State>()) {}

SharedToken::SharedToken(absl::string_view token) : SharedToken() {
  if (!token.empty()) Set({std::string(token)});
}

SharedToken::SharedToken(std::vector<std::string> tokens) : SharedToken() {
  Set(std::move(tokens));
}

void SharedToken::Set(std::vector<std::string> tokens) {
  absl::MutexLock lock(&state_->mu);
  state_->tokens = std::move(tokens);
}

bool SharedToken::empty() const {
  absl::MutexLock lock(&state_->mu);
  return state_->tokens.empty();
}

std::string SharedToken::current() const {
  absl::MutexLock lock(&state_->mu);
  return state_->tokens.empty() ? std::string() : state_->tokens.front();
}

size_t SharedToken::accepted() const {
  absl::MutexLock lock(&state_->mu);
  return state_->tokens.size();
}

bool SharedToken::Accepts(absl::string_view token) const {
  absl::MutexLock lock(&state_->mu);
  if (state_->tokens.empty()) return true;
  bool match = false;
  // Every accepted token is compared in full, whichever matches.
  for (const std::string& t : state_->tokens) match |= ConstantTimeEqual(token, t);
  return match;
}

grpc::Status CheckSharedToken(const grpc::ServerContextBase& context, const SharedToken& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kMetadataKey);
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this service requires the shared token (authorization: Bearer ...)");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  const absl::string_view bearer(kBearer);
  if (value.size() <= bearer.size() || value.substr(0, bearer.size()) != bearer ||
      !token.Accepts(value.substr(bearer.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the shared token is wrong");
  }
  return grpc::Status::OK;
}

void AttachSharedToken(grpc::ClientContext* context, const SharedToken& token) {
  const std::string current = token.current();
  if (!current.empty()) context->AddMetadata(kMetadataKey, kBearer + current);
}

absl::StatusOr<SharedToken> LoadSharedToken(const std::string& file, const char* env_var) {
  if (!file.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<SharedTokenSource> source,
                     SharedTokenSource::Start({file, absl::ZeroDuration(), nullptr, env_var}));
    return source->token();
  }
  const char* env = std::getenv(env_var);
  if (env == nullptr) return SharedToken();
  const absl::string_view token = absl::StripAsciiWhitespace(env);
  if (token.empty()) return SharedToken();  // set but empty: no token
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, ParseSharedTokens(token, env_var));
  return SharedToken(std::move(tokens));
}

absl::StatusOr<std::unique_ptr<SharedTokenSource>> SharedTokenSource::Start(
    const Options& options) {
  auto source = std::make_unique<SharedTokenSource>();
  if (options.file.empty()) {
    ASSIGN_OR_RETURN(source->token_, LoadSharedToken("", options.env_var));
    return source;
  }
  PolledFileOptions polled;
  polled.path = options.file;
  polled.name = "auth_token";
  polled.interval = options.poll_interval;
  polled.registry = options.registry;
  SharedToken token = source->token_;  // a handle on the same tokens
  const std::string path = options.file;
  ASSIGN_OR_RETURN(source->file_,
                   PolledFile::Start(polled, [token, path](const std::string& text) mutable {
                     ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                                      ParseSharedTokens(text, "the token file"));
                     LOG(INFO) << "shared token: " << tokens.size() << " accepted from " << path;
                     token.Set(std::move(tokens));
                     return absl::OkStatus();
                   }));
  return source;
}

}  // namespace ferry
