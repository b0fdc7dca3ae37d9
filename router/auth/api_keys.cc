#include "router/auth/api_keys.h"

#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/common/shared_token.h"

namespace ferry {
namespace {

bool ValidTenantName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

bool ValidKey(const std::string& key) {
  if (key.size() < 16 || key.size() > 256) return false;
  for (char c : key) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

const char* TrafficClassName(v1::TrafficClass c) {
  switch (c) {
    case v1::TRAFFIC_CLASS_AGENT:
      return "agent";
    case v1::TRAFFIC_CLASS_BATCH:
      return "batch";
    default:
      return "chat";
  }
}

absl::StatusOr<v1::TrafficClass> ParseTrafficClass(absl::string_view name) {
  if (name == "chat") return v1::TRAFFIC_CLASS_CHAT;
  if (name == "agent") return v1::TRAFFIC_CLASS_AGENT;
  if (name == "batch") return v1::TRAFFIC_CLASS_BATCH;
  return absl::InvalidArgumentError("a traffic class is chat, agent or batch");
}

absl::StatusOr<std::unique_ptr<const ApiKeys>> ApiKeys::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the key file ", path));
  std::ostringstream text;
  text << in.rdbuf();
  auto keys = Parse(text.str());
  if (!keys.ok()) {
    return absl::Status(keys.status().code(),
                        absl::StrCat("key file ", path, ": ", keys.status().message()));
  }
  return keys;
}

absl::StatusOr<std::unique_ptr<const ApiKeys>> ApiKeys::Parse(absl::string_view json) {
  auto bad = [](const std::string& why) { return absl::InvalidArgumentError(why); };
  const nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
  if (!doc.is_object()) return bad("not a JSON object");
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() != "tenants" && it.key() != "keys") {
      return bad(absl::StrCat("unknown field '", it.key(), "' (tenants, keys)"));
    }
  }
  std::unique_ptr<ApiKeys> out(new ApiKeys());
  std::random_device random;
  for (int i = 0; i < 4; ++i) {
    const uint32_t r = random();
    out->secret_.append(reinterpret_cast<const char*>(&r), sizeof(r));
  }
  std::map<std::string, size_t> index;
  if (doc.contains("tenants")) {
    const nlohmann::json& tenants = doc["tenants"];
    if (!tenants.is_object()) return bad("'tenants' must be an object of tenants by name");
    for (auto it = tenants.begin(); it != tenants.end(); ++it) {
      Tenant t;
      t.name = it.key();
      if (!ValidTenantName(t.name)) {
        return bad(absl::StrCat("tenant '", t.name,
                                "': a name is 1-64 of letters, digits, '.', '_' and '-'"));
      }
      const nlohmann::json& v = *it;
      if (!v.is_object()) return bad(absl::StrCat("tenant '", t.name, "' must be an object"));
      for (auto f = v.begin(); f != v.end(); ++f) {
        const std::string where = absl::StrCat("tenant '", t.name, "': '", f.key(), "'");
        if (f.key() == "traffic_class") {
          auto c = ParseTrafficClass(f->is_string() ? f->get<std::string>() : "");
          if (!c.ok()) return bad(where + " must be chat, agent or batch");
          t.traffic_class = *c;
        } else if (f.key() == "traffic_class_header") {
          if (!f->is_boolean()) return bad(where + " must be true or false");
          t.traffic_class_header = f->get<bool>();
        } else if (f.key() == "requests_per_minute" || f.key() == "tokens_per_minute") {
          if (!f->is_number() || !(f->get<double>() >= 0)) {
            return bad(where + " must be a number >= 0");
          }
          (f.key() == "requests_per_minute" ? t.requests_per_minute : t.tokens_per_minute) =
              f->get<double>();
        } else {
          return bad(where +
                     " is unknown (traffic_class, traffic_class_header, requests_per_minute, "
                     "tokens_per_minute)");
        }
      }
      t.cache_salt = t.name;
      index[t.name] = out->tenants_.size();
      out->tenants_.push_back(std::move(t));
    }
  }
  if (!doc.contains("keys") || !doc["keys"].is_array()) {
    return bad("'keys' must be a list of {\"key\", \"tenant\"}");
  }
  const nlohmann::json& keys = doc["keys"];
  for (size_t i = 0; i < keys.size(); ++i) {
    const nlohmann::json& k = keys[i];
    const std::string where = absl::StrCat("keys[", i, "]");
    if (!k.is_object() || !k.contains("key") || !k["key"].is_string() || !k.contains("tenant") ||
        !k["tenant"].is_string() || k.size() != 2) {
      return bad(where + " must be {\"key\": ..., \"tenant\": ...}");
    }
    Entry e;
    e.key = k["key"].get<std::string>();
    if (!ValidKey(e.key)) {
      return bad(where + ": a key is 16-256 bytes of printable ASCII without spaces");
    }
    const std::string tenant = k["tenant"].get<std::string>();
    auto t = index.find(tenant);
    if (t == index.end()) {
      if (!ValidTenantName(tenant)) return bad(where + ": not a valid tenant name");
      Tenant fresh;  // a tenant named only by its keys: defaults, no limits
      fresh.name = tenant;
      fresh.cache_salt = tenant;
      t = index.emplace(tenant, out->tenants_.size()).first;
      out->tenants_.push_back(std::move(fresh));
    }
    e.tenant = t->second;
    const Hash128 digest = out->Digest(e.key);
    if (out->by_digest_.contains(digest)) return bad(where + " repeats an earlier key");
    out->by_digest_[digest] = out->entries_.size();
    out->entries_.push_back(std::move(e));
  }
  return std::unique_ptr<const ApiKeys>(std::move(out));
}

Hash128 ApiKeys::Digest(absl::string_view key) const {
  return Xxh3Hash128(absl::StrCat(secret_, key));
}

const Tenant* ApiKeys::Find(absl::string_view key) const {
  auto it = by_digest_.find(Digest(key));
  if (it == by_digest_.end()) return nullptr;
  const Entry& e = entries_[it->second];
  if (!ConstantTimeEqual(e.key, key)) return nullptr;
  return &tenants_[e.tenant];
}

}  // namespace ferry
