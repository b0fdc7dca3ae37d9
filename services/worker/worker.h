// A whole worker process in one object (what `ferry-worker`, `ferry-prefill` and
// `ferry-decode` run, and what tests start in-process): the engine (WorkerEngine), the
// ferry.v1.Worker service in its role with the standard gRPC health service on `address`, the
// admin HTTP server (/metrics /healthz /readyz), for the prefill and decode roles the KV
// transport (UCX, or the gRPC fallback) whose registered memory holds the KV pools, and with
// --kvstore the shared KV store's client, reader (prefill and aggregated roles) and writer.
//
//   auto worker = Worker::Start(options);          // loads the model, serves, ready
//   ... (*worker)->grpc_port(), (*worker)->admin_port()
//   (*worker)->Shutdown();                          // as on SIGTERM
//
// Shutdown (SIGTERM): not ready at once (readyz 503, health NOT_SERVING), no new Generate or
// Prefill is admitted, the Watch streams say DRAINING, running requests go on for drain_grace and
// are then handed off with their KV (WorkerService's drain), and once nothing runs and no KV waits
// (at most handoff_wait more) the Watch streams end and the gRPC server stops with rpc_grace for
// calls still in flight.
//
// Thread-safe.

#ifndef FERRY_SERVICES_WORKER_WORKER_H_
#define FERRY_SERVICES_WORKER_WORKER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvstore/client/kv_client.h"
#include "services/common/admin_server.h"
#include "services/common/dns_discovery.h"
#include "services/common/grpc_server.h"
#include "services/transfer/kv_transport.h"
#include "services/worker/load_window.h"
#include "services/worker/sim_link.h"
#include "services/worker/worker_engine.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_options.h"
#include "services/worker/worker_service.h"

namespace ferry {

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Start(const WorkerOptions& options);
  ~Worker();  // Shutdown()

  int grpc_port() const { return grpc_->port(); }
  int admin_port() const { return admin_->port(); }
  const std::string& address() const { return grpc_->address(); }
  WorkerEngine& engine() { return *engine_; }
  WorkerService& service() { return *service_; }

  // The drain step of the shutdown sequence, which ends with the gRPC server shut down (calls
  // still in flight get rpc_grace); returns by `deadline` + handoff_wait + a few seconds.
  void Drain(absl::Time deadline);
  // Drain(now + drain_grace), then the gRPC and admin servers stop. Idempotent.
  void Shutdown();

  GrpcServer& grpc() { return *grpc_; }
  AdminServer& admin() { return *admin_; }
  const WorkerOptions& options() const { return options_; }

 private:
  explicit Worker(const WorkerOptions& options) : options_(options) {}

  const WorkerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  // --auth_token_file, polled: every client and server of the worker holds a copy of its token.
  std::unique_ptr<SharedTokenSource> token_;
  // Prefill and decode roles. Destroyed after the servers stopped and the engine thread with
  // them, before the engine's pools (its last callbacks give blocks back to them).
  std::unique_ptr<transfer::KvTransport> transport_;
  // Prefill with --engine=sim: the link its pushes share. Destroyed after the transport (the
  // pushes' transport callbacks are over) and before the engine (its last callbacks end pushes,
  // which give blocks back).
  std::unique_ptr<SimLink> sim_link_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<LoadWindow> load_;
  // The KV store: the reader stops before the engine (its reads submit to it), the writer after
  // the engine thread (which offers it blocks) and before the pools (it holds blocks of them).
  std::unique_ptr<kv::KvClient> kv_client_;
  std::unique_ptr<DnsDiscovery> store_dns_;  // feeds kv_client_'s nodes (--kvstore_dns)
  std::unique_ptr<StoreReader> store_reader_;
  std::unique_ptr<StoreWriter> store_writer_;
  // The token streams: the engine thread flushes them after each pass, the service's calls send
  // on them; destroyed after both.
  std::unique_ptr<TokenStreams> token_streams_;
  // Destroyed in reverse: the servers, then the engine (whose last events reach live calls
  // through the service), then the service.
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<WorkerEngine> engine_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<AdminServer> admin_;
  bool shut_down_ = false;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_WORKER_H_
