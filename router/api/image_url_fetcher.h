// The seam through which the router gets a remote image (an http(s) URL in an image content part:
// image_part.h keeps it unfetched): one call that returns the image's bytes or says why not.
//
// An implementation owns the policy an operator turns on with --image_url_hosts: the host
// allowlist, the size cap, the deadline, no redirects, the resolved address checked against
// private, loopback, link-local and IPv4-mapped ranges and pinned for the connection, HTTPS with
// the system CA bundle. Without one (RouterOptions.image_url_fetcher null, the default) a remote
// URL is a 400 (kRemoteImagesDisabled).
//
// Errors are the client's answer: InvalidArgument or PermissionDenied (400/403: not allowed, not
// an image, too large), DeadlineExceeded or Unavailable (the host did not answer in time). The
// message names the URL's host, never the resolved address.
//
// Fetch blocks until the bytes arrive or `deadline`, so it must be called off the HTTP I/O thread
// (ApiCall::Start runs there: parse, prompt, hash, then the dispatcher). Not wired yet: a Router
// given a fetcher refuses to start, and ApiLimits.remote_images stays false. Wiring it means an
// executor with a bound (threads, queued fetches, a metric when full) between ApiCall's parse and
// its prompt: the call fetches the request's remote images there, puts the bytes into its
// ApiImage parts, runs CheckImages on them, and continues on that thread (the store probe and the
// dispatcher already take calls from any thread). Implementations are thread-safe: calls run
// concurrently.

#ifndef FERRY_ROUTER_API_IMAGE_URL_FETCHER_H_
#define FERRY_ROUTER_API_IMAGE_URL_FETCHER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ferry {

class ImageUrlFetcher {
 public:
  virtual ~ImageUrlFetcher() = default;

  // The body of `url` (an http or https URL), at most the implementation's size cap.
  virtual absl::StatusOr<std::string> Fetch(const std::string& url, absl::Time deadline) = 0;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_IMAGE_URL_FETCHER_H_
