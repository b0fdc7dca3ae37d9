#include "services/worker/worker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "kvstore/client/dynamic_kv_client.h"
#include "services/common/advertise_address.h"
#include "services/common/metrics.h"
#include "services/common/shared_token.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options) {
  RETURN_IF_ERROR(ValidateWorkerOptions(options));
  std::unique_ptr<Worker> w(new Worker(options));
  w->registry_ = NewServiceRegistry("worker");
  SharedTokenSource::Options token_options;
  token_options.file = options.auth_token_file;
  token_options.poll_interval = options.secret_poll_interval;
  token_options.registry = w->registry_.get();
  ASSIGN_OR_RETURN(w->token_, SharedTokenSource::Start(token_options));
  const SharedToken& token = w->token_->token();
  w->metrics_ = std::make_unique<WorkerMetrics>(*w->registry_);
  w->load_ = std::make_unique<LoadWindow>(options.load_window);
  WorkerMetrics* metrics = w->metrics_.get();
  LoadWindow* load = w->load_.get();
  {
    // Prefill and decode: the P/D path's KV moves through it. Aggregated: a drain's hand-off
    // does; without one an aggregated worker still serves (its drained requests resume by
    // re-prefill).
    transfer::TransportOptions transport;
    transport.kind = options.transport;
    transport.ucx_tls = options.ucx_tls;
    transport.listen_address = options.transport_address;
    transport.advertise_host = options.advertise_address;
    transport.auth_token = token;  // the gRPC fallback's calls, as the worker's own
    transport.registry = w->registry_.get();
    // A GPU's KV moves through a staging area of host memory registered with the transport
    // (WorkerEngine; Debian's UCX has no CUDA transports to read device memory in place).
    auto created = transfer::KvTransport::Create(transport);
    if (created.ok()) {
      w->transport_ = *std::move(created);
    } else if (options.role == "aggregated") {
      LOG(WARNING) << "--transport " << options.transport << ": " << created.status()
                   << "; drained requests will resume elsewhere by re-prefill, without their KV";
    } else {
      return absl::Status(
          created.status().code(),
          absl::StrCat(
              "--transport ", options.transport, ": ", created.status().message(),
              options.transport == "ucx" ? " (--transport grpc is the fallback without UCX)" : ""));
    }
  }
  TokenStreamObserver stream_observer;
  stream_observer.streams = [metrics](int64_t open) { metrics->TokenStreams(open); };
  stream_observer.message = [metrics](int64_t chunks) { metrics->TokenStreamMessage(chunks); };
  w->token_streams_ =
      std::make_unique<TokenStreams>(options.max_token_streams, std::move(stream_observer));
  ASSIGN_OR_RETURN(
      w->engine_,
      WorkerEngine::Create(
          options,
          [metrics, load, delay = options.test_step_delay](const StepInfo& s) {
            metrics->Step(s);
            load->Record(s);
            if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
          },
          w->transport_.get(), [streams = w->token_streams_.get()] { streams->FlushAll(); }));
  {
    const Backend& backend = w->engine_->backend();
    const Backend::MemoryReport memory = backend.memory();
    metrics->SetBackend(options.backend, backend.name(), memory.limit_bytes, memory.device_bytes,
                        memory.limit_bytes > 0 ? std::function<uint64_t()>([b = &backend] {
                          return b->memory().used_bytes;
                        })
                                               : std::function<uint64_t()>());
  }
  if (!options.kvstore.empty() || !options.kvstore_dns.empty()) {
    kv::ClientOptions kv_options;
    kv_options.nodes = absl::StrSplit(options.kvstore, ',', absl::SkipWhitespace());
    kv_options.replication = options.kvstore_replication;
    kv_options.deadline = options.kvstore_deadline;
    kv_options.auth_token = token;
    auto client = kv::DynamicKvClient::Create(kv_options);
    if (!client.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kvstore ", options.kvstore, ": ", client.status().message()));
    }
    kv::DynamicKvClient* nodes = client->get();
    w->kv_client_ = *std::move(client);
    if (!options.kvstore_dns.empty()) {
      DnsDiscoveryOptions d;
      d.targets = absl::StrSplit(options.kvstore_dns, ',', absl::SkipWhitespace());
      d.naming = DnsDiscoveryOptions::Naming::kStableName;
      d.stable_name_linger = options.kvstore_dns_linger;
      d.interval = options.dns_interval;
      d.retry = std::min(options.dns_interval, absl::Seconds(1));
      d.dns.servers = absl::StrSplit(options.dns_servers, ',', absl::SkipWhitespace());
      d.what = "KV store nodes";
      auto discovery = DnsDiscovery::Start(d, [nodes](std::vector<std::string> endpoints) {
        if (absl::Status s = nodes->SetNodes(std::move(endpoints)); !s.ok()) {
          LOG(WARNING) << "KV store nodes from DNS: " << s;
        }
      });
      if (!discovery.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--kvstore_dns ", options.kvstore_dns, ": ",
                                                       discovery.status().message()));
      }
      w->store_dns_ = *std::move(discovery);
    }
    const Hash128 fingerprint = w->engine_->model().fingerprint();
    if (options.kvstore_read && options.role != "decode") {
      StoreReaderOptions read;
      read.threads = options.kvstore_read_threads;
      read.streams = options.kvstore_read_streams;
      read.max_blocks = options.kvstore_read_max_blocks;
      read.sim_timing = w->engine_->sim_timing();
      read.staging = w->engine_->staging();
      if (w->transport_ != nullptr) {
        // Hits land in the pool's blocks by the store node's transport where it has one of
        // this kind (else in the Get streams). A failed node's puts end by the client's deadline
        // plus its transport's cancel grace (TransportOptions' default, 200 ms): a second more.
        auto region = w->engine_->RegionOf(*w->engine_->staging());
        if (region.ok()) {
          read.transport = w->transport_.get();
          read.pool_region = region->descriptor;
          read.unsettled_quarantine = options.kvstore_deadline + absl::Seconds(1);
        } else {
          LOG(WARNING) << "store reads come in the Get streams: " << region.status();
        }
      }
      w->store_reader_ =
          std::make_unique<StoreReader>(w->kv_client_.get(), &w->engine_->engine(),
                                        &w->engine_->pool(), fingerprint, metrics, read);
    }
    if (options.kvstore_write) {
      StoreWriterOptions write;
      write.max_queued_bytes = options.kvstore_write_queue_bytes;
      write.staging = w->engine_->staging();
      w->store_writer_ = std::make_unique<StoreWriter>(w->kv_client_.get(), &w->engine_->pool(),
                                                       fingerprint, metrics, write);
    }
  }
  // The admin server first (not ready), so that the gRPC port is printed only when both exist.
  AdminServerOptions admin_options;
  admin_options.host = options.admin_host;
  admin_options.port = options.admin_port;
  ASSIGN_OR_RETURN(w->admin_, AdminServer::Start(admin_options, w->registry_));

  WorkerServiceOptions service_options;
  service_options.auth_token = token;
  service_options.default_drain_grace = options.drain_grace;
  service_options.watch.interval = options.watch_interval;
  service_options.watch.heartbeat = options.watch_heartbeat;
  service_options.watch.max_hashes_per_message = options.watch_max_hashes_per_message;
  Worker* self = w.get();
  service_options.on_draining = [self] {
    self->admin_->SetReady(false, "draining");
    self->grpc_->SetServing(false);
  };
  service_options.on_drained = options.on_drained;
  service_options.handoff_wait = options.handoff_wait;
  service_options.role = options.role;
  service_options.transport = w->transport_.get();
  service_options.reservation_timeout = options.reservation_timeout;
  service_options.reservation_quarantine = options.reservation_quarantine;
  service_options.stream_kv = options.stream_kv;
  service_options.push_hold_file = options.push_hold_file;
  service_options.image_hold_file = options.image_hold_file;
  service_options.max_image_fetch_time = options.image_fetch_timeout;
  service_options.max_queued_image_requests =
      static_cast<size_t>(options.max_queued_image_requests);
  service_options.constraints.max_bytes = static_cast<size_t>(options.grammar_cache_bytes);
  grammar::GbnfLimits& gbnf = service_options.constraints.constraint.gbnf;
  gbnf.max_text_bytes = static_cast<size_t>(options.grammar_max_bytes);
  gbnf.max_rules = static_cast<size_t>(options.grammar_max_rules);
  gbnf.max_elements = static_cast<size_t>(options.grammar_max_elements);
  gbnf.max_repetition = static_cast<size_t>(options.grammar_max_repetition);
  gbnf.max_nesting_depth = static_cast<size_t>(options.grammar_max_nesting);
  service_options.token_streams = w->token_streams_.get();
  service_options.store_reader = w->store_reader_.get();
  service_options.store_writer = w->store_writer_.get();
  if (const auto& timing = w->engine_->sim_timing();
      timing != nullptr && options.role == "prefill") {
    w->sim_link_ = std::make_unique<SimLink>(timing->calibration().link_bandwidth_bytes_per_s,
                                             timing->calibration().link_latency_s);
    service_options.sim_link = w->sim_link_.get();
  }
  w->service_ = std::make_unique<WorkerService>(w->engine_.get(), metrics, load, service_options);
  GrpcServerOptions grpc_options;
  grpc_options.address = options.address;
  ASSIGN_OR_RETURN(w->grpc_, GrpcServer::Start(grpc_options, {w->service_.get()}));
  // What routers and peers dial: the bound port with the advertised host.
  const std::string endpoint = AdvertisedAddress(w->grpc_->address(), options.advertise_address);
  w->service_->StartWatch(options.worker_id, endpoint);
  w->admin_->SetReady(true);
  LOG(INFO)
      << options.role << " worker " << (options.worker_id.empty() ? endpoint : options.worker_id)
      << " serving " << w->engine_->model_name() << " (" << w->engine_->engine_kind()
      << " engine) on " << w->grpc_->address()
      << (endpoint != w->grpc_->address() ? absl::StrCat(" (advertised as ", endpoint, ")") : "")
      << ", admin on " << options.admin_host << ":" << w->admin_->port()
      << (w->transport_ != nullptr
              ? absl::StrCat(", KV transport ", w->transport_->kind(),
                             w->transport_->kind() == "grpc"
                                 ? absl::StrCat(" on ", w->transport_->address())
                                 : "")
              : "")
      << (w->kv_client_ != nullptr
              ? absl::StrCat(", KV store ", options.kvstore, " (",
                             w->store_reader_ != nullptr
                                 ? (w->store_reader_->by_transport()
                                        ? absl::StrCat("read by the KV transport where the node "
                                                       "has one, else the Get stream")
                                        : std::string("read by the Get stream"))
                                 : std::string(),
                             w->store_reader_ != nullptr && w->store_writer_ != nullptr ? ", " : "",
                             w->store_writer_ != nullptr ? "write" : "", ")")
              : "")
      << (token.empty() ? ", no shared token" : ", shared token required");
  return w;
}

Worker::~Worker() {
  Shutdown();
  store_dns_.reset();  // its callback sets kv_client_'s nodes
  // The order the transport needs: no push starts any more, the engine no longer computes into
  // the pools' memory, the transport's last callbacks (awaits and transfers failing CANCELLED)
  // give blocks back to the pools and end their calls, then the engine (live requests end with
  // kAbort through the service), then the service (which waits for the last call objects).
  // The store's reads end first (their callbacks submit to the engine or give their blocks
  // back); its writes once the engine thread, which offers them, has stopped.
  if (service_ != nullptr) service_->StopPushes();
  store_reader_.reset();
  if (engine_ != nullptr) engine_->engine().Stop();
  store_writer_.reset();
  if (transport_ != nullptr && engine_ != nullptr) {
    engine_->DetachTransport();
    transport_.reset();
  }
  sim_link_.reset();
  engine_.reset();
  service_.reset();
  kv_client_.reset();
}

void Worker::Drain(absl::Time deadline) {
  admin_->SetReady(false, "shutting down");
  grpc_->SetServing(false);
  service_->BeginDrain(deadline);  // no admissions from here on
  // Requests still running at the deadline are parked or ended by the drain (their last events
  // need a step), and parked KV waits at most handoff_wait for its push. The Watch streams stay
  // open meanwhile: routers see the worker draining, not gone.
  const bool idle = service_->WaitIdle(deadline + options_.handoff_wait + absl::Seconds(5));
  if (!idle) {
    LOG(ERROR) << "shutdown: " << service_->live_calls()
               << " request(s) did not end, or hand-offs are still running";
  }
  service_->CloseWatches();
  token_streams_->Close();
  // gRPC's Shutdown waits its whole deadline while clients keep idle connections open (routers
  // do). With no Generate or Watch call left, nothing needs the grace: a short one ends it.
  grpc_->Shutdown(idle ? absl::Milliseconds(200) : options_.rpc_grace);
}

void Worker::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // A worker whose Create failed part-way (its transport, its port) has only some parts.
  if (admin_ != nullptr && grpc_ != nullptr && service_ != nullptr) {
    Drain(absl::Now() + options_.drain_grace);  // stops the gRPC server too
  } else if (grpc_ != nullptr) {
    grpc_->Shutdown(absl::ZeroDuration());
  }
  if (admin_ != nullptr) admin_->Stop();
}

}  // namespace ferry
