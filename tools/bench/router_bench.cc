// ferry bench router: the routing library alone (the KV index and the prefix_aware policy), on
// one core, at the scale of a large pool: 64 aggregated workers, an index of 1M (worker, block)
// entries, 32-block prompts from a shared-prefix distribution (256 system prompts of 8 blocks,
// popular ones far more often, each conversation 24 blocks of its own on its home worker; 80% of
// prompts continue a known conversation, 20% start a new one).
//
// Measured separately, each the best of several runs:
//   - decisions/s with no events (Choose over 64 candidates: the index walk and the cost model);
//   - event ingestion alone (stored then evicted batches of 64 hashes, as Watch messages bring);
//   - decision p50 / p99 while another thread applies events at 20k/s;
//   - the index's bytes per (worker, block) entry;
//   - the baseline: the same prompts' chain lookups in an absl::flat_hash_map of the same keys
//     (no locks, no prefetch, no policy), vs_hashmap_baseline = decisions/s over its prompts/s.
// Goals (anchor: Dynamo's radix index, lookup p99 10 us, 13M block operations/s): >= 500k
// decisions/s, p99 <= 10 us under events, >= 15M events/s, <= 64 bytes per entry.
// Prints a table, then one JSON line.

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/common/hash128.h"
#include "engine/common/mutex_mode.h"
#include "router/index/kv_index.h"
#include "router/policy/prefix_aware.h"
#include "tools/bench/timing.h"

namespace {

using ferry::Hash128;
using Clock = std::chrono::steady_clock;

constexpr int kWorkers = 64;
constexpr int kFamilies = 256;
constexpr int kFamilyBlocks = 8;
constexpr int kOwnBlocks = 24;
constexpr int kBlocks = kFamilyBlocks + kOwnBlocks;  // 32 a prompt
constexpr int64_t kBlockTokens = 16;
constexpr int64_t kEntries = 1000000;

void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

Hash128 Next(std::mt19937_64& g) { return Hash128{g(), g()}; }

// A conversation's chain: its family's blocks, then its own.
struct Conversation {
  int family = 0;
  std::vector<Hash128> chain;
};

}  // namespace

int main(int argc, char** argv) {
  ferry::UseProgramMutexMode();
  // `--events_only`: build the index and ingest events for a while, for a profiler.
  const bool events_only = argc > 1 && std::string(argv[1]) == "--events_only";
  PinTo(0);
  std::mt19937_64 rng(1);
  std::vector<std::vector<Hash128>> families(kFamilies);
  for (auto& f : families) {
    for (int i = 0; i < kFamilyBlocks; ++i) f.push_back(Next(rng));
  }
  // Popular system prompts far more often: family = floor(256 * u^3).
  auto family_of = [&](std::mt19937_64& g) {
    const double u = std::uniform_real_distribution<double>(0, 1)(g);
    return std::min(kFamilies - 1, static_cast<int>(kFamilies * u * u * u));
  };
  auto new_conversation = [&](std::mt19937_64& g) {
    Conversation c;
    c.family = family_of(g);
    c.chain = families[c.family];
    for (int i = 0; i < kOwnBlocks; ++i) c.chain.push_back(Next(g));
    return c;
  };

  // The index: conversations on their home workers until it holds 1M entries.
  ferry::KvIndex index;
  for (int w = 0; w < kWorkers; ++w) index.AddWorker();
  std::vector<Conversation> conversations;
  while (index.entries() < kEntries) {
    conversations.push_back(new_conversation(rng));
    const int home = static_cast<int>(conversations.size() % kWorkers);
    index.Stored(home, conversations.back().chain);
  }
  const double bytes_per_entry =
      static_cast<double>(index.bytes()) / static_cast<double>(index.entries());

  // The prompts: 80% a known conversation, 20% a new one.
  std::vector<std::vector<Hash128>> prompts;
  for (int i = 0; i < 8192; ++i) {
    if (rng() % 5 == 0) {
      prompts.push_back(new_conversation(rng).chain);
    } else {
      prompts.push_back(conversations[rng() % conversations.size()].chain);
    }
  }
  std::vector<ferry::WorkerLoadView> workers(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    workers[w].id = "worker-" + std::to_string(w);
    workers[w].slot = w;
    workers[w].prefill_tokens_per_second = 800 + static_cast<double>(rng() % 800);
    workers[w].queued_tokens = static_cast<int64_t>(rng() % 2000);
    workers[w].total_kv_blocks = workers[w].free_kv_blocks = 16384;
  }
  ferry::PrefixAwarePolicy policy(&index, {}, 7);
  auto request = [&](const std::vector<Hash128>& chain) {
    ferry::RouteRequest r;
    r.prompt_tokens = kBlocks * kBlockTokens + 7;
    r.block_hashes = chain;
    r.block_tokens = kBlockTokens;
    return r;
  };

  if (events_only) {
    std::vector<std::vector<Hash128>> batches;
    for (int i = 0; i < 4096; ++i) {
      std::vector<Hash128> b;
      while (b.size() < 64) b.push_back(Next(rng));
      batches.push_back(std::move(b));
    }
    const double s = ferry::bench::BestSeconds(100, [&] {
      for (size_t i = 0; i < batches.size(); ++i)
        index.Stored(static_cast<int>(i % kWorkers), batches[i]);
      for (size_t i = 0; i < batches.size(); ++i)
        index.Evicted(static_cast<int>(i % kWorkers), batches[i]);
    });
    std::printf("events/s %.0f\n", 2.0 * 4096 * 64 / s);
    double st = 1e9, ev = 1e9;
    for (int r = 0; r < 50; ++r) {
      st = std::min(st, ferry::bench::BestSeconds(1, [&] {
                      for (size_t i = 0; i < batches.size(); ++i)
                        index.Stored(static_cast<int>(i % kWorkers), batches[i]);
                    }));
      ev = std::min(ev, ferry::bench::BestSeconds(1, [&] {
                      for (size_t i = 0; i < batches.size(); ++i)
                        index.Evicted(static_cast<int>(i % kWorkers), batches[i]);
                    }));
    }
    std::printf("stored/s %.0f evicted/s %.0f\n", 4096 * 64 / st, 4096 * 64 / ev);
    return 0;
  }

  // 1. Decisions, no events.
  constexpr int kDecisions = 200000;
  volatile uint64_t sink = 0;
  const double decide = ferry::bench::BestSeconds(9, [&] {
    for (int i = 0; i < kDecisions; ++i) {
      sink += policy.Choose(workers, request(prompts[i % prompts.size()])).index;
    }
  });
  const double decisions_per_s = kDecisions / decide;

  // 2. Events alone: new conversations stored (a batch of 64 hashes per Watch message), then
  // evicted, so the index ends as it began.
  std::vector<std::vector<Hash128>> batches;
  for (int i = 0; i < 4096; ++i) {
    // Two new conversations' own blocks and 16 more: 64 hashes none of the workers holds.
    std::vector<Hash128> b;
    for (int k = 0; k < 2; ++k) {
      const auto c = new_conversation(rng);
      b.insert(b.end(), c.chain.begin() + kFamilyBlocks, c.chain.end());
    }
    while (b.size() < 64) b.push_back(Next(rng));
    batches.push_back(std::move(b));
  }
  int64_t events_per_run = 0;
  for (const auto& b : batches) events_per_run += 2 * static_cast<int64_t>(b.size());
  const double ingest = ferry::bench::BestSeconds(15, [&] {
    for (size_t i = 0; i < batches.size(); ++i)
      index.Stored(static_cast<int>(i % kWorkers), batches[i]);
    for (size_t i = 0; i < batches.size(); ++i)
      index.Evicted(static_cast<int>(i % kWorkers), batches[i]);
  });
  const double events_per_s = static_cast<double>(events_per_run) / ingest;

  // 3. Decision latency while another thread applies 20k events/s (a 64-hash message every
  // 3.2 ms, stored then evicted).
  std::atomic<bool> stop{false};
  std::atomic<int64_t> applied{0};
  std::thread events([&] {
    PinTo(1);
    const auto period = std::chrono::microseconds(3200);
    auto next = Clock::now();
    for (size_t i = 0; !stop.load(); ++i) {
      const auto& b = batches[(i / 2) % batches.size()];
      const int w = static_cast<int>((i / 2) % kWorkers);
      if (i % 2 == 0) {
        index.Stored(w, b);
      } else {
        index.Evicted(w, b);
      }
      applied += static_cast<int64_t>(b.size());
      next += period;
      std::this_thread::sleep_until(next);
    }
  });
  std::vector<double> latencies;
  latencies.reserve(kDecisions);
  const auto under_start = Clock::now();
  for (int rep = 0; rep < 3; ++rep) {
    for (int i = 0; i < kDecisions; ++i) {
      const auto t0 = Clock::now();
      sink += policy.Choose(workers, request(prompts[(i * 7 + rep) % prompts.size()])).index;
      latencies.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  const double under_seconds = std::chrono::duration<double>(Clock::now() - under_start).count();
  stop = true;
  events.join();
  std::sort(latencies.begin(), latencies.end());
  const double p50 = latencies[latencies.size() / 2] * 1e6;
  const double p99 = latencies[latencies.size() * 99 / 100] * 1e6;
  const double event_rate = static_cast<double>(applied.load()) / under_seconds;

  // 4. The baseline: each prompt's reusable chain looked up in a plain flat_hash_map.
  absl::flat_hash_map<Hash128, uint64_t> plain;
  for (size_t i = 0; i < conversations.size(); ++i) {
    for (const Hash128& h : conversations[i].chain) plain[h] |= uint64_t{1} << (i % kWorkers);
  }
  const double baseline = ferry::bench::BestSeconds(5, [&] {
    for (int i = 0; i < kDecisions; ++i) {
      const auto& chain = prompts[i % prompts.size()];
      for (int k = 0; k < kBlocks; ++k) {
        auto it = plain.find(chain[k]);
        sink += it == plain.end() ? 0 : it->second;
      }
    }
  });
  const double baseline_per_s = kDecisions / baseline;

  std::printf(
      "router: %d workers, %lld (worker, block) entries (%zu conversations), %d-block "
      "prompts, best of 9 (events: 15)\n",
      kWorkers, static_cast<long long>(index.entries()), conversations.size(), kBlocks);
  std::printf("  %-44s %12.0f /s  %6.2f us each\n", "decisions, no events", decisions_per_s,
              1e6 / decisions_per_s);
  std::printf("  %-44s %12.0f /s\n", "events ingested alone", events_per_s);
  std::printf("  %-44s p50 %.2f us  p99 %.2f us  (%.0f events/s applied)\n",
              "decisions while events arrive", p50, p99, event_rate);
  std::printf("  %-44s %12.1f bytes (%.1f MB)\n", "index per entry", bytes_per_entry,
              static_cast<double>(index.bytes()) / 1e6);
  std::printf("  %-44s %12.0f /s  %6.2f us each\n", "baseline: flat_hash_map chain lookups",
              baseline_per_s, 1e6 / baseline_per_s);
  std::printf("  decisions vs the baseline's lookups: %.2f\n", decisions_per_s / baseline_per_s);
  std::printf(
      "  goals: decisions >= 500k/s %s, p99 <= 10 us %s, events >= 15M/s %s, <= 64 "
      "bytes/entry %s\n",
      decisions_per_s >= 5e5 ? "met" : "MISSED", p99 <= 10 ? "met" : "MISSED",
      events_per_s >= 15e6 ? "met" : "MISSED", bytes_per_entry <= 64 ? "met" : "MISSED");
  std::printf(
      "{\"bench\":\"router\",\"workers\":%d,\"entries\":%lld,\"decisions_per_s\":%.0f,"
      "\"decision_p50_us\":%.3f,\"decision_p99_us\":%.3f,\"events_per_s\":%.0f,"
      "\"events_per_s_during_latency\":%.0f,\"index_bytes_per_entry\":%.2f,"
      "\"baseline_prompts_per_s\":%.0f,\"vs_hashmap_baseline\":%.3f}\n",
      kWorkers, static_cast<long long>(index.entries()), decisions_per_s, p50, p99, events_per_s,
      event_rate, bytes_per_entry, baseline_per_s, decisions_per_s / baseline_per_s);
  return sink == 42 ? 1 : 0;  // keeps `sink` alive; never 42 in practice
}
