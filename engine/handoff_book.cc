#include "engine/handoff_book.h"

#include <algorithm>
#include <utility>

namespace ferry {

HandoffBook::~HandoffBook() { DropAll(); }

void HandoffBook::DropAll() {
  for (auto& [id, held] : held_) kv_->Release(&held.tables, /*trim=*/false);
  held_.clear();
}

void HandoffBook::Hold(const std::string& id, KvTables tables) {
  held_[id] = Held{std::move(tables), clock_->Monotonic() + ttl_};
}

const KvTables* HandoffBook::Find(const std::string& id) const {
  auto it = held_.find(id);
  return it == held_.end() ? nullptr : &it->second.tables;
}

bool HandoffBook::Drop(const std::string& id) {
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  kv_->Release(&it->second.tables, /*trim=*/false);
  held_.erase(it);
  return true;
}

std::vector<std::string> HandoffBook::Expired() const {
  std::vector<std::string> expired;
  if (held_.empty()) return expired;
  const absl::Duration now = clock_->Monotonic();
  for (const auto& [id, held] : held_) {
    if (held.expires <= now) expired.push_back(id);
  }
  return expired;
}

absl::Duration HandoffBook::NextExpiry() const {
  absl::Duration next = absl::InfiniteDuration();
  for (const auto& [id, held] : held_) next = std::min(next, held.expires);
  return next;
}

}  // namespace ferry
