// dequantize_check GGUF REFERENCE.json: dequantizes every tensor of a GGUF file to fp32 and to
// bf16 and compares XXH3-64 digests of the results with those computed by the `gguf` package's
// NumPy dequantizer (tools/python/dequantize_reference.py). Exits non-zero on any difference.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/dequantize.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: dequantize_check GGUF REFERENCE.json\n";
    return 2;
  }
  auto gguf = ferry::GgufFile::Open(argv[1]);
  if (!gguf.ok()) {
    std::cerr << gguf.status() << "\n";
    return 1;
  }
  std::ifstream in(argv[2]);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json reference = nlohmann::json::parse(text.str());
  size_t checked = 0, bytes = 0;
  double seconds = 0;
  for (const ferry::GgufTensorInfo& t : (*gguf)->tensors()) {
    size_t elements = 1;
    for (uint64_t d : t.dims) elements *= d;
    std::vector<float> f32(elements);
    std::vector<uint16_t> bf16(elements);
    const auto start = std::chrono::steady_clock::now();
    auto s1 = ferry::DequantizeToF32(t.ggml_type, t.data, t.size_bytes, elements, f32.data());
    auto s2 = ferry::DequantizeToBf16(t.ggml_type, t.data, t.size_bytes, elements, bf16.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!s1.ok() || !s2.ok()) {
      std::cerr << t.name << ": " << (s1.ok() ? s2 : s1) << "\n";
      return 1;
    }
    const std::string f32_digest =
        absl::StrFormat("%016x", XXH3_64bits(f32.data(), f32.size() * 4));
    const std::string bf16_digest =
        absl::StrFormat("%016x", XXH3_64bits(bf16.data(), bf16.size() * 2));
    if (!reference.contains(t.name)) {
      std::cerr << t.name << ": not in the reference\n";
      return 1;
    }
    const auto& want = reference[t.name];
    if (want["f32"] != f32_digest || want["bf16"] != bf16_digest) {
      std::cerr << t.name << " (" << ferry::GgmlTypeName(t.ggml_type) << "): f32 " << f32_digest
                << " vs " << want["f32"] << ", bf16 " << bf16_digest << " vs " << want["bf16"]
                << "\n";
      return 1;
    }
    ++checked;
    bytes += elements * 4;
  }
  std::printf(
      "%zu tensors bit-identical to the gguf package (fp32 and bf16); %.2f GB of fp32 in "
      "%.2f s on the shared pool\n",
      checked, bytes / 1e9, seconds);
  return checked > 0 ? 0 : 1;
}
