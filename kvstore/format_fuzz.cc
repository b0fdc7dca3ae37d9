// Fuzz target for the KV store's on-disk format: the decoders of format.h on arbitrary bytes, and
// a KvStore opened on a directory whose segment files are those bytes. Nothing may crash, leak or
// trip a sanitizer, and what the store serves stays consistent: decoded values encode and decode
// to the same, the stats add up, a second Verify finds nothing corrupt, what was served is still
// served after Compact() (and after a Put of it with other bytes, a conflict), a Put is read back
// with its retention floor (also after compacting and reopening) and a Delete stays deleted.
//
// The store sees two segment files: 00000001.seg holds the input as it is, 00000002.seg the input
// with every checksum recomputed (segment header, records at 4096-byte boundaries, footer
// entries, trailer; a segment header is prepended when the input has none), so that the fuzzer
// also reaches what the checksums guard: lengths, offsets, sequence numbers, times and classes
// that are well checksummed but wrong.
//
// Time stands still at kNowUs (kvstore/testdata/make_fuzz_corpus.py writes the seeds relative to
// it), so that expiry depends on the input alone.

#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "engine/common/log.h"
#include "kvstore/file_system.h"
#include "kvstore/format.h"
#include "kvstore/kv_store.h"

namespace ferry {
namespace kv {
namespace {

constexpr int64_t kNowUs = 1'750'000'000'000'000;  // 2025-06-15
constexpr uint32_t kRecordMagic = 0x52564B46;      // "FKVR", format.h
constexpr uint32_t kRepairedId = 2;
constexpr size_t kMaxKeys = 8;

class FixedClock : public Clock {
 public:
  absl::Time Now() const override { return absl::FromUnixMicros(kNowUs); }
  absl::Duration Monotonic() const override { return absl::ZeroDuration(); }
  void SleepFor(absl::Duration) override {}
};

// POSIX files without fsync: durability is not what is fuzzed here, and syncs would dominate.
class NoSyncFile : public File {
 public:
  explicit NoSyncFile(std::unique_ptr<File> base) : base_(std::move(base)) {}
  absl::Status Write(uint64_t offset, const void* data, size_t n) override {
    return base_->Write(offset, data, n);
  }
  absl::Status WriteV(uint64_t offset, absl::Span<const iovec> buffers) override {
    return base_->WriteV(offset, buffers);
  }
  absl::StatusOr<size_t> Read(uint64_t offset, void* data, size_t n) const override {
    return base_->Read(offset, data, n);
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  absl::StatusOr<uint64_t> Size() const override { return base_->Size(); }
  bool direct() const override { return base_->direct(); }

 private:
  std::unique_ptr<File> base_;
};

class NoSyncFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode,
                                             bool direct) override {
    auto file = PosixFileSystem().Open(path, mode, direct);
    if (!file.ok()) return file.status();
    return std::unique_ptr<File>(new NoSyncFile(std::move(*file)));
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    return PosixFileSystem().List(dir);
  }
  absl::Status Remove(const std::string& path) override { return PosixFileSystem().Remove(path); }
  absl::Status CreateDir(const std::string& dir) override {
    return PosixFileSystem().CreateDir(dir);
  }
  absl::Status SyncDir(const std::string&) override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<File>> Lock(const std::string& path) override {
    return PosixFileSystem().Lock(path);
  }
};

// Little-endian fields of untrusted bytes; bytes past the end read as zero.
uint64_t LoadLe(absl::string_view b, uint64_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    const uint64_t pos = at + static_cast<uint64_t>(i);
    v = (v << 8) | (pos < b.size() ? static_cast<uint8_t>(b[pos]) : 0);
  }
  return v;
}

void StoreLe(std::string* b, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    (*b)[at + static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
}

bool SameHeader(const RecordHeader& a, const RecordHeader& b) {
  return a.key == b.key && a.meta.fingerprint == b.meta.fingerprint &&
         a.meta.layout_tag == b.meta.layout_tag && a.meta.token_count == b.meta.token_count &&
         a.meta.traffic_class == b.meta.traffic_class &&
         a.meta.retention_floor_s == b.meta.retention_floor_s && a.tombstone == b.tombstone &&
         a.value_bytes == b.value_bytes && a.seq == b.seq && a.created_us == b.created_us &&
         a.value_checksum == b.value_checksum;
}

// Decoded record headers re-encode to headers that decode to the same.
void CheckRecordRoundTrip(const RecordHeader& h) {
  char out[kRecordHeaderBytes];
  EncodeRecordHeader(h, out);
  auto again = DecodeRecordHeader(absl::string_view(out, sizeof(out)));
  CHECK_OK(again.status());
  CHECK(SameHeader(h, *again));
}

// Decoded footers re-encode to footers that decode to the same (the bytes may differ: the
// decoders do not insist on zero reserved bytes, and a version 1 footer comes back as version 2,
// its floors 0).
void CheckFooterRoundTrip(const Trailer& t, const std::vector<FooterEntry>& entries) {
  CHECK_EQ(entries.size(), t.count);
  const std::string footer = EncodeFooter(t.segment_id, t.footer_offset, entries);
  auto trailer = DecodeTrailer(absl::string_view(footer).substr(footer.size() - kTrailerBytes),
                               t.footer_offset + footer.size());
  CHECK_OK(trailer.status());
  CHECK_EQ(trailer->count, t.count);
  CHECK_EQ(trailer->footer_offset, t.footer_offset);
  auto again = DecodeFooterEntries(footer, *trailer);
  CHECK_OK(again.status());
  CHECK_EQ(again->size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    CHECK(SameHeader((*again)[i].header, entries[i].header));
    CHECK_EQ((*again)[i].last_read_us, entries[i].last_read_us);
    CHECK_EQ((*again)[i].offset, entries[i].offset);
  }
}

// The decoders on the raw input: as a segment header, a record header, a file ending in a
// trailer (of the input's size, and of sizes taken from the input), footer entries and a file
// name.
void FuzzDecoders(absl::string_view in) {
  auto segment = DecodeSegmentHeader(in);
  if (segment.ok()) {
    auto again = DecodeSegmentHeader(EncodeSegmentHeader(*segment));
    CHECK_OK(again.status());
    CHECK_EQ(again->id, segment->id);
    CHECK_EQ(again->created_us, segment->created_us);
  }
  auto record = DecodeRecordHeader(in);
  if (record.ok()) CheckRecordRoundTrip(*record);

  const absl::string_view last =
      in.size() >= kTrailerBytes ? in.substr(in.size() - kTrailerBytes) : in;
  // The input's size (a whole segment), the trailer's own footer offset plus the input (a footer
  // block alone), and any size.
  const uint64_t sizes[] = {in.size(), LoadLe(last, 24, 8) + AlignUp(in.size()), LoadLe(in, 0, 8)};
  for (int i = 0; i < 3; ++i) {
    auto trailer = DecodeTrailer(last, sizes[i]);
    if (!trailer.ok()) continue;
    CHECK_LT(trailer->footer_offset, sizes[i]);
    const absl::string_view footer =
        i == 0 ? in.substr(std::min<uint64_t>(trailer->footer_offset, in.size())) : in;
    auto entries = DecodeFooterEntries(footer, *trailer);
    if (entries.ok()) CheckFooterRoundTrip(*trailer, *entries);
  }
  // A trailer made up from the first bytes, its entries at the start of the input, of either
  // footer version. Counts stay within what the input could hold plus one, as a trailer
  // DecodeTrailer accepted would.
  if (in.size() >= 16) {
    Trailer t;
    t.version = LoadLe(in, 8, 1) % 2 == 0 ? kFooterVersion : 1;
    const size_t entry_bytes = FooterEntryBytes(t.version);
    t.segment_id = 1;
    t.count = LoadLe(in, 0, 8) % (in.size() / entry_bytes + 2);
    t.footer_offset = LoadLe(in, 8, 8);
    t.entries_checksum = Checksum(in.substr(0, t.count * entry_bytes));
    auto entries = DecodeFooterEntries(in, t);
    if (entries.ok()) {
      CHECK_EQ(entries->size(), t.count);
      for (const FooterEntry& e : *entries) {
        CHECK_GE(e.offset, kSegmentHeaderBytes);
        CHECK_LE(e.offset + e.header.record_bytes(), t.footer_offset);
      }
    }
  }
  auto id = ParseSegmentFileName(in);
  if (id.ok()) CHECK_EQ(SegmentFileName(*id), in);
}

// The input as a segment of id kRepairedId with every checksum made to match.
std::string Repaired(absl::string_view in) {
  std::string s;
  if (in.size() >= kSegmentHeaderBytes && in.substr(0, 8) == "FKVSEG01") {
    s = std::string(in);
    StoreLe(&s, 12, kRepairedId, 4);
    StoreLe(&s, kSegmentHeaderBytes - 8,
            Checksum(absl::string_view(s).substr(0, kSegmentHeaderBytes - 8)), 8);
  } else {
    s = EncodeSegmentHeader({kRepairedId, kNowUs});
    s.append(in.data(), in.size());
  }
  const absl::string_view v(s);  // s keeps its size from here on
  for (size_t pos = kSegmentHeaderBytes; pos + kRecordHeaderBytes <= s.size();
       pos += kDirectIoAlignment) {
    if (LoadLe(v, pos, 4) != kRecordMagic) continue;
    const uint64_t value_bytes = LoadLe(v, pos + 56, 8);
    if (value_bytes <= s.size() - pos - kRecordHeaderBytes) {
      StoreLe(&s, pos + 88, Checksum(v.substr(pos + kRecordHeaderBytes, value_bytes)), 8);
    }
    StoreLe(&s, pos + 120, Checksum(v.substr(pos, 120)), 8);
  }
  if (s.size() >= 2 * kDirectIoAlignment && s.size() % kDirectIoAlignment == 0 &&
      v.substr(s.size() - kTrailerBytes, 8) == "FKVFOOT1") {
    const size_t t = s.size() - kTrailerBytes;
    StoreLe(&s, t + 12, kRepairedId, 4);
    // Entries of the trailer's version (an unknown one: of the current version).
    size_t entry_bytes = FooterEntryBytes(static_cast<uint32_t>(LoadLe(v, t + 8, 4)));
    if (entry_bytes == 0) entry_bytes = kFooterEntryBytes;
    const size_t sum_at = entry_bytes - 8;
    const uint64_t count = LoadLe(v, t + 16, 8);
    const uint64_t offset = LoadLe(v, t + 24, 8);
    if (offset <= t && count <= (t - offset) / entry_bytes) {
      for (uint64_t i = 0; i < count; ++i) {
        const size_t e = offset + i * entry_bytes;
        StoreLe(&s, e + sum_at, Checksum(v.substr(e, sum_at)), 8);
      }
      StoreLe(&s, t + 32, Checksum(v.substr(offset, count * entry_bytes)), 8);
    }
    StoreLe(&s, t + 56, Checksum(v.substr(t, 56)), 8);
  }
  return s;
}

// The (key, fingerprint) pairs a segment's records and footer name, checking on the way that the
// decoders round-trip on well checksummed input too.
std::vector<std::pair<Hash128, Hash128>> KeysOf(absl::string_view seg) {
  std::vector<std::pair<Hash128, Hash128>> keys;
  for (size_t pos = kSegmentHeaderBytes; pos + kRecordHeaderBytes <= seg.size();
       pos += kDirectIoAlignment) {
    auto h = DecodeRecordHeader(seg.substr(pos, kRecordHeaderBytes));
    if (!h.ok()) continue;
    CheckRecordRoundTrip(*h);
    if (keys.size() < kMaxKeys) keys.emplace_back(h->key, h->meta.fingerprint);
  }
  if (seg.size() >= kTrailerBytes) {
    auto t = DecodeTrailer(seg.substr(seg.size() - kTrailerBytes), seg.size());
    if (t.ok()) {
      auto entries = DecodeFooterEntries(seg.substr(t->footer_offset), *t);
      if (entries.ok()) {
        CheckFooterRoundTrip(*t, *entries);
        for (const FooterEntry& e : *entries) {
          if (keys.size() < 2 * kMaxKeys)
            keys.emplace_back(e.header.key, e.header.meta.fingerprint);
        }
      }
    }
  }
  return keys;
}

void CheckStats(const StoreStats& s) {
  int64_t objects = 0, bytes = 0;
  for (const ClassStats& c : s.classes) {
    int64_t aged = 0;
    for (int64_t n : c.by_age) aged += n;
    CHECK_EQ(aged, c.objects);
    objects += c.objects;
    bytes += c.bytes;
  }
  CHECK_EQ(objects, s.objects);
  CHECK_EQ(bytes, s.value_bytes);
  CHECK_GE(s.segments, 1);
  CHECK_GE(s.file_bytes, static_cast<int64_t>(kSegmentHeaderBytes));
  for (int64_t n : s.recovery_dropped) CHECK_GE(n, 0);
}

void CheckVerify(KvStore& store) {
  const VerifyReport first = store.Verify();
  CHECK_GE(first.corrupt, 0);
  CHECK_LE(first.corrupt, first.objects_checked);
  CHECK_LE(first.problems.size(), 100u);
  // Corrupt objects left the index: nothing is found twice.
  const VerifyReport second = store.Verify();
  CHECK_EQ(second.corrupt, 0);
  CHECK_EQ(second.objects_checked, first.objects_checked - first.corrupt);
}

std::string TempBase() {
  for (const char* var : {"TEST_TMPDIR", "TMPDIR"}) {
    const char* v = getenv(var);
    if (v != nullptr && *v != '\0') return v;
  }
  return "/tmp";
}

void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHECK(out.good()) << "cannot write " << path;
}

void FuzzStore(absl::string_view in, const std::string& repaired) {
  static FixedClock* const clock = new FixedClock;
  static NoSyncFileSystem* const fs = new NoSyncFileSystem;
  std::string dir = TempBase() + "/format_fuzz.XXXXXX";
  CHECK(mkdtemp(dir.data()) != nullptr) << "mkdtemp " << dir;
  WriteFile(dir + "/" + SegmentFileName(1), in);
  WriteFile(dir + "/" + SegmentFileName(kRepairedId), repaired);

  StoreOptions options;
  options.segment_bytes = int64_t{1} << 20;
  options.capacity_bytes = int64_t{64} << 20;
  options.max_object_bytes = int64_t{256} << 10;
  options.direct_io = false;
  options.clock = clock;
  options.fs = fs;

  const std::vector<std::pair<Hash128, Hash128>> keys = KeysOf(repaired);
  const Hash128 fresh = Xxh3Hash128(absl::StrCat("format_fuzz fresh key ", in));
  const Hash128 model = Xxh3Hash128("model A");
  const std::string value = "a value the input cannot name";
  ObjectMeta meta;
  meta.fingerprint = model;
  meta.token_count = 1;
  meta.retention_floor_s = 3600;
  bool deleted = false;
  {
    auto opened = KvStore::Open(dir, options);
    CHECK_OK(opened.status());
    KvStore& store = **opened;
    CheckStats(store.Stats());
    CheckVerify(store);
    std::vector<Hash128> all;
    // What the input holds that the store serves: still served after the Compact below.
    std::vector<std::pair<size_t, std::string>> found;  // index in keys, value
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto& [key, fingerprint] = keys[i];
      all.push_back(key);
      std::vector<GetResult> got = store.Get({key}, fingerprint);
      CHECK_EQ(got.size(), 1u);
      if (!got[0].found) continue;
      CHECK_EQ(got[0].meta.fingerprint, fingerprint);
      if (key != keys[0].first) found.emplace_back(i, std::move(got[0].value));
    }
    const ExistsResult exists = store.Exists(all, keys.empty() ? model : keys[0].second);
    CHECK_EQ(exists.present.size(), all.size());
    CHECK_LE(exists.prefix, static_cast<int64_t>(all.size()));

    const PutItem item{fresh, meta, value};
    CHECK_OK(store.Put({item}));
    std::vector<GetResult> got = store.Get({fresh}, model);
    CHECK(got[0].found && got[0].value == value);
    // An object served, put again with other bytes: a conflict, its bytes kept (checked below).
    if (!found.empty() && found[0].second.size() < static_cast<size_t>(options.max_object_bytes)) {
      const auto& [i, bytes] = found[0];
      ObjectMeta other = meta;
      other.fingerprint = keys[i].second;
      const std::string other_value = bytes + "!";
      PutResult result;
      CHECK_OK(store.Put({{keys[i].first, other, other_value}}, &result));
      CHECK(result.outcomes.size() == 1 && result.outcomes[0] == PutOutcome::kConflict);
    }
    // A Delete of an object that is there (of one that is not, it writes nothing).
    if (!keys.empty() && store.Get({keys[0].first}, keys[0].second)[0].found) {
      CHECK_OK(store.Delete({keys[0].first}).status());
      deleted = true;
      CHECK(!store.Get({keys[0].first}, keys[0].second)[0].found);
    }
    CHECK_OK(store.Compact());
    got = store.Get({fresh}, model);
    CHECK(got[0].found && got[0].value == value);
    // Nothing expires (time stands still) and the capacity is far: compaction keeps every object.
    for (const auto& [i, bytes] : found) {
      got = store.Get({keys[i].first}, keys[i].second);
      CHECK(got[0].found && got[0].value == bytes)
          << "object " << keys[i].first.ToHex() << " served before Compact() is lost";
    }
    CheckStats(store.Stats());
  }
  {
    auto reopened = KvStore::Open(dir, options);
    CHECK_OK(reopened.status());
    KvStore& store = **reopened;
    std::vector<GetResult> got = store.Get({fresh}, model);
    CHECK(got[0].found && got[0].value == value) << "an acknowledged put is lost";
    CHECK_EQ(got[0].meta.retention_floor_s, meta.retention_floor_s) << "a floor is lost";
    if (deleted) {
      CHECK(!store.Get({keys[0].first}, keys[0].second)[0].found) << "a deleted object is back";
    }
    CheckStats(store.Stats());
    CheckVerify(store);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kv
}  // namespace ferry

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    ferry::SetMinLogSeverity(ferry::LogSeverity::kError);  // corrupt reads are expected here
    return true;
  }();
  (void)quiet;
  const absl::string_view in(reinterpret_cast<const char*>(data), size);
  ferry::kv::FuzzDecoders(in);
  ferry::kv::FuzzStore(in, ferry::kv::Repaired(in));
  return 0;
}
