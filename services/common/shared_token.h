// The shared token that guards inter-service calls (ARCHITECTURE.md §8): when a service is
// configured with one, every call of its own gRPC services must carry it as the metadata
// "authorization: Bearer <token>", and its clients attach it. The standard health service stays
// open (Kubernetes probes send no metadata).
//
// The tokens come from a file (--auth_token_file) or, when no file is named, from the environment
// (FERRY_AUTH_TOKEN: one token); none of them: no token, calls are not checked. The file holds
// one token per line (blank lines and surrounding whitespace ignored): the first is the one the
// service's clients send, every one is accepted by its servers. A rotation across running
// services is then: add the new token as the second line everywhere, make it the first, drop
// the old one, each step applied by every service (SharedTokenSource polls the file) before the
// next. A token is at least 16 bytes of printable ASCII without spaces, so that a mistyped empty
// file or a trivial value is an error rather than a weak guard. The comparison takes the same
// time wherever the first difference is.
//
// SharedToken is a handle: its copies share one set of tokens, so the options structs of a
// service's clients and servers hold copies and each call uses the set in force when it starts.
//
// Thread-safe.

#ifndef FERRY_SERVICES_COMMON_SHARED_TOKEN_H_
#define FERRY_SERVICES_COMMON_SHARED_TOKEN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/polled_file.h"

// The gRPC adapters below take these; the header stays free of gRPC's (STYLE.md §14: the
// transport options and other widely included headers hold a SharedToken).
namespace grpc {
class ClientContext;
class ServerContextBase;
class Status;
}  // namespace grpc
namespace prometheus {
class Registry;
}  // namespace prometheus

namespace ferry {

inline constexpr char kSharedTokenEnv[] = "FERRY_AUTH_TOKEN";
inline constexpr size_t kMinSharedTokenBytes = 16;

// Whether a == b, taking the same time for every pair of equal-length strings (secrets are
// compared with it).
bool ConstantTimeEqual(absl::string_view a, absl::string_view b);

// The tokens of a token file's text, in order (InvalidArgument naming `source` when there is
// none, or one is too short or not printable; the message never quotes a token).
absl::StatusOr<std::vector<std::string>> ParseSharedTokens(absl::string_view text,
                                                           absl::string_view source);

class SharedToken {
 public:
  // No token: nothing is sent, every call is accepted.
  SharedToken();
  // One token ("": none).
  explicit SharedToken(absl::string_view token);
  // The first is sent, all are accepted (none: as SharedToken()).
  explicit SharedToken(std::vector<std::string> tokens);

  // Replaces the tokens of this handle and of all its copies.
  void Set(std::vector<std::string> tokens);

  bool empty() const;
  // The token clients send ("" when none).
  std::string current() const;
  // How many tokens servers accept.
  size_t accepted() const;

  // Whether a call presenting `token` passes: no token is set, or it is one of them (each
  // compared in constant time).
  bool Accepts(absl::string_view token) const;

 private:
  struct State {
    mutable absl::Mutex mu;
    std::vector<std::string> tokens ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

// The tokens of `file` ("": those of the environment variable, one token; neither: none), read
// once.
absl::StatusOr<SharedToken> LoadSharedToken(const std::string& file,
                                            const char* env_var = kSharedTokenEnv);

// A service's tokens: those of its --auth_token_file, re-read every `poll_interval`
// (PolledFile: a new valid content takes effect in every copy of token(); a bad one is logged
// and the old tokens stay), or the environment's (fixed).
class SharedTokenSource {
 public:
  struct Options {
    std::string file;  // "": the environment variable's token, if any
    absl::Duration poll_interval = absl::Seconds(10);  // zero: never re-read
    prometheus::Registry* registry = nullptr;          // ferry_secret_reloads_total
    const char* env_var = kSharedTokenEnv;
  };
  static absl::StatusOr<std::unique_ptr<SharedTokenSource>> Start(const Options& options);

  const SharedToken& token() const { return token_; }
  // Null without a file.
  PolledFile* file() { return file_.get(); }

 private:
  SharedToken token_;
  std::unique_ptr<PolledFile> file_;
};

// OK when `token` has none set or the call carries one of them; UNAUTHENTICATED otherwise (the
// message never contains a token).
grpc::Status CheckSharedToken(const grpc::ServerContextBase& context, const SharedToken& token);

// Adds the token's current one to a call (nothing when none).
void AttachSharedToken(grpc::ClientContext* context, const SharedToken& token);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_SHARED_TOKEN_H_
