// ferry-kvstore: one node of the shared KV store (ARCHITECTURE.md §5): the store library on a
// local directory behind the KvStore gRPC service, with /metrics, /healthz and /readyz on the
// admin port and the standard graceful shutdown (SIGTERM: not ready, in-flight calls finish
// within --rpc_grace_ms, queued writes reach the disk, then exit 0; nothing acknowledged is lost).
// Prints "grpc_port=N admin_port=M" once serving.
//
//   ferry-kvstore --dir /var/lib/ferry/kv --address 0.0.0.0:7100 --advertise_address 10.0.0.5 \
//       --capacity 512GiB
//   ferry-kvstore --dir ... --transport ucx --ucx_tls tcp     # Gets into callers' memory too
//
// With --transport (ucx, or grpc: the fallback without UCX), a Get that names a transfer
// descriptor is answered by putting each value straight into the caller's memory through the
// node's own KV transport, staged in --transport_staging_bytes of registered memory
// (kv_service.h); without one, such a Get answers FAILED_PRECONDITION and clients ask for the
// bytes in the stream. The gRPC transport requires and sends the node's shared token.

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/common/units.h"
#include "kvstore/kv_store.h"
#include "kvstore/service/kv_service.h"
#include "services/common/admin_server.h"
#include "services/common/advertise_address.h"
#include "services/common/allocator_tuning.h"
#include "services/common/command_line.h"
#include "services/common/grpc_log.h"
#include "services/common/grpc_server.h"
#include "services/common/metrics.h"
#include "services/common/service_lifecycle.h"
#include "services/common/shared_token.h"
#include "services/common/termination_signal.h"
#include "services/transfer/kv_transport.h"

ABSL_FLAG(std::string, dir, "", "the store's directory (created if missing)");
ABSL_FLAG(std::string, address, "127.0.0.1:0", "gRPC listen address (port 0: any free port)");
ABSL_FLAG(std::string, admin_host, "127.0.0.1", "admin HTTP listen address");
ABSL_FLAG(int, admin_port, 0, "admin HTTP port (0: any free port)");
ABSL_FLAG(std::string, advertise_address, "",
          "the host in the addresses this node advertises (its gRPC KV transport's); required "
          "when --address or --transport_address listens on 0.0.0.0");
ABSL_FLAG(std::string, capacity, "64GiB", "capacity of the segment files");
ABSL_FLAG(std::string, segment_bytes, "256MiB", "segment file size");
ABSL_FLAG(std::string, max_object_bytes, "64MiB", "largest object accepted");
ABSL_FLAG(std::string, ttl_chat, "7d",
          "retention of chat objects after their last use (an object's own retention floor, "
          "from its request, may keep it longer)");
ABSL_FLAG(std::string, ttl_agent, "3d",
          "retention of agent objects after their last use (or their own floor, if longer)");
ABSL_FLAG(std::string, ttl_batch, "1d",
          "retention of batch objects after their last use (or their own floor, if longer)");
ABSL_FLAG(std::string, max_chunk_bytes, "4MiB", "data per Get/Put message at most");
ABSL_FLAG(int, rpc_grace_ms, 10000, "grace for in-flight calls at shutdown");
ABSL_FLAG(std::string, transport, "none",
          "KV transport for Gets into callers' memory: none, ucx, or grpc (the fallback)");
ABSL_FLAG(std::string, ucx_tls, "", "UCX transports (tcp, shm, ...; default $UCX_TLS or UCX's)");
ABSL_FLAG(std::string, transport_address, "127.0.0.1:0",
          "the gRPC transport's listen address (port 0: any free port)");
ABSL_FLAG(std::string, get_hold_file, "",
          "test seam: while this file exists, a Get into a destination waits after its first put");
ABSL_FLAG(std::string, transport_staging_bytes, "64MiB",
          "registered memory values are staged in on their way through the transport");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the shared token every call must carry (else $FERRY_AUTH_TOKEN; neither: "
          "calls are not checked); one token per line: the first is sent, all are accepted");
ABSL_FLAG(absl::Duration, secret_poll_interval, absl::Seconds(10),
          "--auth_token_file is re-read this often; a new valid content applies without a restart "
          "(0: never)");

namespace {

template <typename T>
T OrExit(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) ferry::ExitOnBadOption("ferry-kvstore", what, v.status());
  return std::move(*v);
}

void OrExit(const absl::Status& s, const char* what) {
  if (!s.ok()) ferry::ExitOnBadOption("ferry-kvstore", what, s);
}

int64_t Dropped(const ferry::kv::StoreStats& stats, ferry::kv::RecoveryDrop reason) {
  return stats.recovery_dropped[static_cast<int>(reason)];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  auto signal = TerminationSignal::Install();  // before any thread
  CHECK_OK(signal.status());
  ParseProgramCommandLine("ferry-kvstore",
                          "one node of the Ferry KV store (--dir DIR; gRPC, admin HTTP /metrics)",
                          argc, argv);
  RouteGrpcLogs();
  TuneAllocatorForLargeBuffers();
  if (absl::GetFlag(FLAGS_dir).empty()) {
    ExitOnBadOption("ferry-kvstore", "--dir", absl::InvalidArgumentError("is required"));
  }
  kv::StoreOptions store_options;
  store_options.capacity_bytes =
      static_cast<int64_t>(OrExit(ParseByteSize(absl::GetFlag(FLAGS_capacity)), "--capacity"));
  store_options.segment_bytes = static_cast<int64_t>(
      OrExit(ParseByteSize(absl::GetFlag(FLAGS_segment_bytes)), "--segment_bytes"));
  store_options.max_object_bytes = static_cast<int64_t>(
      OrExit(ParseByteSize(absl::GetFlag(FLAGS_max_object_bytes)), "--max_object_bytes"));
  store_options.ttl[static_cast<int>(kv::TrafficClass::kChat)] =
      OrExit(ParseConfigDuration(absl::GetFlag(FLAGS_ttl_chat)), "--ttl_chat");
  store_options.ttl[static_cast<int>(kv::TrafficClass::kAgent)] =
      OrExit(ParseConfigDuration(absl::GetFlag(FLAGS_ttl_agent)), "--ttl_agent");
  store_options.ttl[static_cast<int>(kv::TrafficClass::kBatch)] =
      OrExit(ParseConfigDuration(absl::GetFlag(FLAGS_ttl_batch)), "--ttl_batch");
  kv::KvServiceOptions service_options;
  service_options.capacity_bytes = store_options.capacity_bytes;
  service_options.max_chunk_bytes = static_cast<int64_t>(
      OrExit(ParseByteSize(absl::GetFlag(FLAGS_max_chunk_bytes)), "--max_chunk_bytes"));
  if (service_options.max_chunk_bytes < 4096 || service_options.max_chunk_bytes > (64 << 20)) {
    ExitOnBadOption("ferry-kvstore", "--max_chunk_bytes",
                    absl::InvalidArgumentError("must be in 4KiB..64MiB"));
  }

  const std::string transport_kind = absl::GetFlag(FLAGS_transport);
  if (transport_kind != "none" && transport_kind != "ucx" && transport_kind != "grpc") {
    ExitOnBadOption("ferry-kvstore", "--transport",
                    absl::InvalidArgumentError("must be none, ucx or grpc"));
  }
  const int64_t staging_bytes = static_cast<int64_t>(OrExit(
      ParseByteSize(absl::GetFlag(FLAGS_transport_staging_bytes)), "--transport_staging_bytes"));

  const std::string advertise = absl::GetFlag(FLAGS_advertise_address);
  if (!advertise.empty()) {
    OrExit(ValidateAdvertiseHost("--advertise_address", advertise), "--advertise_address");
  }
  OrExit(CheckAdvertisable("--address", absl::GetFlag(FLAGS_address), advertise), "--address");
  if (transport_kind == "grpc") {
    OrExit(
        CheckAdvertisable("--transport_address", absl::GetFlag(FLAGS_transport_address), advertise),
        "--transport_address");
  }
  if (absl::GetFlag(FLAGS_secret_poll_interval) < absl::ZeroDuration()) {
    ExitOnBadOption("ferry-kvstore", "--secret_poll_interval",
                    absl::InvalidArgumentError("must be >= 0"));
  }
  auto registry = NewServiceRegistry("kvstore");
  SharedTokenSource::Options token_options;
  token_options.file = absl::GetFlag(FLAGS_auth_token_file);
  token_options.poll_interval = absl::GetFlag(FLAGS_secret_poll_interval);
  token_options.registry = registry.get();
  const std::unique_ptr<SharedTokenSource> token =
      OrExit(SharedTokenSource::Start(token_options), "--auth_token_file");
  service_options.auth_token = token->token();
  if (service_options.auth_token.empty()) {
    LOG(WARNING) << "no shared token: any client that reaches the store can write into it";
  }

  auto store = OrExit(kv::KvStore::Open(absl::GetFlag(FLAGS_dir), store_options), "open");
  const kv::StoreStats opened = store->Counters();
  LOG(INFO) << "kv store " << absl::GetFlag(FLAGS_dir) << ": " << opened.objects << " objects in "
            << opened.segments << " segments, opened in " << opened.open_seconds << " s ("
            << opened.segments_from_footer << " from footers, " << opened.segments_scanned
            << " scanned, " << opened.torn_bytes_dropped
            << " torn bytes cut; records skipped: " << Dropped(opened, kv::RecoveryDrop::kTornTail)
            << " torn tail, " << Dropped(opened, kv::RecoveryDrop::kChecksum) << " checksum, "
            << Dropped(opened, kv::RecoveryDrop::kHeader) << " header), direct I/O "
            << (opened.direct_io ? "on" : "off");

  // The transport outlives the service and the server: its callbacks give staging slots back.
  std::unique_ptr<transfer::KvTransport> transport;
  if (transport_kind != "none") {
    transfer::TransportOptions transport_options;
    transport_options.kind = transport_kind;
    transport_options.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
    transport_options.listen_address = absl::GetFlag(FLAGS_transport_address);
    transport_options.advertise_host = advertise;
    transport_options.auth_token = service_options.auth_token;
    transport_options.registry = registry.get();
    transport = OrExit(transfer::KvTransport::Create(transport_options), "--transport");
    service_options.transport = transport.get();
    service_options.staging_bytes = staging_bytes;
    service_options.get_hold_file = absl::GetFlag(FLAGS_get_hold_file);
  }
  auto service =
      OrExit(kv::KvStoreService::Create(store.get(), service_options, registry), "start");
  if (transport != nullptr) {
    LOG(INFO) << "KV transport " << transport->kind()
              << (transport->kind() == "grpc"
                      ? absl::StrCat(" listening on ", transport->address())
                      : absl::StrCat(" (worker address of ", transport->address().size(), " bytes",
                                     absl::GetFlag(FLAGS_ucx_tls).empty()
                                         ? ""
                                         : ", ucx_tls " + absl::GetFlag(FLAGS_ucx_tls),
                                     ")"))
              << ", staging " << service_options.staging_bytes << " bytes";
  } else {
    LOG(INFO) << "no KV transport: Gets move bytes in the stream only";
  }
  GrpcServerOptions grpc_options;
  grpc_options.address = absl::GetFlag(FLAGS_address);
  grpc_options.max_receive_message_bytes = kv::MaxMessageBytes(service_options);
  grpc_options.max_send_message_bytes = kv::MaxMessageBytes(service_options);
  auto grpc = OrExit(GrpcServer::Start(grpc_options, {service.get()}), "gRPC server");
  AdminServerOptions admin_options;
  admin_options.host = absl::GetFlag(FLAGS_admin_host);
  admin_options.port = absl::GetFlag(FLAGS_admin_port);
  auto admin = OrExit(AdminServer::Start(admin_options, registry), "admin server");
  admin->SetReady(true);
  std::printf("grpc_port=%d admin_port=%d\n", grpc->port(), admin->port());
  std::fflush(stdout);

  ShutdownOptions shutdown;
  shutdown.rpc_grace = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_grace_ms));
  ServeUntilTerminated(**signal, *grpc, admin.get(), shutdown);
  grpc.reset();
  service.reset();
  transport.reset();  // after every call and the service: its last callbacks ran
  store.reset();      // queued writes reach the disk first
  LOG(INFO) << "kv store stopped";
  return 0;
}
