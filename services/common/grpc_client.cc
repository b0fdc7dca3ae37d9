#include "services/common/grpc_client.h"

#include <algorithm>
#include <chrono>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace ferry {

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          const ChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  const int reconnect = static_cast<int>(absl::ToInt64Milliseconds(options.max_reconnect_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, reconnect);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(reconnect, 200));
  // gRPC's minimum connect timeout (see ChannelOptions::connect_timeout), not a backoff.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.connect_timeout)));
  // Each channel gets its own TCP connection: a router's channels to different workers, and
  // test clients, never share a subchannel by accident.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

std::unique_ptr<grpc::ClientContext> NewClientContext(absl::Duration timeout,
                                                      absl::string_view trace_id) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(std::max(timeout, absl::ZeroDuration())));
  if (!trace_id.empty()) context->AddMetadata(kTraceIdMetadataKey, std::string(trace_id));
  return context;
}

std::string TraceIdOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kTraceIdMetadataKey);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace ferry
