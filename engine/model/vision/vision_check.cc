// vision_check: the vision tower and projector against reference outputs (testonly).
//
//   vision_check compare MODEL_DIR CASES_DIR [--tolerance T] [--precision f32|bf16]
//
// CASES_DIR/cases.json (tools/python/vision_reference.py) lists images: "pixels" (CHW float32,
// little-endian), "hidden" (transformers' hidden_states[vision_feature_layer], CLS first) and
// "projected" (get_image_features: the placeholder rows). For each image and each of the two it
// prints max |ferry - ref| / max |ref| and fails above T (default 1e-4); it also encodes each
// image twice and fails unless the two are bit-identical. --precision picks the tower's
// VisionPrecision (default f32).

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/vision/vision_tower.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

std::vector<float> ReadF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string s = bytes.str();
  std::vector<float> v(s.size() / sizeof(float));
  std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
  return v;
}

// max |a - b| / max |b|, or infinity if the sizes differ.
double RelDiff(const std::vector<float>& a, const std::vector<float>& b, double* max_abs) {
  if (a.size() != b.size() || b.empty()) return INFINITY;
  double diff = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(b[i])));
  }
  *max_abs = diff;
  return mag > 0 ? diff / mag : diff;
}

int Compare(const std::string& model, const std::string& cases_dir, double tolerance,
            VisionPrecision precision) {
  auto tower = VisionTower::Load(model, precision);
  if (!tower.ok()) {
    std::fprintf(stderr, "load: %s\n", tower.status().ToString().c_str());
    return 1;
  }
  std::ifstream in(cases_dir + "/cases.json");
  const nlohmann::json cases = nlohmann::json::parse(in);
  const int64_t layer = tower->config().selected_layer();
  std::printf("tower: %lld px, %lld image tokens, hidden_states[%lld], digest %s\n",
              static_cast<long long>(tower->image_size()),
              static_cast<long long>(tower->num_image_tokens()), static_cast<long long>(layer),
              tower->digest().ToHex().c_str());
  double worst = 0;
  int failures = 0;
  for (const auto& c : cases.at("cases")) {
    const std::vector<float> pixels = ReadF32(cases_dir + "/" + c.at("pixels").get<std::string>());
    auto hidden = tower->HiddenState(pixels, layer);
    auto projected = tower->Encode(pixels);
    auto again = tower->Encode(pixels);
    if (!hidden.ok() || !projected.ok() || !again.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.at("name").get<std::string>().c_str(),
                   (!hidden.ok() ? hidden.status() : projected.status()).ToString().c_str());
      return 1;
    }
    if (*projected != *again) {
      std::fprintf(stderr, "%s: two encodings differ\n", c.at("name").get<std::string>().c_str());
      ++failures;
    }
    double abs_h = 0, abs_p = 0;
    const double rh =
        RelDiff(*hidden, ReadF32(cases_dir + "/" + c.at("hidden").get<std::string>()), &abs_h);
    const double rp = RelDiff(
        *projected, ReadF32(cases_dir + "/" + c.at("projected").get<std::string>()), &abs_p);
    std::printf("%-10s hidden: max abs %.3g, rel %.3g; projected: max abs %.3g, rel %.3g\n",
                c.at("name").get<std::string>().c_str(), abs_h, rh, abs_p, rp);
    worst = std::max({worst, rh, rp});
    if (!(rh <= tolerance) || !(rp <= tolerance)) ++failures;
  }
  std::printf("worst relative difference %.3g (tolerance %.3g)%s\n", worst, tolerance,
              failures ? ": FAILED" : "");
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  if (argc < 4 || std::string(argv[1]) != "compare") {
    std::fprintf(stderr,
                 "usage: vision_check compare MODEL_DIR CASES_DIR [--tolerance T] "
                 "[--precision f32|bf16]\n");
    return 2;
  }
  double tolerance = 1e-4;
  ferry::VisionPrecision precision = ferry::VisionPrecision::kF32;
  for (int i = 4; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--tolerance") {
      tolerance = std::stod(value);
    } else if (flag == "--precision" && (value == "f32" || value == "bf16")) {
      precision = value == "bf16" ? ferry::VisionPrecision::kBf16 : ferry::VisionPrecision::kF32;
    } else {
      std::fprintf(stderr, "vision_check: bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  return ferry::Compare(argv[2], argv[3], tolerance, precision);
}
