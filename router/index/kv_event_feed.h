// One worker's Watch stream into the KvIndex (worker.proto WorkerStatus): snapshots replace the
// worker's set, later messages apply their STORED / EVICTED / CLEARED events in order, and the
// numbering is checked, so that the index holds exactly the worker's set as of the last message
// applied.
//
//   - A snapshot (snapshot = true) clears the worker's blocks and stores its hashes; the parts
//     after it (snapshot_continues) store more. Its sequence and incarnation become the feed's.
//   - Any other message must be of the feed's incarnation and carry exactly the events
//     (sequence before, sequence after]: one per hash. Otherwise it is a gap (a lost message, a
//     restarted worker without a snapshot): nothing of it is applied and Apply says so; the
//     caller resubscribes with resume() and the worker answers with the events it still keeps,
//     or a snapshot.
//
// The caller gives a feed its worker's messages in stream order, one at a time (the registry's
// stream callbacks). Not thread-safe; the index is.

#ifndef FERRY_ROUTER_INDEX_KV_EVENT_FEED_H_
#define FERRY_ROUTER_INDEX_KV_EVENT_FEED_H_

#include <cstdint>
#include <string>

#include "ferry/v1/worker.pb.h"
#include "router/index/kv_index.h"

namespace ferry {

class KvEventFeed {
 public:
  // `index` must outlive the feed; `slot` is the worker's (KvIndex::AddWorker; -1: none, then
  // the numbering is still followed but nothing is indexed).
  KvEventFeed(KvIndex* index, int slot) : index_(index), slot_(slot) {}

  enum class Result { kApplied, kGap };
  // Applies one message; on kGap, `why` says what did not add up.
  Result Apply(const ferry::v1::WorkerStatus& status, std::string* why = nullptr);

  // What a resubscription asks for (WatchRequest): after_sequence 0 (a snapshot) until a
  // snapshot was applied.
  ferry::v1::WatchRequest resume() const;
  // Forgets the worker's blocks (a worker refused or gone for good): the next stream starts with
  // a snapshot.
  void Reset();

  uint64_t sequence() const { return sequence_; }
  uint64_t incarnation() const { return incarnation_; }
  bool synced() const { return synced_; }
  int slot() const { return slot_; }
  // Snapshots applied, and gaps found, over the feed's life.
  int64_t snapshots() const { return snapshots_; }
  int64_t gaps() const { return gaps_; }

 private:
  KvIndex* const index_;
  const int slot_;
  bool synced_ = false;  // a snapshot was applied: sequence_ / incarnation_ are the worker's
  uint64_t sequence_ = 0;
  uint64_t incarnation_ = 0;
  int64_t snapshots_ = 0, gaps_ = 0;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_INDEX_KV_EVENT_FEED_H_
