#include "services/common/shared_token.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

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

absl::StatusOr<std::string> LoadSharedToken(const std::string& file, const char* env_var) {
  std::string token;
  std::string source;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read the token file ", file));
    std::ostringstream text;
    text << in.rdbuf();
    token = std::string(absl::StripAsciiWhitespace(text.str()));
    source = file;
  } else if (const char* env = std::getenv(env_var); env != nullptr) {
    token = std::string(absl::StripAsciiWhitespace(env));
    source = env_var;
    if (token.empty()) return token;  // set but empty: no token
  } else {
    return std::string();
  }
  if (token.size() < kMinSharedTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the shared token in ", source, " is shorter than ", kMinSharedTokenBytes, " bytes"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shared token in ", source, " must be printable ASCII without spaces"));
    }
  }
  return token;
}

grpc::Status CheckSharedToken(const grpc::ServerContextBase& context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kMetadataKey);
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this service requires the shared token (authorization: Bearer ...)");
  }
  const std::string value(it->second.data(), it->second.size());
  const std::string want = kBearer + token;
  if (!ConstantTimeEqual(value, want)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the shared token is wrong");
  }
  return grpc::Status::OK;
}

void AttachSharedToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata(kMetadataKey, kBearer + token);
}

}  // namespace ferry
