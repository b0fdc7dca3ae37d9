// Fuzz target for the bounded JSON parser (bounded_json.h), differential: any text parses to the
// document ordered_json::parse makes of it (same dump: key order, duplicates' last values, number
// types), or both refuse it; the bounded parser refuses besides only what nests deeper than its
// limit. Small limits from the first byte make the other refusals reachable: they must say where.

#include <cstddef>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "router/api/bounded_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  ferry::JsonLimits limits;
  limits.max_depth = 16;
  const bool small = (mode & 1) != 0;
  if (small) {
    limits.max_values = mode >> 1;
    limits.max_string_bytes = mode >> 3;
  }
  nlohmann::ordered_json got;
  ferry::JsonParseError error;
  const bool ok = ferry::ParseBoundedJson(text, limits, &got, &error).ok();
  if (!ok && error.message.empty()) __builtin_trap();  // a refusal always says why
  if (small && !ok && error.kind != ferry::JsonParseError::Kind::kSyntax) return 0;
  if (!ok && error.kind == ferry::JsonParseError::Kind::kDepth) return 0;
  const nlohmann::ordered_json want = nlohmann::ordered_json::parse(text, nullptr, false);
  if (ok != !want.is_discarded()) __builtin_trap();
  if (ok && got.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) !=
                want.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)) {
    __builtin_trap();
  }
  return 0;
}
