// A blocking HTTP/1.1 GET with a deadline on the whole exchange (resolve, connect, write, read):
// what a process asks of another's admin port (ferry-planner reads the routers' GET /workers and
// GET /metrics; ferry load asks a router what it serves). Plain TCP, one connection per call,
// Boost.Beast kept in http_get.cc.
//
// Stateless; thread-safe (each call has its own I/O context).

#ifndef FERRY_SERVICES_COMMON_HTTP_GET_H_
#define FERRY_SERVICES_COMMON_HTTP_GET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry {

struct HttpGetOptions {
  int64_t max_body_bytes = 64 << 20;  // a longer body fails the call (ResourceExhausted)
  std::string user_agent = "ferry";
};

// GET `target` ("/workers") from `address` ("host:port", host_port.h). Returns the body of a 200
// answer. Errors: a bad address (InvalidArgument); the deadline passed (DeadlineExceeded); the
// host cannot be resolved or reached, or the connection broke (Unavailable); an answer other
// than 200 (Unavailable, or NotFound for 404, naming the status and the start of the body); a
// body over max_body_bytes (ResourceExhausted). A numeric host is used as it is; a name goes to
// the system's resolver, whose own timeout (resolv.conf) may outlast the deadline.
absl::StatusOr<std::string> HttpGet(absl::string_view address, absl::string_view target,
                                    absl::Time deadline,
                                    const HttpGetOptions& options = HttpGetOptions());

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_HTTP_GET_H_
