// An HTTPS client for the Kubernetes API server, as the Kubernetes actuator needs it: one request
// at a time, each on a connection of its own (a call every few seconds; no pool to go stale), with
// a deadline over the whole exchange (connect, TLS handshake, request, response).
//
// Security: over https the server's certificate must chain to the CA file (the service account's
// ca.crt; re-read for every connection, so a rotated CA takes effect) and name the URL's host
// (its IP address or DNS name); TLS 1.2 at least. Plain http:// only when the URL says so (tests
// against a mock). The bearer token is read from its file for every request: projected service
// account tokens rotate (the kubelet replaces the file), and a read per call always sends the
// current one. The token never appears in an error message.
//
// Hostile answers: the response's headers are bounded (64 KiB) and its body by
// max_response_bytes; a larger one is ResourceExhausted, a malformed one Internal, never a crash.
// The host should be an IP address (in a pod, KUBERNETES_SERVICE_HOST is): a name is resolved by
// the system resolver, whose own timeout may outlast the deadline.
//
// Thread-compatible: one caller at a time (the planner's loop).

#ifndef FERRY_SERVICES_PLANNER_KUBERNETES_CLIENT_H_
#define FERRY_SERVICES_PLANNER_KUBERNETES_CLIENT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry {

struct KubernetesClientOptions {
  // "https://HOST[:PORT]" (port 443 by default) or "http://HOST[:PORT]"; no path.
  std::string server;
  // The bearer token's file; empty: no Authorization header.
  std::string token_file;
  // PEM CA certificates the server's certificate must chain to (https: required).
  std::string ca_file;
  // The largest response body accepted.
  size_t max_response_bytes = 16 << 20;
};

struct KubernetesRequest {
  std::string method;        // "GET", "PATCH", ...
  std::string path;          // "/apis/apps/v1/namespaces/ferry/deployments/ferry-decode"
  std::string query;         // escaped, without the "?" ("labelSelector=a%3Db"); "" for none
  std::string content_type;  // of the body; "" without one
  std::string body;
};

class KubernetesClient {
 public:
  // Errors: InvalidArgument (a URL that is not http(s)://host[:port], https without a CA file),
  // the CA file unreadable or not PEM certificates (FailedPrecondition).
  static absl::StatusOr<std::unique_ptr<KubernetesClient>> Create(KubernetesClientOptions options);

  // The response body of a 2xx answer. Errors: an answer of another status is ApiError's (with
  // the API server's message); the token file unreadable or empty (FailedPrecondition); no answer
  // by `deadline` (DeadlineExceeded); the connection or the TLS handshake failed, certificate
  // checks included (Unavailable, with the reason); the body over max_response_bytes
  // (ResourceExhausted); not HTTP (Internal).
  absl::StatusOr<std::string> Call(const KubernetesRequest& request, absl::Time deadline);

  const KubernetesClientOptions& options() const { return options_; }

 private:
  KubernetesClient(KubernetesClientOptions options, bool tls, std::string host, int port);

  const KubernetesClientOptions options_;
  const bool tls_;
  const std::string host_;  // without brackets
  const int port_;
};

// `text` escaped for a URL's query component (RFC 3986: unreserved characters stay).
std::string QueryEscape(absl::string_view text);

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_KUBERNETES_CLIENT_H_
