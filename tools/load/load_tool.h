// ferry-load's whole job behind its flags (load_main.cc parses them into LoadToolOptions): ask
// the server for its model and (through the router's admin /workers) its GPUs when not told,
// build the workload, run it (load_driver.h), and print the report: the summary table, then one
// JSON line (SummaryJson plus the run's settings) as the last line of `out`; per-request JSON
// lines to records_out when given.
//
// Thread-compatible.

#ifndef FERRY_TOOLS_LOAD_LOAD_TOOL_H_
#define FERRY_TOOLS_LOAD_LOAD_TOOL_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "tools/load/load_driver.h"
#include "tools/load/load_report.h"
#include "tools/load/workload.h"

namespace ferry {

struct LoadToolOptions {
  LoadOptions load;                        // load.model "": the first model of GET {url}/v1/models
  std::string workload = "shared_prefix";  // "shared_prefix", "sessions" or "trace"
  SharedPrefixSpec shared_prefix;
  SessionSpec sessions;
  TraceSpec trace;
  TokenSpace tokens;
  // Open loop: Poisson arrivals of this many requests/s (0: the workload's own times, which only
  // a trace has).
  double rate = 0;
  std::string arrivals = "poisson";  // with rate: "poisson" or "constant" (gaps of 1 / rate)
  uint64_t seed = 1;                 // the Poisson arrivals'
  std::string tokenizer;             // api chat: a GGUF file or HF directory
  // GPUs of the served system (economics); 0: the workers GET {admin_url}/workers lists, or 1.
  int gpus = 0;
  std::string admin_url;
  Slo slo;
  Prices prices;
  std::string records_out;  // a file of one JSON line per request ("": none)
};

// Runs and reports; an error when the run could not start (the requests' own failures are in
// the report).
absl::Status RunLoadTool(LoadToolOptions options, std::FILE* out);

// The workload the options describe (seeded, arrivals set for the open loop).
absl::StatusOr<Workload> MakeWorkload(const LoadToolOptions& options);

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_LOAD_TOOL_H_
