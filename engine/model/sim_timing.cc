#include "engine/model/sim_timing.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

// The numeric fields, in the file's order (SimCalibrationJson writes them so).
struct NumberField {
  const char* key;
  double SimCalibration::*member;
};

constexpr NumberField kNumbers[] = {
    {"kv_bytes_per_token", &SimCalibration::kv_bytes_per_token},
    {"step_overhead_s", &SimCalibration::step_overhead_s},
    {"prefill_token_s", &SimCalibration::prefill_token_s},
    {"prefill_attention_s", &SimCalibration::prefill_attention_s},
    {"decode_step_s", &SimCalibration::decode_step_s},
    {"decode_row_s", &SimCalibration::decode_row_s},
    {"decode_kv_token_s", &SimCalibration::decode_kv_token_s},
    {"link_bandwidth_bytes_per_s", &SimCalibration::link_bandwidth_bytes_per_s},
    {"link_latency_s", &SimCalibration::link_latency_s},
    {"store_read_bytes_per_s", &SimCalibration::store_read_bytes_per_s},
    {"store_latency_s", &SimCalibration::store_latency_s},
};

absl::Status Bad(const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("sim calibration: \"", key, "\" ", why));
}

// `bytes` moved at `bytes_per_s` (0: free).
double MoveSeconds(double bytes, double bytes_per_s) {
  return bytes_per_s > 0 ? bytes / bytes_per_s : 0;
}

}  // namespace

absl::StatusOr<SimCalibration> ParseSimCalibration(const std::string& json_text) {
  const Json doc = Json::parse(json_text, nullptr, /*allow_exceptions=*/false,
                               /*ignore_comments=*/true);
  if (doc.is_discarded()) return absl::InvalidArgumentError("sim calibration: not valid JSON");
  if (!doc.is_object()) return absl::InvalidArgumentError("sim calibration: not a JSON object");
  SimCalibration c;
  bool has_kv_bytes = false;
  for (const auto& [key, value] : doc.items()) {
    if (key == "name" || key == "source") {
      if (!value.is_string()) return Bad(key, "must be a string");
      (key == "name" ? c.name : c.source) = value.get<std::string>();
      continue;
    }
    if (key == "gpus_per_worker") {
      if (!value.is_number_integer()) return Bad(key, "must be an integer");
      const int64_t gpus = value.get<int64_t>();
      if (gpus < 1 || gpus > 1 << 20) return Bad(key, "must be at least 1");
      c.gpus_per_worker = static_cast<int>(gpus);
      continue;
    }
    const NumberField* field = nullptr;
    for (const NumberField& f : kNumbers) {
      if (key == f.key) field = &f;
    }
    if (field == nullptr) return Bad(key, "is not a calibration field");
    if (!value.is_number()) return Bad(key, "must be a number");
    const double v = value.get<double>();
    if (!std::isfinite(v) || v < 0) return Bad(key, "must be a finite number >= 0");
    c.*(field->member) = v;
    if (field->member == &SimCalibration::kv_bytes_per_token) has_kv_bytes = true;
  }
  if (!has_kv_bytes || !(c.kv_bytes_per_token > 0)) {
    return Bad("kv_bytes_per_token", "is required and must be positive");
  }
  return c;
}

absl::StatusOr<SimCalibration> LoadSimCalibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("sim calibration ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<SimCalibration> parsed = ParseSimCalibration(text.str());
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

std::string SimCalibrationJson(const SimCalibration& c) {
  Json doc;
  doc["name"] = c.name;
  doc["source"] = c.source;
  doc["gpus_per_worker"] = c.gpus_per_worker;
  // nlohmann writes the shortest text that reads back as the same double.
  for (const NumberField& f : kNumbers) doc[f.key] = c.*(f.member);
  return doc.dump(2) + "\n";
}

SimTiming::SimTiming(SimCalibration calibration, double speed)
    : calibration_(std::move(calibration)), speed_(speed) {
  CHECK(speed_ > 0 && std::isfinite(speed_)) << "sim speed must be positive, not " << speed_;
}

double SimTiming::StepSeconds(absl::Span<const SimRow> rows) const {
  const SimCalibration& c = calibration_;
  double seconds = c.step_overhead_s;
  int64_t decode_rows = 0;
  double decode_kv_tokens = 0;
  for (const SimRow& row : rows) {
    if (row.tokens <= 0) continue;
    const double n = static_cast<double>(row.tokens), start = static_cast<double>(row.start);
    if (row.tokens == 1) {
      ++decode_rows;
      decode_kv_tokens += start + 1;  // the earlier positions and its own
      continue;
    }
    const double pairs = n * start + n * (n + 1) / 2;
    seconds += c.prefill_token_s * n + c.prefill_attention_s * pairs;
  }
  if (decode_rows > 0) {
    seconds += c.decode_step_s + c.decode_row_s * static_cast<double>(decode_rows) +
               c.decode_kv_token_s * decode_kv_tokens;
  }
  return seconds / speed_;
}

double SimTiming::TransferSeconds(int64_t tokens, int sharing) const {
  if (tokens <= 0) return 0;
  const double share = static_cast<double>(sharing < 1 ? 1 : sharing);
  return calibration_.link_latency_s +
         MoveSeconds(KvBytes(tokens) * share, calibration_.link_bandwidth_bytes_per_s);
}

double SimTiming::StoreReadSeconds(int64_t tokens) const {
  if (tokens <= 0) return 0;
  return calibration_.store_latency_s +
         MoveSeconds(KvBytes(tokens), calibration_.store_read_bytes_per_s);
}

double SimTiming::KvBytes(int64_t tokens) const {
  return static_cast<double>(tokens) * calibration_.kv_bytes_per_token;
}

int64_t SimTiming::KvTokens(int64_t pool_bytes) const {
  if (pool_bytes <= 0 || !(calibration_.kv_bytes_per_token > 0)) return 0;
  return static_cast<int64_t>(
      std::floor(static_cast<double>(pool_bytes) / calibration_.kv_bytes_per_token));
}

}  // namespace ferry
