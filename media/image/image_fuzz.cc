// Fuzz target: untrusted bytes through ProbeImage and DecodeImage (PNG via libpng, JPEG via
// libjpeg-turbo) with small limits, then ApplyOrientation and the CLIP preprocessing on what
// decodes. Invariants: no crash or sanitizer report, no unbounded allocation (the limits hold);
// what decodes agrees with its probe (same size, RGB buffer of width * height * 3 bytes, within
// the limits); a rotated image keeps its pixel count; preprocessing yields 3 x 32 x 32 finite
// floats.
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "media/image/image.h"
#include "media/image/preprocess.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::media;
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  ImageLimits limits;
  limits.max_input_bytes = 1 << 20;
  limits.max_width = limits.max_height = 4096;
  limits.max_pixels = 1 << 20;
  limits.max_decoder_memory_bytes = 64 << 20;
  limits.max_jpeg_scans = 100;
  absl::StatusOr<ImageInfo> info = ProbeImage(bytes, limits);
  absl::StatusOr<RgbImage> image = DecodeImage(bytes, limits);
  if (!image.ok()) return 0;
  Check(info.ok());
  Check(image->width == info->width && image->height == info->height);
  Check(static_cast<int64_t>(image->width) * image->height <= limits.max_pixels);
  Check(image->pixels.size() == static_cast<size_t>(image->width) * image->height * 3);
  RgbImage turned = ApplyOrientation(*image, info->orientation);
  Check(turned.pixels.size() == image->pixels.size());
  static const PreprocessConfig config = [] {
    PreprocessConfig c = *ParsePreprocessorConfig(
        R"({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32},
            "crop_size": 32})");
    return c;
  }();
  // Bound the resize's own cost: a 1 x 4096 image would resize to 32 x 131072.
  if (std::max(image->width, image->height) <= 64 * std::min(image->width, image->height)) {
    absl::StatusOr<PixelValues> px = Preprocess(turned, config);
    Check(px.ok() && px->height == 32 && px->width == 32 && px->data.size() == 3 * 32 * 32);
    for (float v : px->data) Check(std::isfinite(v));
  }
  return 0;
}
