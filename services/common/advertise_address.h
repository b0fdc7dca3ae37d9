// The address a service puts in what it tells others (a worker's id and gRPC endpoint in its
// Watch stream, a KV transport's address in hand-offs): the host of --advertise_address (in
// Kubernetes the pod's IP, from the Downward API) with the port the service actually bound.
//
// A service that listens on every interface (0.0.0.0, ::, an empty host) has no address of its
// own to advertise: a peer handed "0.0.0.0:port" would dial itself. Such a service must be given
// --advertise_address; without it CheckAdvertisable fails and the service refuses to start. A
// service bound to one address advertises that one when no --advertise_address is given.
//
// Stateless functions; thread-safe.

#ifndef FERRY_SERVICES_COMMON_ADVERTISE_ADDRESS_H_
#define FERRY_SERVICES_COMMON_ADVERTISE_ADDRESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "services/common/host_port.h"

namespace ferry {

// OK for a host to advertise: a name, an IPv4 address, an IPv6 address (bare or bracketed); no
// port, no wildcard, no spaces. The error names `flag`.
absl::Status ValidateAdvertiseHost(absl::string_view flag, absl::string_view host);

// OK unless `listen_address` (the value of `flag`) listens on a wildcard host while
// `advertise_host` is empty (the error says to set --advertise_address), or listens on loopback
// only while `advertise_host` is an IP address that is not (peers could not reach it).
absl::Status CheckAdvertisable(absl::string_view flag, absl::string_view listen_address,
                               absl::string_view advertise_host);

// "advertise_host:port" (an IPv6 host bracketed) when `advertise_host` is set, else
// `bound_address` ("host:port", the address the server actually bound) as it is.
std::string AdvertisedAddress(absl::string_view bound_address, absl::string_view advertise_host);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_ADVERTISE_ADDRESS_H_
