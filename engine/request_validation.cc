#include "engine/request_validation.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/stop_strings.h"

namespace ferry {

int64_t DecodeOnlyPositions(const EngineRequest& r) {
  return static_cast<int64_t>(r.prompt.size() + r.resume[0].generated.size()) - 1;
}

absl::Status ValidateRequest(const EngineRequest& r, const RequestLimits& limits) {
  const KvBlockPool& pool = limits.kv->pool();
  const KvBlockPool* window_pool = limits.kv->window_pool();
  const int32_t block_tokens = limits.kv->block_tokens();
  const int64_t vocab = limits.vocab_size;
  if (r.id.empty()) return absl::InvalidArgumentError("request id is empty");
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (TokenId t : r.prompt) {
    if (t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", t, " is outside the vocabulary (", vocab, ")"));
    }
  }
  if (static_cast<int64_t>(r.prompt.size()) >= limits.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", r.prompt.size(),
                                                   " tokens leaves no room in the model's ",
                                                   limits.max_positions, " positions"));
  }
  if (pool.layout().BlocksFor(static_cast<int64_t>(r.prompt.size()) + 1) > pool.num_blocks()) {
    return absl::InvalidArgumentError("prompt is larger than the whole KV pool");
  }
  int64_t images_end = 0;  // where the previous image's placeholders end
  for (size_t i = 0; i < r.images.size(); ++i) {
    const PromptImageInput& image = r.images[i];
    const int64_t start = image.placeholder_start, length = image.placeholder_length;
    if (start < 0 || length < 1 || start > static_cast<int64_t>(r.prompt.size()) - length) {
      return absl::InvalidArgumentError(absl::StrCat("image ", i, ": placeholders ", start, "+",
                                                     length, " are empty or outside the prompt of ",
                                                     r.prompt.size(), " tokens"));
    }
    if (start < images_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("image ", i, ": placeholders from ", start,
                       " are not after the previous image's (which end at ", images_end,
                       "): images must be sorted and not overlap"));
    }
    images_end = start + length;
    const int64_t want = length * limits.hidden_size;
    // (Null rows: expected cached, prompt_image.h; the step that would need them fails it.)
    if (image.embeddings != nullptr && static_cast<int64_t>(image.embeddings->size()) != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("image ", i, ": ", image.embeddings->size(), " embedding values, want ",
                       length, " rows x ", limits.hidden_size, " (the model's hidden size)"));
    }
  }
  if (r.n < 1 || r.n > limits.max_n) {
    return absl::InvalidArgumentError(absl::StrCat("n must be in [1, ", limits.max_n, "]"));
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
  if (!r.stop.empty() && !limits.has_tokenizer) {
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
    if (static_cast<int64_t>(r.imported_blocks.size()) != pool.layout().BlocksFor(positions)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decode-only: ", r.imported_blocks.size(), " imported blocks do not cover the ",
          positions, " positions of the prompt and the generated tokens but the last"));
    }
    for (BlockId b : r.imported_blocks) {
      if (b < 0 || b >= pool.num_blocks() || pool.ref_count(b) < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("decode-only: imported block ", b, " is not an allocated block"));
      }
    }
    if (window_pool != nullptr) {
      if (r.imported_window_blocks.size() != r.imported_blocks.size()) {
        return absl::InvalidArgumentError(
            "decode-only: the window layers' imported table does not cover the prompt");
      }
      // Present from the block the next row (at `positions`) sees, or the window floor's;
      // before it, optional.
      const int64_t first =
          std::max(limits.kv->FirstWindowBlock(positions), r.window_floor / block_tokens);
      for (size_t i = 0; i < r.imported_window_blocks.size(); ++i) {
        const BlockId b = r.imported_window_blocks[i];
        if (b == kNoBlock && static_cast<int64_t>(i) < first) continue;
        if (b < 0 || b >= window_pool->num_blocks() || window_pool->ref_count(b) < 1) {
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
    if (r.window_floor > 0 && window_pool == nullptr) {
      return absl::InvalidArgumentError("a window floor needs an engine with a window pool");
    }
  } else {
    if (!r.imported_window_blocks.empty() || r.window_floor != 0 || r.approximate_kv) {
      return absl::InvalidArgumentError(
          "imported window blocks, a window floor and approximate KV are for decode-only "
          "requests");
    }
    // Imports: leading full blocks of the prompt, never the one with its last token.
    const int64_t most = (static_cast<int64_t>(r.prompt.size()) - 1) / block_tokens;
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
      if (b < 0 || b >= pool.num_blocks() || pool.ref_count(b) < 1) {
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

}  // namespace ferry
