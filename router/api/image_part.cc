#include "router/api/image_part.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "media/image/image.h"
#include "router/api/request_json.h"

namespace ferry {

const char kRemoteImagesDisabled[] =
    "remote image URLs are disabled on this server (an operator enables them with "
    "--image_url_hosts); send the image inline as a base64 data: URL";

namespace {

std::string MiB(int64_t bytes) {
  return bytes % (1 << 20) == 0 ? absl::StrCat(bytes >> 20, " MiB") : absl::StrCat(bytes, " bytes");
}

ApiError CheckMediaType(const std::string& media_type, const std::string& param) {
  if (!absl::StartsWith(absl::AsciiStrToLower(media_type), "image/")) {
    return ApiInvalid(param,
                      absl::StrCat("'", media_type.substr(0, 64),
                                   "' is not an image media type (image/png, image/jpeg)"),
                      "invalid_image_format");
  }
  return ApiOk();
}

}  // namespace

ApiError ImageFromBase64(const std::string& data, const std::string& media_type,
                         const std::string& param, const ApiLimits& limits, ApiImage* out) {
  RETURN_IF_API_ERROR(CheckMediaType(media_type, param));
  // Decoded, base64 is 3/4 of its length: refused before decoding when that is over the limit.
  const int64_t decoded = static_cast<int64_t>(data.size() / 4 * 3);
  if (decoded > limits.max_image_bytes + 3) {
    return ApiInvalid(param,
                      absl::StrCat("the image takes about ", decoded, " bytes; at most ",
                                   MiB(limits.max_image_bytes), " per image"),
                      "image_too_large");
  }
  std::string bytes;
  if (data.empty() || !absl::Base64Unescape(data, &bytes) || bytes.empty()) {
    return ApiInvalid(param, "the image's data is not valid base64", "invalid_image_format");
  }
  if (static_cast<int64_t>(bytes.size()) > limits.max_image_bytes) {
    return ApiInvalid(param,
                      absl::StrCat("the image takes ", bytes.size(), " bytes; at most ",
                                   MiB(limits.max_image_bytes), " per image"),
                      "image_too_large");
  }
  out->bytes = std::move(bytes);
  out->media_type = absl::AsciiStrToLower(media_type);
  out->url.clear();
  out->param = param;
  return ApiOk();
}

ApiError ImageFromUrl(const std::string& url, const std::string& param, const ApiLimits& limits,
                      ApiImage* out) {
  const size_t colon = url.find(':');
  const std::string scheme =
      colon == std::string::npos ? "" : absl::AsciiStrToLower(url.substr(0, colon));
  if (scheme == "data") {
    // data:[<media type>][;<parameter>]*;base64,<data>
    const size_t comma = url.find(',', colon);
    if (comma == std::string::npos) {
      return ApiInvalid(param, "a data: URL needs a ',' before its data", "invalid_image_url");
    }
    std::vector<std::string> header = absl::StrSplit(url.substr(colon + 1, comma - colon - 1), ';');
    if (header.size() < 2 || absl::AsciiStrToLower(header.back()) != "base64") {
      return ApiInvalid(param, "an image data: URL must be base64 (data:image/png;base64,...)",
                        "invalid_image_url");
    }
    return ImageFromBase64(url.substr(comma + 1), header.front(), param, limits, out);
  }
  if (scheme == "http" || scheme == "https") {
    if (!limits.remote_images) {
      return ApiInvalid(param, kRemoteImagesDisabled, "remote_images_disabled");
    }
    if (url.size() > 8192) return ApiInvalid(param, "the image URL is longer than 8192 bytes");
    out->bytes.clear();
    out->media_type.clear();
    out->url = url;
    out->param = param;
    return ApiOk();
  }
  return ApiInvalid(param,
                    absl::StrCat("an image URL must be a data: URL or an http(s) URL, not '",
                                 scheme.substr(0, 32), ":'"),
                    "invalid_image_url");
}

int64_t CountImages(const std::vector<ApiMessage>& messages) {
  int64_t n = 0;
  for (const ApiMessage& m : messages) {
    for (const ApiContentPart& p : m.content) n += p.image.has_value() ? 1 : 0;
  }
  return n;
}

ApiError CheckImages(const ApiRequest& request, const ApiLimits& limits) {
  const int64_t n = CountImages(request.messages);
  if (n > limits.max_images) {
    return ApiInvalid(
        "messages",
        absl::StrCat("the request has ", n, " images; at most ", limits.max_images, " per request"),
        "too_many_images");
  }
  media::ImageLimits probe = limits.image;
  probe.max_input_bytes = limits.max_image_bytes;
  for (const ApiMessage& m : request.messages) {
    for (const ApiContentPart& p : m.content) {
      if (!p.image.has_value() || p.image->bytes.empty()) continue;
      auto info = media::ProbeImage(p.image->bytes, probe);
      if (!info.ok()) {
        return ApiInvalid(p.image->param,
                          absl::StrCat("the image cannot be used: ", info.status().message()),
                          "invalid_image");
      }
    }
  }
  return ApiOk();
}

}  // namespace ferry
