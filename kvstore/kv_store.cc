#include "kvstore/kv_store.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/common/status.h"

namespace ferry {
namespace kv {
namespace {

constexpr int64_t kMaxProblems = 100;

// Where a live object is, and what is known about it.
struct Entry {
  uint32_t segment = 0;
  uint64_t offset = 0;
  RecordHeader header;
  int64_t written_us = 0;    // when it was appended where it is now (approximate after a restart)
  int64_t last_read_us = 0;  // 0: never read

  int64_t last_use_us() const { return std::max(header.created_us, last_read_us); }
};

struct Segment {
  uint32_t id = 0;
  int64_t created_us = 0;
  std::string path;
  std::shared_ptr<File> file;
  uint64_t file_bytes = 0;  // on disk (the open segment: the end of its last record)
  bool sealed = false;
  int64_t live_bytes = 0;  // record bytes of the index entries that point here
  // Every object key and tombstone written here (superseded ones included); the open segment
  // also keeps its records' headers for its footer.
  std::vector<Hash128> keys;
  std::vector<RecordHeader> tombstones;
  std::vector<FooterEntry> records;  // open segment only
};

// A thread's read buffer for direct I/O.
AlignedBuffer& ReadBuffer(size_t bytes) {
  thread_local AlignedBuffer buffer;
  buffer.Resize(bytes);
  return buffer;
}

// Reads the record at `offset` into `buf` (record_bytes, aligned) and checks it against `want`
// (key, sequence, length, fingerprint) and its checksums; OK only for an intact record, whose
// header it returns in `header`.
absl::Status ReadRecordInto(const File& file, uint64_t offset, const RecordHeader& want, char* buf,
                            RecordHeader* header) {
  const uint64_t bytes = want.record_bytes();
  ASSIGN_OR_RETURN(const size_t got, file.Read(offset, buf, bytes));
  if (got < kRecordHeaderBytes + want.value_bytes) return absl::DataLossError("torn record");
  ASSIGN_OR_RETURN(const RecordHeader h,
                   DecodeRecordHeader(absl::string_view(buf, kRecordHeaderBytes)));
  if (h.key != want.key || h.seq != want.seq || h.value_bytes != want.value_bytes || h.tombstone ||
      h.meta.fingerprint != want.meta.fingerprint) {
    return absl::DataLossError("record header does not match the index");
  }
  const absl::string_view v(buf + kRecordHeaderBytes, h.value_bytes);
  if (Checksum(v) != h.value_checksum) return absl::DataLossError("value checksum mismatch");
  if (header != nullptr) *header = h;
  return absl::OkStatus();
}

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

}  // namespace

struct KvStore::Impl {
  enum class OpKind { kPut, kDelete, kCompact };
  struct Op {
    OpKind kind;
    // kPut: each item as a whole record (header, value, padding) in a buffer aligned for direct
    // I/O, prepared on the caller's thread (value copied, checksums computed) so that the writer
    // only numbers it and writes it.
    std::vector<RecordHeader> headers;
    std::vector<AlignedBuffer> records;
    absl::Span<const Hash128> keys;  // kDelete
    int64_t deleted = 0;             // kDelete: keys that were present
    uint64_t bytes = 0;
    absl::Status status;
    bool done = false;
  };
  // Records on their way to the open segment: a gather list over buffers that stay alive
  // (owned here, or the ops') until written.
  struct Staged {
    std::vector<iovec> iov;
    std::vector<AlignedBuffer> owned;
    uint64_t bytes = 0;
  };

  std::string dir;
  StoreOptions options;
  Clock* clock = nullptr;
  FileSystem* fs = nullptr;
  std::unique_ptr<File> lock;

  // Index and segments.
  mutable std::mutex mu;
  absl::flat_hash_map<Hash128, Entry> index;
  std::map<uint32_t, std::shared_ptr<Segment>> segments;  // by id: oldest first
  StoreStats stats;
  std::array<ClassStats, kNumTrafficClasses> live;  // objects and value bytes in the index
  std::array<int64_t, kFloorBuckets> live_by_floor = {};
  std::vector<std::string> open_problems;

  // Writer thread state (only the writer touches these after Open).
  std::shared_ptr<Segment> open;  // null after a write error until the next group
  uint64_t tail = 0;              // next record offset in `open`
  uint64_t next_seq = 1;
  uint32_t next_segment = 0;
  int64_t last_sweep_us = 0;

  // The writer's queue.
  std::mutex qmu;
  std::condition_variable qcv, done_cv;
  std::deque<Op*> queue;
  bool stopping = false;
  std::thread writer;

  int64_t NowUs() const { return absl::ToUnixMicros(clock->Now()); }
  // How long after its last use an object of `meta` is kept: its class's ttl or its own floor.
  int64_t RetentionUs(const ObjectMeta& meta) const {
    return std::max(absl::ToInt64Microseconds(options.ttl[static_cast<int>(meta.traffic_class)]),
                    static_cast<int64_t>(meta.retention_floor_s) * 1'000'000);
  }
  bool Expired(const Entry& e, int64_t now) const {
    return now - e.last_use_us() > RetentionUs(e.header.meta);
  }

  absl::Status Recover();
  absl::Status RecoverSegment(uint32_t id, bool last, std::vector<FooterEntry>* records);
  absl::Status StartSegment();
  absl::Status Seal();
  absl::Status Submit(Op* op);
  void WriterLoop();
  void RunGroup(std::vector<Op*>& ops);
  // Appends a whole record (its header is written into `record` here) at the tail, rotating
  // segments as they fill; Flush writes what is staged (without syncing).
  struct Pending {
    RecordHeader header;
    uint32_t segment;
    uint64_t offset;
    int64_t last_read_us;
  };
  // `owned`, when not empty, holds `record` and is kept until the record is written.
  absl::Status Append(const RecordHeader& h, char* record, AlignedBuffer owned,
                      std::vector<Pending>* pending, Staged* staged);
  absl::Status AppendTombstone(const RecordHeader& h, std::vector<Pending>* pending,
                               Staged* staged);
  absl::Status Flush(Staged* staged);
  void Apply(const std::vector<Pending>& pending);
  void RemoveEntry(absl::flat_hash_map<Hash128, Entry>::iterator it);
  void AddEntry(const Entry& e);  // to the index (under mu)
  // Compaction (writer thread).
  absl::Status CompactSegment(uint32_t id, bool capacity);
  absl::Status Maintain(bool full);
  void SweepExpired();
  int64_t TotalFileBytes() const;
};

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
  RETURN_IF_ERROR(impl->Recover());
  impl->stats.open_seconds = absl::ToDoubleSeconds(impl->clock->Monotonic() - start);
  impl->stats.open_objects = static_cast<int64_t>(impl->index.size());
  impl->last_sweep_us = impl->NowUs();
  Impl* raw = impl.get();
  impl->writer = std::thread([raw] { raw->WriterLoop(); });
  return std::unique_ptr<KvStore>(new KvStore(std::move(impl)));
}

KvStore::KvStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvStore::~KvStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->qmu);
    impl_->stopping = true;
  }
  impl_->qcv.notify_all();
  impl_->writer.join();
}

// --- Recovery ------------------------------------------------------------------------------

absl::Status KvStore::Impl::RecoverSegment(uint32_t id, bool last,
                                           std::vector<FooterEntry>* records) {
  auto seg = std::make_shared<Segment>();
  seg->id = id;
  seg->path = absl::StrCat(dir, "/", SegmentFileName(id));
  ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                   fs->Open(seg->path, OpenMode::kReadWrite, options.direct_io));
  stats.direct_io = file->direct();
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  AlignedBuffer buf(kSegmentHeaderBytes);
  // The segment header (a segment whose header never became durable holds nothing).
  bool header_ok = false;
  if (size >= kSegmentHeaderBytes) {
    ASSIGN_OR_RETURN(size_t got, file->Read(0, buf.data(), kSegmentHeaderBytes));
    auto h = DecodeSegmentHeader(absl::string_view(buf.data(), got));
    if (h.ok() && h->id == id) {
      seg->created_us = h->created_us;
      header_ok = true;
    }
  }
  if (!header_ok && size < 2 * kDirectIoAlignment) {
    open_problems.push_back(absl::StrCat(seg->path, ": empty or torn segment removed"));
    file.reset();
    return fs->Remove(seg->path);
  }
  if (!header_ok) open_problems.push_back(absl::StrCat(seg->path, ": bad segment header"));

  // A sealed segment: its footer.
  std::string footer_problem = "no footer";
  if (size >= 2 * kDirectIoAlignment && size % kDirectIoAlignment == 0) {
    ASSIGN_OR_RETURN(size_t got,
                     file->Read(size - kDirectIoAlignment, buf.data(), kDirectIoAlignment));
    if (got == kDirectIoAlignment) {
      auto trailer = DecodeTrailer(
          absl::string_view(buf.data() + kDirectIoAlignment - kTrailerBytes, kTrailerBytes), size);
      if (!trailer.ok()) footer_problem = std::string(trailer.status().message());
      if (trailer.ok() && trailer->segment_id != id) footer_problem = "footer of another segment";
      if (trailer.ok() && trailer->segment_id == id) {
        const uint64_t bytes = size - trailer->footer_offset;
        AlignedBuffer footer(bytes);
        ASSIGN_OR_RETURN(size_t n, file->Read(trailer->footer_offset, footer.data(), bytes));
        auto entries = DecodeFooterEntries(absl::string_view(footer.data(), n), *trailer);
        if (entries.ok()) {
          *records = std::move(*entries);
          seg->file = std::move(file);
          seg->file_bytes = size;
          seg->sealed = true;
          ++stats.segments_from_footer;
          segments[id] = std::move(seg);
          return absl::OkStatus();
        }
        footer_problem = std::string(entries.status().message());
      }
    }
  }

  // No usable footer: scan every 4096-byte boundary for a valid record. (The segment that was
  // open has none by design.)
  ++stats.segments_scanned;
  if (!last) open_problems.push_back(absl::StrCat(seg->path, ": ", footer_problem, "; scanned"));
  uint64_t valid_end = kSegmentHeaderBytes;
  AlignedBuffer chunk(kDirectIoAlignment);
  uint64_t pos = kSegmentHeaderBytes;
  while (pos + kRecordHeaderBytes <= size) {
    ASSIGN_OR_RETURN(size_t got, file->Read(pos, chunk.data(), kDirectIoAlignment));
    auto h = DecodeRecordHeader(
        absl::string_view(chunk.data(), std::min<size_t>(got, kRecordHeaderBytes)));
    if (!h.ok() || pos + h->record_bytes() > size) {
      pos += kDirectIoAlignment;
      continue;
    }
    const uint64_t bytes = h->record_bytes();
    AlignedBuffer& rec = ReadBuffer(bytes);
    ASSIGN_OR_RETURN(size_t n, file->Read(pos, rec.data(), bytes));
    if (n < kRecordHeaderBytes + h->value_bytes ||
        Checksum(absl::string_view(rec.data() + kRecordHeaderBytes, h->value_bytes)) !=
            h->value_checksum) {
      pos += kDirectIoAlignment;
      continue;
    }
    FooterEntry e;
    e.header = *h;
    e.offset = pos;
    records->push_back(e);
    pos += bytes;
    valid_end = pos;
  }
  seg->file = std::move(file);
  if (last) {
    // The segment that was open: cut the torn tail and append after the last valid record.
    if (size > valid_end) {
      stats.torn_bytes_dropped += static_cast<int64_t>(size - valid_end);
      RETURN_IF_ERROR(seg->file->Truncate(valid_end));
      RETURN_IF_ERROR(seg->file->Sync());
    }
    if (!header_ok) {
      // Records without a trustworthy header: seal it as it is and start afresh.
      seg->created_us = NowUs();
    }
    seg->file_bytes = valid_end;
    seg->records = *records;
    seg->sealed = !header_ok;
  } else {
    // Sealed but its footer is gone (a crash while sealing, or damage): keep what the scan
    // found; compaction removes the file in time.
    seg->file_bytes = size;
    seg->sealed = true;
  }
  segments[id] = std::move(seg);
  return absl::OkStatus();
}

absl::Status KvStore::Impl::Recover() {
  ASSIGN_OR_RETURN(std::vector<std::string> names, fs->List(dir));
  std::vector<uint32_t> ids;
  for (const std::string& name : names) {
    auto id = ParseSegmentFileName(name);
    if (id.ok()) ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<std::pair<uint32_t, FooterEntry>> all;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<FooterEntry> records;
    RETURN_IF_ERROR(RecoverSegment(ids[i], i + 1 == ids.size(), &records));
    for (FooterEntry& e : records) all.emplace_back(ids[i], e);
    next_segment = ids[i] + 1;
  }
  // The newest record of each key wins; a tombstone hides older objects.
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.second.header.seq < b.second.header.seq; });
  for (const auto& [id, e] : all) {
    next_seq = std::max(next_seq, e.header.seq + 1);
    const std::shared_ptr<Segment>& seg = segments.at(id);
    if (e.header.tombstone) {
      seg->tombstones.push_back(e.header);
      auto it = index.find(e.header.key);
      if (it != index.end()) RemoveEntry(it);
      continue;
    }
    seg->keys.push_back(e.header.key);
    auto it = index.find(e.header.key);
    if (it != index.end()) RemoveEntry(it);
    Entry entry;
    entry.segment = id;
    entry.offset = e.offset;
    entry.header = e.header;
    entry.written_us = seg->created_us;
    entry.last_read_us = e.last_read_us;
    AddEntry(entry);
  }
  // Append to the segment that was open, or start one.
  if (!segments.empty() && !segments.rbegin()->second->sealed) {
    open = segments.rbegin()->second;
    tail = open->file_bytes;
    return absl::OkStatus();
  }
  return StartSegment();
}

// --- Writing -------------------------------------------------------------------------------

absl::Status KvStore::Impl::StartSegment() {
  auto seg = std::make_shared<Segment>();
  seg->id = next_segment++;
  seg->created_us = NowUs();
  seg->path = absl::StrCat(dir, "/", SegmentFileName(seg->id));
  ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                   fs->Open(seg->path, OpenMode::kCreate, options.direct_io));
  {
    std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(mu);
    segments[seg->id] = seg;
  }
  open = std::move(seg);
  tail = kSegmentHeaderBytes;
  return absl::OkStatus();
}

absl::Status KvStore::Impl::Seal() {
  std::vector<FooterEntry> entries = open->records;
  {
    std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(mu);
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

// Makes durable records visible (under mu).
void KvStore::Impl::Apply(const std::vector<Pending>& pending) {
  std::lock_guard<std::mutex> lock(mu);
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
    e.written_us = now;
    e.last_read_us = last_read;
    AddEntry(e);
  }
}

void KvStore::Impl::RunGroup(std::vector<Op*>& ops) {
  std::vector<Pending> pending;
  Staged staged;
  absl::Status status;
  int64_t puts = 0, put_bytes = 0, deletes = 0;
  // Keys put in this group, with the retention floor they were put with.
  absl::flat_hash_map<Hash128, uint32_t> in_group;
  for (Op* op : ops) {
    if (!status.ok()) break;
    if (op->kind == OpKind::kPut) {
      for (size_t i = 0; i < op->headers.size(); ++i) {
        RecordHeader& h = op->headers[i];
        {
          // Content-addressed: a live copy is the same bytes, and is enough unless this item
          // asks for a longer floor. Then it is written again, no shorter-lived than it was.
          std::lock_guard<std::mutex> lock(mu);
          auto it = index.find(h.key);
          if (it != index.end() && !Expired(it->second, NowUs())) {
            const ObjectMeta& live = it->second.header.meta;
            if (live.retention_floor_s >= h.meta.retention_floor_s) continue;
            if (options.ttl[static_cast<int>(live.traffic_class)] >
                options.ttl[static_cast<int>(h.meta.traffic_class)]) {
              h.meta.traffic_class = live.traffic_class;
            }
          }
        }
        // The same key twice in one group: the first is enough, unless this one asks for a
        // longer floor (it is written after the first, and wins).
        auto [at, inserted] = in_group.emplace(h.key, h.meta.retention_floor_s);
        if (!inserted) {
          if (at->second >= h.meta.retention_floor_s) continue;
          at->second = h.meta.retention_floor_s;
        }
        h.seq = next_seq++;
        status = Append(h, op->records[i].data(), AlignedBuffer(), &pending, &staged);
        if (!status.ok()) break;
        ++puts;
        put_bytes += static_cast<int64_t>(h.value_bytes);
      }
    } else if (op->kind == OpKind::kDelete) {
      for (const Hash128& key : op->keys) {
        {
          // Present, or put earlier in this group (the tombstone then follows it).
          std::lock_guard<std::mutex> lock(mu);
          if (!index.contains(key) && !in_group.contains(key)) continue;
        }
        in_group.erase(key);
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
    std::lock_guard<std::mutex> lock(mu);
    stats.puts += puts;
    stats.put_bytes += put_bytes;
    stats.deletes += deletes;
    ++stats.group_commits;
  } else {
    // Nothing of this group is acknowledged; whatever reached the file is never indexed. The
    // segment is given up (sealed as it is, without footer) and writing resumes in a new one.
    LOG(ERROR) << "kv store " << dir << ": write failed: " << status;
    if (open != nullptr) {
      std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(qmu);
    if (stopping) return absl::UnavailableError("the store is closing");
    queue.push_back(op);
  }
  qcv.notify_one();
  std::unique_lock<std::mutex> lock(qmu);
  done_cv.wait(lock, [&] { return op->done; });
  return op->status;
}

void KvStore::Impl::WriterLoop() {
  while (true) {
    std::vector<Op*> group;
    bool exit = false;
    {
      std::unique_lock<std::mutex> lock(qmu);
      qcv.wait_for(lock, std::chrono::seconds(10), [&] { return stopping || !queue.empty(); });
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
      std::lock_guard<std::mutex> lock(qmu);
      for (Op* op : group) op->done = true;
    }
    done_cv.notify_all();
    // Capacity and dead space, between groups.
    absl::Status s = Maintain(/*full=*/false);
    if (!s.ok()) LOG(ERROR) << "kv store " << dir << ": compaction failed: " << s;
  }
}

// --- Compaction ----------------------------------------------------------------------------

int64_t KvStore::Impl::TotalFileBytes() const {
  int64_t total = 0;
  for (const auto& [id, seg] : segments) total += static_cast<int64_t>(seg->file_bytes);
  return total;
}

void KvStore::Impl::SweepExpired() {
  std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(mu);
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
      std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(mu);
    over = TotalFileBytes() > options.capacity_bytes;
  }
  while (over) {
    uint32_t victim = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (TotalFileBytes() <= options.capacity_bytes * 9 / 10) break;
      auto it = segments.begin();
      if (it == segments.end() || it->second == open) break;
      victim = it->first;
    }
    RETURN_IF_ERROR(CompactSegment(victim, /*capacity=*/true));
  }
  return absl::OkStatus();
}

// --- The API -------------------------------------------------------------------------------

absl::Status KvStore::Put(absl::Span<const PutItem> items) {
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
  Impl::Op op{Impl::OpKind::kPut};
  op.bytes = bytes;
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
  return impl_->Submit(&op);
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
  std::lock_guard<std::mutex> lock(impl_->mu);
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
  std::lock_guard<std::mutex> lock(impl_->mu);
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
      std::lock_guard<std::mutex> lock(m.mu);
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
    std::lock_guard<std::mutex> lock(m.mu);
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
    if (same) it->second.last_read_us = m.NowUs();
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
  std::lock_guard<std::mutex> lock(impl_->mu);
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
    std::lock_guard<std::mutex> lock(m.mu);
    for (const std::string& p : m.open_problems) {
      if (static_cast<int64_t>(report.problems.size()) < kMaxProblems) report.problems.push_back(p);
    }
    for (const auto& [key, e] : m.index) all.emplace_back(e, m.segments.at(e.segment)->file);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.segment, a.first.offset) < std::tie(b.first.segment, b.first.offset);
  });
  for (const auto& [e, file] : all) {
    absl::Status s = ReadRecord(*file, e.offset, e.header, nullptr);
    ++report.objects_checked;
    report.bytes_checked += static_cast<int64_t>(e.header.value_bytes);
    if (s.ok()) continue;
    ++report.corrupt;
    if (static_cast<int64_t>(report.problems.size()) < kMaxProblems) {
      report.problems.push_back(absl::StrCat("object ", e.header.key.ToHex(), " in ",
                                             SegmentFileName(e.segment), " at ", e.offset, ": ",
                                             s.message()));
    }
    std::lock_guard<std::mutex> lock(m.mu);
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
