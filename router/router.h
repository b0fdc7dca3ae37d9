// ferry-router in one object (ARCHITECTURE.md §1, §3, §6): the OpenAI-compatible HTTP front door
// (HttpServer + ApiCall), the worker registry (Watch streams), the routing policy, the dispatcher,
// and the admin port (/metrics, /healthz, /readyz, GET /workers, POST /workers/{id}/drain,
// POST /workers/reload). The router links the tokenizer and chat templates, never a compute
// backend.
//
//   auto router = Router::Start(options);   // listening; ready once a worker is up
//   ... (*router)->http_port(), (*router)->admin_port()
//   (*router)->Shutdown();                  // as on SIGTERM
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
// GET /v1/models/{id}. Every response carries x-request-id (the client's, when it sent a valid
// one, else one made here), which also goes to the workers and into every log line and error body
// of the request.
//
// Keys: with options.api_keys_file every /v1 request needs a key of a tenant (Authorization:
// Bearer, or x-api-key; else 401), its tenant's cache salt enters its block hashes and its rate
// limits apply (429 with Retry-After); ReloadKeys() reads the file again (SIGHUP), running
// streams untouched. The admin port's GET /billing reports tokens and revenue (billing.h).
//
// Workers: options.workers and those options.workers_file lists. ReloadWorkers() (SIGHUP, and
// POST /workers/reload on the admin port) reads the file again: workers it newly lists join, those
// it no longer lists get no new requests at once while the requests streaming from them go on
// (WorkerRegistry::SetWorkers); options.workers always stay.
//
// Readiness: /readyz is 200 while a worker can take requests (up, accepted, not draining) and the
// router is not shutting down.
// Shutdown: not ready at once, queued requests end 503, running streams get `shutdown_grace`,
// new requests on open connections get 503.
//
// Thread-safe.

#ifndef FERRY_ROUTER_ROUTER_H_
#define FERRY_ROUTER_ROUTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/router_options.h"

namespace ferry {

class Router {
 public:
  static absl::StatusOr<std::unique_ptr<Router>> Start(const RouterOptions& options);
  ~Router();  // Shutdown()

  int http_port() const;
  int admin_port() const;
  const std::string& model_id() const;

  // Reads the key file again; on an error the keys in use stay (and the error is returned).
  absl::Status ReloadKeys();
  // Reads options.workers_file again (see above); on an error (no such file, a bad line, a list
  // left empty) the workers in use stay and the error is returned. FailedPrecondition without a
  // workers file.
  absl::Status ReloadWorkers();

  // Idempotent; returns when every connection is closed.
  void Shutdown();

  class Impl;

 private:
  explicit Router(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_ROUTER_H_
