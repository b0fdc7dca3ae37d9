#include "tools/sim/sim_worker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/common/status.h"

namespace ferry {

SimWorker::SimWorker(EventLoop* loop, SimWorkerOptions options)
    : loop_(loop), options_(std::move(options)), created_s_(loop->now()) {}

SimWorker::~SimWorker() {
  engine_.reset();  // before the pool and the model
}

absl::StatusOr<std::unique_ptr<SimWorker>> SimWorker::Create(EventLoop* loop, Backend* backend,
                                                             SimWorkerOptions options) {
  if (options.timing == nullptr)
    return absl::InvalidArgumentError("a simulated worker needs timing");
  std::unique_ptr<SimWorker> w(new SimWorker(loop, std::move(options)));
  const SimWorkerOptions& o = w->options_;
  NullModelOptions null;
  null.config.vocab_size = o.vocab_size;
  null.config.max_position_embeddings = 1 << 20;
  null.identity = Hash128{0x53494d, 1};  // "SIM": one identity for every simulated worker
  null.timing = o.timing;
  null.virtual_time = true;
  ASSIGN_OR_RETURN(w->model_, NullModel::Create(std::move(null)));
  const KvBlockLayout layout = w->model_->KvLayoutFor(o.block_tokens);
  const int64_t tokens = o.timing->KvTokens(o.kv_pool_bytes);
  const int64_t blocks = tokens / o.block_tokens;
  if (blocks < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.id, ": the KV pool holds fewer than 2 blocks of the calibrated model"));
  }
  w->allocator_ = std::make_unique<BackendKvAllocator>(backend);
  ASSIGN_OR_RETURN(w->pool_, KvBlockPool::Create(layout, blocks, w->allocator_.get(), backend));
  EngineOptions eo;
  eo.max_batch_tokens = o.max_batch_tokens;
  eo.prefill_chunk = o.prefill_chunk;
  eo.max_running = o.max_running;
  eo.max_queued = o.max_queued;
  eo.prefix_cache_bytes = blocks * static_cast<int64_t>(layout.block_bytes());
  eo.clock = loop;
  SimWorker* self = w.get();
  eo.on_step = [self](const StepInfo& info) {
    self->ran_model_ = true;
    self->last_prefill_tokens_ = info.prefill_tokens;
    self->last_decode_tokens_ = info.decode_tokens;
  };
  ASSIGN_OR_RETURN(w->engine_, Engine::Create(w->model_.get(), w->pool_.get(), nullptr, eo));
  return w;
}

template <typename T>
std::function<void(T)> SimWorker::AtStepEnd(std::function<void(T)> callback) {
  return [this, callback = std::move(callback)](T value) {
    auto shared = std::make_shared<std::decay_t<T>>(std::move(value));
    step_outputs_.push_back([callback, shared] { callback(std::move(*shared)); });
  };
}

absl::Status SimWorker::Submit(EngineRequest request) {
  if (request.on_event) {
    // One shared callback per request, and per event a copy of the event (no allocation of a
    // callback per token: a simulation's CPU goes mostly into its tokens).
    auto callback =
        std::make_shared<std::function<void(const TokenEvent&)>>(std::move(request.on_event));
    request.on_event = [this, callback](const TokenEvent& e) {
      step_events_.emplace_back(callback, e);
    };
  }
  RETURN_IF_ERROR(engine_->Submit(std::move(request)));
  Wake();
  return absl::OkStatus();
}

void SimWorker::Reserve(std::vector<Hash128> hashes, int64_t positions,
                        std::function<void(absl::StatusOr<KvReservation>)> done) {
  engine_->Reserve(std::move(hashes), positions,
                   AtStepEnd<absl::StatusOr<KvReservation>>(std::move(done)));
  Wake();
}

void SimWorker::ReserveImport(std::vector<Hash128> hashes, int64_t max_fresh,
                              std::function<void(absl::StatusOr<KvReservation>)> done) {
  engine_->ReserveImport(std::move(hashes), max_fresh,
                         AtStepEnd<absl::StatusOr<KvReservation>>(std::move(done)));
  Wake();
}

void SimWorker::ReleaseHandoff(const std::string& id) {
  engine_->ReleaseHandoff(id);
  Wake();
}

void SimWorker::Abort(const std::string& id) {
  engine_->Abort(id);
  Wake();
}

void SimWorker::Park(const std::string& id) {
  engine_->Park(id);
  Wake();
}

void SimWorker::Wake() {
  woken_ = true;
  if (stepping_) return;
  stepping_ = true;
  loop_->After(0, [this] { Step(); });
}

void SimWorker::Step() {
  woken_ = false;
  ran_model_ = false;
  auto worked = engine_->Step();
  CHECK_OK(worked.status());
  const double seconds = ran_model_ ? model_->last_forward_seconds() : 0;
  if (ran_model_) {
    ++steps_;
    busy_seconds_ += seconds;
  }
  std::vector<std::function<void()>> outputs;
  outputs.swap(step_outputs_);
  std::vector<std::pair<EventCallback, TokenEvent>> events;
  events.swap(step_events_);
  const bool more = *worked;
  const double end = loop_->now() + seconds;
  if (ran_model_) {
    window_.push_back(StepRecord{end, seconds, last_prefill_tokens_, last_decode_tokens_});
  }
  loop_->At(end, [this, outputs = std::move(outputs), events = std::move(events), more,
                  progressed = ran_model_] {
    for (const auto& [callback, event] : events) (*callback)(event);
    for (const auto& output : outputs) output();
    // Nothing runnable (waiting for blocks or news): idle until woken. A step that only
    // handled the inbox goes on at once, but never twice in a row without the model unless
    // something woke the worker meanwhile.
    if (woken_ || (more && (progressed || idle_steps_ == 0))) {
      idle_steps_ = progressed ? 0 : idle_steps_ + 1;
      Step();
    } else {
      idle_steps_ = 0;
      stepping_ = false;
    }
  });
}

void SimWorker::Report(KvIndex* index, int slot) {
  const EngineStats s = engine_->stats();
  load_.queued_requests = s.waiting;
  load_.running_requests = s.running;
  load_.queued_tokens = s.queued_tokens;
  load_.running_tokens = s.running_tokens;
  load_.free_blocks = s.free_blocks;
  load_.total_blocks = s.total_blocks;
  load_.cached_blocks = s.cached_blocks;
  ++load_.reports;
  const double now = loop_->now();
  while (!window_.empty() && window_.front().end < now - options_.load_window_s) {
    window_.pop_front();
  }
  double seconds = 0, prefill_seconds = 0, decode_seconds = 0;
  int64_t prefill = 0, decode = 0;
  for (const StepRecord& r : window_) {
    seconds += r.seconds;
    if (r.prefill_tokens > 0) {
      prefill += r.prefill_tokens;
      prefill_seconds += r.seconds;
    }
    if (r.decode_tokens > 0) {
      decode += r.decode_tokens;
      decode_seconds += r.seconds;
    }
  }
  if (!window_.empty()) load_.step_time_ms = 1e3 * seconds / static_cast<double>(window_.size());
  load_.prefill_tokens_per_second =
      prefill_seconds > 0 ? static_cast<double>(prefill) / prefill_seconds : 0;
  load_.decode_tokens_per_second =
      decode_seconds > 0 ? static_cast<double>(decode) / decode_seconds : 0;
  // Steps are recorded at their end, which may lie ahead of now (a step in flight).
  const double span = std::min(options_.load_window_s, now - created_s_);
  load_.busy_fraction = span > 0 ? std::clamp(seconds / span, 0.0, 1.0) : 0;
  // The cache's events since the last report, or a snapshot when they are gone.
  const KvEventJournal& journal = engine_->kv_events();
  std::vector<JournalEvent> events;
  if (!journal_synced_ || !journal.EventsAfter(journal_cursor_, size_t{1} << 20, &events)) {
    const JournalSnapshot snapshot = journal.Snapshot();
    index->Cleared(slot);
    index->Stored(slot, snapshot.hashes);
    index->Stored(slot, snapshot.window_hashes, /*window=*/true);
    journal_cursor_ = snapshot.sequence;
    journal_synced_ = true;
    return;
  }
  std::vector<Hash128> run;
  for (size_t i = 0; i < events.size();) {
    const KvCacheEvent::Kind kind = events[i].kind;
    const bool window = events[i].window;
    run.clear();
    for (; i < events.size() && events[i].kind == kind && events[i].window == window; ++i) {
      run.push_back(events[i].hash);
      journal_cursor_ = events[i].sequence;
    }
    if (kind == KvCacheEvent::Kind::kStored) {
      index->Stored(slot, run, window);
    } else {
      index->Evicted(slot, run, window);
    }
  }
}

}  // namespace ferry
