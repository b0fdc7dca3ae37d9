// Fuzz target for a router's pages as the planner reads them (router_view.h): the input is a
// GET /workers body and a GET /metrics body, split at the first NUL byte (all of it the /workers
// body without one). Either both parse, and the views merge into a snapshot whose counts are
// sane, or one is refused with a message; nothing crashes.

#include <cstddef>
#include <cstdint>
#include <string>

#include "services/planner/router_view.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string workers = input.substr(0, nul);
  const std::string metrics = nul == std::string::npos ? "" : input.substr(nul + 1);
  auto view = ferry::ParseRouterView(workers, metrics);
  if (!view.ok()) {
    if (view.status().message().empty()) __builtin_trap();  // a refusal always says why
    return 0;
  }
  const ferry::Snapshot snapshot = ferry::MergeRouterViews({*view, *view}, 1);
  size_t listed = 0;
  for (const ferry::PoolSample& pool : snapshot.pools) {
    listed += pool.workers.size();
    for (const ferry::WorkerSample& w : pool.workers) {
      if (w.id.empty() || w.running_requests < 0 || w.inflight < 0 || (w.ready && w.draining) ||
          w.busy_fraction < 0 || w.busy_fraction > 1) {
        __builtin_trap();
      }
      const double kv = ferry::KvUsedFraction(w);
      if (!(kv >= 0 && kv <= 1)) __builtin_trap();
    }
  }
  if (listed > view->workers.size()) __builtin_trap();  // the same view twice: each worker once
  if (snapshot.counters.requests != 2 * view->counters.requests) __builtin_trap();
  return 0;
}
