// The KV tables an engine holds for others to send (ARCHITECTURE.md §3, §7): a prefill-only
// request's prompt KV once its first tokens are sampled, and a parked request's KV (a drain's
// hand-off), each under its request id until the caller releases it, the request is aborted, or
// its TTL passes (a push that never ended).
//
// Ownership: each held KvTables carries one reference per block, given back to the KV cache on
// Drop. Thread-compatible: owned by the engine thread.

#ifndef FERRY_ENGINE_HANDOFF_BOOK_H_
#define FERRY_ENGINE_HANDOFF_BOOK_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "engine/kv/hybrid_kv_cache.h"

namespace ferry {

class HandoffBook {
 public:
  // `kv` and `clock` outlive the book.
  HandoffBook(HybridKvCache* kv, Clock* clock, absl::Duration ttl)
      : kv_(kv), clock_(clock), ttl_(ttl) {}
  ~HandoffBook();  // gives back whatever is still held

  // Holds `tables` for `id` until Drop or the TTL.
  void Hold(const std::string& id, KvTables tables);
  // The tables held for `id`, or null.
  const KvTables* Find(const std::string& id) const;
  // Gives back what is held for `id`; false when nothing is.
  bool Drop(const std::string& id);
  // Gives back everything held.
  void DropAll();
  // The ids whose TTL passed (the caller drops them).
  std::vector<std::string> Expired() const;
  // When the next TTL passes, on the clock's Monotonic(); InfiniteDuration when none is held.
  absl::Duration NextExpiry() const;
  bool empty() const { return held_.empty(); }
  absl::Duration ttl() const { return ttl_; }

 private:
  struct Held {
    KvTables tables;
    absl::Duration expires;  // on clock_->Monotonic()
  };
  HybridKvCache* const kv_;
  Clock* const clock_;
  const absl::Duration ttl_;
  absl::flat_hash_map<std::string, Held> held_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_HANDOFF_BOOK_H_
