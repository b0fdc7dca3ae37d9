// The KV store's on-disk format: every encoder's output decodes to what was encoded, every
// single-bit flip of a record header, segment header, footer entry and trailer is refused,
// lengths and offsets that do not fit the file are refused, segment file names are exactly
// 8 lowercase hex digits + ".seg", and the fuzz seeds (written by make_fuzz_corpus.py from the
// description in format.h, not from format.cc) decode. Files written before retention floors
// (record headers with zeros where the floor is, version 1 footers) still decode, as floor 0.

#include "kvstore/format.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/common/le_encoding.h"
#include "gtest/gtest.h"

namespace ferry {
namespace kv {
namespace {

Hash128 H(uint64_t lo, uint64_t hi) {
  Hash128 h;
  h.lo = lo;
  h.hi = hi;
  return h;
}

RecordHeader SampleHeader(uint64_t i = 1) {
  RecordHeader h;
  h.key = H(0x0123456789abcdef + i, 0xfedcba9876543210 - i);
  h.meta.fingerprint = H(0x1111111111111111, 0x2222222222222222 + i);
  h.meta.layout_tag = 0x00c0ffee00000000 + i;
  h.meta.token_count = 64 + static_cast<uint32_t>(i);
  h.meta.traffic_class = i % 2 ? TrafficClass::kAgent : TrafficClass::kChat;
  h.meta.retention_floor_s = 300 * static_cast<uint32_t>(i) + 7;
  h.value_bytes = 1000 * i;
  h.seq = 77 + i;
  h.created_us = 1'750'000'000'000'000 + static_cast<int64_t>(i);
  h.value_checksum = 0xabcdef0123456789 ^ i;
  return h;
}

void ExpectSameHeader(const RecordHeader& a, const RecordHeader& b) {
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.meta.fingerprint, b.meta.fingerprint);
  EXPECT_EQ(a.meta.layout_tag, b.meta.layout_tag);
  EXPECT_EQ(a.meta.token_count, b.meta.token_count);
  EXPECT_EQ(a.meta.traffic_class, b.meta.traffic_class);
  EXPECT_EQ(a.meta.retention_floor_s, b.meta.retention_floor_s);
  EXPECT_EQ(a.tombstone, b.tombstone);
  EXPECT_EQ(a.value_bytes, b.value_bytes);
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.created_us, b.created_us);
  EXPECT_EQ(a.value_checksum, b.value_checksum);
}

std::string EncodeHeader(const RecordHeader& h) {
  std::string out(kRecordHeaderBytes, '\0');
  EncodeRecordHeader(h, out.data());
  return out;
}

// Stores the checksum of bytes [start, sum_at) at sum_at: after Put, a structure that is well
// checksummed but otherwise wrong.
void Reseal(std::string* s, size_t start, size_t sum_at) {
  const uint64_t sum = Checksum(absl::string_view(*s).substr(start, sum_at - start));
  for (int i = 0; i < 8; ++i) (*s)[sum_at + i] = static_cast<char>(sum >> (8 * i));
}

void Put(std::string* s, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) (*s)[at + i] = static_cast<char>(v >> (8 * i));
}

std::vector<FooterEntry> SampleEntries(int n, uint64_t first_offset = kSegmentHeaderBytes) {
  std::vector<FooterEntry> entries;
  uint64_t offset = first_offset;
  for (int i = 0; i < n; ++i) {
    FooterEntry e;
    e.header = SampleHeader(static_cast<uint64_t>(i) + 1);
    e.header.value_checksum = 0;  // not kept in the footer
    e.last_read_us = 1'750'000'100'000'000 + i;
    e.offset = offset;
    offset += e.header.record_bytes();
    entries.push_back(e);
  }
  return entries;
}

uint64_t EndOf(const std::vector<FooterEntry>& entries) {
  return entries.empty() ? kSegmentHeaderBytes
                         : entries.back().offset + entries.back().header.record_bytes();
}

// A whole sealed file's tail: the footer at `footer_offset`; returns the file size.
struct Footer {
  std::string bytes;
  uint64_t offset = 0;
  uint64_t file_size() const { return offset + bytes.size(); }
  absl::string_view trailer() const {
    return absl::string_view(bytes).substr(bytes.size() - kTrailerBytes);
  }
};

Footer MakeFooter(const std::vector<FooterEntry>& entries, uint32_t id = 5) {
  Footer f;
  f.offset = AlignUp(EndOf(entries));
  f.bytes = EncodeFooter(id, f.offset, entries);
  return f;
}

// The first 88 bytes of a footer entry, the same in both versions (format.h): key, fingerprint,
// layout tag, value bytes, seq, created, last read, offset, token count, class, flags, 2 zeros.
std::string EntryFields(const FooterEntry& e) {
  std::string entry;
  AppendHash128Le(&entry, e.header.key);
  AppendHash128Le(&entry, e.header.meta.fingerprint);
  AppendU64Le(&entry, e.header.meta.layout_tag);
  AppendU64Le(&entry, e.header.value_bytes);
  AppendU64Le(&entry, e.header.seq);
  AppendU64Le(&entry, static_cast<uint64_t>(e.header.created_us));
  AppendU64Le(&entry, static_cast<uint64_t>(e.last_read_us));
  AppendU64Le(&entry, e.offset);
  AppendU32Le(&entry, e.header.meta.token_count);
  entry.push_back(static_cast<char>(e.header.meta.traffic_class));
  entry.push_back(e.header.tombstone ? 1 : 0);  // flags
  entry.append(2, '\0');
  return entry;
}

// A version 1 footer (as written before retention floors), from format.h's description: 96-byte
// entries without the floor.
Footer MakeFooterV1(const std::vector<FooterEntry>& entries, uint32_t id = 5) {
  std::string b;
  for (const FooterEntry& e : entries) {
    std::string entry = EntryFields(e);
    AppendU64Le(&entry, Checksum(entry));
    b += entry;
  }
  const uint64_t entries_checksum = Checksum(b);
  b.resize(AlignUp(b.size() + kTrailerBytes) - kTrailerBytes, '\0');
  Footer f;
  f.offset = AlignUp(EndOf(entries));
  std::string t("FKVFOOT1");
  AppendU32Le(&t, 1);
  AppendU32Le(&t, id);
  AppendU64Le(&t, entries.size());
  AppendU64Le(&t, f.offset);
  AppendU64Le(&t, entries_checksum);
  t.resize(56, '\0');
  AppendU64Le(&t, Checksum(t));
  f.bytes = b + t;
  return f;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// --- Round trips ----------------------------------------------------------------------------

TEST(FormatTest, ChecksumIsXxh3With0Seed) {
  EXPECT_EQ(Checksum(""), 0x2d06800538d394c2u);
  EXPECT_EQ(Checksum("ferry"), 0xd152ce34ff76fb2bu);
}

TEST(FormatTest, TrafficClassNamesRoundTrip) {
  for (int c = 0; c < kNumTrafficClasses; ++c) {
    const TrafficClass tc = static_cast<TrafficClass>(c);
    auto parsed = ParseTrafficClass(TrafficClassName(tc));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, tc);
  }
  EXPECT_STREQ(TrafficClassName(TrafficClass::kChat), "chat");
  EXPECT_STREQ(TrafficClassName(TrafficClass::kAgent), "agent");
  EXPECT_STREQ(TrafficClassName(TrafficClass::kBatch), "batch");
  EXPECT_FALSE(ParseTrafficClass("Chat").ok());
  EXPECT_FALSE(ParseTrafficClass("").ok());
  EXPECT_FALSE(ParseTrafficClass("interactive").ok());
}

TEST(FormatTest, SegmentHeaderRoundTrips) {
  for (const SegmentHeader& h :
       {SegmentHeader{0, 0}, SegmentHeader{1, 1'750'000'000'000'000}, SegmentHeader{0xffffffff, -1},
        SegmentHeader{0x12345678, INT64_MIN}}) {
    const std::string bytes = EncodeSegmentHeader(h);
    ASSERT_EQ(bytes.size(), kSegmentHeaderBytes);
    EXPECT_EQ(bytes.substr(0, 8), "FKVSEG01");
    auto got = DecodeSegmentHeader(bytes);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->id, h.id);
    EXPECT_EQ(got->created_us, h.created_us);
  }
}

TEST(FormatTest, SegmentHeaderLayoutIsAsDocumented) {
  const std::string b = EncodeSegmentHeader({0x0a0b0c0d, 0x0102030405060708});
  std::string want("FKVSEG01");
  AppendU32Le(&want, 1);
  AppendU32Le(&want, 0x0a0b0c0d);
  AppendU64Le(&want, 0x0102030405060708);
  want.resize(kSegmentHeaderBytes - 8, '\0');
  AppendU64Le(&want, Checksum(want));
  EXPECT_EQ(b, want);
}

TEST(FormatTest, RecordHeaderRoundTrips) {
  std::vector<RecordHeader> headers = {RecordHeader{}, SampleHeader(1), SampleHeader(2)};
  RecordHeader tomb = SampleHeader(3);
  tomb.tombstone = true;
  tomb.value_bytes = 0;
  headers.push_back(tomb);
  RecordHeader extremes = SampleHeader(4);
  extremes.value_bytes = kMaxValueBytes;
  extremes.seq = kMaxSequence - 1;
  extremes.created_us = kMaxTimeUs;
  extremes.meta.token_count = UINT32_MAX;
  extremes.meta.retention_floor_s = UINT32_MAX;
  extremes.meta.layout_tag = UINT64_MAX;
  extremes.key = H(UINT64_MAX, UINT64_MAX);
  headers.push_back(extremes);
  for (const RecordHeader& h : headers) {
    const std::string bytes = EncodeHeader(h);
    auto got = DecodeRecordHeader(bytes);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameHeader(*got, h);
    // Bytes after the header (the value) do not matter.
    auto longer = DecodeRecordHeader(bytes + "value bytes");
    ASSERT_TRUE(longer.ok()) << longer.status();
    ExpectSameHeader(*longer, h);
  }
}

TEST(FormatTest, SequenceNumbersAndTimesOutOfRangeAreRefused) {
  // Checksummed but impossible: a sequence number that would wrap, times that would overflow.
  for (int which = 0; which < 3; ++which) {
    RecordHeader h = SampleHeader(5);
    if (which == 0) h.seq = kMaxSequence;
    if (which == 1) h.created_us = -1;
    if (which == 2) h.created_us = kMaxTimeUs + 1;
    EXPECT_FALSE(DecodeRecordHeader(EncodeHeader(h)).ok()) << which;
  }
}

TEST(FormatTest, RecordHeaderLayoutIsAsDocumented) {
  const RecordHeader h = SampleHeader(1);
  const std::string b = EncodeHeader(h);
  std::string want;
  AppendU32Le(&want, 0x52564B46);
  want += std::string("\x01\x00\x00\x00", 4);  // version 1, flags 0
  AppendU32Le(&want, 128);
  AppendU32Le(&want, h.meta.token_count);
  AppendHash128Le(&want, h.key);
  AppendHash128Le(&want, h.meta.fingerprint);
  AppendU64Le(&want, h.meta.layout_tag);
  AppendU64Le(&want, h.value_bytes);
  AppendU64Le(&want, h.seq);
  AppendU64Le(&want, static_cast<uint64_t>(h.created_us));
  want.push_back(static_cast<char>(h.meta.traffic_class));
  want.resize(84, '\0');
  AppendU32Le(&want, h.meta.retention_floor_s);
  AppendU64Le(&want, h.value_checksum);
  want.resize(120, '\0');
  AppendU64Le(&want, Checksum(want));
  EXPECT_EQ(b, want);
  EXPECT_EQ(h.record_bytes(), 4096u);  // 128 + 1000, padded
}

TEST(FormatTest, RecordHeadersWrittenBeforeFloorsReadAsFloorZero) {
  // The layout before retention floors: bytes 81..87 zero, the same version.
  RecordHeader h = SampleHeader(1);
  std::string old;
  AppendU32Le(&old, 0x52564B46);
  old += std::string("\x01\x00\x00\x00", 4);
  AppendU32Le(&old, 128);
  AppendU32Le(&old, h.meta.token_count);
  AppendHash128Le(&old, h.key);
  AppendHash128Le(&old, h.meta.fingerprint);
  AppendU64Le(&old, h.meta.layout_tag);
  AppendU64Le(&old, h.value_bytes);
  AppendU64Le(&old, h.seq);
  AppendU64Le(&old, static_cast<uint64_t>(h.created_us));
  old.push_back(static_cast<char>(h.meta.traffic_class));
  old.resize(88, '\0');
  AppendU64Le(&old, h.value_checksum);
  old.resize(120, '\0');
  AppendU64Le(&old, Checksum(old));
  auto got = DecodeRecordHeader(old);
  ASSERT_TRUE(got.ok()) << got.status();
  h.meta.retention_floor_s = 0;
  ExpectSameHeader(*got, h);
  // And a floor of 0 is written as those zeros.
  EXPECT_EQ(EncodeHeader(h), old);
}

TEST(FormatTest, RecordBytesPadToTheAlignment) {
  RecordHeader h;
  h.value_bytes = 0;
  EXPECT_EQ(h.record_bytes(), 4096u);
  h.value_bytes = 4096 - kRecordHeaderBytes;
  EXPECT_EQ(h.record_bytes(), 4096u);
  h.value_bytes = 4096 - kRecordHeaderBytes + 1;
  EXPECT_EQ(h.record_bytes(), 8192u);
  h.value_bytes = kMaxValueBytes;
  EXPECT_EQ(h.record_bytes(), kMaxValueBytes + 4096);
}

TEST(FormatTest, FooterRoundTrips) {
  for (int n : {0, 1, 3, 38, 39, 100}) {  // 38 entries and the trailer fit one block, 39 do not
    std::vector<FooterEntry> entries = SampleEntries(n);
    if (n > 1) {
      entries[1].header.tombstone = true;
      entries[1].header.value_bytes = 0;
    }
    const Footer f = MakeFooter(entries, 7);
    ASSERT_EQ(f.bytes.size() % 4096, 0u) << n;
    EXPECT_EQ(f.bytes.size(), AlignUp(n * kFooterEntryBytes + kTrailerBytes)) << n;
    auto t = DecodeTrailer(f.trailer(), f.file_size());
    ASSERT_TRUE(t.ok()) << n << ": " << t.status();
    EXPECT_EQ(t->version, kFooterVersion);
    EXPECT_EQ(t->segment_id, 7u);
    EXPECT_EQ(t->count, static_cast<uint64_t>(n));
    EXPECT_EQ(t->footer_offset, f.offset);
    EXPECT_EQ(t->entries_checksum,
              Checksum(absl::string_view(f.bytes).substr(0, n * kFooterEntryBytes)));
    auto got = DecodeFooterEntries(f.bytes, *t);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status();
    ASSERT_EQ(got->size(), entries.size());
    for (int i = 0; i < n; ++i) {
      ExpectSameHeader((*got)[i].header, entries[i].header);
      EXPECT_EQ((*got)[i].last_read_us, entries[i].last_read_us);
      EXPECT_EQ((*got)[i].offset, entries[i].offset);
    }
  }
  EXPECT_EQ(AlignUp(38 * kFooterEntryBytes + kTrailerBytes), 4096u);
  EXPECT_EQ(AlignUp(39 * kFooterEntryBytes + kTrailerBytes), 8192u);
}

TEST(FormatTest, AFooterCutShortIsToldFromRecords) {
  const Footer f = MakeFooter(SampleEntries(3));
  EXPECT_TRUE(StartsWithFooterEntry(f.bytes));
  EXPECT_TRUE(StartsWithFooterEntry(absl::string_view(f.bytes).substr(0, kFooterEntryBytes)));
  EXPECT_FALSE(StartsWithFooterEntry(absl::string_view(f.bytes).substr(0, kFooterEntryBytes - 1)));
  std::string flipped = f.bytes;
  flipped[10] ^= 1;
  EXPECT_FALSE(StartsWithFooterEntry(flipped));
  // A record, and zeros, are not.
  std::string record(kRecordHeaderBytes + 1000, '\0');
  EXPECT_FALSE(StartsWithFooterEntry(record));
  EncodeRecordHeader(SampleEntries(1)[0].header, record.data());
  EXPECT_FALSE(StartsWithFooterEntry(record));
}

TEST(FormatTest, Version1FootersDecodeWithFloorZero) {
  for (int n : {0, 1, 3, 42, 43, 100}) {  // 42 entries and the trailer fit one block, 43 do not
    std::vector<FooterEntry> entries = SampleEntries(n);
    if (n > 1) {
      entries[1].header.tombstone = true;
      entries[1].header.value_bytes = 0;
    }
    const Footer f = MakeFooterV1(entries, 7);
    ASSERT_EQ(f.bytes.size(), AlignUp(n * kFooterEntryBytesV1 + kTrailerBytes)) << n;
    auto t = DecodeTrailer(f.trailer(), f.file_size());
    ASSERT_TRUE(t.ok()) << n << ": " << t.status();
    EXPECT_EQ(t->version, 1u);
    EXPECT_EQ(t->count, static_cast<uint64_t>(n));
    auto got = DecodeFooterEntries(f.bytes, *t);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status();
    ASSERT_EQ(got->size(), entries.size());
    for (int i = 0; i < n; ++i) {
      RecordHeader want = entries[i].header;
      want.meta.retention_floor_s = 0;
      ExpectSameHeader((*got)[i].header, want);
      EXPECT_EQ((*got)[i].last_read_us, entries[i].last_read_us);
      EXPECT_EQ((*got)[i].offset, entries[i].offset);
    }
  }
  EXPECT_EQ(FooterEntryBytes(1), kFooterEntryBytesV1);
  EXPECT_EQ(FooterEntryBytes(2), kFooterEntryBytes);
  EXPECT_EQ(FooterEntryBytes(0), 0u);
  EXPECT_EQ(FooterEntryBytes(3), 0u);
}

TEST(FormatTest, FooterEntryLayoutIsAsDocumented) {
  const std::vector<FooterEntry> entries = SampleEntries(1);
  const FooterEntry& e = entries[0];
  const Footer f = MakeFooter(entries);
  ASSERT_FALSE(e.header.tombstone);
  std::string want = EntryFields(e);
  AppendU32Le(&want, e.header.meta.retention_floor_s);
  want.append(4, '\0');
  AppendU64Le(&want, Checksum(want));
  ASSERT_EQ(want.size(), kFooterEntryBytes);
  EXPECT_EQ(f.bytes.substr(0, kFooterEntryBytes), want);
}

TEST(FormatTest, FooterValueChecksumIsNotKept) {
  std::vector<FooterEntry> entries = SampleEntries(1);
  entries[0].header.value_checksum = 0x1234;
  const Footer f = MakeFooter(entries);
  auto t = DecodeTrailer(f.trailer(), f.file_size());
  ASSERT_TRUE(t.ok()) << t.status();
  auto got = DecodeFooterEntries(f.bytes, *t);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].header.value_checksum, 0u);
}

TEST(FormatTest, TrailerLayoutIsAsDocumented) {
  const std::vector<FooterEntry> entries = SampleEntries(2);
  const Footer f = MakeFooter(entries, 0x01020304);
  std::string want("FKVFOOT1");
  AppendU32Le(&want, 2);
  AppendU32Le(&want, 0x01020304);
  AppendU64Le(&want, 2);
  AppendU64Le(&want, f.offset);
  AppendU64Le(&want, Checksum(absl::string_view(f.bytes).substr(0, 2 * kFooterEntryBytes)));
  want.resize(56, '\0');
  AppendU64Le(&want, Checksum(want));
  EXPECT_EQ(f.trailer(), want);
  // Zero padding between the entries and the trailer.
  EXPECT_EQ(f.bytes.substr(2 * kFooterEntryBytes, 4096 - 2 * kFooterEntryBytes - kTrailerBytes),
            std::string(4096 - 2 * kFooterEntryBytes - kTrailerBytes, '\0'));
}

TEST(FormatTest, EntriesPointingAnywhereInsideTheSegmentDecode) {
  // Offsets out of order and records ending exactly at the footer are fine.
  std::vector<FooterEntry> entries = SampleEntries(3);
  const uint64_t footer_offset = AlignUp(EndOf(entries));
  std::swap(entries[0].offset, entries[2].offset);
  entries[2].header.value_bytes = 100;  // now first in the file, 4096 bytes
  entries[0].header.value_bytes = footer_offset - entries[0].offset - kRecordHeaderBytes;
  ASSERT_EQ(entries[0].offset + entries[0].header.record_bytes(), footer_offset);
  const std::string footer = EncodeFooter(1, footer_offset, entries);
  auto t = DecodeTrailer(absl::string_view(footer).substr(footer.size() - kTrailerBytes),
                         footer_offset + footer.size());
  ASSERT_TRUE(t.ok()) << t.status();
  auto got = DecodeFooterEntries(footer, *t);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 3u);
}

// --- Every single-bit flip is refused -----------------------------------------------------

TEST(FormatTest, EveryBitFlipOfARecordHeaderIsRefused) {
  for (bool tombstone : {false, true}) {
    RecordHeader h = SampleHeader(2);
    h.tombstone = tombstone;
    if (tombstone) h.value_bytes = 0;
    const std::string good = EncodeHeader(h);
    ASSERT_TRUE(DecodeRecordHeader(good).ok());
    for (size_t bit = 0; bit < kRecordHeaderBytes * 8; ++bit) {
      std::string bad = good;
      bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
      EXPECT_FALSE(DecodeRecordHeader(bad).ok()) << "bit " << bit;
    }
  }
}

TEST(FormatTest, EveryBitFlipOfASegmentHeaderIsRefused) {
  const std::string good = EncodeSegmentHeader({3, 1'750'000'000'000'000});
  ASSERT_TRUE(DecodeSegmentHeader(good).ok());
  for (size_t bit = 0; bit < kSegmentHeaderBytes * 8; ++bit) {
    std::string bad = good;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    ASSERT_FALSE(DecodeSegmentHeader(bad).ok()) << "bit " << bit;
  }
}

TEST(FormatTest, EveryBitFlipOfAFooterEntryIsRefused) {
  const std::vector<FooterEntry> entries = SampleEntries(3);
  for (uint32_t version : {kFooterVersion, 1u}) {
    SCOPED_TRACE(version);
    const Footer f = version == 1 ? MakeFooterV1(entries) : MakeFooter(entries);
    const size_t bytes = 3 * FooterEntryBytes(version);
    auto t = DecodeTrailer(f.trailer(), f.file_size());
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->version, version);
    ASSERT_TRUE(DecodeFooterEntries(f.bytes, *t).ok());
    for (size_t bit = 0; bit < bytes * 8; ++bit) {
      std::string bad = f.bytes;
      bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
      EXPECT_FALSE(DecodeFooterEntries(bad, *t).ok()) << "bit " << bit;
    }
    // Also with the entries checksum made to match the flipped bytes: each entry's own checksum.
    for (size_t bit = 0; bit < bytes * 8; ++bit) {
      std::string bad = f.bytes;
      bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
      Trailer resealed = *t;
      resealed.entries_checksum = Checksum(absl::string_view(bad).substr(0, bytes));
      EXPECT_FALSE(DecodeFooterEntries(bad, resealed).ok()) << "bit " << bit;
    }
  }
}

TEST(FormatTest, EveryBitFlipOfATrailerIsRefused) {
  const Footer f = MakeFooter(SampleEntries(2));
  const std::string good(f.trailer());
  ASSERT_TRUE(DecodeTrailer(good, f.file_size()).ok());
  for (size_t bit = 0; bit < kTrailerBytes * 8; ++bit) {
    std::string bad = good;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EXPECT_FALSE(DecodeTrailer(bad, f.file_size()).ok()) << "bit " << bit;
  }
}

// --- Well checksummed but wrong -----------------------------------------------------------

TEST(FormatTest, RecordHeaderFieldsAreChecked) {
  const std::string good = EncodeHeader(SampleHeader(2));
  auto patched = [&](size_t at, uint64_t v, int bytes) {
    std::string s = good;
    Put(&s, at, v, bytes);
    Reseal(&s, 0, 120);
    return s;
  };
  EXPECT_FALSE(DecodeRecordHeader(patched(0, 0x52564B47, 4)).ok());  // magic
  EXPECT_FALSE(DecodeRecordHeader(patched(4, 2, 2)).ok());           // version
  EXPECT_FALSE(DecodeRecordHeader(patched(6, 2, 2)).ok());           // unknown flag
  EXPECT_FALSE(DecodeRecordHeader(patched(6, 1, 2)).ok());           // tombstone with a value
  EXPECT_FALSE(DecodeRecordHeader(patched(8, 4096, 4)).ok());        // header bytes
  EXPECT_FALSE(DecodeRecordHeader(patched(80, 3, 1)).ok());          // traffic class
  EXPECT_FALSE(DecodeRecordHeader(patched(80, 255, 1)).ok());
  EXPECT_FALSE(DecodeRecordHeader(patched(56, kMaxValueBytes + 1, 8)).ok());  // value bytes
  EXPECT_FALSE(DecodeRecordHeader(patched(56, UINT64_MAX, 8)).ok());
  EXPECT_TRUE(DecodeRecordHeader(patched(56, kMaxValueBytes, 8)).ok());
  // A tombstone without a value is fine.
  std::string tomb = good;
  Put(&tomb, 6, 1, 2);
  Put(&tomb, 56, 0, 8);
  Reseal(&tomb, 0, 120);
  auto t = DecodeRecordHeader(tomb);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->tombstone);
}

TEST(FormatTest, ShortInputsAreRefused) {
  const std::string record = EncodeHeader(SampleHeader(1));
  EXPECT_FALSE(DecodeRecordHeader(record.substr(0, kRecordHeaderBytes - 1)).ok());
  EXPECT_FALSE(DecodeRecordHeader("").ok());
  const std::string segment = EncodeSegmentHeader({1, 2});
  EXPECT_FALSE(DecodeSegmentHeader(segment.substr(0, kSegmentHeaderBytes - 1)).ok());
  EXPECT_FALSE(DecodeSegmentHeader("").ok());
  const Footer f = MakeFooter(SampleEntries(2));
  EXPECT_FALSE(DecodeTrailer(f.trailer().substr(1), f.file_size()).ok());
  EXPECT_FALSE(DecodeTrailer(std::string(f.trailer()) + "x", f.file_size()).ok());
  auto t = DecodeTrailer(f.trailer(), f.file_size());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(DecodeFooterEntries(f.bytes.substr(0, 2 * kFooterEntryBytes - 1), *t).ok());
  EXPECT_TRUE(DecodeFooterEntries(f.bytes.substr(0, 2 * kFooterEntryBytes), *t).ok());
}

TEST(FormatTest, SegmentHeaderVersionIsChecked) {
  std::string s = EncodeSegmentHeader({1, 2});
  Put(&s, 8, 2, 4);
  Reseal(&s, 0, kSegmentHeaderBytes - 8);
  EXPECT_FALSE(DecodeSegmentHeader(s).ok());
}

// A trailer with any fields and a good checksum (the layout is checked against EncodeFooter's in
// TrailerLayoutIsAsDocumented).
std::string MakeTrailer(uint64_t count, uint64_t footer_offset, uint64_t entries_checksum = 0,
                        uint32_t version = kFooterVersion) {
  std::string t("FKVFOOT1");
  AppendU32Le(&t, version);
  AppendU32Le(&t, 1);
  AppendU64Le(&t, count);
  AppendU64Le(&t, footer_offset);
  AppendU64Le(&t, entries_checksum);
  t.resize(56, '\0');
  AppendU64Le(&t, Checksum(t));
  return t;
}

TEST(FormatTest, TrailersThatDoNotFitTheFileAreRefused) {
  // The good case for reference: footer at 8192, 2 entries, file of 12288.
  EXPECT_TRUE(DecodeTrailer(MakeTrailer(2, 8192), 12288).ok());
  EXPECT_TRUE(DecodeTrailer(MakeTrailer(0, 4096), 8192).ok());
  EXPECT_TRUE(DecodeTrailer(MakeTrailer(38, 4096), 8192).ok());  // a full block
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(39, 4096), 8192).ok());
  // Version 1 (96-byte entries) is still read.
  EXPECT_TRUE(DecodeTrailer(MakeTrailer(2, 8192, 0, 1), 12288).ok());
  EXPECT_TRUE(DecodeTrailer(MakeTrailer(42, 4096, 0, 1), 8192).ok());  // a full block
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(43, 4096, 0, 1), 8192).ok());
  // Unknown versions.
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 8192, 0, 0), 12288).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 8192, 0, 3), 12288).ok());
  // Footer offset past the file, at its end, inside the segment header, unaligned.
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 16384), 12288).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 12288), 12288).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, UINT64_MAX - 4095), 12288).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 0), 4096).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 4095), 8191).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 8193), 12289).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 8192 + 2048), 12288 + 2048).ok());
  // More entries than the footer holds, and counts whose byte size overflows.
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(43, 4096), 8192).ok());
  EXPECT_FALSE(
      DecodeTrailer(MakeTrailer(UINT64_MAX / kFooterEntryBytesV1 + 1, 4096, 0, 1), 8192).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(UINT64_MAX, 4096), 8192).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(UINT64_MAX / kFooterEntryBytes + 1, 4096), 8192).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer((uint64_t{1} << 62) + 1, 4096), 8192).ok());
  // A footer larger than its entries need (the file goes on after it), or the file shorter.
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 8192), 16384).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 4096), 12288).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 8192), 12287).ok());
  EXPECT_FALSE(DecodeTrailer(MakeTrailer(2, 8192), 0).ok());
}

// Entries made to order, their footer at `footer_offset`, with trailer and checksums to match.
absl::StatusOr<std::vector<FooterEntry>> DecodeEntries(const std::vector<FooterEntry>& entries,
                                                       uint64_t footer_offset) {
  const std::string footer = EncodeFooter(1, footer_offset, entries);
  Trailer t;
  t.segment_id = 1;
  t.count = entries.size();
  t.footer_offset = footer_offset;
  t.entries_checksum = Checksum(absl::string_view(footer).substr(0, t.count * kFooterEntryBytes));
  return DecodeFooterEntries(footer, t);
}

TEST(FormatTest, EntriesThatDoNotFitTheSegmentAreRefused) {
  const std::vector<FooterEntry> good = SampleEntries(3);  // 4096.., 8192.., 12288..
  const uint64_t footer_offset = AlignUp(EndOf(good));
  ASSERT_TRUE(DecodeEntries(good, footer_offset).ok());
  auto with = [&](auto change) {
    std::vector<FooterEntry> e = good;
    change(e[1]);
    return DecodeEntries(e, footer_offset);
  };
  // Offsets: unaligned, inside the segment header, at or past the footer.
  EXPECT_FALSE(with([](FooterEntry& e) { e.offset += 1; }).ok());
  EXPECT_FALSE(with([](FooterEntry& e) { e.offset += 2048; }).ok());
  EXPECT_FALSE(with([](FooterEntry& e) { e.offset = 0; }).ok());
  EXPECT_FALSE(with([&](FooterEntry& e) { e.offset = footer_offset; }).ok());
  EXPECT_FALSE(with([&](FooterEntry& e) { e.offset = footer_offset + 4096; }).ok());
  EXPECT_FALSE(with([](FooterEntry& e) { e.offset = UINT64_MAX - 4095; }).ok());
  // A record that would overlap the footer, and one ending exactly at it.
  EXPECT_FALSE(with([&](FooterEntry& e) {
                 e.offset = footer_offset - 4096;
                 e.header.value_bytes = 4096 - kRecordHeaderBytes + 1;
               }).ok());
  EXPECT_TRUE(with([&](FooterEntry& e) {
                e.offset = footer_offset - 4096;
                e.header.value_bytes = 4096 - kRecordHeaderBytes;
              }).ok());
  EXPECT_FALSE(with([](FooterEntry& e) { e.header.value_bytes = kMaxValueBytes + 1; }).ok());
  EXPECT_FALSE(with([](FooterEntry& e) { e.header.value_bytes = UINT64_MAX; }).ok());
  // Tombstones with a value; unknown classes and flags.
  EXPECT_FALSE(with([](FooterEntry& e) { e.header.tombstone = true; }).ok());
  EXPECT_TRUE(with([](FooterEntry& e) {
                e.header.tombstone = true;
                e.header.value_bytes = 0;
              }).ok());
  EXPECT_FALSE(with([](FooterEntry& e) {
                 e.header.meta.traffic_class = static_cast<TrafficClass>(kNumTrafficClasses);
               }).ok());
  std::string footer = EncodeFooter(1, footer_offset, good);
  Put(&footer, kFooterEntryBytes + 85, 2, 1);  // entry 1's flags
  Reseal(&footer, kFooterEntryBytes, kFooterEntryBytes + 96);
  Trailer t;
  t.count = 3;
  t.footer_offset = footer_offset;
  t.entries_checksum = Checksum(absl::string_view(footer).substr(0, 3 * kFooterEntryBytes));
  EXPECT_FALSE(DecodeFooterEntries(footer, t).ok());
  // More entries than the bytes hold; a wrong entries checksum.
  t.count = 4;
  EXPECT_FALSE(DecodeFooterEntries(footer.substr(0, 3 * kFooterEntryBytes), t).ok());
  footer = EncodeFooter(1, footer_offset, good);
  t.count = 3;
  t.entries_checksum = Checksum(absl::string_view(footer).substr(0, 3 * kFooterEntryBytes)) + 1;
  EXPECT_FALSE(DecodeFooterEntries(footer, t).ok());
}

// A count whose byte size overflows: 2^62 + 1 entries of 104 bytes wrap to 104 bytes, which would
// pass the size and checksum checks, and then reserve(2^62 + 1) would throw std::length_error.
// DecodeFooterEntries compares the count with bytes.size() / the entry size first.
TEST(FormatTest, EntriesCountsThatOverflowAreRefused) {
  const std::string footer = EncodeFooter(1, 8192, SampleEntries(1));
  Trailer t;
  t.count = (uint64_t{1} << 62) + 1;
  t.footer_offset = 8192;
  t.entries_checksum = Checksum(absl::string_view(footer).substr(0, kFooterEntryBytes));
  EXPECT_FALSE(DecodeFooterEntries(footer, t).ok());
}

// --- Segment file names -------------------------------------------------------------------

TEST(FormatTest, SegmentFileNamesRoundTrip) {
  for (uint32_t id : {0u, 1u, 0x1a2bu, 0x7fffffffu, 0xdeadbeefu, 0xffffffffu}) {
    const std::string name = SegmentFileName(id);
    EXPECT_EQ(name.size(), 12u);
    auto got = ParseSegmentFileName(name);
    ASSERT_TRUE(got.ok()) << name;
    EXPECT_EQ(*got, id);
  }
  EXPECT_EQ(SegmentFileName(0x1a2b), "00001a2b.seg");
  EXPECT_EQ(SegmentFileName(0xdeadbeef), "deadbeef.seg");
}

TEST(FormatTest, OnlyEightLowercaseHexDigitsAndSegAreSegmentFileNames) {
  EXPECT_EQ(*ParseSegmentFileName("0000abcd.seg"), 0xabcdu);
  EXPECT_EQ(*ParseSegmentFileName("ffffffff.seg"), 0xffffffffu);
  for (absl::string_view name : {"",
                                 "LOCK",
                                 ".seg",
                                 "0000ABCD.seg",
                                 "0000abcD.seg",
                                 "0000abc.seg",
                                 "000000abc.seg",
                                 "0000000g.seg",
                                 "0000000G.seg",
                                 "00000001.SEG",
                                 "00000001.Seg",
                                 "00000001.seg.tmp",
                                 "00000001.sega",
                                 "00000001.se",
                                 "00000001_seg",
                                 "00000001seg",
                                 "00000001..seg",
                                 "+0000001.seg",
                                 "-0000001.seg",
                                 " 0000001.seg",
                                 "0000001 .seg",
                                 "0x000001.seg",
                                 "00000001.seg ",
                                 "0000:001.seg",
                                 "0000/001.seg",
                                 "0000`001.seg",
                                 "0000@001.seg"}) {
    EXPECT_FALSE(ParseSegmentFileName(name).ok()) << "'" << name << "'";
  }
  EXPECT_FALSE(ParseSegmentFileName(std::string("0000") + '\0' + "001.seg").ok());
  EXPECT_FALSE(ParseSegmentFileName(absl::string_view("00000001.seg\0", 13)).ok());
  // Every character: exactly 0-9 and a-f are digits.
  for (int c = 0; c < 256; ++c) {
    std::string name = "0000000" + std::string(1, static_cast<char>(c)) + ".seg";
    const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    EXPECT_EQ(ParseSegmentFileName(name).ok(), hex) << c;
  }
}

// --- The fuzz seeds, written from format.h's description ------------------------------------

constexpr char kCorpus[] = "kvstore/testdata/fuzz_corpus/";

TEST(FormatTest, SealedSeedsDecode) {
  // sealed.seg as written now, sealed_v1.seg as written before retention floors.
  for (const char* name : {"sealed.seg", "sealed_v1.seg"}) {
    SCOPED_TRACE(name);
    const bool v1 = std::string(name) == "sealed_v1.seg";
    const std::string file = ReadFile(std::string(kCorpus) + name);
    ASSERT_EQ(file.size(), 5 * 4096u);
    auto h = DecodeSegmentHeader(file);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->id, 1u);
    auto t =
        DecodeTrailer(absl::string_view(file).substr(file.size() - kTrailerBytes), file.size());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->version, v1 ? 1u : kFooterVersion);
    EXPECT_EQ(t->segment_id, 1u);
    EXPECT_EQ(t->count, 3u);
    EXPECT_EQ(t->footer_offset, 4 * 4096u);
    auto entries = DecodeFooterEntries(absl::string_view(file).substr(t->footer_offset), *t);
    ASSERT_TRUE(entries.ok()) << entries.status();
    ASSERT_EQ(entries->size(), 3u);
    for (const FooterEntry& e : *entries) {
      auto r = DecodeRecordHeader(absl::string_view(file).substr(e.offset, kRecordHeaderBytes));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->key, e.header.key);
      EXPECT_EQ(r->seq, e.header.seq);
      EXPECT_EQ(r->value_bytes, e.header.value_bytes);
      EXPECT_EQ(r->meta.traffic_class, e.header.meta.traffic_class);
      EXPECT_EQ(r->meta.retention_floor_s, e.header.meta.retention_floor_s);
      EXPECT_EQ(r->value_checksum, Checksum(absl::string_view(file).substr(
                                       e.offset + kRecordHeaderBytes, r->value_bytes)));
    }
    EXPECT_EQ((*entries)[1].header.meta.traffic_class, TrafficClass::kAgent);
    EXPECT_EQ((*entries)[1].header.meta.retention_floor_s, v1 ? 0u : 3600u);
    EXPECT_EQ((*entries)[0].header.meta.retention_floor_s, 0u);
    EXPECT_NE((*entries)[2].last_read_us, 0);
  }
}

TEST(FormatTest, UnsealedSeedHoldsRecordsAndATombstone) {
  const std::string file = ReadFile(std::string(kCorpus) + "unsealed.seg");
  ASSERT_TRUE(DecodeSegmentHeader(file).ok());
  std::vector<RecordHeader> records;
  for (size_t pos = kSegmentHeaderBytes; pos < file.size(); pos += 4096) {
    auto r = DecodeRecordHeader(absl::string_view(file).substr(pos, kRecordHeaderBytes));
    ASSERT_TRUE(r.ok()) << pos << ": " << r.status();
    records.push_back(*r);
  }
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].meta.retention_floor_s, 0u);
  EXPECT_EQ(records[1].meta.retention_floor_s, 300u);
  EXPECT_TRUE(records[2].tombstone);
  EXPECT_EQ(records[2].key, records[0].key);
  EXPECT_GT(records[2].seq, records[0].seq);
  EXPECT_FALSE(
      DecodeTrailer(absl::string_view(file).substr(file.size() - kTrailerBytes), file.size()).ok());
}

TEST(FormatTest, PieceSeedsDecode) {
  const std::string record = ReadFile(std::string(kCorpus) + "record.bin");
  ASSERT_EQ(record.size(), 4096u);
  auto r = DecodeRecordHeader(record);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->meta.retention_floor_s, 300u);
  EXPECT_EQ(r->value_checksum,
            Checksum(absl::string_view(record).substr(kRecordHeaderBytes, r->value_bytes)));
  const std::string header = ReadFile(std::string(kCorpus) + "record_header.bin");
  ASSERT_EQ(header.size(), kRecordHeaderBytes);
  EXPECT_TRUE(DecodeRecordHeader(header).ok());
  for (const char* name : {"footer.bin", "footer_v1.bin"}) {
    SCOPED_TRACE(name);
    const bool v1 = std::string(name) == "footer_v1.bin";
    const std::string footer = ReadFile(std::string(kCorpus) + name);
    ASSERT_EQ(footer.size(), 4096u);
    auto t = DecodeTrailer(absl::string_view(footer).substr(4096 - kTrailerBytes), 5 * 4096);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->version, v1 ? 1u : kFooterVersion);
    auto entries = DecodeFooterEntries(footer, *t);
    ASSERT_TRUE(entries.ok()) << entries.status();
    ASSERT_EQ(entries->size(), 2u);
    EXPECT_EQ((*entries)[1].header.meta.retention_floor_s, v1 ? 0u : 3600u);
  }
  const std::string trailer = ReadFile(std::string(kCorpus) + "trailer.bin");
  ASSERT_EQ(trailer.size(), kTrailerBytes);
  auto empty = DecodeTrailer(trailer, 2 * 4096);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->count, 0u);
  EXPECT_EQ(empty->version, kFooterVersion);
}

}  // namespace
}  // namespace kv
}  // namespace ferry
