#include "kvstore/kv_store.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/log.h"
#include "engine/common/status.h"

namespace ferry {
namespace kv {
namespace {

constexpr int64_t kMaxProblems = 100;
// Conflicting keys of one Put logged one by one; the rest in one line.
constexpr int64_t kMaxConflictsLogged = 10;

std::string ChecksumHex(uint64_t checksum) { return absl::StrFormat("%016x", checksum); }

// Where a live object is, and what is known about it.
struct Entry {
  uint32_t segment = 0;
  uint64_t offset = 0;
  RecordHeader header;
  // Whether header.value_checksum is the value's: false for an object recovered from a sealed
  // segment's footer (which does not keep it) until its record is read.
  bool checksum_known = false;
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

// DataLoss unless the decoded header `h` is the object the index describes as `want` (key,
// sequence, length, fingerprint).
absl::Status MatchIndex(const RecordHeader& h, const RecordHeader& want) {
  if (h.key != want.key || h.seq != want.seq || h.value_bytes != want.value_bytes || h.tombstone ||
      h.meta.fingerprint != want.meta.fingerprint) {
    return absl::DataLossError("record header does not match the index");
  }
  return absl::OkStatus();
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
  RETURN_IF_ERROR(MatchIndex(h, want));
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

// What a segment scan found where records should be and are not: the bytes from `start` (the
// end of the last valid record) to the next valid record (a hole) or to the end of the file
// (the tail), one 4 KiB block at a time.
class BadStretch {
 public:
  bool empty() const { return empty_; }
  uint64_t start() const { return start_; }
  // Records whose header verifies but whose value does not (or is cut short).
  int64_t bad_values() const { return bad_values_; }
  // Runs of blocks that are no record header, outside the records above.
  int64_t bad_headers() const { return bad_headers_; }
  const std::string& first_bad_value() const { return first_bad_value_; }
  const std::string& first_bad_header() const { return first_bad_header_; }
  // Whether the stretch starts with a footer entry: a footer cut short, not records.
  bool footer() const { return footer_; }

  // The block at `pos` (its bytes read: `block`) is no record header, for the reason `why`.
  void NotARecord(uint64_t pos, absl::string_view block, absl::string_view why) {
    Begin(pos, block);
    if (pos < covered_until_ || in_bad_header_) return;  // inside a record already counted
    in_bad_header_ = true;
    ++bad_headers_;
    if (first_bad_header_.empty()) first_bad_header_ = absl::StrCat("at ", pos, ": ", why);
  }
  // The block at `pos` starts a record with the valid header `h` whose value is bad (`why`).
  void BadRecord(uint64_t pos, absl::string_view block, const RecordHeader& h,
                 absl::string_view why) {
    Begin(pos, block);
    in_bad_header_ = false;
    covered_until_ = std::max(covered_until_, pos + h.record_bytes());
    ++bad_values_;
    if (first_bad_value_.empty()) {
      first_bad_value_ = absl::StrCat(h.tombstone ? "tombstone of " : "object ", h.key.ToHex(),
                                      " (", h.value_bytes, " bytes) at ", pos, ": ", why);
    }
  }

 private:
  void Begin(uint64_t pos, absl::string_view block) {
    if (!empty_) return;
    empty_ = false;
    start_ = pos;
    footer_ = StartsWithFooterEntry(block);
  }

  bool empty_ = true;
  uint64_t start_ = 0;
  int64_t bad_values_ = 0, bad_headers_ = 0;
  uint64_t covered_until_ = 0;  // the end of the last record counted in bad_values_
  bool in_bad_header_ = false;  // the previous block began or continued a bad-header run
  bool footer_ = false;
  std::string first_bad_value_, first_bad_header_;
};

}  // namespace

const char* RecoveryDropName(RecoveryDrop reason) {
  switch (reason) {
    case RecoveryDrop::kTornTail:
      return "torn_tail";
    case RecoveryDrop::kChecksum:
      return "checksum";
    case RecoveryDrop::kHeader:
      return "header";
  }
  return "unknown";
}

struct KvStore::Impl {
  enum class OpKind { kPut, kDelete, kCompact };
  struct Op {
    OpKind kind;
    // kPut: each item as a whole record (header, value, padding) in a buffer aligned for direct
    // I/O, prepared on the caller's thread (value copied, checksums computed) so that the writer
    // only numbers it and writes it.
    std::vector<RecordHeader> headers;
    std::vector<AlignedBuffer> records;
    // kPut, set by the writer: what became of each item, and for a kConflict the checksum of
    // the bytes kept.
    std::vector<PutOutcome> outcomes;
    std::vector<uint64_t> kept_checksums;
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
  // What opening found (NoteOpenProblem), at most kMaxProblems lines, the last of them a count
  // of those left out.
  std::vector<std::string> open_problems;
  int64_t open_problems_left_out = 0;

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
  // Reads segment `id` (`last`: the one that was open) into `records`; `from_footer` says whether
  // they came from its footer (whose entries lack the value checksums).
  absl::Status RecoverSegment(uint32_t id, bool last, std::vector<FooterEntry>* records,
                              bool* from_footer);
  // The one way opening reports what it found: a WARNING, and a line of Verify()'s report.
  void NoteOpenProblem(const std::string& line);
  // Records a scan of `path` skipped: counted by reason, and noted.
  void NoteRecoveryDrop(RecoveryDrop reason, int64_t records, const std::string& path,
                        uint64_t offset, absl::string_view detail);
  // A stretch of `path` without valid records, found by its scan (`tail`: it runs to the end of
  // the file; `last`: the segment that was open, whose tail is cut).
  void NoteBadStretch(const std::string& path, const BadStretch& bad, bool tail, bool last,
                      uint64_t size);
  // Puts the value checksums the index lacks (objects recovered from a footer) for the keys of
  // `items` into the index, from their records' headers; drops a record found damaged.
  void LearnChecksums(absl::Span<const PutItem> items);
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

void KvStore::Impl::NoteOpenProblem(const std::string& line) {
  if (static_cast<int64_t>(open_problems.size()) >= kMaxProblems - 1) {
    ++open_problems_left_out;
    return;
  }
  LOG(WARNING) << "kv store " << dir << ": " << line;
  open_problems.push_back(line);
}

void KvStore::Impl::NoteRecoveryDrop(RecoveryDrop reason, int64_t records, const std::string& path,
                                     uint64_t offset, absl::string_view detail) {
  stats.recovery_dropped[static_cast<int>(reason)] += records;
  NoteOpenProblem(absl::StrCat(path, " at ", offset, ": ", RecoveryDropName(reason), ": ", records,
                               records == 1 ? " record" : " records", " dropped (", detail, ")"));
}

void KvStore::Impl::NoteBadStretch(const std::string& path, const BadStretch& bad, bool tail,
                                   bool last, uint64_t size) {
  if (tail && bad.footer()) {
    // Its records were durable before sealing began; only the footer is lost.
    if (last) {
      NoteOpenProblem(absl::StrCat(path, " at ", bad.start(), ": a footer cut short (",
                                   size - bad.start(), " bytes cut); its records kept"));
    }
    return;
  }
  if (tail && last) {
    // Written after the last fdatasync that covered a valid record: never acknowledged.
    const std::string& first =
        bad.first_bad_value().empty() ? bad.first_bad_header() : bad.first_bad_value();
    NoteRecoveryDrop(RecoveryDrop::kTornTail, bad.bad_values() + bad.bad_headers(), path,
                     bad.start(),
                     absl::StrCat(size - bad.start(), " bytes cut; the first ", first));
    return;
  }
  const char* where = tail ? "; after the segment's last valid record" : "; valid records follow";
  if (bad.bad_values() > 0) {
    NoteRecoveryDrop(RecoveryDrop::kChecksum, bad.bad_values(), path, bad.start(),
                     absl::StrCat("the first ", bad.first_bad_value(), where));
  }
  if (bad.bad_headers() > 0) {
    NoteRecoveryDrop(RecoveryDrop::kHeader, bad.bad_headers(), path, bad.start(),
                     absl::StrCat("no valid record header ", bad.first_bad_header(), where));
  }
}

absl::Status KvStore::Impl::RecoverSegment(uint32_t id, bool last,
                                           std::vector<FooterEntry>* records, bool* from_footer) {
  *from_footer = false;
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
    // A segment holds records only after its header was synced: none here.
    NoteOpenProblem(absl::StrCat(seg->path, ": empty or torn segment removed"));
    file.reset();
    return fs->Remove(seg->path);
  }
  if (!header_ok) NoteOpenProblem(absl::StrCat(seg->path, ": bad segment header"));

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
          *from_footer = true;
          return absl::OkStatus();
        }
        footer_problem = std::string(entries.status().message());
      }
    }
  }

  // No usable footer: scan every 4096-byte boundary for a valid record. (The segment that was
  // open has none by design.) A bad record is skipped, not the rest of the segment: what follows
  // it may have been acknowledged long after it was written, and is intact (checked). Each
  // stretch without valid records is counted and noted (NoteBadStretch).
  ++stats.segments_scanned;
  if (!last) NoteOpenProblem(absl::StrCat(seg->path, ": ", footer_problem, "; scanned"));
  uint64_t valid_end = kSegmentHeaderBytes;
  BadStretch bad;  // since valid_end
  AlignedBuffer chunk(kDirectIoAlignment);
  uint64_t pos = kSegmentHeaderBytes;
  while (pos + kRecordHeaderBytes <= size) {
    ASSIGN_OR_RETURN(size_t got, file->Read(pos, chunk.data(), kDirectIoAlignment));
    const absl::string_view block(chunk.data(), got);
    auto h = DecodeRecordHeader(block.substr(0, kRecordHeaderBytes));
    if (!h.ok()) {
      bad.NotARecord(pos, block, h.status().message());
      pos += kDirectIoAlignment;
      continue;
    }
    const uint64_t bytes = h->record_bytes();
    if (pos + bytes > size) {
      bad.BadRecord(pos, block, *h, "cut short by the end of the file");
      pos += kDirectIoAlignment;
      continue;
    }
    AlignedBuffer& rec = ReadBuffer(bytes);
    ASSIGN_OR_RETURN(size_t n, file->Read(pos, rec.data(), bytes));
    if (n < kRecordHeaderBytes + h->value_bytes) {
      bad.BadRecord(pos, block, *h, "cut short by the end of the file");
      pos += kDirectIoAlignment;
      continue;
    }
    if (Checksum(absl::string_view(rec.data() + kRecordHeaderBytes, h->value_bytes)) !=
        h->value_checksum) {
      bad.BadRecord(pos, block, *h, "value checksum mismatch");
      pos += kDirectIoAlignment;
      continue;
    }
    if (!bad.empty()) {
      NoteBadStretch(seg->path, bad, /*tail=*/false, last, size);
      bad = BadStretch();
    }
    FooterEntry e;
    e.header = *h;
    e.offset = pos;
    records->push_back(e);
    pos += bytes;
    valid_end = pos;
  }
  if (size > valid_end) {
    if (bad.empty()) {
      // Fewer than a header's bytes after the last valid record: a record header cut short (or
      // the start of a footer).
      ASSIGN_OR_RETURN(size_t got, file->Read(valid_end, chunk.data(), kDirectIoAlignment));
      bad.NotARecord(valid_end, absl::string_view(chunk.data(), got), "a record header cut short");
    }
    NoteBadStretch(seg->path, bad, /*tail=*/true, last, size);
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
  struct Found {
    uint32_t id;
    FooterEntry e;
    bool checksum_known;  // scanned, not from a footer
  };
  std::vector<Found> all;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<FooterEntry> records;
    bool from_footer = false;
    RETURN_IF_ERROR(RecoverSegment(ids[i], i + 1 == ids.size(), &records, &from_footer));
    for (FooterEntry& e : records) all.push_back({ids[i], e, !from_footer});
    next_segment = ids[i] + 1;
  }
  if (open_problems_left_out > 0) {
    const std::string line =
        absl::StrCat(open_problems_left_out, " more problems found while opening, not listed");
    LOG(WARNING) << "kv store " << dir << ": " << line;
    open_problems.push_back(line);
  }
  // The newest record of each key wins; a tombstone hides older objects.
  std::sort(all.begin(), all.end(),
            [](const Found& a, const Found& b) { return a.e.header.seq < b.e.header.seq; });
  for (const auto& [id, e, checksum_known] : all) {
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
    entry.checksum_known = checksum_known;
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
          std::lock_guard<std::mutex> lock(mu);
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
          std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(mu);
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

void KvStore::Impl::LearnChecksums(absl::Span<const PutItem> items) {
  struct Unknown {
    Entry entry;
    std::shared_ptr<File> file;
  };
  std::vector<Unknown> unknown;
  {
    std::lock_guard<std::mutex> lock(mu);
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
    std::lock_guard<std::mutex> lock(mu);
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
      std::lock_guard<std::mutex> lock(m.mu);
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
