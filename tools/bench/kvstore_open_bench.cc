// How long the KV store takes to open, per million objects: `kvstore_open_bench DIR [OBJECTS]
// [VALUE_BYTES]` writes OBJECTS objects as sealed segments of the store's format (format.h) with
// their footers, the record areas left as holes of a sparse file (opening reads footers only,
// never records), opens the store three times and prints the times as JSON:
//   {"objects": N, "segments": S, "open_seconds": [..], "open_seconds_per_million": best}
// Footers are read with direct I/O, so the page cache does not flatter the reopenings much.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kvstore/format.h"
#include "kvstore/kv_store.h"

namespace {

using namespace ferry::kv;

void Die(const std::string& what) {
  std::fprintf(stderr, "kvstore_open_bench: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("usage: kvstore_open_bench DIR [OBJECTS] [VALUE_BYTES]");
  const std::string dir = argv[1];
  const int64_t objects = argc > 2 ? std::atoll(argv[2]) : 1'000'000;
  const int64_t value_bytes = argc > 3 ? std::atoll(argv[3]) : (1 << 20) - 128;
  StoreOptions options;  // 256 MiB segments
  RecordHeader proto;
  proto.value_bytes = static_cast<uint64_t>(value_bytes);
  const uint64_t record = proto.record_bytes();
  const int64_t per_segment = std::max<int64_t>(
      1, (options.segment_bytes - static_cast<int64_t>(kSegmentHeaderBytes)) / record);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const int64_t created_us = static_cast<int64_t>(std::time(nullptr)) * 1'000'000;
  int64_t segments = 0;
  for (int64_t first = 0; first < objects; first += per_segment, ++segments) {
    const uint32_t id = static_cast<uint32_t>(segments);
    const int64_t n = std::min(per_segment, objects - first);
    std::vector<FooterEntry> entries(n);
    for (int64_t i = 0; i < n; ++i) {
      FooterEntry& e = entries[i];
      e.header = proto;
      e.header.key = ferry::Xxh3Hash128(std::to_string(first + i));
      e.header.meta.fingerprint = ferry::Xxh3Hash128("model");
      e.header.meta.token_count = 64;
      e.header.seq = static_cast<uint64_t>(first + i + 1);
      e.header.created_us = created_us;
      e.offset = kSegmentHeaderBytes + static_cast<uint64_t>(i) * record;
    }
    const uint64_t footer_at = kSegmentHeaderBytes + static_cast<uint64_t>(n) * record;
    const std::string header = EncodeSegmentHeader({id, created_us});
    const std::string footer = EncodeFooter(id, footer_at, entries);
    const std::string path = dir + "/" + SegmentFileName(id);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::pwrite(fd, header.data(), header.size(), 0) != (ssize_t)header.size() ||
        ::pwrite(fd, footer.data(), footer.size(), footer_at) != (ssize_t)footer.size()) {
      Die("cannot write " + path);
    }
    ::close(fd);
  }
  ::sync();
  std::vector<double> seconds;
  for (int i = 0; i < 3; ++i) {
    auto store = KvStore::Open(dir, options);
    if (!store.ok()) Die(std::string(store.status().message()));
    const StoreStats s = (*store)->Stats();
    if (s.open_objects != objects) Die("the store found " + std::to_string(s.open_objects));
    seconds.push_back(s.open_seconds);
  }
  std::filesystem::remove_all(dir);
  const double best = *std::min_element(seconds.begin(), seconds.end());
  std::printf(
      "{\"objects\": %lld, \"segments\": %lld, \"open_seconds\": [%.3f, %.3f, %.3f], "
      "\"open_seconds_per_million\": %.3f}\n",
      static_cast<long long>(objects), static_cast<long long>(segments), seconds[0], seconds[1],
      seconds[2], best * 1e6 / static_cast<double>(objects));
  return 0;
}
