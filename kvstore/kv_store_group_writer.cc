// KvStore::Impl's writer thread (kv_store_impl.h): Put, Delete and Compact queue an Op and wait;
// the writer takes everything queued (up to max_group_bytes; a compaction alone), appends the
// group's records at the tail of the open segment (sealing a full one and starting the next),
// writes them in one gather write and one fdatasync, makes them visible in the index, and only
// then acknowledges every op of the group (group commit). Between groups it runs compaction
// (kv_store_compaction.cc).

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "kvstore/kv_store_impl.h"

namespace ferry {
namespace kv {

using kv_store_internal::Entry;
using kv_store_internal::Segment;

absl::Status KvStore::Impl::StartSegment() {
  auto seg = std::make_shared<Segment>();
  seg->id = next_segment++;
  seg->created_us = NowUs();
  seg->path = absl::StrCat(dir, "/", SegmentFileName(seg->id));
  ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                   fs->Open(seg->path, OpenMode::kCreate, options.direct_io));
  {
    absl::MutexLock lock(&mu);
    stats.direct_io = file->direct();
  }
  const std::string header = EncodeSegmentHeader({seg->id, seg->created_us});
  AlignedBuffer buf(kSegmentHeaderBytes);
  std::copy(header.begin(), header.end(), buf.data());
  RETURN_IF_ERROR(file->Write(0, buf.data(), kSegmentHeaderBytes));
  RETURN_IF_ERROR(file->Sync());
  RETURN_IF_ERROR(fs->SyncDir(dir));
  seg->file = std::move(file);
  seg->file_bytes = kSegmentHeaderBytes;
  {
    absl::MutexLock lock(&mu);
    segments[seg->id] = seg;
  }
  open = std::move(seg);
  tail = kSegmentHeaderBytes;
  return absl::OkStatus();
}

absl::Status KvStore::Impl::Seal() {
  std::vector<FooterEntry> entries = open->records;
  {
    absl::MutexLock lock(&mu);
    for (FooterEntry& e : entries) {
      auto it = index.find(e.header.key);
      if (it != index.end() && it->second.segment == open->id) {
        e.last_read_us = it->second.last_read_us;
      }
    }
  }
  const std::string footer = EncodeFooter(open->id, tail, entries);
  AlignedBuffer buf(footer.size());
  std::copy(footer.begin(), footer.end(), buf.data());
  RETURN_IF_ERROR(open->file->Write(tail, buf.data(), footer.size()));
  RETURN_IF_ERROR(open->file->Sync());
  {
    absl::MutexLock lock(&mu);
    open->file_bytes = tail + footer.size();
    open->sealed = true;
    open->records.clear();
    open->records.shrink_to_fit();
  }
  open.reset();
  return absl::OkStatus();
}

absl::Status KvStore::Impl::Flush(Staged* staged) {
  if (staged->bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(open->file->WriteV(tail - staged->bytes, staged->iov));
  staged->iov.clear();
  staged->owned.clear();
  staged->bytes = 0;
  return absl::OkStatus();
}

absl::Status KvStore::Impl::Append(const RecordHeader& h, char* record, AlignedBuffer owned,
                                   std::vector<Pending>* pending, Staged* staged) {
  const uint64_t bytes = h.record_bytes();
  if (open == nullptr) RETURN_IF_ERROR(StartSegment());
  if (tail + bytes > static_cast<uint64_t>(options.segment_bytes) && tail > kSegmentHeaderBytes) {
    // Full: what is staged goes to this segment, durably, before it is sealed.
    RETURN_IF_ERROR(Flush(staged));
    RETURN_IF_ERROR(open->file->Sync());
    Apply(*pending);
    pending->clear();
    RETURN_IF_ERROR(Seal());
    RETURN_IF_ERROR(StartSegment());
  }
  // One write per max_group_bytes at most.
  if (staged->bytes > 0 && staged->bytes + bytes > static_cast<uint64_t>(options.max_group_bytes)) {
    RETURN_IF_ERROR(Flush(staged));
  }
  EncodeRecordHeader(h, record);
  staged->iov.push_back({record, bytes});
  if (owned.size() > 0) staged->owned.push_back(std::move(owned));
  staged->bytes += bytes;
  FooterEntry e;
  e.header = h;
  e.offset = tail;
  open->records.push_back(e);
  pending->push_back({h, open->id, tail, 0});
  tail += bytes;
  return absl::OkStatus();
}

absl::Status KvStore::Impl::AppendTombstone(const RecordHeader& h, std::vector<Pending>* pending,
                                            Staged* staged) {
  RecordHeader t = h;
  t.tombstone = true;
  t.value_bytes = 0;
  t.value_checksum = Checksum("");
  AlignedBuffer buf(t.record_bytes());
  char* record = buf.data();
  std::fill(record, record + t.record_bytes(), '\0');
  return Append(t, record, std::move(buf), pending, staged);
}

// Makes durable records visible (under mu).
void KvStore::Impl::Apply(const std::vector<Pending>& pending) {
  absl::MutexLock lock(&mu);
  const int64_t now = NowUs();
  open->file_bytes = tail;
  for (const Pending& p : pending) {
    Segment& seg = *segments.at(p.segment);
    auto it = index.find(p.header.key);
    int64_t last_read = p.last_read_us;
    if (it != index.end()) {
      last_read = std::max(last_read, it->second.last_read_us);
      RemoveEntry(it);
    }
    if (p.header.tombstone) {
      seg.tombstones.push_back(p.header);
      continue;
    }
    seg.keys.push_back(p.header.key);
    Entry e;
    e.segment = p.segment;
    e.offset = p.offset;
    e.header = p.header;
    e.checksum_known = true;  // a Put's, or compaction's copy of a record it read
    e.written_us = now;
    e.last_read_us = last_read;
    AddEntry(e);
  }
}

void KvStore::Impl::RunGroup(std::vector<Op*>& ops) {
  std::vector<Pending> pending;
  Staged staged;
  absl::Status status;
  int64_t puts = 0, put_bytes = 0, deletes = 0, already_present = 0, conflicts = 0;
  // Keys put in this group (as their newest record has them), and keys deleted in it: the index,
  // applied after the group, does not show either yet.
  struct Written {
    uint32_t retention_floor_s;
    TrafficClass traffic_class;
    uint64_t checksum;
  };
  absl::flat_hash_map<Hash128, Written> in_group;
  absl::flat_hash_set<Hash128> deleted_in_group;
  for (Op* op : ops) {
    if (!status.ok()) break;
    if (op->kind == OpKind::kPut) {
      for (size_t i = 0; i < op->headers.size(); ++i) {
        RecordHeader& h = op->headers[i];
        auto present = [&](PutOutcome o, uint64_t kept_checksum) {
          op->outcomes[i] = o;
          op->kept_checksums[i] = kept_checksum;
          ++already_present;
          if (o == PutOutcome::kConflict) ++conflicts;
        };
        // A longer floor is written no shorter-lived than the object was.
        auto keep_class = [&](TrafficClass was) {
          if (options.ttl[static_cast<int>(was)] >
              options.ttl[static_cast<int>(h.meta.traffic_class)]) {
            h.meta.traffic_class = was;
          }
        };
        auto at = in_group.find(h.key);
        if (at != in_group.end()) {
          // Put earlier in this group: compared with that item, written only for a longer floor
          // (after the first, so it wins).
          if (at->second.checksum != h.value_checksum) {
            present(PutOutcome::kConflict, at->second.checksum);
            continue;
          }
          if (at->second.retention_floor_s >= h.meta.retention_floor_s) {
            present(PutOutcome::kPresent, h.value_checksum);
            continue;
          }
          present(PutOutcome::kFloorExtended, h.value_checksum);
          keep_class(at->second.traffic_class);
        } else if (!deleted_in_group.contains(h.key)) {
          // Content-addressed: a live object with the same bytes is enough unless this item asks
          // for a longer floor. Other bytes are never written over it (see Put). An object whose
          // checksum is unknown (its header could not be read: LearnChecksums logged why) is left
          // as it is.
          absl::MutexLock lock(&mu);
          auto it = index.find(h.key);
          if (it != index.end() && !Expired(it->second, NowUs())) {
            const Entry& live = it->second;
            if (live.checksum_known && live.header.value_checksum != h.value_checksum) {
              present(PutOutcome::kConflict, live.header.value_checksum);
              continue;
            }
            if (!live.checksum_known ||
                live.header.meta.retention_floor_s >= h.meta.retention_floor_s) {
              present(PutOutcome::kPresent, live.header.value_checksum);
              continue;
            }
            present(PutOutcome::kFloorExtended, live.header.value_checksum);
            keep_class(live.header.meta.traffic_class);
          }
        }
        in_group[h.key] = {h.meta.retention_floor_s, h.meta.traffic_class, h.value_checksum};
        h.seq = next_seq++;
        status = Append(h, op->records[i].data(), AlignedBuffer(), &pending, &staged);
        if (!status.ok()) break;
        ++puts;
        put_bytes += static_cast<int64_t>(h.value_bytes);
      }
    } else if (op->kind == OpKind::kDelete) {
      for (const Hash128& key : op->keys) {
        // Present (and not deleted earlier in this group), or put earlier in this group (the
        // tombstone then follows it).
        if (!in_group.contains(key)) {
          if (deleted_in_group.contains(key)) continue;
          absl::MutexLock lock(&mu);
          if (!index.contains(key)) continue;
        }
        in_group.erase(key);
        deleted_in_group.insert(key);
        ++op->deleted;
        RecordHeader h;
        h.key = key;
        h.seq = next_seq++;
        h.created_us = NowUs();
        status = AppendTombstone(h, &pending, &staged);
        if (!status.ok()) break;
        ++deletes;
      }
    }
  }
  if (status.ok()) status = Flush(&staged);
  if (status.ok() && open != nullptr) status = open->file->Sync();
  if (status.ok()) {
    if (!pending.empty()) Apply(pending);
    absl::MutexLock lock(&mu);
    stats.puts += puts;
    stats.put_bytes += put_bytes;
    stats.already_present += already_present;
    stats.key_conflicts += conflicts;
    stats.deletes += deletes;
    ++stats.group_commits;
  } else {
    // Nothing of this group is acknowledged; whatever reached the file is never indexed. The
    // segment is given up (sealed as it is, without footer) and writing resumes in a new one.
    LOG(ERROR) << "kv store " << dir << ": write failed: " << status;
    if (open != nullptr) {
      absl::MutexLock lock(&mu);
      open->sealed = true;
      open->records.clear();
      open.reset();
    }
  }
  for (Op* op : ops) {
    if (op->kind != OpKind::kCompact) op->status = status;
  }
}

absl::Status KvStore::Impl::Submit(Op* op) {
  {
    absl::MutexLock lock(&qmu);
    if (stopping) return absl::UnavailableError("the store is closing");
    queue.push_back(op);
  }
  qcv.Signal();
  absl::MutexLock lock(&qmu);
  while (!op->done) done_cv.Wait(&qmu);
  return op->status;
}

void KvStore::Impl::WriterLoop() {
  while (true) {
    std::vector<Op*> group;
    bool exit = false;
    {
      absl::MutexLock lock(&qmu);
      const absl::Time give_up = absl::Now() + absl::Seconds(10);
      while (!stopping && queue.empty() && !qcv.WaitWithDeadline(&qmu, give_up)) {
      }
      // Everything queued, up to max_group_bytes (at least one op); a compaction runs alone.
      uint64_t bytes = 0;
      while (!queue.empty()) {
        Op* op = queue.front();
        if (op->kind == OpKind::kCompact && !group.empty()) break;
        if (!group.empty() && bytes + op->bytes > static_cast<uint64_t>(options.max_group_bytes)) {
          break;
        }
        group.push_back(op);
        bytes += op->bytes;
        queue.pop_front();
        if (op->kind == OpKind::kCompact) break;
      }
      exit = stopping && queue.empty() && group.empty();
    }
    if (exit) return;
    if (!group.empty() && group[0]->kind == OpKind::kCompact) {
      group[0]->status = Maintain(/*full=*/true);
    } else if (!group.empty()) {
      RunGroup(group);
    }
    {
      absl::MutexLock lock(&qmu);
      for (Op* op : group) op->done = true;
    }
    done_cv.SignalAll();
    // Capacity and dead space, between groups.
    absl::Status s = Maintain(/*full=*/false);
    if (!s.ok()) LOG(ERROR) << "kv store " << dir << ": compaction failed: " << s;
  }
}

}  // namespace kv
}  // namespace ferry
