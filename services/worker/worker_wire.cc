#include "services/worker/worker_wire.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/common/block_hash.h"
#include "engine/prompt_image.h"
#include "kvstore/wire.h"
#include "services/vision/image_encoder.h"

namespace ferry {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

ferry::v1::ErrorKind KindOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      return ferry::v1::ERROR_KIND_INVALID_REQUEST;
    case absl::StatusCode::kResourceExhausted:
      return ferry::v1::ERROR_KIND_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kUnavailable:
      return ferry::v1::ERROR_KIND_UNAVAILABLE;
    case absl::StatusCode::kDeadlineExceeded:
      return ferry::v1::ERROR_KIND_DEADLINE_EXCEEDED;
    case absl::StatusCode::kCancelled:
      return ferry::v1::ERROR_KIND_CANCELLED;
    default:
      return ferry::v1::ERROR_KIND_INTERNAL;
  }
}

// The request's images, with their inline embeddings decoded (see ToEngineRequest).
absl::Status ImagesFromProto(const ferry::v1::TokenizedRequest& request, const WireLimits& limits,
                             const FetchedImages* fetched, std::vector<PromptImageInput>* images) {
  const int64_t prompt = request.prompt_token_ids_size();
  int64_t previous_end = 0, total_bytes = 0;
  for (int i = 0; i < request.images_size(); ++i) {
    const ferry::v1::PromptImage& image = request.images(i);
    const int64_t start = image.placeholder_start(), length = image.placeholder_length();
    if (length < 1 || start + length > prompt) {
      return Invalid(absl::StrCat("image ", i, ": placeholders ", start, "+", length,
                                  " are empty or outside the prompt of ", prompt, " tokens"));
    }
    if (start < previous_end) {
      return Invalid(absl::StrCat("image ", i, ": placeholders from ", start,
                                  " overlap or precede the previous image's (ending at ",
                                  previous_end, "): images must be sorted and not overlap"));
    }
    previous_end = start + length;
    if (image.expect_cached()) {
      if (!image.image_data().empty() || !image.embeddings().empty() ||
          !image.embeddings_handle().empty()) {
        return Invalid(absl::StrCat("image ", i,
                                    ": expect_cached sends nothing of the image (no image_data, "
                                    "embeddings or embeddings_handle)"));
      }
      if (limits.image_encoder == nullptr) {
        return Invalid(
            absl::StrCat("image ", i,
                         ": expect_cached needs a worker with a vision model (its "
                         "positions are keyed by the tower's digest); this one has none"));
      }
      PromptImageInput input;  // (no rows: the engine fails the request if it needs them)
      input.content_hash = kv::HashFromProto(image.content_hash());
      input.placeholder_start = start;
      input.placeholder_length = length;
      images->push_back(std::move(input));
      continue;
    }
    if (!image.image_data().empty()) {
      if (limits.image_encoder == nullptr) {
        return Invalid(absl::StrCat("image ", i,
                                    ": image bytes need a worker with a vision model; this one "
                                    "has none (send the embeddings inline)"));
      }
      if (!image.embeddings().empty() || !image.embeddings_handle().empty()) {
        return Invalid(
            absl::StrCat("image ", i, ": image_data and embeddings are exclusive (send one)"));
      }
      total_bytes += length * limits.hidden_size * 4;
      if (total_bytes > limits.max_image_embedding_bytes) {
        return Invalid(absl::StrCat("the images' embeddings exceed ",
                                    limits.max_image_embedding_bytes, " bytes"));
      }
      absl::StatusOr<std::shared_ptr<const std::vector<float>>> rows = limits.image_encoder->Encode(
          image.image_data(), kv::HashFromProto(image.content_hash()), length);
      if (!rows.ok()) {
        return absl::Status(rows.status().code(),
                            absl::StrCat("image ", i, ": ", rows.status().message()));
      }
      PromptImageInput input;
      input.content_hash = kv::HashFromProto(image.content_hash());
      input.placeholder_start = start;
      input.placeholder_length = length;
      input.embeddings = *std::move(rows);
      images->push_back(std::move(input));
      continue;
    }
    if (!image.embeddings_handle().empty()) {
      if (!image.embeddings().empty()) {
        return Invalid(absl::StrCat("image ", i,
                                    ": embeddings and embeddings_handle are exclusive (send one)"));
      }
      if (limits.image_encoder == nullptr) {
        return Invalid(absl::StrCat("image ", i,
                                    ": embeddings by handle need a worker with a vision model; "
                                    "this one has none (send the embeddings inline)"));
      }
      const std::shared_ptr<const std::vector<float>> rows =
          fetched != nullptr && i < static_cast<int>(fetched->size()) ? (*fetched)[i] : nullptr;
      const int64_t floats = length * limits.hidden_size;
      if (rows == nullptr || static_cast<int64_t>(rows->size()) != floats) {
        return Invalid(absl::StrCat("image ", i, ": its embeddings by handle were not fetched"));
      }
      total_bytes += floats * static_cast<int64_t>(sizeof(float));
      if (total_bytes > limits.max_image_embedding_bytes) {
        return Invalid(absl::StrCat("the images' embeddings exceed ",
                                    limits.max_image_embedding_bytes, " bytes"));
      }
      PromptImageInput input;
      input.content_hash = kv::HashFromProto(image.content_hash());
      input.placeholder_start = start;
      input.placeholder_length = length;
      input.embeddings = rows;
      images->push_back(std::move(input));
      continue;
    }
    if (image.embeddings().empty()) {
      return Invalid(absl::StrCat("image ", i, " has no embeddings"));
    }
    if (image.embedding_rows() != image.placeholder_length() ||
        static_cast<int64_t>(image.embedding_cols()) != limits.hidden_size) {
      return Invalid(absl::StrCat("image ", i, ": embeddings of ", image.embedding_rows(), " x ",
                                  image.embedding_cols(), ", want ", length, " rows (its ",
                                  "placeholders) x ", limits.hidden_size,
                                  " (the model's hidden size)"));
    }
    const int64_t bytes = length * limits.hidden_size * static_cast<int64_t>(sizeof(float));
    if (static_cast<int64_t>(image.embeddings().size()) != bytes) {
      return Invalid(absl::StrCat("image ", i, ": ", image.embeddings().size(),
                                  " embedding bytes, want ", bytes, " (rows x cols x 4)"));
    }
    total_bytes += bytes;
    if (total_bytes > limits.max_image_embedding_bytes) {
      return Invalid(absl::StrCat("the images' embeddings exceed ",
                                  limits.max_image_embedding_bytes, " bytes"));
    }
    auto values = std::make_shared<std::vector<float>>(length * limits.hidden_size);
    const unsigned char* in = reinterpret_cast<const unsigned char*>(image.embeddings().data());
    for (size_t k = 0; k < values->size(); ++k, in += 4) {
      const uint32_t u =
          uint32_t{in[0]} | uint32_t{in[1]} << 8 | uint32_t{in[2]} << 16 | uint32_t{in[3]} << 24;
      float f;
      std::memcpy(&f, &u, sizeof(f));
      if (!std::isfinite(f)) {
        return Invalid(absl::StrCat("image ", i, ": embedding value ", k, " is not finite"));
      }
      (*values)[k] = f;
    }
    PromptImageInput input;
    input.content_hash = kv::HashFromProto(image.content_hash());
    input.placeholder_start = start;
    input.placeholder_length = length;
    input.embeddings = std::move(values);
    images->push_back(std::move(input));
  }
  return absl::OkStatus();
}

// The request's constraint, compiled (see ToEngineRequest).
absl::Status ConstraintFromProto(const ferry::v1::OutputConstraint& constraint,
                                 const WireLimits& limits, EngineRequest* r) {
  if (constraint.grammar().empty()) {
    return Invalid("constraint.grammar is empty (a constraint is a GBNF grammar: root ::= ...)");
  }
  const Hash128 hash = kv::HashFromProto(constraint.hash());
  const Hash128 want = Xxh3Hash128(constraint.grammar());
  if (hash != want) {
    return Invalid(absl::StrCat("constraint hash ", hash.ToHex(),
                                " is not the XXH3-128 of its grammar (", want.ToHex(), ")"));
  }
  if (!limits.compile_constraint) return Invalid("this worker does not take constraints");
  absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>> compiled =
      limits.compile_constraint(hash, constraint.grammar(), r->keep_special_token_ids);
  if (!compiled.ok()) {
    return absl::Status(compiled.status().code(),
                        absl::StrCat("constraint: ", compiled.status().message()));
  }
  r->constraint = *std::move(compiled);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EngineRequest> ToEngineRequest(const ferry::v1::TokenizedRequest& request,
                                              const WireLimits& limits,
                                              std::vector<int64_t>* first_output_index,
                                              const FetchedImages* fetched) {
  const ferry::v1::RequestContext& context = request.context();
  const ferry::v1::SamplingParams& p = request.sampling();
  EngineRequest r;
  r.id = context.request_id();
  if (r.id.empty()) return Invalid("context.request_id is empty");
  if (r.id.size() > 256) return Invalid("context.request_id is longer than 256 bytes");
  if (request.has_model() && request.model().has_fingerprint()) {
    const Hash128 fp = kv::HashFromProto(request.model().fingerprint());
    if (fp != Hash128{} && fp != limits.model_fingerprint) {
      return absl::FailedPreconditionError(absl::StrCat("the request is for model fingerprint ",
                                                        fp.ToHex(), "; this worker serves ",
                                                        limits.model_fingerprint.ToHex()));
    }
  }
  r.prompt.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  if (r.prompt.empty()) return Invalid("prompt_token_ids is empty");
  for (TokenId t : r.prompt) {
    if (t >= limits.vocab_size) {
      return Invalid(absl::StrCat("prompt token ", t, " is outside the vocabulary (",
                                  limits.vocab_size, " tokens)"));
    }
  }
  if (absl::Status s = ImagesFromProto(request, limits, fetched, &r.images); !s.ok()) return s;
  r.cache_salt = context.cache_salt();
  r.priority = context.priority();
  // The router's block hashes must be this worker's, or its view of the caches is wrong.
  if (!request.block_hashes().empty()) {
    if (static_cast<int32_t>(request.block_tokens()) != limits.block_tokens) {
      return absl::FailedPreconditionError(absl::StrCat("block_tokens ", request.block_tokens(),
                                                        " is not this worker's (",
                                                        limits.block_tokens, ")"));
    }
    const std::vector<Hash128> mine =
        ComputeBlockHashes({limits.model_fingerprint, r.cache_salt, ""}, r.prompt,
                           limits.block_tokens, ImageSpans(r.images));
    if (static_cast<size_t>(request.block_hashes_size()) > mine.size()) {
      return Invalid(absl::StrCat(request.block_hashes_size(), " block hashes for ", mine.size(),
                                  " full blocks"));
    }
    for (int i = 0; i < request.block_hashes_size(); ++i) {
      if (kv::HashFromProto(request.block_hashes(i)) != mine[i]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "block hash ", i, " is not this worker's (another model fingerprint or salt?)"));
      }
    }
  }

  // Sampling: presence decides the defaults (common.proto).
  r.sampling.temperature = p.has_temperature() ? p.temperature() : 1.0f;
  r.sampling.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  r.sampling.repetition_penalty = p.has_repetition_penalty() ? p.repetition_penalty() : 1.0f;
  if (p.top_k() > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return Invalid("top_k is too large");
  }
  r.sampling.top_k = static_cast<int32_t>(p.top_k());
  r.sampling.min_p = p.min_p();
  r.sampling.frequency_penalty = p.frequency_penalty();
  r.sampling.presence_penalty = p.presence_penalty();
  for (const auto& b : p.logit_biases()) r.sampling.logit_bias.emplace_back(b.token_id(), b.bias());
  r.sampling.seed = p.seed();
  if (p.logprobs()) {
    if (p.top_logprobs() > static_cast<uint32_t>(kMaxTopLogprobs)) {
      return Invalid(absl::StrCat("top_logprobs must be at most ", kMaxTopLogprobs));
    }
    r.sampling.top_logprobs = static_cast<int32_t>(p.top_logprobs());
  } else if (p.top_logprobs() > 0) {
    return Invalid("top_logprobs needs logprobs");
  }
  r.n = p.n() == 0 ? 1 : static_cast<int32_t>(std::min<uint32_t>(p.n(), 1 << 20));
  const int64_t room = limits.max_positions - static_cast<int64_t>(r.prompt.size());
  if (room < 1) {
    return Invalid(absl::StrCat("the prompt's ", r.prompt.size(), " tokens leave no room in the ",
                                "model's ", limits.max_positions, " positions"));
  }
  r.max_tokens = p.max_tokens() == 0 ? room : static_cast<int64_t>(p.max_tokens());
  r.min_tokens = p.min_tokens();
  r.ignore_eos = p.ignore_eos();
  r.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  r.keep_special_token_ids.assign(p.keep_special_token_ids().begin(),
                                  p.keep_special_token_ids().end());
  r.stop.assign(p.stop_strings().begin(), p.stop_strings().end());

  first_output_index->assign(r.n, 0);
  if (request.has_resume() && request.resume().choices_size() > 0) {
    const auto& choices = request.resume().choices();
    if (choices.size() != r.n) {
      return Invalid(absl::StrCat("resume has ", choices.size(), " choices for n = ", r.n));
    }
    for (int c = 0; c < choices.size(); ++c) {
      const ferry::v1::ResumedChoice& choice = choices[c];
      if (choice.sampler_state().choice_index() != static_cast<uint32_t>(c)) {
        return Invalid(absl::StrCat("resume: choice ", c, " has choice_index ",
                                    choice.sampler_state().choice_index()));
      }
      if (choice.sampler_state().seed() != p.seed()) {
        return Invalid("resume: the sampler state's seed is not the request's");
      }
      ResumePoint point;
      point.generated.assign(choice.generated_token_ids().begin(),
                             choice.generated_token_ids().end());
      auto state = SamplerStateFromProto(choice.sampler_state());
      if (!state.ok()) return Invalid(absl::StrCat("resume: ", state.status().message()));
      point.sampler_state = *std::move(state);
      point.held_text = choice.sampler_state().stop_string_tail();
      point.choice = c;
      (*first_output_index)[c] = static_cast<int64_t>(point.generated.size());
      r.resume.push_back(std::move(point));
    }
  }
  if (p.has_constraint()) {
    if (absl::Status s = ConstraintFromProto(p.constraint(), limits, &r); !s.ok()) return s;
  }
  return r;
}

bool HasImageBytes(const ferry::v1::TokenizedRequest& request) {
  for (const ferry::v1::PromptImage& image : request.images()) {
    if (!image.image_data().empty()) return true;
  }
  return false;
}

bool HasImageHandles(const ferry::v1::TokenizedRequest& request) {
  for (const ferry::v1::PromptImage& image : request.images()) {
    if (!image.embeddings_handle().empty()) return true;
  }
  return false;
}

StoreHint StoreHintFromProto(const v1::TokenizedRequest& request) {
  StoreHint hint;
  if (!request.has_store_hint()) return hint;
  hint.probed = request.store_hint().probed_blocks();
  hint.prefix = std::min<int64_t>(request.store_hint().prefix_blocks(), hint.probed);
  return hint;
}

void SamplerStateToProto(const SamplerState& state, uint64_t seed, uint32_t choice,
                         const std::string& held_text, ferry::v1::SamplerState* out) {
  out->set_seed(seed);
  out->set_choice_index(choice);
  out->set_output_count(static_cast<uint32_t>(state.generated()));
  std::vector<std::pair<TokenId, int32_t>> counts(state.counts().begin(), state.counts().end());
  std::sort(counts.begin(), counts.end());
  for (const auto& [token, count] : counts) {
    ferry::v1::TokenCount* c = out->add_penalty_counts();
    c->set_token_id(token);
    c->set_count(static_cast<uint32_t>(count));
  }
  out->set_stop_string_tail(held_text);
}

absl::StatusOr<SamplerState> SamplerStateFromProto(const ferry::v1::SamplerState& state) {
  absl::flat_hash_map<TokenId, int32_t> counts;
  for (const ferry::v1::TokenCount& c : state.penalty_counts()) {
    if (c.count() == 0 || c.count() > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampler state: token ", c.token_id(), " has count ", c.count()));
    }
    if (!counts.emplace(c.token_id(), static_cast<int32_t>(c.count())).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampler state: token ", c.token_id(), " is counted twice"));
    }
  }
  return SamplerState::FromCounts(state.output_count(), counts);
}

ferry::v1::FinishReason FinishReasonToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return ferry::v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return ferry::v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return ferry::v1::FINISH_REASON_ABORT;
    case FinishReason::kError:
      return ferry::v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
    case FinishReason::kHandoff:
      break;
  }
  return ferry::v1::FINISH_REASON_UNSPECIFIED;
}

void AppendToChunk(const TokenEvent& event, bool logprobs, ferry::v1::TokenChunk* chunk) {
  if (event.has_token) {
    chunk->add_token_ids(event.token);
    if (logprobs) {
      ferry::v1::TokenLogprobs* lp = chunk->add_logprobs();
      lp->mutable_sampled()->set_token_id(event.token);
      lp->mutable_sampled()->set_logprob(event.logprob);
      for (const auto& [token, logprob] : event.top_logprobs) {
        ferry::v1::TokenLogprob* alt = lp->add_top_alternatives();
        alt->set_token_id(token);
        alt->set_logprob(logprob);
      }
    }
  }
  chunk->mutable_text()->append(event.text);
  if (event.has_token || event.finish != FinishReason::kNone) {
    chunk->set_stop_string_tail(event.held_text);
  }
  if (event.finish != FinishReason::kNone) {
    chunk->set_finish_reason(FinishReasonToProto(event.finish));
    if (event.stop_token) chunk->set_matched_stop_token_id(event.token);
    if (!event.matched_stop.empty()) chunk->set_matched_stop_string(event.matched_stop);
  }
}

void ErrorInfoFromStatus(const absl::Status& status, const std::string& trace_id, bool retryable,
                         ferry::v1::ErrorInfo* out) {
  out->set_kind(KindOf(status.code()));
  out->set_status_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
  out->set_trace_id(trace_id);
  out->set_retryable(retryable);
}

}  // namespace ferry
