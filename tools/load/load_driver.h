// Drives a workload (workload.h) against a running OpenAI-compatible server and records what
// each request saw (load_report.h's RequestRecord): the core of ferry-load.
//
// Each request is a streaming /v1/completions with the prompt as token ids (api "completions")
// or a /v1/chat/completions whose user message is the prompt decoded to text (api "chat"), with
// max_tokens, ignore_eos, temperature 0 and stream_options.include_usage. TTFT is the time to
// the first event that carries output, ITL the gaps between such events (events that arrive in
// one read get gaps of 0), the token counts and cached tokens come from the final usage chunk.
//
// Modes:
//   closed  `concurrency` users; each takes the next request (a session: all its turns, one
//           after the other's reply plus think time) as soon as its last one ended.
//   open    requests are sent at their arrival_s (Poisson: SetPoissonArrivals; a trace: its own
//           times); a later session turn at the latest of its arrival_s and its previous turn's
//           end plus think time. At most `max_inflight` are in flight; the rest wait in arrival
//           order, and each records how long it waited (queued_s).
//
// Sessions under api "chat" resend the real conversation: the earlier turns' user messages and
// the model's actual replies as assistant messages, then the turn's new tokens (decoded) as the
// next user message: what an agent does, and what lets a server's prefix cache reuse the
// previous output. Under "completions" a turn sends the workload's ids, where the previous reply
// is a stand-in of its length (workload.h), so only the previous prompt can be reused.
//
// One io_context thread runs everything (the HTTP client, the timers, the bookkeeping), so there
// is no locking; it holds hundreds of concurrent streams with a few percent of a core.
//
// Thread-compatible: RunLoad blocks its caller until every request has ended.

#ifndef FERRY_TOOLS_LOAD_LOAD_DRIVER_H_
#define FERRY_TOOLS_LOAD_LOAD_DRIVER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/token_id.h"
#include "tools/load/load_report.h"
#include "tools/load/workload.h"

namespace ferry {

struct LoadOptions {
  std::string url = "http://127.0.0.1:8000";  // the server's base URL (the API under /v1)
  std::string model;                          // the "model" of every request
  std::string api = "completions";            // "completions" or "chat"
  std::string mode = "closed";                // "closed" or "open"
  int concurrency = 8;                        // closed: users
  int max_inflight = 1024;                    // open: requests in flight at most
  absl::Duration request_timeout = absl::Minutes(5);
  bool ignore_eos = true;
  double temperature = 0;
  // A progress line to this stream every progress_interval (nullptr or 0: none).
  std::FILE* progress = nullptr;
  absl::Duration progress_interval = absl::Seconds(1);
};

// api "chat": the text of prompt ids.
using DecodeTokens = std::function<std::string(absl::Span<const TokenId>)>;

struct LoadRunResult {
  std::vector<RequestRecord> records;  // by request id
  double wall_s = 0;                   // the run's start to its last request's end
  int64_t connections_opened = 0;
  int64_t retries = 0;      // requests retried on a new connection (a stale kept-alive one)
  int64_t max_waiting = 0;  // open: requests waiting for a slot at once, at most
};

absl::Status ValidateLoadOptions(const LoadOptions& options);

// Runs `workload`; `decode` is needed for api "chat". A request that fails is recorded (ok false,
// error); the run itself fails only when it cannot start (bad options, an unresolvable host).
absl::StatusOr<LoadRunResult> RunLoad(const Workload& workload, const LoadOptions& options,
                                      const DecodeTokens& decode = nullptr);

// The JSON line of one record (ferry-load --records_out).
std::string RecordJson(const RequestRecord& record);

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_LOAD_DRIVER_H_
