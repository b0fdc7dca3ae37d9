#include "media/image/preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ferry::media {
namespace {

using Json = nlohmann::json;

constexpr int kPrecisionBits = 32 - 8 - 2;    // libImaging/Resample.c
constexpr int kMaxSide = 16384;               // a size in the config
constexpr int64_t kMaxResizedSide = 1 << 20;  // a resized side (a 1:300 image's long side)
constexpr int64_t kMaxResizedPixels = 64'000'000;

double BilinearFilter(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

double BicubicFilter(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// precompute_coeffs + normalize_coeffs_8bpc of Resample.c, for box (0, in_size).
struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // (xmin, count) per output
  std::vector<int32_t> kk;  // out_size * ksize
};

Coeffs PrecomputeCoeffs(int in_size, int out_size, Resample resample) {
  double (*filter)(double) = resample == Resample::kBicubic ? BicubicFilter : BilinearFilter;
  const double filter_support = resample == Resample::kBicubic ? 2.0 : 1.0;
  const double in0 = 0.0, in1 = in_size;
  double scale = (in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  double support = filter_support * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(2 * static_cast<size_t>(out_size));
  c.kk.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    for (int x = 0; x < xmax; ++x) {
      double w = filter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
    }
    for (int x = 0; x < xmax; ++x) {
      double v = k[x] * (1 << kPrecisionBits);
      c.kk[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(k[x] < 0 ? -0.5 + v : 0.5 + v);
    }
    c.bounds[2 * xx] = xmin;
    c.bounds[2 * xx + 1] = xmax;
  }
  return c;
}

uint8_t Clip8(int32_t v) {
  v >>= kPrecisionBits;  // arithmetic shift, as PIL's lookup table index
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

RgbImage ResampleHorizontal(const RgbImage& in, int out_w, const Coeffs& c) {
  RgbImage out;
  out.width = out_w;
  out.height = in.height;
  out.pixels.resize(static_cast<size_t>(out_w) * in.height * 3);
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* row = &in.pixels[static_cast<size_t>(y) * in.width * 3];
    uint8_t* o = &out.pixels[static_cast<size_t>(y) * out_w * 3];
    for (int xx = 0; xx < out_w; ++xx) {
      int xmin = c.bounds[2 * xx], n = c.bounds[2 * xx + 1];
      const int32_t* k = &c.kk[static_cast<size_t>(xx) * c.ksize];
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int x = 0; x < n; ++x) {
        const uint8_t* p = row + (x + xmin) * 3;
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
      }
      o[3 * xx] = Clip8(s0);
      o[3 * xx + 1] = Clip8(s1);
      o[3 * xx + 2] = Clip8(s2);
    }
  }
  return out;
}

RgbImage ResampleVertical(const RgbImage& in, int out_h, const Coeffs& c) {
  RgbImage out;
  out.width = in.width;
  out.height = out_h;
  out.pixels.resize(static_cast<size_t>(in.width) * out_h * 3);
  const size_t stride = static_cast<size_t>(in.width) * 3;
  for (int yy = 0; yy < out_h; ++yy) {
    int ymin = c.bounds[2 * yy], n = c.bounds[2 * yy + 1];
    const int32_t* k = &c.kk[static_cast<size_t>(yy) * c.ksize];
    uint8_t* o = &out.pixels[static_cast<size_t>(yy) * stride];
    for (size_t i = 0; i < stride; ++i) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < n; ++y) s += in.pixels[(y + ymin) * stride + i] * k[y];
      o[i] = Clip8(s);
    }
  }
  return out;
}

absl::Status Unsupported(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("preprocessor_config.json: ", what));
}

absl::StatusOr<bool> Bool(const Json& j, const char* key, bool def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) return Unsupported(absl::StrCat(key, " is not a boolean"));
  return j[key].get<bool>();
}

absl::StatusOr<int> Side(const Json& v, const std::string& what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxSide) {
    return Unsupported(absl::StrCat(what, " is not an integer in [1, ", kMaxSide, "]"));
  }
  return static_cast<int>(v.get<int64_t>());
}

absl::Status Triple(const Json& j, const char* key, std::array<double, 3>* out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  const Json& v = j[key];
  if (v.is_number()) {
    out->fill(v.get<double>());
    return absl::OkStatus();
  }
  if (!v.is_array() || v.size() != 3) return Unsupported(absl::StrCat(key, " is not 3 numbers"));
  for (int i = 0; i < 3; ++i) {
    if (!v[i].is_number()) return Unsupported(absl::StrCat(key, " is not 3 numbers"));
    (*out)[i] = v[i].get<double>();
  }
  return absl::OkStatus();
}

}  // namespace

RgbImage ResizePil(const RgbImage& image, int width, int height, Resample resample) {
  if (width == image.width && height == image.height) return image;  // PIL: a copy
  RgbImage cur = image;
  if (width != image.width) {
    cur = ResampleHorizontal(cur, width, PrecomputeCoeffs(image.width, width, resample));
  }
  if (height != image.height) {
    cur = ResampleVertical(cur, height, PrecomputeCoeffs(image.height, height, resample));
  }
  return cur;
}

RgbImage CenterCrop(const RgbImage& image, int crop_width, int crop_height) {
  // Python's floor division and ceil, as transformers writes them.
  auto floordiv2 = [](int v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
  int top = floordiv2(image.height - crop_height);
  int left = floordiv2(image.width - crop_width);
  int top_pad = image.height < crop_height ? (crop_height - image.height + 1) / 2 : 0;
  int left_pad = image.width < crop_width ? (crop_width - image.width + 1) / 2 : 0;
  int y0 = std::max(0, top + top_pad), x0 = std::max(0, left + left_pad);
  RgbImage out;
  out.width = crop_width;
  out.height = crop_height;
  out.pixels.assign(static_cast<size_t>(crop_width) * crop_height * 3, 0);
  for (int y = 0; y < crop_height; ++y) {
    int sy = y0 + y - top_pad;
    if (sy < 0 || sy >= image.height) continue;
    for (int x = 0; x < crop_width; ++x) {
      int sx = x0 + x - left_pad;
      if (sx < 0 || sx >= image.width) continue;
      std::copy_n(&image.pixels[(static_cast<size_t>(sy) * image.width + sx) * 3], 3,
                  &out.pixels[(static_cast<size_t>(y) * crop_width + x) * 3]);
    }
  }
  return out;
}

absl::StatusOr<PreprocessConfig> ParsePreprocessorConfig(absl::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Unsupported("not a JSON object");
  PreprocessConfig c;
  std::string type = j.value("image_processor_type", "");
  std::set<std::string> known = {"image_processor_type",
                                 "processor_class",
                                 "feature_extractor_type",
                                 "do_convert_rgb",
                                 "do_resize",
                                 "size",
                                 "resample",
                                 "do_rescale",
                                 "rescale_factor",
                                 "do_normalize",
                                 "image_mean",
                                 "image_std"};
  if (type == "CLIPImageProcessor" || type == "CLIPFeatureExtractor") {
    c.processor = PreprocessConfig::Processor::kClip;
    known.insert({"do_center_crop", "crop_size"});
    c.shortest_edge = 224;
    c.do_center_crop = true;
    c.crop_height = c.crop_width = 224;
    c.image_mean = {0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
    c.image_std = {0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD
  } else if (type == "SiglipImageProcessor") {
    c.processor = PreprocessConfig::Processor::kSiglip;
    c.resize_height = c.resize_width = 224;
    c.image_mean = {0.5, 0.5, 0.5};  // IMAGENET_STANDARD_MEAN
    c.image_std = {0.5, 0.5, 0.5};
  } else {
    return Unsupported(absl::StrCat("image_processor_type \"", type,
                                    "\" is not supported (CLIPImageProcessor, "
                                    "SiglipImageProcessor)"));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known.count(it.key())) {
      return Unsupported(absl::StrCat("option \"", it.key(), "\" is not supported for ", type));
    }
  }
  absl::StatusOr<bool> b = Bool(j, "do_convert_rgb", true);
  if (!b.ok()) return b.status();
  if (!(b = Bool(j, "do_resize", true)).ok()) return b.status();
  c.do_resize = *b;
  if (!(b = Bool(j, "do_rescale", true)).ok()) return b.status();
  c.do_rescale = *b;
  if (!(b = Bool(j, "do_normalize", true)).ok()) return b.status();
  c.do_normalize = *b;
  if (c.processor == PreprocessConfig::Processor::kClip) {
    if (!(b = Bool(j, "do_center_crop", true)).ok()) return b.status();
    c.do_center_crop = *b;
  }
  if (j.contains("size") && !j["size"].is_null()) {
    const Json& s = j["size"];
    if (s.is_number_integer() && c.processor == PreprocessConfig::Processor::kClip) {
      absl::StatusOr<int> v = Side(s, "size");  // get_size_dict(default_to_square=False)
      if (!v.ok()) return v.status();
      c.shortest_edge = *v;
    } else if (s.is_object() && s.size() == 1 && s.contains("shortest_edge") &&
               c.processor == PreprocessConfig::Processor::kClip) {
      absl::StatusOr<int> v = Side(s["shortest_edge"], "size.shortest_edge");
      if (!v.ok()) return v.status();
      c.shortest_edge = *v;
    } else if (s.is_object() && s.size() == 2 && s.contains("height") && s.contains("width")) {
      absl::StatusOr<int> h = Side(s["height"], "size.height"), w = Side(s["width"], "size.width");
      if (!h.ok()) return h.status();
      if (!w.ok()) return w.status();
      c.shortest_edge = 0;
      c.resize_height = *h;
      c.resize_width = *w;
    } else {
      return Unsupported(absl::StrCat("size ", s.dump(), " is not supported for ", type));
    }
  }
  if (j.contains("resample") && !j["resample"].is_null()) {
    const Json& r = j["resample"];
    if (r.is_number_integer() && r.get<int64_t>() == 2) {
      c.resample = Resample::kBilinear;
    } else if (r.is_number_integer() && r.get<int64_t>() == 3) {
      c.resample = Resample::kBicubic;
    } else {
      return Unsupported(
          absl::StrCat("resample ", r.dump(), " is not supported (2 bilinear, 3 bicubic)"));
    }
  }
  if (j.contains("crop_size") && !j["crop_size"].is_null()) {
    const Json& s = j["crop_size"];
    if (s.is_number_integer()) {  // get_size_dict(default_to_square=True)
      absl::StatusOr<int> v = Side(s, "crop_size");
      if (!v.ok()) return v.status();
      c.crop_height = c.crop_width = *v;
    } else if (s.is_object() && s.size() == 2 && s.contains("height") && s.contains("width")) {
      absl::StatusOr<int> h = Side(s["height"], "crop_size.height");
      absl::StatusOr<int> w = Side(s["width"], "crop_size.width");
      if (!h.ok()) return h.status();
      if (!w.ok()) return w.status();
      c.crop_height = *h;
      c.crop_width = *w;
    } else {
      return Unsupported(absl::StrCat("crop_size ", s.dump(), " is not supported"));
    }
  }
  if (j.contains("rescale_factor") && !j["rescale_factor"].is_null()) {
    if (!j["rescale_factor"].is_number()) return Unsupported("rescale_factor is not a number");
    c.rescale_factor = j["rescale_factor"].get<double>();
  }
  if (absl::Status s = Triple(j, "image_mean", &c.image_mean); !s.ok()) return s;
  if (absl::Status s = Triple(j, "image_std", &c.image_std); !s.ok()) return s;
  for (double v : c.image_std) {
    if (!(v != 0.0) || !std::isfinite(v))
      return Unsupported("image_std has a zero or non-finite value");
  }
  return c;
}

absl::StatusOr<PixelValues> Preprocess(const RgbImage& image, const PreprocessConfig& config) {
  if (image.width < 1 || image.height < 1 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return absl::InvalidArgumentError("preprocess: not a well-formed RGB image");
  }
  RgbImage cur = image;
  if (config.do_resize) {
    int h, w;
    if (config.shortest_edge > 0) {
      // get_resize_output_image_size(default_to_square=False): int(s * long / short).
      int64_t shorter = std::min(image.width, image.height);
      int64_t longer = std::max(image.width, image.height);
      int64_t s = config.shortest_edge;
      int64_t l =
          static_cast<int64_t>(static_cast<double>(s * longer) / static_cast<double>(shorter));
      if (l < 1 || l > kMaxResizedSide || l * s > kMaxResizedPixels) {
        return absl::InvalidArgumentError(absl::StrCat(
            "preprocess: a ", image.width, "x", image.height, " image resizes to ", s, "x", l,
            ", over the limit of ", kMaxResizedPixels, " pixels (aspect ratio too extreme)"));
      }
      if (image.width <= image.height) {
        w = static_cast<int>(s);
        h = static_cast<int>(l);
      } else {
        h = static_cast<int>(s);
        w = static_cast<int>(l);
      }
    } else {
      h = config.resize_height;
      w = config.resize_width;
    }
    cur = ResizePil(cur, w, h, config.resample);
  }
  if (config.do_center_crop) cur = CenterCrop(cur, config.crop_width, config.crop_height);
  PixelValues out;
  out.height = cur.height;
  out.width = cur.width;
  const size_t plane = static_cast<size_t>(cur.width) * cur.height;
  out.data.resize(3 * plane);
  float mean[3], stdv[3];
  for (int c = 0; c < 3; ++c) {
    mean[c] = static_cast<float>(config.image_mean[c]);  // np.array(mean, dtype=float32)
    stdv[c] = static_cast<float>(config.image_std[c]);
  }
  for (size_t i = 0; i < plane; ++i) {
    for (int c = 0; c < 3; ++c) {
      uint8_t v = cur.pixels[3 * i + c];
      float x = config.do_rescale
                    ? static_cast<float>(static_cast<double>(v) * config.rescale_factor)
                    : static_cast<float>(v);
      if (config.do_normalize) x = (x - mean[c]) / stdv[c];
      out.data[c * plane + i] = x;
    }
  }
  return out;
}

}  // namespace ferry::media
