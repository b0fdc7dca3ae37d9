// Single-flight: several callers asking for the same key's value at once share one computation.
// The first to Join a key leads (it must start the computation and Complete the key); the others
// only wait; Complete hands the one result to every caller that joined, outside the lock, and
// the next Join of the key leads again.
//
// Each caller registers whether it is still waiting (`gone`: its RPC was cancelled or its
// deadline passed), so the computation can be skipped when every caller left (AllGone) before
// it started.
//
// Thread-safe. `done` callbacks run on the thread that calls Complete.

#ifndef FERRY_SERVICES_ENCODER_SINGLE_FLIGHT_H_
#define FERRY_SERVICES_ENCODER_SINGLE_FLIGHT_H_

#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

template <typename Key, typename Value>
class SingleFlight {
 public:
  struct Waiter {
    std::function<void(const absl::StatusOr<Value>&)> done;
    std::function<bool()> gone;  // may be empty: never gone
  };

  // Adds a caller of `key`; true when it leads (no computation of the key was in flight).
  bool Join(const Key& key, Waiter waiter) {
    absl::MutexLock lock(&mu_);
    auto [it, leads] = flights_.try_emplace(key);
    it->second.push_back(std::move(waiter));
    return leads;
  }

  // Whether every caller of `key` has left (false when the key has no flight).
  bool AllGone(const Key& key) const {
    absl::MutexLock lock(&mu_);
    auto it = flights_.find(key);
    if (it == flights_.end()) return false;
    for (const Waiter& w : it->second) {
      if (!w.gone || !w.gone()) return false;
    }
    return true;
  }

  // Ends the flight of `key`: every caller that joined gets `result`.
  void Complete(const Key& key, const absl::StatusOr<Value>& result) {
    std::vector<Waiter> waiters;
    {
      absl::MutexLock lock(&mu_);
      auto it = flights_.find(key);
      if (it == flights_.end()) return;
      waiters = std::move(it->second);
      flights_.erase(it);
    }
    for (Waiter& w : waiters) w.done(result);
  }

  size_t in_flight() const {
    absl::MutexLock lock(&mu_);
    return flights_.size();
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::vector<Waiter>> flights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_SERVICES_ENCODER_SINGLE_FLIGHT_H_
