#include "router/api/response_store.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry {

ResponseStore::ResponseStore(ResponseStoreOptions options)
    : options_(options), clock_(options.clock != nullptr ? options.clock : &RealClock()) {}

size_t ResponseStore::EntryBytes(const StoredResponse& r) {
  size_t bytes = sizeof(Entry) + r.id.size() + r.tenant.size() + r.response_json.size();
  bytes += r.id.size();  // the index's key
  for (const ApiMessage& m : r.conversation) {
    bytes += sizeof(ApiMessage) + m.name.size() + m.reasoning.size() + m.tool_call_id.size();
    for (const ApiContentPart& p : m.content) {
      bytes += sizeof(ApiContentPart) + p.text.size();
      if (p.image.has_value()) {
        bytes += p.image->bytes.size() + p.image->url.size() + p.image->media_type.size() +
                 p.image->param.size();
      }
    }
    for (const ApiToolCall& c : m.tool_calls) {
      bytes += sizeof(ApiToolCall) + c.id.size() + c.name.size() + c.arguments.size();
    }
  }
  return bytes;
}

bool ResponseStore::Expired(const Entry& entry, absl::Duration now) const {
  return now - entry.stored_at >= options_.ttl;
}

void ResponseStore::Erase(Tenant* tenant, std::list<Entry>::iterator it) {
  tenant->bytes -= it->response.bytes;
  tenant->by_id.erase(it->response.id);
  tenant->entries.erase(it);
}

bool ResponseStore::Put(StoredResponse response) {
  response.bytes = EntryBytes(response);
  response.created = clock_->Now();
  const absl::Duration now = clock_->Monotonic();
  absl::MutexLock lock(&mu_);
  if (response.bytes > options_.max_bytes_per_tenant || options_.max_responses_per_tenant == 0) {
    ++stats_.refused;
    return false;
  }
  // Expired entries go, every tenant's (a tenant that stopped calling gives its memory back).
  for (auto t = tenants_.begin(); t != tenants_.end();) {
    Tenant& other = t->second;
    while (!other.entries.empty() && Expired(other.entries.front(), now)) {
      Erase(&other, other.entries.begin());
      ++stats_.expired;
    }
    t = other.entries.empty() ? tenants_.erase(t) : std::next(t);
  }
  Tenant& tenant = tenants_[response.tenant];
  if (auto it = tenant.by_id.find(response.id); it != tenant.by_id.end()) {
    Erase(&tenant, it->second);
  }
  while (!tenant.entries.empty() &&
         (tenant.entries.size() + 1 > options_.max_responses_per_tenant ||
          tenant.bytes + response.bytes > options_.max_bytes_per_tenant)) {
    Erase(&tenant, tenant.entries.begin());
    ++stats_.evicted;
  }
  tenant.bytes += response.bytes;
  const std::string id = response.id;
  tenant.entries.push_back(Entry{std::move(response), now});
  tenant.by_id[id] = std::prev(tenant.entries.end());
  return true;
}

std::optional<StoredResponse> ResponseStore::Get(const std::string& tenant,
                                                 const std::string& id) const {
  const absl::Duration now = clock_->Monotonic();
  absl::MutexLock lock(&mu_);
  auto t = tenants_.find(tenant);
  if (t == tenants_.end()) return std::nullopt;
  auto it = t->second.by_id.find(id);
  if (it == t->second.by_id.end() || Expired(*it->second, now)) return std::nullopt;
  return it->second->response;
}

bool ResponseStore::Delete(const std::string& tenant, const std::string& id) {
  const absl::Duration now = clock_->Monotonic();
  absl::MutexLock lock(&mu_);
  auto t = tenants_.find(tenant);
  if (t == tenants_.end()) return false;
  auto it = t->second.by_id.find(id);
  if (it == t->second.by_id.end()) return false;
  const bool live = !Expired(*it->second, now);
  if (!live) ++stats_.expired;
  Erase(&t->second, it->second);
  if (t->second.entries.empty()) tenants_.erase(t);
  return live;
}

size_t ResponseStore::Count(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto t = tenants_.find(tenant);
  return t == tenants_.end() ? 0 : t->second.entries.size();
}

size_t ResponseStore::Bytes(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto t = tenants_.find(tenant);
  return t == tenants_.end() ? 0 : t->second.bytes;
}

ResponseStoreStats ResponseStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

ApiError ResponsesConversation(const ResponseStore& store, const std::string& tenant,
                               ApiRequest* request, std::vector<ApiMessage>* history) {
  history->clear();
  if (!request->previous_response_id.empty()) {
    std::optional<StoredResponse> previous = store.Get(tenant, request->previous_response_id);
    if (!previous.has_value()) {
      return ApiError{
          absl::NotFoundError(absl::StrCat("Previous response with id '",
                                           request->previous_response_id, "' not found.")),
          "previous_response_id", "previous_response_not_found"};
    }
    *history = std::move(previous->conversation);
  }
  history->insert(history->end(), request->messages.begin(), request->messages.end());
  request->messages.clear();
  if (!request->instructions.empty()) {
    ApiMessage system;
    system.role = ApiRole::kSystem;
    system.content.push_back({request->instructions});
    request->messages.push_back(std::move(system));
  }
  request->messages.insert(request->messages.end(), history->begin(), history->end());
  return ApiError{absl::OkStatus(), "", ""};
}

}  // namespace ferry
