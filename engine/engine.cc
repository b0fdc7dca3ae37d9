#include "engine/engine.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/common/block_hash.h"
#include "engine/common/log.h"
#include "engine/sampling/stop_strings.h"
#include "engine/tokenizer/incremental_detokenizer.h"

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
  Hash128 root;               // of the block-hash chain (model, tenant salt)
  bool fork_pending = false;  // choices 1..n-1 start from choice 0's prompt
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
  SamplerState state;
  StopStringMatcher stop{{}};
  std::unique_ptr<IncrementalDetokenizer> detok;
  int64_t step_chunk = 0;  // tokens scheduled in the current step

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  // Rank: lower runs first.
  std::tuple<int32_t, int64_t, int32_t> rank() const { return {req->r.priority, arrival, choice}; }
};

namespace {

bool SameLayout(const KvBlockLayout& a, const KvBlockLayout& b) {
  return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.dtype == b.dtype && a.block_tokens == b.block_tokens;
}

void ReleaseTable(KvBlockPool& pool, std::vector<BlockId>& table) {
  std::vector<BlockId> held;
  for (BlockId b : table) {
    if (b != kNoBlock) held.push_back(b);
  }
  CHECK(pool.Release(held).ok());
  table.clear();
}

}  // namespace

int64_t Engine::WindowBlocksPerSequence(const Transformer& model, const EngineOptions& options,
                                        int32_t block_tokens) {
  // During a step a sequence holds the blocks from the one with the first key its first new row
  // sees (window - 1 positions back) to the one of its last new row: at most
  // ceil((window - 2 + chunk) / block_tokens) + 1.
  const int64_t chunk = std::min(options.prefill_chunk, options.max_batch_tokens);
  const int64_t span = std::max<int64_t>(0, model.max_window() - 2 + chunk);
  return (span + block_tokens - 1) / block_tokens + 1;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(Transformer* model, KvBlockPool* pool,
                                                       const Tokenizer* tokenizer,
                                                       const EngineOptions& options,
                                                       KvBlockPool* window_pool) {
  if (options.max_batch_tokens < 1 || options.max_running < 1 || options.prefill_chunk < 1 ||
      options.max_n < 1 || options.prefix_cache_bytes < 0 || options.window_cache_bytes < 0) {
    return absl::InvalidArgumentError("engine options must be positive");
  }
  const int32_t bt = pool->layout().block_tokens;
  if (window_pool == nullptr) {
    if (!SameLayout(model->KvLayoutFor(bt), pool->layout())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the KV pool's layout (", pool->layout().DebugString(),
                       ") is not the model's (", model->KvLayoutFor(bt).DebugString(), ")"));
    }
  } else {
    if (model->FullKvLayoutFor(bt).num_layers == 0) {
      return absl::InvalidArgumentError(
          "a window pool needs a model with both sliding-window and full-attention layers");
    }
    if (!SameLayout(model->FullKvLayoutFor(bt), pool->layout()) ||
        !SameLayout(model->WindowKvLayoutFor(bt), window_pool->layout())) {
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

Engine::Engine(Transformer* model, KvBlockPool* pool, const Tokenizer* tokenizer,
               const EngineOptions& options, KvBlockPool* window_pool)
    : model_(model),
      pool_(pool),
      tokenizer_(tokenizer),
      options_(options),
      window_pool_(window_pool),
      block_tokens_(pool->layout().block_tokens),
      cache_(pool, options.prefix_cache_bytes) {
  if (window_pool_ != nullptr) {
    // Its blocks are of use to this engine only: nobody is told about them.
    window_cache_ = std::make_unique<PrefixCache>(window_pool_, options.window_cache_bytes,
                                                  /*record_events=*/false);
  }
}

Engine::~Engine() {
  Stop();
  DrainInbox();
  for (auto& seq : seqs_) {
    if (!seq->finished) Finish(*seq, FinishReason::kAbort, TokenEvent{});
  }
  RemoveFinished();
  for (auto& [id, handoff] : handoffs_) ReleaseHandoffBlocks(handoff);
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
  if (absl::Status s = r.sampling.Validate(vocab); !s.ok()) return s;
  for (TokenId t : r.stop_token_ids) {
    if (t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token ", t, " is outside the vocabulary"));
    }
  }
  if (!r.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError("stop strings need an engine with a tokenizer");
  }
  if (absl::Status s = StopStringMatcher::Validate(r.stop); !s.ok()) return s;
  if (!r.resume.empty() && static_cast<int32_t>(r.resume.size()) != r.n) {
    return absl::InvalidArgumentError("resume needs one point per choice");
  }
  for (const ResumePoint& p : r.resume) {
    auto state = SamplerState::Parse(p.sampler_state);
    if (!state.ok()) return state.status();
    if (state->generated() != static_cast<int64_t>(p.generated.size())) {
      return absl::InvalidArgumentError("resume: sampler state and tokens disagree");
    }
    for (TokenId t : p.generated) {
      if (t >= vocab) return absl::InvalidArgumentError("resume: token out of range");
    }
    if (static_cast<int64_t>(p.generated.size()) >= r.max_tokens) {
      return absl::InvalidArgumentError("resume: max_tokens already reached");
    }
  }
  if (r.role == EngineRole::kDecodeOnly) {
    if (r.n != 1 || r.resume.size() != 1 || r.resume[0].generated.empty()) {
      return absl::InvalidArgumentError(
          "decode-only requests carry one choice that resumes after the first token");
    }
    if (static_cast<int64_t>(r.imported_blocks.size()) !=
        pool_->layout().BlocksFor(static_cast<int64_t>(r.prompt.size()))) {
      return absl::InvalidArgumentError("decode-only: imported blocks do not cover the prompt");
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
      // Present from the block the next row (at prompt length) sees; before it, optional.
      const int64_t first = FirstWindowBlock(static_cast<int64_t>(r.prompt.size()));
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
  } else if (!r.imported_blocks.empty() || !r.imported_window_blocks.empty()) {
    return absl::InvalidArgumentError("imported blocks are for decode-only requests");
  }
  if (r.role == EngineRole::kPrefillOnly && r.n != 1) {
    return absl::InvalidArgumentError("prefill-only requests have one choice");
  }
  return absl::OkStatus();
}

absl::Status Engine::Submit(EngineRequest request) {
  if (absl::Status s = Validate(request); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_ids_.insert(request.id).second) {
      return absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is already live"));
    }
    submitted_.push_back(std::move(request));
  }
  wake_.notify_one();
  return absl::OkStatus();
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

void Engine::DrainInbox() {
  std::deque<EngineRequest> submitted;
  std::vector<std::string> aborted, released;
  {
    std::lock_guard<std::mutex> lock(mu_);
    submitted.swap(submitted_);
    aborted.swap(aborted_);
    released.swap(released_);
  }
  for (EngineRequest& r : submitted) AddRequest(std::move(r));
  for (const std::string& id : aborted) {
    for (auto& seq : seqs_) {
      if (!seq->finished && seq->req->r.id == id) Finish(*seq, FinishReason::kAbort, TokenEvent{});
    }
  }
  for (const std::string& id : released) {
    auto it = handoffs_.find(id);
    if (it == handoffs_.end()) continue;
    ReleaseHandoffBlocks(it->second);
    handoffs_.erase(it);
  }
  RemoveFinished();
}

void Engine::AddRequest(EngineRequest r) {
  auto req = std::make_shared<Request>();
  req->r = std::move(r);
  const EngineRequest& er = req->r;
  req->prompt_set.insert(er.prompt.begin(), er.prompt.end());
  req->root = RootBlockHash({model_->fingerprint(), er.cache_salt, ""});
  const int64_t arrival = arrivals_++;
  const int32_t first_choices = er.resume.empty() ? 1 : er.n;
  req->fork_pending = er.resume.empty() && er.n > 1;
  for (int32_t c = 0; c < first_choices; ++c) {
    auto seq = std::make_unique<Sequence>();
    seq->req = req;
    seq->choice = c;
    seq->arrival = arrival;
    seq->prompt_len = static_cast<int64_t>(er.prompt.size());
    seq->tokens = er.prompt;
    seq->stop = StopStringMatcher(er.stop);
    if (tokenizer_ != nullptr) {
      seq->detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_, /*skip_special=*/true);
    }
    if (!er.resume.empty()) {
      const ResumePoint& p = er.resume[c];
      seq->tokens.insert(seq->tokens.end(), p.generated.begin(), p.generated.end());
      seq->state = *SamplerState::Parse(p.sampler_state);
      seq->stop.Restore(p.held_text);
      // The detokenizer sees the delivered tokens again; their text was delivered already.
      if (seq->detok != nullptr) {
        for (TokenId t : p.generated) seq->detok->Push(t).IgnoreError();
      }
    }
    if (er.role == EngineRole::kDecodeOnly) {
      seq->blocks = er.imported_blocks;
      seq->window_blocks = er.imported_window_blocks;
      seq->computed = seq->prompt_len;
      seq->admitted = true;
    }
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
    // Preempt the admitted sequence ranked last, if it ranks after `seq`.
    Sequence* victim = nullptr;
    for (auto& s : seqs_) {
      if (s->admitted && !s->finished && s.get() != &seq && s->rank() > seq.rank() &&
          (victim == nullptr || s->rank() > victim->rank())) {
        victim = s.get();
      }
    }
    if (victim == nullptr) return false;
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
  seq.admitted = false;
  ++stats_.preemptions;
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
  const absl::Span<const Hash128> hashes(seq.hashes);
  if (window_pool_ == nullptr) {
    seq.blocks = cache_.Lookup(hashes.subspan(0, full));
  } else {
    // k cached blocks are of use when the window cache also holds the window layers' blocks
    // that the row after them (at k * block_tokens) sees: blocks [FirstWindowBlock, k).
    int64_t k = 0;
    while (k < full && cache_.Contains(hashes[k])) ++k;
    auto window_cached = [&](int64_t k) {
      for (int64_t i = FirstWindowBlock(k * block_tokens_); i < k; ++i) {
        if (!window_cache_->Contains(hashes[i])) return false;
      }
      return true;
    };
    while (k > 0 && !window_cached(k)) --k;
    seq.blocks = cache_.Lookup(hashes.subspan(0, k));
    CHECK_EQ(static_cast<int64_t>(seq.blocks.size()), k);
    seq.window_begin = FirstWindowBlock(k * block_tokens_);
    seq.window_blocks.assign(seq.window_begin, kNoBlock);
    const std::vector<BlockId> window =
        window_cache_->LookupAll(hashes.subspan(seq.window_begin, k - seq.window_begin));
    CHECK_EQ(static_cast<int64_t>(window.size()), k - seq.window_begin);
    seq.window_blocks.insert(seq.window_blocks.end(), window.begin(), window.end());
    seq.window_cached = k;
  }
  seq.computed = static_cast<int64_t>(seq.blocks.size()) * block_tokens_;
  seq.cached_blocks = static_cast<int64_t>(seq.blocks.size());
  stats_.cached_tokens += seq.computed;
  seq.admitted = true;
  return seq.computed;
}

void Engine::CacheFullBlocks(Sequence& seq) {
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
      s->admitted = false;
      stats_.cached_tokens -= cached;
      break;
    }
    ++running;
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
    batch.push_back(f);
  }
  std::vector<float>& logits = logits_;  // kept across steps: no fresh pages every step
  logits.clear();
  absl::Status status = model_->Forward(batch, *pool_, &logits, window_pool_);
  ++stats_.steps;
  if (!status.ok()) {
    for (Sequence* s : scheduled) {
      TokenEvent e;
      e.error = std::string(status.message());
      Finish(*s, FinishReason::kError, std::move(e));
    }
    RemoveFinished();
    return status;
  }
  const int64_t vocab = model_->config().vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence& s = *scheduled[i];
    if (s.computed < s.prompt_len) {
      stats_.prompt_tokens_computed += std::min(s.step_chunk, s.prompt_len - s.computed);
    }
    s.computed += s.step_chunk;
    CacheFullBlocks(s);
    Slide(s);
    if (batch[i].no_logits) continue;
    const absl::Span<const float> l(logits.data() + row * vocab, vocab);
    ++row;
    if (!s.finished) Deliver(s, l);
  }
  RemoveFinished();
  return true;
}

void Engine::Deliver(Sequence& seq, absl::Span<const float> logits) {
  Request& req = *seq.req;
  const EngineRequest& r = req.r;
  const SampledToken sampled =
      Sample(logits, r.sampling, req.prompt_set, seq.state, static_cast<uint64_t>(seq.choice));
  if (req.fork_pending && seq.choice == 0) {
    req.fork_pending = false;
    Fork(seq, logits);
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
  const bool stop_token = std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(),
                                    sampled.token) != r.stop_token_ids.end();
  if (seq.detok != nullptr && !stop_token) {
    auto delta = seq.detok->Push(sampled.token);
    if (delta.ok()) e.text = seq.stop.Push(*delta);
  }
  FinishReason reason = FinishReason::kNone;
  if (stop_token || seq.stop.stopped()) {
    reason = FinishReason::kStop;
  } else if (seq.generated() >= r.max_tokens ||
             static_cast<int64_t>(seq.tokens.size()) >= model_->max_positions()) {
    reason = FinishReason::kLength;
  } else if (r.role == EngineRole::kPrefillOnly) {
    reason = FinishReason::kHandoff;
  }
  if (reason == FinishReason::kNone) {
    Emit(seq, e);
    return;
  }
  Finish(seq, reason, std::move(e));
}

void Engine::Fork(Sequence& first, absl::Span<const float> logits) {
  // Choices 1..n-1 share the prompt's full blocks and copy its partial last block.
  const int64_t full = first.prompt_len / block_tokens_;
  const bool partial = first.prompt_len % block_tokens_ != 0;
  for (int32_t c = 1; c < first.req->r.n; ++c) {
    auto seq = std::make_unique<Sequence>();
    seq->req = first.req;
    seq->choice = c;
    seq->arrival = first.arrival;
    seq->prompt_len = first.prompt_len;
    seq->tokens = first.tokens;
    seq->stop = StopStringMatcher(first.req->r.stop);
    if (tokenizer_ != nullptr) {
      seq->detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_, true);
    }
    seq->hashes = first.hashes;
    seq->cached_blocks = std::min<int64_t>(first.cached_blocks, full);
    // The partial block's copies, in each pool (none: the choice waits).
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
    }
    if (copied) {
      seq->blocks.assign(first.blocks.begin(), first.blocks.begin() + full);
      CHECK(pool_->AddRef(seq->blocks).ok());
      if (partial) {
        CHECK(pool_->CopyBlock(first.blocks[full], copy).ok());
        seq->blocks.push_back(copy);
      }
      if (window_pool_ != nullptr) {
        // The window blocks still held (full ones shared, the partial one copied).
        seq->window_blocks.assign(first.window_blocks.begin(), first.window_blocks.begin() + full);
        std::vector<BlockId> shared;
        for (BlockId b : seq->window_blocks) {
          if (b != kNoBlock) shared.push_back(b);
        }
        CHECK(window_pool_->AddRef(shared).ok());
        if (partial) {
          CHECK(window_pool_->CopyBlock(first.window_blocks[full], window_copy).ok());
          seq->window_blocks.push_back(window_copy);
        }
        seq->window_begin = std::min<int64_t>(first.window_begin, full);
        seq->window_cached = std::min<int64_t>(first.window_cached, full);
      }
      seq->computed = first.prompt_len;
      seq->admitted = true;
      Deliver(*seq, logits);  // its first token, from the same logits with its own choice
    }
    // Without a block to copy into, the choice waits and recomputes (from the cache).
    seqs_.push_back(std::move(seq));
  }
}

void Engine::Emit(const Sequence& seq, TokenEvent& event) {
  event.request_id = seq.req->r.id;
  event.choice = seq.choice;
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
  event.sampler_state = seq.state.Serialize();
  event.held_text = seq.stop.held();
  if (reason == FinishReason::kHandoff) {
    event.blocks = seq.blocks;
    event.window_blocks = seq.window_blocks;
    handoffs_[seq.req->r.id] = Handoff{std::move(seq.blocks), std::move(seq.window_blocks)};
    seq.blocks.clear();
    seq.window_blocks.clear();
  } else {
    ReleaseBlocks(seq);
  }
  seq.admitted = false;
  Emit(seq, event);
}

void Engine::RemoveFinished() {
  seqs_.erase(std::remove_if(seqs_.begin(), seqs_.end(),
                             [](const std::unique_ptr<Sequence>& s) { return s->finished; }),
              seqs_.end());
  // Ids of requests with no live sequence left become reusable.
  absl::flat_hash_set<std::string> live;
  for (const auto& s : seqs_) live.insert(s->req->r.id);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = live_ids_.begin(); it != live_ids_.end();) {
    const bool queued = std::any_of(submitted_.begin(), submitted_.end(),
                                    [&](const EngineRequest& r) { return r.id == *it; });
    if (!live.contains(*it) && !queued && !handoffs_.contains(*it)) {
      live_ids_.erase(it++);
    } else {
      ++it;
    }
  }
  published_ = stats_;
  published_.expert_tokens.clear();
  for (const auto& layer : model_->expert_token_counts()) {
    published_.expert_tokens.resize(std::max(published_.expert_tokens.size(), layer.size()), 0);
    for (size_t e = 0; e < layer.size(); ++e) published_.expert_tokens[e] += layer[e];
  }
  published_.running = 0;
  published_.waiting = 0;
  for (const auto& s : seqs_) (s->admitted ? published_.running : published_.waiting)++;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = published_;
  s.waiting += static_cast<int64_t>(submitted_.size());
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
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        return stopping_ || !submitted_.empty() || !aborted_.empty() || !released_.empty() ||
               published_.running + published_.waiting > 0;
      });
      if (stopping_) return;
    }
    auto worked = Step();
    if (worked.ok() && !*worked) {
      // Nothing runnable (e.g. waiting for blocks held by handoffs): wait for news.
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        return stopping_ || !submitted_.empty() || !aborted_.empty() || !released_.empty();
      });
      if (stopping_) return;
    }
  }
}

}  // namespace ferry
