#include "tests/integration/worker_test_util.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/host_weights.h"
#include "engine/model/vision/llava_model.h"
#include "gtest/gtest.h"
#include "kvstore/wire.h"
#include "nlohmann/json.hpp"
#include "services/worker/worker_wire.h"

namespace ferry {

namespace {

std::string g_worker, g_make_tiny_model, g_kvstore;

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Hash128 FromProto(const v1::Hash128& h) { return Hash128{h.lo(), h.hi()}; }

}  // namespace

void InitWorkerTests(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s FERRY_WORKER MAKE_TINY_MODEL_PY [FERRY_KVSTORE]\n", argv[0]);
    std::exit(2);
  }
  g_worker = argv[1];
  g_make_tiny_model = argv[2];
  if (argc > 3) g_kvstore = argv[3];
}

const std::string& WorkerBinary() { return g_worker; }

const std::string& KvStoreBinary() { return g_kvstore; }

std::unique_ptr<ServiceProcess> StartKvStore(const std::string& dir, int port,
                                             const std::vector<std::string>& extra) {
  EXPECT_FALSE(g_kvstore.empty()) << "the test's third argument must be ferry-kvstore";
  std::vector<std::string> args = {"--dir=" + dir,
                                   absl::StrCat("--address=127.0.0.1:", port),
                                   "--segment_bytes=4MiB",
                                   "--capacity=256MiB",
                                   "--max_object_bytes=1MiB",
                                   "--rpc_grace_ms=2000"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto store = std::make_unique<ServiceProcess>(g_kvstore, args);
  EXPECT_TRUE(store->ready()) << "ferry-kvstore did not start:\n" << store->LogTail();
  return store;
}

PdResult RunPd(WorkerClient& decode, const std::string& decode_address, WorkerClient& prefill,
               v1::GenerateRequest request,
               const std::function<bool(const v1::KvReservation&)>& before_prefill,
               absl::Duration prefill_timeout,
               const std::function<void(const v1::TokenChunk&)>& on_tokens) {
  PdResult out;
  request.set_aggregated(false);
  const v1::TokenizedRequest tokenized = request.request();
  std::vector<uint32_t> first_index;
  for (const v1::ResumedChoice& c : tokenized.resume().choices()) {
    first_index.push_back(static_cast<uint32_t>(c.generated_token_ids_size()));
  }
  out.stream = decode.Generate(
      request, absl::Seconds(60),
      [&](const v1::GenerateEvent& e) {
        if (e.has_tokens() && on_tokens) on_tokens(e.tokens());
        if (!e.has_reservation()) return true;
        out.reserved = true;
        out.reservation = e.reservation();
        if (before_prefill && !before_prefill(e.reservation())) return false;
        v1::PrefillRequest p;
        *p.mutable_request() = tokenized;
        *p.mutable_destination() = e.reservation();
        p.set_decode_endpoint(decode_address);
        out.prefill = prefill.Prefill(p, &out.response, prefill_timeout);
        return true;
      },
      first_index);
  return out;
}

std::string TinyModel(const std::string& name) {
  static const std::string dir = [] {
    const char* python = std::getenv("FERRY_REF_PYTHON");
    if (python == nullptr) {
      ADD_FAILURE() << "FERRY_REF_PYTHON is not set; run through ./ferry test";
      return std::string();
    }
    const std::string out = absl::StrCat(std::getenv("TEST_TMPDIR"), "/tiny_models");
    const std::string command =
        absl::StrCat(python, " ", g_make_tiny_model, " models ", out, " > ", out, ".log 2>&1");
    if (std::system(command.c_str()) != 0) {
      std::ifstream log(out + ".log");
      std::stringstream text;
      text << log.rdbuf();
      ADD_FAILURE() << "make_tiny_model failed: " << command << "\n" << text.str();
    }
    return out;
  }();
  const std::string path = dir + "/" + name;
  EXPECT_TRUE(IsDirectory(path)) << path;
  return path;
}

std::unique_ptr<ServiceProcess> StartWorker(const std::string& model,
                                            const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--model=" + model, "--block_tokens=16", "--kv_pool_bytes=4MiB",
                                   "--threads=1",      "--drain_grace=30s", "--rpc_grace=5s"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto worker = std::make_unique<ServiceProcess>(g_worker, args);
  EXPECT_TRUE(worker->ready()) << "ferry-worker did not start:\n" << worker->LogTail();
  return worker;
}

v1::GenerateRequest MakeRequest(const std::string& id, const std::vector<TokenId>& prompt,
                                const Sampling& s) {
  v1::GenerateRequest request;
  request.set_aggregated(true);
  v1::TokenizedRequest* r = request.mutable_request();
  r->mutable_context()->set_request_id(id);
  r->mutable_context()->set_trace_id("trace-" + id);
  for (TokenId t : prompt) r->add_prompt_token_ids(t);
  v1::SamplingParams* p = r->mutable_sampling();
  p->set_temperature(s.temperature);
  p->set_top_p(s.top_p);
  p->set_seed(s.seed);
  p->set_n(s.n);
  p->set_max_tokens(s.max_tokens);
  p->set_min_tokens(s.min_tokens);
  p->set_logprobs(s.logprobs);
  p->set_top_logprobs(s.top_logprobs);
  p->set_ignore_eos(s.ignore_eos);
  for (const std::string& stop : s.stop) p->add_stop_strings(stop);
  for (uint32_t id : s.stop_ids) p->add_stop_token_ids(id);
  return request;
}

v1::GenerateRequest Resumed(v1::GenerateRequest request, const std::vector<uint32_t>& tokens,
                            size_t k, const std::string& id) {
  request.mutable_request()->mutable_context()->set_request_id(id);
  v1::ResumedChoice* c = request.mutable_request()->mutable_resume()->add_choices();
  std::map<uint32_t, uint32_t> counts;
  for (size_t i = 0; i < k; ++i) {
    c->add_generated_token_ids(tokens[i]);
    ++counts[tokens[i]];
  }
  v1::SamplerState* state = c->mutable_sampler_state();
  state->set_seed(request.request().sampling().seed());
  state->set_output_count(static_cast<uint32_t>(k));
  for (const auto& [token, count] : counts) {
    v1::TokenCount* tc = state->add_penalty_counts();
    tc->set_token_id(token);
    tc->set_count(count);
  }
  return request;
}

InProcessEngine::InProcessEngine(const std::string& model, int64_t window_pool_bytes,
                                 const std::string& weights, const std::string& kv,
                                 int32_t block_tokens, int64_t pool_bytes) {
  backend_ = *CpuBackend::Create({1, std::nullopt});
  const WeightDType dtype = *ParseWeightDType(weights);
  absl::StatusOr<HostWeights> host;
  if (IsDirectory(model) && std::ifstream(model + "/preprocessor_config.json").good()) {
    // A LLaVA directory, as the worker loads it: the text model and the vision tower.
    tokenizer_ = *Tokenizer::FromHfDirectory(model);
    absl::StatusOr<LlavaModel> llava = LoadLlavaModel(model, dtype, kv);
    EXPECT_TRUE(llava.ok()) << llava.status();
    if (llava.ok()) {
      host = std::move(llava->text);
      auto encoder = ImageEncoder::Create(model, std::move(llava->tower), media::ImageLimits{});
      EXPECT_TRUE(encoder.ok()) << encoder.status();
      if (encoder.ok()) image_encoder_ = *std::move(encoder);
    } else {
      host = llava.status();
    }
  } else if (IsDirectory(model)) {
    tokenizer_ = *Tokenizer::FromHfDirectory(model);
    host = LoadHfModel(model, dtype, kv);
  } else {
    auto gguf = *GgufFile::Open(model);
    tokenizer_ = *Tokenizer::FromGguf(*gguf);
    host = LoadGgufModel(*gguf, dtype, kv);
  }
  EXPECT_TRUE(host.ok()) << host.status();
  model_ = *Transformer::Create(*host, backend_.get());
  allocator_ = std::make_unique<BackendKvAllocator>(backend_.get());
  const KvBlockLayout layout = window_pool_bytes > 0 ? model_->FullKvLayoutFor(block_tokens)
                                                     : model_->KvLayoutFor(block_tokens);
  pool_ = *KvBlockPool::Create(layout, pool_bytes / static_cast<int64_t>(layout.block_bytes()),
                               allocator_.get(), backend_.get());
  if (window_pool_bytes > 0) {
    const KvBlockLayout window = model_->WindowKvLayoutFor(block_tokens);
    window_pool_ =
        *KvBlockPool::Create(window, window_pool_bytes / static_cast<int64_t>(window.block_bytes()),
                             allocator_.get(), backend_.get());
  }
  EngineOptions options;  // the worker's defaults
  options.prefix_cache_bytes = pool_bytes;
  auto engine =
      Engine::Create(model_.get(), pool_.get(), tokenizer_.get(), options, window_pool_.get());
  EXPECT_TRUE(engine.ok()) << engine.status();
  engine_ = std::move(*engine);
}

InProcessEngine::~InProcessEngine() { engine_.reset(); }

std::vector<ChoiceOutput> InProcessEngine::Run(const v1::GenerateRequest& request) {
  WireLimits limits;
  limits.model_fingerprint = model_->fingerprint();
  limits.block_tokens = engine_->block_tokens();
  limits.max_positions = model_->max_positions();
  limits.vocab_size = model_->config().vocab_size;
  limits.hidden_size = model_->config().hidden_size;
  limits.image_encoder = image_encoder_.get();
  // Constraints compiled directly (no cache): the worker's compile cache is what is compared.
  limits.compile_constraint = [this](const Hash128&, absl::string_view gbnf,
                                     absl::Span<const TokenId> kept_special)
      -> absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>> {
    absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> vocabulary =
        engine_->Vocabulary(kept_special);
    if (!vocabulary.ok()) return vocabulary.status();
    return grammar::CompiledConstraint::Create(gbnf, *std::move(vocabulary));
  };
  std::vector<int64_t> first;
  absl::StatusOr<EngineRequest> r = ToEngineRequest(request.request(), limits, &first);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  const bool logprobs = r->sampling.top_logprobs >= 0;
  std::vector<v1::TokenChunk> chunks(r->n);
  r->on_event = [&](const TokenEvent& e) { AppendToChunk(e, logprobs, &chunks[e.choice]); };
  EXPECT_TRUE(engine_->Submit(*std::move(r)).ok());
  while (true) {
    auto worked = engine_->Step();
    EXPECT_TRUE(worked.ok()) << worked.status();
    if (!worked.ok() || !*worked) break;
  }
  std::vector<ChoiceOutput> out(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    out[c].tokens.assign(chunks[c].token_ids().begin(), chunks[c].token_ids().end());
    out[c].logprobs.assign(chunks[c].logprobs().begin(), chunks[c].logprobs().end());
    out[c].text = chunks[c].text();
    out[c].finish = chunks[c].finish_reason();
    out[c].has_stop_token = chunks[c].has_matched_stop_token_id();
    out[c].stop_token = chunks[c].matched_stop_token_id();
    out[c].stop_string = chunks[c].matched_stop_string();
  }
  return out;
}

std::vector<TokenId> Encode(const Tokenizer& tokenizer, const std::string& text) {
  auto ids = tokenizer.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<TokenId>{};
}

std::vector<TokenId> RandomPrompt(int n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<TokenId> p(n);
  for (TokenId& t : p) t = 4 + static_cast<TokenId>(rng() % static_cast<uint32_t>(vocab - 4));
  return p;
}

bool CacheView::Apply(const v1::WorkerStatus& status) {
  if (status.snapshot()) {
    full.clear();
    window.clear();
  }
  if (status.snapshot() || status.snapshot_continues()) {
    for (const v1::KvEvent& e : status.kv_events()) {
      for (const v1::Hash128& h : e.block_hashes()) {
        (e.window_layers() ? window : full).insert(FromProto(h));
      }
    }
    sequence = status.sequence();
    return true;
  }
  uint64_t count = 0;
  for (const v1::KvEvent& e : status.kv_events()) {
    for (const v1::Hash128& h : e.block_hashes()) {
      std::set<Hash128>& set = e.window_layers() ? window : full;
      if (e.type() == v1::KV_EVENT_TYPE_STORED) {
        set.insert(FromProto(h));
      } else {
        set.erase(FromProto(h));
      }
      ++count;
    }
  }
  const bool ok = status.sequence() - sequence == count;
  if (!ok) consistent = false;
  sequence = status.sequence();
  return ok;
}

bool WaitUntilIdle(WorkerClient::WatchStream& stream, CacheView* view, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::WorkerStatus status;
  while (absl::Now() < deadline && stream.Next(&status)) {
    if (view != nullptr) view->Apply(status);
    if (status.snapshot_continues()) continue;
    const v1::WorkerLoad& l = status.load();
    if (l.running_requests() == 0 && l.queued_requests() == 0 &&
        l.used_kv_blocks() == l.cached_kv_blocks()) {
      return true;
    }
  }
  return false;
}

bool WaitUntilIdle(WorkerClient& client, CacheView* view, absl::Duration timeout) {
  auto stream = client.Watch(v1::WatchRequest(), timeout + absl::Seconds(5));
  CacheView own;
  const bool idle = WaitUntilIdle(*stream, view != nullptr ? view : &own, timeout);
  stream->Cancel();
  stream->Finish();
  return idle;
}

bool ReadUntilSequence(WorkerClient::WatchStream& stream, CacheView* view, uint64_t sequence,
                       absl::Duration timeout) {
  if (view->sequence >= sequence) return true;
  const absl::Time deadline = absl::Now() + timeout;
  v1::WorkerStatus status;
  while (absl::Now() < deadline && stream.Next(&status)) {
    view->Apply(status);
    if (!status.snapshot_continues() && view->sequence >= sequence) return true;
  }
  return false;
}

void ExpectSameOutput(const ChoiceOutput& got, const ChoiceOutput& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.text, want.text) << what;
  EXPECT_EQ(got.finish, want.finish) << what;
  EXPECT_EQ(got.stop_string, want.stop_string) << what;
  EXPECT_EQ(got.has_stop_token, want.has_stop_token) << what;
  EXPECT_TRUE(got.indexes_ok) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    // Bit for bit: the same floats serialize to the same bytes.
    EXPECT_EQ(got.logprobs[i].SerializeAsString(), want.logprobs[i].SerializeAsString())
        << what << ": logprobs of token " << i;
  }
}

std::string MiddleCharacter(const std::string& text) {
  auto continuation = [&](size_t i) {
    return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80;
  };
  size_t at = text.size() / 2;
  while (at > 0 && continuation(at)) --at;
  size_t end = at + 1;
  while (end < text.size() && continuation(end)) ++end;
  return text.substr(at, end - at);
}

double WaitForMetric(int admin_port, const std::string& metric, double at_least,
                     absl::Duration timeout) {
  double value = MetricValue(admin_port, metric);
  WaitUntil(
      [&] {
        value = MetricValue(admin_port, metric);
        return value >= at_least;
      },
      timeout);
  return value;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TestImage(const std::string& name) {
  return ReadBytes(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/ferry/media/image/testdata/fuzz_corpus/", name));
}

TinyVlm LoadTinyVlm(const std::string& variant) {
  const char* dir = std::getenv("FERRY_TINY_VLM_DIR");
  EXPECT_NE(dir, nullptr) << "FERRY_TINY_VLM_DIR is not set (run the test through its .sh)";
  TinyVlm v;
  v.dir = absl::StrCat(dir == nullptr ? "" : dir, "/", variant);
  const nlohmann::json config = nlohmann::json::parse(ReadBytes(v.dir + "/config.json"));
  v.image_token = config.at("image_token_index").get<TokenId>();
  v.image_tokens = config.at("image_seq_length").get<uint32_t>();
  v.vocab = config.at("text_config").at("vocab_size").get<int64_t>();
  v.hidden = config.at("text_config").at("hidden_size").get<int64_t>();
  return v;
}

v1::PromptImage BytesImage(v1::GenerateRequest& request, uint32_t start, uint32_t length,
                           TokenId placeholder, const std::string& bytes) {
  for (uint32_t i = 0; i < length; ++i) {
    request.mutable_request()->set_prompt_token_ids(static_cast<int>(start + i), placeholder);
  }
  v1::PromptImage image;
  kv::HashToProto(Xxh3Hash128(bytes), image.mutable_content_hash());
  image.set_placeholder_start(start);
  image.set_placeholder_length(length);
  image.set_image_data(bytes);
  return image;
}

v1::GenerateRequest ImageRequest(const std::string& id, const TinyVlm& vlm, int n, uint32_t seed,
                                 const std::vector<std::pair<uint32_t, std::string>>& images,
                                 const Sampling& sampling) {
  v1::GenerateRequest r = MakeRequest(id, RandomPrompt(n, seed, vlm.image_token), sampling);
  for (const auto& [start, bytes] : images) {
    *r.mutable_request()->add_images() =
        BytesImage(r, start, vlm.image_tokens, vlm.image_token, bytes);
  }
  return r;
}

}  // namespace ferry
