// The router's token streams (worker.proto Tokens; docs/design/token-streams.md): one stream per
// worker, which carries the output of every request the router has on that worker, one message
// per engine step, demultiplexed here to the requests' listeners (the dispatcher's calls) by tag.
// A worker making a token for each of 200 requests sends one message and wakes the router once,
// not 200 times.
//
// Opening: the dispatcher opens a worker's stream when the registry finds the worker up (Open),
// and an Attach to a worker without one opens it too (on one of the completion threads) and
// answers "not yet": that request's events come on its own Generate call, as every request's do
// until the stream's first message (`opened`) arrives. From then on Attach gives the stream's id
// and a fresh tag, which the request names in its GenerateRequest. A worker that refuses the
// stream as unknown (an older worker: UNIMPLEMENTED) is asked again only after `retry_after`; one
// whose stream broke or could not be opened otherwise, at the next Attach after `reopen_after`.
//
// Listeners: each attached listener is referenced until it detaches or the stream ends. Chunks of
// one message for one listener are delivered together (OnChunks), in the order the worker wrote
// them, on the stream's completion thread; a listener whose tag is not attached (it detached
// meanwhile) loses them. When the stream ends (the worker died or closed it, the router closed it
// because the registry found the worker down, shutdown), every listener still attached gets
// OnStreamLost once and is detached: its chunks sent since the last message are lost, and the
// dispatcher moves the request (its resume point is what its sink received).
//
// Bounds: one stream per worker; a message is at most gRPC's receive limit; listeners are the
// router's requests on the worker (the dispatcher bounds them). Thread-safe; listeners are called
// without the hub's locks.

#ifndef FERRY_ROUTER_DISPATCH_TOKEN_STREAM_HUB_H_
#define FERRY_ROUTER_DISPATCH_TOKEN_STREAM_HUB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "services/common/completion_thread.h"
#include "services/common/shared_token.h"

namespace ferry {

class TokenStreamListener {
 public:
  virtual ~TokenStreamListener() = default;
  // The listener's chunks of one message (it may take them: swap them out).
  virtual void OnChunks(ferry::v1::TaggedChunks& chunks) = 0;
  // The stream ended with the listener attached (it is detached now).
  virtual void OnStreamLost(const std::string& why) = 0;
  virtual void Ref() = 0;
  virtual void Unref() = 0;
};

struct TokenStreamRoute {
  std::string stream_id;
  uint64_t tag = 0;
};

struct TokenStreamHubOptions {
  SharedToken auth_token;  // sent to the workers
  // Where the streams read (each must outlive the hub); at least one.
  std::vector<CompletionThread*> completions;
  absl::Duration retry_after = absl::Seconds(60);  // after UNIMPLEMENTED
  absl::Duration reopen_after = absl::Seconds(1);  // after a break, or a failure to open
  bool enabled = true;  // false: Attach always answers "not yet" (every call streams on itself)
};

// Counters the hub reports (router metrics); any may be empty.
struct TokenStreamHubObserver {
  std::function<void(int64_t open)> streams;
  // A message read, with its chunks, and chunks whose listener was gone.
  std::function<void(int64_t chunks, int64_t dropped)> message;
  // A stream ended: "closed" (by the router), "broken", "refused".
  std::function<void(const char* how)> ended;
};

class TokenStreamHub {
 public:
  TokenStreamHub(TokenStreamHubOptions options, TokenStreamHubObserver observer = {});
  ~TokenStreamHub();  // closes every stream and waits for their ends (at most 30 s)

  // Attaches `listener` to worker `worker`'s open stream (taking a reference) and gives its
  // route; nullopt when the stream is not open (it starts opening it, on `stub`).
  std::optional<TokenStreamRoute> Attach(const std::string& worker,
                                         const std::shared_ptr<ferry::v1::Worker::Stub>& stub,
                                         TokenStreamListener* listener);
  // Opens `worker`'s stream unless it is open or opening, whatever an earlier stream's end said
  // (the registry found the worker up: its requests find the stream open).
  void Open(const std::string& worker, const std::shared_ptr<ferry::v1::Worker::Stub>& stub);
  // Detaches the listener of `route` on `worker` (dropping the hub's reference); nothing when it
  // is not attached (the stream ended).
  void Detach(const std::string& worker, const TokenStreamRoute& route);
  // Ends `worker`'s stream (the registry found it down): its listeners get OnStreamLost.
  void Close(const std::string& worker);

  int64_t open_streams() const;

  class Stream;

 private:
  friend class Stream;
  // A new stream to `worker`, in the map (its Start is the caller's, without mu_); null while the
  // worker is not to be asked again yet.
  Stream* NewStreamLocked(const std::string& worker,
                          const std::shared_ptr<ferry::v1::Worker::Stub>& stub)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `stream` ended: it leaves the map (when still there) and the end is counted.
  void Ended(Stream* stream, const char* how, absl::Duration wait_before_reopen);

  const TokenStreamHubOptions options_;
  const TokenStreamHubObserver observer_;
  mutable absl::Mutex mu_;
  absl::CondVar idle_;
  absl::flat_hash_map<std::string, Stream*> streams_ ABSL_GUARDED_BY(mu_);
  // Workers not to ask again before a time (a refusal or a break).
  absl::flat_hash_map<std::string, absl::Time> not_before_ ABSL_GUARDED_BY(mu_);
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;  // Stream objects not yet finished
  uint64_t next_stream_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  const uint64_t incarnation_;  // random: stream ids differ across router restarts
};

}  // namespace ferry

#endif  // FERRY_ROUTER_DISPATCH_TOKEN_STREAM_HUB_H_
