// How much of a prompt the shared KV store holds, for the prefix-aware policy's cost model
// (ARCHITECTURE.md §6: store_blocks_w x fetch_cost): one Exists call over the prompt's chain,
// off the HTTP threads (they must not block), before the request is dispatched.
//
// The store is an optimisation, and so is this: a probe that fails or times out (the client's
// per-RPC deadline) answers 0 blocks, one that finds its queue full answers nothing, and the
// request is routed on the workers' caches alone. Down store nodes are skipped without an RPC
// (kv_client.h). What a probe found travels with the request to the worker that reads the
// prefix (TokenizedRequest.store_hint), which then does not ask the store again.
//
// Threads: one probe thread; `done` runs there (or on the caller's thread when the queue is
// full or the probe is stopping). The destructor answers what is still queued with 0.
// Thread-safe.

#ifndef FERRY_ROUTER_DISPATCH_STORE_PROBE_H_
#define FERRY_ROUTER_DISPATCH_STORE_PROBE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/hash128.h"
#include "kvstore/client/kv_client.h"

namespace ferry {

class StoreProbe {
 public:
  // `max_queued`: probes waiting at most; more are answered 0 at once. `counted` (may be empty)
  // is called for each probe: true when the store was asked, false when it was skipped.
  StoreProbe(std::unique_ptr<kv::KvClient> client, int64_t max_queued = 256,
             std::function<void(bool asked)> counted = {});
  ~StoreProbe();

  // Calls done(leading blocks of `chain` the store holds) once; nullopt when the store was not
  // asked (the queue is full, or the probe stops).
  void Probe(std::vector<Hash128> chain, const Hash128& fingerprint,
             std::function<void(std::optional<int64_t>)> done);

 private:
  struct Item {
    std::vector<Hash128> chain;
    Hash128 fingerprint;
    std::function<void(std::optional<int64_t>)> done;
  };
  void Run();

  const std::unique_ptr<kv::KvClient> client_;
  const int64_t max_queued_;
  const std::function<void(bool)> counted_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_DISPATCH_STORE_PROBE_H_
