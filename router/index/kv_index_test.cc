// The KV index against a plain model (a std::set of (worker, hash) per cache), and the event feed:
// stored / evicted / cleared events, snapshots, gaps and the resync after one, the byte cap.

#include "router/index/kv_index.h"

#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "router/index/block_table.h"
#include "router/index/kv_event_feed.h"

namespace ferry {
namespace {

Hash128 H(uint64_t i) {
  // Spread over the shards like real XXH3 output.
  std::mt19937_64 g(i * 7919 + 1);
  return Hash128{g(), g()};
}

std::vector<Hash128> Chain(uint64_t first, int n) {
  std::vector<Hash128> out;
  for (int i = 0; i < n; ++i) out.push_back(H(first + i));
  return out;
}

// The prefix each slot holds of `chain`, from the model.
std::vector<int32_t> ModelMatch(const std::vector<std::set<Hash128>>& held,
                                const std::vector<Hash128>& chain) {
  std::vector<int32_t> out(held.size());
  for (size_t s = 0; s < held.size(); ++s) {
    int32_t k = 0;
    while (k < static_cast<int32_t>(chain.size()) && held[s].count(chain[k])) ++k;
    out[s] = k;
  }
  return out;
}

TEST(BlockTableTest, AgreesWithAMapThroughInsertsErasesGrowthAndEraseIf) {
  BlockTable table;
  std::map<Hash128, uint64_t> model;
  std::mt19937_64 rng(5);
  for (int step = 0; step < 200000; ++step) {
    const Hash128 key = H(rng() % 5000);
    // Crowd the keys' home slots now and then (same low bits of lo).
    const Hash128 k{step % 7 == 0 ? key.lo & ~uint64_t{0xfff} : key.lo, 0};
    uint64_t* word = table.Find(k);
    ASSERT_EQ(word != nullptr, model.count(k) > 0) << step;
    if (word != nullptr) {
      ASSERT_EQ(*word, model[k]);
      if (rng() % 2 == 0) {
        table.Erase(word);
        model.erase(k);
      }
    } else {
      if (table.Full()) table.Rehash(table.GrownCapacity());
      const uint64_t w = 1 + rng() % 1000;
      table.Insert(k, w);
      model[k] = w;
    }
    ASSERT_EQ(table.size(), model.size());
    ASSERT_LE(table.size() * 4, table.capacity() * 3);
    if (step % 20000 == 19999) {
      // Erase the odd words, keep the rest: every key visited once.
      int visited = 0;
      table.EraseIf([&](uint64_t lo, uint64_t& w) {
        ++visited;
        EXPECT_EQ(model.count(Hash128{lo, 0}), 1u);
        return w % 2 == 1;
      });
      EXPECT_EQ(visited, static_cast<int>(model.size()));
      for (auto it = model.begin(); it != model.end();) {
        it = it->second % 2 == 1 ? model.erase(it) : std::next(it);
      }
      ASSERT_EQ(table.size(), model.size());
      for (const auto& [key, w] : model) ASSERT_NE(table.Find(key), nullptr);
    }
  }
  EXPECT_EQ(table.bytes(), table.capacity() * 16);
}

TEST(KvIndexTest, MatchesTheLongestPrefixOfEveryWorker) {
  KvIndex index;
  std::vector<int> slots;
  for (int i = 0; i < 3; ++i) slots.push_back(index.AddWorker());
  EXPECT_EQ(slots, (std::vector<int>{0, 1, 2}));
  const auto chain = Chain(100, 8);
  index.Stored(0, absl::MakeConstSpan(chain).subspan(0, 5));
  index.Stored(1, chain);
  index.Stored(2, absl::MakeConstSpan(chain).subspan(1, 7));  // not the first block: no prefix
  std::vector<int32_t> prefix;
  index.Match(chain, &prefix);
  EXPECT_EQ(prefix, (std::vector<int32_t>{5, 8, 0}));
  EXPECT_EQ(index.entries(), 5 + 8 + 7);
  EXPECT_EQ(index.blocks(1), 8);
  // Evicting a middle block cuts the prefix there; a repeated event changes nothing.
  index.Evicted(1, {chain[3]});
  index.Evicted(1, {chain[3]});
  index.Stored(0, {chain[0]});
  index.Match(chain, &prefix);
  EXPECT_EQ(prefix, (std::vector<int32_t>{5, 3, 0}));
  EXPECT_EQ(index.blocks(1), 7);
  index.Cleared(0);
  index.Match(chain, &prefix);
  EXPECT_EQ(prefix, (std::vector<int32_t>{0, 3, 0}));
  EXPECT_EQ(index.entries(), 7 + 7);
  // A removed worker's slot is reused, empty.
  index.RemoveWorker(1);
  EXPECT_EQ(index.AddWorker(), 1);
  index.Match(chain, &prefix);
  EXPECT_EQ(prefix, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(index.entries(), 7);
}

TEST(KvIndexTest, AgreesWithAModelOverRandomEventsAcrossGroupsAndCaches) {
  KvIndex index;
  const int workers = 130;  // three groups of 64
  std::vector<std::set<Hash128>> held(workers), window(workers);
  for (int i = 0; i < workers; ++i) ASSERT_EQ(index.AddWorker(), i);
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const int w = static_cast<int>(rng() % workers);
    const bool win = rng() % 4 == 0;
    std::vector<Hash128> batch;
    for (int k = static_cast<int>(rng() % 6); k >= 0; --k) batch.push_back(H(rng() % 48));
    auto& model = win ? window[w] : held[w];
    if (rng() % 3 == 0) {
      index.Evicted(w, batch, win);
      for (const Hash128& h : batch) model.erase(h);
    } else {
      index.Stored(w, batch, win);
      for (const Hash128& h : batch) model.insert(h);
    }
    if (rng() % 500 == 0) {
      index.Cleared(w);
      held[w].clear();
      window[w].clear();
    }
  }
  int64_t entries = 0;
  for (int w = 0; w < workers; ++w) {
    entries += static_cast<int64_t>(held[w].size() + window[w].size());
    EXPECT_EQ(index.blocks(w), static_cast<int64_t>(held[w].size())) << w;
  }
  EXPECT_EQ(index.entries(), entries);
  std::vector<int32_t> prefix;
  for (uint64_t start = 0; start < 48; ++start) {
    const auto chain = Chain(start, 4);
    index.Match(chain, &prefix);
    EXPECT_EQ(prefix, ModelMatch(held, chain)) << start;
  }
  for (int w = 0; w < workers; ++w) {
    for (uint64_t i = 0; i < 48; ++i) {
      ASSERT_EQ(index.Holds(w, H(i), true), window[w].count(H(i)) > 0);
    }
  }
}

TEST(KvIndexTest, NeverExceedsItsByteCapAndDropsOnlyStores) {
  KvIndexOptions options;
  options.max_bytes = 64 << 10;
  KvIndex index(options);
  const int a = index.AddWorker(), b = index.AddWorker();
  for (uint64_t i = 0; i < 20000; ++i) {
    index.Stored(i % 2 == 0 ? a : b, {H(i)});
    ASSERT_LE(index.bytes(), options.max_bytes);
  }
  EXPECT_GT(index.dropped(), 0);
  EXPECT_GT(index.bytes(), options.max_bytes / 4);  // the cap is used, not just respected
  EXPECT_EQ(index.entries() + index.dropped(), 20000);
  // At the cap, churn (evict one, store another in the same shard: KvIndex::ShardOf is hi's top
  // 4 bits) goes on: an evicted key's slot is free for the next (no tombstones).
  int64_t churned = 0, refused = 0;
  uint64_t next = 100000;
  for (uint64_t i = 0; i < 20000; i += 2) {
    if (!index.Holds(a, H(i))) continue;
    Hash128 fresh = H(next++);
    while (fresh.hi >> 60 != H(i).hi >> 60) fresh = H(next++);
    index.Evicted(a, {H(i)});
    const int64_t dropped = index.dropped();
    index.Stored(a, {fresh});
    ++(index.dropped() == dropped ? churned : refused);
    ASSERT_LE(index.bytes(), options.max_bytes);
    index.Evicted(a, {fresh});
    index.Stored(a, {H(i)});
  }
  EXPECT_EQ(refused, 0) << churned << " stored";
  // What was kept is exact: every stored hash the index holds was stored, and evictions free
  // room for new ones.
  const int64_t kept = index.entries();
  std::vector<Hash128> held;
  for (uint64_t i = 0; i < 20000; ++i) {
    if (index.Holds(i % 2 == 0 ? a : b, H(i))) held.push_back(H(i));
  }
  EXPECT_EQ(static_cast<int64_t>(held.size()), kept);
  index.Cleared(a);
  index.Cleared(b);
  EXPECT_EQ(index.entries(), 0);
  const int64_t dropped = index.dropped();
  index.Stored(a, {H(999999)});
  EXPECT_TRUE(index.Holds(a, H(999999)));
  EXPECT_EQ(index.dropped(), dropped);
}

// Watch messages as a worker's WatchHub writes them.
class Stream {
 public:
  explicit Stream(uint64_t incarnation) : incarnation_(incarnation) {}

  v1::WorkerStatus Snapshot(const std::set<Hash128>& held, size_t part = 1000) {
    std::vector<v1::WorkerStatus> parts;
    v1::WorkerStatus first = Base();
    first.set_snapshot(true);
    v1::KvEvent* e = first.add_kv_events();
    e->set_type(v1::KV_EVENT_TYPE_STORED);
    size_t n = 0;
    for (const Hash128& h : held) {
      if (n++ >= part) break;
      Add(h, e);
    }
    return first;
  }
  v1::WorkerStatus Events(const std::vector<std::pair<bool, Hash128>>& events) {
    v1::WorkerStatus s = Base();
    v1::KvEvent* current = nullptr;
    bool current_stored = false;
    for (const auto& [stored, h] : events) {
      if (current == nullptr || current_stored != stored) {
        current = s.add_kv_events();
        current->set_type(stored ? v1::KV_EVENT_TYPE_STORED : v1::KV_EVENT_TYPE_EVICTED);
        current_stored = stored;
      }
      Add(h, current);
      ++sequence_;
    }
    s.set_sequence(sequence_);
    return s;
  }
  uint64_t sequence() const { return sequence_; }
  void set_sequence(uint64_t s) { sequence_ = s; }

 private:
  v1::WorkerStatus Base() const {
    v1::WorkerStatus s;
    s.set_incarnation(incarnation_);
    s.set_sequence(sequence_);
    return s;
  }
  static void Add(const Hash128& h, v1::KvEvent* e) {
    v1::Hash128* p = e->add_block_hashes();
    p->set_lo(h.lo);
    p->set_hi(h.hi);
  }
  const uint64_t incarnation_;
  uint64_t sequence_ = 0;
};

std::set<Hash128> IndexSet(const KvIndex& index, int slot, uint64_t universe) {
  std::set<Hash128> out;
  for (uint64_t i = 0; i < universe; ++i) {
    if (index.Holds(slot, H(i))) out.insert(H(i));
  }
  return out;
}

TEST(KvEventFeedTest, FollowsTheStreamAndResyncsExactlyAfterAGap) {
  KvIndex index;
  const int other = index.AddWorker();
  index.Stored(other, Chain(0, 10));  // another worker's blocks are never touched
  KvEventFeed feed(&index, index.AddWorker());
  Stream stream(42);
  std::set<Hash128> held;  // the worker's cache
  std::mt19937_64 rng(3);
  auto random_events = [&](int n) {
    std::vector<std::pair<bool, Hash128>> events;
    for (int i = 0; i < n; ++i) {
      const Hash128 h = H(rng() % 200);
      const bool stored = !held.count(h);
      (stored ? (void)held.insert(h) : (void)held.erase(h));
      events.emplace_back(stored, h);
    }
    return events;
  };
  // Before a snapshot nothing applies.
  EXPECT_EQ(feed.Apply(stream.Events({})), KvEventFeed::Result::kGap);
  for (int i = 0; i < 30; ++i) random_events(1);  // the worker's state before we subscribed
  ASSERT_EQ(feed.Apply(stream.Snapshot(held)), KvEventFeed::Result::kApplied);
  EXPECT_EQ(feed.resume().after_sequence(), stream.sequence());
  EXPECT_EQ(feed.resume().incarnation(), 42u);
  for (int m = 0; m < 50; ++m) {
    ASSERT_EQ(feed.Apply(stream.Events(random_events(1 + m % 7))), KvEventFeed::Result::kApplied);
  }
  EXPECT_EQ(IndexSet(index, feed.slot(), 200), held);
  EXPECT_EQ(index.blocks(feed.slot()), static_cast<int64_t>(held.size()));

  // A lost message: the next one does not add up; nothing of it is applied.
  stream.Events(random_events(5));
  const std::set<Hash128> before = IndexSet(index, feed.slot(), 200);
  std::string why;
  EXPECT_EQ(feed.Apply(stream.Events(random_events(3)), &why), KvEventFeed::Result::kGap);
  EXPECT_NE(why.find("sequence"), std::string::npos) << why;
  EXPECT_EQ(IndexSet(index, feed.slot(), 200), before);
  EXPECT_EQ(feed.gaps(), 2);
  // The resubscription gets a snapshot (the worker no longer keeps the events): exact again.
  ASSERT_EQ(feed.Apply(stream.Snapshot(held)), KvEventFeed::Result::kApplied);
  EXPECT_EQ(IndexSet(index, feed.slot(), 200), held);
  EXPECT_EQ(index.blocks(feed.slot()), static_cast<int64_t>(held.size()));
  // A restarted worker (a new incarnation) must start with a snapshot.
  Stream restarted(43);
  EXPECT_EQ(feed.Apply(restarted.Events(random_events(1))), KvEventFeed::Result::kGap);
  std::set<Hash128> fresh = {H(7), H(8)};
  held = fresh;
  ASSERT_EQ(feed.Apply(restarted.Snapshot(held)), KvEventFeed::Result::kApplied);
  EXPECT_EQ(IndexSet(index, feed.slot(), 200), fresh);
  EXPECT_EQ(feed.snapshots(), 3);
  // The other worker's entries are intact.
  std::vector<int32_t> prefix;
  index.Match(Chain(0, 10), &prefix);
  EXPECT_EQ(prefix[other], 10);
}

TEST(KvEventFeedTest, ASnapshotInPartsAndAResumedStream) {
  KvIndex index;
  KvEventFeed feed(&index, index.AddWorker());
  Stream stream(9);
  std::set<Hash128> held;
  for (uint64_t i = 0; i < 25; ++i) held.insert(H(i));
  stream.set_sequence(25);
  // The snapshot's first part, then the rest as snapshot_continues messages.
  ASSERT_EQ(feed.Apply(stream.Snapshot(held, 10)), KvEventFeed::Result::kApplied);
  v1::WorkerStatus rest;
  rest.set_incarnation(9);
  rest.set_sequence(25);
  rest.set_snapshot_continues(true);
  v1::KvEvent* e = rest.add_kv_events();
  e->set_type(v1::KV_EVENT_TYPE_STORED);
  size_t n = 0;
  for (const Hash128& h : held) {
    if (n++ < 10) continue;
    v1::Hash128* p = e->add_block_hashes();
    p->set_lo(h.lo);
    p->set_hi(h.hi);
  }
  ASSERT_EQ(feed.Apply(rest), KvEventFeed::Result::kApplied);
  EXPECT_EQ(IndexSet(index, feed.slot(), 100), held);
  // A stream resumed after sequence 25: its first message carries the events after it.
  ASSERT_EQ(feed.Apply(stream.Events({{false, H(0)}, {true, H(50)}})),
            KvEventFeed::Result::kApplied);
  held.erase(H(0));
  held.insert(H(50));
  EXPECT_EQ(IndexSet(index, feed.slot(), 100), held);
  EXPECT_EQ(feed.sequence(), 27u);
  // Reset forgets the worker: a snapshot next.
  feed.Reset();
  EXPECT_EQ(index.blocks(feed.slot()), 0);
  EXPECT_EQ(feed.resume().after_sequence(), 0u);
}

}  // namespace
}  // namespace ferry
