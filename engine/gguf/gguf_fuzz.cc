// Fuzz target for the GGUF parser: any byte string is parsed to a GgufFile or refused with a
// Status; accessors on what parsed never crash.

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/gguf/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto file = ferry::GgufFile::FromBuffer(bytes);
  if (!file.ok()) return 0;
  for (const auto& [key, value] : (*file)->metadata()) {
    (void)(*file)->GetString(key);
    (void)(*file)->GetInt(key);
    (void)(*file)->GetStringArray(key);
    (void)(*file)->GetIntArray(key);
  }
  uint64_t sum = 0;
  for (const ferry::GgufTensorInfo& t : (*file)->tensors()) {
    for (uint64_t b = 0; b < t.size_bytes; b += 64) sum += t.data[b];  // in bounds by contract
  }
  return sum == 0xdeadbeef ? 1 : 0;
}
