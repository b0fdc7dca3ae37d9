// Reads the part of a request's prefix that the worker's memory lacks from the shared KV store,
// before the request goes to the engine (ARCHITECTURE.md §3 step 5): a prefill or aggregated
// worker reuses any earlier prefix, whoever computed it.
//
//   StoreReader reader(client, &engine, &pool, fingerprint, metrics, {});
//   reader.Read(std::move(request), deadline, [](EngineRequest r, const StoreRead& read) {
//     if (!engine.Submit(r).ok()) StoreReader::ReleaseImports(pool, r);
//   });
//
// One read, on a reader thread: the prompt's chained block hashes (its full blocks before the last
// token); how many of them the engine's cache holds (a hint from its journal); how many the store
// holds: the router's probe of the same chain, when the request carries it (StoreHint: no second
// existence check on the request path; the store may have evicted a block since, which is then a
// miss and computed), else one Exists over the rest; then Engine::ReserveImport for the longest
// present run (the cached prefix with a reference each, fresh blocks for the rest), and Gets of
// those keys straight into the fresh blocks' memory (KvClient::GetInto, `streams` calls at once
// over slices of the run; the two paths below). A value is taken only when the store's header
// names this pool's layout (KvBlockLayout::Tag), the block's token count and the model's
// fingerprint and its checksum holds; the first that fails ends the run, and the blocks after it
// go back to the pool (but those a failed node may still write: below). The request then
// carries the run as imported_blocks (the engine holds them until it admits the request). A store
// that is down, slow (past the client's deadline), or missing the blocks is a miss, never an
// error: the request is computed.
//
// The engine thread is never held: the reservation is answered on it, the reads run here, and the
// engine computes other requests meanwhile. On a prefill worker the imported blocks are pushed to
// the decode worker as soon as the request is admitted, while the rest of the prompt is computed
// (Engine's stream_kv progress at admission).
//
// Two paths into the blocks' host memory (KvStaging::Import: the blocks themselves on host memory,
// else a staging area's slots, committed into the blocks, a GPU's, once the read is over). With
// the worker's KV transport (options.transport, that memory registered with it:
// TransportKvAllocator), each Get carries a descriptor of it (the region, one block slice per
// key) and a node whose own transport is of that kind puts the values straight into it from its
// staging memory, the stream carrying headers only (path "transport"); a node without one answers
// so and sends the bytes in the stream, copied once from the received message (path "stream",
// also the path without a transport). A read counts as transport when any of its blocks came that
// way. A staging area without room for a read skips it (the request is computed).
//
// Memory a peer may still write never goes back to the free list: a node that failed during a
// descriptor read may still have puts in flight into the blocks of the keys it did not complete
// (GetIntoResult::unsettled), until the client's deadline plus the node transport's cancel
// grace. Those blocks are quarantined here for options.unsettled_quarantine from the read's end,
// then given back to the pool (the read itself is a miss from that block on, and the request is
// computed; counted as unsettled blocks).
//
// Hybrid models: only the full-attention pool's blocks are read (the window layers are never
// stored; the engine rebuilds them: SWA replay).
//
// Bounded: max_queued reads wait at most (beyond: the request goes on without the store,
// counted skipped); a read takes at most max_blocks fresh blocks; a read that would start past
// the request's deadline is skipped.
//
// Threads: Read on any thread; `threads` reader threads run the reads and the callbacks, and
// give quarantined blocks back when their time is up. The destructor finishes the reads queued
// (their callbacks run), waits out the quarantines (bounded by unsettled_quarantine) and joins.

#ifndef FERRY_SERVICES_WORKER_STORE_READER_H_
#define FERRY_SERVICES_WORKER_STORE_READER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "engine/engine.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/kv/kv_staging.h"
#include "engine/model/sim_timing.h"
#include "kvstore/client/kv_client.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/transfer_wire.h"
#include "services/worker/worker_metrics.h"

namespace ferry {

struct StoreReaderOptions {
  int threads = 2;
  // Get calls one read splits its blocks over, run at once (a node serves each on a thread of its
  // own, so its disk reads and sends overlap: 4 read 90 MB 1.6x as fast as 1 here).
  int streams = 4;
  size_t max_queued = 256;
  int64_t max_blocks = 0;  // fresh blocks per read (0: half the pool)
  // How long a read waits for the engine's reservation (the engine answers at its next step).
  absl::Duration reserve_timeout = absl::Seconds(10);
  // The simulated engine (--engine=sim): a read that loads T tokens' blocks completes no earlier
  // than sim_timing->StoreReadSeconds(T) after it started (the reader thread waits; bounded by
  // the request's deadline). Null: real time only.
  std::shared_ptr<const SimTiming> sim_timing;
  // Host access to the pool's blocks (must outlive the reader); null: the pool in place (its
  // memory must be host memory).
  KvStaging* staging = nullptr;
  // The worker's KV transport and the registration of the blocks' host memory with it (the
  // region holding the staging's region()); null: every read comes in the Get streams. Must
  // outlive the reader.
  const transfer::KvTransport* transport = nullptr;
  transfer::RegionDescriptor pool_region;
  // How long blocks a failed node's puts may still reach stay out of the pool, from the end of
  // the read: at least the KV client's per-RPC deadline plus the node transport's cancel grace.
  absl::Duration unsettled_quarantine = absl::Seconds(2);
  // Times the quarantine (null: the real clock; tests drive a FakeClock). Must outlive the reader.
  Clock* clock = nullptr;
};

// What the router's KV store probe found of the prompt's chain (TokenizedRequest.store_hint): of
// its first `probed` blocks, the store held the first `prefix`. probed < 0: the router did not
// ask (the reader does).
struct StoreHint {
  int64_t probed = -1;
  int64_t prefix = 0;
};

// What one read did.
struct StoreRead {
  int64_t blocks = 0;         // read from the store into the request's imports
  int64_t bytes = 0;          // of them
  bool by_transport = false;  // some of them put into the blocks by the node's KV transport
  int64_t quarantined = 0;    // blocks held back from the pool: a failed node may still write them
  double seconds = 0;         // from the start of the read to the callback
  const char* result = "";    // hit, miss, memory (nothing beyond the worker's cache), skipped
};

class StoreReader {
 public:
  using Done = std::function<void(EngineRequest request, const StoreRead& read)>;

  // `client`, `engine`, `pool` (the engine's full-attention pool) and `metrics` must outlive the
  // reader.
  StoreReader(kv::KvClient* client, Engine* engine, KvBlockPool* pool, const Hash128& fingerprint,
              WorkerMetrics* metrics, const StoreReaderOptions& options);
  ~StoreReader();
  StoreReader(const StoreReader&) = delete;
  StoreReader& operator=(const StoreReader&) = delete;

  // Reads what the store has of `request`'s prefix into request.imported_blocks, then runs
  // `done` once with the request, on a reader thread (or on this one, when the read is skipped:
  // a full queue). `done` submits the request or gives its imports back (ReleaseImports).
  void Read(EngineRequest request, absl::Time deadline, Done done, StoreHint hint = {});

  // Gives a request's imported blocks back to `pool` (a request the engine did not take).
  static void ReleaseImports(KvBlockPool& pool, EngineRequest& request);

  // Blocks held back from the pool now, once those whose time is up went back (for tests and
  // metrics).
  int64_t quarantined_blocks();
  // Whether reads offer the store the worker's KV transport (a descriptor of their blocks).
  bool by_transport() const { return destination_.has_value(); }

 private:
  struct Task {
    EngineRequest request;
    absl::Time deadline;
    Done done;
    StoreHint hint;
  };
  // Blocks that may still be written until `until` (on clock_->Monotonic()).
  struct Quarantine {
    absl::Duration until;
    std::vector<BlockId> blocks;
    std::shared_ptr<KvHostBlocks> landing;  // the read's host memory, written as well
  };
  void Loop();
  // Gives back the quarantined blocks whose time is up; returns how long until the next one's is
  // (or InfiniteDuration).
  absl::Duration ReleaseQuarantined() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t QuarantinedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The descriptor of `spans` (fresh blocks of the pool) for the worker's transport.
  transfer::PeerDescriptor Describe(absl::Span<const MemorySpan> spans) const;
  // The read itself; fills request.imported_blocks.
  StoreRead Run(EngineRequest& request, absl::Time deadline, const StoreHint& hint);
  // The leading blocks of `chain` the store holds, from the hint where it answers that, else
  // asked from the first block the engine's cache lacks (`local`).
  int64_t StorePrefix(absl::Span<const Hash128> chain, int64_t local, const StoreHint& hint);
  // Engine::ReserveImport, waited for here; an error when it did not answer in time.
  absl::StatusOr<KvReservation> Reserve(std::vector<Hash128> hashes, int64_t max_fresh);

  kv::KvClient* const client_;
  Engine* const engine_;
  KvBlockPool* const pool_;
  std::unique_ptr<KvStaging> own_staging_;  // without options.staging
  KvStaging* staging_;
  const Hash128 fingerprint_;
  WorkerMetrics* const metrics_;
  const StoreReaderOptions options_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<Quarantine> quarantine_ ABSL_GUARDED_BY(mu_);
  // Kind, address and the pool's region: what every read's descriptor starts from; none
  // without a transport.
  std::optional<transfer::PeerDescriptor> destination_;
  std::atomic<bool> logged_transport_{false}, logged_stream_{false};  // the first read by each
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_STORE_READER_H_
