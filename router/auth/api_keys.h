// API keys and the tenants they belong to (ARCHITECTURE.md §8): the router's key file, read at
// start and again on SIGHUP.
//
//   {
//     "tenants": {
//       "acme": {"traffic_class": "agent", "requests_per_minute": 600,
//                "tokens_per_minute": 2000000},
//       "lab":  {"traffic_class": "batch", "traffic_class_header": true}
//     },
//     "keys": [{"key": "sk-acme-0123456789abcdef", "tenant": "acme"},
//              {"key": "sk-lab-0123456789abcdef", "tenant": "lab"}]
//   }
//
// A tenant's name is 1-64 of a-z, A-Z, 0-9, '.', '_', '-' (it labels metrics); its traffic class
// (chat, agent, batch; default chat) goes to the workers and the KV store, where it sets how long
// the tenant's KV is kept (by default 7 days chat, 3 days agent, 1 day batch); with
// "traffic_class_header": true a request may choose its own class in an x-ferry-traffic-class
// header (else such a header is refused). A limit of 0 or none is no limit. Its cache salt (mixed
// into every block hash, so that no cache entry is shared across tenants) is its name. A key is
// 16-256 bytes of printable ASCII without spaces, and belongs to one tenant; keys are never logged,
// and a presented key is compared with the stored one in constant time (the lookup goes through a
// keyed hash, so its timing tells nothing useful).
//
// Immutable after Load; thread-safe.

#ifndef FERRY_ROUTER_AUTH_API_KEYS_H_
#define FERRY_ROUTER_AUTH_API_KEYS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/common/hash128.h"
#include "ferry/v1/common.pb.h"

namespace ferry {

struct Tenant {
  std::string name;
  ferry::v1::TrafficClass traffic_class = ferry::v1::TRAFFIC_CLASS_CHAT;
  bool traffic_class_header = false;  // requests may set their class (x-ferry-traffic-class)
  double requests_per_minute = 0;     // 0: no limit
  double tokens_per_minute = 0;       // prompt and completion tokens; 0: no limit
  std::string cache_salt;
};

// "chat", "agent", "batch".
const char* TrafficClassName(ferry::v1::TrafficClass c);
// The class named "chat", "agent" or "batch"; InvalidArgument otherwise.
absl::StatusOr<ferry::v1::TrafficClass> ParseTrafficClass(absl::string_view name);

class ApiKeys {
 public:
  // Errors name the file and what is wrong in it, never a key.
  static absl::StatusOr<std::unique_ptr<const ApiKeys>> Load(const std::string& path);
  static absl::StatusOr<std::unique_ptr<const ApiKeys>> Parse(absl::string_view json);

  // The tenant of `key`, or null.
  const Tenant* Find(absl::string_view key) const;

  size_t keys() const { return entries_.size(); }
  const std::vector<Tenant>& tenants() const { return tenants_; }

 private:
  ApiKeys() = default;
  Hash128 Digest(absl::string_view key) const;

  struct Entry {
    std::string key;
    size_t tenant;
  };
  std::string secret_;  // random per load: the digest is a keyed hash
  std::vector<Tenant> tenants_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<Hash128, size_t> by_digest_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_AUTH_API_KEYS_H_
