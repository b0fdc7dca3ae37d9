// Crash safety of the KV store, two ways (kvstore/crash_objects.h says what each object holds):
//
// 1. A child process (crash_writer) writes continuously from 4 threads and is SIGKILLed at a
//    random point, 20 times over the same directory. After each kill the store is opened here:
//    every object whose Put the child saw acknowledged reads back intact, and every object the
//    child may have been writing reads back intact or not at all; Verify finds nothing corrupt,
//    and opening skipped nothing but a torn tail.
// 2. kill -9 leaves the page cache, so the same runs in-process over FaultFileSystem, which
//    drops every byte not yet fsynced at the "crash" (as a power cut would): the same checks.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/crash_objects.h"
#include "kvstore/fault_file_system.h"
#include "kvstore/kv_store.h"

namespace ferry {
namespace kv {
namespace {

namespace fs = std::filesystem;

const char* g_writer = nullptr;  // argv[1]

StoreOptions Options() {
  StoreOptions o;
  o.segment_bytes = 1 << 20;
  o.capacity_bytes = int64_t{1} << 40;
  o.max_object_bytes = 512 << 10;
  return o;
}

// Acknowledged objects per run, and how far each run may have gone.
struct Ledger {
  std::map<uint64_t, std::set<uint64_t>> acked;
  std::map<uint64_t, uint64_t> attempted_below;
};

// Opens the store and checks the ledger: every acknowledged object of every run is present
// (Exists), every present object passes its checksum (Verify), and the latest run's objects,
// acknowledged or only attempted, read back with exactly their bytes (Get) or not at all.
void Check(const std::string& dir, const Ledger& ledger, uint64_t latest, const std::string& when) {
  auto store = KvStore::Open(dir, Options());
  ASSERT_TRUE(store.ok()) << when << ": " << store.status();
  const StoreStats stats = (*store)->Stats();
  int64_t present = 0;
  for (const auto& [run, below] : ledger.attempted_below) {
    const auto& acked = ledger.acked.at(run);
    const Hash128 fingerprint = crash::ObjectMetaFor(run).fingerprint;
    std::vector<Hash128> keys;
    for (uint64_t i = 0; i < below; ++i) keys.push_back(crash::ObjectKey(run, i));
    const ExistsResult exists = (*store)->Exists(keys, fingerprint);
    for (uint64_t i = 0; i < below; ++i) {
      present += exists.present[i];
      if (acked.count(i)) {
        ASSERT_TRUE(exists.present[i])
            << when << ": acknowledged object " << run << "/" << i << " lost";
      }
      if (run != latest || !exists.present[i]) continue;
      auto got = (*store)->Get({keys[i]}, fingerprint);
      ASSERT_TRUE(got[0].found) << when << ": object " << run << "/" << i << " not served";
      ASSERT_EQ(got[0].value, crash::ObjectValue(run, i))
          << when << ": object " << run << "/" << i << " served with other bytes";
      ASSERT_EQ(got[0].meta.layout_tag, run);
    }
  }
  EXPECT_EQ(present, stats.open_objects) << when << ": objects nobody wrote";
  // A crash leaves at most a torn tail: never a record skipped for its checksum or header.
  const auto& dropped = stats.recovery_dropped;
  EXPECT_EQ(dropped[static_cast<int>(RecoveryDrop::kChecksum)], 0) << when;
  EXPECT_EQ(dropped[static_cast<int>(RecoveryDrop::kHeader)], 0) << when;
  const VerifyReport report = (*store)->Verify();
  EXPECT_EQ(report.corrupt, 0) << when;
  EXPECT_EQ(report.objects_checked, stats.open_objects) << when;
  std::printf(
      "%s: %ld objects, opened in %.1f ms (%ld segments from footers, %ld scanned, %ld "
      "torn bytes cut, %ld torn records)\n",
      when.c_str(), static_cast<long>(stats.open_objects), stats.open_seconds * 1e3,
      static_cast<long>(stats.segments_from_footer), static_cast<long>(stats.segments_scanned),
      static_cast<long>(stats.torn_bytes_dropped),
      static_cast<long>(dropped[static_cast<int>(RecoveryDrop::kTornTail)]));
}

TEST(CrashTest, KillNineTwentyTimes) {
  ASSERT_NE(g_writer, nullptr);
  const std::string dir = (fs::path(::testing::TempDir()) / "kill9").string();
  fs::remove_all(dir);
  std::mt19937 rng(2026);
  Ledger ledger;
  constexpr int kThreads = 4;
  for (uint64_t run = 0; run < 20; ++run) {
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      const std::string r = std::to_string(run), t = std::to_string(kThreads);
      ::execl(g_writer, g_writer, dir.c_str(), r.c_str(), t.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(out[1]);
    // Read acknowledgements for a random 30..300 ms after the first one, then kill.
    std::string buffer;
    bool ready = false;
    auto& acked = ledger.acked[run];
    uint64_t max_i = 0;
    auto consume = [&] {
      size_t nl;
      while ((nl = buffer.find('\n')) != std::string::npos) {
        const std::string line = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        if (line == "ready") {
          ready = true;
        } else if (!line.empty()) {
          const uint64_t i = std::stoull(line);
          acked.insert(i);
          max_i = std::max(max_i, i);
        }
      }
    };
    auto read_some = [&](int timeout_ms) {
      pollfd p{out[0], POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return false;
      char chunk[4096];
      const ssize_t n = ::read(out[0], chunk, sizeof(chunk));
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<size_t>(n));
      consume();
      return true;
    };
    const auto start = std::chrono::steady_clock::now();
    while (!ready && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
      read_some(100);
    }
    ASSERT_TRUE(ready) << "run " << run << ": the writer did not start";
    // The kill lands a random time after the first acknowledgement (on a loaded machine the
    // first put can take longer than the whole window).
    while (acked.empty() && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
      read_some(100);
    }
    ASSERT_FALSE(acked.empty()) << "run " << run << ": the writer acknowledged nothing in 60 s";
    const auto kill_at = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(30 + static_cast<int>(rng() % 270));
    while (std::chrono::steady_clock::now() < kill_at) read_some(5);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "run " << run << ": the writer exited by itself";
    while (read_some(0)) {
    }
    ::close(out[0]);
    // Each thread had at most one put in flight beyond its last acknowledgement.
    ledger.attempted_below[run] = max_i + 2 * kThreads + 1;
    ASSERT_GT(acked.size(), 0u) << "run " << run;
    Check(dir, ledger, run,
          "after kill " + std::to_string(run + 1) + " (" + std::to_string(acked.size()) +
              " acknowledged in this run)");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(CrashTest, PowerCutTwentyTimes) {
  const std::string dir = (fs::path(::testing::TempDir()) / "powercut").string();
  fs::remove_all(dir);
  std::mt19937 rng(7);
  Ledger ledger;
  constexpr int kThreads = 3;
  for (uint64_t run = 100; run < 120; ++run) {
    FaultFileSystem fault(&PosixFileSystem());
    StoreOptions options = Options();
    options.fs = &fault;
    std::mutex mu;
    std::condition_variable first_ack;
    auto& acked = ledger.acked[run];
    std::atomic<uint64_t> next{0};
    int64_t dropped = 0;
    {
      auto store = KvStore::Open(dir, options);
      ASSERT_TRUE(store.ok()) << store.status();
      std::vector<std::thread> writers;
      for (int t = 0; t < kThreads; ++t) {
        writers.emplace_back([&] {
          while (true) {
            const uint64_t i = next++;
            const std::string v = crash::ObjectValue(run, i);
            if (!(*store)->Put({{crash::ObjectKey(run, i), crash::ObjectMetaFor(run), v}}).ok()) {
              return;
            }
            std::lock_guard<std::mutex> lock(mu);
            acked.insert(i);
            first_ack.notify_all();
          }
        });
      }
      // The power goes a random time after the first acknowledgement (on a loaded machine the
      // first put can take longer than the whole window).
      {
        std::unique_lock<std::mutex> lock(mu);
        first_ack.wait_for(lock, std::chrono::seconds(60), [&] { return !acked.empty(); });
      }
      // Inherent: the random cut point is what this test varies (the writers run meanwhile).
      std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 200));
      dropped = fault.Crash();
      for (auto& w : writers) w.join();
    }
    ledger.attempted_below[run] = next;
    ASSERT_GT(acked.size(), 0u);
    Check(dir, ledger, run,
          "after power cut " + std::to_string(run - 99) + " (" + std::to_string(dropped) +
              " unsynced bytes dropped)");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace kv
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) ferry::kv::g_writer = argv[1];
  return RUN_ALL_TESTS();
}
