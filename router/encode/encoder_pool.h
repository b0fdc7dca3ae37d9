// The router's encoders (--encoders host:port,...; docs/serving/encoder.md "The router's side"):
// one Watch stream per encoder keeps its up/down state and load (encoder.proto EncoderStatus), and
// Encode sends an image to the encoder EncoderOrder picks (encoder_choice.h), failing over to the
// next one.
//
//   - Up/down: an encoder is up from the first status of its Watch stream until the stream ends,
//     its status goes stale (no message for `stale_after`: the encoder's heartbeat is 1 s), it
//     says it is draining, or it serves another image size (num_image_tokens differs from the
//     model's tokens per image). A down encoder's stream is opened again after `watch_backoff`.
//   - Encode: every call carries the shared token, the request's trace id and a deadline (the
//     earlier of the request's and now + encode_timeout). UNAVAILABLE, DEADLINE_EXCEEDED,
//     RESOURCE_EXHAUSTED (queue or cache full), CANCELLED and UNKNOWN move to the next encoder in
//     the order; any other error (the encoder refused the image itself: INVALID_ARGUMENT ...)
//     stops the failover. Encode's error is the last one: the caller then sends the image's bytes
//     inline, and the worker encodes it in process (or answers the client's 4xx for a bad image).
//   - Handles are never released by the router: they expire on the encoder's TTL (a P/D request's
//     prefill and decode workers both fetch, a retry may fetch again; nothing tells the router
//     when the last fetch happened).
//
//   - The set: the endpoints given, replaced by SetEndpoints (the router's --encoders_dns); an
//     encoder that leaves the set ends its stream and counts as down (on_state).
//
// Bounded: one thread per encoder (its Watch stream, blocking reads), one monitor thread; the
// last status of each encoder only; at most kMaxEncoders. Encode blocks its caller (the router
// runs it on its encode executor, never on an HTTP I/O thread). Thread-safe.

#ifndef FERRY_ROUTER_ENCODE_ENCODER_POOL_H_
#define FERRY_ROUTER_ENCODE_ENCODER_POOL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/hash128.h"
#include "grpcpp/client_context.h"
#include "services/common/shared_token.h"

namespace ferry {

struct EncoderPoolOptions {
  std::vector<std::string> endpoints;  // host:port, at most kMaxEncoders (SetEndpoints: more)
  SharedToken auth_token;
  absl::Duration encode_timeout = absl::Seconds(30);  // one Encode call, at most
  absl::Duration watch_backoff = absl::Milliseconds(500);
  absl::Duration stale_after = absl::Seconds(5);
  int64_t backlog_slack = 8;           // encoder_choice.h's load rule
  uint32_t expected_image_tokens = 0;  // the model's tokens per image (0: not checked)
  // An encoder went up or down (on its Watch thread).
  std::function<void(const std::string& endpoint, bool up)> on_state;
};

struct EncodedImage {
  std::string handle;
  std::string endpoint;  // the encoder that holds it
  uint32_t num_tokens = 0;
  bool cached = false;  // the encoder had it
  int tried = 0;        // encoders tried (1: the first choice answered)
};

class EncoderPool {
 public:
  static constexpr size_t kMaxEncoders = 256;

  // Starts the Watch streams. InvalidArgument: too many endpoints, or a malformed one (none is
  // fine: SetEndpoints brings them).
  static absl::StatusOr<std::unique_ptr<EncoderPool>> Start(EncoderPoolOptions options);

  // The encoders are now `endpoints`: new ones get a stream, those absent leave (their streams
  // end; Encode calls in flight to them finish). Errors as Start's; the set is then unchanged.
  absl::Status SetEndpoints(std::vector<std::string> endpoints);
  ~EncoderPool();  // Shutdown, then joins the threads (Encode calls must have returned)

  // Ends the Watch streams and cancels the Encode calls in flight (they return Unavailable, as
  // every later one does): the router's shutdown does not wait for an encoder.
  void Shutdown();
  EncoderPool(const EncoderPool&) = delete;
  EncoderPool& operator=(const EncoderPool&) = delete;

  // Encodes the image `bytes` (XXH3-128 `content_hash`) on the encoders in EncoderOrder; see the
  // header comment. Blocks up to `deadline`. Unavailable when no encoder is up.
  absl::StatusOr<EncodedImage> Encode(const std::string& bytes, const Hash128& content_hash,
                                      absl::Time deadline, const std::string& trace_id);

  // Encoders up now, of all.
  int64_t up() const;
  size_t size() const;

 private:
  struct Encoder;
  explicit EncoderPool(EncoderPoolOptions options);
  void WatchLoop(Encoder* encoder);
  void MonitorLoop();
  void SetUp(Encoder* encoder, bool up, const std::string& why);

  const EncoderPoolOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar stop_cv_;
  // By endpoint; an Encode call holds its encoders (shared) while it runs.
  std::map<std::string, std::shared_ptr<Encoder>> encoders_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);  // Encode calls in flight
  std::thread monitor_;
  absl::Mutex set_mu_;  // one SetEndpoints at a time (it joins the threads of those that left)
};

}  // namespace ferry

#endif  // FERRY_ROUTER_ENCODE_ENCODER_POOL_H_
