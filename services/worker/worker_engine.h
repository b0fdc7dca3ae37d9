// The engine a worker serves, built from its options (ARCHITECTURE.md §1
// `--engine=real|null|sim`): the model (the Transformer on the CPU backend, or the NullModel token
// source, timed by a calibration's SimTiming with `sim`), its tokenizer, the KV pool(s) and the
// Engine with its thread running. The worker's services see only the Engine and the tokenizer;
// which model runs underneath is this module's business. With `sim` the pool's byte sizes are of
// the simulated model's KV (kv_pool_bytes / (kv_bytes_per_token x block_tokens) blocks), and
// sim_timing() is what the services time KV hand-offs and store reads with.
//
// With a KV transport (the prefill and decode roles) the pools' memory comes from it
// (TransportKvAllocator), registered, so that peers can read and write the blocks in place. A
// GPU's pools (or any, with --kv_staging=always) stay device memory, and their KV moves through a
// staging area of host memory per pool (engine/kv/kv_staging.h), registered with the transport
// when there is one; staging() is the services' one way to the blocks' bytes either way.
//
// A LLaVA directory (config.json's model_type "llava", with --engine=real) loads with
// LoadLlavaModel: the text model runs as any other (its fingerprint extended with the tower's
// digest) and image_encoder() encodes requests' image bytes; other models have none.
//
// Thread-safe after Create (the Engine is; the rest is immutable). Destruction stops the engine
// thread first (live requests end with kAbort), then frees the pools and the model.

#ifndef FERRY_SERVICES_WORKER_WORKER_ENGINE_H_
#define FERRY_SERVICES_WORKER_WORKER_ENGINE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backends/backend.h"
#include "engine/engine.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/kv/kv_staging.h"
#include "engine/model/forward_model.h"
#include "engine/model/sim_timing.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/transfer/kv_transport.h"
#include "services/vision/image_encoder.h"
#include "services/worker/worker_options.h"

namespace ferry {

class WorkerEngine {
 public:
  // Loads the model named by options.model (DefaultModelPath() when empty) and starts the engine.
  // `on_step` and `on_pass` (may be empty) become EngineOptions::on_step and on_pass.
  // `transport` (may be null) must outlive the WorkerEngine.
  static absl::StatusOr<std::unique_ptr<WorkerEngine>> Create(
      const WorkerOptions& options, std::function<void(const StepInfo&)> on_step,
      transfer::KvTransport* transport = nullptr, std::function<void()> on_pass = nullptr);
  ~WorkerEngine();

  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ForwardModel& model() const { return *model_; }
  // The vision model's encoder (a LLaVA directory); null for a text-only model.
  const ImageEncoder* image_encoder() const { return image_encoder_.get(); }
  const std::string& model_path() const { return model_path_; }
  const std::string& model_name() const { return model_name_; }
  const std::string& engine_kind() const { return engine_kind_; }
  // The compute backend ("cpu", "cuda") and the backend itself (its name, its memory).
  const std::string& backend_kind() const { return backend_kind_; }
  const Backend& backend() const { return *backend_; }
  const EngineOptions& engine_options() const { return engine_options_; }
  double load_seconds() const { return load_seconds_; }
  // The simulated engine's timing model (--engine=sim); null otherwise.
  const std::shared_ptr<const SimTiming>& sim_timing() const { return sim_timing_; }
  // Whether the window layers of a hybrid model run in a pool of their own.
  bool two_pools() const { return window_pool_ != nullptr; }
  KvBlockPool& pool() { return *pool_; }
  KvBlockPool* window_pool() { return window_pool_.get(); }
  // Host access to the pools' blocks (in place, or staged): null only for a staged pool whose
  // worker moves no KV (no transport, no store).
  KvStaging* staging() { return staging_.get(); }
  KvStaging* window_staging() { return window_staging_.get(); }
  bool staged() const { return staged_; }
  // With a transport: the registration of `staging`'s host memory (for reservations).
  absl::StatusOr<transfer::LocalRegion> RegionOf(const KvStaging& staging) const;
  // Before the transport is destroyed (TransportKvAllocator::Detach); the engine thread must be
  // stopped by then or soon after.
  void DetachTransport();

 private:
  WorkerEngine() = default;
  absl::StatusOr<std::unique_ptr<KvStaging>> MakeStaging(KvBlockPool& pool,
                                                         const WorkerOptions& options,
                                                         bool moves_kv);

  std::string model_path_, model_name_, engine_kind_, backend_kind_;
  EngineOptions engine_options_;
  double load_seconds_ = 0;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<const SimTiming> sim_timing_;
  std::unique_ptr<ForwardModel> model_;
  std::unique_ptr<ImageEncoder> image_encoder_;
  std::unique_ptr<KvAllocator> allocator_;          // the pools' memory
  std::unique_ptr<KvAllocator> staging_allocator_;  // the staging areas' (staged only)
  // The one of them that is the transport's (with a transport).
  transfer::TransportKvAllocator* transport_allocator_ = nullptr;
  bool staged_ = false;
  std::unique_ptr<KvBlockPool> pool_, window_pool_;
  std::unique_ptr<KvStaging> staging_, window_staging_;  // before the pools are freed
  std::unique_ptr<Engine> engine_;                       // last: destroyed first
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_WORKER_ENGINE_H_
