// The worker's edge between proto/ferry/v1 (worker.proto, common.proto) and the engine's types
// (STYLE.md §16): a Generate request becomes an EngineRequest (validated, with the proto's
// presence and zero-value conventions resolved), engine token events become TokenChunks, sampler
// states cross in both directions, and errors become ErrorInfo. Nothing else in the worker
// library touches generated message types for the request path.
//
// Thread-compatible functions.

#ifndef FERRY_SERVICES_WORKER_WORKER_WIRE_H_
#define FERRY_SERVICES_WORKER_WORKER_WIRE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "engine/engine.h"
#include "engine/grammar/compiled_constraint.h"
#include "engine/sampling/sampler.h"
#include "ferry/v1/worker.pb.h"
#include "services/vision/image_encoder.h"
#include "services/worker/store_reader.h"

namespace ferry {

// Compiles a constraint's grammar text, whose XXH3-128 is `hash` (checked), for the engine's
// vocabulary with the request's kept special tokens (the worker's compile cache:
// WorkerService::CompileConstraint). InvalidArgument for a bad grammar or one over a limit.
using ConstraintCompiler =
    std::function<absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>>(
        const Hash128& hash, absl::string_view gbnf, absl::Span<const TokenId> kept_special)>;

// What the conversion checks a request against.
struct WireLimits {
  Hash128 model_fingerprint;
  int32_t block_tokens = 64;
  int64_t max_positions = 0;  // the model's
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;  // the model's: the width of inline image embeddings
  // Inline image embeddings of one request, all images together (the gRPC message cap bounds
  // them too).
  int64_t max_image_embedding_bytes = int64_t{64} << 20;
  // The worker's vision model (a LLaVA directory), or null: image bytes are then refused.
  const ImageEncoder* image_encoder = nullptr;
  // Structured output: compiles SamplingParams.constraint (empty: a constraint is refused).
  ConstraintCompiler compile_constraint;
};

// Embedding rows fetched from an encoder (embedding_fetcher.h), by image index: null for an image
// that had no handle to fetch. Each non-null entry is placeholder_length x hidden_size floats,
// already checked against the encoder's EmbeddingsInfo.
using FetchedImages = std::vector<std::shared_ptr<const std::vector<float>>>;

// A Generate request as the engine takes it (on_event left empty). InvalidArgument for what the
// request itself gets wrong (ranges, a resume state that does not add up), FailedPrecondition
// when it was routed with another model's view (fingerprint, block size or block hashes that
// are not this worker's). Images: inline embeddings (prompt_image.h; the rows' width the
// model's hidden size, spans sorted, disjoint, inside the prompt, finite values) or, with
// limits.image_encoder, image bytes, encoded here (image_encoder.h: content hash, decoding,
// placeholder count checked; its errors name the image) on the calling thread; image bytes
// without an encoder are InvalidArgument, as is an encoder handle without fetched rows.
// `first_output_index` receives, per choice, the absolute output index of its first new token (the
// resumed tokens before it). An image by handle (embeddings_handle) takes its rows from `fetched`
// (fetched[i] for image i); one without fetched rows is InvalidArgument (a worker without a vision
// model fetches nothing). A constraint (SamplingParams.constraint) is compiled through
// limits.compile_constraint on the calling thread (never the engine's) after its hash is checked
// against its grammar ("constraint hash ..." InvalidArgument otherwise); a bad grammar is
// InvalidArgument with the parser's message.
absl::StatusOr<EngineRequest> ToEngineRequest(const ferry::v1::TokenizedRequest& request,
                                              const WireLimits& limits,
                                              std::vector<int64_t>* first_output_index,
                                              const FetchedImages* fetched = nullptr);

// Whether any of the request's images comes as encoded bytes (image_data).
bool HasImageBytes(const ferry::v1::TokenizedRequest& request);
// Whether any of the request's images names encoder-held embeddings (embeddings_handle).
bool HasImageHandles(const ferry::v1::TokenizedRequest& request);

// The router's KV store probe the request carries (none: probed < 0).
StoreHint StoreHintFromProto(const ferry::v1::TokenizedRequest& request);

// SamplerState <-> proto (choice index and seed are the request's; held text the stop matcher's).
void SamplerStateToProto(const SamplerState& state, uint64_t seed, uint32_t choice,
                         const std::string& held_text, ferry::v1::SamplerState* out);
absl::StatusOr<SamplerState> SamplerStateFromProto(const ferry::v1::SamplerState& state);

ferry::v1::FinishReason FinishReasonToProto(FinishReason reason);

// Appends one engine event's token (and logprobs when `logprobs`), text and finish to `chunk`
// (whose request id, choice and first index the caller set).
void AppendToChunk(const TokenEvent& event, bool logprobs, ferry::v1::TokenChunk* chunk);

// An error inside a stream; `retryable`: another worker may succeed.
void ErrorInfoFromStatus(const absl::Status& status, const std::string& trace_id, bool retryable,
                         ferry::v1::ErrorInfo* out);

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_WORKER_WIRE_H_
