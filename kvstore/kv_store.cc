// KvStore (kv_store.h): Open and close, the public API and the index's bookkeeping. Recovery,
// the writer thread and compaction are in kv_store_recovery.cc, kv_store_group_writer.cc and
// kv_store_compaction.cc; KvStore::Impl is in kv_store_impl.h.

#include "kvstore/kv_store.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "kvstore/kv_store_impl.h"

namespace ferry {
namespace kv {

using kv_store_internal::Entry;
using kv_store_internal::kMaxProblems;
using kv_store_internal::ReadBuffer;
using kv_store_internal::ReadRecordInto;

namespace {

// Conflicting keys of one Put logged one by one; the rest in one line.
constexpr int64_t kMaxConflictsLogged = 10;

std::string ChecksumHex(uint64_t checksum) { return absl::StrFormat("%016x", checksum); }

// DataLoss unless the decoded header `h` is the object the index describes as `want` (key,
// sequence, length, fingerprint).
absl::Status MatchIndex(const RecordHeader& h, const RecordHeader& want) {
  if (h.key != want.key || h.seq != want.seq || h.value_bytes != want.value_bytes || h.tombstone ||
      h.meta.fingerprint != want.meta.fingerprint) {
    return absl::DataLossError("record header does not match the index");
  }
  return absl::OkStatus();
}

}  // namespace

namespace kv_store_internal {

AlignedBuffer& ReadBuffer(size_t bytes) {
  thread_local AlignedBuffer buffer;
  buffer.Resize(bytes);
  return buffer;
}

absl::Status ReadRecordInto(const File& file, uint64_t offset, const RecordHeader& want, char* buf,
                            RecordHeader* header) {
  const uint64_t bytes = want.record_bytes();
  ASSIGN_OR_RETURN(const size_t got, file.Read(offset, buf, bytes));
  if (got < kRecordHeaderBytes + want.value_bytes) return absl::DataLossError("torn record");
  ASSIGN_OR_RETURN(const RecordHeader h,
                   DecodeRecordHeader(absl::string_view(buf, kRecordHeaderBytes)));
  RETURN_IF_ERROR(MatchIndex(h, want));
  const absl::string_view v(buf + kRecordHeaderBytes, h.value_bytes);
  if (Checksum(v) != h.value_checksum) return absl::DataLossError("value checksum mismatch");
  if (header != nullptr) *header = h;
  return absl::OkStatus();
}

}  // namespace kv_store_internal

namespace {

// The same into this thread's buffer, the value copied out (when `value` is not null).
absl::Status ReadRecord(const File& file, uint64_t offset, const RecordHeader& want,
                        std::string* value, uint64_t* checksum = nullptr) {
  AlignedBuffer& buf = ReadBuffer(want.record_bytes());
  RecordHeader h;
  RETURN_IF_ERROR(ReadRecordInto(file, offset, want, buf.data(), &h));
  if (value != nullptr) value->assign(buf.data() + kRecordHeaderBytes, want.value_bytes);
  if (checksum != nullptr) *checksum = h.value_checksum;
  return absl::OkStatus();
}

// The header of the record at `offset` (its first aligned block, not the value), checked
// against `want` as ReadRecordInto does: DataLoss for a damaged or foreign one.
absl::StatusOr<RecordHeader> ReadRecordHeader(const File& file, uint64_t offset,
                                              const RecordHeader& want) {
  AlignedBuffer& buf = ReadBuffer(kDirectIoAlignment);
  ASSIGN_OR_RETURN(const size_t got, file.Read(offset, buf.data(), kDirectIoAlignment));
  if (got < kRecordHeaderBytes) return absl::DataLossError("torn record");
  ASSIGN_OR_RETURN(const RecordHeader h,
                   DecodeRecordHeader(absl::string_view(buf.data(), kRecordHeaderBytes)));
  RETURN_IF_ERROR(MatchIndex(h, want));
  return h;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const std::string& dir,
                                                       const StoreOptions& options) {
  if (options.segment_bytes < int64_t{1} << 20 || options.segment_bytes % kDirectIoAlignment) {
    return absl::InvalidArgumentError("segment_bytes must be a multiple of 4096, at least 1 MiB");
  }
  if (options.capacity_bytes < 4 * options.segment_bytes) {
    return absl::InvalidArgumentError("capacity_bytes must hold at least 4 segments");
  }
  if (options.max_object_bytes < 1 ||
      options.max_object_bytes >
          options.segment_bytes - static_cast<int64_t>(kSegmentHeaderBytes + kRecordHeaderBytes)) {
    return absl::InvalidArgumentError("max_object_bytes must fit in a segment");
  }
  for (absl::Duration ttl : options.ttl) {
    if (ttl <= absl::ZeroDuration()) return absl::InvalidArgumentError("TTLs must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->options = options;
  impl->options.max_group_bytes = std::max<int64_t>(options.max_group_bytes, 1 << 20);
  impl->clock = options.clock != nullptr ? options.clock : &RealClock();
  impl->fs = options.fs != nullptr ? options.fs : &PosixFileSystem();
  RETURN_IF_ERROR(impl->fs->CreateDir(dir));
  ASSIGN_OR_RETURN(impl->lock, impl->fs->Lock(dir + "/LOCK"));
  const absl::Duration start = impl->clock->Monotonic();
  {
    absl::MutexLock lock(&impl->mu);  // nothing else runs yet: for the annotations
    RETURN_IF_ERROR(impl->Recover());
    impl->stats.open_seconds = absl::ToDoubleSeconds(impl->clock->Monotonic() - start);
    impl->stats.open_objects = static_cast<int64_t>(impl->index.size());
  }
  if (impl->open == nullptr) RETURN_IF_ERROR(impl->StartSegment());
  impl->last_sweep_us = impl->NowUs();
  Impl* raw = impl.get();
  impl->writer = std::thread([raw] { raw->WriterLoop(); });
  return std::unique_ptr<KvStore>(new KvStore(std::move(impl)));
}

KvStore::KvStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvStore::~KvStore() {
  {
    absl::MutexLock lock(&impl_->qmu);
    impl_->stopping = true;
  }
  impl_->qcv.SignalAll();
  impl_->writer.join();
}

// --- The index -----------------------------------------------------------------------------

void KvStore::Impl::RemoveEntry(absl::flat_hash_map<Hash128, Entry>::iterator it) {
  const Entry& e = it->second;
  auto seg = segments.find(e.segment);
  if (seg != segments.end()) {
    seg->second->live_bytes -= static_cast<int64_t>(e.header.record_bytes());
  }
  ClassStats& c = live[static_cast<int>(e.header.meta.traffic_class)];
  --c.objects;
  c.bytes -= static_cast<int64_t>(e.header.value_bytes);
  --live_by_floor[FloorBucket(e.header.meta.retention_floor_s)];
  index.erase(it);
}

void KvStore::Impl::AddEntry(const Entry& e) {
  segments.at(e.segment)->live_bytes += static_cast<int64_t>(e.header.record_bytes());
  ClassStats& c = live[static_cast<int>(e.header.meta.traffic_class)];
  ++c.objects;
  c.bytes += static_cast<int64_t>(e.header.value_bytes);
  ++live_by_floor[FloorBucket(e.header.meta.retention_floor_s)];
  index.emplace(e.header.key, e);
}

int64_t KvStore::Impl::TotalFileBytes() const {
  int64_t total = 0;
  for (const auto& [id, seg] : segments) total += static_cast<int64_t>(seg->file_bytes);
  return total;
}

// --- The API -------------------------------------------------------------------------------

void KvStore::Impl::LearnChecksums(absl::Span<const PutItem> items) {
  struct Unknown {
    Entry entry;
    std::shared_ptr<File> file;
  };
  std::vector<Unknown> unknown;
  {
    absl::MutexLock lock(&mu);
    absl::flat_hash_set<Hash128> seen;
    for (const PutItem& item : items) {
      auto it = index.find(item.key);
      if (it == index.end() || it->second.checksum_known || !seen.insert(item.key).second) continue;
      unknown.push_back({it->second, segments.at(it->second.segment)->file});
    }
  }
  for (const Unknown& u : unknown) {
    const Entry& e = u.entry;
    absl::StatusOr<RecordHeader> h = ReadRecordHeader(*u.file, e.offset, e.header);
    absl::MutexLock lock(&mu);
    auto it = index.find(e.header.key);
    if (it == index.end() || it->second.segment != e.segment || it->second.offset != e.offset) {
      continue;  // gone or moved since (a new location knows its checksum)
    }
    if (h.ok()) {
      it->second.header.value_checksum = h->value_checksum;
      it->second.checksum_known = true;
    } else if (absl::IsDataLoss(h.status())) {
      ++stats.corrupt_reads;
      LOG(WARNING) << "kv store " << dir << ": object " << e.header.key.ToHex() << " in segment "
                   << e.segment << " at " << e.offset << ": " << h.status().message()
                   << "; dropped";
      RemoveEntry(it);
    } else {
      LOG(WARNING) << "kv store " << dir << ": object " << e.header.key.ToHex() << " in segment "
                   << e.segment << " at " << e.offset << ": cannot read its header (" << h.status()
                   << "); a Put of its key is taken as the same bytes";
    }
  }
}

absl::Status KvStore::Put(absl::Span<const PutItem> items, PutResult* result) {
  if (result != nullptr) *result = PutResult();
  uint64_t bytes = 0;
  for (const PutItem& item : items) {
    if (static_cast<int64_t>(item.value.size()) > impl_->options.max_object_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "object ", item.key.ToHex(), " of ", item.value.size(),
          " bytes is larger than max_object_bytes (", impl_->options.max_object_bytes, ")"));
    }
    if (static_cast<int>(item.meta.traffic_class) >= kNumTrafficClasses) {
      return absl::InvalidArgumentError("unknown traffic class");
    }
    bytes += item.value.size() + kRecordHeaderBytes;
  }
  if (items.empty()) return absl::OkStatus();
  impl_->LearnChecksums(items);
  Impl::Op op{Impl::OpKind::kPut};
  op.bytes = bytes;
  op.outcomes.assign(items.size(), PutOutcome::kWritten);
  op.kept_checksums.assign(items.size(), 0);
  const int64_t now = impl_->NowUs();
  for (const PutItem& item : items) {
    RecordHeader h;
    h.key = item.key;
    h.meta = item.meta;
    h.value_bytes = item.value.size();
    h.created_us = now;
    h.value_checksum = Checksum(item.value);
    AlignedBuffer record(h.record_bytes());
    char* out = record.data();
    std::copy(item.value.begin(), item.value.end(), out + kRecordHeaderBytes);
    std::fill(out + kRecordHeaderBytes + item.value.size(), out + h.record_bytes(), '\0');
    op.headers.push_back(h);
    op.records.push_back(std::move(record));
  }
  RETURN_IF_ERROR(impl_->Submit(&op));
  int64_t conflicts = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (op.outcomes[i] != PutOutcome::kConflict) continue;
    if (conflicts++ < kMaxConflictsLogged) {
      LOG(WARNING) << "kv store " << impl_->dir << ": object " << items[i].key.ToHex()
                   << " put again with other bytes (XXH3-64 "
                   << ChecksumHex(op.headers[i].value_checksum) << ", stored "
                   << ChecksumHex(op.kept_checksums[i])
                   << "): a hash collision or a writer's bug; the stored object is kept";
    }
  }
  if (conflicts > kMaxConflictsLogged) {
    LOG(WARNING) << "kv store " << impl_->dir << ": " << conflicts - kMaxConflictsLogged
                 << " more objects of the same Put put again with other bytes";
  }
  if (result != nullptr) {
    result->outcomes = std::move(op.outcomes);
    for (PutOutcome o : result->outcomes) {
      if (o != PutOutcome::kWritten) ++result->already_present;
    }
    result->conflicts = conflicts;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvStore::Delete(absl::Span<const Hash128> keys) {
  if (keys.empty()) return 0;
  Impl::Op op{Impl::OpKind::kDelete};
  op.keys = keys;
  op.bytes = keys.size() * kDirectIoAlignment;
  RETURN_IF_ERROR(impl_->Submit(&op));
  return op.deleted;
}

int64_t KvStore::max_object_bytes() const { return impl_->options.max_object_bytes; }

absl::Duration KvStore::ttl(TrafficClass c) const {
  return impl_->options.ttl[static_cast<int>(c)];
}

StoreStats KvStore::Counters() const {
  absl::MutexLock lock(&impl_->mu);
  StoreStats s = impl_->stats;
  s.objects = static_cast<int64_t>(impl_->index.size());
  s.segments = static_cast<int64_t>(impl_->segments.size());
  s.file_bytes = impl_->TotalFileBytes();
  s.classes = impl_->live;
  s.objects_by_floor = impl_->live_by_floor;
  for (const ClassStats& c : s.classes) s.value_bytes += c.bytes;
  return s;
}

absl::Status KvStore::Compact() {
  Impl::Op op{Impl::OpKind::kCompact};
  return impl_->Submit(&op);
}

ExistsResult KvStore::Exists(absl::Span<const Hash128> keys, const Hash128& fingerprint) {
  ExistsResult r;
  r.present.resize(keys.size());
  r.retention_floor_s.resize(keys.size());
  absl::MutexLock lock(&impl_->mu);
  const int64_t now = impl_->NowUs();
  bool prefix = true;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = impl_->index.find(keys[i]);
    r.present[i] = it != impl_->index.end() && it->second.header.meta.fingerprint == fingerprint &&
                   !impl_->Expired(it->second, now);
    if (r.present[i]) r.retention_floor_s[i] = it->second.header.meta.retention_floor_s;
    prefix = prefix && r.present[i];
    if (prefix) ++r.prefix;
  }
  return r;
}

std::vector<GetResult> KvStore::Get(absl::Span<const Hash128> keys, const Hash128& fingerprint) {
  Impl& m = *impl_;
  std::vector<GetResult> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry entry;
    std::shared_ptr<File> file;
    {
      absl::MutexLock lock(&m.mu);
      ++m.stats.gets;
      auto it = m.index.find(keys[i]);
      if (it == m.index.end()) {
        ++m.stats.misses;
        continue;
      }
      if (it->second.header.meta.fingerprint != fingerprint) {
        ++m.stats.misses;
        ++m.stats.fingerprint_mismatches;
        continue;
      }
      if (m.Expired(it->second, m.NowUs())) {
        ++m.stats.misses;
        ++m.stats.expired;
        m.RemoveEntry(it);
        continue;
      }
      entry = it->second;
      file = m.segments.at(entry.segment)->file;
    }
    GetResult& r = results[i];
    absl::Status read = ReadRecord(*file, entry.offset, entry.header, &r.value, &r.checksum);
    absl::MutexLock lock(&m.mu);
    auto it = m.index.find(keys[i]);
    const bool same = it != m.index.end() && it->second.header.seq == entry.header.seq;
    if (!read.ok()) {
      r.value.clear();
      ++m.stats.misses;
      ++m.stats.corrupt_reads;
      LOG(WARNING) << "kv store " << m.dir << ": object " << keys[i].ToHex() << " in segment "
                   << entry.segment << " at " << entry.offset << ": " << read.message()
                   << "; dropped";
      if (same && it->second.segment == entry.segment && it->second.offset == entry.offset) {
        m.RemoveEntry(it);
      }
      continue;
    }
    r.found = true;
    r.meta = entry.header.meta;
    r.created = absl::FromUnixMicros(entry.header.created_us);
    ++m.stats.hits;
    m.stats.read_bytes += static_cast<int64_t>(r.value.size());
    if (same) {
      it->second.last_read_us = m.NowUs();
      it->second.header.value_checksum = r.checksum;  // verified against the bytes
      it->second.checksum_known = true;
    }
  }
  return results;
}

int FloorBucket(uint32_t retention_floor_s) {
  return retention_floor_s == 0      ? 0
         : retention_floor_s <= 300  ? 1
         : retention_floor_s <= 3600 ? 2
                                     : 3;
}

const char* FloorBucketName(int bucket) {
  static constexpr const char* kNames[kFloorBuckets] = {"none", "5m", "1h", "longer"};
  return bucket >= 0 && bucket < kFloorBuckets ? kNames[bucket] : "?";
}

StoreStats KvStore::Stats() const {
  absl::MutexLock lock(&impl_->mu);
  StoreStats s = impl_->stats;
  s.objects = static_cast<int64_t>(impl_->index.size());
  s.segments = static_cast<int64_t>(impl_->segments.size());
  s.file_bytes = impl_->TotalFileBytes();
  const int64_t now = impl_->NowUs();
  constexpr int64_t kHour = int64_t{3600} * 1'000'000;
  for (const auto& [key, e] : impl_->index) {
    if (impl_->Expired(e, now)) {  // a miss already; leaves at the next sweep
      --s.objects;
      continue;
    }
    s.value_bytes += static_cast<int64_t>(e.header.value_bytes);
    ++s.objects_by_floor[FloorBucket(e.header.meta.retention_floor_s)];
    ClassStats& c = s.classes[static_cast<int>(e.header.meta.traffic_class)];
    ++c.objects;
    c.bytes += static_cast<int64_t>(e.header.value_bytes);
    const int64_t age = now - e.header.created_us;
    const int bucket = age < kHour         ? 0
                       : age < 24 * kHour  ? 1
                       : age < 72 * kHour  ? 2
                       : age < 168 * kHour ? 3
                                           : 4;
    ++c.by_age[bucket];
  }
  return s;
}

VerifyReport KvStore::Verify() {
  Impl& m = *impl_;
  VerifyReport report;
  m.SweepExpired();
  std::vector<std::pair<Entry, std::shared_ptr<File>>> all;
  {
    absl::MutexLock lock(&m.mu);
    report.recovery_dropped = m.stats.recovery_dropped;
    for (const std::string& p : m.open_problems) {
      if (static_cast<int64_t>(report.problems.size()) < kMaxProblems) report.problems.push_back(p);
    }
    for (const auto& [key, e] : m.index) all.emplace_back(e, m.segments.at(e.segment)->file);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.segment, a.first.offset) < std::tie(b.first.segment, b.first.offset);
  });
  for (const auto& [e, file] : all) {
    uint64_t checksum = 0;
    absl::Status s = ReadRecord(*file, e.offset, e.header, nullptr, &checksum);
    ++report.objects_checked;
    report.bytes_checked += static_cast<int64_t>(e.header.value_bytes);
    if (s.ok() && !e.checksum_known) {
      absl::MutexLock lock(&m.mu);
      auto it = m.index.find(e.header.key);
      if (it != m.index.end() && it->second.segment == e.segment && it->second.offset == e.offset) {
        it->second.header.value_checksum = checksum;
        it->second.checksum_known = true;
      }
    }
    if (s.ok()) continue;
    ++report.corrupt;
    if (static_cast<int64_t>(report.problems.size()) < kMaxProblems) {
      report.problems.push_back(absl::StrCat("object ", e.header.key.ToHex(), " in ",
                                             SegmentFileName(e.segment), " at ", e.offset, ": ",
                                             s.message()));
    }
    absl::MutexLock lock(&m.mu);
    auto it = m.index.find(e.header.key);
    if (it != m.index.end() && it->second.segment == e.segment && it->second.offset == e.offset) {
      m.RemoveEntry(it);
      ++m.stats.corrupt_reads;
    }
  }
  return report;
}

}  // namespace kv
}  // namespace ferry
