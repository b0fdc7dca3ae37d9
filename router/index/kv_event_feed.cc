#include "router/index/kv_event_feed.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace ferry {

namespace {

void Hashes(const v1::KvEvent& event, std::vector<Hash128>* out) {
  out->clear();
  out->reserve(event.block_hashes_size());
  for (const v1::Hash128& h : event.block_hashes()) out->push_back(Hash128{h.lo(), h.hi()});
}

// A snapshot (or a part of one): every block in its STORED events.
void StoreSnapshot(const v1::WorkerStatus& status, int slot, KvIndex* index) {
  std::vector<Hash128> hashes;
  for (const v1::KvEvent& e : status.kv_events()) {
    if (e.type() != v1::KV_EVENT_TYPE_STORED) continue;
    Hashes(e, &hashes);
    index->Stored(slot, hashes, e.window_layers());
  }
}

}  // namespace

KvEventFeed::Result KvEventFeed::Apply(const v1::WorkerStatus& status, std::string* why) {
  if (status.snapshot()) {
    index_->Cleared(slot_);
    StoreSnapshot(status, slot_, index_);
    synced_ = true;
    sequence_ = status.sequence();
    incarnation_ = status.incarnation();
    ++snapshots_;
    return Result::kApplied;
  }
  auto gap = [&](std::string reason) {
    ++gaps_;
    if (why != nullptr) *why = std::move(reason);
    return Result::kGap;
  };
  if (!synced_) return gap("no snapshot yet");
  if (status.incarnation() != incarnation_) {
    return gap(absl::StrCat("incarnation ", status.incarnation(), " follows ", incarnation_,
                            " without a snapshot"));
  }
  if (status.snapshot_continues()) {
    if (status.sequence() != sequence_) {
      return gap(
          absl::StrCat("a snapshot part at sequence ", status.sequence(), " after ", sequence_));
    }
    StoreSnapshot(status, slot_, index_);
    return Result::kApplied;
  }
  uint64_t count = 0;
  for (const v1::KvEvent& e : status.kv_events()) {
    if (e.type() != v1::KV_EVENT_TYPE_CLEARED) count += e.block_hashes_size();
  }
  if (status.sequence() < sequence_ || status.sequence() - sequence_ != count) {
    return gap(absl::StrCat("sequence ", sequence_, " -> ", status.sequence(), " with ", count,
                            " events"));
  }
  std::vector<Hash128> hashes;
  for (const v1::KvEvent& e : status.kv_events()) {
    switch (e.type()) {
      case v1::KV_EVENT_TYPE_STORED:
        Hashes(e, &hashes);
        index_->Stored(slot_, hashes, e.window_layers());
        break;
      case v1::KV_EVENT_TYPE_EVICTED:
        Hashes(e, &hashes);
        index_->Evicted(slot_, hashes, e.window_layers());
        break;
      case v1::KV_EVENT_TYPE_CLEARED:
        index_->Cleared(slot_);
        break;
      default:
        break;
    }
  }
  sequence_ = status.sequence();
  return Result::kApplied;
}

v1::WatchRequest KvEventFeed::resume() const {
  v1::WatchRequest request;
  if (synced_) {
    request.set_after_sequence(sequence_);
    request.set_incarnation(incarnation_);
  }
  return request;
}

void KvEventFeed::Reset() {
  index_->Cleared(slot_);
  synced_ = false;
  sequence_ = 0;
  incarnation_ = 0;
}

}  // namespace ferry
