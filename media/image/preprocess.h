// Preprocessing identical to transformers' image processors (4.47.1): an RGB image into the
// float32 channel-first pixel values a vision tower takes, as CLIPImageProcessor (LLaVA-1.5) and
// SiglipImageProcessor compute them from a model's `preprocessor_config.json`.
//
// Steps, each as transformers does it on a uint8 RGB array:
//   resize       PIL's Image.resize (reducing_gap=None) with the config's resample, 2 bilinear or
//                3 bicubic; ResizePil replicates libImaging/Resample.c: horizontal pass then
//                vertical, filter support scaled by the downscale factor, coefficients normalised
//                in double and converted to 22-bit fixed point, rounding and clipping to 8 bits
//                after each pass (bit-identical to PIL);
//                CLIP: {"shortest_edge": s}: the short side to s, the long one to
//                int(s * long / short) (get_resize_output_image_size, default_to_square=False);
//                {"height", "width"} (CLIP or SigLIP): that size directly; a resized image
//                over 64 Mpx (an aspect ratio beyond ~1:500 at 336) is refused;
//   center crop  transformers' center_crop: top = (h - ch) // 2, zero padding when smaller;
//   rescale      float32(float64(v) * rescale_factor);
//   normalize    (x - float32(mean)) / float32(std) in float32;
//   output       channel-first (3, H, W) float32.
// do_convert_rgb is implied: the input is already RGB (DecodeImage gives what convert("RGB")
// gives). A processor or option this does not implement is refused with the key's name, so a
// model whose processor differs fails loudly rather than being fed different pixels.
// Pure functions; thread-safe.
#ifndef FERRY_MEDIA_IMAGE_PREPROCESS_H_
#define FERRY_MEDIA_IMAGE_PREPROCESS_H_

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "media/image/image.h"

namespace ferry::media {

enum class Resample { kBilinear = 2, kBicubic = 3 };

struct PreprocessConfig {
  enum class Processor { kClip, kSiglip };
  Processor processor = Processor::kClip;
  bool do_resize = true;
  int shortest_edge = 0;  // > 0: resize the short side to it; else to resize_height x resize_width
  int resize_height = 0;
  int resize_width = 0;
  Resample resample = Resample::kBicubic;
  bool do_center_crop = false;
  int crop_height = 0;
  int crop_width = 0;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255;
  bool do_normalize = true;
  std::array<double, 3> image_mean = {0, 0, 0};
  std::array<double, 3> image_std = {1, 1, 1};
};

// Parses `preprocessor_config.json` with transformers' defaults for what it leaves out.
absl::StatusOr<PreprocessConfig> ParsePreprocessorConfig(absl::string_view json);

// Channel-first float32: data[(c * height + y) * width + x].
struct PixelValues {
  int height = 0;
  int width = 0;
  std::vector<float> data;
};

absl::StatusOr<PixelValues> Preprocess(const RgbImage& image, const PreprocessConfig& config);

// PIL's Image.resize(size, resample) on an RGB image; width, height >= 1.
RgbImage ResizePil(const RgbImage& image, int width, int height, Resample resample);

// transformers' center_crop on uint8 HWC, padding with zeros where the image is smaller.
RgbImage CenterCrop(const RgbImage& image, int crop_width, int crop_height);

}  // namespace ferry::media

#endif  // FERRY_MEDIA_IMAGE_PREPROCESS_H_
