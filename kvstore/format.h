// The KV store's on-disk format (ARCHITECTURE.md §5). Everything is little-endian.
//
// A segment file `<id as 8 hex digits>.seg` is append-only:
//
//   offset 0      segment header, 4096 bytes: magic "FKVSEG01", u32 format version (1), u32
//                 segment id, i64 created (unix microseconds), zeros, u64 XXH3-64 of the bytes
//                 before it at offset 4088.
//   offset 4096   records, each starting at a multiple of 4096 and padded with zeros to one:
//                   a 128-byte record header (below), then value_bytes of value.
//   sealed only:  the footer: one 96-byte entry per record of the segment, zero padding, and a
//                 64-byte trailer that ends the file (the footer is a multiple of 4096 bytes).
//
// Record header (128 bytes):
//   0 u32 magic 0x52564B46 ("FKVR")   4 u16 version (1)   6 u16 flags (bit 0: tombstone)
//   8 u32 header bytes (128)          12 u32 token count  16 key (Hash128: lo, hi)
//   32 model fingerprint (Hash128)    48 u64 layout tag   56 u64 value bytes
//   64 u64 sequence number            72 i64 created (unix us)   80 u8 traffic class
//   81..83 zero                       84 u32 retention floor (seconds)
//   88 u64 XXH3-64 of the value       96..119 zero       120 u64 XXH3-64 of bytes 0..119
// The retention floor took bytes that were zero before it existed: older records read as floor
// 0 (the class alone), with the same version.
//
// Footer entry, version 2 (104 bytes): key, fingerprint, u64 layout tag, u64 value bytes, u64
// sequence, i64 created, i64 last read (unix us, as of sealing), u64 record offset, u32 token
// count, u8 class, u8 flags, 2 zero bytes, u32 retention floor (seconds), 4 zero bytes, u64
// XXH3-64 of the entry's first 96 bytes. Version 1 (96 bytes, written before retention floors;
// still read, as floor 0): the same up to the 2 zero bytes, then u64 XXH3-64 of the first 88.
//
// Trailer (64 bytes, the file's last): magic "FKVFOOT1", u32 footer version (2; 1 is still read),
// u32 segment id, u64 entry count, u64 footer offset (where the entries start, a multiple of
// 4096), u64 XXH3-64 of the entries, 16 zero bytes, u64 XXH3-64 of the trailer's first 56 bytes.
// (A build that predates version 2 refuses its footer and scans the segment instead.)
//
// A record is valid when its header checksum, magic, version and lengths hold and its value's
// checksum matches; anything else is not a record (a torn or corrupt write), never an error.
// Every decoder here takes untrusted bytes.

#ifndef FERRY_KVSTORE_FORMAT_H_
#define FERRY_KVSTORE_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/common/hash128.h"
#include "kvstore/file_system.h"

namespace ferry {
namespace kv {

// Traffic classes, each with its own retention. Stored as one byte; new classes append.
enum class TrafficClass : uint8_t { kChat = 0, kAgent = 1, kBatch = 2 };
inline constexpr int kNumTrafficClasses = 3;
const char* TrafficClassName(TrafficClass c);
absl::StatusOr<TrafficClass> ParseTrafficClass(absl::string_view name);

// What the store keeps about an object besides its bytes.
struct ObjectMeta {
  Hash128 fingerprint;      // the model fingerprint the KV belongs to
  uint64_t layout_tag = 0;  // the writer's KV layout (layers, heads, dtype, block tokens)
  uint32_t token_count = 0;
  TrafficClass traffic_class = TrafficClass::kChat;
  // The object is kept at least this long after its last use, whatever its class's ttl (the
  // class may keep it longer); 0: the class alone.
  uint32_t retention_floor_s = 0;
};

inline constexpr size_t kSegmentHeaderBytes = 4096;
inline constexpr size_t kRecordHeaderBytes = 128;
// Footers are written in version kFooterVersion; version 1 footers are read too.
inline constexpr uint32_t kFooterVersion = 2;
inline constexpr size_t kFooterEntryBytes = 104;   // version 2
inline constexpr size_t kFooterEntryBytesV1 = 96;  // version 1
// The entry size of a footer version (0 for a version this build does not know).
size_t FooterEntryBytes(uint32_t footer_version);
inline constexpr size_t kTrailerBytes = 64;
// Larger values are refused by the decoders (and by the store, with its own smaller limit).
inline constexpr uint64_t kMaxValueBytes = uint64_t{1} << 32;
// Sequence numbers at or past kMaxSequence, and times (unix microseconds) outside
// [0, kMaxTimeUs] (about the year 4250), are refused too.
inline constexpr uint64_t kMaxSequence = uint64_t{1} << 62;
inline constexpr int64_t kMaxTimeUs = int64_t{1} << 56;

uint64_t Checksum(absl::string_view bytes);  // XXH3-64, seed 0

struct SegmentHeader {
  uint32_t id = 0;
  int64_t created_us = 0;
};
std::string EncodeSegmentHeader(const SegmentHeader& h);  // kSegmentHeaderBytes
absl::StatusOr<SegmentHeader> DecodeSegmentHeader(absl::string_view bytes);

struct RecordHeader {
  Hash128 key;
  ObjectMeta meta;
  bool tombstone = false;
  uint64_t value_bytes = 0;
  uint64_t seq = 0;
  int64_t created_us = 0;
  uint64_t value_checksum = 0;

  // Header + value, padded to the alignment.
  uint64_t record_bytes() const { return AlignUp(kRecordHeaderBytes + value_bytes); }
};
void EncodeRecordHeader(const RecordHeader& h, char* out);  // kRecordHeaderBytes
absl::StatusOr<RecordHeader> DecodeRecordHeader(absl::string_view bytes);

struct FooterEntry {
  RecordHeader header;  // value_checksum is not kept in the footer (0)
  int64_t last_read_us = 0;
  uint64_t offset = 0;
};

// The footer (version kFooterVersion) for `entries` written at `footer_offset` (a multiple of
// 4096, after every record): a multiple of 4096 bytes, the trailer last.
std::string EncodeFooter(uint32_t segment_id, uint64_t footer_offset,
                         const std::vector<FooterEntry>& entries);

struct Trailer {
  uint32_t version = kFooterVersion;  // of the footer: its entries' layout
  uint32_t segment_id = 0;
  uint64_t count = 0;
  uint64_t footer_offset = 0;
  uint64_t entries_checksum = 0;
};
// The trailer in the last kTrailerBytes of a file of `file_size` bytes, checked against it.
absl::StatusOr<Trailer> DecodeTrailer(absl::string_view bytes, uint64_t file_size);
// The entries (the bytes from trailer.footer_offset, count * FooterEntryBytes(version) of them),
// each checked: offsets aligned, after the segment header, records before the footer.
absl::StatusOr<std::vector<FooterEntry>> DecodeFooterEntries(absl::string_view bytes,
                                                             const Trailer& trailer);
// Whether `bytes` start with a footer entry of version kFooterVersion whose own checksum holds:
// how a segment scan tells the start of a footer cut short (a crash while sealing) from records.
bool StartsWithFooterEntry(absl::string_view bytes);

std::string SegmentFileName(uint32_t id);
// The id of a segment file name, or nullopt-like error for other names.
absl::StatusOr<uint32_t> ParseSegmentFileName(absl::string_view name);

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_FORMAT_H_
