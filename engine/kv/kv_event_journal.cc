#include "engine/kv/kv_event_journal.h"

#include <algorithm>

namespace ferry {

KvEventJournal::KvEventJournal(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void KvEventJournal::Append(absl::Span<const KvCacheEvent> events, bool window) {
  if (events.empty()) return;
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<Hash128>& held = window ? window_held_ : held_;
  for (const KvCacheEvent& e : events) {
    if (e.kind == KvCacheEvent::Kind::kStored) {
      held.insert(e.hash);
    } else {
      held.erase(e.hash);
    }
    events_.push_back(JournalEvent{++last_, e.kind, e.hash, window});
    if (events_.size() > capacity_) {
      floor_ = events_.front().sequence;
      events_.pop_front();
    }
  }
}

void KvEventJournal::Reset(absl::Span<const Hash128> hashes,
                           absl::Span<const Hash128> window_hashes) {
  absl::MutexLock lock(&mu_);
  held_ = absl::flat_hash_set<Hash128>(hashes.begin(), hashes.end());
  window_held_ = absl::flat_hash_set<Hash128>(window_hashes.begin(), window_hashes.end());
  events_.clear();
  ++last_;  // the new state gets a sequence of its own, which no reader has seen
  floor_ = last_;
}

JournalSnapshot KvEventJournal::Snapshot() const {
  JournalSnapshot s;
  absl::MutexLock lock(&mu_);
  s.sequence = last_;
  s.hashes.assign(held_.begin(), held_.end());
  s.window_hashes.assign(window_held_.begin(), window_held_.end());
  std::sort(s.hashes.begin(), s.hashes.end());
  std::sort(s.window_hashes.begin(), s.window_hashes.end());
  return s;
}

bool KvEventJournal::EventsAfter(uint64_t after, size_t max_events,
                                 std::vector<JournalEvent>* out) const {
  absl::MutexLock lock(&mu_);
  if (after < floor_ || after > last_) return false;
  if (after == last_) return true;
  // events_ holds sequences floor_ + 1 .. last_, consecutively.
  const size_t first = static_cast<size_t>(after - floor_);
  const size_t end = std::min(events_.size(), first + max_events);
  out->insert(out->end(), events_.begin() + first, events_.begin() + end);
  return true;
}

uint64_t KvEventJournal::last_sequence() const {
  absl::MutexLock lock(&mu_);
  return last_;
}

int64_t KvEventJournal::held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(held_.size());
}

int64_t KvEventJournal::window_held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(window_held_.size());
}

int64_t KvEventJournal::CachedPrefix(absl::Span<const Hash128> hashes) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  while (n < static_cast<int64_t>(hashes.size()) && held_.contains(hashes[n])) ++n;
  return n;
}

}  // namespace ferry
