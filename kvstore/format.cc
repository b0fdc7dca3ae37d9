#include "kvstore/format.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/le_encoding.h"

namespace ferry {
namespace kv {
namespace {

constexpr char kSegmentMagic[8] = {'F', 'K', 'V', 'S', 'E', 'G', '0', '1'};
constexpr char kTrailerMagic[8] = {'F', 'K', 'V', 'F', 'O', 'O', 'T', '1'};
constexpr uint32_t kRecordMagic = 0x52564B46;  // "FKVR"
constexpr uint32_t kVersion = 1;               // of segment headers and records
constexpr uint16_t kTombstoneFlag = 1;

// Sequence numbers and times a store can have written: no wrap-around or overflow downstream.
bool SaneSeqAndTime(uint64_t seq, int64_t created_us) {
  return seq < kMaxSequence && created_us >= 0 && created_us <= kMaxTimeUs;
}

// Reads little-endian fields from untrusted bytes; the caller checks the size first.
class LeReader {
 public:
  explicit LeReader(absl::string_view bytes) : p_(reinterpret_cast<const uint8_t*>(bytes.data())) {}
  uint8_t U8() { return p_[pos_++]; }
  uint16_t U16() {
    const uint16_t v = static_cast<uint16_t>(p_[pos_] | (p_[pos_ + 1] << 8));
    pos_ += 2;
    return v;
  }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | p_[pos_ + i];
    pos_ += 4;
    return v;
  }
  uint64_t U64() {
    const uint64_t lo = U32();
    return lo | (uint64_t{U32()} << 32);
  }
  Hash128 H128() {
    Hash128 h;
    h.lo = U64();
    h.hi = U64();
    return h;
  }
  void Skip(size_t n) { pos_ += n; }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* p_;
  size_t pos_ = 0;
};

void AppendU16Le(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v));
  out->push_back(static_cast<char>(v >> 8));
}

}  // namespace

const char* TrafficClassName(TrafficClass c) {
  switch (c) {
    case TrafficClass::kChat:
      return "chat";
    case TrafficClass::kAgent:
      return "agent";
    case TrafficClass::kBatch:
      return "batch";
  }
  return "unknown";
}

absl::StatusOr<TrafficClass> ParseTrafficClass(absl::string_view name) {
  if (name == "chat") return TrafficClass::kChat;
  if (name == "agent") return TrafficClass::kAgent;
  if (name == "batch") return TrafficClass::kBatch;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown traffic class '", name, "' (chat, agent or batch)"));
}

uint64_t Checksum(absl::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string EncodeSegmentHeader(const SegmentHeader& h) {
  std::string out(kSegmentMagic, 8);
  AppendU32Le(&out, kVersion);
  AppendU32Le(&out, h.id);
  AppendU64Le(&out, static_cast<uint64_t>(h.created_us));
  out.resize(kSegmentHeaderBytes - 8, '\0');
  AppendU64Le(&out, Checksum(out));
  return out;
}

absl::StatusOr<SegmentHeader> DecodeSegmentHeader(absl::string_view bytes) {
  if (bytes.size() < kSegmentHeaderBytes) return absl::DataLossError("short segment header");
  if (std::memcmp(bytes.data(), kSegmentMagic, 8) != 0) {
    return absl::DataLossError("not a segment (bad magic)");
  }
  LeReader r(bytes.substr(kSegmentHeaderBytes - 8));
  if (r.U64() != Checksum(bytes.substr(0, kSegmentHeaderBytes - 8))) {
    return absl::DataLossError("segment header checksum mismatch");
  }
  LeReader f(bytes.substr(8));
  if (f.U32() != kVersion) return absl::DataLossError("unknown segment format version");
  SegmentHeader h;
  h.id = f.U32();
  h.created_us = static_cast<int64_t>(f.U64());
  return h;
}

void EncodeRecordHeader(const RecordHeader& h, char* out) {
  std::string b;
  b.reserve(kRecordHeaderBytes);
  AppendU32Le(&b, kRecordMagic);
  AppendU16Le(&b, static_cast<uint16_t>(kVersion));
  AppendU16Le(&b, h.tombstone ? kTombstoneFlag : 0);
  AppendU32Le(&b, static_cast<uint32_t>(kRecordHeaderBytes));
  AppendU32Le(&b, h.meta.token_count);
  AppendHash128Le(&b, h.key);
  AppendHash128Le(&b, h.meta.fingerprint);
  AppendU64Le(&b, h.meta.layout_tag);
  AppendU64Le(&b, h.value_bytes);
  AppendU64Le(&b, h.seq);
  AppendU64Le(&b, static_cast<uint64_t>(h.created_us));
  b.push_back(static_cast<char>(h.meta.traffic_class));
  b.resize(84, '\0');
  AppendU32Le(&b, h.meta.retention_floor_s);
  AppendU64Le(&b, h.value_checksum);
  b.resize(120, '\0');
  AppendU64Le(&b, Checksum(b));
  std::memcpy(out, b.data(), kRecordHeaderBytes);
}

absl::StatusOr<RecordHeader> DecodeRecordHeader(absl::string_view bytes) {
  if (bytes.size() < kRecordHeaderBytes) return absl::DataLossError("short record header");
  LeReader c(bytes.substr(120));
  if (c.U64() != Checksum(bytes.substr(0, 120))) {
    return absl::DataLossError("record header checksum mismatch");
  }
  LeReader r(bytes);
  if (r.U32() != kRecordMagic) return absl::DataLossError("not a record (bad magic)");
  if (r.U16() != kVersion) return absl::DataLossError("unknown record format version");
  const uint16_t flags = r.U16();
  if ((flags & ~kTombstoneFlag) != 0) return absl::DataLossError("unknown record flags");
  if (r.U32() != kRecordHeaderBytes) return absl::DataLossError("unexpected record header size");
  RecordHeader h;
  h.tombstone = (flags & kTombstoneFlag) != 0;
  h.meta.token_count = r.U32();
  h.key = r.H128();
  h.meta.fingerprint = r.H128();
  h.meta.layout_tag = r.U64();
  h.value_bytes = r.U64();
  h.seq = r.U64();
  h.created_us = static_cast<int64_t>(r.U64());
  const uint8_t cls = r.U8();
  if (cls >= kNumTrafficClasses) return absl::DataLossError("unknown traffic class");
  h.meta.traffic_class = static_cast<TrafficClass>(cls);
  r.Skip(3);
  h.meta.retention_floor_s = r.U32();
  h.value_checksum = r.U64();
  if (h.value_bytes > kMaxValueBytes) return absl::DataLossError("record value too large");
  if (!SaneSeqAndTime(h.seq, h.created_us)) {
    return absl::DataLossError("record sequence number or time out of range");
  }
  if (h.tombstone && h.value_bytes != 0) return absl::DataLossError("tombstone with a value");
  return h;
}

size_t FooterEntryBytes(uint32_t footer_version) {
  switch (footer_version) {
    case 1:
      return kFooterEntryBytesV1;
    case 2:
      return kFooterEntryBytes;
  }
  return 0;
}

namespace {

// A version 2 entry.
std::string EncodeEntry(const FooterEntry& e) {
  std::string b;
  AppendHash128Le(&b, e.header.key);
  AppendHash128Le(&b, e.header.meta.fingerprint);
  AppendU64Le(&b, e.header.meta.layout_tag);
  AppendU64Le(&b, e.header.value_bytes);
  AppendU64Le(&b, e.header.seq);
  AppendU64Le(&b, static_cast<uint64_t>(e.header.created_us));
  AppendU64Le(&b, static_cast<uint64_t>(e.last_read_us));
  AppendU64Le(&b, e.offset);
  AppendU32Le(&b, e.header.meta.token_count);
  b.push_back(static_cast<char>(e.header.meta.traffic_class));
  b.push_back(static_cast<char>(e.header.tombstone ? kTombstoneFlag : 0));
  b.append(2, '\0');
  AppendU32Le(&b, e.header.meta.retention_floor_s);
  b.append(4, '\0');
  AppendU64Le(&b, Checksum(b));
  return b;
}

}  // namespace

std::string EncodeFooter(uint32_t segment_id, uint64_t footer_offset,
                         const std::vector<FooterEntry>& entries) {
  std::string out;
  out.reserve(entries.size() * kFooterEntryBytes + kDirectIoAlignment);
  for (const FooterEntry& e : entries) out += EncodeEntry(e);
  const uint64_t entries_checksum = Checksum(out);
  out.resize(AlignUp(out.size() + kTrailerBytes) - kTrailerBytes, '\0');
  std::string t(kTrailerMagic, 8);
  AppendU32Le(&t, kFooterVersion);
  AppendU32Le(&t, segment_id);
  AppendU64Le(&t, entries.size());
  AppendU64Le(&t, footer_offset);
  AppendU64Le(&t, entries_checksum);
  t.resize(56, '\0');
  AppendU64Le(&t, Checksum(t));
  return out + t;
}

absl::StatusOr<Trailer> DecodeTrailer(absl::string_view bytes, uint64_t file_size) {
  if (bytes.size() != kTrailerBytes) return absl::DataLossError("short trailer");
  if (std::memcmp(bytes.data(), kTrailerMagic, 8) != 0) {
    return absl::DataLossError("no footer (bad trailer magic)");
  }
  LeReader c(bytes.substr(56));
  if (c.U64() != Checksum(bytes.substr(0, 56))) {
    return absl::DataLossError("trailer checksum mismatch");
  }
  LeReader r(bytes.substr(8));
  Trailer t;
  t.version = r.U32();
  const uint64_t entry_bytes = FooterEntryBytes(t.version);
  if (entry_bytes == 0) return absl::DataLossError("unknown footer version");
  t.segment_id = r.U32();
  t.count = r.U64();
  t.footer_offset = r.U64();
  t.entries_checksum = r.U64();
  // The footer is count entries + padding + trailer, a multiple of 4096 ending the file.
  if (t.footer_offset < kSegmentHeaderBytes || t.footer_offset % kDirectIoAlignment != 0 ||
      t.footer_offset >= file_size || t.count > (file_size - t.footer_offset) / entry_bytes ||
      AlignUp(t.count * entry_bytes + kTrailerBytes) != file_size - t.footer_offset) {
    return absl::DataLossError("footer does not fit the file");
  }
  return t;
}

absl::StatusOr<std::vector<FooterEntry>> DecodeFooterEntries(absl::string_view bytes,
                                                             const Trailer& trailer) {
  const size_t entry_bytes = FooterEntryBytes(trailer.version);
  if (entry_bytes == 0) return absl::DataLossError("unknown footer version");
  if (trailer.count > bytes.size() / entry_bytes) return absl::DataLossError("short footer");
  const absl::string_view all = bytes.substr(0, trailer.count * entry_bytes);
  if (Checksum(all) != trailer.entries_checksum) {
    return absl::DataLossError("footer checksum mismatch");
  }
  std::vector<FooterEntry> entries;
  entries.reserve(trailer.count);
  for (uint64_t i = 0; i < trailer.count; ++i) {
    const absl::string_view b = all.substr(i * entry_bytes, entry_bytes);
    LeReader c(b.substr(entry_bytes - 8));
    if (c.U64() != Checksum(b.substr(0, entry_bytes - 8))) {
      return absl::DataLossError(absl::StrCat("footer entry ", i, " checksum mismatch"));
    }
    LeReader r(b);
    FooterEntry e;
    e.header.key = r.H128();
    e.header.meta.fingerprint = r.H128();
    e.header.meta.layout_tag = r.U64();
    e.header.value_bytes = r.U64();
    e.header.seq = r.U64();
    e.header.created_us = static_cast<int64_t>(r.U64());
    e.last_read_us = static_cast<int64_t>(r.U64());
    e.offset = r.U64();
    e.header.meta.token_count = r.U32();
    const uint8_t cls = r.U8();
    const uint8_t flags = r.U8();
    if (trailer.version >= 2) {
      r.Skip(2);
      e.header.meta.retention_floor_s = r.U32();
    }
    if (cls >= kNumTrafficClasses || (flags & ~kTombstoneFlag) != 0) {
      return absl::DataLossError(absl::StrCat("footer entry ", i, " is invalid"));
    }
    e.header.meta.traffic_class = static_cast<TrafficClass>(cls);
    e.header.tombstone = (flags & kTombstoneFlag) != 0;
    if (!SaneSeqAndTime(e.header.seq, e.header.created_us) || e.last_read_us < 0 ||
        e.last_read_us > kMaxTimeUs) {
      return absl::DataLossError(absl::StrCat("footer entry ", i, " has times out of range"));
    }
    if (e.header.value_bytes > kMaxValueBytes || (e.header.tombstone && e.header.value_bytes) ||
        e.offset < kSegmentHeaderBytes || e.offset % kDirectIoAlignment != 0 ||
        e.offset > trailer.footer_offset ||
        e.header.record_bytes() > trailer.footer_offset - e.offset) {
      return absl::DataLossError(absl::StrCat("footer entry ", i, " points outside the segment"));
    }
    entries.push_back(e);
  }
  return entries;
}

bool StartsWithFooterEntry(absl::string_view bytes) {
  if (bytes.size() < kFooterEntryBytes) return false;
  LeReader c(bytes.substr(kFooterEntryBytes - 8));
  return c.U64() == Checksum(bytes.substr(0, kFooterEntryBytes - 8));
}

std::string SegmentFileName(uint32_t id) { return absl::StrFormat("%08x.seg", id); }

absl::StatusOr<uint32_t> ParseSegmentFileName(absl::string_view name) {
  if (name.size() != 12 || name.substr(8) != ".seg") {
    return absl::InvalidArgumentError("not a segment file name");
  }
  uint32_t id = 0;
  for (char ch : name.substr(0, 8)) {
    int d;
    if (ch >= '0' && ch <= '9') {
      d = ch - '0';
    } else if (ch >= 'a' && ch <= 'f') {
      d = ch - 'a' + 10;
    } else {
      return absl::InvalidArgumentError("not a segment file name");
    }
    id = id * 16 + static_cast<uint32_t>(d);
  }
  return id;
}

}  // namespace kv
}  // namespace ferry
