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
  LoadOptions load;  // load.model "": the first model of GET {url}/v1/models
  WorkloadOptions workload;
  std::string tokenizer;  // api chat: a GGUF file or HF directory
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

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_LOAD_TOOL_H_
