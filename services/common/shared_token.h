// The shared token that guards inter-service calls (ARCHITECTURE.md §8): when a service is
// configured with one, every call of its own gRPC services must carry it as the metadata
// "authorization: Bearer <token>", and its clients attach it. The standard health service stays
// open (Kubernetes probes send no metadata).
//
// The token comes from a file (--auth_token_file; surrounding whitespace trimmed) or, when no
// file is named, from the environment (FERRY_AUTH_TOKEN); none of them: no token, calls are not
// checked. A token is at least 16 bytes of printable ASCII, so that a mistyped empty file or a
// trivial value is an error at start-up rather than a weak guard. The comparison takes the same
// time wherever the first difference is.
//
// Thread-safe (stateless functions).

#ifndef FERRY_SERVICES_COMMON_SHARED_TOKEN_H_
#define FERRY_SERVICES_COMMON_SHARED_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace ferry {

inline constexpr char kSharedTokenEnv[] = "FERRY_AUTH_TOKEN";
inline constexpr size_t kMinSharedTokenBytes = 16;

// Whether a == b, taking the same time for every pair of equal-length strings (secrets are
// compared with it).
bool ConstantTimeEqual(absl::string_view a, absl::string_view b);

// The configured token ("" when none is configured).
absl::StatusOr<std::string> LoadSharedToken(const std::string& file,
                                            const char* env_var = kSharedTokenEnv);

// OK when `token` is empty or the call carries it; UNAUTHENTICATED otherwise (the message never
// contains either token).
grpc::Status CheckSharedToken(const grpc::ServerContextBase& context, const std::string& token);

// Adds the token to a call (nothing when empty).
void AttachSharedToken(grpc::ClientContext* context, const std::string& token);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_SHARED_TOKEN_H_
