// The command-line flags that ferry-load and ferry-sim share, defined once: the workload
// (tools/load/workload.h: its kind and spec, the open loop's arrivals or load envelope
// (envelope.h), the seed) and the report's
// SLOs and prices (load_report.h). Each binary adds its own (where to send, how many clients, the
// cluster to simulate) and reads these through the functions below after absl::ParseCommandLine.
//
// The token space is not among them: the load tool's ids must be ordinary tokens of the served
// model's vocabulary (its own flags), the simulator's lie in its small simulated one.

#ifndef FERRY_TOOLS_LOAD_WORKLOAD_FLAGS_H_
#define FERRY_TOOLS_LOAD_WORKLOAD_FLAGS_H_

#include "absl/strings/string_view.h"
#include "tools/load/load_report.h"
#include "tools/load/workload.h"

namespace ferry {

// The workload the flags describe (tokens left at their default).
WorkloadOptions WorkloadOptionsFromFlags();
Slo SloFromFlags();
Prices PricesFromFlags();

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_WORKLOAD_FLAGS_H_
