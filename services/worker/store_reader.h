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
// over slices of the run: the bytes are copied once, from the received message into the pool). A
// value is taken only when the store's header names this pool's layout (KvBlockLayout::Tag), the
// block's token count and the model's fingerprint and its checksum holds; the first that fails ends
// the run, and the blocks after it go back to the pool. The request then carries the run as
// imported_blocks (the engine holds them until it admits the request). A store that is down, slow
// (past the client's deadline), or missing the blocks is a miss, never an error: the request is
// computed.
//
// The engine thread is never held: the reservation is answered on it, the reads run here, and the
// engine computes other requests meanwhile. On a prefill worker the imported blocks are pushed to
// the decode worker as soon as the request is admitted, while the rest of the prompt is computed
// (Engine's stream_kv progress at admission).
//
// Hybrid models: only the full-attention pool's blocks are read (the window layers are never
// stored; the engine rebuilds them: SWA replay).
//
// Bounded: max_queued reads wait at most (beyond: the request goes on without the store,
// counted skipped); a read takes at most max_blocks fresh blocks; a read that would start past
// the request's deadline is skipped.
//
// Threads: Read on any thread; `threads` reader threads run the reads and the callbacks. The
// destructor finishes the reads queued (their callbacks run) and joins.

#ifndef FERRY_SERVICES_WORKER_STORE_READER_H_
#define FERRY_SERVICES_WORKER_STORE_READER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/hash128.h"
#include "engine/engine.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/sim_timing.h"
#include "kvstore/client/kv_client.h"
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
  int64_t blocks = 0;       // read from the store into the request's imports
  int64_t bytes = 0;        // of them
  double seconds = 0;       // from the start of the read to the callback
  const char* result = "";  // hit, miss, memory (nothing beyond the worker's cache), skipped
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

 private:
  struct Task {
    EngineRequest request;
    absl::Time deadline;
    Done done;
    StoreHint hint;
  };
  void Loop();
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
  const Hash128 fingerprint_;
  WorkerMetrics* const metrics_;
  const StoreReaderOptions options_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_STORE_READER_H_
