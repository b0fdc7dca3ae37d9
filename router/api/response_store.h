// The router's memory of OpenAI Responses (POST /v1/responses with store: true, the default):
// what GET /v1/responses/{id} returns, what DELETE /v1/responses/{id} removes, and the
// conversation a later request continues with previous_response_id (ResponsesConversation).
//
// Responses live in one router replica's memory only: another replica, or this one after a
// restart, answers 404 for them (a client behind several replicas needs sticky sessions, or sends
// the conversation as input items instead). OpenAI keeps responses 30 days; an in-memory store
// keeps them for `ttl` (default 1 hour: long enough for an agent's loop or a chat session, short
// enough that idle tenants give their memory back), and per tenant at most
// max_responses_per_tenant responses and max_bytes_per_tenant bytes, the oldest evicted first.
// Each entry holds its whole conversation, so a chain of N turns takes O(N^2) bytes across its
// entries; the byte bound evicts the older links first, and the newest one (the one continued)
// holds everything. Memory overall is bounded by the tenants' count times the per-tenant bound;
// tenants are the API keys' (configured, finite).
//
// A response is visible to its tenant only: another tenant's id is absent (404), never 403, so
// ids cannot be probed across tenants.

#ifndef FERRY_ROUTER_API_RESPONSE_STORE_H_
#define FERRY_ROUTER_API_RESPONSE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "router/api/api_request.h"
#include "router/api/conversation.h"

namespace ferry {

struct StoredResponse {
  std::string id;  // "resp_..."
  std::string tenant;
  absl::Time created;         // wall time; ResponseStore::Put sets it
  std::string response_json;  // the response object, as GET returns it
  // What a response continuing this one starts from: the previous conversation, this response's
  // input and its output as one assistant message. Instructions are not part of it (OpenAI does
  // not carry them over).
  std::vector<ApiMessage> conversation;
  size_t bytes = 0;  // ResponseStore::Put computes it (EntryBytes)
};

struct ResponseStoreOptions {
  size_t max_responses_per_tenant = 1000;
  size_t max_bytes_per_tenant = size_t{64} << 20;
  absl::Duration ttl = absl::Hours(1);
  Clock* clock = nullptr;  // null: RealClock(); must outlive the store
};

// What the bounds did, since the store was made (for the router's metrics: STYLE.md §18).
struct ResponseStoreStats {
  uint64_t evicted = 0;  // entries dropped to keep a tenant within its count or byte bound
  uint64_t expired = 0;  // entries dropped after their TTL
  uint64_t refused = 0;  // Puts refused: an entry larger than the byte bound
};

// Thread-safe (one mutex; every operation is short and copies in or out).
class ResponseStore {
 public:
  explicit ResponseStore(ResponseStoreOptions options = {});

  ResponseStore(const ResponseStore&) = delete;
  ResponseStore& operator=(const ResponseStore&) = delete;

  // Stores `response` under (tenant, id), replacing an entry of the same id; sets its `created`
  // and `bytes`. Expired entries (of every tenant) are dropped, then the tenant's oldest ones
  // until it is within both bounds. Returns false, storing nothing, when the entry alone is larger
  // than max_bytes_per_tenant (or max_responses_per_tenant is 0).
  bool Put(StoredResponse response);

  // A copy of the tenant's response `id`; nullopt when there is none, it expired, or it is
  // another tenant's.
  std::optional<StoredResponse> Get(const std::string& tenant, const std::string& id) const;

  // Removes the tenant's response `id`; false when there was none (or it expired).
  bool Delete(const std::string& tenant, const std::string& id);

  // What the tenant holds now (live and not yet pruned entries): for metrics and tests.
  size_t Count(const std::string& tenant) const;
  size_t Bytes(const std::string& tenant) const;
  ResponseStoreStats stats() const;

  // The memory an entry is charged: its strings and the conversation's, and the structures'.
  static size_t EntryBytes(const StoredResponse& response);

 private:
  struct Entry {
    StoredResponse response;
    absl::Duration stored_at;  // the clock's Monotonic(): TTLs never jump with the wall clock
  };
  // One tenant's entries, oldest first (insertion order is expiry order: one TTL for all).
  struct Tenant {
    std::list<Entry> entries;
    std::unordered_map<std::string, std::list<Entry>::iterator> by_id;
    size_t bytes = 0;
  };

  bool Expired(const Entry& entry, absl::Duration now) const;
  void Erase(Tenant* tenant, std::list<Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ResponseStoreOptions options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Tenant> tenants_ ABSL_GUARDED_BY(mu_);
  ResponseStoreStats stats_ ABSL_GUARDED_BY(mu_);
};

// The conversation of a Responses request, in place: when request->previous_response_id is set,
// `*history` = that response's stored conversation + the request's own messages (NotFound, 404,
// "Previous response with id '...' not found.", param previous_response_id, code
// previous_response_not_found, when the tenant has no such response); else its own messages.
// Then request->messages = [system: request->instructions, when not empty] + *history. The
// writer stores *history plus its answer for the next turn.
ApiError ResponsesConversation(const ResponseStore& store, const std::string& tenant,
                               ApiRequest* request, std::vector<ApiMessage>* history);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_RESPONSE_STORE_H_
