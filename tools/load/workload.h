// Workloads for the load tool (ferry-load) and the discrete-event simulator (tools/sim): the
// requests to send, as token ids, so that prefix sharing is exact and independent of any
// tokenizer. Three kinds:
//   shared prefix  `groups` x `prompts_per_group` prompts: each group's system prompt of
//                  `system_tokens`, then a question of `question_tokens` of its own
//   sessions       multi-turn agent sessions: turn 1 is a prompt of `first_tokens`; each later
//                  turn resends the whole history (previous prompt, the previous reply, then
//                  `turn_tokens` new ones). The reply resent is the workload's own stand-in of
//                  the previous output length (the tool cannot know the model's reply as ids),
//                  so a turn reuses the previous prompt, not the previous output.
//   trace          a Mooncake-format trace (JSON lines: timestamp in ms, input_length,
//                  output_length, hash_ids of 512-token blocks; equal ids are equal blocks),
//                  with a time scale and a block scale (block_tokens: one id becomes this many
//                  tokens; 64 fits SmolLM2's 8k context).
// Token ids are drawn from [token_base, token_base + token_range) by SplitMix64 keyed on the
// block's identity (group, session, trace id), the spec's seed and the position, so equal blocks
// are equal ids (and another seed gives other ids: a second run on a warm stack with the same
// seed finds the first run's blocks cached).
//
// What the trace's scaling keeps and cuts: every hash id but a request's last is a full 512-token
// block and becomes `block_tokens` ids; the last holds the rest of input_length (1..512) and
// becomes ceil(rest * block_tokens / 512) ids, so prompts are block_tokens/512 of the trace's
// input lengths and equal ids stay equal blocks (64: one trace block is one KV block of a worker
// at --block_tokens 64). Output lengths are not scaled (0 is sent as 1; `max_output` caps them).
// Requests whose prompt + output exceed `max_context` are dropped. `cut_tokens` is what the scaled
// trace asked for (prompt + output of every request read) minus what the workload sends.
// Arrival times are the timestamps (ms) less the first one's, x time_scale.
//
// Thread-compatible values.

#ifndef FERRY_TOOLS_LOAD_WORKLOAD_H_
#define FERRY_TOOLS_LOAD_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/token_id.h"
#include "tools/load/envelope.h"

namespace ferry {

struct LoadRequest {
  int64_t id = 0;
  // Open loop: seconds after the start when it is sent (trace time, Poisson arrivals); a later
  // session turn is sent at the latest of this and its previous turn's end plus think time.
  double arrival_s = 0;
  int64_t session = -1;  // sessions: the session, and the turn (0, 1, ...) within it
  int turn = 0;
  int64_t group = -1;  // shared prefix: the group
  std::vector<TokenId> prompt;
  int64_t max_tokens = 1;  // the output length (sent with ignore_eos)
};

struct Workload {
  std::string kind;                   // "shared_prefix", "sessions", "trace"
  std::vector<LoadRequest> requests;  // by id; a session's turns in order
  // What the trace's scaling cut: requests dropped (over max_context) and tokens cut.
  int64_t dropped_requests = 0;
  int64_t cut_tokens = 0;
  std::string note;  // one line for the report (what was scaled or cut)
  // Sessions: seconds between a reply and the session's next turn (the spec's think_s).
  double think_s = 0;
};

struct TokenSpace {
  TokenId token_base = 1000;
  TokenId token_range = 20000;
};

struct SharedPrefixSpec {
  int64_t groups = 8;
  int64_t prompts_per_group = 16;
  int64_t system_tokens = 1024;
  int64_t question_tokens = 64;
  int64_t output_tokens = 32;
  // The order requests are issued in: "interleaved" (group 0, 1, ..., 0, 1, ...: every group
  // active at once) or "random" (shuffled by `seed`).
  std::string order = "random";
  uint64_t seed = 1;
};

struct SessionSpec {
  int64_t sessions = 8;
  int64_t turns = 4;
  int64_t first_tokens = 1024;
  int64_t turn_tokens = 64;
  int64_t output_tokens = 32;
  double think_s = 0;  // between a reply and the next turn
  uint64_t seed = 1;
};

struct TraceSpec {
  std::string path;
  double time_scale = 1.0;     // arrival times are multiplied by this (0.5: twice the rate)
  int64_t block_tokens = 64;   // tokens one 512-token hash id becomes (512: unscaled)
  int64_t max_context = 8192;  // prompt + output, after scaling; longer requests are dropped
  int64_t max_output = 0;      // > 0: output lengths capped here
  int64_t limit = 0;           // > 0: the first `limit` requests only
  // Mixed into every block's ids (0: the ids of the hash ids alone). Another seed gives other
  // ids for the same trace, so that a second run on a warm stack does not hit the first's cache.
  uint64_t seed = 0;
};

Workload MakeSharedPrefix(const SharedPrefixSpec& spec, const TokenSpace& space = {});
Workload MakeSessions(const SessionSpec& spec, const TokenSpace& space = {});
absl::StatusOr<Workload> LoadTrace(const TraceSpec& spec, const TokenSpace& space = {});

// A workload as its tools' flags describe it (workload_flags.h): the kind and its spec, the
// ids' space, and for the open loop the arrival process.
struct WorkloadOptions {
  std::string kind = "shared_prefix";  // "shared_prefix", "sessions" or "trace"
  SharedPrefixSpec shared_prefix;
  SessionSpec sessions;
  TraceSpec trace;
  TokenSpace tokens;
  // Open loop: arrivals of this many requests/s (0: the workload's own times, which only a
  // trace has), "poisson" (seeded) or "constant" (gaps of 1 / rate).
  double rate = 0;
  std::string arrivals = "poisson";
  uint64_t seed = 1;
  // Open loop: a day's shape over the workload (envelope.h), in place of `rate`; its arrivals and
  // seed are these options'.
  EnvelopeSpec envelope;
};

// The workload `options` describe; with `open_loop`, its arrival times set (by the envelope when
// it has a shape). InvalidArgument for an unknown kind or arrival process, a trace without a
// path, an open loop without a rate on a workload that has no times of its own, an envelope with
// a rate or in the closed loop.
absl::StatusOr<Workload> MakeWorkload(const WorkloadOptions& options, bool open_loop);

// Open loop: sets arrival_s of each request (turns after the first keep 0: they follow their
// session) as a Poisson process of `rate` requests/s from `seed`: the first at 0, then
// exponential gaps of mean 1 / rate, in id order. rate <= 0: every arrival at 0.
void SetPoissonArrivals(Workload* workload, double rate, uint64_t seed);
// The same with constant gaps of 1 / rate (a schedule with no sampling noise: two tools compared
// on it see the same offered load).
void SetConstantArrivals(Workload* workload, double rate);

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_WORKLOAD_H_
