#include "kvstore/client/dynamic_kv_client.h"

#include <algorithm>
#include <utility>

namespace ferry {
namespace kv {

absl::StatusOr<std::unique_ptr<DynamicKvClient>> DynamicKvClient::Create(
    const ClientOptions& options) {
  // The options are checked as KvClient::Create checks them, over a placeholder node.
  ClientOptions check = options;
  check.nodes = {"placeholder:1"};
  check.replication = 1;
  if (options.replication < 1) {
    return absl::InvalidArgumentError("kv client: replication must be at least 1");
  }
  if (absl::StatusOr<std::unique_ptr<KvClient>> c = KvClient::Create(check); !c.ok()) {
    return c.status();
  }
  std::unique_ptr<DynamicKvClient> client(new DynamicKvClient(options));
  if (!options.nodes.empty()) {
    if (absl::Status s = client->SetNodes(options.nodes); !s.ok()) return s;
  }
  return client;
}

absl::Status DynamicKvClient::SetNodes(std::vector<std::string> nodes) {
  absl::MutexLock set_lock(&set_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (nodes == nodes_) return absl::OkStatus();
  }
  std::shared_ptr<KvClient> client;
  if (!nodes.empty()) {
    ClientOptions o = options_;
    o.nodes = nodes;
    o.replication = std::min(options_.replication, static_cast<int>(nodes.size()));
    absl::StatusOr<std::unique_ptr<KvClient>> c = KvClient::Create(o);
    if (!c.ok()) return c.status();
    client = *std::move(c);
  }
  absl::MutexLock lock(&mu_);
  nodes_ = std::move(nodes);
  client_ = std::move(client);
  return absl::OkStatus();
}

std::shared_ptr<KvClient> DynamicKvClient::current() const {
  absl::MutexLock lock(&mu_);
  return client_;
}

std::vector<std::string> DynamicKvClient::node_names() const {
  absl::MutexLock lock(&mu_);
  return nodes_;
}

int64_t DynamicKvClient::Put(absl::Span<const ClientObject> objects) {
  std::shared_ptr<KvClient> c = current();
  return c == nullptr ? 0 : c->Put(objects);
}

std::vector<ClientGetResult> DynamicKvClient::Get(absl::Span<const Hash128> keys,
                                                  const Hash128& fingerprint) {
  std::shared_ptr<KvClient> c = current();
  if (c == nullptr) return std::vector<ClientGetResult>(keys.size());
  return c->Get(keys, fingerprint);
}

std::vector<GetIntoResult> DynamicKvClient::GetInto(absl::Span<const Hash128> keys,
                                                    const Hash128& fingerprint,
                                                    const GetIntoDestination& destination) {
  std::shared_ptr<KvClient> c = current();
  if (c == nullptr) return std::vector<GetIntoResult>(keys.size());
  return c->GetInto(keys, fingerprint, destination);
}

ExistsResult DynamicKvClient::Exists(absl::Span<const Hash128> keys, const Hash128& fingerprint) {
  std::shared_ptr<KvClient> c = current();
  if (c == nullptr) {
    ExistsResult none;
    none.present.assign(keys.size(), false);
    none.retention_floor_s.assign(keys.size(), 0);
    return none;
  }
  return c->Exists(keys, fingerprint);
}

int64_t DynamicKvClient::Delete(absl::Span<const Hash128> keys) {
  std::shared_ptr<KvClient> c = current();
  return c == nullptr ? 0 : c->Delete(keys);
}

std::vector<int> DynamicKvClient::NodesFor(const Hash128& key) const {
  std::shared_ptr<KvClient> c = current();
  return c == nullptr ? std::vector<int>() : c->NodesFor(key);
}

std::vector<NodeStatus> DynamicKvClient::nodes() const {
  std::shared_ptr<KvClient> c = current();
  return c == nullptr ? std::vector<NodeStatus>() : c->nodes();
}

}  // namespace kv
}  // namespace ferry
