// KvStore::Impl's recovery (kv_store_impl.h): opening reads each sealed segment's footer, scans
// the segment that was open (and any whose footer is missing or damaged) record by record, skips
// and reports torn or corrupt records, cuts the open segment's torn tail and rebuilds the index.

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "kvstore/kv_store_impl.h"

namespace ferry {
namespace kv {

using kv_store_internal::BadStretch;
using kv_store_internal::Entry;
using kv_store_internal::kMaxProblems;
using kv_store_internal::ReadBuffer;
using kv_store_internal::Segment;

namespace kv_store_internal {

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

}  // namespace kv_store_internal

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
  // Append to the segment that was open (none open: Open starts one).
  if (!segments.empty() && !segments.rbegin()->second->sealed) {
    open = segments.rbegin()->second;
    tail = open->file_bytes;
  }
  return absl::OkStatus();
}

}  // namespace kv
}  // namespace ferry
