// Image decoding, hardened: PNG (libpng) and JPEG (libjpeg-turbo) bytes from an untrusted client
// into 8-bit RGB, with every size checked from the header before anything is decoded.
//
// What it gives: exactly what PIL's `Image.open(f).convert("RGB")` gives for the same bytes
// (transformers' `load_image` and image processors call it): grey replicated to three channels,
// palettes expanded, alpha and tRNS dropped (not composited), 1/2/4-bit grey scaled to 0..255,
// 16-bit colour and grey+alpha reduced to the high byte, 16-bit grey clamped to 0..255 (PIL opens
// it as mode "I" and its I -> RGB conversion clips; checked by
// //media/image:preprocess_reference_test). JPEG decodes with
// libjpeg's defaults (JDCT_ISLOW, fancy upsampling, block smoothing), as PIL's decoder does; CMYK
// and YCCK JPEGs (libjpeg turns YCCK into CMYK) are read as PIL reads them, as Adobe's inverted
// CMYK, and converted with PIL's own CMYK -> RGB formula (nk = 255 - K; R = nk - C nk / 255).
// EXIF orientation is reported by ProbeImage and applied only by ApplyOrientation: the image
// processors do not rotate, transformers' `load_image` does (ImageOps.exif_transpose), and the API
// path follows load_image.
//
// Bounds (ImageLimits): the input size, each side and the pixel count are checked from the header
// before any pixel buffer exists; libpng's chunk allocations and cached ancillary chunks are
// capped, libjpeg's working memory is capped and a progressive JPEG's scan count is bounded (the
// CPU bomb). Errors: absl::InvalidArgumentError naming the problem (truncated, malformed,
// unsupported, over a limit); nothing crashes or allocates without bound. Thread-safe: no shared
// state.
#ifndef FERRY_MEDIA_IMAGE_IMAGE_H_
#define FERRY_MEDIA_IMAGE_IMAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry::media {

enum class ImageFormat { kPng, kJpeg };

const char* ImageFormatName(ImageFormat format);

struct ImageLimits {
  // The encoded bytes (a request's image is inline in its JSON body).
  int64_t max_input_bytes = 32 << 20;
  // Each side, and the pixel count: 50 Mpx is 150 MB of RGB, above any camera image a client
  // sends and far below what PIL refuses (2 x 89.5 Mpx).
  int64_t max_width = 16384;
  int64_t max_height = 16384;
  int64_t max_pixels = 50'000'000;
  // libjpeg's working memory (a progressive JPEG buffers its coefficients: 2 bytes a sample).
  int64_t max_decoder_memory_bytes = 512 << 20;
  // A progressive JPEG with thousands of tiny scans costs a full pass each.
  int max_jpeg_scans = 1000;
};

// What the header says, without decoding pixels.
struct ImageInfo {
  ImageFormat format = ImageFormat::kPng;
  int width = 0;
  int height = 0;
  int channels = 0;  // in the file: 1 grey, 2 grey+alpha, 3 colour, 4 colour+alpha (or CMYK)
  int bit_depth = 8;
  bool palette = false;
  int orientation = 1;  // EXIF 0x0112 (JPEG APP1 Exif, PNG eXIf), 1..8; 1 when absent or invalid
};

// 8-bit RGB, interleaved, row-major: pixels.size() == width * height * 3.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

// The header only (PNG's IHDR and chunk headers for eXIf; JPEG's markers up to the first SOF,
// with APP1 Exif). Checks the
// limits on input size and dimensions too, so the router can refuse before forwarding.
absl::StatusOr<ImageInfo> ProbeImage(absl::string_view bytes, const ImageLimits& limits = {});

// The whole image as RGB (see the contract above). Orientation is not applied.
absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, const ImageLimits& limits = {});

// PIL's ImageOps.exif_transpose for an EXIF orientation 1..8 (others: unchanged).
RgbImage ApplyOrientation(const RgbImage& image, int orientation);

}  // namespace ferry::media

#endif  // FERRY_MEDIA_IMAGE_IMAGE_H_
