// Images in API requests: what the three adapters (openai_parser, anthropic_parser,
// responses_parser) share in reading an image content part, and the checks every image of a
// request passes before anything is sent to a worker.
//
// An image arrives as a data: URL (OpenAI's image_url, Responses' input_image:
// "data:image/png;base64,..."), as base64 with a media type (Anthropic's source "base64"), or as a
// remote http(s) URL (all three). Only those: another scheme, a data: URL that is not base64, a
// media type that is not image/*, bad base64, or decoded bytes over ApiLimits.max_image_bytes are
// a 400 naming the field. A remote URL is kept unfetched (ApiImage.url) when the server fetches
// them (ApiLimits.remote_images, set when an ImageUrlFetcher is configured), and a 400 otherwise.
//
// CheckImages then counts the request's images (at most ApiLimits.max_images) and probes each
// inline image's header (media::ProbeImage with ApiLimits.image: PNG or JPEG, not truncated, each
// side and the pixel count within bounds: a decompression bomb is refused by its header); the
// bytes themselves are decoded by the worker that encodes them.
//
// Pure functions; thread-safe.

#ifndef FERRY_ROUTER_API_IMAGE_PART_H_
#define FERRY_ROUTER_API_IMAGE_PART_H_

#include <string>

#include "router/api/api_request.h"

namespace ferry {

// The message a remote image URL gets while the server fetches none.
extern const char kRemoteImagesDisabled[];

// `url`: a data: URL or an http(s) URL, at `param`.
ApiError ImageFromUrl(const std::string& url, const std::string& param, const ApiLimits& limits,
                      ApiImage* out);

// Base64 `data` of `media_type` (Anthropic's source "base64"), at `param`.
ApiError ImageFromBase64(const std::string& data, const std::string& media_type,
                         const std::string& param, const ApiLimits& limits, ApiImage* out);

// The request's images: their count, and each inline one's header (see above).
ApiError CheckImages(const ApiRequest& request, const ApiLimits& limits);

// The images of `messages`, in order.
int64_t CountImages(const std::vector<ApiMessage>& messages);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_IMAGE_PART_H_
