// What the worker's multi-process tests share: the tiny test models (made once per test binary
// with tools/make_tiny_model), ferry-worker children, Generate requests, the same request run by
// an Engine inside the test (the reference the worker's streams must equal bit for bit), and
// waiting, through Watch, until a worker's KV pool is back to idle.

#ifndef FERRY_TESTS_INTEGRATION_WORKER_TEST_UTIL_H_
#define FERRY_TESTS_INTEGRATION_WORKER_TEST_UTIL_H_

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/model/transformer.h"
#include "engine/tokenizer/tokenizer.h"
#include "ferry/v1/worker.pb.h"
#include "services/vision/image_encoder.h"
#include "tests/integration/service_process.h"
#include "tools/worker_cli/worker_client.h"

namespace ferry {

// argv[1]: ferry-worker; argv[2]: make_tiny_model.py; argv[3] (optional): ferry-kvstore. Call
// from main before RUN_ALL_TESTS.
void InitWorkerTests(int argc, char** argv);
const std::string& WorkerBinary();
const std::string& KvStoreBinary();

// A ferry-kvstore on `dir` (created if missing), on `port` (0: any), with small test settings and
// `extra` flags.
std::unique_ptr<ServiceProcess> StartKvStore(const std::string& dir, int port = 0,
                                             const std::vector<std::string>& extra = {});
// The directory of a tiny model (llama_gqa_bf16, qwen2_moe, qwen3_hybrid, ...), made on first use.
std::string TinyModel(const std::string& name);

// A ferry-worker on `model` with small test settings (block_tokens 16, 4 MiB pool) and `extra`
// flags (later flags win).
std::unique_ptr<ServiceProcess> StartWorker(const std::string& model,
                                            const std::vector<std::string>& extra = {});

struct Sampling {
  float temperature = 0;
  float top_p = 1;
  uint64_t seed = 0;
  uint32_t n = 1;
  uint32_t max_tokens = 12;
  uint32_t min_tokens = 0;
  uint32_t top_logprobs = 0;
  bool logprobs = false;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  std::vector<uint32_t> stop_ids;
};

ferry::v1::GenerateRequest MakeRequest(const std::string& id, const std::vector<TokenId>& prompt,
                                       const Sampling& sampling);

// `request` resumed after the first `k` of `tokens` (one choice), under the id `id`: what the
// router sends on a migration (the generated tokens, the sampler's seed, output count and
// penalty counts).
ferry::v1::GenerateRequest Resumed(ferry::v1::GenerateRequest request,
                                   const std::vector<uint32_t>& tokens, size_t k,
                                   const std::string& id);

// What one disaggregated request gave: the decode worker's stream, and the prefill call.
struct PdResult {
  GenerateResult stream;
  grpc::Status prefill;
  ferry::v1::PrefillResponse response;
  ferry::v1::KvReservation reservation;
  bool reserved = false;
};

// Plays the router for one request: Generate on the decode worker, Prefill on the prefill worker
// with its reservation. `before_prefill` runs once the reservation is in (false: cancel the
// stream instead); `on_tokens` sees each TokenChunk of the stream. A resumed request's output
// indexes start after its resumed tokens.
PdResult RunPd(WorkerClient& decode, const std::string& decode_address, WorkerClient& prefill,
               ferry::v1::GenerateRequest request,
               const std::function<bool(const ferry::v1::KvReservation&)>& before_prefill = {},
               absl::Duration prefill_timeout = absl::Seconds(60),
               const std::function<void(const ferry::v1::TokenChunk&)>& on_tokens = {});

// The worker's engine, in this process, with the worker's settings for the tests.
class InProcessEngine {
 public:
  // `window_pool_bytes` as the worker's flag; `weights`/`kv` as its --weights/--kv_dtype.
  InProcessEngine(const std::string& model, int64_t window_pool_bytes = 0,
                  const std::string& weights = "bf16", const std::string& kv = "bf16",
                  int32_t block_tokens = 16, int64_t pool_bytes = 4 << 20);
  ~InProcessEngine();
  // Runs the request to its end, as the worker would convert it (a LLaVA directory's image bytes
  // encoded as the worker does: ImageEncoder).
  std::vector<ChoiceOutput> Run(const ferry::v1::GenerateRequest& request);
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ForwardModel& model() const { return *model_; }
  const KvBlockPool& pool() const { return *pool_; }

 private:
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ForwardModel> model_;
  std::unique_ptr<ImageEncoder> image_encoder_;
  std::unique_ptr<KvAllocator> allocator_;
  std::unique_ptr<KvBlockPool> pool_, window_pool_;
  std::unique_ptr<Engine> engine_;
};

// Expects `got` to be `want` bit for bit: tokens, text, finish, the stop that matched, indexes,
// logprobs (the same floats serialize to the same bytes).
void ExpectSameOutput(const ChoiceOutput& got, const ChoiceOutput& want, const std::string& what);

// The UTF-8 character in the middle of `text` (a stop string that cuts it); `text` not empty.
std::string MiddleCharacter(const std::string& text);

// Polls `metric` on the admin port until it is at least `at_least`, or `timeout`; its last value.
double WaitForMetric(int admin_port, const std::string& metric, double at_least,
                     absl::Duration timeout = absl::Seconds(30));

// Token ids of `text` with the model's tokenizer.
std::vector<TokenId> Encode(const Tokenizer& tokenizer, const std::string& text);
// A prompt of `n` tokens from `seed` (ids below `vocab`, avoiding ids 0..3 the tiny tokenizers
// use for specials).
std::vector<TokenId> RandomPrompt(int n, uint32_t seed, int64_t vocab);

// The state of a worker's prefix caches as a Watch subscriber rebuilds it.
struct CacheView {
  std::set<Hash128> full, window;
  uint64_t sequence = 0;
  bool consistent = true;  // every non-snapshot message carried exactly its sequence's events
  // Applies one message; returns false on a gap.
  bool Apply(const ferry::v1::WorkerStatus& status);
};

// Reads `stream` until the worker is idle: nothing queued or running, every used block cached
// (the pool at its idle usage). Applies every message to `view` (may be null). False on timeout.
bool WaitUntilIdle(WorkerClient::WatchStream& stream, CacheView* view,
                   absl::Duration timeout = absl::Seconds(60));
// The same on a fresh Watch stream; the snapshot it ended with goes to `view` if given.
bool WaitUntilIdle(WorkerClient& client, CacheView* view = nullptr,
                   absl::Duration timeout = absl::Seconds(60));
// Reads `stream` into `view` until a whole message (no snapshot part follows it) at `sequence` or
// later. A stream's idle-looking message can be an old one (the worker was idle for a moment
// between requests), so a test that compares a stream's view with a fresh snapshot reads to the
// snapshot's sequence first. False on timeout or the end of the stream.
bool ReadUntilSequence(WorkerClient::WatchStream& stream, CacheView* view, uint64_t sequence,
                       absl::Duration timeout = absl::Seconds(60));

// ---- Vision-language models (the tiny LLaVA directories make_tiny_vlm writes) ---------------

// A file's bytes (a failed expectation, and "", when it cannot be read).
std::string ReadBytes(const std::string& path);
// A test image of media/image's corpus, from the runfiles ("rgb.png", "orient6.jpg"...).
std::string TestImage(const std::string& name);

struct TinyVlm {
  std::string dir;
  TokenId image_token = 0;
  uint32_t image_tokens = 0;  // placeholders per image
  int64_t vocab = 0, hidden = 0;
};
// The `variant` directory under $FERRY_TINY_VLM_DIR (set by the test's .sh wrapper, which makes
// the models), with what its config.json says of images.
TinyVlm LoadTinyVlm(const std::string& variant);

// `request`'s placeholders of an image at [start, start + length) set to `placeholder`, and the
// image with its encoded `bytes` inline (PromptImage.image_data, content_hash their XXH3-128).
ferry::v1::PromptImage BytesImage(ferry::v1::GenerateRequest& request, uint32_t start,
                                  uint32_t length, TokenId placeholder, const std::string& bytes);
// A prompt of `n` random tokens (below the image token, which only placeholders carry) with the
// `images` (placeholder start, encoded bytes) inline.
ferry::v1::GenerateRequest ImageRequest(const std::string& id, const TinyVlm& vlm, int n,
                                        uint32_t seed,
                                        const std::vector<std::pair<uint32_t, std::string>>& images,
                                        const Sampling& sampling);

}  // namespace ferry

#endif  // FERRY_TESTS_INTEGRATION_WORKER_TEST_UTIL_H_
