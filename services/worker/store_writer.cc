#include "services/worker/store_writer.h"

#include <algorithm>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"

namespace ferry {

StoreWriter::StoreWriter(kv::KvClient* client, KvBlockPool* pool, const Hash128& fingerprint,
                         WorkerMetrics* metrics, const StoreWriterOptions& options)
    : client_(client),
      pool_(pool),
      fingerprint_(fingerprint),
      metrics_(metrics),
      options_(options),
      block_bytes_(static_cast<int64_t>(pool->layout().block_bytes())),
      layout_tag_(pool->layout().Tag()) {
  staging_ = options.staging;
  if (staging_ == nullptr) {
    auto in_place = KvStaging::InPlace(pool);
    CHECK_OK(in_place.status());
    own_staging_ = *std::move(in_place);
    staging_ = own_staging_.get();
  }
  CHECK(&staging_->pool() == pool) << "the store writer's staging is another pool's";
  thread_ = std::thread([this] { Loop(); });
}

StoreWriter::~StoreWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void StoreWriter::Offer(absl::Span<const ComputedBlock> blocks, kv::TrafficClass traffic_class,
                        uint32_t retention_floor_s) {
  int64_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const ComputedBlock& b : blocks) {
      const int64_t bytes = static_cast<int64_t>(queue_.size() + 1) * block_bytes_;
      if (stopping_ || bytes > options_.max_queued_bytes ||
          !pool_->AddRef(absl::MakeConstSpan(&b.block, 1)).ok()) {
        ++dropped;
        continue;
      }
      queue_.push_back(Item{b.hash, b.block, traffic_class, retention_floor_s});
    }
    const int64_t queued_bytes = static_cast<int64_t>(queue_.size()) * block_bytes_;
    // Under the lock: set after it, a writer that emptied the queue meanwhile would be overwritten
    // with this stale figure, and the gauge would say bytes wait when none do.
    metrics_->StoreWriteQueueBytes(queued_bytes);
  }
  cv_.Signal();
  if (dropped > 0) metrics_->StoreWriteBlocks("dropped", dropped);
}

bool StoreWriter::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time give_up = absl::Now() + timeout;
  while (!(queue_.empty() && !writing_) && !cv_.WaitWithDeadline(&mu_, give_up)) {
  }
  return queue_.empty() && !writing_;
}

void StoreWriter::Loop() {
  mu_.Lock();
  while (true) {
    while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) break;  // stopping, everything written
    std::vector<Item> batch;
    while (!queue_.empty() && static_cast<int64_t>(batch.size()) < options_.batch_blocks) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    writing_ = true;
    metrics_->StoreWriteQueueBytes(static_cast<int64_t>(queue_.size() + batch.size()) *
                                   block_bytes_);
    mu_.Unlock();
    Write(std::move(batch));
    mu_.Lock();
    writing_ = false;
    metrics_->StoreWriteQueueBytes(static_cast<int64_t>(queue_.size()) * block_bytes_);
    cv_.SignalAll();  // Flush
  }
  mu_.Unlock();
}

void StoreWriter::Release(const Item& item) {
  CHECK_OK(pool_->Release(absl::MakeConstSpan(&item.block, 1)));
}

void StoreWriter::Remember(const Hash128& hash, uint32_t retention_floor_s) {
  auto [it, inserted] = recent_.emplace(hash, retention_floor_s);
  if (!inserted) {
    it->second = std::max(it->second, retention_floor_s);
    return;
  }
  recent_order_.push_back(hash);
  while (recent_order_.size() > options_.recent_hashes) {
    recent_.erase(recent_order_.front());
    recent_order_.pop_front();
  }
}

void StoreWriter::Write(std::vector<Item> batch) {
  // What was written (or seen present) lately with at least the floor wanted is not asked about
  // again; nor is a hash twice (the first goes, with the highest floor asked for).
  std::vector<Item> fresh;
  absl::flat_hash_map<Hash128, size_t> seen;  // hash -> its index in `fresh`
  int64_t skipped = 0;
  for (const Item& item : batch) {
    auto known = recent_.find(item.hash);
    if (known != recent_.end() && known->second >= item.retention_floor_s) {
      Release(item);
      ++skipped;
      continue;
    }
    auto [at, inserted] = seen.emplace(item.hash, fresh.size());
    if (!inserted) {
      Item& first = fresh[at->second];
      first.retention_floor_s = std::max(first.retention_floor_s, item.retention_floor_s);
      Release(item);
      ++skipped;
      continue;
    }
    fresh.push_back(item);
  }
  if (fresh.empty()) {
    metrics_->StoreWriteBlocks("present", skipped);
    return;
  }
  std::vector<Hash128> keys;
  for (const Item& item : fresh) keys.push_back(item.hash);
  const kv::ExistsResult present = client_->Exists(keys, fingerprint_);
  // To put: the absent ones first, then those present with a lower floor than wanted.
  std::vector<Item> missing, extend;
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (i >= present.present.size() || !present.present[i]) {
      missing.push_back(fresh[i]);
      continue;
    }
    const uint32_t floor = i < present.retention_floor_s.size() ? present.retention_floor_s[i] : 0;
    if (floor < fresh[i].retention_floor_s) {
      extend.push_back(fresh[i]);
      continue;
    }
    Remember(fresh[i].hash, floor);
    Release(fresh[i]);
    ++skipped;
  }
  if (skipped > 0) metrics_->StoreWriteBlocks("present", skipped);
  const int64_t absent = static_cast<int64_t>(missing.size());
  missing.insert(missing.end(), extend.begin(), extend.end());
  if (missing.empty()) return;
  // The values are the blocks' host bytes: the blocks are full and referenced, so nothing writes
  // them.
  std::vector<BlockId> ids;
  for (const Item& item : missing) ids.push_back(item.block);
  auto host = staging_->Export(ids);
  if (!host.ok()) {
    // The staging area is full (or a copy failed): this batch is not written, as with a store
    // that is down; the request never waits for it.
    LOG(WARNING) << "KV store writes: " << host.status();
    for (const Item& item : missing) Release(item);
    metrics_->StoreWriteBlocks("failed", static_cast<int64_t>(missing.size()));
    return;
  }
  std::vector<kv::ClientObject> objects;
  for (size_t i = 0; i < missing.size(); ++i) {
    const Item& item = missing[i];
    const MemorySpan& span = (*host)->spans()[i];
    kv::ClientObject o;
    o.key = item.hash;
    o.meta.fingerprint = fingerprint_;
    o.meta.layout_tag = layout_tag_;
    o.meta.token_count = static_cast<uint32_t>(pool_->layout().block_tokens);
    o.meta.traffic_class = item.traffic_class;
    o.meta.retention_floor_s = item.retention_floor_s;
    o.value = absl::string_view(static_cast<const char*>(span.address), span.length);
    objects.push_back(o);
  }
  const int64_t durable = client_->Put(objects);
  host->reset();  // the call has returned: nothing reads the values any more
  for (const Item& item : missing) Release(item);
  const int64_t n = static_cast<int64_t>(missing.size());
  if (durable == n) {
    // (A lower bound: when it is short, which ones failed is unknown, and none is remembered.)
    for (const Item& item : missing) Remember(item.hash, item.retention_floor_s);
  }
  // When the call stored only some, which is unknown: the absent ones count first.
  const int64_t written = std::min(durable, absent);
  metrics_->StoreWriteBlocks("written", written);
  if (durable > written) metrics_->StoreWriteBlocks("extended", durable - written);
  if (durable < n) metrics_->StoreWriteBlocks("failed", n - durable);
  metrics_->StoreWrittenBytes(durable * block_bytes_);
}

}  // namespace ferry
