#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/block_hash.h"
#include "engine/common/log.h"
#include "engine/request_validation.h"

namespace ferry {

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

namespace {

// The runs of positions [start, start + count) that `images` cover, offsets relative to start.
std::vector<InputEmbeddingRows> InputRowsFor(absl::Span<const PromptImageInput> images,
                                             int64_t hidden_size, int64_t start, int64_t count) {
  std::vector<InputEmbeddingRows> out;
  const int64_t end = start + count;
  for (const PromptImageInput& image : images) {
    if (image.placeholder_start >= end) break;
    const int64_t first = std::max(start, image.placeholder_start);
    const int64_t last = std::min(end, image.placeholder_start + image.placeholder_length);
    if (first >= last) continue;
    out.push_back({first - start, last - first,
                   image.embeddings->data() + (first - image.placeholder_start) * hidden_size});
  }
  return out;
}

// The first of `images` sent without rows (null embeddings) that overlaps positions
// [start, start + count); -1: none.
int64_t AbsentImageAt(absl::Span<const PromptImageInput> images, int64_t start, int64_t count) {
  const int64_t end = start + count;
  for (size_t i = 0; i < images.size(); ++i) {
    const PromptImageInput& image = images[i];
    if (image.placeholder_start >= end) break;
    if (image.embeddings != nullptr) continue;
    if (image.placeholder_start + image.placeholder_length > start) return static_cast<int64_t>(i);
  }
  return -1;
}

HybridKvCacheOptions KvCacheOptions(const ForwardModel& model, const EngineOptions& options,
                                    Clock* clock) {
  HybridKvCacheOptions o;
  o.prefix_cache_bytes = options.prefix_cache_bytes;
  o.window_cache_bytes = options.window_cache_bytes;
  o.window_cache_ttl = options.window_cache_ttl;
  o.clock = clock;
  o.max_window = model.max_window();
  o.exact_replay_tokens = model.exact_replay_tokens();
  o.bounded_replay = options.swa_replay == EngineOptions::SwaReplay::kBounded;
  o.bounded_replay_tokens = options.swa_replay_tokens;
  return o;
}

SchedulerLimits LimitsOf(const EngineOptions& options) {
  SchedulerLimits l;
  l.max_batch_tokens = options.max_batch_tokens;
  l.max_running = options.max_running;
  l.prefill_chunk = options.prefill_chunk;
  return l;
}

}  // namespace

Engine::Engine(ForwardModel* model, KvBlockPool* pool, const Tokenizer* tokenizer,
               const EngineOptions& options, KvBlockPool* window_pool)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : &RealClock()),
      block_tokens_(pool->layout().block_tokens),
      kv_(pool, window_pool, KvCacheOptions(*model, options, clock_)),
      journal_(options.journal_events),
      scheduler_(&kv_, LimitsOf(options), clock_, &stats_),
      handoffs_(&kv_, clock_, options.handoff_ttl) {
  eos_ids_ = model_->config().eos_token_ids;
  if (tokenizer_ != nullptr && tokenizer_->eos_id().has_value() &&
      *tokenizer_->eos_id() < static_cast<TokenId>(model_->config().vocab_size)) {
    eos_ids_.push_back(*tokenizer_->eos_id());
  }
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
  // Blocks given back by other threads (a service releasing a reservation) wake a waiting loop.
  kv_.SetFreeListener([this] {
    {
      absl::MutexLock lock(&mu_);
      blocks_freed_ = true;
    }
    wake_.Signal();
  });
  published_.total_blocks = kv_.num_blocks();
  published_.free_blocks = kv_.pool().num_free();
}

Engine::~Engine() {
  Stop();
  DrainInbox();
  for (auto& seq : scheduler_.sequences()) {
    if (!seq->finished) Finish(*seq, FinishReason::kAbort, TokenEvent{});
  }
  RemoveFinished();
  handoffs_.DropAll();
  kv_.SetFreeListener(nullptr);
}

absl::Status Engine::Validate(const EngineRequest& r) const {
  RequestLimits limits;
  limits.vocab_size = model_->config().vocab_size;
  limits.max_positions = model_->max_positions();
  limits.max_n = options_.max_n;
  limits.has_tokenizer = tokenizer_ != nullptr;
  limits.hidden_size = model_->config().hidden_size;
  limits.kv = &kv_;
  if (absl::Status s = ValidateRequest(r, limits); !s.ok()) return s;
  return ValidateConstraint(r);
}

absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> Engine::Vocabulary(
    absl::Span<const TokenId> kept_special) const {
  if (tokenizer_ == nullptr) {
    return absl::FailedPreconditionError("the engine has no tokenizer: no vocabulary");
  }
  // Only special ids change the bytes; the key is them, sorted and unique.
  std::vector<TokenId> key;
  for (TokenId t : kept_special) {
    if (tokenizer_->IsSpecial(t)) key.push_back(t);
  }
  std::sort(key.begin(), key.end());
  key.erase(std::unique(key.begin(), key.end()), key.end());
  absl::MutexLock lock(&vocabulary_mu_);
  if (key.empty()) {
    if (vocabulary_ == nullptr) {
      absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> built =
          grammar::CompiledConstraint::BuildVocabulary(*tokenizer_);
      if (!built.ok()) return built.status();
      vocabulary_ = *std::move(built);
    }
    return vocabulary_;
  }
  for (size_t i = 0; i < kept_vocabularies_.size(); ++i) {
    if (kept_vocabularies_[i].first != key) continue;
    std::rotate(kept_vocabularies_.begin() + i, kept_vocabularies_.begin() + i + 1,
                kept_vocabularies_.end());  // most recently used last
    return kept_vocabularies_.back().second;
  }
  absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> built =
      grammar::CompiledConstraint::BuildVocabulary(*tokenizer_, key);
  if (!built.ok()) return built.status();
  if (kept_vocabularies_.size() >= kMaxKeptVocabularies) {
    kept_vocabularies_.erase(kept_vocabularies_.begin());
  }
  kept_vocabularies_.emplace_back(std::move(key), *built);
  return *std::move(built);
}

namespace {

// A request's stop ids as its matchers see them (RunningRequest::stop_ids, as AddRequest makes).
std::vector<uint32_t> MatcherStopIds(const EngineRequest& r, const std::vector<TokenId>& eos) {
  std::vector<uint32_t> ids(r.stop_token_ids.begin(), r.stop_token_ids.end());
  if (!r.ignore_eos) ids.insert(ids.end(), eos.begin(), eos.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

absl::Status Engine::ValidateConstraint(const EngineRequest& r) const {
  if (r.constraint == nullptr) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> mine =
      Vocabulary(r.keep_special_token_ids);
  if (!mine.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a constrained request needs the engine's tokenizer: ", mine.status().message()));
  }
  const grammar::TokenTrie& theirs = *r.constraint->vocabulary();
  if (mine->get() != &theirs) {
    bool same = theirs.vocab_size() == (*mine)->vocab_size();
    for (uint32_t t = 0; same && t < theirs.vocab_size(); ++t) {
      same = theirs.TokenBytes(t) == (*mine)->TokenBytes(t);
    }
    if (!same) {
      return absl::InvalidArgumentError(
          "the constraint was compiled for another vocabulary than the engine's for the "
          "request's kept special tokens (keep_special_token_ids)");
    }
  }
  if (theirs.vocab_size() > static_cast<size_t>(model_->config().vocab_size)) {
    return absl::InvalidArgumentError("the constraint's vocabulary is larger than the model's");
  }
  for (const ResumePoint& p : r.resume) {
    absl::StatusOr<grammar::TokenMatcher> m = r.constraint->NewMatcher(MatcherStopIds(r, eos_ids_));
    if (!m.ok()) return m.status();
    for (size_t i = 0; i < p.generated.size(); ++i) {
      if (absl::Status s = m->Accept(static_cast<uint32_t>(p.generated[i])); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("resume point of choice ", p.choice,
                                                       ": generated token ", i, " (",
                                                       p.generated[i], "): ", s.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::StartMatcher(Sequence& seq, absl::Span<const TokenId> generated) const {
  const EngineRequest& r = seq.req->r;
  if (r.constraint == nullptr) return absl::OkStatus();
  absl::StatusOr<grammar::TokenMatcher> m = r.constraint->NewMatcher(
      std::vector<uint32_t>(seq.req->stop_ids.begin(), seq.req->stop_ids.end()));
  if (!m.ok()) return m.status();
  for (TokenId t : generated) {
    if (absl::Status s = m->Accept(static_cast<uint32_t>(t)); !s.ok()) return s;
  }
  seq.matcher.emplace(*std::move(m));
  seq.mask.assign(grammar::TokenMatcher::MaskWords(
                      std::max<size_t>(r.constraint->vocabulary()->vocab_size(),
                                       static_cast<size_t>(model_->config().vocab_size))),
                  0);
  return absl::OkStatus();
}

absl::Status Engine::Submit(EngineRequest request) {
  if (absl::Status s = Validate(request); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
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
  wake_.Signal();
  return absl::OkStatus();
}

bool Engine::IsLive(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  return live_ids_.contains(id);
}

void Engine::Reserve(std::vector<Hash128> hashes, int64_t positions,
                     std::function<void(absl::StatusOr<KvReservation>)> done) {
  {
    absl::MutexLock lock(&mu_);
    PendingReservation r;
    r.hashes = std::move(hashes);
    r.positions = positions;
    r.done = std::move(done);
    reservations_.push_back(std::move(r));
  }
  wake_.Signal();
}

void Engine::ReserveImport(std::vector<Hash128> hashes, int64_t max_fresh,
                           std::function<void(absl::StatusOr<KvReservation>)> done) {
  {
    absl::MutexLock lock(&mu_);
    PendingReservation r;
    r.hashes = std::move(hashes);
    r.import = true;
    r.max_fresh = max_fresh;
    r.done = std::move(done);
    reservations_.push_back(std::move(r));
  }
  wake_.Signal();
}

void Engine::HoldComputedBlocks(const std::string& id, int64_t blocks,
                                std::function<void(absl::StatusOr<std::vector<BlockId>>)> done) {
  {
    absl::MutexLock lock(&mu_);
    holds_.push_back(PendingHold{id, blocks, std::move(done)});
  }
  wake_.Signal();
}

void Engine::CacheBlocks(std::vector<Hash128> hashes, std::vector<BlockId> blocks) {
  {
    absl::MutexLock lock(&mu_);
    caches_.push_back(PendingCache{std::move(hashes), std::move(blocks)});
  }
  wake_.Signal();
}

void Engine::RunHold(PendingHold& hold) {
  Sequence* only = nullptr;
  int64_t live = 0;
  for (auto& seq : scheduler_.sequences()) {
    if (seq->finished || seq->req->r.id != hold.id) continue;
    ++live;
    only = seq.get();
  }
  if (live == 0) {
    return hold.done(absl::NotFoundError(absl::StrCat("request ", hold.id, " is not running")));
  }
  if (live > 1 || only->req->r.n != 1) {
    return hold.done(absl::FailedPreconditionError(
        absl::StrCat("request ", hold.id, " has several choices: its KV is not handed off")));
  }
  const Sequence& seq = *only;
  if (hold.blocks <= 0 || hold.blocks * block_tokens_ > seq.computed ||
      hold.blocks > static_cast<int64_t>(seq.kv.blocks.size())) {
    return hold.done(absl::FailedPreconditionError(
        absl::StrCat("request ", hold.id, " has ", seq.computed, " positions computed, not the ",
                     hold.blocks, " full blocks asked for")));
  }
  std::vector<BlockId> held(seq.kv.blocks.begin(), seq.kv.blocks.begin() + hold.blocks);
  CHECK_OK(kv_.pool().AddRef(held));
  hold.done(std::move(held));
}

void Engine::ClearPrefixCache() {
  {
    absl::MutexLock lock(&mu_);
    clear_cache_ = true;
  }
  wake_.Signal();
}

void Engine::Abort(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    aborted_.push_back(id);
  }
  wake_.Signal();
}

void Engine::ReleaseHandoff(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    released_.push_back(id);
  }
  wake_.Signal();
}

void Engine::Park(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    parked_.push_back(id);
  }
  wake_.Signal();
}

bool Engine::ParkRequest(const std::string& id) {
  Sequence* only = nullptr;
  int64_t live = 0;
  for (auto& seq : scheduler_.sequences()) {
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
                        handoffs_.Find(id) == nullptr;
  if (!parkable) return false;  // not yet (prefilling, preempted), or never (several choices)
  // The table covers the computed positions; a block reserved ahead for the next one goes back.
  kv_.Truncate(&seq.kv, seq.computed);
  seq.req->handed_off = true;
  handoffs_.Hold(id, std::move(seq.kv));
  seq.kv = KvTables();
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
  std::vector<PendingHold> holds;
  std::vector<PendingCache> caches;
  bool clear = false;
  {
    absl::MutexLock lock(&mu_);
    submitted.swap(submitted_);
    submitted_tokens_ = 0;
    aborted.swap(aborted_);
    released.swap(released_);
    parked.swap(parked_);
    reservations.swap(reservations_);
    holds.swap(holds_);
    caches.swap(caches_);
    std::swap(clear, clear_cache_);
    blocks_freed_ = false;
    // Until RemoveFinished publishes again, the queue bound counts these as waiting.
    published_waiting_requests_ += static_cast<int64_t>(submitted.size());
  }
  for (Submitted& s : submitted) AddRequest(std::move(s.r), s.at);
  for (const std::string& id : aborted) {
    for (auto& seq : scheduler_.sequences()) {
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
  stats_.window_expired_blocks += kv_.ExpireWindowBlocks();
  if (clear) kv_.EvictAll();
  for (PendingCache& c : caches) {
    kv_.CacheImported(c.hashes, c.blocks);
    kv_.ReleaseFull(&c.blocks);
  }
  for (PendingReservation& r : reservations) RunReservation(r);
  for (PendingHold& h : holds) RunHold(h);
  RemoveFinished();
}

bool Engine::DropHandoff(const std::string& id) {
  if (!handoffs_.Drop(id)) return false;
  released_ids_.push_back(id);
  return true;
}

void Engine::ExpireHandoffs() {
  for (const std::string& id : handoffs_.Expired()) {
    LOG(WARNING) << "handoff of request " << id << " not released within "
                 << absl::FormatDuration(handoffs_.ttl()) << ": its blocks are freed";
    DropHandoff(id);
  }
}

void Engine::RunReservation(PendingReservation& r) {
  r.done(r.import ? kv_.ReserveImport(r.hashes, r.max_fresh) : kv_.Reserve(r.hashes, r.positions));
}

void Engine::AddRequest(EngineRequest r, absl::Duration submitted_at) {
  auto req = std::make_shared<RunningRequest>();
  req->r = std::move(r);
  req->submitted_at = submitted_at;
  const EngineRequest& er = req->r;
  req->prompt_set.insert(er.prompt.begin(), er.prompt.end());
  req->root = RootBlockHash({model_->fingerprint(), er.cache_salt, ""});
  req->image_spans = ImageSpans(er.images);
  req->stop_ids = er.stop_token_ids;
  if (!er.ignore_eos) req->stop_ids.insert(req->stop_ids.end(), eos_ids_.begin(), eos_ids_.end());
  std::sort(req->stop_ids.begin(), req->stop_ids.end());
  req->stop_ids.erase(std::unique(req->stop_ids.begin(), req->stop_ids.end()), req->stop_ids.end());
  const int64_t arrival = scheduler_.NextArrival();
  if (er.role == EngineRole::kDecodeOnly) {
    req->approximate = er.approximate_kv;
    req->window_floor = er.window_floor;
  } else if (!er.imported_blocks.empty()) {
    // Imports: offered to the prefix cache now (hashes already cached keep their blocks), held
    // until the first admission.
    const int64_t k = static_cast<int64_t>(er.imported_blocks.size());
    std::vector<Hash128> hashes;
    for (int64_t i = 0; i < k; ++i) {
      hashes.push_back(
          NextBlockHash(i == 0 ? req->root : hashes.back(),
                        absl::MakeConstSpan(er.prompt).subspan(i * block_tokens_, block_tokens_),
                        ImagesInBlock(req->image_spans, i * block_tokens_, block_tokens_)));
    }
    kv_.CacheImported(hashes, er.imported_blocks);
    req->pinned = std::move(req->r.imported_blocks);
    req->r.imported_blocks.clear();
  }
  // Without resume points choice 0 starts and the others fork from its first token.
  req->fork_pending = er.resume.empty() && er.n > 1;
  std::vector<const ResumePoint*> points;
  for (const ResumePoint& p : er.resume) points.push_back(&p);
  if (points.empty()) points.push_back(nullptr);
  for (const ResumePoint* resume : points) {
    auto seq = NewSequence(req, resume != nullptr ? resume->choice : 0, arrival, tokenizer_);
    // (Validate replayed the same tokens: a failure here is a matcher limit.)
    absl::Status matcher =
        StartMatcher(*seq, resume != nullptr ? absl::MakeConstSpan(resume->generated)
                                             : absl::Span<const TokenId>());
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
        seq->kv.blocks = er.imported_blocks;
        seq->kv.window_blocks = er.imported_window_blocks;
        seq->computed = DecodeOnlyPositions(er);
        seq->admitted = true;
      } else {
        // The others share them (each after one token: the prompt's KV). Without a block for
        // the partial one's copy, a choice recomputes when it is admitted.
        KvTables imported;
        imported.blocks = er.imported_blocks;
        imported.window_blocks = er.imported_window_blocks;
        if (kv_.Share(imported, seq->prompt_len, &seq->kv)) {
          seq->computed = seq->prompt_len;
          seq->admitted = true;
        }
      }
      // The imported positions were computed elsewhere: only blocks completed here are offered.
      seq->offer_from = seq->computed / block_tokens_;
      if (seq->admitted) seq->window_floor = er.window_floor;
      req->admitted_once = true;
    }
    ++req->live;
    Sequence& added = *seq;
    scheduler_.Add(std::move(seq));
    if (!matcher.ok()) {
      TokenEvent e;
      e.error = absl::StrCat("grammar: ", matcher.message());
      e.error_code = matcher.code();
      Finish(added, FinishReason::kError, std::move(e));
    }
  }
}

void Engine::CacheFullBlocks(Sequence& seq) {
  // An approximation is never shared.
  if (seq.req->approximate) return;
  const int64_t full = seq.computed / block_tokens_;
  HashFullBlocks(seq, full, block_tokens_);
  kv_.Cache(seq.hashes, &seq.kv, std::min(seq.cached_blocks, full), full);
  if (seq.cached_blocks < full) {
    OfferComputedBlocks(seq, std::max(seq.cached_blocks, seq.offer_from), full);
    seq.cached_blocks = full;
  }
}

void Engine::OfferComputedBlocks(Sequence& seq, int64_t first, int64_t end) {
  const auto& offer = seq.req->r.on_computed_blocks;
  if (!offer || first >= end) return;
  std::vector<ComputedBlock> blocks;
  for (int64_t i = first; i < end; ++i) {
    blocks.push_back(ComputedBlock{i, seq.hashes[i], seq.kv.blocks[i]});
  }
  offer(blocks);
}

absl::StatusOr<bool> Engine::Step() {
  const auto start = std::chrono::steady_clock::now();
  DrainInbox();
  // A prefill-only request's cached prefix may be sent while the rest is computed.
  const std::vector<Sequence*> scheduled =
      scheduler_.Plan([this](Sequence& admitted) { ReportKvProgress(admitted); });
  if (scheduled.empty()) {
    // An admitted sequence that got no block although nothing ranks after it: when it outgrew
    // the whole pool nothing will ever free a block for it; otherwise it waits for handoffs.
    if (Sequence* s = scheduler_.Outgrown(); s != nullptr) {
      TokenEvent e;
      e.error =
          absl::StrCat("the KV cache (", kv_.num_blocks(), " blocks of ", block_tokens_,
                       " tokens) cannot hold this sequence's ", s->tokens.size(), " positions");
      e.error_code = absl::StatusCode::kResourceExhausted;
      Finish(*s, FinishReason::kError, std::move(e));
      RemoveFinished();
      return true;
    }
    return false;
  }

  // A chunk reaching into an image sent without rows (expected cached, prompt_image.h): its
  // request fails Unavailable (its caller sends the rows again); the others wait a step.
  bool absent_rows = false;
  for (Sequence* s : scheduled) {
    const int64_t missing = AbsentImageAt(s->req->r.images, s->computed, s->step_chunk);
    if (missing < 0) continue;
    TokenEvent e;
    e.error = absl::StrCat("image ", missing,
                           " was sent without its embeddings (expected cached) and the step must "
                           "compute its positions (from ",
                           s->req->r.images[missing].placeholder_start,
                           "): send the request again with the image");
    e.error_code = absl::StatusCode::kUnavailable;
    ++stats_.absent_image_rows;
    Finish(*s, FinishReason::kError, std::move(e));
    absent_rows = true;
  }
  if (absent_rows) {
    RemoveFinished();
    return true;
  }

  // Sequences preempted while others were scheduled are no longer in `scheduled`.
  std::vector<ForwardSequence> batch;
  // Each sequence's greedy token, where the model chooses it (GreedyOnly; kNoToken: its logits).
  std::vector<TokenId> greedy(scheduled.size(), kNoToken);
  // The image rows of each scheduled sequence's chunk (a chunk may start or end inside an image;
  // any recompute of the prompt passes here again).
  std::vector<std::vector<InputEmbeddingRows>> image_rows(scheduled.size());
  for (size_t i = 0; i < scheduled.size(); ++i) {
    const Sequence& s = *scheduled[i];
    image_rows[i] =
        InputRowsFor(s.req->r.images, model_->config().hidden_size, s.computed, s.step_chunk);
  }
  for (Sequence* s : scheduled) {
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->computed;
    ForwardSequence f;
    f.tokens = absl::MakeConstSpan(s->tokens).subspan(s->computed, s->step_chunk);
    f.start_position = s->computed;
    f.blocks = s->kv.blocks;
    f.window_blocks = s->kv.window_blocks;
    f.no_logits = s->step_chunk != remaining;
    f.replay_end = s->replay_end;
    f.window_floor = s->window_floor;
    f.input_embeddings = image_rows[batch.size()];
    if (!f.no_logits && GreedyOnly(*s)) f.greedy_token = &greedy[batch.size()];
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
  absl::Status status = model_->Forward(batch, kv_.pool(), &logits, kv_.window_pool());
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
    kv_.Slide(&s.kv, s.computed);
    if (batch[i].no_logits) {
      ReportKvProgress(s);
      continue;
    }
    if (greedy[i] != kNoToken) {
      // Chosen by the model: no logits row for it.
      ++stats_.greedy_rows_on_backend;
      if (!s.finished) Deliver(s, {}, greedy[i]);
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

bool Engine::GreedyOnly(const Sequence& seq) const {
  const RunningRequest& req = *seq.req;
  const EngineRequest& r = req.r;
  const SamplingParams& p = r.sampling;
  if (r.role == EngineRole::kPrefillOnly || req.fork_pending || r.keep_logits ||
      seq.matcher.has_value()) {
    return false;
  }
  if (p.temperature != 0.0f || !p.logit_bias.empty() || p.repetition_penalty != 1.0f ||
      p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f || p.top_logprobs >= 0) {
    return false;
  }
  // Before min_tokens the stop ids are suppressed (NextToken): the sampler's business.
  return seq.generated() + 1 > r.min_tokens || req.stop_ids.empty();
}

void Engine::Deliver(Sequence& seq, absl::Span<const float> logits, TokenId greedy) {
  RunningRequest& req = *seq.req;
  if (req.r.role == EngineRole::kPrefillOnly) return DeliverPrefillOnly(seq, logits);
  if (req.fork_pending && seq.choice == 0) {
    req.fork_pending = false;
    Fork(seq, logits);
  }
  FinishReason reason = FinishReason::kNone;
  TokenEvent e = NextToken(seq, logits, &reason, greedy);
  if (reason == FinishReason::kNone) {
    Emit(seq, e);
    return;
  }
  Finish(seq, reason, std::move(e));
}

TokenEvent Engine::NextToken(Sequence& seq, absl::Span<const float> logits, FinishReason* reason,
                             TokenId greedy) {
  RunningRequest& req = *seq.req;
  const EngineRequest& r = req.r;
  // Before min_tokens, no stop token may be chosen and no stop string may end the text.
  const bool may_stop = seq.generated() + 1 > r.min_tokens;
  absl::Span<const uint32_t> allowed;
  if (greedy == kNoToken && seq.matcher.has_value()) {
    const auto mask_start = std::chrono::steady_clock::now();
    seq.matcher->ComputeMask(absl::MakeSpan(seq.mask));
    stats_.grammar_mask_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - mask_start).count();
    ++stats_.grammar_masks;
    bool any = false;
    for (uint32_t w : seq.mask) any |= w != 0;
    if (!any && seq.matcher->Accepting()) {
      // Complete with nothing to continue it and no stop id to end it (ignore_eos): it ends here.
      *reason = FinishReason::kStop;
      return TokenEvent{};
    }
    if (!any) {  // a grammar no token of the vocabulary can continue
      *reason = FinishReason::kError;
      TokenEvent e;
      e.error = "grammar: no token of the vocabulary can continue the output";
      e.error_code = absl::StatusCode::kInvalidArgument;
      return e;
    }
    allowed = seq.mask;
  }
  SampledToken sampled;
  if (greedy != kNoToken) {
    sampled.token = greedy;  // the model's greedy choice (GreedyOnly: nothing else is read)
  } else {
    sampled =
        Sample(logits, r.sampling, req.prompt_set, seq.state, static_cast<uint64_t>(seq.choice),
               may_stop ? absl::Span<const TokenId>() : absl::MakeConstSpan(req.stop_ids), allowed);
  }
  if (seq.matcher.has_value()) {
    if (absl::Status s = seq.matcher->Accept(static_cast<uint32_t>(sampled.token)); !s.ok()) {
      // A matcher limit (the mask allowed it): the choice ends without the token.
      *reason = FinishReason::kError;
      TokenEvent e;
      e.error = absl::StrCat("grammar: ", s.message());
      e.error_code = s.code();
      return e;
    }
  }
  seq.state.Observe(sampled.token);
  seq.tokens.push_back(sampled.token);
  ++stats_.generated_tokens;
  TokenEvent e;
  e.has_token = true;
  e.token = sampled.token;
  e.logprob = sampled.logprob;
  e.top_logprobs = sampled.top;
  if (r.keep_logits) e.logits.assign(logits.begin(), logits.end());
  // With a grammar, its matcher decides: a stop id ends the choice where the grammar is complete
  // (even before min_tokens when it allowed nothing else); elsewhere a stop id with bytes is text.
  const bool stop_token =
      seq.matcher.has_value()
          ? seq.matcher->Stopped()
          : may_stop && std::binary_search(req.stop_ids.begin(), req.stop_ids.end(), sampled.token);
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
  e.blocks.assign(seq.kv.blocks.begin(), seq.kv.blocks.begin() + complete);
  Emit(seq, e);
}

void Engine::DeliverPrefillOnly(Sequence& seq, absl::Span<const float> logits) {
  RunningRequest& req = *seq.req;
  // Every choice's first token comes from these logits (with a resume point, only `seq`'s
  // choice runs). The other choices need no KV of their own: they exist for this moment.
  std::vector<std::unique_ptr<Sequence>> others;
  std::vector<Sequence*> choices = {&seq};
  if (req.fork_pending) {
    req.fork_pending = false;
    for (int32_t c = 1; c < req.r.n; ++c) {
      others.push_back(NewSequence(seq.req, c, seq.arrival, tokenizer_));
      // (The start state was made once for choice 0: a fresh one cannot fail.)
      CHECK_OK(StartMatcher(*others.back(), {}));
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
    handoffs_.Hold(req.r.id, std::move(seq.kv));
    seq.kv = KvTables();
  }
  for (size_t i = 0; i < choices.size(); ++i) {
    Finish(*choices[i], reasons[i], std::move(events[i]));
  }
}

void Engine::Fork(Sequence& first, absl::Span<const float> logits) {
  // Choices 1..n-1 share the prompt's full blocks and copy its partial last block.
  const int64_t full = first.prompt_len / block_tokens_;
  for (int32_t c = 1; c < first.req->r.n; ++c) {
    auto seq = NewSequence(first.req, c, first.arrival, tokenizer_);
    CHECK_OK(StartMatcher(*seq, {}));  // (as choice 0's, from the start state)
    seq->hashes = first.hashes;
    seq->cached_blocks = std::min<int64_t>(first.cached_blocks, full);
    const bool copied = kv_.Share(first.kv, first.prompt_len, &seq->kv);
    if (copied) {
      seq->computed = first.prompt_len;
      seq->admitted = true;
      seq->window_floor = first.window_floor;
    }
    seq->offer_from = std::min<int64_t>(first.offer_from, full);
    ++first.req->live;
    Sequence& added = *seq;
    scheduler_.Add(std::move(seq));
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
  if (seq.req->live == 1) {
    // Ended before its first admission: its imports stay cached, held no more.
    scheduler_.ForgetImports(*seq.req);
  }
  if (seq.req->live == 1) parking_.erase(seq.req->r.id);  // its last choice ends
  if (--seq.req->live == 0 && !seq.req->handed_off) {
    // Reusable from its last event on: whoever sees that event finds the id free (its
    // sequences leave seqs_ at the end of this step, before a new submission is added).
    absl::MutexLock lock(&mu_);
    live_ids_.erase(seq.req->r.id);
  }
  if (reason == FinishReason::kHandoff) {
    const KvTables* handoff = handoffs_.Find(seq.req->r.id);
    CHECK(handoff != nullptr);
    event.blocks = handoff->blocks;
    event.window_blocks = handoff->window_blocks;
  }
  scheduler_.Release(seq);  // (a handoff's moved to handoffs_)
  seq.admitted = false;
  const std::string error = event.error;
  const absl::StatusCode event_code = event.error_code;
  Emit(seq, event);
  RunningRequest& req = *seq.req;
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
  scheduler_.RemoveFinished();
  kv_.PublishEvents(&journal_);
  EngineStats published = stats_;
  for (const auto& layer : model_->expert_token_counts()) {
    published.expert_tokens.resize(std::max(published.expert_tokens.size(), layer.size()), 0);
    for (size_t e = 0; e < layer.size(); ++e) published.expert_tokens[e] += layer[e];
  }
  int64_t waiting_requests = 0;
  scheduler_.Census(&published, &waiting_requests);
  published.total_blocks = kv_.num_blocks();
  published.free_blocks = kv_.pool().num_free();
  published.cached_blocks = kv_.cached_blocks();
  published.window_cached_blocks = kv_.window_cached_blocks();
  absl::MutexLock lock(&mu_);
  // Released handoffs' ids become reusable.
  for (const std::string& id : released_ids_) live_ids_.erase(id);
  released_ids_.clear();
  published_ = std::move(published);
  published_waiting_requests_ = waiting_requests;
}

EngineStats Engine::stats() const {
  absl::MutexLock lock(&mu_);
  EngineStats s = published_;
  s.waiting += static_cast<int64_t>(submitted_.size());
  s.queued_tokens += submitted_tokens_;
  return s;
}

void Engine::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Engine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void Engine::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // (Blocks a service gave back: a step publishes the pool's new state.)
      WaitForNews(/*or_work_left=*/true);
      if (stopping_) return;
    }
    auto worked = Step();
    if (options_.on_pass) options_.on_pass();
    if (worked.ok() && !*worked) {
      // Nothing runnable (e.g. waiting for blocks held by handoffs): wait for news.
      absl::MutexLock lock(&mu_);
      WaitForNews(/*or_work_left=*/false);
      if (stopping_) return;
    }
  }
}

void Engine::WaitForNews(bool or_work_left) {
  // Until the next handoff expires, if any (handoffs_ is this thread's).
  absl::Time give_up = absl::InfiniteFuture();
  if (!handoffs_.empty()) {
    const absl::Duration left =
        std::max(absl::ZeroDuration(), handoffs_.NextExpiry() - clock_->Monotonic());
    give_up = absl::Now() + left + absl::Milliseconds(1);
  }
  while (!stopping_ && !InboxHasWork() && !blocks_freed_ &&
         !(or_work_left && published_.running + published_.waiting > 0)) {
    if (wake_.WaitWithDeadline(&mu_, give_up)) return;  // the handoff's expiry
  }
}

}  // namespace ferry
