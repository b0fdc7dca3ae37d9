// A small synchronous client of ferry.v1.Worker, for people and tests: one Generate call
// collected per choice (tokens, text, logprobs, finish), Abort, Drain, and a Watch stream read
// message by message. Every call has a deadline and carries the shared token when given.
// (The router talks to workers with its own asynchronous client.)
//
// Thread-compatible; a WatchStream belongs to one reader thread, Cancel() may come from another.

#ifndef FERRY_TOOLS_WORKER_CLI_WORKER_CLIENT_H_
#define FERRY_TOOLS_WORKER_CLI_WORKER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace ferry {

struct ChoiceOutput {
  std::vector<uint32_t> tokens;
  std::vector<ferry::v1::TokenLogprobs> logprobs;
  std::string text;
  ferry::v1::FinishReason finish = ferry::v1::FINISH_REASON_UNSPECIFIED;
  bool has_stop_token = false;
  uint32_t stop_token = 0;
  std::string stop_string;
  bool indexes_ok = true;  // every chunk started where the previous one ended
};

struct GenerateResult {
  grpc::Status status;
  std::vector<ChoiceOutput> choices;
  bool has_usage = false;
  ferry::v1::Usage usage;
  bool has_error = false;
  ferry::v1::ErrorInfo error;
  int64_t events = 0;
};

class WorkerClient {
 public:
  // `channel_args`: extra gRPC channel arguments (tests shrink flow-control windows).
  explicit WorkerClient(const std::string& address, std::string token = "",
                        const std::vector<std::pair<std::string, int>>& channel_args = {});

  // Runs a Generate call to its end. `on_event` sees every event as it arrives; returning false
  // cancels the call (the result then ends CANCELLED). `first_index` per choice: where its
  // output starts (a resumed request's generated count).
  GenerateResult Generate(const ferry::v1::GenerateRequest& request, absl::Duration timeout,
                          const std::function<bool(const ferry::v1::GenerateEvent&)>& on_event = {},
                          const std::vector<uint32_t>& first_index = {});

  grpc::Status Abort(const std::string& request_id, bool* found);
  grpc::Status Drain(uint32_t grace_seconds, ferry::v1::DrainResponse* response);
  grpc::Status Prefill(const ferry::v1::PrefillRequest& request,
                       ferry::v1::PrefillResponse* response = nullptr,
                       absl::Duration timeout = absl::Seconds(60));
  grpc::Status KvReady(const ferry::v1::KvReadyRequest& request);

  class WatchStream {
   public:
    // False at the end of the stream (Status() then says why).
    bool Next(ferry::v1::WorkerStatus* status);
    grpc::Status Finish();
    void Cancel() { context_->TryCancel(); }

   private:
    friend class WorkerClient;
    std::unique_ptr<grpc::ClientContext> context_;
    std::unique_ptr<grpc::ClientReader<ferry::v1::WorkerStatus>> reader_;
  };
  std::unique_ptr<WatchStream> Watch(const ferry::v1::WatchRequest& request,
                                     absl::Duration timeout);

  ferry::v1::Worker::Stub& stub() { return *stub_; }

 private:
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;

  const std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ferry::v1::Worker::Stub> stub_;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_WORKER_CLI_WORKER_CLIENT_H_
