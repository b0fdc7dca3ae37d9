#include "services/worker/worker_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/backends/backend_factory.h"
#include "engine/common/hash128.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "engine/common/units.h"
#include "engine/kv/kv_staging.h"
#include "engine/model/host_weights.h"
#include "engine/model/model_files.h"
#include "engine/model/null_model.h"
#include "engine/model/sim_timing.h"
#include "engine/model/transformer.h"
#include "engine/model/vision/llava_model.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

// The ids the null model emits: ordinary tokens with text of their own.
std::vector<TokenId> OrdinaryTokens(const Tokenizer& tokenizer, const ModelConfig& config) {
  std::vector<TokenId> out;
  const TokenId vocab = static_cast<TokenId>(
      std::min<int64_t>(config.vocab_size, static_cast<int64_t>(tokenizer.vocab_size())));
  for (TokenId t = 0; t < vocab; ++t) {
    if (tokenizer.IsSpecial(t) || tokenizer.IsByteFallbackToken(t)) continue;
    if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), t) !=
        config.eos_token_ids.end()) {
      continue;
    }
    auto text = tokenizer.Decode({&t, 1});
    if (!text.ok() || text->empty() || text->find("\xEF\xBF\xBD") != std::string::npos) continue;
    out.push_back(t);
  }
  return out;
}

// --null_script's file as token scripts.
absl::StatusOr<std::vector<NullScript>> ReadNullScripts(const std::string& path,
                                                        const Tokenizer& tokenizer) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--null_script ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--null_script ", path, ": ", why));
  };
  if (!doc.is_array()) return bad("not a JSON array of {\"when\", \"reply\"} objects");
  std::vector<NullScript> scripts;
  for (const nlohmann::json& entry : doc) {
    if (!entry.is_object() || !entry.contains("reply") || !entry["reply"].is_string() ||
        (entry.contains("when") && !entry["when"].is_string())) {
      return bad("each entry needs \"reply\" (and may have \"when\"), strings");
    }
    NullScript script;
    if (entry.contains("when")) {
      ASSIGN_OR_RETURN(script.trigger, tokenizer.Encode(entry["when"].get<std::string>()));
    }
    ASSIGN_OR_RETURN(script.reply,
                     tokenizer.Encode(entry["reply"].get<std::string>(), /*allow_special=*/true));
    scripts.push_back(std::move(script));
  }
  return scripts;
}

// Whether an HF directory holds a LLaVA-style model (config.json's model_type "llava").
absl::StatusOr<bool> IsLlavaDirectory(const ModelFiles& files) {
  if (!files.hf()) return false;
  const std::string path = files.path() + "/config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  if (!config.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  return config.contains("model_type") && config["model_type"] == "llava";
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerEngine>> WorkerEngine::Create(
    const WorkerOptions& options, std::function<void(const StepInfo&)> on_step,
    transfer::KvTransport* transport, std::function<void()> on_pass) {
  RETURN_IF_ERROR(ValidateWorkerOptions(options));
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<WorkerEngine> w(new WorkerEngine());
  w->model_path_ = options.model.empty() ? DefaultModelPath() : options.model;
  ASSIGN_OR_RETURN(ModelFiles files, ModelFiles::Open(w->model_path_));
  w->model_name_ = options.model_name.empty() ? files.name() : options.model_name;
  w->engine_kind_ = options.engine;
  w->backend_kind_ = options.backend;
  w->tokenizer_ = files.TakeTokenizer();
  BackendOptions backend_options;
  backend_options.kind = options.backend;
  backend_options.threads = options.engine == "real" ? options.threads : 1;
  backend_options.cuda_device = options.cuda_device;
  backend_options.gpu_memory_bytes = static_cast<uint64_t>(options.gpu_memory_bytes);
  backend_options.deterministic = options.deterministic;
  backend_options.cuda_graphs = options.cuda_graphs;
  // Graphs for every decode batch the scheduler makes (at most max_running sequences), rounded
  // up to the recorded shapes' multiple of 8.
  backend_options.cuda_graph_rows = static_cast<int>(
      std::min<int64_t>(std::max<int64_t>(8, (options.max_running + 7) / 8 * 8), 1024));
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(backend_options));
  if (options.engine == "real") {
    ASSIGN_OR_RETURN(const WeightDType dtype, ParseWeightDType(options.weights));
    ASSIGN_OR_RETURN(const bool llava, IsLlavaDirectory(files));
    if (llava) {
      // A vision-language model: the text model runs as any other, its fingerprint extended with
      // the tower's; the tower encodes the requests' image bytes (image_encoder.h).
      ASSIGN_OR_RETURN(LlavaModel loaded, LoadLlavaModel(w->model_path_, dtype, options.kv_dtype));
      ASSIGN_OR_RETURN(w->model_, Transformer::Create(loaded.text, backend.get()));
      ASSIGN_OR_RETURN(
          w->image_encoder_,
          ImageEncoder::Create(w->model_path_, std::move(loaded.tower), media::ImageLimits{}));
    } else {
      ASSIGN_OR_RETURN(const HostWeights weights, files.LoadWeights(dtype, options.kv_dtype));
      if (options.backend != "cpu" && weights.config.moe.num_experts > 0) {
        // Routing runs on the host: a copy of the router's logits per layer, per step.
        return absl::InvalidArgumentError(
            "--backend=cuda: mixture-of-experts models run on --backend=cpu for now");
      }
      ASSIGN_OR_RETURN(w->model_, Transformer::Create(weights, backend.get()));
    }
  } else {
    NullModelOptions null;
    ASSIGN_OR_RETURN(null.config, files.ReadConfig());
    null.tokens = OrdinaryTokens(*w->tokenizer_, null.config);
    ASSIGN_OR_RETURN(null.identity, DigestFile(files.tokenizer_file()));
    null.prefill_tokens_per_second = options.null_prefill_tokens_per_second;
    null.decode_token_seconds = options.null_token_seconds;
    null.step_overhead_seconds = options.null_step_overhead_seconds;
    if (!options.null_script.empty()) {
      ASSIGN_OR_RETURN(null.scripts, ReadNullScripts(options.null_script, *w->tokenizer_));
    }
    if (options.engine == "sim") {
      absl::StatusOr<SimCalibration> calibration = LoadSimCalibration(options.sim_calibration);
      if (!calibration.ok()) {
        return absl::Status(calibration.status().code(),
                            absl::StrCat("--sim_calibration: ", calibration.status().message()));
      }
      w->sim_timing_ =
          std::make_shared<const SimTiming>(*std::move(calibration), options.sim_speed);
      null.timing = w->sim_timing_;
    }
    ASSIGN_OR_RETURN(w->model_, NullModel::Create(std::move(null)));
  }
  w->backend_ = std::move(backend);
  // Where the pools live, and the host memory their KV moves through (kv_staging.h): a pool of
  // host memory is lent in place, from the transport's registered memory when there is one; a
  // GPU's pool (or any, with --kv_staging=always) stays the backend's, and a staging area of host
  // memory (the transport's, else plain) carries its blocks in and out.
  w->staged_ = options.kv_staging == "always" || !w->backend_->host_memory();
  const bool moves_kv =
      transport != nullptr || !options.kvstore.empty() || !options.kvstore_dns.empty();
  std::unique_ptr<transfer::TransportKvAllocator> registered;
  if (transport != nullptr) {
    registered = std::make_unique<transfer::TransportKvAllocator>(transport);
    w->transport_allocator_ = registered.get();
  }
  if (registered != nullptr && !w->staged_) {
    w->allocator_ = std::move(registered);
  } else {
    w->allocator_ = std::make_unique<BackendKvAllocator>(w->backend_.get());
  }
  if (w->staged_ && moves_kv) {
    if (registered != nullptr) {
      w->staging_allocator_ = std::move(registered);
    } else {
      w->staging_allocator_ = std::make_unique<HostKvAllocator>();
    }
  }

  const ForwardModel& model = *w->model_;
  const int32_t bt = options.block_tokens;
  const bool hybrid = model.FullKvLayoutFor(bt).num_layers > 0;
  if (options.window_pool_bytes > 0 && !hybrid) {
    return absl::InvalidArgumentError(
        "--window_pool_bytes: the model has no sliding-window layers next to full ones");
  }
  if (hybrid && options.window_pool_bytes == 0 && !options.kvstore.empty()) {
    // The store holds the full-attention layers' KV only; in one pool a block holds every layer.
    return absl::InvalidArgumentError(
        "--kvstore with a hybrid model (sliding-window layers) needs --window_pool_bytes: the "
        "store keeps the full-attention layers' KV, which only a pool of their own separates");
  }
  const KvBlockLayout layout =
      options.window_pool_bytes > 0 ? model.FullKvLayoutFor(bt) : model.KvLayoutFor(bt);
  // The byte sizes are of the KV the pool holds: NullModel's tiny blocks, or with the simulated
  // engine the calibrated model's (its blocks are counted as that model's, kept as NullModel's).
  const int64_t sized_block_bytes =
      w->sim_timing_ != nullptr ? static_cast<int64_t>(std::ceil(w->sim_timing_->KvBytes(bt)))
                                : static_cast<int64_t>(layout.block_bytes());
  const int64_t blocks = options.kv_pool_bytes / sized_block_bytes;
  if (blocks < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_pool_bytes ", FormatByteSize(options.kv_pool_bytes), " holds fewer than 2 blocks of ",
        FormatByteSize(sized_block_bytes), w->sim_timing_ != nullptr ? " (simulated)" : ""));
  }
  ASSIGN_OR_RETURN(w->pool_,
                   KvBlockPool::Create(layout, blocks, w->allocator_.get(), w->backend_.get()));
  EngineOptions& eo = w->engine_options_;
  eo.max_batch_tokens = options.max_batch_tokens;
  eo.max_running = options.max_running;
  eo.max_queued = options.max_queued;
  eo.prefill_chunk = options.prefill_chunk;
  eo.max_n = options.max_n;
  eo.prefix_cache_bytes = options.prefix_cache_bytes >= 0
                              ? options.prefix_cache_bytes / sized_block_bytes *
                                    static_cast<int64_t>(layout.block_bytes())
                              : blocks * static_cast<int64_t>(layout.block_bytes());
  eo.window_cache_bytes = options.window_cache_bytes;
  eo.window_cache_ttl = options.window_cache_ttl;
  eo.swa_replay = options.swa_replay == "bounded" ? EngineOptions::SwaReplay::kBounded
                                                  : EngineOptions::SwaReplay::kExact;
  eo.swa_replay_tokens = options.swa_replay_tokens;
  eo.journal_events = options.watch_journal_events;
  eo.on_step = std::move(on_step);
  eo.on_pass = std::move(on_pass);
  eo.handoff_ttl = options.handoff_ttl;
  if (options.window_pool_bytes > 0) {
    const KvBlockLayout window = model.WindowKvLayoutFor(bt);
    const int64_t window_blocks =
        options.window_pool_bytes / static_cast<int64_t>(window.block_bytes());
    ASSIGN_OR_RETURN(w->window_pool_, KvBlockPool::Create(window, window_blocks,
                                                          w->allocator_.get(), w->backend_.get()));
  }
  ASSIGN_OR_RETURN(w->staging_, w->MakeStaging(*w->pool_, options, moves_kv));
  if (w->window_pool_ != nullptr) {
    // The window layers' KV moves only between workers (the store keeps the full layers').
    ASSIGN_OR_RETURN(w->window_staging_,
                     w->MakeStaging(*w->window_pool_, options, transport != nullptr));
  }
  ASSIGN_OR_RETURN(w->engine_, Engine::Create(w->model_.get(), w->pool_.get(), w->tokenizer_.get(),
                                              eo, w->window_pool_.get()));
  w->engine_->Start();
  w->load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LOG(INFO) << "engine " << w->engine_kind_ << " on " << w->backend_->name() << ": "
            << w->model_name_ << " (" << w->model_path_ << "), " << blocks << " KV blocks of " << bt
            << " tokens (" << FormatByteSize(blocks * layout.block_bytes())
            << (w->sim_timing_ != nullptr
                    ? absl::StrCat(", simulating ", FormatByteSize(blocks * sized_block_bytes),
                                   " of ", w->sim_timing_->calibration().name, " at speed ",
                                   w->sim_timing_->speed())
                    : "")
            << ")"
            << (w->window_pool_ != nullptr
                    ? absl::StrCat(", window pool of ", w->window_pool_->num_blocks(), " blocks")
                    : "")
            << (w->staging_ != nullptr && w->staging_->staged()
                    ? absl::StrCat(", its KV moved through a staging area of ",
                                   w->staging_->capacity_blocks(), " blocks of host memory",
                                   w->transport_allocator_ != nullptr
                                       ? " registered with the KV transport"
                                       : "")
                    : "")
            << (w->image_encoder_ != nullptr
                    ? absl::StrCat(", vision tower of ", w->image_encoder_->num_image_tokens(),
                                   " tokens per image")
                    : "")
            << ", fingerprint " << model.fingerprint() << ", loaded in " << w->load_seconds_
            << " s";
  return w;
}

absl::StatusOr<std::unique_ptr<KvStaging>> WorkerEngine::MakeStaging(KvBlockPool& pool,
                                                                     const WorkerOptions& options,
                                                                     bool moves_kv) {
  if (!staged_) return KvStaging::InPlace(&pool);
  if (!moves_kv) return std::unique_ptr<KvStaging>();
  const int64_t block_bytes = static_cast<int64_t>(pool.layout().block_bytes());
  // By default room for two of the longest sequences the model takes at once (a hand-off needs
  // its whole table's fresh blocks in the area), never more than the pool: host memory in
  // proportion to what one request can move, not to the device's pool.
  int64_t capacity = pool.num_blocks();
  const int64_t longest = model_->config().max_position_embeddings;
  if (longest > 0) capacity = std::min(capacity, 2 * pool.layout().BlocksFor(longest));
  if (options.kv_staging_bytes > 0) {
    capacity = std::min(pool.num_blocks(), options.kv_staging_bytes / block_bytes);
    if (capacity < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv_staging_bytes ", FormatByteSize(options.kv_staging_bytes),
                       " holds no KV block of ", FormatByteSize(block_bytes)));
    }
  }
  return KvStaging::Staged(&pool, staging_allocator_.get(), capacity);
}

absl::StatusOr<transfer::LocalRegion> WorkerEngine::RegionOf(const KvStaging& staging) const {
  if (transport_allocator_ == nullptr) {
    return absl::FailedPreconditionError(
        "the worker's KV pools are not registered with a transport");
  }
  return transport_allocator_->RegionOf(staging.region().address);
}

void WorkerEngine::DetachTransport() {
  // The transport frees the memory it lent (the staging areas' too): unpinned first.
  if (staging_ != nullptr) staging_->Unpin();
  if (window_staging_ != nullptr) window_staging_->Unpin();
  if (transport_allocator_ != nullptr) transport_allocator_->Detach();
}

WorkerEngine::~WorkerEngine() {
  if (engine_ != nullptr) engine_->Stop();
  engine_.reset();
}

}  // namespace ferry
