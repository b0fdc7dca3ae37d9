#include "tools/worker_cli/worker_client.h"

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "services/common/grpc_client.h"
#include "services/common/shared_token.h"

namespace ferry {

WorkerClient::WorkerClient(const std::string& address, std::string token,
                           const std::vector<std::pair<std::string, int>>& channel_args)
    : token_(std::move(token)) {
  if (channel_args.empty()) {
    channel_ = NewChannel(address);
  } else {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    for (const auto& [name, value] : channel_args) args.SetInt(name, value);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  stub_ = v1::Worker::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> WorkerClient::Context(absl::Duration timeout) const {
  auto context = NewClientContext(timeout);
  AttachSharedToken(context.get(), SharedToken(token_));
  return context;
}

GenerateResult WorkerClient::Generate(const v1::GenerateRequest& request, absl::Duration timeout,
                                      const std::function<bool(const v1::GenerateEvent&)>& on_event,
                                      const std::vector<uint32_t>& first_index) {
  GenerateResult result;
  const uint32_t n = request.request().sampling().n() == 0 ? 1 : request.request().sampling().n();
  result.choices.resize(n);
  std::vector<uint32_t> next(n, 0);
  for (size_t c = 0; c < first_index.size() && c < n; ++c) next[c] = first_index[c];
  auto context = Context(timeout);
  auto reader = stub_->Generate(context.get(), request);
  v1::GenerateEvent event;
  bool cancelled = false;
  while (reader->Read(&event)) {
    ++result.events;
    if (event.has_tokens()) {
      const v1::TokenChunk& chunk = event.tokens();
      if (chunk.choice_index() < n) {
        ChoiceOutput& out = result.choices[chunk.choice_index()];
        if (chunk.first_output_index() != next[chunk.choice_index()]) out.indexes_ok = false;
        next[chunk.choice_index()] += static_cast<uint32_t>(chunk.token_ids_size());
        out.tokens.insert(out.tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
        out.logprobs.insert(out.logprobs.end(), chunk.logprobs().begin(), chunk.logprobs().end());
        out.text += chunk.text();
        if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
          out.finish = chunk.finish_reason();
          out.has_stop_token = chunk.has_matched_stop_token_id();
          out.stop_token = chunk.matched_stop_token_id();
          out.stop_string = chunk.matched_stop_string();
        }
      }
    } else if (event.has_usage()) {
      result.has_usage = true;
      result.usage = event.usage();
    } else if (event.has_error()) {
      result.has_error = true;
      result.error = event.error();
    }
    if (on_event && !cancelled && !on_event(event)) {
      cancelled = true;
      context->TryCancel();
    }
  }
  result.status = reader->Finish();
  return result;
}

grpc::Status WorkerClient::Abort(const std::string& request_id, bool* found) {
  v1::AbortRequest request;
  request.set_request_id(request_id);
  v1::AbortResponse response;
  auto context = Context(absl::Seconds(10));
  grpc::Status status = stub_->Abort(context.get(), request, &response);
  if (found != nullptr) *found = response.found();
  return status;
}

grpc::Status WorkerClient::Drain(uint32_t grace_seconds, v1::DrainResponse* response) {
  v1::DrainRequest request;
  request.set_grace_seconds(grace_seconds);
  auto context = Context(absl::Seconds(10));
  return stub_->Drain(context.get(), request, response);
}

grpc::Status WorkerClient::Prefill(const v1::PrefillRequest& request, v1::PrefillResponse* response,
                                   absl::Duration timeout) {
  v1::PrefillResponse ignored;
  auto context = Context(timeout);
  return stub_->Prefill(context.get(), request, response != nullptr ? response : &ignored);
}

grpc::Status WorkerClient::KvReady(const v1::KvReadyRequest& request) {
  v1::KvReadyResponse response;
  auto context = Context(absl::Seconds(10));
  return stub_->KvReady(context.get(), request, &response);
}

std::unique_ptr<WorkerClient::WatchStream> WorkerClient::Watch(const v1::WatchRequest& request,
                                                               absl::Duration timeout) {
  auto stream = std::make_unique<WatchStream>();
  stream->context_ = Context(timeout);
  stream->reader_ = stub_->Watch(stream->context_.get(), request);
  return stream;
}

bool WorkerClient::WatchStream::Next(v1::WorkerStatus* status) { return reader_->Read(status); }

grpc::Status WorkerClient::WatchStream::Finish() { return reader_->Finish(); }

}  // namespace ferry
