#include "tools/calibrate/step_probe.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status.h"
#include "engine/engine.h"
#include "tools/calibrate/recording_model.h"

namespace ferry {
namespace {

// Prompt ids are drawn above the low ids where vocabularies keep their special tokens.
constexpr TokenId kFirstPromptToken = 256;
// Steps a drained engine may still take (finishing, releasing) before Drain gives up.
constexpr int kMaxIdleSteps = 100000;

std::string RowsText(absl::Span<const SimRow> rows) {
  return absl::StrJoin(rows, " ", [](std::string* out, const SimRow& r) {
    absl::StrAppend(out, "(", r.start, ",", r.tokens, ")");
  });
}

struct TimedStep {
  std::vector<SimRow> rows;
  double seconds = 0;          // the whole step, as the engine times it (StepInfo::seconds)
  double forward_seconds = 0;  // the model's Forward within it
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

ShapeTiming Summarize(const StepShape& shape, const std::vector<TimedStep>& steps) {
  ShapeTiming t;
  t.shape = shape;
  t.steps = static_cast<int>(steps.size());
  t.first_rows = steps.front().rows;
  std::vector<double> seconds, step_seconds;
  for (const TimedStep& s : steps) {
    seconds.push_back(s.forward_seconds);
    step_seconds.push_back(s.seconds);
    const StepTerms terms = StepTermsOf(s.rows);
    t.terms.prefill_tokens += terms.prefill_tokens / t.steps;
    t.terms.prefill_pairs += terms.prefill_pairs / t.steps;
    t.terms.decode += terms.decode / t.steps;
    t.terms.decode_rows += terms.decode_rows / t.steps;
    t.terms.decode_kv_tokens += terms.decode_kv_tokens / t.steps;
  }
  t.median_seconds = Median(seconds);
  t.min_seconds = *std::min_element(seconds.begin(), seconds.end());
  t.max_seconds = *std::max_element(seconds.begin(), seconds.end());
  t.median_step_seconds = Median(std::move(step_seconds));
  return t;
}

// One engine over the recording model, stepped on this thread.
class Driver {
 public:
  Driver(ForwardModel* model, KvBlockPool* pool, const Tokenizer* tokenizer)
      : recorder_(model), pool_(pool), tokenizer_(tokenizer), rng_(20240611) {}

  absl::Status Start(int64_t prefill_chunk, int64_t max_batch_tokens) {
    engine_.reset();  // its blocks go back first
    EngineOptions options;
    options.prefill_chunk = prefill_chunk;
    options.max_batch_tokens = max_batch_tokens;
    options.max_running = 256;
    // As a worker: the whole pool may cache (nothing is ever reused here: prompts are random).
    options.prefix_cache_bytes = pool_->num_blocks() * pool_->layout().block_bytes();
    options.on_step = [this](const StepInfo& info) {
      int calls = 0;
      double forward_seconds = 0;
      std::vector<SimRow> rows = recorder_.TakeRows(&calls, &forward_seconds);
      if (calls != 1) {
        bad_steps_ += 1;  // not one Forward per step: the batch is not known
        return;
      }
      steps_.push_back({std::move(rows), info.seconds, forward_seconds});
    };
    ASSIGN_OR_RETURN(engine_, Engine::Create(&recorder_, pool_, tokenizer_, options));
    return absl::OkStatus();
  }

  // Steps until the engine has nothing to do.
  absl::Status Drain() {
    for (int i = 0; i < kMaxIdleSteps; ++i) {
      ASSIGN_OR_RETURN(const bool worked, engine_->Step());
      if (!worked && !AnyLive()) return absl::OkStatus();
    }
    return absl::InternalError("the engine did not go idle");
  }

  absl::Status StepOnce() { return engine_->Step().status(); }

  // `count` tables of fresh blocks for `positions` positions each (Engine::Reserve).
  absl::StatusOr<std::vector<std::vector<BlockId>>> Reserve(int64_t count, int64_t positions) {
    // Shared with the callbacks, which may outlive this call when the engine does not run them.
    struct Pending {
      std::vector<std::vector<BlockId>> tables;
      absl::Status failed;
      int64_t done = 0;
    };
    auto pending = std::make_shared<Pending>();
    pending->tables.resize(count);
    for (int64_t i = 0; i < count; ++i) {
      engine_->Reserve({}, positions, [pending, i](absl::StatusOr<KvReservation> r) {
        ++pending->done;
        if (!r.ok()) {
          pending->failed.Update(r.status());
          return;
        }
        pending->tables[i] = std::move(r->blocks);
      });
    }
    for (int i = 0; i < 8 && pending->done < count; ++i) RETURN_IF_ERROR(StepOnce());
    if (pending->done < count) {
      return absl::InternalError("the engine did not run the reservations");
    }
    if (!pending->failed.ok()) {
      for (auto& t : pending->tables) {
        if (!t.empty()) RETURN_IF_ERROR(pool_->Release(t));
      }
      return pending->failed;
    }
    return std::move(pending->tables);
  }

  std::vector<TokenId> RandomPrompt(int64_t n) {
    const TokenId vocab = static_cast<TokenId>(recorder_.config().vocab_size);
    std::uniform_int_distribution<TokenId> token(std::min(kFirstPromptToken, vocab - 1), vocab - 1);
    std::vector<TokenId> prompt(n);
    for (TokenId& t : prompt) t = token(rng_);
    return prompt;
  }

  EngineRequest NewRequest(int64_t prompt_tokens, int64_t max_tokens) {
    EngineRequest r;
    r.id = absl::StrCat("calibrate-", next_id_++);
    r.prompt = RandomPrompt(prompt_tokens);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.seed = static_cast<uint64_t>(next_id_);
    r.on_event = [this](const TokenEvent& e) {
      if (e.finish == FinishReason::kError) errors_.push_back(e.error);
      if (e.finish != FinishReason::kNone) finished_.insert(e.request_id);
    };
    return r;
  }

  // A decode-only request on `blocks` (k positions), resumed after one token.
  EngineRequest DecodeRequest(int64_t k, std::vector<BlockId> blocks, int64_t max_tokens) {
    EngineRequest r = NewRequest(k, max_tokens);
    r.role = EngineRole::kDecodeOnly;
    ResumePoint p;
    p.generated = RandomPrompt(1);
    p.sampler_state.Observe(p.generated[0]);
    r.resume.push_back(std::move(p));
    r.imported_blocks = std::move(blocks);
    return r;
  }

  absl::Status Submit(EngineRequest r) {
    live_.push_back(r.id);
    return engine_->Submit(std::move(r));
  }

  void Abort(const std::string& id) { engine_->Abort(id); }

  bool Finished(const std::string& id) const { return finished_.contains(id); }

  // The steps since the last call; an error if any step failed or went unrecorded.
  absl::StatusOr<std::vector<TimedStep>> TakeSteps() {
    if (!errors_.empty()) {
      return absl::InternalError(absl::StrCat("a request failed: ", errors_[0]));
    }
    if (bad_steps_ > 0) {
      return absl::InternalError("a step ran the model more or less than once");
    }
    return std::exchange(steps_, {});
  }

  size_t steps_taken() const { return steps_.size(); }
  double last_step_seconds() const { return steps_.empty() ? 0 : steps_.back().seconds; }

 private:
  // Forgets the requests that ended.
  bool AnyLive() {
    live_.erase(std::remove_if(live_.begin(), live_.end(),
                               [&](const std::string& id) { return !engine_->IsLive(id); }),
                live_.end());
    return !live_.empty();
  }

  RecordingModel recorder_;
  KvBlockPool* const pool_;
  const Tokenizer* const tokenizer_;
  std::mt19937_64 rng_;
  std::unique_ptr<Engine> engine_;
  int64_t next_id_ = 0;
  std::vector<TimedStep> steps_;
  int bad_steps_ = 0;
  std::vector<std::string> errors_, live_;
  absl::flat_hash_set<std::string> finished_;
};

absl::Status Mismatch(const StepShape& shape, absl::Span<const SimRow> rows) {
  return absl::InternalError(absl::StrCat("meant ", shape.Label(), ", the engine ran the batch ",
                                          RowsText(rows), " (start, tokens)"));
}

// Prefill shapes: one step each of the row (start, n).
absl::Status MeasurePrefill(Driver& d, const StepPlan& plan,
                            const std::function<void(const ShapeTiming&)>& emit) {
  int64_t largest = 0;
  for (const auto& [n, start] : plan.prefill) largest = std::max(largest, n);
  RETURN_IF_ERROR(d.Start(largest, largest));
  // Warm-up: the largest batch once (the model's scratch grows to it), not counted.
  RETURN_IF_ERROR(d.Submit(d.NewRequest(largest, 1)));
  RETURN_IF_ERROR(d.Drain());
  RETURN_IF_ERROR(d.TakeSteps().status());
  std::vector<std::vector<TimedStep>> kept(plan.prefill.size());
  std::vector<double> spent(plan.prefill.size(), 0);
  for (int round = 0; round < plan.rounds + plan.prefill_extra_rounds; ++round) {
    bool any = false;
    for (size_t i = 0; i < plan.prefill.size(); ++i) {
      if (round >= plan.rounds && spent[i] >= plan.shape_seconds) continue;
      any = true;
      const auto [n, start] = plan.prefill[i];
      EngineRequest req = d.NewRequest(start + n, 1);
      if (start > 0) {
        ASSIGN_OR_RETURN(auto tables, d.Reserve(1, start));
        req.imported_blocks = std::move(tables[0]);
      }
      RETURN_IF_ERROR(d.Submit(std::move(req)));
      RETURN_IF_ERROR(d.Drain());
      ASSIGN_OR_RETURN(std::vector<TimedStep> steps, d.TakeSteps());
      if (steps.size() != 1 || steps[0].rows.size() != 1 || steps[0].rows[0].start != start ||
          steps[0].rows[0].tokens != n) {
        return Mismatch(StepShape{"prefill", 0, 0, n, start},
                        steps.empty() ? absl::Span<const SimRow>() : steps[0].rows);
      }
      spent[i] += steps[0].seconds;
      kept[i].push_back(std::move(steps[0]));
    }
    if (!any) break;
  }
  for (size_t i = 0; i < plan.prefill.size(); ++i) {
    emit(Summarize(StepShape{"prefill", 0, 0, plan.prefill[i].first, plan.prefill[i].second},
                   kept[i]));
  }
  return absl::OkStatus();
}

// b decode-only requests on k imported positions each, running `max_tokens` - 1 steps.
absl::StatusOr<std::vector<std::string>> StartDecodeBatch(Driver& d, int64_t b, int64_t k,
                                                          int64_t max_tokens) {
  ASSIGN_OR_RETURN(auto tables, d.Reserve(b, k));
  std::vector<std::string> ids;
  for (auto& table : tables) {
    EngineRequest r = d.DecodeRequest(k, std::move(table), max_tokens);
    ids.push_back(r.id);
    RETURN_IF_ERROR(d.Submit(std::move(r)));
  }
  return ids;
}

bool AllDecode(absl::Span<const SimRow> rows, int64_t b) {
  if (static_cast<int64_t>(rows.size()) != b) return false;
  for (const SimRow& r : rows) {
    if (r.tokens != 1) return false;
  }
  return true;
}

// Ends the decode batch `ids` and steps the engine idle; returns what it ran before.
absl::StatusOr<std::vector<TimedStep>> EndBatch(Driver& d, const std::vector<std::string>& ids) {
  for (const std::string& id : ids) d.Abort(id);
  ASSIGN_OR_RETURN(std::vector<TimedStep> steps, d.TakeSteps());
  RETURN_IF_ERROR(d.Drain());
  RETURN_IF_ERROR(d.TakeSteps().status());
  return steps;
}

absl::Status MeasureDecode(Driver& d, const StepPlan& plan,
                           const std::function<void(const ShapeTiming&)>& emit) {
  RETURN_IF_ERROR(d.Start(plan.mixed_chunk, plan.mixed_batch_tokens));
  std::vector<std::vector<TimedStep>> kept(plan.decode.size());
  const double round_seconds = plan.shape_seconds / std::max(1, plan.rounds);
  for (int round = 0; round < plan.rounds; ++round) {
    for (size_t i = 0; i < plan.decode.size(); ++i) {
      const auto [b, k] = plan.decode[i];
      const StepShape shape{"decode", b, k, 0, 0};
      // The resumed token, the admission step (not counted), then up to decode_max_steps.
      ASSIGN_OR_RETURN(std::vector<std::string> ids,
                       StartDecodeBatch(d, b, k, 2 + plan.decode_max_steps));
      RETURN_IF_ERROR(d.StepOnce());
      double spent = 0;
      int measured = 0;
      while (measured < plan.decode_max_steps &&
             (measured < plan.decode_steps || spent < round_seconds)) {
        const size_t before = d.steps_taken();
        RETURN_IF_ERROR(d.StepOnce());
        if (d.steps_taken() != before + 1) {
          return absl::InternalError(absl::StrCat(shape.Label(), ": a step ran no batch"));
        }
        spent += d.last_step_seconds();
        ++measured;
      }
      ASSIGN_OR_RETURN(std::vector<TimedStep> steps, EndBatch(d, ids));
      for (size_t s = 1; s < steps.size(); ++s) {  // [0]: the admission
        if (!AllDecode(steps[s].rows, b)) return Mismatch(shape, steps[s].rows);
        kept[i].push_back(std::move(steps[s]));
      }
    }
  }
  for (size_t i = 0; i < plan.decode.size(); ++i) {
    emit(
        Summarize(StepShape{"decode", plan.decode[i].first, plan.decode[i].second, 0, 0}, kept[i]));
  }
  return absl::OkStatus();
}

absl::Status MeasureMixed(Driver& d, const StepPlan& plan,
                          const std::function<void(const ShapeTiming&)>& emit) {
  RETURN_IF_ERROR(d.Start(plan.mixed_chunk, plan.mixed_batch_tokens));
  const int64_t chunks = (plan.mixed_prompt + plan.mixed_chunk - 1) / plan.mixed_chunk;
  // Per (b, k): the steps by the prompt chunk's start.
  std::vector<std::map<int64_t, std::vector<TimedStep>>> kept(plan.mixed.size());
  for (int round = 0; round < plan.rounds; ++round) {
    for (size_t i = 0; i < plan.mixed.size(); ++i) {
      const auto [b, k] = plan.mixed[i];
      const StepShape shape{"mixed", b, k, 0, 0};
      // Long enough for the prompt; ended once it is done.
      ASSIGN_OR_RETURN(std::vector<std::string> decoders,
                       StartDecodeBatch(d, b, k, 4 + chunks + 1));
      RETURN_IF_ERROR(d.StepOnce());  // their admission
      RETURN_IF_ERROR(d.TakeSteps().status());
      EngineRequest prompt = d.NewRequest(plan.mixed_prompt, 1);
      const std::string id = prompt.id;
      RETURN_IF_ERROR(d.Submit(std::move(prompt)));
      for (int64_t s = 0; s < chunks + 4 && !d.Finished(id); ++s) RETURN_IF_ERROR(d.StepOnce());
      if (!d.Finished(id)) return absl::InternalError("a mixed step's prompt did not finish");
      ASSIGN_OR_RETURN(std::vector<TimedStep> steps, EndBatch(d, decoders));
      for (TimedStep& s : steps) {
        std::vector<SimRow> decode_rows, prefill_rows;
        for (const SimRow& row : s.rows) {
          (row.tokens == 1 ? decode_rows : prefill_rows).push_back(row);
        }
        if (prefill_rows.size() != 1 || !AllDecode(decode_rows, b)) return Mismatch(shape, s.rows);
        kept[i][prefill_rows[0].start].push_back(std::move(s));
      }
    }
  }
  for (size_t i = 0; i < plan.mixed.size(); ++i) {
    for (const auto& [start, steps] : kept[i]) {
      int64_t n = 0;
      for (const SimRow& row : steps[0].rows) n = row.tokens > 1 ? row.tokens : n;
      emit(Summarize(StepShape{"mixed", plan.mixed[i].first, plan.mixed[i].second, n, start},
                     steps));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string StepShape::Label() const {
  if (kind == "prefill")
    return absl::StrCat("prefill n=", prefill_tokens, " start=", prefill_start);
  if (kind == "decode") return absl::StrCat("decode b=", decode_rows, " k=", decode_kv);
  return absl::StrCat("mixed b=", decode_rows, " k=", decode_kv, " + ", prefill_tokens, "@",
                      prefill_start);
}

StepPlan DefaultStepPlan(bool quick) {
  StepPlan p;
  if (quick) {
    p.prefill = {{16, 0}, {128, 0}, {512, 0}, {128, 2048}, {512, 1024}};
    p.decode = {{1, 64}, {1, 2048}, {8, 256}, {32, 64}, {32, 1024}};
    p.mixed = {{8, 256}};
    p.mixed_prompt = 512;
    p.rounds = 2;
    p.prefill_extra_rounds = 2;
    p.decode_steps = 2;
    p.decode_max_steps = 3;
    p.shape_seconds = 0.3;
    return p;
  }
  for (int64_t n : {16, 64, 256, 1024}) {
    for (int64_t start : {0, 1024, 4096}) p.prefill.push_back({n, start});
  }
  for (int64_t b : {1, 4, 16, 64}) {
    for (int64_t k : {64, 256, 1024, 4096}) {
      if (b * k <= 65536) p.decode.push_back({b, k});
    }
  }
  p.mixed = {{4, 256}, {16, 1024}, {64, 256}};
  return p;
}

std::string DescribeStepPlan(const StepPlan& plan) {
  auto range = [](const std::vector<std::pair<int64_t, int64_t>>& v, bool second) {
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const auto& p : v) {
      const int64_t x = second ? p.second : p.first;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    return lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "..", hi);
  };
  std::vector<std::string> parts;
  if (!plan.prefill.empty()) {
    parts.push_back(absl::StrCat("prefill rows of n=", range(plan.prefill, false),
                                 " new tokens after start=", range(plan.prefill, true)));
  }
  if (!plan.decode.empty()) {
    parts.push_back(absl::StrCat("decode batches of b=", range(plan.decode, false),
                                 " rows with k=", range(plan.decode, true), " KV tokens each"));
  }
  if (!plan.mixed.empty()) {
    parts.push_back(absl::StrCat("mixed steps of b=", range(plan.mixed, false),
                                 " decode rows (k=", range(plan.mixed, true), ") with a ",
                                 plan.mixed_prompt, "-token prompt chunked by ", plan.mixed_chunk,
                                 " (max_batch_tokens ", plan.mixed_batch_tokens, ")"));
  }
  return absl::StrJoin(parts, ", ");
}

int64_t KvBlocksNeeded(const StepPlan& plan, int32_t block_tokens) {
  auto blocks = [&](int64_t positions) { return (positions + block_tokens - 1) / block_tokens; };
  int64_t most = 0;
  for (const auto& [n, start] : plan.prefill) most = std::max(most, blocks(start + n));
  for (const auto& [b, k] : plan.decode) {
    most = std::max(most, b * blocks(k + plan.decode_max_steps + 2));
  }
  const int64_t chunks = (plan.mixed_prompt + plan.mixed_chunk - 1) / plan.mixed_chunk;
  for (const auto& [b, k] : plan.mixed) {
    most = std::max(most, b * blocks(k + 4 + chunks + 1) + blocks(plan.mixed_prompt));
  }
  return most + 2;
}

absl::StatusOr<std::vector<ShapeTiming>> MeasureStepShapes(
    ForwardModel* model, KvBlockPool* pool, const Tokenizer* tokenizer, const StepPlan& plan,
    const std::function<void(const ShapeTiming&)>& progress) {
  std::vector<ShapeTiming> out;
  auto emit = [&](ShapeTiming t) {
    if (progress) progress(t);
    out.push_back(std::move(t));
  };
  Driver d(model, pool, tokenizer);
  if (!plan.prefill.empty()) RETURN_IF_ERROR(MeasurePrefill(d, plan, emit));
  if (!plan.decode.empty()) RETURN_IF_ERROR(MeasureDecode(d, plan, emit));
  if (!plan.mixed.empty()) RETURN_IF_ERROR(MeasureMixed(d, plan, emit));
  return out;
}

}  // namespace ferry
