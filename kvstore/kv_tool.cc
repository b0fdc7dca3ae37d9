// ferry-kv: the operator's tool for a KV store directory (kv_store.h), run on a store no server
// has open (KvStore::Open locks the directory, so the tool refuses a store in use):
//
//   ferry-kv stats DIR      what is stored, by traffic class and age, and how the store opened
//   ferry-kv verify DIR     reads and checks every object; exits 1 when any is corrupt
//   ferry-kv compact DIR    drops expired, deleted and superseded objects and enforces the
//                           capacity; prints the stats before and after
//
// Flags: --json (one JSON object instead of a table), and the store's options as its server runs
// with them (compact evicts down to the capacity and drops what is past its TTL): --capacity
// BYTES, --segment-bytes BYTES ("64GiB", "256MiB"), --ttl-chat and --ttl-agent DURATION ("7d",
// "72h"); defaults are StoreOptions'. Opening recovers the store as a server would: a torn tail of
// the open segment is cut, and a segment is begun when the last one is sealed.
//
// Exit status: 0 done, 1 an error (or corrupt objects, for verify), 2 bad usage.

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/common/units.h"
#include "kvstore/format.h"
#include "kvstore/kv_store.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace kv {
namespace {

using Json = nlohmann::json;

constexpr char kUsage[] =
    "usage: ferry-kv stats|verify|compact DIR [--json] [--capacity BYTES] [--segment-bytes BYTES]\n"
    "                [--ttl-chat DURATION] [--ttl-agent DURATION]\n"
    "\n"
    "  stats    objects and bytes by traffic class and age, segment files, how the store opened\n"
    "  verify   read and check every object; exit status 1 when any is corrupt\n"
    "  compact  drop expired and dead objects, enforce the capacity; stats before and after\n"
    "\n"
    "DIR must be a store directory that no running server holds (its LOCK). Give the server's\n"
    "--capacity and TTLs to compact: it evicts down to the capacity and drops expired objects.\n"
    "Sizes: 4096, 256MiB, 64GiB; durations: 72h, 7d.\n";

struct Flags {
  std::string command;
  std::string dir;
  bool json = false;
  StoreOptions options;
};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "ferry-kv: %s\n\n%s", message.c_str(), kUsage);
  return 2;
}

// Parses argv into `flags`; returns -1 to go on, or the exit status.
int ParseFlags(int argc, char** argv, Flags* flags) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help" || arg == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) {
      positional.push_back(arg);
      continue;
    }
    if (arg == "--json") {
      flags->json = true;
      continue;
    }
    std::string value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return UsageError(absl::StrCat(arg, " needs a value"));
    }
    if (arg == "--capacity" || arg == "--segment-bytes") {
      auto bytes = ParseByteSize(value);
      if (!bytes.ok()) return UsageError(absl::StrCat(arg, ": ", bytes.status().message()));
      if (*bytes > static_cast<uint64_t>(INT64_MAX)) return UsageError(arg + ": too large");
      const int64_t n = static_cast<int64_t>(*bytes);
      if (arg == "--capacity") {
        flags->options.capacity_bytes = n;
      } else {
        flags->options.segment_bytes = n;
        // The tool writes nothing of its own; the limit only has to fit the segments.
        flags->options.max_object_bytes =
            std::min<int64_t>(flags->options.max_object_bytes,
                              n - static_cast<int64_t>(kSegmentHeaderBytes + kRecordHeaderBytes));
      }
    } else if (arg == "--ttl-chat" || arg == "--ttl-agent") {
      auto ttl = ParseConfigDuration(value);
      if (!ttl.ok()) return UsageError(absl::StrCat(arg, ": ", ttl.status().message()));
      const TrafficClass c = arg == "--ttl-chat" ? TrafficClass::kChat : TrafficClass::kAgent;
      flags->options.ttl[static_cast<int>(c)] = *ttl;
    } else {
      return UsageError(absl::StrCat("unknown flag ", arg));
    }
  }
  if (positional.empty()) return UsageError("no command given");
  flags->command = positional[0];
  if (flags->command != "stats" && flags->command != "verify" && flags->command != "compact") {
    return UsageError(absl::StrCat("unknown command '", flags->command, "'"));
  }
  if (positional.size() != 2) {
    return UsageError(absl::StrCat(flags->command, " takes one store directory"));
  }
  flags->dir = positional[1];
  return -1;
}

// Opens the store, or says why not (exit status in *exit_code).
std::unique_ptr<KvStore> OpenStore(const Flags& flags, int* exit_code) {
  struct stat st;
  if (::stat(flags.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    // Open would create it: a mistyped path must not become an empty store.
    std::fprintf(stderr, "ferry-kv: %s is not a directory\n", flags.dir.c_str());
    *exit_code = 1;
    return nullptr;
  }
  auto store = KvStore::Open(flags.dir, flags.options);
  if (store.ok()) return std::move(*store);
  const absl::Status& s = store.status();
  if (absl::IsInvalidArgument(s)) {
    *exit_code = UsageError(std::string(s.message()));
    return nullptr;
  }
  std::fprintf(stderr, "ferry-kv: cannot open the store in %s: %s\n", flags.dir.c_str(),
               std::string(s.message()).c_str());
  if (absl::IsFailedPrecondition(s)) {
    std::fprintf(stderr,
                 "ferry-kv: a running store (a KV store server, or another ferry-kv) holds its "
                 "lock; stop it first, or run ferry-kv on a copy of the directory\n");
  }
  *exit_code = 1;
  return nullptr;
}

constexpr const char* kAgeNames[5] = {"<1h", "<1d", "<3d", "<7d", "older"};

Json StatsJson(const StoreStats& s) {
  Json classes = Json::object();
  for (int c = 0; c < kNumTrafficClasses; ++c) {
    const ClassStats& cs = s.classes[c];
    Json by_age = Json::object();
    for (int a = 0; a < 5; ++a) by_age[kAgeNames[a]] = cs.by_age[a];
    classes[TrafficClassName(static_cast<TrafficClass>(c))] = {
        {"objects", cs.objects}, {"bytes", cs.bytes}, {"by_age", by_age}};
  }
  return Json{
      {"objects", s.objects},
      {"value_bytes", s.value_bytes},
      {"file_bytes", s.file_bytes},
      {"segments", s.segments},
      {"classes", classes},
      {"open",
       {{"seconds", s.open_seconds},
        {"objects", s.open_objects},
        {"segments_from_footer", s.segments_from_footer},
        {"segments_scanned", s.segments_scanned},
        {"torn_bytes_dropped", s.torn_bytes_dropped}}},
      {"direct_io", s.direct_io},
      {"since_open",
       {{"puts", s.puts},
        {"put_bytes", s.put_bytes},
        {"deletes", s.deletes},
        {"gets", s.gets},
        {"hits", s.hits},
        {"misses", s.misses},
        {"read_bytes", s.read_bytes},
        {"corrupt_reads", s.corrupt_reads},
        {"fingerprint_mismatches", s.fingerprint_mismatches},
        {"expired", s.expired},
        {"evicted", s.evicted},
        {"evicted_bytes", s.evicted_bytes},
        {"rewritten", s.rewritten},
        {"rewritten_bytes", s.rewritten_bytes},
        {"compactions", s.compactions},
        {"group_commits", s.group_commits}}},
  };
}

std::string Bytes(int64_t n) { return FormatByteSize(static_cast<uint64_t>(n < 0 ? 0 : n)); }

void PrintStats(const std::string& dir, const StoreStats& s) {
  std::printf("store %s\n", dir.c_str());
  std::printf("  objects        %lld (%s of values)\n", static_cast<long long>(s.objects),
              Bytes(s.value_bytes).c_str());
  std::printf("  segment files  %lld, %s\n", static_cast<long long>(s.segments),
              Bytes(s.file_bytes).c_str());
  std::printf("  direct I/O     %s\n\n", s.direct_io ? "yes" : "no (buffered)");
  std::printf("  %-7s %9s %12s %8s %8s %8s %8s %8s\n", "class", "objects", "bytes", kAgeNames[0],
              kAgeNames[1], kAgeNames[2], kAgeNames[3], kAgeNames[4]);
  ClassStats all;
  auto row = [](const char* name, const ClassStats& c) {
    std::printf("  %-7s %9lld %12s", name, static_cast<long long>(c.objects),
                Bytes(c.bytes).c_str());
    for (int64_t n : c.by_age) std::printf(" %8lld", static_cast<long long>(n));
    std::printf("\n");
  };
  for (int c = 0; c < kNumTrafficClasses; ++c) {
    const ClassStats& cs = s.classes[c];
    row(TrafficClassName(static_cast<TrafficClass>(c)), cs);
    all.objects += cs.objects;
    all.bytes += cs.bytes;
    for (int a = 0; a < 5; ++a) all.by_age[a] += cs.by_age[a];
  }
  row("all", all);
  std::printf("  (age since creation)\n\n");
  std::printf(
      "  opened in %.3f s: %lld objects; segments: %lld from their footer, %lld scanned; "
      "torn bytes dropped: %lld\n",
      s.open_seconds, static_cast<long long>(s.open_objects),
      static_cast<long long>(s.segments_from_footer), static_cast<long long>(s.segments_scanned),
      static_cast<long long>(s.torn_bytes_dropped));
}

int RunStats(const Flags& flags, KvStore& store) {
  const StoreStats s = store.Stats();
  if (flags.json) {
    Json j = StatsJson(s);
    j["dir"] = flags.dir;
    std::printf("%s\n", j.dump().c_str());
  } else {
    PrintStats(flags.dir, s);
  }
  return 0;
}

int RunVerify(const Flags& flags, KvStore& store) {
  const VerifyReport r = store.Verify();
  if (flags.json) {
    Json j = {{"dir", flags.dir},
              {"objects_checked", r.objects_checked},
              {"bytes_checked", r.bytes_checked},
              {"corrupt", r.corrupt},
              {"problems", r.problems}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("store %s: %lld objects checked (%s of values), %lld corrupt\n", flags.dir.c_str(),
                static_cast<long long>(r.objects_checked), Bytes(r.bytes_checked).c_str(),
                static_cast<long long>(r.corrupt));
    if (!r.problems.empty()) {
      std::printf(
          "problems (found while opening and verifying; corrupt objects are now misses):\n");
      for (const std::string& p : r.problems) std::printf("  %s\n", p.c_str());
    }
  }
  return r.corrupt > 0 ? 1 : 0;
}

int RunCompact(const Flags& flags, KvStore& store) {
  const StoreStats before = store.Stats();
  const absl::Status status = store.Compact();
  const StoreStats after = store.Stats();
  if (flags.json) {
    Json j = {{"dir", flags.dir},
              {"ok", status.ok()},
              {"before", StatsJson(before)},
              {"after", StatsJson(after)}};
    if (!status.ok()) j["error"] = std::string(status.message());
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("store %s: compacted%s\n", flags.dir.c_str(), status.ok() ? "" : " (FAILED)");
    std::printf("  %-12s %12s %12s\n", "", "before", "after");
    std::printf("  %-12s %12s %12s\n", "file bytes", Bytes(before.file_bytes).c_str(),
                Bytes(after.file_bytes).c_str());
    std::printf("  %-12s %12lld %12lld\n", "segments", static_cast<long long>(before.segments),
                static_cast<long long>(after.segments));
    std::printf("  %-12s %12lld %12lld\n", "objects", static_cast<long long>(before.objects),
                static_cast<long long>(after.objects));
    std::printf("  %-12s %12s %12s\n", "value bytes", Bytes(before.value_bytes).c_str(),
                Bytes(after.value_bytes).c_str());
    std::printf("  expired %lld, evicted %lld (%s), rewritten %lld (%s), segments compacted %lld\n",
                static_cast<long long>(after.expired), static_cast<long long>(after.evicted),
                Bytes(after.evicted_bytes).c_str(), static_cast<long long>(after.rewritten),
                Bytes(after.rewritten_bytes).c_str(), static_cast<long long>(after.compactions));
  }
  if (!status.ok()) {
    std::fprintf(stderr, "ferry-kv: compaction failed: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

int Main(int argc, char** argv) {
  Flags flags;
  const int parsed = ParseFlags(argc, argv, &flags);
  if (parsed >= 0) return parsed;
  int exit_code = 0;
  std::unique_ptr<KvStore> store = OpenStore(flags, &exit_code);
  if (store == nullptr) return exit_code;
  if (flags.command == "stats") return RunStats(flags, *store);
  if (flags.command == "verify") return RunVerify(flags, *store);
  return RunCompact(flags, *store);
}

}  // namespace
}  // namespace kv
}  // namespace ferry

int main(int argc, char** argv) { return ferry::kv::Main(argc, argv); }
