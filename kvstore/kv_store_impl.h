// KvStore's insides (kv_store.h is the API), shared by the files that implement them: KvStore::Impl
// with its index, segment table and writer queue, the index entry and segment records it keeps,
// and the record-reading helpers more than one of those files needs. Internal to
// //kvstore:kv_store (a private header of that library); nothing outside the package includes it.
//
// Impl's methods are defined by concept, one file each:
//   kv_store.cc                Open and close, the public API (Put, Get, Exists, Delete, Stats,
//                              Verify, Compact) and the index's bookkeeping (AddEntry,
//                              RemoveEntry, LearnChecksums).
//   kv_store_recovery.cc       Start-up: sealed segments read by their footers, the segment
//                              that was open (or one without a usable footer) scanned, torn and
//                              corrupt records dropped and reported, the index rebuilt.
//   kv_store_group_writer.cc   The writer thread: the queue of puts, deletes and compactions,
//                              group commit (one write and one fdatasync per group), the open
//                              segment (appending, sealing, starting the next) and the
//                              acknowledgements.
//   kv_store_compaction.cc     Retention and capacity on the writer thread: expired objects
//                              swept, mostly dead segments and (over capacity) the oldest ones
//                              rewritten and removed.
//
// Ownership: the KvStore owns its Impl; Impl owns the directory lock, the segments (shared with
// readers, which hold a segment's File while they read it) and the writer thread, joined by
// ~KvStore after the queue drains.
//
// Threading: `mu` guards the index, the segment table, the stats and what opening found; the
// writer thread alone touches the writer state (the open segment, its tail, the sequence numbers)
// after Open; `qmu` guards the queue and each Op's `done`. Readers take `mu` only to look up and
// to update the index, never across a disk read.
//
// Errors are absl::Status values: a failed group is not acknowledged (its ops get the error and
// the segment is given up); a record found damaged by a read is a miss, counted and dropped from
// the index.

#ifndef FERRY_KVSTORE_KV_STORE_IMPL_H_
#define FERRY_KVSTORE_KV_STORE_IMPL_H_

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "kvstore/file_system.h"
#include "kvstore/format.h"
#include "kvstore/kv_store.h"

namespace ferry {
namespace kv {
namespace kv_store_internal {

// Lines of problems kept for Verify()'s report (what opening found, then what Verify finds).
inline constexpr int64_t kMaxProblems = 100;

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

// What a segment scan found where records should be and are not (kv_store_recovery.cc).
class BadStretch;

// A thread's read buffer for direct I/O (kv_store.cc).
AlignedBuffer& ReadBuffer(size_t bytes);

// Reads the record at `offset` into `buf` (record_bytes, aligned) and checks it against `want`
// (key, sequence, length, fingerprint) and its checksums; OK only for an intact record, whose
// header it returns in `header` (kv_store.cc).
absl::Status ReadRecordInto(const File& file, uint64_t offset, const RecordHeader& want, char* buf,
                            RecordHeader* header);

}  // namespace kv_store_internal

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
    bool done = false;  // under the store's qmu
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
  mutable absl::Mutex mu;
  absl::flat_hash_map<Hash128, kv_store_internal::Entry> index ABSL_GUARDED_BY(mu);
  // By id: oldest first.
  std::map<uint32_t, std::shared_ptr<kv_store_internal::Segment>> segments ABSL_GUARDED_BY(mu);
  StoreStats stats ABSL_GUARDED_BY(mu);
  // Objects and value bytes in the index.
  std::array<ClassStats, kNumTrafficClasses> live ABSL_GUARDED_BY(mu);
  std::array<int64_t, kFloorBuckets> live_by_floor ABSL_GUARDED_BY(mu) = {};
  // What opening found (NoteOpenProblem), at most kMaxProblems lines, the last of them a count
  // of those left out.
  std::vector<std::string> open_problems ABSL_GUARDED_BY(mu);
  int64_t open_problems_left_out ABSL_GUARDED_BY(mu) = 0;

  // Writer thread state (only the writer touches these after Open).
  // null after a write error until the next group
  std::shared_ptr<kv_store_internal::Segment> open;
  uint64_t tail = 0;  // next record offset in `open`
  uint64_t next_seq = 1;
  uint32_t next_segment = 0;
  int64_t last_sweep_us = 0;

  // The writer's queue.
  absl::Mutex qmu;
  absl::CondVar qcv, done_cv;
  std::deque<Op*> queue ABSL_GUARDED_BY(qmu);
  bool stopping ABSL_GUARDED_BY(qmu) = false;
  std::thread writer;

  int64_t NowUs() const { return absl::ToUnixMicros(clock->Now()); }
  // How long after its last use an object of `meta` is kept: its class's ttl or its own floor.
  int64_t RetentionUs(const ObjectMeta& meta) const {
    return std::max(absl::ToInt64Microseconds(options.ttl[static_cast<int>(meta.traffic_class)]),
                    static_cast<int64_t>(meta.retention_floor_s) * 1'000'000);
  }
  bool Expired(const kv_store_internal::Entry& e, int64_t now) const {
    return now - e.last_use_us() > RetentionUs(e.header.meta);
  }

  // Recovery (kv_store_recovery.cc): the index and the segments from the files, and the segment
  // that was open (`open`), if it is to be appended to; null: a new one is to be started.
  absl::Status Recover() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Reads segment `id` (`last`: the one that was open) into `records`; `from_footer` says whether
  // they came from its footer (whose entries lack the value checksums).
  absl::Status RecoverSegment(uint32_t id, bool last, std::vector<FooterEntry>* records,
                              bool* from_footer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The one way opening reports what it found: a WARNING, and a line of Verify()'s report.
  void NoteOpenProblem(const std::string& line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Records a scan of `path` skipped: counted by reason, and noted.
  void NoteRecoveryDrop(RecoveryDrop reason, int64_t records, const std::string& path,
                        uint64_t offset, absl::string_view detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A stretch of `path` without valid records, found by its scan (`tail`: it runs to the end of
  // the file; `last`: the segment that was open, whose tail is cut).
  void NoteBadStretch(const std::string& path, const kv_store_internal::BadStretch& bad, bool tail,
                      bool last, uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The index (kv_store.cc).
  // Puts the value checksums the index lacks (objects recovered from a footer) for the keys of
  // `items` into the index, from their records' headers; drops a record found damaged.
  void LearnChecksums(absl::Span<const PutItem> items) ABSL_LOCKS_EXCLUDED(mu);
  void RemoveEntry(absl::flat_hash_map<Hash128, kv_store_internal::Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void AddEntry(const kv_store_internal::Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  int64_t TotalFileBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The writer thread (kv_store_group_writer.cc).
  absl::Status StartSegment() ABSL_LOCKS_EXCLUDED(mu);
  absl::Status Seal() ABSL_LOCKS_EXCLUDED(mu);
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
  void Apply(const std::vector<Pending>& pending) ABSL_LOCKS_EXCLUDED(mu);

  // Compaction (writer thread; kv_store_compaction.cc).
  absl::Status CompactSegment(uint32_t id, bool capacity) ABSL_LOCKS_EXCLUDED(mu);
  absl::Status Maintain(bool full) ABSL_LOCKS_EXCLUDED(mu);
  void SweepExpired() ABSL_LOCKS_EXCLUDED(mu);
};

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_KV_STORE_IMPL_H_
