// A KV store client over a node set that changes at runtime (DNS discovery of the store's
// StatefulSet, services/common/dns_discovery.h): SetNodes builds a client (kv_client.h) for the
// new set, and each call runs on the set current when it began.
//
//   auto client = kv::DynamicKvClient::Create(options);  // options.nodes may be empty
//   discovery = DnsDiscovery::Start(o, [c = client.get()](auto nodes) { c->SetNodes(nodes); });
//
// Placement is the inner client's: rendezvous hashing over the node strings, so a set that gains
// or loses a node moves only that node's keys, and a node that comes back under the same name
// (its stable DNS name) gets its keys back. The nodes' health (down, backoff) starts afresh with
// each new set. With no node, every key is a miss (Put stores nothing) and replication is
// min(ClientOptions::replication, nodes) with at least one node.
//
// Thread-safe: calls run concurrently with SetNodes; a call keeps the set it started on alive.

#ifndef FERRY_KVSTORE_CLIENT_DYNAMIC_KV_CLIENT_H_
#define FERRY_KVSTORE_CLIENT_DYNAMIC_KV_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvstore/client/kv_client.h"

namespace ferry {
namespace kv {

class DynamicKvClient final : public KvClient {
 public:
  // InvalidArgument for bad options (as KvClient::Create, except that no nodes is allowed).
  static absl::StatusOr<std::unique_ptr<DynamicKvClient>> Create(const ClientOptions& options);

  // Replaces the node set (the same set again changes nothing). InvalidArgument for an empty or
  // duplicate node; the current set stays then.
  absl::Status SetNodes(std::vector<std::string> nodes);

  int64_t Put(absl::Span<const ClientObject> objects) override;
  std::vector<ClientGetResult> Get(absl::Span<const Hash128> keys,
                                   const Hash128& fingerprint) override;
  std::vector<GetIntoResult> GetInto(absl::Span<const Hash128> keys, const Hash128& fingerprint,
                                     const GetIntoDestination& destination) override;
  ExistsResult Exists(absl::Span<const Hash128> keys, const Hash128& fingerprint) override;
  int64_t Delete(absl::Span<const Hash128> keys) override;
  // Indices into the current set (node_names()); empty with no node.
  std::vector<int> NodesFor(const Hash128& key) const override;
  std::vector<NodeStatus> nodes() const override;
  std::vector<std::string> node_names() const;

 private:
  explicit DynamicKvClient(const ClientOptions& options) : options_(options) {}
  std::shared_ptr<KvClient> current() const;

  const ClientOptions options_;
  absl::Mutex set_mu_;  // one SetNodes at a time (the last one called wins)
  mutable absl::Mutex mu_;
  std::vector<std::string> nodes_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<KvClient> client_ ABSL_GUARDED_BY(mu_);  // null: no node
};

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_CLIENT_DYNAMIC_KV_CLIENT_H_
