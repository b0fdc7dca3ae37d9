// Fetches the bytes of a remote image URL for the router (an OpenAI `image_url` or Anthropic
// `url` image source that is not a `data:` URL), when the operator has turned remote URLs on.
// A remote URL makes the router send a request the client chose, so every step is bounded and
// checked (docs/serving/remote-images.md states the rules for operators):
//
//   1. ParseImageUrl (image_url.h): http or https only, a strict host, no user info.
//   2. The host must be on the operator's allowlist (host_allowlist.h): PermissionDenied if not.
//      An empty allowlist refuses every URL (the feature is off).
//   3. A name is resolved here, once, through c-ares (services/common/dns_resolver.h: the
//      system's servers, or RemoteImageFetcherOptions::dns_servers), as an absolute name (no
//      search list), bounded by the deadline. "localhost" and "*.localhost" are refused without
//      a lookup. EVERY address of the answer (and an IP literal) must be public unicast
//      (ip_address.h: not loopback, private, link-local, CGNAT, multicast, reserved,
//      IPv4-mapped / NAT64 / 6to4 forms of those...): PermissionDenied otherwise, before any
//      connection.
//   4. The connection goes to those checked addresses (the first that answers), never to a second
//      resolution; the Host header, TLS SNI and the certificate's name check carry the name.
//   5. HTTPS: TLS 1.2+, the peer verified against the CA bundle (the system's by default) and its
//      certificate checked for the host name (or IP literal).
//   6. GET with `Connection: close` and no Accept-Encoding. A 3xx is refused (redirects are never
//      followed), as is any answer but 200; the headers are capped; the Content-Type must be
//      image/* (or application/octet-stream when accept_octet_stream: object stores often serve
//      images so, and the router probes the bytes' format anyway); a Content-Encoding other than
//      identity is refused; a Content-Length over max_image_bytes is refused before the body is
//      read, and any body is read only up to max_image_bytes.
//   7. One deadline covers the lookup, connect, TLS handshake, request and response: the earlier of
//      the caller's deadline and now + timeout.
//
// Errors (messages fit for the API client: they name the URL's host as the client gave it, never
// an address it resolved to): InvalidArgument for a bad URL, an answer refused (status, type,
// size, encoding, an empty body), a name that does not resolve, a server that cannot be reached or
// answers too slowly within the fetcher's own timeout; PermissionDenied for a host not on the
// allowlist or an address that is not public; DeadlineExceeded when the caller's deadline (not
// the fetcher's timeout) ran out; FailedPrecondition from Create for bad options (the CA file
// cannot be read).
//
// Thread-safe: Fetch may be called from many threads at once; each call has its own I/O context,
// resolver channel and TLS session, and shares only the immutable options, allowlist and TLS
// context. Fetch blocks the calling thread until the deadline at most.

#ifndef FERRY_ROUTER_FETCH_REMOTE_IMAGE_FETCHER_H_
#define FERRY_ROUTER_FETCH_REMOTE_IMAGE_FETCHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/fetch/host_allowlist.h"

namespace ferry {

struct RemoteImageFetcherOptions {
  // Host patterns (host_allowlist.h). Empty: every URL is refused.
  std::vector<std::string> allowed_hosts;
  int64_t max_image_bytes = 20 << 20;          // the body's cap
  int64_t max_header_bytes = 16 << 10;         // the response headers' cap
  absl::Duration timeout = absl::Seconds(10);  // resolve + connect + TLS + exchange, at most
  // The CA certificates HTTPS peers are verified against (PEM bundle).
  std::string ca_file = "/etc/ssl/certs/ca-certificates.crt";
  bool accept_octet_stream = true;  // also take Content-Type: application/octet-stream
  // DNS servers ("ip" or "ip:port"), asked instead of the system's (/etc/resolv.conf and
  // /etc/hosts); empty: the system's.
  std::vector<std::string> dns_servers;
  // FOR TESTS ONLY: skip the public-address check of step 3, so that a test may fetch from a
  // server on 127.0.0.1. Never set in a serving process (router_main has no flag for it).
  bool allow_private_addresses_for_tests = false;
};

class RemoteImageFetcher {
 public:
  // InvalidArgument for a bad allowlist pattern, a malformed DNS server or a non-positive cap or
  // timeout;
  // FailedPrecondition if the CA file cannot be loaded.
  static absl::StatusOr<std::unique_ptr<RemoteImageFetcher>> Create(
      RemoteImageFetcherOptions options);
  ~RemoteImageFetcher();
  RemoteImageFetcher(const RemoteImageFetcher&) = delete;
  RemoteImageFetcher& operator=(const RemoteImageFetcher&) = delete;

  // The body of `url`'s 200 answer (the image's bytes, at most max_image_bytes), by `deadline`.
  // The shape of the router's ImageUrlFetcher seam.
  absl::StatusOr<std::string> Fetch(const std::string& url, absl::Time deadline);

 private:
  struct Tls;
  RemoteImageFetcher(RemoteImageFetcherOptions options, HostAllowlist allowlist,
                     std::unique_ptr<Tls> tls);

  const RemoteImageFetcherOptions options_;
  const HostAllowlist allowlist_;
  const std::unique_ptr<Tls> tls_;  // the TLS client context (Beast kept in the .cc)
};

}  // namespace ferry

#endif  // FERRY_ROUTER_FETCH_REMOTE_IMAGE_FETCHER_H_
