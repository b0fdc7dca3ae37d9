// ferry-encoder: the vision encoder service (docs/serving/encoder.md). It loads the vision tower
// and projector of a LLaVA-style --model directory (not its text model), and serves the Encoder
// gRPC service (encoder_service.h: Encode, FetchEmbeddings, Release, GetStatus, Watch) with
// /metrics, /healthz and /readyz on the admin port. Prints "grpc_port=N admin_port=M" once serving.
//
//   ferry-encoder --model /models/llava --address 0.0.0.0:7600 --advertise_address 10.0.0.7 \
//       --cache_bytes 4GiB --embeddings_ttl 5m
//
// SIGTERM drains: not ready, Encode answers UNAVAILABLE, queued and running encodes finish and
// answer (within --drain_grace), fetches in flight finish within --rpc_grace_ms, exit 0.

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/common/units.h"
#include "engine/model/vision/vision_tower.h"
#include "services/common/admin_server.h"
#include "services/common/advertise_address.h"
#include "services/common/command_line.h"
#include "services/common/grpc_log.h"
#include "services/common/grpc_server.h"
#include "services/common/metrics.h"
#include "services/common/service_lifecycle.h"
#include "services/common/shared_token.h"
#include "services/common/termination_signal.h"
#include "services/encoder/encoder_service.h"
#include "services/vision/image_encoder.h"

ABSL_FLAG(std::string, model, "",
          "a LLaVA-style HF directory (config.json, preprocessor_config.json, safetensors): only "
          "its vision tower and projector are loaded");
ABSL_FLAG(std::string, model_name, "", "name reported in GetStatus (default: the directory's)");
ABSL_FLAG(std::string, weights, "bf16",
          "the workers' --weights: f32 computes the tower in fp32, bf16 and native with bf16 "
          "products (as the worker's LoadLlavaModel); the rows must match the workers' own");
ABSL_FLAG(std::string, address, "127.0.0.1:0", "gRPC listen address (port 0: any free port)");
ABSL_FLAG(std::string, advertise_address, "",
          "the host this encoder is reached at (GetStatus endpoint); required when --address "
          "listens on 0.0.0.0");
ABSL_FLAG(std::string, admin_host, "127.0.0.1", "admin HTTP listen address");
ABSL_FLAG(int, admin_port, 0, "admin HTTP port (0: any free port)");
ABSL_FLAG(std::string, cache_bytes, "1GiB", "the embedding cache's cap");
ABSL_FLAG(std::string, embeddings_ttl, "5m",
          "a handle's life from Encode (Release frees it earlier); it pins its embeddings");
ABSL_FLAG(int64_t, max_handles, 65536, "live handles at most (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, encode_threads, 1,
          "images encoded at once (each spreads its tower over every core)");
ABSL_FLAG(int64_t, max_queued, 64,
          "images waiting for an encoding thread at most (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(std::string, max_image_bytes, "20MiB", "an image's encoded bytes at most");
ABSL_FLAG(std::string, max_chunk_bytes, "1MiB", "embedding bytes per FetchEmbeddings message");
ABSL_FLAG(std::string, drain_grace, "30s", "SIGTERM: how long queued and running encodes get");
ABSL_FLAG(int, rpc_grace_ms, 10000, "grace for in-flight calls at shutdown");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the shared token every call must carry (else $FERRY_AUTH_TOKEN; neither: "
          "calls are not checked); one token per line: the first is sent, all are accepted");
ABSL_FLAG(absl::Duration, secret_poll_interval, absl::Seconds(10),
          "--auth_token_file is re-read this often (0: never)");
ABSL_FLAG(std::string, encode_hold_file, "",
          "test seam: while this file exists, each encode waits before it starts (at most 60 s)");
ABSL_FLAG(std::string, fetch_hold_file, "",
          "test seam: while this file exists, each FetchEmbeddings stream waits after its first "
          "chunk (at most 60 s)");

namespace {

constexpr char kName[] = "ferry-encoder";

template <typename T>
T OrExit(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) ferry::ExitOnBadOption(kName, what, v.status());
  return std::move(*v);
}

void OrExit(const absl::Status& s, const char* what) {
  if (!s.ok()) ferry::ExitOnBadOption(kName, what, s);
}

int64_t Bytes(const absl::StatusOr<uint64_t>& v, const char* flag) {
  return static_cast<int64_t>(OrExit(v, flag));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  auto signal = TerminationSignal::Install();  // before any thread
  CHECK_OK(signal.status());
  ParseProgramCommandLine(kName,
                          "the Ferry vision encoder (--model LLAVA_DIR; gRPC Encoder, admin HTTP "
                          "/metrics /healthz /readyz)",
                          argc, argv);
  RouteGrpcLogs();
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) {
    ExitOnBadOption(kName, "--model", absl::InvalidArgumentError("is required"));
  }
  const std::string weights = absl::GetFlag(FLAGS_weights);
  if (weights != "f32" && weights != "bf16" && weights != "native") {
    ExitOnBadOption(kName, "--weights", absl::InvalidArgumentError("must be f32, bf16 or native"));
  }
  EncoderServiceOptions options;
  options.cache.capacity_bytes =
      Bytes(ParseByteSize(absl::GetFlag(FLAGS_cache_bytes)), "--cache_bytes");
  options.cache.ttl =
      OrExit(ParseConfigDuration(absl::GetFlag(FLAGS_embeddings_ttl)), "--embeddings_ttl");
  if (options.cache.ttl <= absl::ZeroDuration()) {
    ExitOnBadOption(kName, "--embeddings_ttl", absl::InvalidArgumentError("must be positive"));
  }
  options.cache.max_handles = absl::GetFlag(FLAGS_max_handles);
  options.threads = absl::GetFlag(FLAGS_encode_threads);
  options.max_queued = absl::GetFlag(FLAGS_max_queued);
  if (options.cache.max_handles < 1 || options.threads < 1 || options.threads > 256 ||
      options.max_queued < 0) {
    ExitOnBadOption(kName, "--max_handles/--encode_threads/--max_queued",
                    absl::InvalidArgumentError(
                        "need max_handles >= 1, 1 <= encode_threads <= 256, max_queued >= 0"));
  }
  options.max_image_bytes =
      Bytes(ParseByteSize(absl::GetFlag(FLAGS_max_image_bytes)), "--max_image_bytes");
  options.max_chunk_bytes =
      Bytes(ParseByteSize(absl::GetFlag(FLAGS_max_chunk_bytes)), "--max_chunk_bytes");
  if (options.max_chunk_bytes < 1024 || options.max_chunk_bytes > (16 << 20)) {
    ExitOnBadOption(kName, "--max_chunk_bytes", absl::InvalidArgumentError("must be 1KiB..16MiB"));
  }
  if (options.max_image_bytes < 1 || options.max_image_bytes > (256 << 20)) {
    ExitOnBadOption(kName, "--max_image_bytes", absl::InvalidArgumentError("must be 1..256MiB"));
  }
  options.limits.max_input_bytes = options.max_image_bytes;
  const absl::Duration drain_grace =
      OrExit(ParseConfigDuration(absl::GetFlag(FLAGS_drain_grace)), "--drain_grace");
  options.hold_file = absl::GetFlag(FLAGS_encode_hold_file);
  options.fetch_hold_file = absl::GetFlag(FLAGS_fetch_hold_file);
  options.model = absl::GetFlag(FLAGS_model_name);
  if (options.model.empty()) {
    std::string dir = model;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    options.model = dir.substr(dir.rfind('/') + 1);
  }

  const std::string advertise = absl::GetFlag(FLAGS_advertise_address);
  if (!advertise.empty()) {
    OrExit(ValidateAdvertiseHost("--advertise_address", advertise), "--advertise_address");
  }
  OrExit(CheckAdvertisable("--address", absl::GetFlag(FLAGS_address), advertise), "--address");
  if (absl::GetFlag(FLAGS_secret_poll_interval) < absl::ZeroDuration()) {
    ExitOnBadOption(kName, "--secret_poll_interval", absl::InvalidArgumentError("must be >= 0"));
  }
  auto registry = NewServiceRegistry("encoder");
  SharedTokenSource::Options token_options;
  token_options.file = absl::GetFlag(FLAGS_auth_token_file);
  token_options.poll_interval = absl::GetFlag(FLAGS_secret_poll_interval);
  token_options.registry = registry.get();
  const std::unique_ptr<SharedTokenSource> token =
      OrExit(SharedTokenSource::Start(token_options), "--auth_token_file");
  options.auth_token = token->token();
  if (options.auth_token.empty()) {
    LOG(WARNING) << "no shared token: any client that reaches the encoder can use it";
  }

  // The tower computes as the workers' LoadLlavaModel makes it: fp32 for f32 weights, bf16
  // products otherwise. The text model's weights are not read.
  const VisionPrecision precision =
      weights == "f32" ? VisionPrecision::kF32 : VisionPrecision::kBf16;
  VisionTower tower = OrExit(VisionTower::Load(model, precision), "--model");
  const Hash128 digest = tower.digest();
  const int64_t tokens = tower.num_image_tokens();
  const int64_t hidden = tower.text_hidden_size();
  std::unique_ptr<ImageEncoder> encoder =
      OrExit(ImageEncoder::Create(model, std::move(tower), options.limits), "--model");
  LOG(INFO) << "vision tower of " << model << " (" << weights << "): " << tokens << " rows of "
            << hidden << " floats per image, digest " << digest.ToHex() << "; cache "
            << options.cache.capacity_bytes << " bytes, handles live "
            << absl::FormatDuration(options.cache.ttl);

  GrpcServerOptions grpc_options;
  grpc_options.address = absl::GetFlag(FLAGS_address);
  grpc_options.max_receive_message_bytes = static_cast<int>(options.max_image_bytes + (64 << 10));
  grpc_options.max_send_message_bytes = static_cast<int>(options.max_chunk_bytes + (64 << 10));
  auto service = std::make_unique<EncoderService>(encoder.get(), digest, options, registry);
  auto grpc = OrExit(GrpcServer::Start(grpc_options, {service.get()}), "gRPC server");
  service->SetEndpoint(AdvertisedAddress(grpc->address(), advertise));
  AdminServerOptions admin_options;
  admin_options.host = absl::GetFlag(FLAGS_admin_host);
  admin_options.port = absl::GetFlag(FLAGS_admin_port);
  auto admin = OrExit(AdminServer::Start(admin_options, registry), "admin server");
  admin->SetReady(true);
  std::printf("grpc_port=%d admin_port=%d\n", grpc->port(), admin->port());
  std::fflush(stdout);

  ShutdownOptions shutdown;
  shutdown.rpc_grace = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_grace_ms));
  shutdown.drain_grace = drain_grace;
  shutdown.drain = [&service](absl::Time deadline) {
    service->StartDrain();
    if (!service->WaitIdle(deadline)) {
      LOG(WARNING) << "drain: encodes still running at the deadline";
    }
    service->StopWatches();
  };
  ServeUntilTerminated(**signal, *grpc, admin.get(), shutdown);
  grpc.reset();
  service.reset();
  LOG(INFO) << "encoder stopped";
  return 0;
}
