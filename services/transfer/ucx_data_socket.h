// The bulk path of the active-message protocol (ucx_am_protocol.cc) where UCX moves bytes over
// tcp: a put's data travels on a plain TCP connection of its own, and the owner reads the socket
// straight into the destination blocks (one copy), where UCX's tcp transport reads into its own
// buffer and the owner copies out of it (two). UCX 1.13 cannot do it itself: on an endpoint with
// peer error handling it selects no rendezvous lane over tcp (its tcp memory domain cannot
// invalidate registrations, which error handling requires), so rendezvous active messages travel
// as fragments copied out of its buffers; without error handling a dead peer is not detected, and
// tcp zero-copy sends in flight when a connection fails abort the sender ("comp->count > 0").
//
// A connection carries frames, each a DataFrameHeader and `length` bytes: kPutData (token, a =
// destination address, b = the region's secret; the bytes go to the destination) and kPutCommit
// (token, code, a = total bytes; the bytes are the commit's payload, as in the active-message
// commit). A transfer sends all its data and then its commit on one connection, so the owner has
// taken every data frame before it sees the commit: once a put is committed no byte of it can
// still land, whatever its outcome.
//
// DataListener (the owner's side) accepts connections on a port of its own (every interface, as
// UCX's tcp transport listens) and reads each on a thread of its own. For a data frame it asks
// `begin` to check the frame (the region's secret and bounds) and hold the region registered,
// reads the bytes into place, and tells `end` how many arrived; a refused frame is read and dropped
// (`refused` is told, and the put's commit is answered with the refusal), a malformed one (bad
// magic or type, data over kDataFrameBytes, a commit over kMaxCommitFrameBytes) closes the
// connection (the initiator's transfers on it fail). `begin`, `end` and `commit` run on the
// connection's thread. DataSender (the initiator's side) is one connection to a peer's listener,
// made by a thread of its own on the first frame, which writes the queued frames from the caller's
// memory in order; each frame's `done` runs on that thread once its bytes are in the kernel (or
// it failed), and the sender no longer reads the memory after it. Abort fails what is queued and
// unblocks a write in progress. Both are thread-safe; their destructors join their threads.
// Errors are absl::Status; nothing here ends the process.

#ifndef FERRY_SERVICES_TRANSFER_UCX_DATA_SOCKET_H_
#define FERRY_SERVICES_TRANSFER_UCX_DATA_SOCKET_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/transfer/ucx_wire.h"

#pragma GCC visibility push(hidden)

namespace ferry {
namespace transfer {
namespace ucx_internal {

constexpr uint32_t kDataFrameMagic = 0x46445431;  // "FDT1"
// A commit frame's payload is at most this long (an address and a notification).
constexpr uint64_t kMaxCommitFrameBytes = 64 << 10;

struct DataFrameHeader {
  uint32_t magic = kDataFrameMagic;
  uint32_t reserved = 0;
  AmHeader am;
  uint64_t length = 0;
};

class DataListener {
 public:
  struct Sink {
    // Checks a data frame and holds its region; the returned value is handed to `end`.
    std::function<absl::StatusOr<uint64_t>(const DataFrameHeader&)> begin;
    // `received` bytes of the frame are in place (all of them when `status` is OK).
    std::function<void(const DataFrameHeader&, uint64_t hold, uint64_t received,
                       absl::Status status)>
        end;
    std::function<void(const DataFrameHeader&, std::string payload)> commit;
    // A frame refused before any byte of it went into place (`begin` refused it, or it was
    // malformed).
    std::function<void(const DataFrameHeader&, absl::Status status)> refused;
  };

  // Listens on every interface, on an ephemeral port.
  static absl::StatusOr<std::unique_ptr<DataListener>> Start(Sink sink);
  ~DataListener();

  // This host's port and IPv4 addresses (loopback last).
  const DataEndpoint& endpoint() const { return endpoint_; }

 private:
  struct Connection {
    int fd = -1;
    std::thread thread;
    bool done = false;
  };
  static constexpr int kMaxConnections = 256;

  explicit DataListener(Sink sink) : sink_(std::move(sink)) {}
  void AcceptLoop();
  void Serve(Connection* connection);
  void ReapFinished() ABSL_LOCKS_EXCLUDED(mu_);

  const Sink sink_;
  int listen_fd_ = -1;
  DataEndpoint endpoint_;
  std::thread accept_thread_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
};

class DataSender {
 public:
  using Done = std::function<void(absl::Status)>;

  // Connects (on its thread) to the first of `endpoint`'s addresses that answers; `loopback`:
  // the peer is on this host, 127.0.0.1 first.
  DataSender(DataEndpoint endpoint, bool loopback);
  ~DataSender();

  // Queues a frame: `header`, then its length bytes from `data` (alive until `done`), or `payload`
  // when `data` is null.
  void Send(const DataFrameHeader& header, const void* data, std::string payload, Done done);
  // Fails what is queued and whatever is sent from now on with `status`.
  void Abort(absl::Status status);

 private:
  struct Frame {
    DataFrameHeader header;
    const void* data = nullptr;
    std::string payload;
    Done done;
  };

  void Loop();
  absl::Status ConnectNow();
  absl::Status Write(const Frame& frame);

  const DataEndpoint endpoint_;
  const bool loopback_;
  absl::Mutex mu_;
  std::deque<Frame> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  std::thread thread_;
};

}  // namespace ucx_internal
}  // namespace transfer
}  // namespace ferry

#pragma GCC visibility pop

#endif  // FERRY_SERVICES_TRANSFER_UCX_DATA_SOCKET_H_
