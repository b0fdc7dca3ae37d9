// The worker's Watch streams (worker.proto WorkerStatus): any number of subscribers, each first
// sent a snapshot (identity, capacity, drain state, load, every cached block hash), then load
// updates at most once per `interval` while something changes, the prefix caches' stored /
// evicted events in order with their sequence numbers (KvEventJournal), and a heartbeat after
// `heartbeat` without a message. The worker knows no router: a subscriber is just a stream.
//
// Bounded per subscriber: at most one message in flight, built only when the previous one was
// written, of at most max_hashes_per_message hashes; a subscriber that falls so far behind that
// the journal no longer holds the events it has not seen gets a fresh snapshot instead of a
// backlog. A large snapshot is sent in parts (snapshot_continues).
//
// Threads: one ticker thread (which also refreshes the worker's gauges); writes continue on
// gRPC's callback threads. Thread-safe.

#ifndef FERRY_SERVICES_WORKER_WATCH_HUB_H_
#define FERRY_SERVICES_WORKER_WATCH_HUB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "services/worker/load_window.h"
#include "services/worker/worker_metrics.h"

namespace ferry {

struct WatchHubOptions {
  absl::Duration interval = absl::Milliseconds(100);
  absl::Duration heartbeat = absl::Seconds(1);
  size_t max_hashes_per_message = size_t{1} << 16;
};

class WatchCall;

class WatchHub {
 public:
  // `identity` holds the fields that never change (worker id, role, model, versions, capacity,
  // endpoint, incarnation, engine, load window); `drain_state` is asked for on every message.
  // `engine`, `load` and `metrics` must outlive the hub.
  WatchHub(const Engine* engine, LoadWindow* load, WorkerMetrics* metrics,
           ferry::v1::WorkerStatus identity, std::function<ferry::v1::DrainState()> drain_state,
           WatchHubOptions options);
  ~WatchHub();  // Shutdown()

  // A new subscriber (the caller checked its token).
  grpc::ServerWriteReactor<ferry::v1::WorkerStatus>* Subscribe(
      grpc::CallbackServerContext* context, const ferry::v1::WatchRequest* request);

  // Ends every stream now (UNAVAILABLE: the worker is going away; a stream stuck on a client
  // that does not read is cancelled) and refuses new ones. Returns when every stream is done.
  void Shutdown();

  // The load now, as a subscriber would get it.
  ferry::v1::WorkerLoad Load();
  int64_t subscribers() const;

 private:
  friend class WatchCall;

  void Run();
  void Remove(WatchCall* call);
  // Fills `status` with the next message for a subscriber at `cursor` (see WatchCall).
  const ferry::v1::WorkerStatus& identity() const { return identity_; }

  const Engine* const engine_;
  LoadWindow* const load_;
  WorkerMetrics* const metrics_;
  const ferry::v1::WorkerStatus identity_;
  const std::function<ferry::v1::DrainState()> drain_state_;
  const WatchHubOptions options_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::set<WatchCall*> calls_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ferry::v1::WorkerLoad load_now_ ABSL_GUARDED_BY(mu_);  // as of the last tick
  std::thread ticker_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_WATCH_HUB_H_
