#include "tools/calibrate/store_probe.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/common/hash128.h"
#include "engine/common/status.h"
#include "kvstore/kv_store.h"

namespace ferry {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Removes the probe's directory however MeasureStore returns.
struct DirectoryGuard {
  std::string path;
  ~DirectoryGuard() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

absl::StatusOr<StoreTiming> Measure(const StoreProbeOptions& options, const std::string& dir) {
  StoreTiming out;
  out.dir = dir;
  ASSIGN_OR_RETURN(std::unique_ptr<kv::KvStore> store, kv::KvStore::Open(dir, {}));
  out.direct_io = store->Counters().direct_io;
  const int largest = *std::max_element(options.block_counts.begin(), options.block_counts.end());
  const int objects = 2 * largest;
  const Hash128 fingerprint{0xca11b7a7e, 0x5707e};
  std::mt19937_64 rng(11);
  std::string value(options.block_bytes, '\0');
  for (char& c : value) c = static_cast<char>(rng());
  std::vector<Hash128> keys;
  for (int i = 0; i < objects; ++i) {
    keys.push_back({rng(), rng()});
    // Each value differs in its first bytes (no store deduplicates, but be honest).
    std::memcpy(value.data(), &keys.back(), sizeof(Hash128));
    kv::PutItem item;
    item.key = keys.back();
    item.meta.fingerprint = fingerprint;
    item.meta.token_count = 64;
    item.value = value;
    RETURN_IF_ERROR(store->Put({item}));
  }
  // `keys` read over `streams` threads at once, each one Get call of its share.
  auto read = [&](const std::vector<Hash128>& wanted) -> absl::StatusOr<double> {
    const int streams = std::min<int>(options.streams, static_cast<int>(wanted.size()));
    std::vector<int> missing(streams, 0);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int s = 0; s < streams; ++s) {
      threads.emplace_back([&, s] {
        std::vector<Hash128> mine;
        for (size_t i = s; i < wanted.size(); i += streams) mine.push_back(wanted[i]);
        for (const kv::GetResult& r : store->Get(mine, fingerprint)) missing[s] += r.found ? 0 : 1;
      });
    }
    for (std::thread& t : threads) t.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (std::accumulate(missing.begin(), missing.end(), 0) > 0) {
      return absl::InternalError("the store missed objects it had just stored");
    }
    return seconds;
  };
  std::vector<Hash128> shuffled = keys;
  for (int count : options.block_counts) {
    std::vector<double> seconds;
    for (int r = 0; r < options.repeats; ++r) {
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      ASSIGN_OR_RETURN(const double s,
                       read(std::vector<Hash128>(shuffled.begin(), shuffled.begin() + count)));
      seconds.push_back(s);
    }
    out.samples.push_back({static_cast<double>(count * options.block_bytes), Median(seconds)});
  }
  ASSIGN_OR_RETURN(out.fit, FitLatencyAndBandwidth(out.samples));
  return out;
}

}  // namespace

absl::StatusOr<StoreTiming> MeasureStore(const StoreProbeOptions& options) {
  if (options.block_bytes == 0 || options.parent_dir.empty()) {
    return absl::InvalidArgumentError("store probe: a directory and a block size are required");
  }
  std::string pattern = options.parent_dir + "/ferry-calibrate-store-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("store probe: cannot make a directory under ", options.parent_dir));
  }
  DirectoryGuard guard{pattern};
  return Measure(options, pattern);
}

}  // namespace ferry
