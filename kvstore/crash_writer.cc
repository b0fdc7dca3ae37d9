// The crash test's child: `crash_writer DIR RUN THREADS` opens the store in DIR and writes
// objects of run RUN (crash_objects.h) from THREADS threads until it is killed, printing
// "ready" once open and then "<i>" for each object whose Put was acknowledged, in acknowledgement
// order per thread. Thread t writes i = t, t + THREADS, t + 2 THREADS, ...

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "kvstore/crash_objects.h"
#include "kvstore/kv_store.h"

int main(int argc, char** argv) {
  using namespace ferry::kv;
  if (argc != 4) {
    std::fprintf(stderr, "usage: crash_writer DIR RUN THREADS\n");
    return 2;
  }
  const uint64_t run = std::strtoull(argv[2], nullptr, 10);
  const int threads = std::atoi(argv[3]);
  StoreOptions options;
  options.segment_bytes = 1 << 20;  // many seals and footers
  options.capacity_bytes = int64_t{1} << 40;
  options.max_object_bytes = 512 << 10;
  auto store = KvStore::Open(argv[1], options);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  absl::Mutex out;
  std::printf("ready\n");
  std::fflush(stdout);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (uint64_t i = t;; i += threads) {
        const std::string value = crash::ObjectValue(run, i);
        const PutItem item{crash::ObjectKey(run, i), crash::ObjectMetaFor(run), value};
        if (!(*store)->Put({item}).ok()) std::abort();
        absl::MutexLock lock(&out);
        std::printf("%llu\n", static_cast<unsigned long long>(i));
        std::fflush(stdout);
      }
    });
  }
  for (auto& w : workers) w.join();
  return 0;
}
