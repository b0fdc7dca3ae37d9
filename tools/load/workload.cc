#include "tools/load/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

// What a block of ids belongs to: blocks of different kinds never share ids.
enum BlockKind : uint64_t {
  kGroupSystem = 1,   // shared prefix: a group's system prompt
  kQuestion = 2,      // shared prefix: one request's question
  kSessionFirst = 3,  // sessions: turn 0's prompt
  kSessionReply = 4,  // sessions: the stand-in of a turn's reply
  kSessionTurn = 5,   // sessions: a later turn's new tokens
  kTraceBlock = 6,    // trace: one hash id
  kTraceLine = 7,     // trace: a line with no hash ids (its own ids)
};

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t BlockKey(BlockKind kind, uint64_t seed, uint64_t a, uint64_t b = 0) {
  uint64_t z = SplitMix64(kind);
  z = SplitMix64(z ^ seed);
  z = SplitMix64(z ^ a);
  return SplitMix64(z ^ b);
}

// Appends the first `n` ids of the block `key`: position j's id depends on (key, j) only, so a
// shorter block of the same key is a prefix of a longer one.
void AppendBlock(uint64_t key, int64_t n, const TokenSpace& space, std::vector<TokenId>* out) {
  const uint64_t range = std::max<TokenId>(1, space.token_range);
  for (int64_t j = 0; j < n; ++j) {
    out->push_back(space.token_base +
                   static_cast<TokenId>(SplitMix64(key + static_cast<uint64_t>(j)) % range));
  }
}

// The i-th draw of a stream, uniform in [0, 1).
double Uniform(uint64_t stream, uint64_t i) {
  return static_cast<double>(SplitMix64(SplitMix64(stream) ^ i) >> 11) * 0x1.0p-53;
}

}  // namespace

Workload MakeSharedPrefix(const SharedPrefixSpec& spec, const TokenSpace& space) {
  Workload w;
  w.kind = "shared_prefix";
  const int64_t groups = std::max<int64_t>(0, spec.groups);
  const int64_t per_group = std::max<int64_t>(0, spec.prompts_per_group);
  // Interleaved: prompt p of group g is request p * groups + g.
  for (int64_t p = 0; p < per_group; ++p) {
    for (int64_t g = 0; g < groups; ++g) {
      LoadRequest r;
      r.group = g;
      AppendBlock(BlockKey(kGroupSystem, spec.seed, static_cast<uint64_t>(g)), spec.system_tokens,
                  space, &r.prompt);
      AppendBlock(
          BlockKey(kQuestion, spec.seed, static_cast<uint64_t>(g), static_cast<uint64_t>(p)),
          spec.question_tokens, space, &r.prompt);
      r.max_tokens = std::max<int64_t>(1, spec.output_tokens);
      w.requests.push_back(std::move(r));
    }
  }
  if (spec.order == "random") {  // Fisher-Yates on the spec's own stream
    for (size_t i = w.requests.size(); i > 1; --i) {
      const size_t j = static_cast<size_t>(Uniform(spec.seed, i) * static_cast<double>(i));
      std::swap(w.requests[i - 1], w.requests[std::min(j, i - 1)]);
    }
  }
  for (size_t i = 0; i < w.requests.size(); ++i) w.requests[i].id = static_cast<int64_t>(i);
  w.note = absl::StrFormat(
      "shared prefix: %d groups x %d prompts, %d system + %d question tokens, %d output tokens, "
      "%s order",
      groups, per_group, spec.system_tokens, spec.question_tokens, spec.output_tokens, spec.order);
  return w;
}

Workload MakeSessions(const SessionSpec& spec, const TokenSpace& space) {
  Workload w;
  w.kind = "sessions";
  w.think_s = std::max(0.0, spec.think_s);
  const int64_t output = std::max<int64_t>(1, spec.output_tokens);
  for (int64_t s = 0; s < spec.sessions; ++s) {
    std::vector<TokenId> history;
    for (int64_t t = 0; t < spec.turns; ++t) {
      const uint64_t session = static_cast<uint64_t>(s), turn = static_cast<uint64_t>(t);
      if (t == 0) {
        AppendBlock(BlockKey(kSessionFirst, spec.seed, session), spec.first_tokens, space,
                    &history);
      } else {
        AppendBlock(BlockKey(kSessionReply, spec.seed, session, turn - 1), output, space, &history);
        AppendBlock(BlockKey(kSessionTurn, spec.seed, session, turn), spec.turn_tokens, space,
                    &history);
      }
      LoadRequest r;
      r.id = static_cast<int64_t>(w.requests.size());
      r.session = s;
      r.turn = static_cast<int>(t);
      r.prompt = history;
      r.max_tokens = output;
      w.requests.push_back(std::move(r));
    }
  }
  w.note = absl::StrFormat(
      "sessions: %d x %d turns, %d first tokens, then the previous reply's stand-in (%d) + %d "
      "new tokens a turn, %d output tokens, think %.3g s",
      spec.sessions, spec.turns, spec.first_tokens, output, spec.turn_tokens, output, w.think_s);
  return w;
}

absl::StatusOr<Workload> LoadTrace(const TraceSpec& spec, const TokenSpace& space) {
  constexpr int64_t kTraceBlockTokens = 512;
  if (spec.block_tokens <= 0) {
    return absl::InvalidArgumentError("trace: block_tokens must be positive");
  }
  if (spec.time_scale < 0) return absl::InvalidArgumentError("trace: time_scale must be >= 0");
  std::ifstream in(spec.path);
  if (!in) return absl::NotFoundError(absl::StrCat("trace: cannot open ", spec.path));
  Workload w;
  w.kind = "trace";
  std::string line;
  int64_t line_number = 0, read = 0;
  int64_t trace_input = 0, scaled_input = 0, asked = 0, sent = 0, capped = 0, zero_output = 0;
  double first_ms = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (spec.limit > 0 && read >= spec.limit) break;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace ", spec.path, " line ", line_number, ": ", what));
    };
    if (!j.is_object()) return bad("not a JSON object");
    for (const char* key : {"timestamp", "input_length", "output_length"}) {
      if (!j.contains(key) || !j[key].is_number() || j[key].get<double>() < 0) {
        return bad(absl::StrCat("'", key, "' must be a number >= 0"));
      }
    }
    std::vector<uint64_t> hash_ids;
    if (j.contains("hash_ids")) {
      if (!j["hash_ids"].is_array()) return bad("'hash_ids' must be a list");
      for (const auto& id : j["hash_ids"]) {
        if (!id.is_number_integer()) return bad("'hash_ids' must hold integers");
        hash_ids.push_back(id.get<uint64_t>());
      }
    }
    const double timestamp_ms = j["timestamp"].get<double>();
    const int64_t input = j["input_length"].get<int64_t>();
    const int64_t trace_output = j["output_length"].get<int64_t>();
    if (read == 0) first_ms = timestamp_ms;
    ++read;
    trace_input += input;

    LoadRequest r;
    r.arrival_s = std::max(0.0, timestamp_ms - first_ms) / 1000.0 * spec.time_scale;
    // Every hash id but the last is a full 512-token block; the last holds the rest of
    // input_length (1..512 tokens). Scaled: block_tokens ids a block, the last block
    // ceil(rest * block_tokens / 512).
    const auto scaled = [&](int64_t tokens) {
      return (tokens * spec.block_tokens + kTraceBlockTokens - 1) / kTraceBlockTokens;
    };
    if (hash_ids.empty()) {
      AppendBlock(BlockKey(kTraceLine, spec.seed, static_cast<uint64_t>(line_number)),
                  std::max<int64_t>(1, scaled(input)), space, &r.prompt);
    } else {
      const int64_t n = static_cast<int64_t>(hash_ids.size());
      const int64_t last =
          std::clamp<int64_t>(input - kTraceBlockTokens * (n - 1), 1, kTraceBlockTokens);
      for (int64_t b = 0; b < n; ++b) {
        AppendBlock(BlockKey(kTraceBlock, spec.seed, hash_ids[static_cast<size_t>(b)]),
                    b + 1 < n ? spec.block_tokens : scaled(last), space, &r.prompt);
      }
    }
    const int64_t prompt = static_cast<int64_t>(r.prompt.size());
    scaled_input += prompt;
    int64_t output = trace_output;
    if (output == 0) {
      output = 1;  // a request asks for one token at least
      ++zero_output;
    }
    asked += prompt + output;
    if (spec.max_output > 0 && output > spec.max_output) {
      output = spec.max_output;
      ++capped;
    }
    r.max_tokens = output;
    if (spec.max_context > 0 && prompt + output > spec.max_context) {
      ++w.dropped_requests;
      continue;
    }
    sent += prompt + output;
    r.id = static_cast<int64_t>(w.requests.size());
    w.requests.push_back(std::move(r));
  }
  w.cut_tokens = asked - sent;
  w.note = absl::StrFormat(
      "trace %s: %d requests read%s; block scale %d/512 (one hash id -> %d tokens: prompts "
      "%d -> %d tokens); time scale %.3g; %d dropped over max_context %d",
      spec.path, read, spec.limit > 0 ? absl::StrCat(" (limit ", spec.limit, ")") : "",
      spec.block_tokens, spec.block_tokens, trace_input, scaled_input, spec.time_scale,
      w.dropped_requests, spec.max_context);
  if (capped > 0) {
    absl::StrAppendFormat(&w.note, "; %d outputs capped at %d", capped, spec.max_output);
  }
  if (zero_output > 0) absl::StrAppendFormat(&w.note, "; %d zero outputs sent as 1", zero_output);
  absl::StrAppendFormat(&w.note, "; %d tokens cut", w.cut_tokens);
  return w;
}

void SetPoissonArrivals(Workload* workload, double rate, uint64_t seed) {
  double t = 0;
  uint64_t draw = 0;
  for (LoadRequest& r : workload->requests) {
    if (r.session >= 0 && r.turn > 0) {
      r.arrival_s = 0;
      continue;
    }
    if (rate <= 0) {
      r.arrival_s = 0;
      continue;
    }
    r.arrival_s = t;
    t += -std::log1p(-Uniform(seed, draw++)) / rate;  // exponential gap of mean 1 / rate
  }
}

void SetConstantArrivals(Workload* workload, double rate) {
  int64_t n = 0;
  for (LoadRequest& r : workload->requests) {
    const bool head = r.session < 0 || r.turn == 0;
    r.arrival_s = head && rate > 0 ? static_cast<double>(n++) / rate : 0;
  }
}

absl::StatusOr<Workload> MakeWorkload(const WorkloadOptions& o, bool open_loop) {
  Workload w;
  if (o.kind == "shared_prefix") {
    w = MakeSharedPrefix(o.shared_prefix, o.tokens);
  } else if (o.kind == "sessions") {
    w = MakeSessions(o.sessions, o.tokens);
  } else if (o.kind == "trace") {
    if (o.trace.path.empty()) return absl::InvalidArgumentError("workload trace needs --trace");
    ASSIGN_OR_RETURN(w, LoadTrace(o.trace, o.tokens));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown workload '", o.kind, "': shared_prefix, sessions or trace"));
  }
  if (o.envelope.active()) {
    if (!open_loop) return absl::InvalidArgumentError("--envelope needs the open loop");
    if (o.rate > 0) {
      return absl::InvalidArgumentError("--envelope sets the rate (--envelope_peak): drop --rate");
    }
    EnvelopeSpec envelope = o.envelope;
    envelope.arrivals = o.arrivals;
    envelope.seed = o.seed;
    RETURN_IF_ERROR(ApplyEnvelope(envelope, o.tokens, &w));
    return w;
  }
  if (open_loop) {
    if (o.rate > 0 && o.arrivals == "constant") {
      SetConstantArrivals(&w, o.rate);
      absl::StrAppend(&w.note, "; constant arrivals at ", o.rate, " req/s");
    } else if (o.rate > 0 && o.arrivals == "poisson") {
      SetPoissonArrivals(&w, o.rate, o.seed);
      absl::StrAppend(&w.note, "; Poisson arrivals at ", o.rate, " req/s");
    } else if (o.rate > 0) {
      return absl::InvalidArgumentError("--arrivals must be poisson or constant");
    } else if (w.kind != "trace") {
      return absl::InvalidArgumentError("the open loop needs --rate (or a trace's own times)");
    }
  }
  return w;
}

}  // namespace ferry
