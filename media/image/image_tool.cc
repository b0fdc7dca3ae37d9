// image_tool: media/image from the command line, for the reference checks against PIL and
// transformers (media/image/preprocess_reference.py).
//   image_tool probe FILE                 one JSON line: format, width, height, channels,
//   orientation image_tool decode FILE OUT            int32 width, int32 height, then RGB bytes
//   image_tool orient FILE OUT            the same after ApplyOrientation(EXIF orientation)
//   image_tool preprocess FILE CONFIG OUT int32 height, int32 width, then float32 (3, H, W)
// Errors: the status on stderr, exit 1.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "media/image/image.h"
#include "media/image/preprocess.h"

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  *out = s.str();
  return true;
}

int Fail(const std::string& msg) {
  std::cerr << msg << "\n";
  return 1;
}

bool WriteRgb(const std::string& path, const ferry::media::RgbImage& img) {
  std::ofstream f(path, std::ios::binary);
  int32_t dims[2] = {img.width, img.height};
  f.write(reinterpret_cast<const char*>(dims), sizeof(dims));
  f.write(reinterpret_cast<const char*>(img.pixels.data()), img.pixels.size());
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::media;
  if (argc < 3) return Fail("usage: image_tool probe|decode|orient|preprocess FILE [CONFIG] [OUT]");
  std::string cmd = argv[1], bytes;
  if (!ReadFile(argv[2], &bytes)) return Fail(std::string("cannot read ") + argv[2]);
  if (cmd == "probe") {
    absl::StatusOr<ImageInfo> info = ProbeImage(bytes);
    if (!info.ok()) return Fail(info.status().ToString());
    std::printf(
        "{\"format\": \"%s\", \"width\": %d, \"height\": %d, \"channels\": %d, "
        "\"orientation\": %d}\n",
        ImageFormatName(info->format), info->width, info->height, info->channels,
        info->orientation);
    return 0;
  }
  absl::StatusOr<RgbImage> image = DecodeImage(bytes);
  if (!image.ok()) return Fail(image.status().ToString());
  if ((cmd == "decode" || cmd == "orient") && argc == 4) {
    RgbImage out = *image;
    if (cmd == "orient") out = ApplyOrientation(out, ProbeImage(bytes)->orientation);
    return WriteRgb(argv[3], out) ? 0 : Fail("cannot write the output");
  }
  if (cmd == "preprocess" && argc == 5) {
    std::string text;
    if (!ReadFile(argv[3], &text)) return Fail(std::string("cannot read ") + argv[3]);
    absl::StatusOr<PreprocessConfig> config = ParsePreprocessorConfig(text);
    if (!config.ok()) return Fail(config.status().ToString());
    absl::StatusOr<PixelValues> px = Preprocess(*image, *config);
    if (!px.ok()) return Fail(px.status().ToString());
    std::ofstream f(argv[4], std::ios::binary);
    int32_t dims[2] = {px->height, px->width};
    f.write(reinterpret_cast<const char*>(dims), sizeof(dims));
    f.write(reinterpret_cast<const char*>(px->data.data()), px->data.size() * sizeof(float));
    return f ? 0 : Fail("cannot write the output");
  }
  return Fail("usage: image_tool probe|decode|orient|preprocess FILE [CONFIG] [OUT]");
}
