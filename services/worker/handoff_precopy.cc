// The drain pre-copy's two halves on WorkerService (worker_service.h, "Draining"):
//   - the target's PrefetchKv: reserve blocks for the request's full blocks computed so far
//     (Engine::ReserveImport: those cached here are taken as they are), describe the fresh ones,
//     ask the source for them (PushKv with precopy) and, once they landed, give them to the
//     prefix cache (Engine::CacheBlocks), where the hand-off's reservation at the deadline finds
//     them as its cached prefix;
//   - the source's PushKv with precopy: hold the running request's first blocks
//     (Engine::HoldComputedBlocks), put them into the target's slices, let them go.
// A failure on either side costs the hand-off its speed, never its correctness: the hand-off at
// the deadline pushes whatever the target does not hold then.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/common/block_hash.h"
#include "engine/common/log.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"
#include "services/common/shared_token.h"
#include "services/worker/generate_call.h"
#include "services/worker/kv_handoff.h"
#include "services/worker/worker_service.h"

namespace ferry {

namespace {

grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context,
                                   const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

void WorkerService::PlanHandoffs(absl::Time deadline) {
  std::vector<GenerateCall*> calls;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, call] : calls_) {
      call->Ref();
      calls.push_back(call);
    }
  }
  for (GenerateCall* call : calls) {
    call->PlanHandoff(deadline);
    call->Unref();
  }
}

grpc::ServerUnaryReactor* WorkerService::PrefetchKv(grpc::CallbackServerContext* context,
                                                    const v1::PrefetchKvRequest* request,
                                                    v1::PrefetchKvResponse* response) {
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return Finished(context, auth);
  if (!hands_off()) {
    return Finished(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                          "this worker takes no hand-offs (a prefill worker, or "
                                          "no KV transport)"));
  }
  if (draining()) {
    return Finished(context,
                    grpc::Status(grpc::StatusCode::UNAVAILABLE, "this worker is draining"));
  }
  const v1::GenerateRequest& g = request->request();
  const v1::TokenizedRequest& t = g.request();
  if (g.handoff_source_endpoint().empty() || g.handoff_source_request_id().empty() ||
      t.resume().choices_size() != 1 || t.prompt_token_ids_size() == 0) {
    return Finished(context,
                    grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a pre-copy names its source (handoff_source_endpoint and "
                                 "handoff_source_request_id), a prompt and one resumed choice"));
  }
  if (t.images_size() > 0) {
    // Their blocks' hashes need the images' own; such a hand-off moves all of its KV at the end.
    return Finished(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                          "requests with images are not pre-copied"));
  }
  // The hand-off's KV: the prompt and the output but its last token (never computed there yet).
  std::vector<TokenId> tokens(t.prompt_token_ids().begin(), t.prompt_token_ids().end());
  const auto& generated = t.resume().choices(0).generated_token_ids();
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  if (!generated.empty()) tokens.pop_back();
  const int64_t bt = std::max<int64_t>(1, limits_.block_tokens);
  if (static_cast<int64_t>(tokens.size()) / bt > engine_->pool().num_blocks()) {
    return Finished(context, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                          "the request's KV is larger than this worker's pool"));
  }
  std::vector<Hash128> hashes = ComputeBlockHashes(
      {limits_.model_fingerprint, t.context().cache_salt(), ""}, tokens, static_cast<uint32_t>(bt));
  if (hashes.empty()) {
    return Finished(context, grpc::Status::OK);  // not one full block yet
  }
  const absl::Time deadline =
      std::min(absl::Now() + options_.reservation_timeout,
               context->deadline() == std::chrono::system_clock::time_point::max()
                   ? absl::InfiniteFuture()
                   : absl::FromChrono(context->deadline()));

  // One answer, from whichever of the landing, the source's refusal or a failure comes first.
  struct State {
    grpc::ServerUnaryReactor* reactor = nullptr;
    v1::PrefetchKvResponse* response = nullptr;
    std::vector<Hash128> hashes;
    std::string source_id, source_endpoint, trace_id;
    absl::Mutex mu;
    bool answered ABSL_GUARDED_BY(mu) = false;
    std::shared_ptr<IncomingKv> kv ABSL_GUARDED_BY(mu);
    // The landing's outcome, when it came before kv was set (an await past its deadline).
    std::optional<absl::Status> early ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  state->reactor = context->DefaultReactor();
  state->response = response;
  state->hashes = std::move(hashes);
  state->source_id = g.handoff_source_request_id();
  state->source_endpoint = g.handoff_source_endpoint();
  state->trace_id = TraceIdOf(*context);
  CallCreated();  // until answered: the service outlives the callbacks
  // Whoever claims the answer first settles the blocks, then answers (finish).
  auto claim = [state]() {
    absl::MutexLock lock(&state->mu);
    if (state->answered) return false;
    state->answered = true;
    state->kv.reset();  // (it holds this state through its callback)
    return true;
  };
  auto finish = [this, state](const grpc::Status& status) {
    if (!status.ok()) {
      LOG(INFO) << LogTraceId(state->trace_id) << "pre-copy of request " << state->source_id
                << " from " << state->source_endpoint << " not done: " << status.error_message();
    }
    state->reactor->Finish(status);
    CallGone();
  };
  auto answer = [claim, finish](const grpc::Status& status) {
    if (claim()) finish(status);
  };
  const int64_t n = static_cast<int64_t>(state->hashes.size());
  engine_->engine().ReserveImport(
      state->hashes, n,
      [this, state, answer, claim, finish, deadline](absl::StatusOr<KvReservation> got) {
        // On the engine thread: nothing here blocks.
        if (!got.ok()) {
          return answer(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                     absl::StrCat("no room for the KV: ", got.status().message())));
        }
        KvReservation blocks = *std::move(got);
        const int64_t k = static_cast<int64_t>(blocks.blocks.size());
        state->response->set_cached_blocks(static_cast<uint32_t>(blocks.cached_blocks));
        if (blocks.cached_blocks >= k) {
          // Held here already (or no fresh block was free): nothing to pull.
          engine_->engine().CacheBlocks(
              std::vector<Hash128>(state->hashes.begin(), state->hashes.begin() + k),
              std::move(blocks.blocks));
          return answer(grpc::Status::OK);
        }
        ReservationTarget target = target_;
        target.window_staging = nullptr;  // the pool's blocks only: window layers move at the end
        const std::string transfer_id =
            absl::StrCat("precopy/", state->source_id, "/", RandomTransferSuffix());
        KvLanding landing;
        auto described = DescribeReservation(state->source_id, blocks, target, facts_, transfer_id,
                                             "", deadline, &landing);
        if (!described.ok()) {
          landing.clear();  // never sent: nobody can write it
          CHECK_OK(engine_->pool().Release(blocks.blocks));
          return answer(ToGrpcStatus(described.status()));
        }
        const int64_t cached = blocks.cached_blocks;
        std::vector<Hash128> landed_hashes(state->hashes.begin(), state->hashes.begin() + k);
        // The landing: its blocks go to the prefix cache, or back once no put can reach them.
        auto settle = [this, state, claim, finish, landed_hashes, cached, k](
                          const std::shared_ptr<IncomingKv>& kv, const absl::Status& s) {
          if (!claim()) return;
          if (!s.ok()) {
            kv->Abandon();
            return finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       absl::StrCat("the pre-copy did not land: ", s.message())));
          }
          KvReservation landed = kv->Take();
          engine_->engine().CacheBlocks(landed_hashes, std::move(landed.blocks));
          state->response->set_pushed_blocks(static_cast<uint32_t>(k - cached));
          state->response->set_bytes_transferred(static_cast<uint64_t>(k - cached) *
                                                 facts_.block_bytes);
          finish(grpc::Status::OK);
        };
        std::shared_ptr<IncomingKv> kv =
            IncomingKv::Await(options_.transport, &engine_->pool(), nullptr, std::move(blocks),
                              {transfer_id}, deadline, options_.reservation_quarantine,
                              std::move(landing), [state, settle](absl::Status s) {
                                std::shared_ptr<IncomingKv> kv;
                                {
                                  absl::MutexLock lock(&state->mu);
                                  if (state->kv == nullptr) {
                                    state->early = std::move(s);
                                    return;
                                  }
                                  kv = state->kv;
                                }
                                settle(kv, s);
                              });
        std::optional<absl::Status> early;
        {
          absl::MutexLock lock(&state->mu);
          state->kv = kv;
          early = std::move(state->early);
        }
        if (early.has_value()) {
          kv->NoTransfer();  // never asked for: no put can reach the blocks
          return settle(kv, absl::DeadlineExceededError("the pre-copy's deadline passed"));
        }
        LOG(INFO) << LogTraceId(state->trace_id) << "pre-copy of request " << state->source_id
                  << " from " << state->source_endpoint << ": " << (k - cached)
                  << " blocks to pull, " << cached << " held here";
        // The source pushes; its answer matters only when it never posted (the landing says the
        // rest).
        struct Rpc {
          std::unique_ptr<grpc::ClientContext> context;
          v1::PushKvRequest request;
          v1::PushKvResponse response;
        };
        auto rpc = std::make_shared<Rpc>();
        rpc->request.set_request_id(state->source_id);
        rpc->request.set_precopy(true);
        *rpc->request.mutable_destination() = *std::move(described);
        rpc->context = NewClientContext(std::max(absl::Milliseconds(1), deadline - absl::Now()),
                                        state->trace_id);
        AttachSharedToken(rpc->context.get(), options_.auth_token);
        auto stub = DecodeStub(state->source_endpoint);
        stub->async()->PushKv(
            rpc->context.get(), &rpc->request, &rpc->response,
            [claim, finish, kv, rpc, stub](grpc::Status status) {
              if (status.ok() || !claim()) return;
              const grpc::StatusCode code = status.error_code();
              if (code == grpc::StatusCode::NOT_FOUND ||
                  code == grpc::StatusCode::FAILED_PRECONDITION ||
                  code == grpc::StatusCode::INVALID_ARGUMENT ||
                  code == grpc::StatusCode::UNIMPLEMENTED ||
                  code == grpc::StatusCode::UNAUTHENTICATED) {
                kv->NoTransfer();  // refused before any put
              }
              kv->Abandon();
              finish(grpc::Status(status.error_code(),
                                  absl::StrCat("the source refused: ", status.error_message())));
            });
      });
  return state->reactor;
}

grpc::ServerUnaryReactor* WorkerService::PushPrecopy(grpc::CallbackServerContext* context,
                                                     const v1::PushKvRequest* request,
                                                     v1::PushKvResponse* response) {
  if (options_.transport == nullptr) {
    return Finished(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                          "this worker has no KV transport"));
  }
  const v1::KvReservation& destination = request->destination();
  if (absl::Status valid = CheckPrecopyReservation(destination, facts_); !valid.ok()) {
    return Finished(context, ToGrpcStatus(valid));
  }
  auto peer = options_.transport->Connect(destination.transfer().worker_address());
  if (!peer.ok()) return Finished(context, ToGrpcStatus(peer.status()));
  const std::string id = request->request_id();
  const int64_t blocks =
      static_cast<int64_t>(destination.cached_prefix_blocks()) + destination.reserved_blocks();
  {
    absl::MutexLock lock(&mu_);
    ++handoff_pushes_;  // the drain waits for it
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const auto start = std::chrono::steady_clock::now();
  auto finish = [this, reactor, response, id, start](const absl::Status& outcome, uint64_t bytes) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (outcome.ok()) {
      response->set_bytes_transferred(bytes);
      response->set_transfer_us(static_cast<uint64_t>(seconds * 1e6));
      metrics_->Precopy("pushed", bytes);
      LOG(INFO) << "pre-copy of request " << id << ": " << bytes << " bytes pushed in "
                << absl::Seconds(seconds);
    } else {
      metrics_->Precopy(outcome.code() == absl::StatusCode::kNotFound ||
                                outcome.code() == absl::StatusCode::kFailedPrecondition
                            ? "refused"
                            : "failed",
                        0);
      LOG(INFO) << "pre-copy of request " << id << " not done: " << outcome;
    }
    reactor->Finish(ToGrpcStatus(outcome));
    {
      absl::MutexLock lock(&mu_);
      --handoff_pushes_;
    }
    changed_.SignalAll();
  };
  const absl::Time deadline = absl::Now() + options_.reservation_timeout;
  const transfer::PeerId to = *peer;
  if (const std::string& hold = options_.push_hold_file; !hold.empty()) {
    // Test seam (as the hand-off's push): the pre-copy waits while the file exists, on a thread of
    // its own; the log line is the tests' event that it is held.
    CallCreated();  // the destructor waits for this thread's end
    std::thread([this, hold, id, blocks, deadline, to, destination, finish] {
      if (access(hold.c_str(), F_OK) == 0) {
        LOG(INFO) << "test seam: the pre-copy push of request " << id << " waits while " << hold
                  << " exists";
      }
      while (access(hold.c_str(), F_OK) == 0 && absl::Now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      StartPrecopy(id, blocks, destination, to, deadline, finish);
      CallGone();
    }).detach();
    return reactor;
  }
  StartPrecopy(id, blocks, destination, to, deadline, finish);
  return reactor;
}

void WorkerService::StartPrecopy(const std::string& id, int64_t blocks,
                                 const v1::KvReservation& destination, transfer::PeerId to,
                                 absl::Time deadline,
                                 std::function<void(const absl::Status&, uint64_t)> finish) {
  engine_->engine().HoldComputedBlocks(
      id, blocks,
      [this, destination, finish, deadline, to](absl::StatusOr<std::vector<BlockId>> held) {
        // On the engine thread: the put is posted, never waited for.
        if (!held.ok()) return finish(held.status(), 0);
        auto owned = std::make_shared<std::vector<BlockId>>(*std::move(held));
        uint64_t bytes = 0;
        std::shared_ptr<KvHostBlocks> source;
        auto put =
            PrecopyTransfer(destination, *owned, *engine_->staging(), deadline, &bytes, &source);
        if (!put.ok()) {
          CHECK_OK(engine_->pool().Release(*owned));
          return finish(put.status(), 0);
        }
        put->peer = to;
        auto done = [this, owned, finish, bytes, source](absl::Status s) mutable {
          source.reset();  // the put is over: its staging slots go back
          CHECK_OK(engine_->pool().Release(*owned));
          finish(s, s.ok() ? bytes : 0);
        };
        auto posted = options_.transport->Post(*std::move(put), done);
        if (!posted.ok()) done(posted.status());
      });
}

}  // namespace ferry
