#include "engine/model/null_model.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/common/le_encoding.h"
#include "engine/sampling/sampling.h"

namespace ferry {
namespace {

constexpr float kBaseline = -30.0f;
constexpr float kCandidateLogits[] = {8.0f, 7.0f, 6.0f, 5.0f};

// Slot `slot` of a block: the state's low half at key dimension 0, the high half at dimension 1.
void WriteState(uint8_t* block, int32_t block_tokens, int64_t slot, uint64_t state) {
  const uint32_t lo = static_cast<uint32_t>(state), hi = static_cast<uint32_t>(state >> 32);
  std::memcpy(block + slot * 4, &lo, 4);
  std::memcpy(block + (block_tokens + slot) * 4, &hi, 4);
}

uint64_t ReadState(const uint8_t* block, int32_t block_tokens, int64_t slot) {
  uint32_t lo = 0, hi = 0;
  std::memcpy(&lo, block + slot * 4, 4);
  std::memcpy(&hi, block + (block_tokens + slot) * 4, 4);
  return lo | static_cast<uint64_t>(hi) << 32;
}

// Scripted state: bits 0-7 the armed script (kNoScript: none), 8-31 the reply cursor, 32-63
// each script's trigger progress (8 bits each).
constexpr uint64_t kNoScript = 0xFF;
constexpr size_t kMaxScripts = 4;
uint64_t Armed(uint64_t s) { return s & 0xFF; }
uint64_t Cursor(uint64_t s) { return (s >> 8) & 0xFFFFFF; }
uint64_t Progress(uint64_t s, size_t i) { return (s >> (32 + 8 * i)) & 0xFF; }
uint64_t Pack(uint64_t armed, uint64_t cursor, const uint64_t progress[kMaxScripts]) {
  uint64_t s = armed | cursor << 8;
  for (size_t i = 0; i < kMaxScripts; ++i) s |= progress[i] << (32 + 8 * i);
  return s;
}

}  // namespace

uint64_t NullModel::InitialScriptState() const {
  const uint64_t progress[kMaxScripts] = {0, 0, 0, 0};
  for (size_t i = 0; i < options_.scripts.size(); ++i) {
    if (options_.scripts[i].trigger.empty()) return Pack(i, 0, progress);
  }
  return Pack(kNoScript, 0, progress);
}

uint64_t NullModel::NextScriptState(uint64_t prev, TokenId token) const {
  uint64_t armed = Armed(prev), cursor = Cursor(prev);
  if (armed != kNoScript) {
    const std::vector<TokenId>& reply = options_.scripts[armed].reply;
    if (cursor < reply.size() && reply[cursor] == token) {
      ++cursor;
    } else {
      cursor = !reply.empty() && reply[0] == token ? 1 : 0;
    }
  }
  uint64_t progress[kMaxScripts] = {0, 0, 0, 0};
  for (size_t i = 0; i < options_.scripts.size(); ++i) {
    const std::vector<TokenId>& trigger = options_.scripts[i].trigger;
    if (trigger.empty()) continue;
    uint64_t m = Progress(prev, i);
    while (m > 0 && trigger[m] != token) m = static_cast<uint64_t>(failure_[i][m - 1]);
    if (trigger[m] == token) ++m;
    if (m == trigger.size()) {
      if (cursor == 0) armed = i;  // a trigger inside a reply being written arms nothing
      m = static_cast<uint64_t>(failure_[i][m - 1]);
    }
    progress[i] = m;
  }
  return Pack(armed, cursor, progress);
}

uint64_t NullModel::NextState(uint64_t prev, TokenId token, int64_t position) {
  return SplitMix64(prev ^ (static_cast<uint64_t>(token) * 0x9E3779B97F4A7C15ull) ^
                    (static_cast<uint64_t>(position) << 32));
}

absl::StatusOr<std::unique_ptr<NullModel>> NullModel::Create(NullModelOptions options) {
  const ModelConfig& c = options.config;
  if (c.vocab_size < 1 || c.max_position_embeddings < 2) {
    return absl::InvalidArgumentError("null model: vocab_size and max positions must be positive");
  }
  for (TokenId t : options.tokens) {
    if (t >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("null model: token ", t, " is outside the vocabulary"));
    }
  }
  for (TokenId t : c.eos_token_ids) {
    if (t >= c.vocab_size) return absl::InvalidArgumentError("null model: eos id out of range");
  }
  if (!(options.prefill_tokens_per_second >= 0) || !(options.decode_token_seconds >= 0) ||
      !(options.step_overhead_seconds >= 0)) {
    return absl::InvalidArgumentError("null model: timings must be >= 0");
  }
  if (options.scripts.size() > kMaxScripts) {
    return absl::InvalidArgumentError(
        absl::StrCat("null model: at most ", kMaxScripts, " scripts"));
  }
  for (const NullScript& script : options.scripts) {
    if (script.trigger.size() > 255 || script.reply.size() >= (size_t{1} << 24)) {
      return absl::InvalidArgumentError(
          "null model: a script's trigger is longer than 255 tokens or its reply too long");
    }
    for (const std::vector<TokenId>* ids : {&script.trigger, &script.reply}) {
      for (TokenId t : *ids) {
        if (t >= c.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("null model: script token ", t, " is outside the vocabulary"));
        }
      }
    }
  }
  return std::unique_ptr<NullModel>(new NullModel(std::move(options)));
}

NullModel::NullModel(NullModelOptions options) : options_(std::move(options)) {
  std::string bytes = "FERRYNUL";
  AppendU32Le(&bytes, 1);
  AppendU64Le(&bytes, static_cast<uint64_t>(options_.config.vocab_size));
  AppendU64Le(&bytes, static_cast<uint64_t>(options_.config.max_position_embeddings));
  AppendU64Le(&bytes, options_.seed);
  AppendHash128Le(&bytes, options_.identity);
  for (const NullScript& script : options_.scripts) {
    for (const std::vector<TokenId>* ids : {&script.trigger, &script.reply}) {
      AppendU32Le(&bytes, static_cast<uint32_t>(ids->size()));
      for (TokenId t : *ids) AppendU32Le(&bytes, static_cast<uint32_t>(t));
    }
    // KMP failure function: the longest proper border of each prefix of the trigger.
    const std::vector<TokenId>& t = script.trigger;
    std::vector<int32_t> failure(t.size(), 0);
    for (size_t i = 1, k = 0; i < t.size(); ++i) {
      while (k > 0 && t[i] != t[k]) k = static_cast<size_t>(failure[k - 1]);
      if (t[i] == t[k]) ++k;
      failure[i] = static_cast<int32_t>(k);
    }
    failure_.push_back(std::move(failure));
  }
  fingerprint_ = Xxh3Hash128(bytes);
}

KvBlockLayout NullModel::KvLayoutFor(int32_t block_tokens) const {
  KvBlockLayout layout;
  layout.num_layers = 1;
  layout.num_kv_heads = 1;
  layout.head_dim = 2;
  layout.block_tokens = block_tokens;
  layout.dtype = DType::kF32;
  return layout;
}

KvBlockLayout NullModel::FullKvLayoutFor(int32_t block_tokens) const {
  KvBlockLayout layout = KvLayoutFor(block_tokens);
  layout.num_layers = 0;  // no sliding-window layers: never two pools
  return layout;
}

KvBlockLayout NullModel::WindowKvLayoutFor(int32_t block_tokens) const {
  return FullKvLayoutFor(block_tokens);
}

absl::Status NullModel::Forward(absl::Span<const ForwardSequence> batch, KvBlockPool& kv,
                                std::vector<float>* logits, KvBlockPool* window_kv) {
  const auto start = std::chrono::steady_clock::now();
  const KvBlockLayout& layout = kv.layout();
  if (window_kv != nullptr) {
    return absl::InvalidArgumentError("the null model has no sliding-window layers");
  }
  if (!SameKvLayout(layout, KvLayoutFor(layout.block_tokens))) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool layout (", layout.DebugString(), ") is not the null model's"));
  }
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  const int64_t vocab = options_.config.vocab_size;
  const int32_t bt = layout.block_tokens;
  // Validate everything before writing anything.
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSequence& seq = batch[s];
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no tokens"));
    if (seq.start_position < 0 || seq.start_position + n > max_positions()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": positions exceed the ",
                                                     max_positions(), " the model accepts"));
    }
    if (static_cast<int64_t>(seq.blocks.size()) < layout.BlocksFor(seq.start_position + n)) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": block table too short"));
    }
    for (BlockId b : seq.blocks.subspan(0, layout.BlocksFor(seq.start_position + n))) {
      if (b < 0 || b >= kv.num_blocks()) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": bad block ", b));
      }
    }
    for (TokenId t : seq.tokens) {
      if (t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("token ", t, " is outside the vocabulary"));
      }
    }
  }
  const MemorySpan region = kv.region();
  auto block_of = [&](const ForwardSequence& seq, int64_t position) {
    return static_cast<uint8_t*>(region.address) +
           static_cast<size_t>(seq.blocks[position / bt]) * layout.block_bytes();
  };
  const std::vector<TokenId>& tokens = options_.tokens;
  const bool scripted = !options_.scripts.empty();
  auto emit_row = [&](uint64_t state) {
    const size_t base = logits->size();
    logits->resize(base + vocab, kBaseline);
    float* row = logits->data() + base;
    if (scripted && Armed(state) != kNoScript) {
      const std::vector<TokenId>& reply = options_.scripts[Armed(state)].reply;
      const uint64_t k = Cursor(state);
      if (k < reply.size()) {
        row[reply[k]] = kCandidateLogits[0];
        return;
      }
      if (!options_.config.eos_token_ids.empty()) {
        row[options_.config.eos_token_ids[0]] = kCandidateLogits[0];
        return;
      }
    }
    if (scripted) state = SplitMix64(state);
    for (int j = 3; j >= 0; --j) {  // the first draw's value wins a duplicate
      const uint64_t r = SplitMix64(state + static_cast<uint64_t>(j));
      const TokenId t = tokens.empty() ? static_cast<TokenId>(r % static_cast<uint64_t>(vocab))
                                       : tokens[r % tokens.size()];
      row[t] = kCandidateLogits[j];
    }
  };
  int64_t prefill_tokens = 0;
  bool decoding = false;
  rows_.clear();
  for (const ForwardSequence& seq : batch) {
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    if (n == 1) {
      decoding = true;
    } else {
      prefill_tokens += n;
    }
    rows_.push_back({seq.start_position, n});
    uint64_t state = scripted ? InitialScriptState() : options_.seed;
    if (seq.start_position > 0) {
      const int64_t p = seq.start_position - 1;
      state = ReadState(block_of(seq, p), bt, p % bt);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = seq.start_position + i;
      state = scripted ? NextScriptState(state, seq.tokens[i]) : NextState(state, seq.tokens[i], p);
      WriteState(block_of(seq, p), bt, p % bt, state);
      if (seq.all_logits || (!seq.no_logits && i == n - 1)) emit_row(state);
    }
  }
  double seconds = 0;
  if (options_.timing != nullptr) {
    seconds = options_.timing->StepSeconds(rows_);
  } else {
    seconds = options_.step_overhead_seconds;
    if (options_.prefill_tokens_per_second > 0) {
      seconds += static_cast<double>(prefill_tokens) / options_.prefill_tokens_per_second;
    }
    if (decoding) seconds += options_.decode_token_seconds;
  }
  last_forward_seconds_ = seconds;
  if (seconds > 0 && !options_.virtual_time) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::duration<double>(seconds)));
  }
  return absl::OkStatus();
}

}  // namespace ferry
