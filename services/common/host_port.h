// "host:port" endpoints, as flags and peers spell them: a name, an IPv4 address or a bracketed
// IPv6 address ("[fd00::7]:50051"), a colon, a port. The one place Ferry splits and joins them.
//
// Stateless functions; thread-safe.

#ifndef FERRY_SERVICES_COMMON_HOST_PORT_H_
#define FERRY_SERVICES_COMMON_HOST_PORT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {

// "host:port" split (the host of "[v6]:port" without its brackets). InvalidArgument unless the
// port is 1..65535 and the host not empty.
absl::Status SplitHostPort(absl::string_view endpoint, std::string* host, int* port);

// "host:port", bracketing an IPv6 host (a host already bracketed stays as it is).
std::string JoinHostPort(absl::string_view host, int port);

// The host of "host:port" or "[v6]:port" (brackets kept); the whole text without a port.
absl::string_view HostOfAddress(absl::string_view address);

// "", "0.0.0.0", "::", "[::]": every interface.
bool IsWildcardHost(absl::string_view host);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_HOST_PORT_H_
