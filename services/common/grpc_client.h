// Client-side gRPC helpers: channels with the same message-size bounds as Ferry's servers, and
// call contexts that always carry a deadline and the request's trace id, so no inter-service call
// can wait forever and every call can be found in the peer's logs.

#ifndef FERRY_SERVICES_COMMON_GRPC_CLIENT_H_
#define FERRY_SERVICES_COMMON_GRPC_CLIENT_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace ferry {

// Metadata key of the trace id on every inter-service call.
inline constexpr char kTraceIdMetadataKey[] = "x-ferry-trace-id";

struct ChannelOptions {
  int max_receive_message_bytes = 64 << 20;
  int max_send_message_bytes = 64 << 20;
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // How soon a channel whose peer went away tries to connect again, at most (gRPC's own default
  // grows to 2 minutes: a worker restarted after a crash would wait that long to be seen).
  absl::Duration max_reconnect_backoff = absl::Seconds(5);
  // How long one connection attempt (TCP and the HTTP/2 handshake) may take before it counts as
  // failed. gRPC takes it from GRPC_ARG_MIN_RECONNECT_BACKOFF_MS (its "minimum connect timeout",
  // 20 s by default), not from the backoff above: a short one fails attempts to a peer that is
  // merely slow to answer (a loaded machine, a worker busy draining), and a call without
  // wait_for_ready then fails at once. The backoff between attempts stays the short one above.
  absl::Duration connect_timeout = absl::Seconds(5);
};

// A plaintext channel to `target` ("host:port"). Connects lazily.
std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          const ChannelOptions& options = {});

// A context whose call fails with DEADLINE_EXCEEDED after `timeout`.
std::unique_ptr<grpc::ClientContext> NewClientContext(absl::Duration timeout,
                                                      absl::string_view trace_id = "");

// The caller's trace id ("" if none was sent).
std::string TraceIdOf(const grpc::ServerContextBase& context);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_GRPC_CLIENT_H_
