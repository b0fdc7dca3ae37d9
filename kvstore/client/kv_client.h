// The KV store's sharding client (ARCHITECTURE.md §5): one logical cache over several
// ferry-kvstore nodes, for the workers that reuse and publish KV blocks.
//
//   auto client = kv::KvClient::Create({.nodes = {"kv-0:7400", "kv-1:7400", "kv-2:7400"},
//                                       .replication = 2});
//   (*client)->Put(objects);                              // count durable on >= 1 node
//   auto hits = (*client)->Exists(chain, fingerprint);    // merged over the replicas
//   auto got = (*client)->Get(keys, fingerprint);         // a miss, never an error
//   (*client)->GetInto(keys, fingerprint, {.spans = block_spans});  // into caller memory
//
// Placement is rendezvous (highest-random-weight) hashing: a key's nodes, best first, are the
// nodes ordered by RendezvousScore(key, address), and it lives on the first `replication` of
// them. Every client with the same node list computes the same placement, with no coordination;
// removing a node moves only that node's keys.
//
// The cache is an optimisation, so the client never fails a user request: a node that is down,
// slow (past the per-RPC deadline) or broken is a miss. After a failure (UNAVAILABLE,
// DEADLINE_EXCEEDED, any transport or server fault) the node is marked down for `down_backoff`,
// doubling with each consecutive failure up to `max_down_backoff`. While down it is skipped
// without an RPC; once the backoff has passed, one request probes it, and success marks it up
// again. A down node keeps its place in every key's order: its keys are misses, never remapped
// to other nodes, so when it comes back it serves them again. A request error from a healthy
// node (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, e.g. an object over its size limit) is not a node
// failure: only that request's objects are affected.
//
// Each call sends one RPC (one stream for Get and Put) per node involved, to all of them in
// parallel (a thread per node, the caller's among them), so a call costs about one round trip
// plus the transfer, and at most the deadline per replica tried when nodes misbehave. Get asks a
// key's replicas one after another (round r asks the r-th replica of the keys still missing);
// Exists and Delete ask all of them at once; Put writes to all of them.
//
// GetInto is Get with the values landing in caller memory (a KV block pool's blocks): copied once,
// from the received message into the span, or, with a transfer descriptor of that memory, written
// there by the node's own KV transport (one-sided puts from the node's staging memory; the stream
// carries headers only). Either way the client verifies each value's checksum over the span once
// its stream ended.

#ifndef FERRY_KVSTORE_CLIENT_KV_CLIENT_H_
#define FERRY_KVSTORE_CLIENT_KV_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "kvstore/format.h"
#include "kvstore/kv_store.h"
#include "services/common/shared_token.h"
#include "services/transfer/transfer_wire.h"

namespace ferry {
namespace kv {

struct ClientOptions {
  // "host:port" of each ferry-kvstore node. The strings are part of the placement (see
  // RendezvousScore): every client of a cluster must spell them the same way.
  std::vector<std::string> nodes;
  // Copies of each object, on the first `replication` nodes of its order (1..nodes.size()).
  int replication = 1;
  // Per RPC; a slower node is a miss (and is marked down).
  absl::Duration deadline = absl::Milliseconds(500);
  // After a failure the node is skipped this long, doubling per consecutive failure, at most
  // max_down_backoff.
  absl::Duration down_backoff = absl::Milliseconds(200);
  absl::Duration max_down_backoff = absl::Seconds(5);
  // Value bytes per PutChunk / GetChunk message: 1 byte .. 4 MiB (what a ferry-kvstore accepts
  // by default, its --max_chunk_bytes). Nodes may answer with other chunk sizes; any is read.
  int64_t max_chunk_bytes = int64_t{1} << 20;
  // Times the backoffs (Monotonic) and reports them (Now); null: RealClock(). Not owned. RPC
  // deadlines always run on real time.
  Clock* clock = nullptr;
  // The nodes' shared token, sent with every call ("": none).
  SharedToken auth_token;
};

struct ClientObject {
  Hash128 key;  // the block hash
  ObjectMeta meta;
  absl::string_view value;
};

struct ClientGetResult {
  bool found = false;
  ObjectMeta meta;
  std::string value;
};

struct GetIntoResult {
  bool found = false;
  ObjectMeta meta;
  // Found, and put into the span by the node's transport (else: copied from the stream).
  bool by_transport = false;
  // Not found, and the span may still be written: the destination had a descriptor and the
  // key's node failed before completing it (see GetInto). The span's memory is safely reused
  // only after the call's deadline (ClientOptions::deadline from when GetInto returned, at the
  // latest) plus the node transport's cancel grace.
  bool unsettled = false;
};

// Where GetInto puts each key's value.
struct GetIntoDestination {
  // One span of caller memory per key, exactly the size of the value the caller expects.
  std::vector<absl::Span<char>> spans;
  // Optional: the same spans as the caller's KV transport registered them
  // (services/transfer/transfer_wire.h PeerDescriptor: kind, address, regions, one block slice per
  // key, in key order; its transfer_id is not used). Then a node whose own KV transport is of the
  // same kind writes each value into the caller's memory itself (one-sided puts) and its Get
  // stream carries headers only; a node without such a transport (or that cannot reach the
  // caller's) answers FAILED_PRECONDITION and the client asks it again for the bytes in the
  // stream, within the same deadline.
  std::optional<transfer::PeerDescriptor> descriptor;
};

struct NodeStatus {
  std::string address;
  // False from a failure until a later request to the node succeeds.
  bool up = true;
  // RPCs sent to the node, and those that failed as node failures (skipped calls count in
  // neither).
  int64_t requests = 0, failures = 0;
  // While !up: when the node may be probed again (wall time of the client's clock).
  absl::Time down_until;
};

// The KV store client seam: users take a KvClient and their tests may substitute a fake.
// Thread-safe. Create() connects lazily; nothing blocks on a node until a call needs it.
class KvClient {
 public:
  // InvalidArgument for bad options only: no nodes, an empty or duplicate address, replication
  // outside 1..nodes.size(), a deadline <= 0, negative or inverted backoffs, max_chunk_bytes
  // outside 1..4 MiB.
  static absl::StatusOr<std::unique_ptr<KvClient>> Create(const ClientOptions& options);

  virtual ~KvClient() = default;

  // Stores each object on its `replication` nodes (down ones are skipped, not replaced), one Put
  // stream per node, the nodes in parallel. Returns how many of `objects` are durable on at
  // least one node (already-present ones included): a lower bound, as a call that fails part way
  // may have stored some objects before. Objects refused by a node (too large, bad header) and
  // node failures only lower the count; never an error. Each object's meta travels with it, its
  // retention floor included: a node that has the object with a lower floor writes it again
  // (KvStore::Put). A node that has an object with other bytes keeps them (it counts as durable)
  // and says so: the client logs a WARNING.
  virtual int64_t Put(absl::Span<const ClientObject> objects) = 0;

  // One result per key. Each key is read from its first replica that is up and has it: a miss,
  // a failure or a skipped (down) node moves the key on to its next replica, in rounds, each
  // round one Get stream per node, in parallel. A value is returned only if its size and the
  // XXH3-64 checksum of its header match the bytes received, and the header names the key and
  // `fingerprint`; anything else is a miss (without marking the node down).
  virtual std::vector<ClientGetResult> Get(absl::Span<const Hash128> keys,
                                           const Hash128& fingerprint) = 0;

  // Like Get (replicas in rounds, a miss never an error), but each value lands in
  // destination.spans[i], copied once from the received message (or written there by the node's
  // transport): no std::string per value. A value whose size is not spans[i].size(), or whose
  // XXH3-64 checksum (the header's) does not match the bytes in spans[i] once its stream ended,
  // is a miss; whatever a miss left in its span is garbage. The header must name the key and
  // `fingerprint` (as Get). A retry of a key on its next replica simply rewrites its span, so
  // spans must not overlap. Never an error: a bad destination (spans.size() != keys.size(); a
  // descriptor whose block slices are not exactly the spans, in count, length or address) makes
  // every key a miss and logs once.
  //
  // With a descriptor, a node whose stream failed (deadline, connection lost) may still have
  // puts landing in the spans of the keys it did not complete, until its transport gives up on
  // them (the call's deadline plus the transport's cancel grace, 200 ms by default): those keys
  // are misses, marked unsettled, not asked of their next replica in this call (a key found
  // elsewhere could be overwritten after its check), and their memory is safely reused only
  // after that time. The
  // node is marked down as usual, so later calls go to the next replica at once.
  virtual std::vector<GetIntoResult> GetInto(absl::Span<const Hash128> keys,
                                             const Hash128& fingerprint,
                                             const GetIntoDestination& destination) = 0;

  // `keys` is a chain in order. A key is present if any of its replica nodes says so (all of
  // them are asked, in parallel, one RPC per node); `prefix` is the number of leading keys
  // present. Keys of down nodes are not present. A present key's retention_floor_s is the lowest
  // among the replicas that have it (0 from a node that predates floors), 0 for an absent key.
  virtual ExistsResult Exists(absl::Span<const Hash128> keys, const Hash128& fingerprint) = 0;

  // Deletes each key on all its replica nodes (best effort: a node that is down keeps its copy,
  // which it serves again when it comes back). Returns the sum of DeleteResponse.deleted over the
  // nodes that answered (so with replication 2 a key deleted on both replicas counts twice).
  virtual int64_t Delete(absl::Span<const Hash128> keys) = 0;

  // The node indices (into ClientOptions::nodes) in `key`'s order: by RendezvousScore descending,
  // ties by lower index. The first `replication` hold the key. Independent of node health.
  virtual std::vector<int> NodesFor(const Hash128& key) const = 0;

  // One entry per node, in ClientOptions::nodes order.
  virtual std::vector<NodeStatus> nodes() const = 0;
};

// The placement score of `key` on the node at `address`, XXH3-64 (seed 0) of exactly these
// bytes:
//
//   key.lo as 8 bytes little-endian, key.hi as 8 bytes little-endian, then the address's bytes
//   as given in ClientOptions::nodes (no length prefix, no terminator).
//
// E.g. in Python: xxhash.xxh3_64_intdigest(struct.pack("<QQ", lo, hi) + address.encode()).
uint64_t RendezvousScore(const Hash128& key, absl::string_view address);

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_CLIENT_KV_CLIENT_H_
