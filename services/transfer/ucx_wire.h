// The UCX transport's own bytes (ucx_transport.h): the formats of its addresses and remote keys,
// and of the active messages its workers exchange. An address is kAddressMagic, the process's
// identity (EncodeIdentity), its bulk-data listener (EncodeDataEndpoint) and the ucp worker's
// address; a remote key is kKeyMagic, the region's
// secret (8 bytes) and UCX's packed key. Every message is active message kFerryAmId with an
// AmHeader whose type says what it is (see "The active-message protocol" in ucx_am_protocol.cc).
// Not to be confused with transfer_wire.h, which maps descriptors (holding these addresses and
// keys as opaque bytes) to protobuf for every transport.
//
// Internal to the ucx_transport library. Constants and functions of caller-owned bytes, no state:
// thread-safe. DecodeNotification returns false for bytes that are not a notification; ReadLe and
// DecodeIdentity read bytes whose presence the caller has checked.

#ifndef FERRY_SERVICES_TRANSFER_UCX_WIRE_H_
#define FERRY_SERVICES_TRANSFER_UCX_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

// Hidden visibility: nothing here is used outside the ucx_transport library (as when all of it
// was one file, with internal linkage).
#pragma GCC visibility push(hidden)

namespace ferry {
namespace transfer {
namespace ucx_internal {

// Prefixes of the opaque bytes this transport hands out, so that bytes from another transport
// (or garbage) are refused before UCX parses them.
constexpr absl::string_view kAddressMagic = "FERRY-UCX-ADDR2:";
constexpr absl::string_view kKeyMagic = "FERRY-UCX-RKEY1:";
// Active message id of every message between Ferry transports; AmHeader::type tells them apart.
constexpr unsigned kFerryAmId = 7;
// The longest address a kHello may carry (a UCX worker address lists every device it uses).
constexpr size_t kMaxAddressBytes = size_t{64} << 10;
// Data bytes per active message when UCX has no native RMA to the peer (see ucx_transport.h).
constexpr size_t kAmChunkBytes = size_t{48} << 10;
// Puts of at least this many bytes to such a peer go over the bulk-data connection instead
// (ucx_data_socket.h), in frames of at most kDataFrameBytes, at most kMaxInflightFrames of a
// transfer queued or being written at once (16 MiB: what a cancelled transfer still sends).
constexpr size_t kDataSocketMinBytes = size_t{64} << 10;
constexpr size_t kDataFrameBytes = size_t{1} << 20;
constexpr int kMaxInflightFrames = 16;

// The messages (all little-endian; peers share the byte order, as UCX's own wire format does).
enum class AmType : uint32_t {
  kNotify = 1,      // initiator -> owner: a transfer's outcome (native RMA path); data = outcome
  kPutData = 2,     // initiator -> owner: token, a = remote address, b = region secret; data
  kPutCommit = 3,   // initiator -> owner: token, a = total bytes, code; data = address + outcome
  kPutAck = 4,      // owner -> initiator: token, code; data = message
  kGetRequest = 5,  // initiator -> owner: token, b = secret; data = address, id, ranges
  kGetData = 6,     // owner -> initiator: token, a = segment index, b = offset; data
  kGetDone = 7,     // owner -> initiator: token, code; data = message
  kHello = 8,       // initiator -> owner, a new connection's first message: token; data = address
  kHelloAck = 9,    // owner -> initiator, over the owner's reply connection: token
};

struct AmHeader {
  uint32_t type = 0;
  uint32_t code = 0;
  uint64_t token = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};

// Who a process is on its host, carried in its transport address so that a peer on the same host
// can watch for its exit (pidfd): UCX's shared-memory transports have no peer failure detection.
struct ProcessIdentity {
  std::string boot_id;  // /proc/sys/kernel/random/boot_id: the host (and boot)
  uint64_t pid_namespace = 0;
  uint32_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22: tells a reused pid apart
};
constexpr size_t kBootIdBytes = 36;
constexpr size_t kIdentityBytes = kBootIdBytes + 8 + 4 + 8;

inline void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

inline uint64_t ReadLe(absl::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

// Where a process's bulk-data listener is (ucx_data_socket.h): its port and up to
// kMaxDataAddresses IPv4 addresses (network byte order); port 0 when it has none.
struct DataEndpoint {
  uint16_t port = 0;
  std::vector<uint32_t> ipv4;
};
constexpr size_t kMaxDataAddresses = 8;
// Port (2 bytes LE), count (1 byte), kMaxDataAddresses x 4 bytes.
constexpr size_t kDataEndpointBytes = 2 + 1 + 4 * kMaxDataAddresses;
std::string EncodeDataEndpoint(const DataEndpoint& endpoint);
DataEndpoint DecodeDataEndpoint(absl::string_view in);  // kDataEndpointBytes, checked by the caller

// kIdentityBytes: the boot id, then pid namespace, pid and start time (little-endian).
std::string EncodeIdentity(const ProcessIdentity& id);
ProcessIdentity DecodeIdentity(absl::string_view in);

// The payload of a notification: code (4 bytes LE), id length (4 bytes LE), id, message.
std::string EncodeNotification(const std::string& transfer_id, const absl::Status& status);
bool DecodeNotification(absl::string_view in, std::string* transfer_id, absl::Status* status);

}  // namespace ucx_internal
}  // namespace transfer
}  // namespace ferry

#pragma GCC visibility pop

#endif  // FERRY_SERVICES_TRANSFER_UCX_WIRE_H_
