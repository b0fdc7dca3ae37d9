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
// Fetch blocks until the bytes arrive or `deadline` (RouterOptions.image_fetch_timeout, within the
// request's own deadline), so it is never called on the HTTP I/O threads: a call with remote
// images continues on the router's ImageFetchExecutor (router/image_fetch_executor.h; a full
// queue is a 503), which fetches them, puts the bytes into the request's image parts, checks them
// as inline ones (image_part.h CheckImages; over --max_image_bytes: 400) and builds the prompt
// there. Implementations are thread-safe: calls run concurrently.

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
