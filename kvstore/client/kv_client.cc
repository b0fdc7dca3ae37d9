#include "kvstore/client/kv_client.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/le_encoding.h"
#include "engine/common/log.h"
#include "ferry/v1/kvstore.grpc.pb.h"
#include "ferry/v1/kvstore.pb.h"
#include "kvstore/client/put_stream.h"
#include "kvstore/wire.h"
#include "services/common/grpc_client.h"
#include "services/common/shared_token.h"

namespace ferry {
namespace kv {
namespace {

// Every ferry-kvstore accepts messages of its max_chunk_bytes (4 MiB by default) plus a header.
constexpr int64_t kMaxChunkBytesLimit = int64_t{4} << 20;
// What Get reserves up front for a value at most; larger values grow as their chunks arrive, so
// a header announcing a huge size costs nothing until the bytes really come.
constexpr uint64_t kMaxReserveBytes = uint64_t{64} << 20;

using Stub = ferry::v1::KvStore::Stub;

// A ferry-kvstore takes at most this many keys per request (KvServiceOptions::max_keys): longer
// Get, Exists and Delete calls are sent in slices.
constexpr size_t kMaxKeysPerRequest = 65536;

// Errors that are about the request, from a node that answered: the node stays up. Everything
// else (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, INTERNAL, UNKNOWN, UNIMPLEMENTED, ...) is a
// node failure.
bool IsRequestError(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return true;
    default:
      return false;
  }
}

// Runs fn(0..n-1) concurrently: n - 1 on threads of their own, one on the caller's. A call
// involves a handful of nodes and each RPC blocks up to the deadline, so a shared pool could
// queue one caller's RPCs behind another's slow node; a thread per node cannot.
void RunInParallel(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  for (size_t i = 1; i < n; ++i) threads.emplace_back(fn, i);
  fn(0);
  for (std::thread& t : threads) t.join();
}

// One node: its channel and its health. Thread-safe.
class Node {
 public:
  // Whether a request goes to the node now. A probe is the one request let through after a
  // down node's backoff; the others keep skipping it until the probe has answered.
  enum class Admission { kSkip, kSend, kProbe };

  struct Lease {
    Admission admission = Admission::kSkip;
    std::shared_ptr<Stub> stub;
    // The same channel's, for Put (PutStream).
    std::shared_ptr<grpc::GenericStub> generic;
  };

  Node(std::string address, const ClientOptions& options, Clock* clock)
      : address_(std::move(address)), options_(options), clock_(clock) {
    absl::MutexLock lock(&mu_);
    Connect();
  }

  const std::string& address() const { return address_; }

  Lease Admit() {
    absl::MutexLock lock(&mu_);
    Lease lease;
    if (consecutive_failures_ == 0) {
      lease.admission = Admission::kSend;
    } else if (probing_ || clock_->Monotonic() < down_until_) {
      return lease;  // kSkip
    } else {
      probing_ = true;
      lease.admission = Admission::kProbe;
      // A channel that failed to connect waits out gRPC's own reconnect backoff (1 s growing to
      // 2 min) and fails calls at once meanwhile; the probe must really try, so it gets a fresh
      // connection.
      if (channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
        Connect();
      }
    }
    ++requests_;
    lease.stub = stub_;
    lease.generic = generic_;
    return lease;
  }

  // Reports how a request admitted by Admit() ended: `failed` means a node failure.
  void Release(const Lease& lease, bool failed, const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (lease.admission == Admission::kProbe) probing_ = false;
    if (!failed) {
      if (consecutive_failures_ > 0) {
        LOG(INFO) << "kv node " << address_ << " is up again";
      }
      consecutive_failures_ = 0;
      return;
    }
    ++failures_;
    // A request that was in flight when another one marked the node down does not extend the
    // backoff: only the first failure and failed probes count as consecutive.
    if (consecutive_failures_ > 0 && lease.admission != Admission::kProbe) return;
    ++consecutive_failures_;
    absl::Duration backoff = options_.down_backoff;
    for (int i = 1; i < consecutive_failures_ && backoff < options_.max_down_backoff; ++i) {
      backoff *= 2;
    }
    backoff = std::min(backoff, options_.max_down_backoff);
    down_until_ = clock_->Monotonic() + backoff;
    if (consecutive_failures_ == 1) {
      LOG(WARNING) << "kv node " << address_ << " is down for " << backoff << ": "
                   << static_cast<int>(status.error_code()) << " " << status.error_message();
    }
  }

  // Whether a Get may name a transfer descriptor: not for a while after the node refused one
  // (FAILED_PRECONDITION: no transport of that kind there, or ours unreachable from it), so that
  // a node without a transport costs one extra round trip a minute, not one per Get.
  bool TakesDescriptors() const {
    absl::MutexLock lock(&mu_);
    return clock_->Monotonic() >= descriptors_refused_until_;
  }
  void RefusedDescriptor() {
    absl::MutexLock lock(&mu_);
    if (clock_->Monotonic() >= descriptors_refused_until_) {
      LOG(INFO) << "kv node " << address_ << " cannot write into this process's memory (no KV "
                << "transport of its kind there): its values come in the stream for the next "
                << kDescriptorRetry;
    }
    descriptors_refused_until_ = clock_->Monotonic() + kDescriptorRetry;
  }

  NodeStatus status() const {
    absl::MutexLock lock(&mu_);
    NodeStatus s;
    s.address = address_;
    s.up = consecutive_failures_ == 0;
    s.requests = requests_;
    s.failures = failures_;
    if (!s.up) s.down_until = clock_->Now() + (down_until_ - clock_->Monotonic());
    return s;
  }

 private:
  void Connect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    channel_ = NewChannel(address_);
    stub_ = ferry::v1::KvStore::NewStub(channel_);
    generic_ = std::make_shared<grpc::GenericStub>(channel_);
  }

  const std::string address_;
  const ClientOptions& options_;  // the client's, which outlives its nodes
  Clock* const clock_;

  mutable absl::Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Stub> stub_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::GenericStub> generic_ ABSL_GUARDED_BY(mu_);
  int consecutive_failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration down_until_ ABSL_GUARDED_BY(mu_);  // on clock_->Monotonic()
  bool probing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  static constexpr absl::Duration kDescriptorRetry = absl::Seconds(60);
  absl::Duration descriptors_refused_until_ ABSL_GUARDED_BY(mu_);  // on clock_->Monotonic()
};

// Where GetInto puts the values of one slice of its keys: spans[k] for the slice's keys[k], and
// optionally the same memory as the caller's transport describes it.
struct IntoSpans {
  absl::Span<const absl::Span<char>> spans;
  // Null: the bytes come in the stream.
  const transfer::PeerDescriptor* descriptor = nullptr;
  // The index into descriptor->block_slices of spans[0].
  size_t first_slice = 0;
  // What became of each of the slice's keys, for GetIntoResult (indexed as spans): its value was
  // put by the node's transport; its node failed with puts into its span possibly still running.
  std::vector<char>* by_transport = nullptr;
  std::vector<char>* unsettled = nullptr;
};

// A value being reassembled from a Get stream, one mechanism for Get and GetInto: the bytes go
// into the value's own string (Get) or into the caller's span (GetInto); with a descriptor the
// node's transport wrote them there before the header came, and the stream brings no data.
struct Incoming {
  bool seen = false;   // its first chunk arrived
  bool found = false;  // ... and said found, with a usable header
  bool bad = false;    // a chunk did not fit: a miss
  ObjectMeta meta;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t received = 0;  // bytes of the value in place
  std::string value;      // Get
  // GetInto: the caller's memory, exactly the size expected.
  bool into_span = false;
  absl::Span<char> span;
  bool by_transport = false;  // ... written by the node's transport

  // The header of a found object; `expected` is the key asked for.
  void Begin(const ferry::v1::GetChunk& chunk, const Hash128& expected,
             const Hash128& fingerprint) {
    const ferry::v1::ObjectHeader& h = chunk.header();
    found = true;
    // The object must be the one asked for, of the model asked for.
    bad = !chunk.has_header() || HashFromProto(h.block_hash()) != expected ||
          HashFromProto(h.model_fingerprint()) != fingerprint || h.size_bytes() > kMaxValueBytes ||
          (into_span && h.size_bytes() != span.size());
    size = h.size_bytes();
    checksum = h.checksum();
    meta.fingerprint = HashFromProto(h.model_fingerprint());
    meta.layout_tag = h.layout_tag();
    meta.token_count = h.token_count();
    meta.traffic_class = ClassFromProto(h.traffic_class());
    meta.retention_floor_s = h.retention_floor_seconds();
    if (by_transport) received = size;  // in the span already: any data now is a violation
  }

  // A chunk's data (not empty).
  void Append(ferry::v1::GetChunk* chunk) {
    if (bad) return;
    const std::string& data = chunk->data();
    const uint64_t n = data.size();
    if (!found || chunk->offset() != received || n > size - received) {
      bad = true;
      value.clear();
      value.shrink_to_fit();
      return;
    }
    if (into_span) {
      std::memcpy(span.data() + received, data.data(), n);
    } else if (value.empty() && n == size) {
      value = std::move(*chunk->mutable_data());  // the whole object in one chunk: no copy
    } else {
      if (value.empty()) value.reserve(std::min(size, kMaxReserveBytes));
      value.append(data);
    }
    received += n;
  }

  // Checked over the bytes where they landed, once the stream ended.
  bool Complete() const {
    if (!found || bad || received != size) return false;
    const absl::string_view bytes =
        into_span ? absl::string_view(span.data(), size) : absl::string_view(value);
    return Checksum(bytes) == checksum;
  }
};

class GrpcKvClient final : public KvClient {
 public:
  explicit GrpcKvClient(const ClientOptions& options)
      : options_(options), clock_(options.clock != nullptr ? options.clock : &RealClock()) {
    for (const std::string& address : options_.nodes) {
      nodes_.push_back(std::make_unique<Node>(address, options_, clock_));
    }
  }

  int64_t Put(absl::Span<const ClientObject> objects) override;
  std::vector<ClientGetResult> Get(absl::Span<const Hash128> keys,
                                   const Hash128& fingerprint) override;
  std::vector<GetIntoResult> GetInto(absl::Span<const Hash128> keys, const Hash128& fingerprint,
                                     const GetIntoDestination& destination) override;
  ExistsResult Exists(absl::Span<const Hash128> keys, const Hash128& fingerprint) override;
  int64_t Delete(absl::Span<const Hash128> keys) override;
  std::vector<int> NodesFor(const Hash128& key) const override;
  std::vector<NodeStatus> nodes() const override;

 private:
  // Work for one node within one call: the indices (into the call's keys or objects) it serves.
  struct NodeWork {
    int node = 0;
    Node::Lease lease;
    std::vector<int> items;
  };

  // The replica nodes of each key (the first `replication` of NodesFor), grouped into per-node
  // work for the nodes that admit a request now; items of skipped nodes are left out.
  std::vector<NodeWork> Plan(absl::Span<const Hash128> keys);

  std::vector<int> Replicas(const Hash128& key) const {
    std::vector<int> order = NodesFor(key);
    order.resize(static_cast<size_t>(options_.replication));
    return order;
  }

  // Ends a node's request; returns whether it succeeded (neither a node nor a request error).
  bool Finish(const NodeWork& work, const grpc::Status& status) {
    const bool failed = !status.ok() && !IsRequestError(status.error_code());
    nodes_[work.node]->Release(work.lease, failed, status);
    return status.ok();
  }

  // The public calls in slices of at most kMaxKeysPerRequest keys. GetSlice serves Get (`into`
  // null: the values in the results) and GetInto (the values in into's spans, the results'
  // strings empty).
  std::vector<ClientGetResult> GetSlice(absl::Span<const Hash128> keys, const Hash128& fingerprint,
                                        const IntoSpans* into);
  ExistsResult ExistsSlice(absl::Span<const Hash128> keys, const Hash128& fingerprint);
  int64_t DeleteSlice(absl::Span<const Hash128> keys);

  // Gets keys[work.items] from `work`'s node; completed values land in results (or into's spans).
  // With into's descriptor, a node that cannot put into it (FAILED_PRECONDITION) is asked again
  // for the bytes in the stream, within the same deadline. Returns true when the node's puts
  // into the spans of the keys it did not complete may still be running (its stream failed with
  // a descriptor): those keys must not be asked of another replica in this call.
  bool GetFromNode(const NodeWork& work, absl::Span<const Hash128> keys, const Hash128& fingerprint,
                   const IntoSpans* into, std::vector<ClientGetResult>* results);
  // One Get stream of GetFromNode, by the node's transport or not; returns how it ended.
  grpc::Status GetStream(const NodeWork& work, absl::Span<const Hash128> keys,
                         const Hash128& fingerprint, const IntoSpans* into, bool by_transport,
                         absl::Time deadline, std::vector<ClientGetResult>* results);

  // One Put stream of objects[work.items]; sets (*durable)[i] for each object i the node stored.
  void PutToNode(const NodeWork& work, absl::Span<const ClientObject> objects,
                 std::vector<char>* durable);

  const ClientOptions options_;
  Clock* const clock_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

std::vector<int> GrpcKvClient::NodesFor(const Hash128& key) const {
  std::vector<std::pair<uint64_t, int>> scored;
  scored.reserve(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    scored.emplace_back(RendezvousScore(key, options_.nodes[i]), static_cast<int>(i));
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<int> order;
  order.reserve(scored.size());
  for (const auto& s : scored) order.push_back(s.second);
  return order;
}

std::vector<NodeStatus> GrpcKvClient::nodes() const {
  std::vector<NodeStatus> out;
  out.reserve(nodes_.size());
  for (const auto& node : nodes_) out.push_back(node->status());
  return out;
}

std::vector<GrpcKvClient::NodeWork> GrpcKvClient::Plan(absl::Span<const Hash128> keys) {
  // Admission is asked once per node per call, and only of nodes the call needs.
  std::vector<int> slot(nodes_.size(), -1);  // node -> index in `work`, -2 skipped
  std::vector<NodeWork> work;
  for (size_t k = 0; k < keys.size(); ++k) {
    for (int node : Replicas(keys[k])) {
      if (slot[node] == -1) {
        Node::Lease lease = nodes_[node]->Admit();
        if (lease.admission == Node::Admission::kSkip) {
          slot[node] = -2;
        } else {
          slot[node] = static_cast<int>(work.size());
          work.push_back(NodeWork{node, std::move(lease), {}});
        }
      }
      if (slot[node] >= 0) work[slot[node]].items.push_back(static_cast<int>(k));
    }
  }
  return work;
}

int64_t GrpcKvClient::Put(absl::Span<const ClientObject> objects) {
  std::vector<Hash128> keys;
  keys.reserve(objects.size());
  for (const ClientObject& o : objects) keys.push_back(o.key);
  const std::vector<NodeWork> work = Plan(keys);
  std::vector<std::vector<char>> durable(work.size(), std::vector<char>(objects.size(), 0));
  RunInParallel(work.size(), [&](size_t w) { PutToNode(work[w], objects, &durable[w]); });
  int64_t count = 0;
  for (size_t i = 0; i < objects.size(); ++i) {
    bool stored = false;
    for (const auto& d : durable) stored = stored || d[i] != 0;
    if (stored) ++count;
  }
  return count;
}

void GrpcKvClient::PutToNode(const NodeWork& work, absl::Span<const ClientObject> objects,
                             std::vector<char>* durable) {
  auto context = NewClientContext(options_.deadline);
  AttachSharedToken(context.get(), options_.auth_token);
  ferry::v1::PutResponse response;
  // Each chunk's data goes from the caller's memory (a pool block) to the socket as it is: no
  // copy into a message (PutStream).
  PutStream writer(work.lease.generic.get(), context.get());
  bool first_message = true;
  bool writing = true;
  size_t sent = 0;  // objects of work.items written whole
  for (int i : work.items) {
    const ClientObject& o = objects[i];
    uint64_t offset = 0;
    do {
      ferry::v1::PutChunk chunk;
      if (first_message) chunk.mutable_context();  // an empty RequestContext
      first_message = false;
      if (offset == 0) {
        ferry::v1::ObjectHeader* h = chunk.mutable_header();
        HashToProto(o.key, h->mutable_block_hash());
        HashToProto(o.meta.fingerprint, h->mutable_model_fingerprint());
        h->set_layout_tag(o.meta.layout_tag);
        h->set_token_count(o.meta.token_count);
        h->set_traffic_class(ClassToProto(o.meta.traffic_class));
        h->set_retention_floor_seconds(o.meta.retention_floor_s);
        h->set_size_bytes(o.value.size());
        h->set_checksum(Checksum(o.value));
      }
      const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(options_.max_chunk_bytes),
                                            o.value.size() - offset);
      chunk.set_offset(offset);
      const absl::string_view data = o.value.substr(offset, n);
      offset += n;
      writing = writer.Write(chunk, data);
    } while (writing && offset < o.value.size());
    if (!writing) break;  // the stream is broken; Finish() says why
    ++sent;
  }
  const grpc::Status status = writer.Finish(&response);
  if (!Finish(work, status)) return;
  if (response.conflicting_block_hashes_size() > 0) {
    // Stored (the node keeps its bytes), but this writer and an earlier one disagree.
    LOG(WARNING) << "kv node " << nodes_[work.node]->address() << " already had "
                 << response.conflicting_block_hashes_size()
                 << " of the objects put with other bytes (a hash collision or a writer's bug; "
                    "it keeps its own), the first "
                 << HashFromProto(response.conflicting_block_hashes(0)).ToHex();
  }
  absl::flat_hash_set<Hash128> rejected;
  for (const auto& r : response.rejections()) rejected.insert(HashFromProto(r.block_hash()));
  std::vector<int> stored;
  for (size_t j = 0; j < sent; ++j) {
    if (!rejected.contains(objects[work.items[j]].key)) stored.push_back(work.items[j]);
  }
  // The node's own count bounds ours: when they disagree, which objects it kept is unknown, and
  // none is counted (a lower bound, as the cache's callers need).
  if (stored.size() > response.stored()) {
    LOG(WARNING) << "kv node " << nodes_[work.node]->address() << " stored " << response.stored()
                 << " of " << stored.size() << " objects it did not refuse";
    return;
  }
  for (int i : stored) (*durable)[i] = 1;
}

std::vector<ClientGetResult> GrpcKvClient::Get(absl::Span<const Hash128> keys,
                                               const Hash128& fingerprint) {
  std::vector<ClientGetResult> results;
  results.reserve(keys.size());
  for (size_t at = 0; at < keys.size(); at += kMaxKeysPerRequest) {
    std::vector<ClientGetResult> slice =
        GetSlice(keys.subspan(at, kMaxKeysPerRequest), fingerprint, nullptr);
    for (ClientGetResult& r : slice) results.push_back(std::move(r));
  }
  return results;
}

// Why `destination` cannot take `keys` values (OK when it can): one span per key, and a
// descriptor's block slices exactly those spans, as the caller's transport registered them.
absl::Status CheckDestination(size_t keys, const GetIntoDestination& destination) {
  if (destination.spans.size() != keys) {
    return absl::InvalidArgumentError(
        absl::StrCat(destination.spans.size(), " spans for ", keys, " keys"));
  }
  if (!destination.descriptor.has_value()) return absl::OkStatus();
  const transfer::PeerDescriptor& d = *destination.descriptor;
  if (d.block_slices.size() != keys) {
    return absl::InvalidArgumentError(absl::StrCat("a descriptor of ", d.block_slices.size(),
                                                   " block slices for ", keys, " keys"));
  }
  for (size_t i = 0; i < keys; ++i) {
    const transfer::BlockSlice& slice = d.block_slices[i];
    if (slice.region_index >= d.regions.size()) {
      return absl::InvalidArgumentError(absl::StrCat("block slice ", i, " names region ",
                                                     slice.region_index, " of ", d.regions.size()));
    }
    const transfer::RegionDescriptor& region = d.regions[slice.region_index];
    const absl::Span<char> span = destination.spans[i];
    if (slice.length == 0 || slice.length != span.size() || slice.offset > region.length ||
        slice.length > region.length - slice.offset ||
        region.address + slice.offset != reinterpret_cast<uint64_t>(span.data())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block slice ", i, " (", slice.length, " bytes at offset ", slice.offset, " of region ",
          slice.region_index, ") is not span ", i, " (", span.size(), " bytes)"));
    }
  }
  return absl::OkStatus();
}

std::vector<GetIntoResult> GrpcKvClient::GetInto(absl::Span<const Hash128> keys,
                                                 const Hash128& fingerprint,
                                                 const GetIntoDestination& destination) {
  std::vector<GetIntoResult> results(keys.size());
  if (absl::Status s = CheckDestination(keys.size(), destination); !s.ok()) {
    LOG(WARNING) << "kv client: GetInto of " << keys.size()
                 << " keys into a bad destination, every key a miss: " << s.message();
    return results;
  }
  const absl::Span<const absl::Span<char>> spans(destination.spans);
  for (size_t at = 0; at < keys.size(); at += kMaxKeysPerRequest) {
    IntoSpans into;
    into.spans = spans.subspan(at, kMaxKeysPerRequest);
    if (destination.descriptor.has_value()) into.descriptor = &*destination.descriptor;
    into.first_slice = at;
    std::vector<char> by_transport(into.spans.size(), 0), unsettled(into.spans.size(), 0);
    into.by_transport = &by_transport;
    into.unsettled = &unsettled;
    const std::vector<ClientGetResult> slice =
        GetSlice(keys.subspan(at, kMaxKeysPerRequest), fingerprint, &into);
    for (size_t j = 0; j < slice.size(); ++j) {
      results[at + j].found = slice[j].found;
      results[at + j].meta = slice[j].meta;
      results[at + j].by_transport = slice[j].found && by_transport[j] != 0;
      results[at + j].unsettled = !slice[j].found && unsettled[j] != 0;
    }
  }
  return results;
}

std::vector<ClientGetResult> GrpcKvClient::GetSlice(absl::Span<const Hash128> keys,
                                                    const Hash128& fingerprint,
                                                    const IntoSpans* into) {
  std::vector<ClientGetResult> results(keys.size());
  std::vector<std::vector<int>> replicas(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) replicas[k] = Replicas(keys[k]);
  std::vector<int> next(keys.size(), 0);  // the replica a key tries next
  std::vector<int> pending(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) pending[k] = static_cast<int>(k);
  // Round r asks each pending key's first admitting replica from next[k] on; misses and
  // failures move on to the replica after it in the next round.
  while (!pending.empty()) {
    std::vector<int> slot(nodes_.size(), -1);  // as in Plan(), per round
    std::vector<NodeWork> work;
    for (int k : pending) {
      for (; next[k] < options_.replication; ++next[k]) {
        const int node = replicas[k][next[k]];
        if (slot[node] == -1) {
          Node::Lease lease = nodes_[node]->Admit();
          if (lease.admission == Node::Admission::kSkip) {
            slot[node] = -2;
          } else {
            slot[node] = static_cast<int>(work.size());
            work.push_back(NodeWork{node, std::move(lease), {}});
          }
        }
        if (slot[node] >= 0) {
          work[slot[node]].items.push_back(k);
          break;
        }
      }
    }
    if (work.empty()) break;
    std::vector<char> still_writing(work.size(), 0);
    RunInParallel(work.size(), [&](size_t w) {
      still_writing[w] = GetFromNode(work[w], keys, fingerprint, into, &results);
    });
    std::vector<int> still;
    for (size_t w = 0; w < work.size(); ++w) {
      // Another replica would write into spans the failed node's puts may still reach.
      if (still_writing[w]) {
        for (int k : work[w].items) {
          if (!results[k].found) (*into->unsettled)[static_cast<size_t>(k)] = 1;
        }
        continue;
      }
      for (int k : work[w].items) {
        if (results[k].found) continue;
        if (++next[k] < options_.replication) still.push_back(k);
      }
    }
    pending = std::move(still);
  }
  return results;
}

bool GrpcKvClient::GetFromNode(const NodeWork& work, absl::Span<const Hash128> keys,
                               const Hash128& fingerprint, const IntoSpans* into,
                               std::vector<ClientGetResult>* results) {
  const absl::Time deadline = absl::Now() + options_.deadline;
  const bool by_transport =
      into != nullptr && into->descriptor != nullptr && nodes_[work.node]->TakesDescriptors();
  const grpc::Status status =
      GetStream(work, keys, fingerprint, into, by_transport, deadline, results);
  if (by_transport && status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // No transport of the descriptor's kind there, or it cannot reach ours: the bytes come in
    // the stream instead (and for a while, at once).
    nodes_[work.node]->RefusedDescriptor();
    Finish(work,
           GetStream(work, keys, fingerprint, into, /*by_transport=*/false, deadline, results));
    return false;
  }
  Finish(work, status);
  return by_transport && !status.ok();
}

grpc::Status GrpcKvClient::GetStream(const NodeWork& work, absl::Span<const Hash128> keys,
                                     const Hash128& fingerprint, const IntoSpans* into,
                                     bool by_transport, absl::Time deadline,
                                     std::vector<ClientGetResult>* results) {
  ferry::v1::GetRequest request;
  HashToProto(fingerprint, request.mutable_model_fingerprint());
  for (int k : work.items) HashToProto(keys[k], request.add_block_hashes());
  request.set_max_chunk_bytes(static_cast<uint32_t>(options_.max_chunk_bytes));
  if (by_transport) {
    // The descriptor narrowed to this node's keys: their slices, in request order.
    transfer::PeerDescriptor destination;
    destination.kind = into->descriptor->kind;
    destination.address = into->descriptor->address;
    destination.regions = into->descriptor->regions;
    for (int k : work.items) {
      destination.block_slices.push_back(
          into->descriptor->block_slices[into->first_slice + static_cast<size_t>(k)]);
    }
    *request.mutable_destination() = transfer::ToProto(destination);
  }
  auto context = NewClientContext(std::max(deadline - absl::Now(), absl::Microseconds(1)));
  AttachSharedToken(context.get(), options_.auth_token);
  std::unique_ptr<grpc::ClientReader<ferry::v1::GetChunk>> reader =
      work.lease.stub->Get(context.get(), request);
  std::vector<Incoming> incoming(work.items.size());
  if (into != nullptr) {
    for (size_t i = 0; i < incoming.size(); ++i) {
      incoming[i].into_span = true;
      incoming[i].span = into->spans[static_cast<size_t>(work.items[i])];
      incoming[i].by_transport = by_transport;
    }
  }
  bool broken = false;  // the server broke the protocol: the call is cancelled
  ferry::v1::GetChunk chunk;
  while (reader->Read(&chunk)) {
    if (broken) continue;  // draining after TryCancel()
    if (chunk.index() >= incoming.size()) {
      broken = true;
      context->TryCancel();
      continue;
    }
    Incoming& in = incoming[chunk.index()];
    if (!in.seen) {
      in.seen = true;
      if (chunk.found()) in.Begin(chunk, keys[work.items[chunk.index()]], fingerprint);
    }
    if (!chunk.data().empty()) in.Append(&chunk);
  }
  grpc::Status status = reader->Finish();
  if (broken) {
    status = grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("Get from ", nodes_[work.node]->address(),
                                       ": a chunk for an index that was not asked for"));
  }
  // Whole, verified values count even when the call failed later (they are checksummed).
  for (size_t i = 0; i < incoming.size(); ++i) {
    Incoming& in = incoming[i];
    if (!in.Complete()) continue;
    ClientGetResult& r = (*results)[work.items[i]];
    r.found = true;
    r.meta = in.meta;
    r.value = std::move(in.value);
    if (by_transport) (*into->by_transport)[static_cast<size_t>(work.items[i])] = 1;
  }
  return status;
}

ExistsResult GrpcKvClient::Exists(absl::Span<const Hash128> keys, const Hash128& fingerprint) {
  ExistsResult all;
  for (size_t at = 0; at < keys.size(); at += kMaxKeysPerRequest) {
    const ExistsResult slice = ExistsSlice(keys.subspan(at, kMaxKeysPerRequest), fingerprint);
    all.present.insert(all.present.end(), slice.present.begin(), slice.present.end());
    all.retention_floor_s.insert(all.retention_floor_s.end(), slice.retention_floor_s.begin(),
                                 slice.retention_floor_s.end());
  }
  while (all.prefix < static_cast<int64_t>(all.present.size()) && all.present[all.prefix]) {
    ++all.prefix;
  }
  return all;
}

ExistsResult GrpcKvClient::ExistsSlice(absl::Span<const Hash128> keys, const Hash128& fingerprint) {
  const std::vector<NodeWork> work = Plan(keys);
  std::vector<std::vector<bool>> present(work.size());
  std::vector<std::vector<uint32_t>> floors(work.size());
  RunInParallel(work.size(), [&](size_t w) {
    ferry::v1::ExistsRequest request;
    request.mutable_context();
    HashToProto(fingerprint, request.mutable_model_fingerprint());
    for (int k : work[w].items) HashToProto(keys[k], request.add_block_hashes());
    ferry::v1::ExistsResponse response;
    auto context = NewClientContext(options_.deadline);
    AttachSharedToken(context.get(), options_.auth_token);
    grpc::Status status = work[w].lease.stub->Exists(context.get(), request, &response);
    if (status.ok() && response.present_flags_size() != request.block_hashes_size()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL,
                            absl::StrCat("Exists from ", nodes_[work[w].node]->address(), ": ",
                                         response.present_flags_size(), " flags for ",
                                         request.block_hashes_size(), " keys"));
    }
    if (!Finish(work[w], status)) return;
    present[w].assign(response.present_flags().begin(), response.present_flags().end());
    // A node that predates retention floors sends none: 0 each.
    floors[w].assign(present[w].size(), 0);
    if (response.retention_floor_seconds_size() == response.present_flags_size()) {
      floors[w].assign(response.retention_floor_seconds().begin(),
                       response.retention_floor_seconds().end());
    }
  });
  // Present on any replica; the floor is the lowest of the replicas that have the key (what a
  // writer can count on).
  ExistsResult result;
  result.present.assign(keys.size(), false);
  result.retention_floor_s.assign(keys.size(), 0);
  for (size_t w = 0; w < work.size(); ++w) {
    for (size_t i = 0; i < present[w].size(); ++i) {
      if (!present[w][i]) continue;
      const int k = work[w].items[i];
      const uint32_t floor = floors[w][i];
      result.retention_floor_s[k] =
          result.present[k] ? std::min(result.retention_floor_s[k], floor) : floor;
      result.present[k] = true;
    }
  }
  while (result.prefix < static_cast<int64_t>(keys.size()) && result.present[result.prefix]) {
    ++result.prefix;
  }
  return result;
}

int64_t GrpcKvClient::Delete(absl::Span<const Hash128> keys) {
  int64_t deleted = 0;
  for (size_t at = 0; at < keys.size(); at += kMaxKeysPerRequest) {
    deleted += DeleteSlice(keys.subspan(at, kMaxKeysPerRequest));
  }
  return deleted;
}

int64_t GrpcKvClient::DeleteSlice(absl::Span<const Hash128> keys) {
  const std::vector<NodeWork> work = Plan(keys);
  std::vector<int64_t> deleted(work.size(), 0);
  RunInParallel(work.size(), [&](size_t w) {
    ferry::v1::DeleteRequest request;
    request.mutable_context();
    for (int k : work[w].items) HashToProto(keys[k], request.add_block_hashes());
    ferry::v1::DeleteResponse response;
    auto context = NewClientContext(options_.deadline);
    AttachSharedToken(context.get(), options_.auth_token);
    const grpc::Status status = work[w].lease.stub->Delete(context.get(), request, &response);
    if (Finish(work[w], status)) deleted[w] = response.deleted();
  });
  int64_t total = 0;
  for (int64_t d : deleted) total += d;
  return total;
}

}  // namespace

uint64_t RendezvousScore(const Hash128& key, absl::string_view address) {
  std::string bytes;
  bytes.reserve(16 + address.size());
  AppendHash128Le(&bytes, key);
  bytes.append(address.data(), address.size());
  return XXH3_64bits(bytes.data(), bytes.size());
}

absl::StatusOr<std::unique_ptr<KvClient>> KvClient::Create(const ClientOptions& options) {
  if (options.nodes.empty()) return absl::InvalidArgumentError("kv client: no nodes");
  absl::flat_hash_set<std::string> seen;
  for (const std::string& address : options.nodes) {
    if (address.empty()) return absl::InvalidArgumentError("kv client: an empty node address");
    if (!seen.insert(address).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv client: node ", address, " is listed twice"));
    }
  }
  if (options.replication < 1 || options.replication > static_cast<int>(options.nodes.size())) {
    return absl::InvalidArgumentError(absl::StrCat("kv client: replication ", options.replication,
                                                   " with ", options.nodes.size(), " nodes"));
  }
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kv client: the deadline must be positive");
  }
  if (options.down_backoff < absl::ZeroDuration() ||
      options.max_down_backoff < options.down_backoff) {
    return absl::InvalidArgumentError(
        "kv client: backoffs must satisfy 0 <= down_backoff <= max_down_backoff");
  }
  if (options.max_chunk_bytes < 1 || options.max_chunk_bytes > kMaxChunkBytesLimit) {
    return absl::InvalidArgumentError(absl::StrCat("kv client: max_chunk_bytes ",
                                                   options.max_chunk_bytes, " outside 1..",
                                                   kMaxChunkBytesLimit));
  }
  return std::unique_ptr<KvClient>(new GrpcKvClient(options));
}

}  // namespace kv
}  // namespace ferry
