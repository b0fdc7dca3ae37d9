// What the engine is asked and what it answers (engine.h): a request (EngineRequest) and its
// events (TokenEvent), a resumed choice (ResumePoint), the blocks it computed (ComputedBlock)
// and what one step did (StepInfo). Plain values; the contract of how the engine uses them is
// engine.h's.

#ifndef FERRY_ENGINE_REQUEST_H_
#define FERRY_ENGINE_REQUEST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "engine/common/token_id.h"
#include "engine/grammar/compiled_constraint.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/prompt_image.h"
#include "engine/sampling/sampler.h"

namespace ferry {

enum class FinishReason { kNone, kStop, kLength, kAbort, kError, kHandoff };
const char* FinishReasonName(FinishReason reason);

enum class EngineRole { kPrefillAndDecode, kPrefillOnly, kDecodeOnly };

struct TokenEvent {
  std::string request_id;
  int32_t choice = 0;
  bool has_token = false;  // false: an event without a token (abort, error)
  TokenId token = 0;
  std::string text;   // text that became final with this token
  float logprob = 0;  // with sampling.top_logprobs >= 0
  std::vector<std::pair<TokenId, float>> top_logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string error;                                    // kError
  absl::StatusCode error_code = absl::StatusCode::kOk;  // kError: kResourceExhausted, kInternal...
  // kStop: `token` is a stop token (end of sequence or one of stop_token_ids), or the stop
  // string that matched.
  bool stop_token = false;
  std::string matched_stop;
  // Prompt tokens whose KV came from the prefix cache when the request was first admitted (the
  // rest were computed), on every event once known.
  int64_t cached_tokens = 0;
  // From Submit to the request's first admission (its wait in the queue), on every event once
  // known; what came after is compute.
  absl::Duration queued = absl::ZeroDuration();
  std::vector<float> logits;  // the row the token was chosen from (keep_logits)
  // kHandoff: the request's KV (see Roles above). A progress event (stream_kv; no token, no
  // finish): the leading blocks of the table whose KV is complete, all layers.
  std::vector<BlockId> blocks;
  // kHandoff on a window pool: the window layers' table, indexed like `blocks`, kNoBlock for the
  // blocks before the window.
  std::vector<BlockId> window_blocks;
  // Of cached_tokens, those the request's imported blocks supplied (a KV store's), on every event
  // once known.
  int64_t imported_tokens = 0;
  // Positions a window replay recomputed at the first admission (SWA replay), once known.
  int64_t replayed_tokens = 0;
  // A bounded replay made the request's KV an approximation: nothing of it may be cached
  // anywhere. With it, the window layers see no key before window_floor (a decode side that
  // continues the request must use the same floor).
  bool approximate_kv = false;
  int64_t window_floor = 0;
  // With every finish: what continuing this choice elsewhere needs (ResumePoint).
  SamplerState sampler_state;
  // With every token and every finish: the text the stop-string matcher holds back after it
  // (ResumePoint::held_text of a continuation from here; the sampler state follows from the
  // tokens).
  std::string held_text;
};

// A choice that already produced `generated` tokens (all already delivered to the client) and
// continues here exactly as if it had never stopped.
struct ResumePoint {
  std::vector<TokenId> generated;
  SamplerState sampler_state;  // after `generated`
  std::string held_text;       // text held back by the stop-string matcher
  int32_t choice = 0;          // its index among the request's n choices (sampling is keyed by it)
};

// A full block of KV a request computed (EngineRequest::on_computed_blocks): block `index` of its
// table, chained hash `hash`, in the full-attention pool.
struct ComputedBlock {
  int64_t index = 0;
  Hash128 hash;
  BlockId block = kNoBlock;
};

struct EngineRequest {
  std::string id;  // unique among live requests
  std::vector<TokenId> prompt;
  SamplingParams sampling;
  int32_t n = 1;  // choices, sampled with choice index 0..n-1
  int64_t max_tokens = 16;
  // No stop (token, end of sequence or string) ends a choice before this many output tokens.
  int64_t min_tokens = 0;
  std::vector<TokenId> stop_token_ids;
  // Special tokens whose text stays in the output text (the others are skipped).
  std::vector<TokenId> keep_special_token_ids;
  bool ignore_eos = false;        // do not stop on the model's end-of-sequence ids
  std::vector<std::string> stop;  // needs the engine's tokenizer
  // A grammar every choice's output obeys (null: none), made for the engine's vocabulary
  // (Engine::Vocabulary(); another vocabulary is an InvalidArgument). Each choice runs its own
  // matcher: the sampler allows only the tokens the grammar allows next (EOS and stop ids only
  // where the grammar is complete, and then whatever min_tokens says), and a choice whose grammar
  // is complete with nothing left to continue it ends with kStop. A resume point's generated
  // tokens are replayed into a fresh matcher (a token the grammar refuses: InvalidArgument). A
  // matcher limit hit ends the choice with kError (ResourceExhausted), never with a token the
  // grammar did not allow.
  std::shared_ptr<const grammar::CompiledConstraint> constraint;
  int32_t priority = 0;    // higher runs first; then arrival
  std::string cache_salt;  // the tenant's, enters the block hashes
  // Images in the prompt (prompt_image.h), sorted by placeholder_start: their embeddings are
  // the input rows at their placeholder positions, and they enter the block hashes. Held for the
  // request's life: recomputing the prompt (preemption, SWA replay) reads them again.
  std::vector<PromptImageInput> images;
  EngineRole role = EngineRole::kPrefillAndDecode;
  bool keep_logits = false;
  // kPrefillOnly: progress events as blocks of the prompt complete (see Roles above).
  bool stream_kv = false;
  // Empty, or the choices to run (distinct choice indexes < n; choices not listed finished
  // elsewhere and are not run).
  std::vector<ResumePoint> resume;
  // One reference each, handed to the engine (see Ownership). kDecodeOnly: the KV of every
  // position it resumes after. Otherwise (imports): the KV of the prompt's first
  // imported_blocks.size() full blocks (none may hold the prompt's last token), in the
  // full-attention pool; the first imported_cached_blocks of them were this engine's own cached
  // blocks (ReserveImport's cached_blocks), the rest came from elsewhere.
  std::vector<BlockId> imported_blocks;
  int64_t imported_cached_blocks = 0;
  // kDecodeOnly on a window pool: the window layers' table (kNoBlock before the window).
  std::vector<BlockId> imported_window_blocks;
  // kDecodeOnly: the prefill side's TokenEvent::window_floor / approximate_kv.
  int64_t window_floor = 0;
  bool approximate_kv = false;
  // Full blocks of the full-attention pool that this engine computes for the request (prompt
  // and output; not those it reused from a cache or an import, nor an approximation), after the
  // step that completed them, on the engine thread. A callback that uses a block after it
  // returns takes a reference (KvBlockPool::AddRef) first. May be empty.
  std::function<void(absl::Span<const ComputedBlock>)> on_computed_blocks;
  std::function<void(const TokenEvent&)> on_event;
};

// What one step did, for a service's metrics (EngineOptions::on_step).
struct StepInfo {
  double seconds = 0;          // the whole step: scheduling, the forward pass, sampling, events
  int64_t prefill_tokens = 0;  // positions computed for prompts (and recomputation)
  int64_t decode_tokens = 0;   // sequences that decoded one token
};

}  // namespace ferry

#endif  // FERRY_ENGINE_REQUEST_H_
