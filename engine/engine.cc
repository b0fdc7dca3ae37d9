#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/common/block_hash.h"
#include "engine/common/log.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/stop_strings.h"

namespace ferry {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kHandoff:
      return "handoff";
  }
  return "?";
}

struct Engine::Request {
  EngineRequest r;
  PromptTokenSet prompt_set;
  Hash128 root;                   // of the block-hash chain (model, tenant salt)
  bool fork_pending = false;      // choices 1..n-1 start from choice 0's prompt
  std::vector<TokenId> stop_ids;  // stop_token_ids and (unless ignore_eos) the eos ids, sorted
  int64_t live = 0;               // sequences not finished
  bool admitted_once = false;
  bool handed_off = false;           // prefill-only: its KV is held in handoffs_
  int64_t cached_prompt_tokens = 0;  // at the first admission
  // Imports: the blocks held until the first admission (r.imported_blocks, emptied then), and
  // of the cached prompt tokens, how many they supplied.
  std::vector<BlockId> pinned;
  int64_t imported_tokens = 0;
  int64_t replayed_tokens = 0;  // at the first admission
  // Its KV is an approximation (a bounded replay; or imported so): never cached or offered.
  bool approximate = false;
  int64_t window_floor = 0;     // the window layers' first key (a bounded replay's start)
  absl::Duration submitted_at;  // clock_->Monotonic() at Submit
  absl::Duration queued;        // submitted_at to the first admission
};

struct Engine::Sequence {
  std::shared_ptr<Request> req;
  int32_t choice = 0;
  int64_t arrival = 0;
  int64_t prompt_len = 0;
  std::vector<TokenId> tokens;  // prompt + generated
  int64_t computed = 0;         // positions whose KV is in `blocks`
  std::vector<BlockId> blocks;
  // With a window pool: the window layers' table, indexed like `blocks`; entries before
  // window_begin are kNoBlock (given back or never held).
  std::vector<BlockId> window_blocks;
  int64_t window_begin = 0;
  int64_t window_cached = 0;  // of window_blocks, offered to the window cache
  bool admitted = false;
  bool finished = false;
  std::vector<Hash128> hashes;  // of full blocks of `tokens`, as far as computed
  int64_t cached_blocks = 0;    // of `hashes`, offered to the prefix cache
  int64_t offer_from = 0;       // blocks from here on are computed here (on_computed_blocks)
  // A window replay (SWA replay): positions before replay_end leave the full-attention KV as it
  // is; the window layers see no key before window_floor.
  int64_t replay_end = 0;
  int64_t window_floor = 0;
  Replay admission;  // the latest admission's cached prefix (for the first's accounting)
  SamplerState state;
  StopStringMatcher stop{{}};
  std::unique_ptr<IncrementalDetokenizer> detok;
  int64_t step_chunk = 0;       // tokens scheduled in the current step
  int64_t reported_blocks = 0;  // stream_kv: in the latest progress event

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  // Rank: lower runs first (higher priority, then earlier arrival).
  std::tuple<int64_t, int64_t, int32_t> rank() const {
    return {-static_cast<int64_t>(req->r.priority), arrival, choice};
  }
};

namespace {

void ReleaseTable(KvBlockPool& pool, std::vector<BlockId>& table) {
  std::vector<BlockId> held;
  for (BlockId b : table) {
    if (b != kNoBlock) held.push_back(b);
  }
  CHECK(pool.Release(held).ok());
  table.clear();
}

// The positions a decode-only request's imported KV covers: the prompt and the generated tokens
// but the last (whose KV its first step computes). Validated requests only.
int64_t DecodeOnlyPositions(const EngineRequest& r) {
  return static_cast<int64_t>(r.prompt.size() + r.resume[0].generated.size()) - 1;
}

}  // namespace

int64_t Engine::WindowBlocksPerSequence(const ForwardModel& model, const EngineOptions& options,
                                        int32_t block_tokens) {
  // During a step a sequence holds the blocks from the one with the first key its first new row
  // sees (window - 1 positions back) to the one of its last new row: at most
  // ceil((window - 2 + chunk) / block_tokens) + 1.
  const int64_t chunk = std::min(options.prefill_chunk, options.max_batch_tokens);
  const int64_t span = std::max<int64_t>(0, model.max_window() - 2 + chunk);
  return (span + block_tokens - 1) / block_tokens + 1;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(ForwardModel* model, KvBlockPool* pool,
                                                       const Tokenizer* tokenizer,
                                                       const EngineOptions& options,
                                                       KvBlockPool* window_pool) {
  if (options.max_batch_tokens < 1 || options.max_running < 1 || options.prefill_chunk < 1 ||
      options.max_n < 1 || options.max_queued < 1 || options.prefix_cache_bytes < 0 ||
      options.window_cache_bytes < 0 || options.swa_replay_tokens < 1 ||
      options.window_cache_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("engine options must be positive");
  }
  const int32_t bt = pool->layout().block_tokens;
  if (window_pool == nullptr) {
    if (!SameKvLayout(model->KvLayoutFor(bt), pool->layout())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the KV pool's layout (", pool->layout().DebugString(),
                       ") is not the model's (", model->KvLayoutFor(bt).DebugString(), ")"));
    }
  } else {
    if (model->FullKvLayoutFor(bt).num_layers == 0) {
      return absl::InvalidArgumentError(
          "a window pool needs a model with both sliding-window and full-attention layers");
    }
    if (!SameKvLayout(model->FullKvLayoutFor(bt), pool->layout()) ||
        !SameKvLayout(model->WindowKvLayoutFor(bt), window_pool->layout())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the KV pools' layouts (", pool->layout().DebugString(), "; ",
                       window_pool->layout().DebugString(), ") are not the model's (",
                       model->FullKvLayoutFor(bt).DebugString(), "; ",
                       model->WindowKvLayoutFor(bt).DebugString(), ")"));
    }
    const int64_t need = WindowBlocksPerSequence(*model, options, bt);
    if (window_pool->num_blocks() < need) {
      return absl::InvalidArgumentError(absl::StrCat("the window pool (", window_pool->num_blocks(),
                                                     " blocks) cannot hold one sequence's window (",
                                                     need, " blocks)"));
    }
  }
  return std::unique_ptr<Engine>(new Engine(model, pool, tokenizer, options, window_pool));
}

Engine::Engine(ForwardModel* model, KvBlockPool* pool, const Tokenizer* tokenizer,
               const EngineOptions& options, KvBlockPool* window_pool)
    : model_(model),
      pool_(pool),
      tokenizer_(tokenizer),
      options_(options),
      window_pool_(window_pool),
      clock_(options.clock != nullptr ? options.clock : &RealClock()),
      block_tokens_(pool->layout().block_tokens),
      cache_(pool, options.prefix_cache_bytes),
      journal_(options.journal_events) {
  if (window_pool_ != nullptr) {
    // A prefix is of use only as far as its window layers' blocks are cached too: the journal
    // reports both (KvEventJournal).
    window_cache_ = std::make_unique<PrefixCache>(window_pool_, options.window_cache_bytes);
    window_cache_->SetTtl(options.window_cache_ttl, clock_);
  }
  eos_ids_ = model_->config().eos_token_ids;
  if (tokenizer_ != nullptr && tokenizer_->eos_id().has_value() &&
      *tokenizer_->eos_id() < static_cast<TokenId>(model_->config().vocab_size)) {
    eos_ids_.push_back(*tokenizer_->eos_id());
  }
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
  // Blocks given back by other threads (a service releasing a reservation) wake a waiting loop.
  auto wake = [this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_freed_ = true;
    }
    wake_.notify_one();
  };
  pool_->SetFreeListener(wake);
  if (window_pool_ != nullptr) window_pool_->SetFreeListener(wake);
  published_.total_blocks = pool_->num_blocks();
  published_.free_blocks = pool_->num_free();
}

Engine::~Engine() {
  Stop();
  DrainInbox();
  for (auto& seq : seqs_) {
    if (!seq->finished) Finish(*seq, FinishReason::kAbort, TokenEvent{});
  }
  RemoveFinished();
  for (auto& [id, handoff] : handoffs_) ReleaseHandoffBlocks(handoff);
  pool_->SetFreeListener(nullptr);
  if (window_pool_ != nullptr) window_pool_->SetFreeListener(nullptr);
}

absl::Status Engine::Validate(const EngineRequest& r) const {
  const int64_t vocab = model_->config().vocab_size;
  if (r.id.empty()) return absl::InvalidArgumentError("request id is empty");
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (TokenId t : r.prompt) {
    if (t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", t, " is outside the vocabulary (", vocab, ")"));
    }
  }
  if (static_cast<int64_t>(r.prompt.size()) >= model_->max_positions()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", r.prompt.size(),
                                                   " tokens leaves no room in the model's ",
                                                   model_->max_positions(), " positions"));
  }
  if (pool_->layout().BlocksFor(static_cast<int64_t>(r.prompt.size()) + 1) > pool_->num_blocks()) {
    return absl::InvalidArgumentError("prompt is larger than the whole KV pool");
  }
  if (r.n < 1 || r.n > options_.max_n) {
    return absl::InvalidArgumentError(absl::StrCat("n must be in [1, ", options_.max_n, "]"));
  }
  if (r.max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be >= 1");
  if (r.min_tokens < 0 || r.min_tokens > r.max_tokens) {
    return absl::InvalidArgumentError("min_tokens must be in [0, max_tokens]");
  }
  if (absl::Status s = r.sampling.Validate(vocab); !s.ok()) return s;
  for (TokenId t : r.stop_token_ids) {
    if (t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token ", t, " is outside the vocabulary"));
    }
  }
  for (TokenId t : r.keep_special_token_ids) {
    if (t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("kept special token ", t, " is outside the vocabulary"));
    }
  }
  if (!r.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError("stop strings need an engine with a tokenizer");
  }
  if (absl::Status s = StopStringMatcher::Validate(r.stop); !s.ok()) return s;
  if (static_cast<int64_t>(r.resume.size()) > r.n) {
    return absl::InvalidArgumentError("resume lists more choices than n");
  }
  std::vector<bool> resumed(r.n, false);
  for (const ResumePoint& p : r.resume) {
    if (p.choice < 0 || p.choice >= r.n || resumed[p.choice]) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume: choice ", p.choice, " is outside [0, n) or listed twice"));
    }
    resumed[p.choice] = true;
    if (p.sampler_state.generated() != static_cast<int64_t>(p.generated.size())) {
      return absl::InvalidArgumentError("resume: sampler state and tokens disagree");
    }
    for (const auto& [token, count] : p.sampler_state.counts()) {
      if (token >= vocab) return absl::InvalidArgumentError("resume: counted token out of range");
    }
    for (TokenId t : p.generated) {
      if (t >= vocab) return absl::InvalidArgumentError("resume: token out of range");
    }
    if (static_cast<int64_t>(p.generated.size()) >= r.max_tokens) {
      return absl::InvalidArgumentError("resume: max_tokens already reached");
    }
  }
  if (r.role == EngineRole::kDecodeOnly) {
    if (r.resume.empty()) {
      return absl::InvalidArgumentError(
          "decode-only requests resume each choice they run after its first token");
    }
    for (const ResumePoint& p : r.resume) {
      if (p.generated.empty() || (r.resume.size() > 1 && p.generated.size() != 1)) {
        return absl::InvalidArgumentError(
            "decode-only requests resume each choice after its first token (several choices "
            "share the prompt's KV: after exactly one)");
      }
    }
    const int64_t positions = DecodeOnlyPositions(r);
    if (static_cast<int64_t>(r.imported_blocks.size()) != pool_->layout().BlocksFor(positions)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decode-only: ", r.imported_blocks.size(), " imported blocks do not cover the ",
          positions, " positions of the prompt and the generated tokens but the last"));
    }
    for (BlockId b : r.imported_blocks) {
      if (b < 0 || b >= pool_->num_blocks() || pool_->ref_count(b) < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("decode-only: imported block ", b, " is not an allocated block"));
      }
    }
    if (window_pool_ != nullptr) {
      if (r.imported_window_blocks.size() != r.imported_blocks.size()) {
        return absl::InvalidArgumentError(
            "decode-only: the window layers' imported table does not cover the prompt");
      }
      // Present from the block the next row (at `positions`) sees, or the window floor's;
      // before it, optional.
      const int64_t first = std::max(FirstWindowBlock(positions), r.window_floor / block_tokens_);
      for (size_t i = 0; i < r.imported_window_blocks.size(); ++i) {
        const BlockId b = r.imported_window_blocks[i];
        if (b == kNoBlock && static_cast<int64_t>(i) < first) continue;
        if (b < 0 || b >= window_pool_->num_blocks() || window_pool_->ref_count(b) < 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("decode-only: imported window block ", b, " is not an allocated block"));
        }
      }
    } else if (!r.imported_window_blocks.empty()) {
      return absl::InvalidArgumentError("imported window blocks need an engine with a window pool");
    }
    if (r.window_floor < 0 || r.window_floor > positions) {
      return absl::InvalidArgumentError("decode-only: window floor outside the imported positions");
    }
    if (r.window_floor > 0 && window_pool_ == nullptr) {
      return absl::InvalidArgumentError("a window floor needs an engine with a window pool");
    }
  } else {
    if (!r.imported_window_blocks.empty() || r.window_floor != 0 || r.approximate_kv) {
      return absl::InvalidArgumentError(
          "imported window blocks, a window floor and approximate KV are for decode-only "
          "requests");
    }
    // Imports: leading full blocks of the prompt, never the one with its last token.
    const int64_t most = (static_cast<int64_t>(r.prompt.size()) - 1) / block_tokens_;
    if (static_cast<int64_t>(r.imported_blocks.size()) > most) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.imported_blocks.size(), " imported blocks: the prompt of ", r.prompt.size(),
          " tokens has ", most, " full blocks before its last token"));
    }
    if (r.imported_cached_blocks < 0 ||
        r.imported_cached_blocks > static_cast<int64_t>(r.imported_blocks.size())) {
      return absl::InvalidArgumentError("imported_cached_blocks outside [0, imported blocks]");
    }
    for (BlockId b : r.imported_blocks) {
      if (b < 0 || b >= pool_->num_blocks() || pool_->ref_count(b) < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("imported block ", b, " is not an allocated block"));
      }
    }
  }
  if (r.role == EngineRole::kPrefillOnly && r.resume.size() > 1) {
    return absl::InvalidArgumentError(
        "a prefill-only request resumes at most one choice (choices with output of their own "
        "have KV of their own)");
  }
  return absl::OkStatus();
}

absl::Status Engine::Submit(EngineRequest request) {
  if (absl::Status s = Validate(request); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t queued = static_cast<int64_t>(submitted_.size()) + published_waiting_requests_;
    if (queued >= options_.max_queued) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the engine's queue is full (", options_.max_queued, " requests wait for admission)"));
    }
    if (!live_ids_.insert(request.id).second) {
      return absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is already live"));
    }
    submitted_tokens_ += static_cast<int64_t>(request.prompt.size());
    submitted_.push_back(Submitted{std::move(request), clock_->Monotonic()});
  }
  wake_.notify_one();
  return absl::OkStatus();
}

bool Engine::IsLive(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_ids_.contains(id);
}

void Engine::Reserve(std::vector<Hash128> hashes, int64_t positions,
                     std::function<void(absl::StatusOr<KvReservation>)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    PendingReservation r;
    r.hashes = std::move(hashes);
    r.positions = positions;
    r.done = std::move(done);
    reservations_.push_back(std::move(r));
  }
  wake_.notify_one();
}

void Engine::ReserveImport(std::vector<Hash128> hashes, int64_t max_fresh,
                           std::function<void(absl::StatusOr<KvReservation>)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    PendingReservation r;
    r.hashes = std::move(hashes);
    r.import = true;
    r.max_fresh = max_fresh;
    r.done = std::move(done);
    reservations_.push_back(std::move(r));
  }
  wake_.notify_one();
}

void Engine::ClearPrefixCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    clear_cache_ = true;
  }
  wake_.notify_one();
}

void Engine::Abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.push_back(id);
  }
  wake_.notify_one();
}

void Engine::ReleaseHandoff(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_.push_back(id);
  }
  wake_.notify_one();
}

void Engine::Park(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    parked_.push_back(id);
  }
  wake_.notify_one();
}

bool Engine::ParkRequest(const std::string& id) {
  Sequence* only = nullptr;
  int64_t live = 0;
  for (auto& seq : seqs_) {
    if (seq->finished || seq->req->r.id != id) continue;
    ++live;
    only = seq.get();
  }
  if (live == 0) return true;  // finished, aborted, or never here
  Sequence& seq = *only;
  const bool parkable = live == 1 && seq.req->r.n == 1 && !seq.req->fork_pending &&
                        seq.req->r.role != EngineRole::kPrefillOnly && seq.admitted &&
                        static_cast<int64_t>(seq.tokens.size()) > seq.prompt_len &&
                        seq.computed == static_cast<int64_t>(seq.tokens.size()) - 1 &&
                        handoffs_.find(id) == handoffs_.end();
  if (!parkable) return false;  // not yet (prefilling, preempted), or never (several choices)
  // The table covers the computed positions; a block reserved ahead for the next one goes back.
  const int64_t keep = pool_->layout().BlocksFor(seq.computed);
  std::vector<BlockId> spare;
  while (static_cast<int64_t>(seq.blocks.size()) > keep) {
    spare.push_back(seq.blocks.back());
    seq.blocks.pop_back();
  }
  if (!spare.empty()) ReleaseTable(*pool_, spare);
  if (window_pool_ != nullptr && static_cast<int64_t>(seq.window_blocks.size()) > keep) {
    std::vector<BlockId> spare_window(seq.window_blocks.begin() + keep, seq.window_blocks.end());
    seq.window_blocks.resize(keep);
    ReleaseTable(*window_pool_, spare_window);
  }
  seq.req->handed_off = true;
  handoffs_[id] = Handoff{std::move(seq.blocks), std::move(seq.window_blocks),
                          clock_->Monotonic() + options_.handoff_ttl};
  seq.blocks.clear();
  seq.window_blocks.clear();
  TokenEvent event;
  event.request_id = id;
  event.choice = seq.choice;
  Finish(seq, FinishReason::kHandoff, std::move(event));
  return true;
}

void Engine::DrainInbox() {
  std::deque<Submitted> submitted;
  std::vector<std::string> aborted, released, parked;
  std::vector<PendingReservation> reservations;
  bool clear = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    submitted.swap(submitted_);
    submitted_tokens_ = 0;
    aborted.swap(aborted_);
    released.swap(released_);
    parked.swap(parked_);
    reservations.swap(reservations_);
    std::swap(clear, clear_cache_);
    blocks_freed_ = false;
    // Until RemoveFinished publishes again, the queue bound counts these as waiting.
    published_waiting_requests_ += static_cast<int64_t>(submitted.size());
  }
  for (Submitted& s : submitted) AddRequest(std::move(s.r), s.at);
  for (const std::string& id : aborted) {
    for (auto& seq : seqs_) {
      if (!seq->finished && seq->req->r.id == id) Finish(*seq, FinishReason::kAbort, TokenEvent{});
    }
    DropHandoff(id);
  }
  for (const std::string& id : released) DropHandoff(id);
  // Parks what can be parked now; the rest is tried again at the next step.
  // (A copy: a request's end takes it out of parking_.)
  parking_.insert(parked.begin(), parked.end());
  const std::vector<std::string> parking(parking_.begin(), parking_.end());
  for (const std::string& id : parking) {
    if (ParkRequest(id)) parking_.erase(id);
  }
  ExpireHandoffs();
  if (window_cache_ != nullptr) stats_.window_expired_blocks += window_cache_->Expire();
  if (clear) EvictAllCached();
  for (PendingReservation& r : reservations) RunReservation(r);
  RemoveFinished();
}

bool Engine::DropHandoff(const std::string& id) {
  auto it = handoffs_.find(id);
  if (it == handoffs_.end()) return false;
  ReleaseHandoffBlocks(it->second);
  handoffs_.erase(it);
  released_ids_.push_back(id);
  return true;
}

void Engine::ExpireHandoffs() {
  if (handoffs_.empty()) return;
  const absl::Duration now = clock_->Monotonic();
  std::vector<std::string> expired;
  for (const auto& [id, handoff] : handoffs_) {
    if (handoff.expires <= now) expired.push_back(id);
  }
  for (const std::string& id : expired) {
    LOG(WARNING) << "handoff of request " << id << " not released within "
                 << absl::FormatDuration(options_.handoff_ttl) << ": its blocks are freed";
    DropHandoff(id);
  }
}

void Engine::EvictAllCached() {
  cache_.Evict(cache_.blocks());
  if (window_cache_ != nullptr) window_cache_->Evict(window_cache_->blocks());
}

bool Engine::MakeRoom(KvBlockPool* pool, PrefixCache* cache, int64_t n) {
  while (pool->num_free() < n) {
    if (cache->Evict(n - pool->num_free()) == 0) return false;
  }
  return true;
}

void Engine::RunReservation(PendingReservation& r) {
  KvReservation out;
  if (r.import) {
    // The full-attention pool only: the cached prefix, then as many fresh blocks as may be had.
    out.blocks = cache_.Lookup(absl::MakeConstSpan(r.hashes));
    out.cached_blocks = static_cast<int64_t>(out.blocks.size());
    int64_t fresh = std::min<int64_t>(static_cast<int64_t>(r.hashes.size()) - out.cached_blocks,
                                      std::max<int64_t>(0, r.max_fresh));
    while (pool_->num_free() < fresh && cache_.Evict(fresh - pool_->num_free()) > 0) {
    }
    fresh = std::min(fresh, pool_->num_free());
    if (fresh <= 0 && out.cached_blocks < static_cast<int64_t>(r.hashes.size())) {
      ReleaseTable(*pool_, out.blocks);
      r.done(absl::ResourceExhaustedError(absl::StrCat("no KV block is free to import into (",
                                                       pool_->num_blocks(), " blocks, ",
                                                       cache_.blocks(), " cached)")));
      return;
    }
    auto blocks = pool_->Allocate(fresh);
    CHECK(blocks.ok());
    out.blocks.insert(out.blocks.end(), blocks->begin(), blocks->end());
    r.done(std::move(out));
    return;
  }
  const int64_t total = pool_->layout().BlocksFor(r.positions);
  // The prefix blocks must leave at least one position to compute (as Admit's).
  const int64_t full = std::min<int64_t>(static_cast<int64_t>(r.hashes.size()),
                                         std::max<int64_t>(0, r.positions - 1) / block_tokens_);
  TakeCachedPrefix(absl::MakeConstSpan(r.hashes), full, &out.blocks, &out.window_blocks);
  out.cached_blocks = static_cast<int64_t>(out.blocks.size());
  const int64_t fresh = total - out.cached_blocks;
  // The window layers need blocks only from the one the next row (at `positions`) sees; the
  // cached prefix's window blocks come along, the entries between stay kNoBlock.
  const int64_t window_from =
      window_pool_ == nullptr ? total
                              : std::max<int64_t>(out.cached_blocks, FirstWindowBlock(r.positions));
  const int64_t window_fresh = total - window_from;
  bool ok = r.positions >= 0 && total <= pool_->num_blocks() && MakeRoom(pool_, &cache_, fresh);
  if (ok && window_pool_ != nullptr) {
    ok = window_fresh <= window_pool_->num_blocks() &&
         MakeRoom(window_pool_, window_cache_.get(), window_fresh);
  }
  absl::StatusOr<std::vector<BlockId>> blocks = std::vector<BlockId>{};
  absl::StatusOr<std::vector<BlockId>> window = std::vector<BlockId>{};
  if (ok) blocks = pool_->Allocate(fresh);
  if (ok && blocks.ok() && window_pool_ != nullptr) window = window_pool_->Allocate(window_fresh);
  if (!ok || !blocks.ok() || !window.ok()) {
    if (blocks.ok()) CHECK(pool_->Release(*blocks).ok());
    ReleaseTable(*pool_, out.blocks);
    if (window_pool_ != nullptr) ReleaseTable(*window_pool_, out.window_blocks);
    r.done(absl::ResourceExhaustedError(
        absl::StrCat("the KV pool cannot reserve ", total, " blocks now (", pool_->num_free(),
                     " of ", pool_->num_blocks(), " free, ", cache_.blocks(), " cached)")));
    return;
  }
  out.blocks.insert(out.blocks.end(), blocks->begin(), blocks->end());
  if (window_pool_ != nullptr) {
    out.window_blocks.resize(window_from, kNoBlock);
    out.window_blocks.insert(out.window_blocks.end(), window->begin(), window->end());
  }
  r.done(std::move(out));
}

void Engine::AddRequest(EngineRequest r, absl::Duration submitted_at) {
  auto req = std::make_shared<Request>();
  req->r = std::move(r);
  req->submitted_at = submitted_at;
  const EngineRequest& er = req->r;
  req->prompt_set.insert(er.prompt.begin(), er.prompt.end());
  req->root = RootBlockHash({model_->fingerprint(), er.cache_salt, ""});
  req->stop_ids = er.stop_token_ids;
  if (!er.ignore_eos) req->stop_ids.insert(req->stop_ids.end(), eos_ids_.begin(), eos_ids_.end());
  std::sort(req->stop_ids.begin(), req->stop_ids.end());
  req->stop_ids.erase(std::unique(req->stop_ids.begin(), req->stop_ids.end()), req->stop_ids.end());
  const int64_t arrival = arrivals_++;
  if (er.role == EngineRole::kDecodeOnly) {
    req->approximate = er.approximate_kv;
    req->window_floor = er.window_floor;
  } else if (!er.imported_blocks.empty()) {
    // Imports: offered to the prefix cache now (hashes already cached keep their blocks), held
    // until the first admission.
    const int64_t k = static_cast<int64_t>(er.imported_blocks.size());
    std::vector<Hash128> hashes;
    for (int64_t i = 0; i < k; ++i) {
      hashes.push_back(NextBlockHash(
          i == 0 ? req->root : hashes.back(),
          absl::MakeConstSpan(er.prompt).subspan(i * block_tokens_, block_tokens_), {}));
    }
    cache_.Insert(hashes, er.imported_blocks);
    req->pinned = std::move(req->r.imported_blocks);
    req->r.imported_blocks.clear();
  }
  // Without resume points choice 0 starts and the others fork from its first token.
  req->fork_pending = er.resume.empty() && er.n > 1;
  std::vector<const ResumePoint*> points;
  for (const ResumePoint& p : er.resume) points.push_back(&p);
  if (points.empty()) points.push_back(nullptr);
  for (const ResumePoint* resume : points) {
    auto seq = NewSequence(req, resume != nullptr ? resume->choice : 0, arrival);
    if (resume != nullptr) {
      const ResumePoint& p = *resume;
      seq->tokens.insert(seq->tokens.end(), p.generated.begin(), p.generated.end());
      seq->state = p.sampler_state;
      // Held text from before min_tokens could not stop (Deliver's may_stop).
      seq->stop.Restore(p.held_text, seq->generated() > er.min_tokens);
      // The detokenizer sees the delivered tokens again; their text was delivered already.
      if (seq->detok != nullptr) {
        for (TokenId t : p.generated) seq->detok->Push(t).IgnoreError();
      }
    }
    if (er.role == EngineRole::kDecodeOnly) {
      if (resume == points[0]) {  // the imported references become this choice's
        seq->blocks = er.imported_blocks;
        seq->window_blocks = er.imported_window_blocks;
        seq->computed = DecodeOnlyPositions(er);
        seq->admitted = true;
      } else {
        // The others share them (each after one token: the prompt's KV). Without a block for
        // the partial one's copy, a choice recomputes when it is admitted.
        ShareKv(er.imported_blocks, er.imported_window_blocks, seq->prompt_len, *seq);
      }
      // The imported positions were computed elsewhere: only blocks completed here are offered.
      seq->offer_from = seq->computed / block_tokens_;
      if (seq->admitted) seq->window_floor = er.window_floor;
      req->admitted_once = true;
    }
    ++req->live;
    seqs_.push_back(std::move(seq));
  }
}

bool Engine::Reserve(Sequence& seq, int64_t positions, std::vector<Sequence*>& scheduled) {
  // Both tables grow alike (the window table's entries before the window are kNoBlock).
  const int64_t need =
      pool_->layout().BlocksFor(positions) - static_cast<int64_t>(seq.blocks.size());
  if (need <= 0) return true;
  auto short_of = [&](KvBlockPool* pool) {
    return pool == nullptr ? 0 : std::max<int64_t>(0, need - pool->num_free());
  };
  while (short_of(pool_) > 0 || short_of(window_pool_) > 0) {
    int64_t evicted = 0;
    if (short_of(pool_) > 0) evicted += cache_.Evict(short_of(pool_));
    if (short_of(window_pool_) > 0) evicted += window_cache_->Evict(short_of(window_pool_));
    if (evicted > 0) continue;
    // Imports held for requests that wait behind `seq` become evictable.
    if (UnpinWaiting(&seq)) continue;
    // Preempt the admitted sequence ranked last, if it ranks after `seq`.
    Sequence* victim = nullptr;
    for (auto& s : seqs_) {
      if (s->admitted && !s->finished && s.get() != &seq && s->rank() > seq.rank() &&
          (victim == nullptr || s->rank() > victim->rank())) {
        victim = s.get();
      }
    }
    if (victim == nullptr) {
      // Last, the imports of requests ranked before `seq` that still wait.
      if (UnpinWaiting(nullptr)) continue;
      return false;
    }
    scheduled.erase(std::remove(scheduled.begin(), scheduled.end(), victim), scheduled.end());
    Preempt(*victim);
  }
  auto more = pool_->Allocate(need);
  CHECK(more.ok());
  seq.blocks.insert(seq.blocks.end(), more->begin(), more->end());
  if (window_pool_ != nullptr) {
    auto window = window_pool_->Allocate(need);
    CHECK(window.ok());
    seq.window_blocks.insert(seq.window_blocks.end(), window->begin(), window->end());
  }
  return true;
}

void Engine::ReleaseBlocks(Sequence& seq) {
  ReleaseTable(*pool_, seq.blocks);
  cache_.TrimToCap();
  if (window_pool_ != nullptr) {
    ReleaseTable(*window_pool_, seq.window_blocks);
    window_cache_->TrimToCap();
  }
  seq.window_begin = 0;
}

void Engine::ReleaseHandoffBlocks(Handoff& handoff) {
  ReleaseTable(*pool_, handoff.blocks);
  if (window_pool_ != nullptr) ReleaseTable(*window_pool_, handoff.window_blocks);
}

void Engine::Preempt(Sequence& seq) {
  ReleaseBlocks(seq);
  seq.computed = 0;
  seq.replay_end = 0;
  seq.window_floor = 0;
  seq.admitted = false;
  ++stats_.preemptions;
}

void Engine::Unpin(Request& req) {
  if (req.pinned.empty()) return;
  CHECK(pool_->Release(req.pinned).ok());
  req.pinned.clear();
  cache_.TrimToCap();
}

bool Engine::UnpinWaiting(const Sequence* than) {
  Sequence* worst = nullptr;
  for (auto& s : seqs_) {
    if (s->finished || s->req->admitted_once || s->req->pinned.empty()) continue;
    if (than != nullptr && (s->req == than->req || !(s->rank() > than->rank()))) continue;
    if (worst == nullptr || s->rank() > worst->rank()) worst = s.get();
  }
  if (worst == nullptr) return false;
  const int64_t loaded =
      static_cast<int64_t>(worst->req->pinned.size()) - worst->req->r.imported_cached_blocks;
  stats_.unused_imported_blocks += std::max<int64_t>(0, loaded);
  Unpin(*worst->req);
  return true;
}

int64_t Engine::FirstWindowBlock(int64_t position) const {
  return std::max<int64_t>(0, position + 1 - model_->max_window()) / block_tokens_;
}

int64_t Engine::Admit(Sequence& seq) {
  // Hashes of the full blocks of everything but the last token (at least one token is computed
  // to get logits), then the longest cached prefix of them.
  const int64_t full = (static_cast<int64_t>(seq.tokens.size()) - 1) / block_tokens_;
  while (static_cast<int64_t>(seq.hashes.size()) < full) {
    const int64_t i = static_cast<int64_t>(seq.hashes.size());
    const Hash128 parent = i == 0 ? seq.req->root : seq.hashes.back();
    seq.hashes.push_back(NextBlockHash(
        parent, absl::MakeConstSpan(seq.tokens).subspan(i * block_tokens_, block_tokens_), {}));
  }
  Replay replay;
  TakeCachedPrefix(absl::MakeConstSpan(seq.hashes), full, &seq.blocks, &seq.window_blocks, &replay);
  seq.admission = replay;
  const int64_t cached = static_cast<int64_t>(seq.blocks.size()) * block_tokens_;
  seq.computed = cached;
  seq.replay_end = 0;
  seq.window_floor = 0;
  if (replay.end > 0) {
    // The window layers are rebuilt from replay.from; the full-attention KV is the cache's.
    seq.computed = replay.from;
    seq.replay_end = replay.end;
    seq.window_floor = replay.from;
    if (replay.approximate) seq.req->approximate = true;
  }
  if (window_pool_ != nullptr) {
    // Window blocks a replay rebuilds are never cached (the first of them may hold positions no
    // replay made exact).
    seq.window_begin = FirstWindowBlock(seq.computed);
    seq.window_cached = static_cast<int64_t>(seq.blocks.size());
  }
  seq.cached_blocks = static_cast<int64_t>(seq.blocks.size());
  seq.offer_from = seq.cached_blocks;
  stats_.cached_tokens += cached;
  seq.admitted = true;
  return cached;
}

void Engine::FirstAdmission(Sequence& seq, int64_t cached) {
  Request& req = *seq.req;
  req.admitted_once = true;
  req.cached_prompt_tokens = std::min(cached, seq.prompt_len);
  req.queued = clock_->Monotonic() - req.submitted_at;
  // The imports it used: prefix blocks that are the very blocks it brought from elsewhere.
  const int64_t prefix = std::min<int64_t>(cached / block_tokens_, req.pinned.size());
  int64_t used = 0;
  for (int64_t i = req.r.imported_cached_blocks; i < prefix; ++i) {
    if (seq.blocks[i] == req.pinned[i]) ++used;
  }
  const int64_t loaded = static_cast<int64_t>(req.pinned.size()) - req.r.imported_cached_blocks;
  req.imported_tokens = used * block_tokens_;
  stats_.imported_tokens += req.imported_tokens;
  stats_.unused_imported_blocks += std::max<int64_t>(0, loaded - used);
  Unpin(req);
  const Replay& a = seq.admission;
  if (a.end > 0) {
    req.replayed_tokens = a.end - a.from;
    stats_.replayed_tokens += req.replayed_tokens;
    ++stats_.window_replays;
    if (a.approximate) req.window_floor = a.from;
  } else if (window_pool_ != nullptr && a.longest > 0) {
    ++(a.windowed == a.longest ? stats_.window_hits : stats_.window_misses);
  }
}

void Engine::TakeCachedPrefix(absl::Span<const Hash128> hashes, int64_t full,
                              std::vector<BlockId>* blocks, std::vector<BlockId>* window_blocks,
                              Replay* replay) {
  full = std::min<int64_t>(full, static_cast<int64_t>(hashes.size()));
  if (window_pool_ == nullptr) {
    *blocks = cache_.Lookup(hashes.subspan(0, full));
    return;
  }
  // k cached blocks are of use when the window cache also holds the window layers' blocks
  // that the row after them (at k * block_tokens) sees: blocks [FirstWindowBlock, k).
  int64_t longest = 0;
  while (longest < full && cache_.Contains(hashes[longest])) ++longest;
  auto window_cached = [&](int64_t k) {
    for (int64_t i = FirstWindowBlock(k * block_tokens_); i < k; ++i) {
      if (!window_cache_->Contains(hashes[i])) return false;
    }
    return true;
  };
  int64_t k = longest;
  while (k > 0 && !window_cached(k)) --k;
  if (replay != nullptr) {
    replay->longest = longest;
    replay->windowed = k;
  }
  if (replay != nullptr && k < longest) {
    // The whole prefix with a replay of its last positions, when that computes fewer positions
    // than starting after the k blocks whose window blocks are cached.
    const int64_t end = longest * block_tokens_;
    const int64_t exact = model_->exact_replay_tokens();
    const bool bounded = options_.swa_replay == EngineOptions::SwaReplay::kBounded &&
                         options_.swa_replay_tokens < exact;
    const int64_t from = std::max<int64_t>(0, end - (bounded ? options_.swa_replay_tokens : exact));
    const int64_t first = from / block_tokens_;
    if (end - from < (longest - k) * block_tokens_ &&
        MakeRoom(window_pool_, window_cache_.get(), longest - first)) {
      auto fresh = window_pool_->Allocate(longest - first);
      CHECK(fresh.ok());
      *blocks = cache_.Lookup(hashes.subspan(0, longest));
      CHECK_EQ(static_cast<int64_t>(blocks->size()), longest);
      window_blocks->assign(first, kNoBlock);
      window_blocks->insert(window_blocks->end(), fresh->begin(), fresh->end());
      replay->from = from;
      replay->end = end;
      replay->approximate = bounded && from > 0;
      return;
    }
    // (Making room may have evicted window blocks k needed.)
    while (k > 0 && !window_cached(k)) --k;
  }
  *blocks = cache_.Lookup(hashes.subspan(0, k));
  CHECK_EQ(static_cast<int64_t>(blocks->size()), k);
  const int64_t begin = FirstWindowBlock(k * block_tokens_);
  window_blocks->assign(begin, kNoBlock);
  const std::vector<BlockId> window = window_cache_->LookupAll(hashes.subspan(begin, k - begin));
  CHECK_EQ(static_cast<int64_t>(window.size()), k - begin);
  window_blocks->insert(window_blocks->end(), window.begin(), window.end());
}

void Engine::CacheFullBlocks(Sequence& seq) {
  // An approximation is never shared.
  if (seq.req->approximate) return;
  const int64_t full = seq.computed / block_tokens_;
  while (static_cast<int64_t>(seq.hashes.size()) < full) {
    const int64_t i = static_cast<int64_t>(seq.hashes.size());
    const Hash128 parent = i == 0 ? seq.req->root : seq.hashes.back();
    seq.hashes.push_back(NextBlockHash(
        parent, absl::MakeConstSpan(seq.tokens).subspan(i * block_tokens_, block_tokens_), {}));
  }
  if (seq.cached_blocks < full) {
    cache_.Insert(
        absl::MakeConstSpan(seq.hashes).subspan(seq.cached_blocks, full - seq.cached_blocks),
        absl::MakeConstSpan(seq.blocks).subspan(seq.cached_blocks, full - seq.cached_blocks));
    OfferComputedBlocks(seq, std::max(seq.cached_blocks, seq.offer_from), full);
    seq.cached_blocks = full;
  }
  if (window_pool_ != nullptr) {
    for (int64_t i = seq.window_cached; i < full; ++i) {
      const BlockId b = seq.window_blocks[i];
      if (b != kNoBlock) window_cache_->Insert({seq.hashes[i]}, absl::MakeConstSpan(&b, 1));
    }
    seq.window_cached = std::max(seq.window_cached, full);
  }
}

void Engine::OfferComputedBlocks(Sequence& seq, int64_t first, int64_t end) {
  const auto& offer = seq.req->r.on_computed_blocks;
  if (!offer || first >= end) return;
  std::vector<ComputedBlock> blocks;
  for (int64_t i = first; i < end; ++i) {
    blocks.push_back(ComputedBlock{i, seq.hashes[i], seq.blocks[i]});
  }
  offer(blocks);
}

void Engine::Slide(Sequence& seq) {
  if (window_pool_ == nullptr) return;
  const int64_t first = std::min<int64_t>(FirstWindowBlock(seq.computed), seq.window_blocks.size());
  for (; seq.window_begin < first; ++seq.window_begin) {
    BlockId& b = seq.window_blocks[seq.window_begin];
    if (b == kNoBlock) continue;
    CHECK(window_pool_->Release(absl::MakeConstSpan(&b, 1)).ok());
    b = kNoBlock;
  }
}

absl::StatusOr<bool> Engine::Step() {
  const auto start = std::chrono::steady_clock::now();
  DrainInbox();
  std::vector<Sequence*> order;
  for (auto& s : seqs_) {
    if (!s->finished) order.push_back(s.get());
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const Sequence* a, const Sequence* b) { return a->rank() < b->rank(); });
  std::vector<Sequence*> scheduled;
  int64_t budget = options_.max_batch_tokens, running = 0;
  for (Sequence* s : order) running += s->admitted ? 1 : 0;
  auto schedule = [&](Sequence* s) -> bool {
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->computed;
    const int64_t chunk = std::min({remaining, budget, options_.prefill_chunk});
    if (chunk <= 0) return false;
    if (!Reserve(*s, s->computed + chunk, scheduled)) return false;
    s->step_chunk = chunk;
    scheduled.push_back(s);
    budget -= chunk;
    return true;
  };
  // Admitted sequences by rank: decodes first, then continuing prefills.
  for (int pass = 0; pass < 2; ++pass) {
    for (Sequence* s : order) {
      if (!s->admitted || s->finished) continue;
      const bool decoding = static_cast<int64_t>(s->tokens.size()) - s->computed == 1;
      if (decoding == (pass == 0)) schedule(s);
    }
  }
  // Admission, strictly in rank order.
  for (Sequence* s : order) {
    if (s->admitted || s->finished) continue;
    if (budget <= 0 || running >= options_.max_running) break;
    const int64_t cached = Admit(*s);
    if (!schedule(s)) {
      // Not now: give the cache hits back and hold everything behind it.
      ReleaseBlocks(*s);
      s->computed = 0;
      s->replay_end = 0;
      s->window_floor = 0;
      s->admitted = false;
      stats_.cached_tokens -= cached;
      break;
    }
    if (!s->req->admitted_once) FirstAdmission(*s, cached);
    ++running;
    // A prefill-only request's cached prefix may be sent while the rest is computed.
    ReportKvProgress(*s);
  }
  if (scheduled.empty()) {
    // An admitted sequence that got no block although nothing ranks after it: when it outgrew
    // the whole pool nothing will ever free a block for it; otherwise it waits for handoffs.
    for (Sequence* s : order) {
      if (s->admitted && !s->finished &&
          pool_->layout().BlocksFor(s->computed + 1) > pool_->num_blocks()) {
        TokenEvent e;
        e.error =
            absl::StrCat("the KV cache (", pool_->num_blocks(), " blocks of ", block_tokens_,
                         " tokens) cannot hold this sequence's ", s->tokens.size(), " positions");
        e.error_code = absl::StatusCode::kResourceExhausted;
        Finish(*s, FinishReason::kError, std::move(e));
        RemoveFinished();
        return true;
      }
    }
    return false;
  }

  // Sequences preempted while others were scheduled are no longer in `scheduled`.
  std::vector<ForwardSequence> batch;
  for (Sequence* s : scheduled) {
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->computed;
    ForwardSequence f;
    f.tokens = absl::MakeConstSpan(s->tokens).subspan(s->computed, s->step_chunk);
    f.start_position = s->computed;
    f.blocks = s->blocks;
    f.window_blocks = s->window_blocks;
    f.no_logits = s->step_chunk != remaining;
    f.replay_end = s->replay_end;
    f.window_floor = s->window_floor;
    batch.push_back(f);
  }
  std::vector<float>& logits = logits_;  // kept across steps: no fresh pages every step
  logits.clear();
  StepInfo info;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    const Sequence& s = *scheduled[i];
    const bool decode =
        static_cast<int64_t>(s.tokens.size()) - s.computed == 1 && s.computed >= s.prompt_len;
    (decode ? info.decode_tokens : info.prefill_tokens) += s.step_chunk;
  }
  absl::Status status = model_->Forward(batch, *pool_, &logits, window_pool_);
  ++stats_.steps;
  if (!status.ok()) {
    for (Sequence* s : scheduled) {
      TokenEvent e;
      e.error = std::string(status.message());
      e.error_code = status.code();
      Finish(*s, FinishReason::kError, std::move(e));
    }
    RemoveFinished();
    return status;
  }
  const int64_t vocab = model_->config().vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence& s = *scheduled[i];
    // (Replayed positions were counted at the admission.)
    const int64_t fresh_from = std::max(s.computed, s.replay_end);
    if (fresh_from < s.prompt_len) {
      stats_.prompt_tokens_computed +=
          std::max<int64_t>(0, std::min(s.computed + s.step_chunk, s.prompt_len) - fresh_from);
    }
    s.computed += s.step_chunk;
    if (s.computed >= s.replay_end) s.replay_end = 0;
    CacheFullBlocks(s);
    Slide(s);
    if (batch[i].no_logits) {
      ReportKvProgress(s);
      continue;
    }
    const absl::Span<const float> l(logits.data() + row * vocab, vocab);
    ++row;
    if (!s.finished) Deliver(s, l);
  }
  info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats_.busy_seconds += info.seconds;
  stats_.last_step_seconds = info.seconds;
  RemoveFinished();
  if (options_.on_step) options_.on_step(info);
  return true;
}

void Engine::Deliver(Sequence& seq, absl::Span<const float> logits) {
  Request& req = *seq.req;
  if (req.r.role == EngineRole::kPrefillOnly) return DeliverPrefillOnly(seq, logits);
  if (req.fork_pending && seq.choice == 0) {
    req.fork_pending = false;
    Fork(seq, logits);
  }
  FinishReason reason = FinishReason::kNone;
  TokenEvent e = NextToken(seq, logits, &reason);
  if (reason == FinishReason::kNone) {
    Emit(seq, e);
    return;
  }
  Finish(seq, reason, std::move(e));
}

TokenEvent Engine::NextToken(Sequence& seq, absl::Span<const float> logits, FinishReason* reason) {
  Request& req = *seq.req;
  const EngineRequest& r = req.r;
  // Before min_tokens, no stop token may be chosen and no stop string may end the text.
  const bool may_stop = seq.generated() + 1 > r.min_tokens;
  const SampledToken sampled =
      Sample(logits, r.sampling, req.prompt_set, seq.state, static_cast<uint64_t>(seq.choice),
             may_stop ? absl::Span<const TokenId>() : absl::MakeConstSpan(req.stop_ids));
  seq.state.Observe(sampled.token);
  seq.tokens.push_back(sampled.token);
  ++stats_.generated_tokens;
  TokenEvent e;
  e.has_token = true;
  e.token = sampled.token;
  e.logprob = sampled.logprob;
  e.top_logprobs = sampled.top;
  if (r.keep_logits) e.logits.assign(logits.begin(), logits.end());
  const bool stop_token =
      may_stop && std::binary_search(req.stop_ids.begin(), req.stop_ids.end(), sampled.token);
  if (seq.detok != nullptr && !stop_token) {
    auto delta = seq.detok->Push(sampled.token);
    if (delta.ok()) e.text = seq.stop.Push(*delta, may_stop);
  }
  e.held_text = seq.stop.held();
  *reason = FinishReason::kNone;
  if (stop_token || seq.stop.stopped()) {
    *reason = FinishReason::kStop;
    e.stop_token = stop_token;
    if (!stop_token) e.matched_stop = seq.stop.matched();
  } else if (seq.generated() >= r.max_tokens ||
             static_cast<int64_t>(seq.tokens.size()) >= model_->max_positions()) {
    *reason = FinishReason::kLength;
  }
  return e;
}

void Engine::ReportKvProgress(Sequence& seq) {
  const EngineRequest& r = seq.req->r;
  if (!r.stream_kv || r.role != EngineRole::kPrefillOnly || seq.finished) return;
  // (A replay leaves the full-attention blocks before replay_end as they are: complete.)
  const int64_t complete =
      std::min(std::max(seq.computed, seq.replay_end), seq.prompt_len) / block_tokens_;
  if (complete <= seq.reported_blocks) return;
  seq.reported_blocks = complete;
  TokenEvent e;
  e.blocks.assign(seq.blocks.begin(), seq.blocks.begin() + complete);
  Emit(seq, e);
}

void Engine::DeliverPrefillOnly(Sequence& seq, absl::Span<const float> logits) {
  Request& req = *seq.req;
  // Every choice's first token comes from these logits (with a resume point, only `seq`'s
  // choice runs). The other choices need no KV of their own: they exist for this moment.
  std::vector<std::unique_ptr<Sequence>> others;
  std::vector<Sequence*> choices = {&seq};
  if (req.fork_pending) {
    req.fork_pending = false;
    for (int32_t c = 1; c < req.r.n; ++c) {
      others.push_back(NewSequence(seq.req, c, seq.arrival));
      others.back()->computed = seq.computed;
      ++req.live;
      choices.push_back(others.back().get());
    }
  }
  std::vector<TokenEvent> events;
  std::vector<FinishReason> reasons;
  for (Sequence* s : choices) {
    FinishReason reason = FinishReason::kNone;
    events.push_back(NextToken(*s, logits, &reason));
    reasons.push_back(reason == FinishReason::kNone ? FinishReason::kHandoff : reason);
    if (reasons.back() == FinishReason::kHandoff) req.handed_off = true;
  }
  if (req.handed_off) {
    handoffs_[req.r.id] = Handoff{std::move(seq.blocks), std::move(seq.window_blocks),
                                  clock_->Monotonic() + options_.handoff_ttl};
    seq.blocks.clear();
    seq.window_blocks.clear();
  }
  for (size_t i = 0; i < choices.size(); ++i) {
    Finish(*choices[i], reasons[i], std::move(events[i]));
  }
}

std::unique_ptr<Engine::Sequence> Engine::NewSequence(const std::shared_ptr<Request>& req,
                                                      int32_t choice, int64_t arrival) {
  auto seq = std::make_unique<Sequence>();
  seq->req = req;
  seq->choice = choice;
  seq->arrival = arrival;
  seq->prompt_len = static_cast<int64_t>(req->r.prompt.size());
  seq->tokens = req->r.prompt;
  seq->stop = StopStringMatcher(req->r.stop);
  if (tokenizer_ != nullptr) {
    seq->detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_, /*skip_special=*/true,
                                                          req->r.keep_special_token_ids);
  }
  return seq;
}

bool Engine::ShareKv(const std::vector<BlockId>& blocks, const std::vector<BlockId>& window_blocks,
                     int64_t positions, Sequence& seq) {
  const int64_t full = positions / block_tokens_;
  const bool partial = positions % block_tokens_ != 0;
  // The partial block's copies, in each pool.
  auto copy_of = [&](KvBlockPool& pool, PrefixCache& cache) -> BlockId {
    if (!partial) return kNoBlock;
    auto b = pool.Allocate(1);
    if (!b.ok() && cache.Evict(1) > 0) b = pool.Allocate(1);
    return b.ok() ? (*b)[0] : kNoBlock;
  };
  const BlockId copy = copy_of(*pool_, cache_);
  const BlockId window_copy =
      window_pool_ != nullptr ? copy_of(*window_pool_, *window_cache_) : kNoBlock;
  const bool copied =
      !partial || (copy != kNoBlock && (window_pool_ == nullptr || window_copy != kNoBlock));
  if (!copied) {
    if (copy != kNoBlock) CHECK(pool_->Release(absl::MakeConstSpan(&copy, 1)).ok());
    if (window_copy != kNoBlock) {
      CHECK(window_pool_->Release(absl::MakeConstSpan(&window_copy, 1)).ok());
    }
    return false;
  }
  seq.blocks.assign(blocks.begin(), blocks.begin() + full);
  CHECK(pool_->AddRef(seq.blocks).ok());
  if (partial) {
    CHECK(pool_->CopyBlock(blocks[full], copy).ok());
    seq.blocks.push_back(copy);
  }
  if (window_pool_ != nullptr) {
    // The window blocks still held (full ones shared, the partial one copied).
    seq.window_blocks.assign(window_blocks.begin(), window_blocks.begin() + full);
    std::vector<BlockId> shared;
    for (BlockId b : seq.window_blocks) {
      if (b != kNoBlock) shared.push_back(b);
    }
    CHECK(window_pool_->AddRef(shared).ok());
    if (partial) {
      CHECK(window_pool_->CopyBlock(window_blocks[full], window_copy).ok());
      seq.window_blocks.push_back(window_copy);
    }
  }
  seq.computed = positions;
  seq.admitted = true;
  return true;
}

void Engine::Fork(Sequence& first, absl::Span<const float> logits) {
  // Choices 1..n-1 share the prompt's full blocks and copy its partial last block.
  const int64_t full = first.prompt_len / block_tokens_;
  for (int32_t c = 1; c < first.req->r.n; ++c) {
    auto seq = NewSequence(first.req, c, first.arrival);
    seq->hashes = first.hashes;
    seq->cached_blocks = std::min<int64_t>(first.cached_blocks, full);
    const bool copied = ShareKv(first.blocks, first.window_blocks, first.prompt_len, *seq);
    if (copied && window_pool_ != nullptr) {
      seq->window_begin = std::min<int64_t>(first.window_begin, full);
      seq->window_cached = std::min<int64_t>(first.window_cached, full);
      seq->window_floor = first.window_floor;
    }
    seq->offer_from = std::min<int64_t>(first.offer_from, full);
    ++first.req->live;
    Sequence& added = *seq;
    seqs_.push_back(std::move(seq));
    // Its first token, from the same logits with its own choice. (Without a block to copy into,
    // the choice waits and recomputes, from the cache.)
    if (copied) Deliver(added, logits);
  }
}

void Engine::Emit(const Sequence& seq, TokenEvent& event) {
  event.request_id = seq.req->r.id;
  event.choice = seq.choice;
  event.cached_tokens = seq.req->cached_prompt_tokens;
  event.imported_tokens = seq.req->imported_tokens;
  event.replayed_tokens = seq.req->replayed_tokens;
  event.approximate_kv = seq.req->approximate;
  event.window_floor = seq.req->window_floor;
  event.queued = seq.req->queued;
  if (seq.req->r.on_event) seq.req->r.on_event(event);
}

void Engine::Finish(Sequence& seq, FinishReason reason, TokenEvent event) {
  if (seq.finished) return;
  seq.finished = true;
  if ((reason == FinishReason::kLength || reason == FinishReason::kStop) && !seq.stop.stopped()) {
    // The end of the text: what the detokenizer and the stop matcher held back. (A handoff
    // keeps it: the decode side continues the same text.)
    if (seq.detok != nullptr) {
      auto rest = seq.detok->Finish();
      if (rest.ok()) event.text += seq.stop.Push(*rest);
    }
    if (!seq.stop.stopped()) event.text += seq.stop.Finish();
  }
  event.finish = reason;
  event.sampler_state = seq.state;
  event.held_text = seq.stop.held();
  if (seq.req->live == 1 && !seq.req->pinned.empty()) {
    // Ended before its first admission: its imports stay cached, held no more.
    const int64_t loaded =
        static_cast<int64_t>(seq.req->pinned.size()) - seq.req->r.imported_cached_blocks;
    stats_.unused_imported_blocks += std::max<int64_t>(0, loaded);
    Unpin(*seq.req);
  }
  if (seq.req->live == 1) parking_.erase(seq.req->r.id);  // its last choice ends
  if (--seq.req->live == 0 && !seq.req->handed_off) {
    // Reusable from its last event on: whoever sees that event finds the id free (its
    // sequences leave seqs_ at the end of this step, before a new submission is added).
    std::lock_guard<std::mutex> lock(mu_);
    live_ids_.erase(seq.req->r.id);
  }
  if (reason == FinishReason::kHandoff) {
    const Handoff& handoff = handoffs_.at(seq.req->r.id);
    event.blocks = handoff.blocks;
    event.window_blocks = handoff.window_blocks;
  }
  ReleaseBlocks(seq);  // (a handoff's moved to handoffs_)
  seq.admitted = false;
  const std::string error = event.error;
  const absl::StatusCode event_code = event.error_code;
  Emit(seq, event);
  Request& req = *seq.req;
  if (seq.choice == 0 && req.fork_pending) {
    // Choices 1..n-1 would have forked from choice 0's first token: they end with it.
    req.fork_pending = false;
    for (int32_t c = 1; c < req.r.n; ++c) {
      TokenEvent e;
      e.request_id = req.r.id;
      e.choice = c;
      e.finish = reason;
      e.error = error;
      e.error_code = event_code;
      e.cached_tokens = req.cached_prompt_tokens;
      e.imported_tokens = req.imported_tokens;
      e.replayed_tokens = req.replayed_tokens;
      e.approximate_kv = req.approximate;
      e.window_floor = req.window_floor;
      e.queued = req.queued;
      if (req.r.on_event) req.r.on_event(e);
    }
  }
}

void Engine::RemoveFinished() {
  seqs_.erase(std::remove_if(seqs_.begin(), seqs_.end(),
                             [](const std::unique_ptr<Sequence>& s) { return s->finished; }),
              seqs_.end());
  PublishCacheEvents();
  EngineStats published = stats_;
  for (const auto& layer : model_->expert_token_counts()) {
    published.expert_tokens.resize(std::max(published.expert_tokens.size(), layer.size()), 0);
    for (size_t e = 0; e < layer.size(); ++e) published.expert_tokens[e] += layer[e];
  }
  int64_t waiting_requests = 0;
  const Request* last = nullptr;
  for (const auto& s : seqs_) {
    if (s->admitted) {
      ++published.running;
      published.running_tokens += static_cast<int64_t>(s->tokens.size());
    } else {
      ++published.waiting;
      published.queued_tokens += static_cast<int64_t>(s->tokens.size()) - s->computed;
      if (!s->req->admitted_once && s->req.get() != last) ++waiting_requests;
      last = s->req.get();
    }
  }
  published.total_blocks = pool_->num_blocks();
  published.free_blocks = pool_->num_free();
  published.cached_blocks = cache_.blocks();
  published.window_cached_blocks = window_cache_ != nullptr ? window_cache_->blocks() : 0;
  std::lock_guard<std::mutex> lock(mu_);
  // Released handoffs' ids become reusable.
  for (const std::string& id : released_ids_) live_ids_.erase(id);
  released_ids_.clear();
  published_ = std::move(published);
  published_waiting_requests_ = waiting_requests;
}

void Engine::PublishCacheEvents() {
  const int64_t dropped =
      cache_.dropped_events() + (window_cache_ != nullptr ? window_cache_->dropped_events() : 0);
  if (dropped != dropped_events_) {
    // A cache lost events (more in one step than it keeps): the journal starts over from what
    // the caches hold.
    dropped_events_ = dropped;
    cache_.TakeEvents();
    if (window_cache_ != nullptr) window_cache_->TakeEvents();
    journal_.Reset(cache_.Hashes(),
                   window_cache_ != nullptr ? window_cache_->Hashes() : std::vector<Hash128>{});
    return;
  }
  journal_.Append(cache_.TakeEvents(), /*window=*/false);
  if (window_cache_ != nullptr) journal_.Append(window_cache_->TakeEvents(), /*window=*/true);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = published_;
  s.waiting += static_cast<int64_t>(submitted_.size());
  s.queued_tokens += submitted_tokens_;
  return s;
}

void Engine::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::Loop() {
  // Waits for `ready`, or until the next handoff expires (handoffs_ is this thread's).
  auto wait = [&](std::unique_lock<std::mutex>& lock, auto ready) {
    if (handoffs_.empty()) return wake_.wait(lock, ready);
    absl::Duration next = absl::InfiniteDuration();
    for (const auto& [id, handoff] : handoffs_) next = std::min(next, handoff.expires);
    const absl::Duration left = std::max(absl::ZeroDuration(), next - clock_->Monotonic());
    wake_.wait_for(lock, absl::ToChronoMicroseconds(left) + std::chrono::milliseconds(1), ready);
  };
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // (Blocks a service gave back: a step publishes the pool's new state.)
      wait(lock, [&] {
        return stopping_ || InboxHasWork() || blocks_freed_ ||
               published_.running + published_.waiting > 0;
      });
      if (stopping_) return;
    }
    auto worked = Step();
    if (worked.ok() && !*worked) {
      // Nothing runnable (e.g. waiting for blocks held by handoffs): wait for news.
      std::unique_lock<std::mutex> lock(mu_);
      wait(lock, [&] { return stopping_ || InboxHasWork() || blocks_freed_; });
      if (stopping_) return;
    }
  }
}

}  // namespace ferry
