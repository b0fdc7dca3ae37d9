#!/usr/bin/env python3
"""Writes the seed corpus of //kvstore:format_fuzz (kvstore/testdata/fuzz_corpus/).

  make_fuzz_corpus.py [OUTDIR]     (default: fuzz_corpus/ next to this script)

Needs the `xxhash` module (in Ferry's client virtualenv: ${FERRY_CACHE}/venv/client/bin/python).
The files are written from the format as kvstore/format.h describes it, independently of
format.cc, so that the seeds also check that description:

  sealed.seg          segment 1 with three records (chat, agent with a retention floor of
                      3600 s, chat) and its footer (version 2)
  sealed_v1.seg       the same as written before retention floors: footer version 1, no floor
  unsealed.seg        segment 1 still open: two records (the second with a floor of 300 s) and a
                      tombstone for the first, no footer
  torn.seg            segment 1 open, one record and a second one cut off in its value
  record.bin          one whole record (header, value, padding; floor 300 s), no segment header
  record_header.bin   a record header alone
  footer.bin          a footer block alone (two entries, the second with a floor of 3600 s, and
                      the trailer; its offset is 16384), version 2
  footer_v1.bin       the same in version 1 (no floors)
  trailer.bin         a trailer alone (no entries, footer offset 4096), version 2

Times are relative to the fuzz target's fixed clock (kNowUs in format_fuzz.cc).
"""
import os
import struct
import sys

import xxhash

NOW_US = 1_750_000_000_000_000  # format_fuzz.cc's kNowUs
HOUR_US = 3600 * 1_000_000
ALIGN = 4096
RECORD_MAGIC = 0x52564B46
CHAT, AGENT = 0, 1


def checksum(b):
    return xxhash.xxh3_64_intdigest(b)


def hash128(text):
    v = xxhash.xxh3_128_intdigest(text.encode())
    return struct.pack("<QQ", v & (2**64 - 1), v >> 64)  # lo, hi


def align_up(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


MODEL = hash128("model A")


def segment_header(seg_id, created_us):
    b = b"FKVSEG01" + struct.pack("<IIq", 1, seg_id, created_us)
    b = b.ljust(ALIGN - 8, b"\0")
    return b + struct.pack("<Q", checksum(b))


class Rec:
    def __init__(self, name, value_bytes, seq, created_us, cls=CHAT, tombstone=False,
                 last_read_us=0, floor_s=0):
        self.key = hash128(name)
        self.value = bytes((i * 31 + seq) & 0xFF for i in range(value_bytes))
        self.seq, self.created_us, self.cls = seq, created_us, cls
        self.tombstone, self.last_read_us = tombstone, last_read_us
        self.floor_s = floor_s  # the retention floor, seconds (0 in version 1 files)
        self.layout_tag, self.token_count = 42, 16
        self.offset = 0

    def header(self):
        b = struct.pack("<IHHII", RECORD_MAGIC, 1, 1 if self.tombstone else 0, 128,
                        self.token_count)
        b += self.key + MODEL
        b += struct.pack("<QQQqB", self.layout_tag, len(self.value), self.seq, self.created_us,
                         self.cls)
        b = b.ljust(84, b"\0") + struct.pack("<IQ", self.floor_s, checksum(self.value))
        b = b.ljust(120, b"\0")
        return b + struct.pack("<Q", checksum(b))

    def record(self):
        return (self.header() + self.value).ljust(align_up(128 + len(self.value)), b"\0")

    def footer_entry(self, version):
        b = self.key + MODEL
        b += struct.pack("<QQQqqQIBB", self.layout_tag, len(self.value), self.seq,
                         self.created_us, self.last_read_us, self.offset, self.token_count,
                         self.cls, 1 if self.tombstone else 0)
        b += b"\0\0"
        if version >= 2:
            b += struct.pack("<I", self.floor_s) + b"\0" * 4
        return b + struct.pack("<Q", checksum(b))


def records_at(start, recs):
    out = b""
    for r in recs:
        r.offset = start + len(out)
        out += r.record()
    return out


def footer(seg_id, footer_offset, recs, version=2):
    entries = b"".join(r.footer_entry(version) for r in recs)
    t = b"FKVFOOT1" + struct.pack("<IIQQQ", version, seg_id, len(recs), footer_offset,
                                  checksum(entries))
    t = t.ljust(56, b"\0")
    t += struct.pack("<Q", checksum(t))
    return entries.ljust(align_up(len(entries) + 64) - 64, b"\0") + t


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fuzz_corpus")
    os.makedirs(out_dir, exist_ok=True)
    files = {}

    for version, name in ((2, "sealed.seg"), (1, "sealed_v1.seg")):
        recs = [Rec("sealed 1", 100, 1, NOW_US - HOUR_US // 2),
                Rec("sealed 2", 300, 2, NOW_US - 48 * HOUR_US, cls=AGENT,
                    floor_s=3600 if version >= 2 else 0),
                Rec("sealed 3", 1000, 3, NOW_US - 120 * HOUR_US, last_read_us=NOW_US - HOUR_US)]
        body = segment_header(1, NOW_US - 144 * HOUR_US) + records_at(ALIGN, recs)
        files[name] = body + footer(1, len(body), recs, version)

    recs = [Rec("open 1", 200, 1, NOW_US - 3 * HOUR_US),
            Rec("open 2", 50, 2, NOW_US - 2 * HOUR_US, cls=AGENT, floor_s=300),
            Rec("open 1", 0, 3, NOW_US - HOUR_US, tombstone=True)]
    files["unsealed.seg"] = segment_header(1, NOW_US - 4 * HOUR_US) + records_at(ALIGN, recs)

    whole = Rec("torn 1", 500, 1, NOW_US - HOUR_US)
    cut = Rec("torn 2", 3000, 2, NOW_US - HOUR_US)
    files["torn.seg"] = (segment_header(1, NOW_US - HOUR_US) + records_at(ALIGN, [whole]) +
                         cut.record()[:128 + 1000])

    files["record.bin"] = Rec("record", 64, 7, NOW_US - 30 * HOUR_US, floor_s=300).record()
    files["record_header.bin"] = Rec("header", 10, 9, NOW_US - 2 * HOUR_US).header()

    for version, name in ((2, "footer.bin"), (1, "footer_v1.bin")):
        recs = [Rec("footer 1", 1000, 1, NOW_US - HOUR_US),
                Rec("footer 2", 4000, 2, NOW_US, floor_s=3600 if version >= 2 else 0)]
        body = records_at(ALIGN, recs)  # at 4096 (4096 bytes) and 8192 (8192 bytes)
        files[name] = footer(3, ALIGN + len(body), recs, version)
    files["trailer.bin"] = footer(1, ALIGN, [])[-64:]

    for name, data in sorted(files.items()):
        assert len(data) < 64 << 10, name
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
