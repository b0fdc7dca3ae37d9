// KvStore::Impl's compaction (kv_store_impl.h), run by the writer thread between groups and by
// Compact(): expired objects swept from the index; sealed segments mostly dead rewritten (their
// live objects and the tombstones an older segment still needs appended at the head) and
// removed; over capacity, the oldest segments compacted the same way, keeping only what was read
// since it was written (at most half a segment), until the files are under the low watermark.

#include <algorithm>
#include <iterator>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/common/status.h"
#include "kvstore/kv_store_impl.h"

namespace ferry {
namespace kv {

using kv_store_internal::Entry;
using kv_store_internal::ReadRecordInto;
using kv_store_internal::Segment;

void KvStore::Impl::SweepExpired() {
  absl::MutexLock lock(&mu);
  const int64_t now = NowUs();
  for (auto it = index.begin(); it != index.end();) {
    auto next = std::next(it);
    if (Expired(it->second, now)) {
      RemoveEntry(it);
      ++stats.expired;
    }
    it = next;
  }
}

absl::Status KvStore::Impl::CompactSegment(uint32_t id, bool capacity) {
  std::shared_ptr<Segment> victim;
  std::vector<Entry> live;
  bool older_exists = false;
  {
    absl::MutexLock lock(&mu);
    auto sit = segments.find(id);
    if (sit == segments.end()) return absl::OkStatus();
    victim = sit->second;
    older_exists = sit != segments.begin();
    absl::flat_hash_map<Hash128, bool> seen;
    for (const Hash128& key : victim->keys) {
      auto it = index.find(key);
      if (it == index.end() || it->second.segment != id || !seen.emplace(key, true).second) {
        continue;
      }
      live.push_back(it->second);
    }
  }
  // What stays: not expired; under capacity pressure only what was read since it was written,
  // most recently read first, up to half a segment.
  const int64_t now = NowUs();
  std::vector<Entry> keep, drop;
  for (const Entry& e : live) {
    if (Expired(e, now)) {
      drop.push_back(e);
    } else if (capacity && e.last_read_us <= e.written_us) {
      drop.push_back(e);
    } else {
      keep.push_back(e);
    }
  }
  if (capacity) {
    std::sort(keep.begin(), keep.end(),
              [](const Entry& a, const Entry& b) { return a.last_read_us > b.last_read_us; });
    uint64_t kept = 0;
    size_t n = 0;
    while (n < keep.size() && kept + keep[n].header.record_bytes() <=
                                  static_cast<uint64_t>(options.segment_bytes) / 2) {
      kept += keep[n++].header.record_bytes();
    }
    drop.insert(drop.end(), keep.begin() + n, keep.end());
    keep.resize(n);
  }
  // Rewrite what stays (checked on the way), and the tombstones an older segment still needs.
  std::vector<Pending> pending;
  Staged staged;
  int64_t rewritten = 0, rewritten_bytes = 0, corrupt = 0;
  for (const Entry& e : keep) {
    // The record as it is on disk (checked), written again at the tail.
    const uint64_t bytes = e.header.record_bytes();
    AlignedBuffer buf(bytes);
    RecordHeader on_disk;
    absl::Status read = ReadRecordInto(*victim->file, e.offset, e.header, buf.data(), &on_disk);
    if (!read.ok()) {
      ++corrupt;
      drop.push_back(e);
      continue;
    }
    char* record = buf.data();
    RETURN_IF_ERROR(Append(on_disk, record, std::move(buf), &pending, &staged));
    pending.back().last_read_us = e.last_read_us;
    ++rewritten;
    rewritten_bytes += static_cast<int64_t>(bytes);
  }
  if (older_exists) {
    for (const RecordHeader& t : victim->tombstones) {
      RETURN_IF_ERROR(AppendTombstone(t, &pending, &staged));
    }
  }
  RETURN_IF_ERROR(Flush(&staged));
  if (open != nullptr) RETURN_IF_ERROR(open->file->Sync());
  // Apply moves the kept entries; the dropped ones leave the index with the file.
  {
    absl::MutexLock lock(&mu);
    for (const Entry& e : drop) {
      auto it = index.find(e.header.key);
      if (it != index.end() && it->second.segment == id) {
        RemoveEntry(it);
        if (Expired(e, now)) {
          ++stats.expired;
        } else {
          ++stats.evicted;
          stats.evicted_bytes += static_cast<int64_t>(e.header.record_bytes());
        }
      }
    }
    stats.corrupt_reads += corrupt;
    stats.rewritten += rewritten;
    stats.rewritten_bytes += rewritten_bytes;
    ++stats.compactions;
  }
  if (!pending.empty()) Apply(pending);
  {
    absl::MutexLock lock(&mu);
    segments.erase(id);
  }
  RETURN_IF_ERROR(fs->Remove(victim->path));
  return fs->SyncDir(dir);
}

absl::Status KvStore::Impl::Maintain(bool full) {
  const int64_t now = NowUs();
  if (full || now - last_sweep_us > 60'000'000) {
    SweepExpired();
    last_sweep_us = now;
  }
  // Dead space: sealed segments at most half live (all of them when asked: any dead space).
  while (true) {
    uint32_t victim = 0;
    bool found = false;
    {
      absl::MutexLock lock(&mu);
      bool older = false;
      for (const auto& [id, seg] : segments) {
        if (seg->sealed && seg != open) {
          const int64_t tomb =
              older ? static_cast<int64_t>(seg->tombstones.size() * kDirectIoAlignment) : 0;
          const int64_t needed = seg->live_bytes + tomb + static_cast<int64_t>(kSegmentHeaderBytes);
          const int64_t on_disk = static_cast<int64_t>(seg->file_bytes);
          // At least half dead, or when asked, at least a tenth (the footer is ~2%).
          if (full ? needed * 10 < on_disk * 9 : needed * 2 < on_disk) {
            victim = id;
            found = true;
            break;
          }
        }
        older = true;
      }
    }
    if (!found) break;
    RETURN_IF_ERROR(CompactSegment(victim, /*capacity=*/false));
  }
  // Capacity: the oldest segment first, down to 90% of capacity.
  bool over = false;
  {
    absl::MutexLock lock(&mu);
    over = TotalFileBytes() > options.capacity_bytes;
  }
  while (over) {
    uint32_t victim = 0;
    {
      absl::MutexLock lock(&mu);
      if (TotalFileBytes() <= options.capacity_bytes * 9 / 10) break;
      auto it = segments.begin();
      if (it == segments.end() || it->second == open) break;
      victim = it->first;
    }
    RETURN_IF_ERROR(CompactSegment(victim, /*capacity=*/true));
  }
  return absl::OkStatus();
}

}  // namespace kv
}  // namespace ferry
