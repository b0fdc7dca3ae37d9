// The journal's promises: sequence numbers in order, a snapshot equal to the result of every event
// so far, the events after any kept sequence, a refusal (snapshot needed) past the bound, and a
// reset that no earlier reader can continue from.

#include "engine/kv/kv_event_journal.h"

#include <set>
#include <thread>

#include "gtest/gtest.h"

namespace ferry {
namespace {

Hash128 H(uint64_t i) { return Hash128{~i, i}; }  // sorts (by hi) as i does

KvCacheEvent Stored(uint64_t i) { return {KvCacheEvent::Kind::kStored, H(i)}; }
KvCacheEvent Evicted(uint64_t i) { return {KvCacheEvent::Kind::kEvicted, H(i)}; }

// Applies `events` to `held`.
void Apply(const std::vector<JournalEvent>& events, std::set<Hash128>* held,
           std::set<Hash128>* window) {
  for (const JournalEvent& e : events) {
    std::set<Hash128>& s = e.window ? *window : *held;
    if (e.kind == KvCacheEvent::Kind::kStored) {
      s.insert(e.hash);
    } else {
      s.erase(e.hash);
    }
  }
}

TEST(KvEventJournalTest, SnapshotPlusEventsReproducesTheState) {
  KvEventJournal journal(100);
  journal.Append({Stored(1), Stored(2), Stored(3)}, false);
  journal.Append({Stored(7)}, true);
  const JournalSnapshot first = journal.Snapshot();
  EXPECT_EQ(first.sequence, 4u);
  EXPECT_EQ(first.hashes, (std::vector<Hash128>{H(1), H(2), H(3)}));
  EXPECT_EQ(first.window_hashes, (std::vector<Hash128>{H(7)}));
  journal.Append({Evicted(2), Stored(4)}, false);
  journal.Append({Evicted(7)}, true);

  std::set<Hash128> held(first.hashes.begin(), first.hashes.end());
  std::set<Hash128> window(first.window_hashes.begin(), first.window_hashes.end());
  std::vector<JournalEvent> events;
  ASSERT_TRUE(journal.EventsAfter(first.sequence, 2, &events));  // in two reads of at most 2
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].sequence, 5u);
  ASSERT_TRUE(journal.EventsAfter(events.back().sequence, 2, &events));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events.back().sequence, 7u);
  EXPECT_TRUE(events.back().window);
  Apply(events, &held, &window);
  const JournalSnapshot now = journal.Snapshot();
  EXPECT_EQ(std::vector<Hash128>(held.begin(), held.end()), now.hashes);
  EXPECT_EQ(std::vector<Hash128>(window.begin(), window.end()), now.window_hashes);
  EXPECT_EQ(journal.held(), 3);
  EXPECT_EQ(journal.window_held(), 0);
  // Nothing after the last; nothing from the future.
  events.clear();
  EXPECT_TRUE(journal.EventsAfter(7, 10, &events));
  EXPECT_TRUE(events.empty());
  EXPECT_FALSE(journal.EventsAfter(8, 10, &events));
  EXPECT_EQ(journal.CachedPrefix({H(1), H(3), H(2), H(4)}), 2);
}

TEST(KvEventJournalTest, AReaderPastTheBoundNeedsASnapshot) {
  KvEventJournal journal(4);
  for (uint64_t i = 1; i <= 10; ++i) journal.Append({Stored(i)}, false);
  std::vector<JournalEvent> events;
  EXPECT_FALSE(journal.EventsAfter(5, 100, &events));  // 6 is gone
  EXPECT_TRUE(events.empty());
  ASSERT_TRUE(journal.EventsAfter(6, 100, &events));  // 7..10 kept
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events.front().sequence, 7u);
  EXPECT_EQ(journal.Snapshot().hashes.size(), 10u);  // the state is never bounded by events
}

TEST(KvEventJournalTest, ResetStartsEveryReaderAgain) {
  KvEventJournal journal(16);
  journal.Append({Stored(1), Stored(2)}, false);
  journal.Reset({H(5)}, {H(6)});
  std::vector<JournalEvent> events;
  EXPECT_FALSE(journal.EventsAfter(2, 10, &events));
  const JournalSnapshot s = journal.Snapshot();
  EXPECT_EQ(s.sequence, 3u);
  EXPECT_EQ(s.hashes, std::vector<Hash128>{H(5)});
  EXPECT_EQ(s.window_hashes, std::vector<Hash128>{H(6)});
  journal.Append({Stored(8)}, false);
  ASSERT_TRUE(journal.EventsAfter(s.sequence, 10, &events));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].sequence, 4u);
}

TEST(KvEventJournalTest, ReadersOnOtherThreadsSeeAConsistentState) {
  KvEventJournal journal(1 << 20);
  std::thread writer([&] {
    for (uint64_t i = 0; i < 20000; ++i) {
      journal.Append({Stored(i)}, false);
      if (i % 3 == 0) journal.Append({Evicted(i)}, false);
    }
  });
  // A snapshot taken at any moment plus the events after it equals the final state.
  JournalSnapshot s = journal.Snapshot();
  writer.join();
  std::set<Hash128> held(s.hashes.begin(), s.hashes.end()), window;
  std::vector<JournalEvent> events;
  ASSERT_TRUE(journal.EventsAfter(s.sequence, 1 << 20, &events));
  Apply(events, &held, &window);
  const JournalSnapshot end = journal.Snapshot();
  EXPECT_EQ(std::vector<Hash128>(held.begin(), held.end()), end.hashes);
  EXPECT_EQ(end.sequence, 20000u + 6667u);
}

}  // namespace
}  // namespace ferry
