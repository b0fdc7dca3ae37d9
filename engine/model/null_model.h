// NullModel: the `--engine=null` model (and, timed by a SimTiming, `--engine=sim`'s;
// ARCHITECTURE.md §1): a deterministic token source behind the same ForwardModel seam as the real
// Transformer, so that everything above it (the engine's admission, KV accounting, block hashes,
// prefix cache and events; the worker's streaming, usage, metrics) runs for real while the model
// costs only the time it is told to. The router's overhead benchmark, scripted API tests and the
// simulator build on it.
//
// What it computes. Each position p of a sequence has a 64-bit state
//   s_p = SplitMix64(s_{p-1} ^ (token_p * 0x9E3779B97F4A7C15) ^ (p << 32)),   s_{-1} = seed,
// kept in the KV cache itself (slot p of the one layer's keys holds s_p's two 32-bit halves), so
// it depends on the whole prefix exactly as a real model's output does: a prefix from the cache,
// KV moved to another process, chunking or batching give the same states only when the KV
// machinery is right. The logits of position p are -30 everywhere except for four candidates
// drawn from `tokens` by SplitMix64(s_p + j), j = 0..3, which get 8, 7, 6 and 5 (a candidate
// drawn twice keeps its first value): greedy decoding picks the first, sampling mostly the first
// few, and nothing else is ever likely. With `tokens` the ordinary (non-special) tokens of the
// model's tokenizer, the text is made of the model's vocabulary and never ends on its own: a
// choice ends at max_tokens, a stop string or a stop id.
//
// Scripts (the scripted token source of API tests). With `scripts`, a sequence replies with a
// script's text: each script is a trigger (token ids; empty: armed from the first position) and
// a reply. The state of a position is then (the armed script, how much of its reply the sequence
// has just written, how much of each trigger it has just matched), packed in the same 64 bits:
// the position after a completed trigger arms its script (unless a reply is being written), and
// an armed script's next reply token gets logit 8, its end the first end-of-sequence id, so that
// greedy decoding writes the reply of the last trigger the prompt held and then stops. A token
// that breaks a reply restarts it. Positions with no armed script draw candidates as above. At
// most 4 scripts, triggers of at most 255 tokens, replies of fewer than 2^24.
//
// Timing. A Forward's modeled time is step_overhead + (prefill tokens) /
// prefill_tokens_per_second + (decode_token_seconds when a row decodes), where a sequence
// contributing one token counts as decoding and every other token as prefill; with `timing` (the
// simulated engine, `--engine=sim`: engine/model/sim_timing.h) it is instead
// timing->StepSeconds of the batch's rows (a row per sequence: start = its start_position,
// tokens = its new tokens), which replaces the three simple timings. A Forward returns no earlier
// than its start + the modeled time, unless `virtual_time` (the discrete-event simulator, which
// advances a clock of its own by last_forward_seconds()): then it never sleeps.
//
// Fingerprint: XXH3-128 of "FERRYNUL" u32 1 (version) u64 vocab_size u64 max_positions u64 seed
// hash128 identity (little-endian), then, with scripts, each script's u32 trigger length, trigger
// ids (u32), u32 reply length, reply ids: a null model never shares cache entries with a real
// one, or with a null model of another vocabulary, identity or script.
//
// Not thread-safe: one engine thread owns it.

#ifndef FERRY_ENGINE_MODEL_NULL_MODEL_H_
#define FERRY_ENGINE_MODEL_NULL_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/forward_model.h"
#include "engine/model/sim_timing.h"

namespace ferry {

struct NullScript {
  std::vector<TokenId> trigger;  // empty: armed from the first position
  std::vector<TokenId> reply;
};

struct NullModelOptions {
  // vocab_size, max_position_embeddings and eos_token_ids are used (the engine reads them).
  ModelConfig config;
  // Ids the source emits; empty: every id of the vocabulary.
  std::vector<TokenId> tokens;
  // Enters the fingerprint (e.g. the tokenizer's digest).
  Hash128 identity;
  uint64_t seed = 0;
  double prefill_tokens_per_second = 0;  // 0: prefill costs nothing
  double decode_token_seconds = 0;       // a step with decoding rows lasts at least this
  double step_overhead_seconds = 0;
  std::vector<NullScript> scripts;  // empty: the hash-chained source
  // The simulated engine's timing model (non-null: replaces the three timings above).
  std::shared_ptr<const SimTiming> timing;
  // Never sleep: a Forward returns at once, its modeled time in last_forward_seconds().
  bool virtual_time = false;
};

class NullModel final : public ForwardModel {
 public:
  static absl::StatusOr<std::unique_ptr<NullModel>> Create(NullModelOptions options);

  const ModelConfig& config() const override { return options_.config; }
  const Hash128& fingerprint() const override { return fingerprint_; }
  // One layer, one KV head of dimension 2, f32: 8 bytes of state per position (keys), unused
  // values.
  KvBlockLayout KvLayoutFor(int32_t block_tokens) const override;
  KvBlockLayout FullKvLayoutFor(int32_t block_tokens) const override;
  KvBlockLayout WindowKvLayoutFor(int32_t block_tokens) const override;
  int32_t max_window() const override { return 0; }
  int64_t exact_replay_tokens() const override { return 0; }
  absl::Status Forward(absl::Span<const ForwardSequence> batch, KvBlockPool& kv,
                       std::vector<float>* logits, KvBlockPool* window_kv = nullptr) override;
  const std::vector<std::vector<int64_t>>& expert_token_counts() const override {
    return no_experts_;
  }

  // The modeled seconds of the latest Forward (0 before the first), slept or not.
  double last_forward_seconds() const { return last_forward_seconds_; }

  // The state of a position after `prev` (exposed for tests).
  static uint64_t NextState(uint64_t prev, TokenId token, int64_t position);

 private:
  explicit NullModel(NullModelOptions options);
  // Scripted mode: the packed state after `prev` and `token`, and the state before position 0.
  uint64_t NextScriptState(uint64_t prev, TokenId token) const;
  uint64_t InitialScriptState() const;

  const NullModelOptions options_;
  Hash128 fingerprint_;
  std::vector<std::vector<int32_t>> failure_;  // per script: KMP failure function of its trigger
  const std::vector<std::vector<int64_t>> no_experts_;
  std::vector<SimRow> rows_;  // the latest batch's, for the timing model (kept: no allocation)
  double last_forward_seconds_ = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_NULL_MODEL_H_
