// gguf_dump FILE: prints a GGUF file's metadata and tensor table as one JSON object, for people
// and for the conformance test against the `gguf` Python package. Arrays are summarised by their
// element type, length, first elements and an XXH3-64 digest of their contents (each string as
// u64 length + bytes; integers as int64 little-endian; floats as float64).

#include <cstdio>
#include <string>

#include "engine/gguf/gguf_file.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

namespace {

using Json = nlohmann::json;

Json Scalar(const ferry::GgufValue& v) {
  switch (v.type) {
    case ferry::GgufType::kString:
      return std::string(v.s);
    case ferry::GgufType::kBool:
      return v.u != 0;
    case ferry::GgufType::kFloat32:
    case ferry::GgufType::kFloat64:
      return v.f;
    case ferry::GgufType::kUint64:
      return v.u;
    default:
      return v.i;
  }
}

Json Describe(const ferry::GgufValue& v) {
  if (v.type != ferry::GgufType::kArray) return Scalar(v);
  std::string bytes;
  Json first = Json::array();
  for (size_t n = 0; n < v.elements.size(); ++n) {
    const ferry::GgufValue& e = v.elements[n];
    if (n < 3) first.push_back(Describe(e));
    if (e.type == ferry::GgufType::kString) {
      const uint64_t length = e.s.size();
      bytes.append(reinterpret_cast<const char*>(&length), 8);
      bytes.append(e.s.data(), e.s.size());
    } else if (e.type == ferry::GgufType::kFloat32 || e.type == ferry::GgufType::kFloat64) {
      bytes.append(reinterpret_cast<const char*>(&e.f), 8);
    } else if (e.type == ferry::GgufType::kBool) {
      const int64_t b = static_cast<int64_t>(e.u);
      bytes.append(reinterpret_cast<const char*>(&b), 8);
    } else {
      bytes.append(reinterpret_cast<const char*>(&e.i), 8);
    }
  }
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return Json{{"element_type", std::string(ferry::GgufTypeName(v.element_type))},
              {"count", v.elements.size()},
              {"first", first},
              {"xxh3_64", digest}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_dump FILE.gguf\n");
    return 2;
  }
  auto file = ferry::GgufFile::Open(argv[1]);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  Json out;
  out["version"] = (*file)->version();
  Json metadata = Json::object();
  for (const auto& [key, value] : (*file)->metadata()) metadata[key] = Describe(value);
  out["metadata"] = metadata;
  Json tensors = Json::array();
  for (const ferry::GgufTensorInfo& t : (*file)->tensors()) {
    tensors.push_back({{"name", t.name},
                       {"dims", t.dims},
                       {"type", t.ggml_type},
                       {"offset", t.offset},
                       {"size_bytes", t.size_bytes}});
  }
  out["tensors"] = tensors;
  std::printf("%s\n", out.dump(1, ' ', false, Json::error_handler_t::replace).c_str());
  return 0;
}
