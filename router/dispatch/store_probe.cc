#include "router/dispatch/store_probe.h"

#include <utility>

namespace ferry {

StoreProbe::StoreProbe(std::unique_ptr<kv::KvClient> client, int64_t max_queued,
                       std::function<void(bool)> counted)
    : client_(std::move(client)), max_queued_(max_queued), counted_(std::move(counted)) {
  thread_ = std::thread([this] { Run(); });
}

StoreProbe::~StoreProbe() {
  std::deque<Item> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  thread_.join();
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
  }
  for (Item& item : left) item.done(std::nullopt);
}

void StoreProbe::Probe(std::vector<Hash128> chain, const Hash128& fingerprint,
                       std::function<void(std::optional<int64_t>)> done) {
  {
    absl::MutexLock lock(&mu_);
    if (!chain.empty() && !stopping_ && static_cast<int64_t>(queue_.size()) < max_queued_) {
      queue_.push_back(Item{std::move(chain), fingerprint, std::move(done)});
      cv_.Signal();
      return;
    }
  }
  if (!chain.empty() && counted_) counted_(false);
  done(std::nullopt);
}

void StoreProbe::Run() {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (stopping_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    const int64_t prefix = client_->Exists(item.chain, item.fingerprint).prefix;
    if (counted_) counted_(true);
    item.done(prefix);
  }
}

}  // namespace ferry
