// Writes the KV blocks a worker computes to the shared KV store (ARCHITECTURE.md §3 step 5, §5),
// off the critical path: the engine thread offers each full block it computed
// (EngineRequest::on_computed_blocks; prompt blocks on prefill and aggregated workers, output
// blocks on decode and aggregated ones) and goes on; a writer thread sends them.
//
//   StoreWriter writer(client, &pool, fingerprint, metrics, {});
//   request.on_computed_blocks = [&](absl::Span<const ComputedBlock> b) {
//     writer.Offer(b, kv::TrafficClass::kAgent, /*retention_floor_s=*/3600);
//   };
//
// Retention: each block goes with its traffic class and a retention floor (the store keeps it at
// least that long after its last use; the class may keep it longer; 0: the class alone).
//
// Bounded: the blocks waiting hold a pool reference each (the pool cannot reuse them before
// their bytes are sent), at most max_queued_bytes of them; a block offered beyond that is dropped
// and counted, never waited for. The writer takes up to batch_blocks blocks at a time, skips
// those it wrote or found present lately with at least the floor wanted (a bounded map of recent
// hashes to the floor known for each; a hash twice in a batch goes once, with its highest
// floor), asks the store which of the rest it already has and with which floor (one Exists), and
// Puts the others in one call whose values are the blocks' host bytes (KvStaging::Export: the
// pool itself on host memory, so no copy is made before the kernel's, the client handing each
// value to gRPC as a slice of the block, PutStream; a GPU's blocks copied to its staging area):
// those absent, and those present with a lower floor than wanted (written again with the higher
// one, counted "extended"). Each block's reference is dropped as soon as that call returns. A
// store that is down or slow costs the batch (counted failed), never a request.
//
// Threads: Offer on any thread (the engine's), never blocking; one writer thread. The destructor
// writes what is queued (each call bounded by the client's deadline) and joins.

#ifndef FERRY_SERVICES_WORKER_STORE_WRITER_H_
#define FERRY_SERVICES_WORKER_STORE_WRITER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "engine/engine.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/kv/kv_staging.h"
#include "kvstore/client/kv_client.h"
#include "services/worker/worker_metrics.h"

namespace ferry {

struct StoreWriterOptions {
  // Host access to the pool's blocks (must outlive the writer); null: the pool in place (its
  // memory must be host memory).
  KvStaging* staging = nullptr;
  int64_t max_queued_bytes = int64_t{256} << 20;
  int64_t batch_blocks = 16;
  size_t recent_hashes = size_t{1} << 16;
};

class StoreWriter {
 public:
  // `client`, `pool` and `metrics` must outlive the writer. `fingerprint` is the model's.
  StoreWriter(kv::KvClient* client, KvBlockPool* pool, const Hash128& fingerprint,
              WorkerMetrics* metrics, const StoreWriterOptions& options);
  ~StoreWriter();
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // Queues `blocks` (a reference each) for the store, with their retention class and floor
  // (seconds; 0: the class alone); drops what does not fit. Never blocks.
  void Offer(absl::Span<const ComputedBlock> blocks, kv::TrafficClass traffic_class,
             uint32_t retention_floor_s = 0);
  // Waits until nothing is queued or being written, at most `timeout`; true when so.
  bool Flush(absl::Duration timeout);

 private:
  struct Item {
    Hash128 hash;
    BlockId block;
    kv::TrafficClass traffic_class;
    uint32_t retention_floor_s;
  };
  void Loop();
  void Write(std::vector<Item> batch);
  void Release(const Item& item);
  // Notes that the store has `hash` with at least `retention_floor_s`.
  void Remember(const Hash128& hash, uint32_t retention_floor_s);

  kv::KvClient* const client_;
  KvBlockPool* const pool_;
  std::unique_ptr<KvStaging> own_staging_;  // without options.staging
  KvStaging* staging_;
  const Hash128 fingerprint_;
  WorkerMetrics* const metrics_;
  const StoreWriterOptions options_;
  const int64_t block_bytes_;
  const uint64_t layout_tag_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Hashes written or found present lately, with the retention floor the store has them with
  // (writer thread only, hence not under mu_), oldest first in recent_order_.
  absl::flat_hash_map<Hash128, uint32_t> recent_;
  std::deque<Hash128> recent_order_;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_STORE_WRITER_H_
