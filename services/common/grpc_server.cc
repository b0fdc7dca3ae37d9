#include "services/common/grpc_server.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace ferry {
namespace {

// "127.0.0.1:0" -> "127.0.0.1", "[::1]:0" -> "[::1]".
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services) {
  if (options.max_receive_message_bytes <= 0 || options.max_send_message_bytes <= 0) {
    return absl::InvalidArgumentError("gRPC message size limits must be positive");
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  // Refuse to share the port with another process (SO_REUSEPORT would let two servers bind).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", options.address, " (address in use or invalid?)"));
  }
  std::string address = absl::StrCat(HostOf(options.address), ":", port);
  LOG(INFO) << "gRPC server listening on " << address;
  auto result = std::unique_ptr<GrpcServer>(new GrpcServer(std::move(server), port, address));
  result->SetServing(true);
  return result;
}

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server, int port, std::string address)
    : server_(std::move(server)), port_(port), address_(std::move(address)) {}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(serving);
}

void GrpcServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
    if (health != nullptr) health->SetServingStatus(false);
  }
  const auto deadline = std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(std::max(grace, absl::ZeroDuration()));
  server_->Shutdown(deadline);
  server_->Wait();
  LOG(INFO) << "gRPC server on " << address_ << " stopped";
}

}  // namespace ferry
