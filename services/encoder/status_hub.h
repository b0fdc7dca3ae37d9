// The encoder's Watch streams (encoder.proto EncoderStatus): any number of subscribers, each sent
// the status at once, then whenever it differs from what that stream last got (checked every
// `interval`, or at once by Tick), and at least every `heartbeat`. The hub knows no router: a
// subscriber is a stream.
//
// Bounded per subscriber: one message in flight at most; a stream still writing when the status
// changes gets the newer status once its write is done (at the next tick), never a backlog.
// Shutdown sends nothing more, ends every stream UNAVAILABLE (cancelling one whose client does
// not read after 1 s) and refuses new ones.
//
// Threads: one ticker thread; writes complete on gRPC's callback threads. Thread-safe.

#ifndef FERRY_SERVICES_ENCODER_STATUS_HUB_H_
#define FERRY_SERVICES_ENCODER_STATUS_HUB_H_

#include <functional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/encoder.grpc.pb.h"

namespace ferry {

struct StatusHubOptions {
  absl::Duration interval = absl::Milliseconds(100);
  absl::Duration heartbeat = absl::Seconds(1);
};

class StatusCall;

class StatusHub {
 public:
  // `status` is asked for the status on every tick (on the ticker thread, no lock held).
  StatusHub(std::function<ferry::v1::EncoderStatus()> status, StatusHubOptions options);
  ~StatusHub();  // Shutdown()

  grpc::ServerWriteReactor<ferry::v1::EncoderStatus>* Subscribe(
      grpc::CallbackServerContext* context);

  // Offers the status now to every stream (after a change the streams should see at once).
  void Tick();

  // See the header comment. Returns when every stream is done and the ticker has stopped.
  void Shutdown();

  int64_t subscribers() const;

 private:
  friend class StatusCall;
  void Remove(StatusCall* call);
  void Run();
  void Offer();

  const std::function<ferry::v1::EncoderStatus()> status_;
  const StatusHubOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool tick_ ABSL_GUARDED_BY(mu_) = false;
  std::set<StatusCall*> calls_ ABSL_GUARDED_BY(mu_);
  std::thread ticker_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_ENCODER_STATUS_HUB_H_
