// The KV store's storage engine (ARCHITECTURE.md §5): content-addressed KV blocks on local
// SSD, for any prefill worker to reuse any earlier prefix.
//
//   auto store = kv::KvStore::Open("/var/lib/ferry/kv", kv::StoreOptions{});
//   (*store)->Put({{hash, meta, bytes}});                         // durable when it returns
//   auto hits = (*store)->Exists(chain_hashes, fingerprint);      // longest present prefix
//   auto got = (*store)->Get({hash}, fingerprint);                // a miss, never corrupt bytes
//
// Layout: append-only segment files (format.h) written by one writer thread in groups: the
// puts and deletes queued while the previous group was being written become one sequential
// write and one fdatasync, after which all of them are acknowledged (group commit). Records are
// 4 KiB-aligned and read with O_DIRECT by (segment, offset, length) from an in-memory index
// (key -> location and metadata, ~100 bytes per object). A full segment is sealed with an index
// footer, so opening reads the footers and scans only the segment that was open (verifying every
// record there, and cutting a torn tail).
//
// Reads verify the record header and the value checksum; a corrupt or torn object is a miss
// (counted, dropped from the index), as is an object of another model fingerprint, an expired
// one, or a deleted one. The newest record of a key (by sequence number) wins across segments;
// deletes write tombstones.
//
// Recovery: the scan of a segment without a footer (the one that was open, or one whose footer is
// missing or damaged) indexes every valid record and skips the rest, one stretch of bad bytes at a
// time; records after a bad stretch are kept (they may have been acknowledged long after the
// damaged one was written). The bytes after the open segment's last valid record are a torn tail,
// written but never acknowledged (unless a damaged last record looks the same): they are cut
// (torn_bytes_dropped) and appending resumes there. Every record skipped is counted by RecoveryDrop
// reason (StoreStats::recovery_dropped) and logged as a WARNING naming the directory, the segment
// file, the offset and the reason; those lines, with the segment-level problems (a bad segment
// header, a missing footer), are the first problems of Verify()'s report until the store is closed.
// A cut-short footer (a crash while sealing) is not a record and is not counted.
//
// Retention and capacity: an object expires after its last use (creation or read) plus the longer
// of its traffic class's `ttl` and its own retention floor (ObjectMeta::retention_floor_s, kept in
// its record and its segment's footer, so a restart keeps it too). A Put of a present key with the
// same bytes asking for a longer floor writes the object again (the newest record wins). Neither
// the ttl nor a floor reserves room: capacity eviction comes first. When the segment files exceed
// capacity_bytes, the oldest segment is compacted: objects read since that segment was written are
// rewritten at the head (at most half a segment's worth, most recently read first; one more round
// each, as in a second-chance FIFO), the rest evicted, and the file removed, until the store is
// under the low watermark.
// Segments mostly dead (deleted, expired, superseded) are compacted the same way in the
// background, so the files stay within capacity and at most ~2x the live bytes; the index holds
// only live objects and tombstones are dropped once no older segment remains.
//
// Thread-safe: any number of readers and writers.

#ifndef FERRY_KVSTORE_KV_STORE_H_
#define FERRY_KVSTORE_KV_STORE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "kvstore/file_system.h"
#include "kvstore/format.h"

namespace ferry {
namespace kv {

struct StoreOptions {
  // Retention after last use, per traffic class (indexed by TrafficClass); an object's own
  // retention floor may keep it longer.
  std::array<absl::Duration, kNumTrafficClasses> ttl = {absl::Hours(24 * 7),  // chat
                                                        absl::Hours(24 * 3),  // agent
                                                        absl::Hours(24)};     // batch
  int64_t capacity_bytes = int64_t{64} << 30;  // segment files in all
  int64_t segment_bytes = int64_t{256} << 20;  // a segment is sealed when it reaches this
  int64_t max_object_bytes = int64_t{64} << 20;
  int64_t max_group_bytes = int64_t{64} << 20;  // written per fdatasync at most
  bool direct_io = true;                        // falls back where the filesystem refuses it
  Clock* clock = nullptr;                       // null: the real clock
  FileSystem* fs = nullptr;                     // null: POSIX
};

struct PutItem {
  Hash128 key;  // the block hash (the tenant's salt and the model are already in it)
  ObjectMeta meta;
  absl::string_view value;
};

struct GetResult {
  bool found = false;
  ObjectMeta meta;
  std::string value;
  uint64_t checksum = 0;  // XXH3-64 of value (verified against the bytes read)
  absl::Time created;
};

struct ExistsResult {
  int64_t prefix = 0;         // leading keys all present
  std::vector<bool> present;  // per key
  // Per key: the present object's retention floor (ObjectMeta::retention_floor_s), 0 for an
  // absent one; a writer that wants a longer one puts the object again.
  std::vector<uint32_t> retention_floor_s;
};

struct ClassStats {
  int64_t objects = 0, bytes = 0;
  // Objects by age since creation: < 1 h, < 1 day, < 3 days, < 7 days, older.
  std::array<int64_t, 5> by_age = {};
};

// Objects by retention floor: none, up to 5 minutes, up to an hour, longer.
inline constexpr int kFloorBuckets = 4;
int FloorBucket(uint32_t retention_floor_s);
const char* FloorBucketName(int bucket);  // "none", "5m", "1h", "longer"

// Why opening the store skipped a record of a segment it scanned (see the header comment).
enum class RecoveryDrop : uint8_t {
  // In the torn tail of the segment that was open (after its last valid record): a record cut
  // short, or whose header or value did not reach the disk. Expected after a crash.
  kTornTail = 0,
  // Elsewhere (before a valid record, or in a sealed segment scanned for want of its footer):
  // a record whose header verifies but whose value does not match its checksum, or is cut short
  // by the end of the file. Corruption.
  kChecksum = 1,
  // Elsewhere, bytes where a record should start that are no valid record header: one per
  // stretch of them (at least that many records). Corruption.
  kHeader = 2,
};
inline constexpr int kNumRecoveryDrops = 3;
const char* RecoveryDropName(RecoveryDrop reason);  // "torn_tail", "checksum", "header"

struct StoreStats {
  int64_t objects = 0;
  int64_t value_bytes = 0;
  int64_t file_bytes = 0;  // segment files on disk
  int64_t segments = 0;
  std::array<ClassStats, kNumTrafficClasses> classes;
  std::array<int64_t, kFloorBuckets> objects_by_floor = {};
  // Since open.
  int64_t puts = 0, put_bytes = 0, deletes = 0;  // puts: records written for Put items
  // Put items whose key was present (PutOutcome other than kWritten), and of those the ones with
  // other bytes (kConflict).
  int64_t already_present = 0, key_conflicts = 0;
  int64_t gets = 0, hits = 0, misses = 0, read_bytes = 0;
  int64_t corrupt_reads = 0;           // checksum or header mismatches (served as misses)
  int64_t fingerprint_mismatches = 0;  // objects of another model asked for (misses)
  int64_t expired = 0;                 // objects dropped by their TTL
  int64_t evicted = 0, evicted_bytes = 0;
  int64_t rewritten = 0, rewritten_bytes = 0;  // kept by compaction
  int64_t compactions = 0;
  int64_t group_commits = 0;
  // Opening: how long, how many objects, segments read by footer vs scanned.
  double open_seconds = 0;
  int64_t open_objects = 0, segments_from_footer = 0, segments_scanned = 0;
  int64_t torn_bytes_dropped = 0;  // a torn tail cut from the open segment
  // Records the scans skipped, by RecoveryDrop.
  std::array<int64_t, kNumRecoveryDrops> recovery_dropped = {};
  bool direct_io = false;
};

struct VerifyReport {
  int64_t objects_checked = 0, bytes_checked = 0;
  int64_t corrupt = 0;  // found by this check, dropped from the index
  // What opening the store skipped (StoreStats::recovery_dropped); not in `corrupt`.
  std::array<int64_t, kNumRecoveryDrops> recovery_dropped = {};
  // One line each (at most 100): the problems found while opening, then this check's.
  std::vector<std::string> problems;
};

// What a Put did with each of its items (see KvStore::Put).
enum class PutOutcome : uint8_t {
  kWritten = 0,        // a new object
  kPresent = 1,        // present with the same bytes: nothing written
  kFloorExtended = 2,  // present with the same bytes: written again for a longer retention floor
  kConflict = 3,       // present with other bytes: nothing written, the stored object kept
};

struct PutResult {
  std::vector<PutOutcome> outcomes;  // one per item, in order
  int64_t already_present = 0;       // items not kWritten
  int64_t conflicts = 0;             // items kConflict
};

class KvStore {
 public:
  // Opens (creating the directory if needed) and recovers; takes an exclusive lock on the
  // directory.
  static absl::StatusOr<std::unique_ptr<KvStore>> Open(const std::string& dir,
                                                       const StoreOptions& options);
  ~KvStore();  // waits for queued writes; nothing acknowledged is lost

  // Stores every item, durably when it returns OK, and says in `result` (when not null) what
  // became of each. An item over max_object_bytes fails the whole batch before anything is
  // written.
  //
  // Keys are content hashes, so a present key (live: not expired, not deleted) keeps its object:
  // the first writer wins, and a Put never replaces stored bytes. The item's XXH3-64 is compared
  // with the stored object's (kept in the index; for an object recovered from a sealed segment's
  // footer, which lacks it, read once from its record's header, never its value):
  //   - the same: kPresent, unless the item asks for a longer retention floor than the present
  //     object's; then it is written again with that floor and the longer-lived class of the two
  //     (the newest record wins), its last use now: kFloorExtended.
  //   - different (a hash collision, or a writer's bug): kConflict. Nothing is written, not even a
  //     longer floor (that would rewrite the key with the item's bytes, or keep disputed bytes
  //     longer); counted (StoreStats::key_conflicts) and logged as a WARNING with the key and
  //     both checksums.
  // A stored record whose header turns out damaged is dropped (a corrupt read) and the item is
  // written. The same key twice in one call, or in one group commit, is compared the same way
  // with the earlier item (a Delete in between makes the key absent again).
  absl::Status Put(absl::Span<const PutItem> items, PutResult* result = nullptr);
  // Misses for absent, expired, deleted, corrupt objects and objects of another fingerprint.
  std::vector<GetResult> Get(absl::Span<const Hash128> keys, const Hash128& fingerprint);
  // Presence by the index (no disk read): the longest present prefix, per-key presence and the
  // present objects' retention floors.
  ExistsResult Exists(absl::Span<const Hash128> keys, const Hash128& fingerprint);
  // Durable when it returns OK; the number of keys that were present.
  absl::StatusOr<int64_t> Delete(absl::Span<const Hash128> keys);

  // Everything, walking the index for the per-class age buckets (and leaving out objects past
  // their TTL that no sweep removed yet).
  StoreStats Stats() const;
  // The same without the walk, in constant time for metrics: by_age stays empty and objects past
  // their TTL still count until swept.
  StoreStats Counters() const;
  int64_t max_object_bytes() const;
  absl::Duration ttl(TrafficClass c) const;
  // Reads and checks every object; corrupt ones become misses. Also drops expired objects. The
  // report starts with what opening the store found (its problems and recovery_dropped).
  VerifyReport Verify();
  // Compacts now: expired objects dropped, every segment with dead space rewritten, then the
  // capacity enforced.
  absl::Status Compact();

  struct Impl;

 private:
  explicit KvStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_KV_STORE_H_
