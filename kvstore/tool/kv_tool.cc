// ferry-kv: the operator's tool for a KV store (kv_store.h): a store directory no server has
// open (KvStore::Open locks the directory, so the tool refuses a store in use), or a running
// ferry-kvstore reached by its gRPC address (the Stats, Verify and Compact calls of
// proto/ferry/v1/kvstore.proto):
//
//   ferry-kv stats DIR|--addr HOST:PORT     what is stored, by traffic class and age, and how the
//                                           store opened
//   ferry-kv verify DIR|--addr HOST:PORT    reads and checks every object, and lists what
//                                           opening the store skipped (by reason); exits 1 when
//                                           any object is corrupt, or was skipped at opening for
//                                           its checksum or header (a torn tail is not corrupt)
//   ferry-kv compact DIR|--addr HOST:PORT   drops expired, deleted and superseded objects and
//                                           enforces the capacity; prints the stats before and
//                                           after
//
// Both ways print the same table, JSON or report. A server's StatsResponse lacks the bytes
// evicted and rewritten (shown as unknown: "-", JSON null), and adds its capacity and retention
// per class (printed only then). Deadlines over --addr: 30 s for stats, 10 min for verify and
// compact; an unreachable node is an error (exit 1).
//
// Flags: --json (one JSON object instead of a table), --log_format=text|json, --version, and, for
// DIR only, the store's options as its server runs with them (compact evicts down to the
// capacity and drops what is past its TTL): --capacity BYTES, --segment-bytes BYTES ("64GiB",
// "256MiB"), --ttl-chat, --ttl-agent and --ttl-batch DURATION ("7d", "72h"); defaults are
// StoreOptions'. Opening recovers the store as a server would: a torn tail of the open segment is
// cut, and a segment is begun when the last one is sealed. A server uses its own options.
//
// A server that requires the shared token gets the one in $FERRY_AUTH_TOKEN.
//
// Exit status: 0 done, 1 an error (or corrupt objects, for verify), 2 bad usage.

#include <sys/stat.h>

#include <algorithm>
#include <array>
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
#include "engine/common/log.h"
#include "engine/common/units.h"
#include "ferry/v1/kvstore.grpc.pb.h"
#include "kvstore/format.h"
#include "kvstore/kv_store.h"
#include "kvstore/wire.h"
#include "nlohmann/json.hpp"
#include "services/common/build_info.h"
#include "services/common/grpc_client.h"
#include "services/common/shared_token.h"

namespace ferry {
namespace kv {
namespace {

using Json = nlohmann::json;

constexpr char kUsage[] =
    "usage: ferry-kv stats|verify|compact DIR [--json] [--capacity BYTES] [--segment-bytes BYTES]\n"
    "                [--ttl-chat DURATION] [--ttl-agent DURATION] [--ttl-batch DURATION]\n"
    "       ferry-kv stats|verify|compact --addr HOST:PORT [--json]\n"
    "\n"
    "  stats    objects and bytes by traffic class and age, segment files, how the store opened\n"
    "  verify   what opening skipped, then read and check every object; exit status 1 when any\n"
    "           is corrupt or opening skipped a corrupt record (a torn tail alone is not)\n"
    "  compact  drop expired and dead objects, enforce the capacity; stats before and after\n"
    "\n"
    "DIR must be a store directory that no running server holds (its LOCK). Give the server's\n"
    "--capacity and TTLs to compact: it evicts down to the capacity and drops expired objects.\n"
    "--addr calls a running ferry-kvstore (its gRPC address) instead, which keeps its own\n"
    "options; give DIR or --addr, not both.\n"
    "Sizes: 4096, 256MiB, 64GiB; durations: 72h, 7d.\n";

// The flags, as every Ferry binary's --help lists them (services/common/command_line.h).
std::string FlagsHelp() {
  const StoreOptions defaults;
  auto flag = [](absl::string_view name, absl::string_view type, absl::string_view value,
                 absl::string_view help) {
    return absl::StrCat("  --", name, " (", type, ", default ", value, ")\n      ", help, "\n");
  };
  // As the flag takes it: "64GiB", "256MiB", else bytes.
  auto size = [](int64_t bytes) {
    if (bytes % (int64_t{1} << 30) == 0) return absl::StrCat(bytes >> 30, "GiB");
    if (bytes % (int64_t{1} << 20) == 0) return absl::StrCat(bytes >> 20, "MiB");
    return absl::StrCat(bytes);
  };
  auto ttl = [&](TrafficClass c) {
    return absl::FormatDuration(defaults.ttl[static_cast<int>(c)]);
  };
  return absl::StrCat(
      "\nFlags (--name value or --name=value):\n",
      flag("addr", "string", "\"\"", "a running ferry-kvstore's gRPC address, instead of DIR"),
      flag("capacity", "string", size(defaults.capacity_bytes),
           "DIR: the segment files' capacity (compact evicts down to it)"),
      flag("json", "bool", "false", "one JSON object instead of a table or report"),
      flag("segment-bytes", "string", size(defaults.segment_bytes), "DIR: the segment file size"),
      flag("ttl-agent", "duration", ttl(TrafficClass::kAgent),
           "DIR: retention of agent objects after their last use"),
      flag("ttl-batch", "duration", ttl(TrafficClass::kBatch),
           "DIR: retention of batch objects after their last use"),
      flag("ttl-chat", "duration", ttl(TrafficClass::kChat),
           "DIR: retention of chat objects after their last use"),
      "\nLogging (every Ferry binary):\n",
      flag("log_format", "string", "\"text\"",
           "log lines on stderr: text (glog-like) or json (one object a line)"),
      "\nAlso: --help, --version (version, git commit, build configuration).\n");
}

// Deadlines of the calls to a server: Stats walks the index; Verify reads every object and
// Compact may rewrite segments, both minutes on a large store.
constexpr absl::Duration kStatsDeadline = absl::Seconds(30);
constexpr absl::Duration kLongDeadline = absl::Minutes(10);

struct Flags {
  std::string command;
  std::string dir;   // a store directory, or
  std::string addr;  // a running ferry-kvstore's gRPC address
  bool json = false;
  std::string store_flag;  // the first store option given (DIR only)
  StoreOptions options;
};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "ferry-kv: %s\n\n%s", message.c_str(), kUsage);
  return 2;
}

// --log_format's value: text or json.
bool SetLogFormatFlag(absl::string_view value) {
  if (value == "text") {
    SetLogFormat(LogFormat::kText);
  } else if (value == "json") {
    SetLogFormat(LogFormat::kJson);
  } else {
    return false;
  }
  return true;
}

// Parses argv into `flags`; returns -1 to go on, or the exit status.
int ParseFlags(int argc, char** argv, Flags* flags) {
  std::vector<std::string> positional;
  bool addr_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help" || arg == "-help" || arg == "help") {
      std::fputs(absl::StrCat(kUsage, FlagsHelp()).c_str(), stdout);
      return 0;
    }
    if (arg == "--version" || arg == "-version") {
      std::fputs(VersionText("ferry-kv").c_str(), stdout);
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
    if (arg == "--log_format") {
      if (!SetLogFormatFlag(value)) return UsageError("--log_format: text or json");
      continue;
    }
    if (arg == "--addr") {
      if (value.empty()) return UsageError("--addr needs HOST:PORT");
      addr_given = true;
      flags->addr = value;
    } else if (arg == "--capacity" || arg == "--segment-bytes") {
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
    } else if (arg == "--ttl-chat" || arg == "--ttl-agent" || arg == "--ttl-batch") {
      auto ttl = ParseConfigDuration(value);
      if (!ttl.ok()) return UsageError(absl::StrCat(arg, ": ", ttl.status().message()));
      const TrafficClass c = *ParseTrafficClass(arg.substr(6));
      flags->options.ttl[static_cast<int>(c)] = *ttl;
    } else {
      return UsageError(absl::StrCat("unknown flag ", arg));
    }
    if (arg != "--addr" && flags->store_flag.empty()) flags->store_flag = arg;
  }
  if (positional.empty()) return UsageError("no command given");
  flags->command = positional[0];
  if (flags->command != "stats" && flags->command != "verify" && flags->command != "compact") {
    return UsageError(absl::StrCat("unknown command '", flags->command, "'"));
  }
  if (addr_given) {
    if (positional.size() != 1) {
      return UsageError(
          absl::StrCat(flags->command, " takes a store directory or --addr HOST:PORT, not both"));
    }
    if (!flags->store_flag.empty()) {
      return UsageError(absl::StrCat(flags->store_flag,
                                     " applies to a store directory; a server keeps its own "
                                     "options"));
    }
    return -1;
  }
  if (positional.size() != 2) {
    return UsageError(
        absl::StrCat(flags->command, " takes one store directory or --addr HOST:PORT"));
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

// What the tool shows of a store, from the store itself or from a server's StatsResponse.
struct ToolStats {
  StoreStats store;
  // StatsResponse has no evicted_bytes and rewritten_bytes: false over --addr.
  bool moved_bytes_known = true;
  // Only from a server: its capacity and retention per class (a directory's are the flags').
  bool from_server = false;
  int64_t capacity_bytes = 0;
  std::array<int64_t, kNumTrafficClasses> retention_seconds = {};
};

ToolStats FromStore(const StoreStats& s) {
  ToolStats t;
  t.store = s;
  return t;
}

std::array<int64_t, kNumRecoveryDrops> FromServer(const ferry::v1::RecoveryDrops& r) {
  std::array<int64_t, kNumRecoveryDrops> d = {};
  d[static_cast<int>(RecoveryDrop::kTornTail)] = static_cast<int64_t>(r.torn_tail());
  d[static_cast<int>(RecoveryDrop::kChecksum)] = static_cast<int64_t>(r.checksum());
  d[static_cast<int>(RecoveryDrop::kHeader)] = static_cast<int64_t>(r.header());
  return d;
}

// {"torn_tail": n, "checksum": n, "header": n}
Json RecoveryDropsJson(const std::array<int64_t, kNumRecoveryDrops>& dropped) {
  Json j = Json::object();
  for (int r = 0; r < kNumRecoveryDrops; ++r) {
    j[RecoveryDropName(static_cast<RecoveryDrop>(r))] = dropped[r];
  }
  return j;
}

// "torn tail 2, checksum 0, header 1"
std::string RecoveryDropsText(const std::array<int64_t, kNumRecoveryDrops>& dropped) {
  return absl::StrCat("torn tail ", dropped[static_cast<int>(RecoveryDrop::kTornTail)],
                      ", checksum ", dropped[static_cast<int>(RecoveryDrop::kChecksum)],
                      ", header ", dropped[static_cast<int>(RecoveryDrop::kHeader)]);
}

// Records the store's start-up skipped as corrupt (not a crash's torn tail).
int64_t CorruptAtOpen(const std::array<int64_t, kNumRecoveryDrops>& dropped) {
  return dropped[static_cast<int>(RecoveryDrop::kChecksum)] +
         dropped[static_cast<int>(RecoveryDrop::kHeader)];
}

ToolStats FromServer(const ferry::v1::StatsResponse& r) {
  ToolStats t;
  t.moved_bytes_known = false;
  t.from_server = true;
  t.capacity_bytes = static_cast<int64_t>(r.capacity_bytes());
  StoreStats& s = t.store;
  s.objects = static_cast<int64_t>(r.objects());
  s.value_bytes = static_cast<int64_t>(r.bytes());
  s.file_bytes = static_cast<int64_t>(r.file_bytes());
  s.segments = r.segments();
  for (const ferry::v1::ClassStats& cs : r.classes()) {
    const int c = static_cast<int>(ClassFromProto(cs.traffic_class()));
    s.classes[c].objects += static_cast<int64_t>(cs.objects());
    s.classes[c].bytes += static_cast<int64_t>(cs.bytes());
    for (int a = 0; a < cs.age_bucket_counts_size() && a < 5; ++a) {
      s.classes[c].by_age[a] += static_cast<int64_t>(cs.age_bucket_counts(a));
    }
    t.retention_seconds[c] = cs.retention_seconds();
  }
  s.puts = static_cast<int64_t>(r.puts());
  s.put_bytes = static_cast<int64_t>(r.put_bytes());
  s.deletes = static_cast<int64_t>(r.deletes());
  s.hits = static_cast<int64_t>(r.hits());
  s.misses = static_cast<int64_t>(r.misses());
  s.gets = s.hits + s.misses;  // the store counts every get as one or the other
  s.read_bytes = static_cast<int64_t>(r.read_bytes());
  s.corrupt_reads = static_cast<int64_t>(r.corrupt_reads());
  s.fingerprint_mismatches = static_cast<int64_t>(r.fingerprint_mismatches());
  s.expired = static_cast<int64_t>(r.expired_objects());
  s.evicted = static_cast<int64_t>(r.evicted_objects());
  s.rewritten = static_cast<int64_t>(r.rewritten_objects());
  s.compactions = static_cast<int64_t>(r.compactions());
  s.group_commits = static_cast<int64_t>(r.group_commits());
  s.open_seconds = r.open_seconds();
  s.open_objects = static_cast<int64_t>(r.open_objects());
  s.segments_from_footer = r.segments_from_footer();
  s.segments_scanned = r.segments_scanned();
  s.torn_bytes_dropped = static_cast<int64_t>(r.torn_bytes_dropped());
  s.recovery_dropped = FromServer(r.recovery_dropped());
  s.already_present = static_cast<int64_t>(r.already_present());
  s.key_conflicts = static_cast<int64_t>(r.key_conflicts());
  s.direct_io = r.direct_io();
  return t;
}

VerifyReport FromServer(const ferry::v1::VerifyResponse& r) {
  VerifyReport v;
  v.objects_checked = static_cast<int64_t>(r.objects_checked());
  v.bytes_checked = static_cast<int64_t>(r.bytes_checked());
  v.corrupt = static_cast<int64_t>(r.corrupt());
  v.recovery_dropped = FromServer(r.recovery_dropped());
  v.problems.assign(r.problems().begin(), r.problems().end());
  return v;
}

// How the output names the store: "store DIR" or "KV store at HOST:PORT"; in JSON "dir" or
// "addr".
std::string Where(const Flags& flags) {
  return flags.addr.empty() ? absl::StrCat("store ", flags.dir)
                            : absl::StrCat("KV store at ", flags.addr);
}
void AddWhere(const Flags& flags, Json* j) {
  if (flags.addr.empty()) {
    (*j)["dir"] = flags.dir;
  } else {
    (*j)["addr"] = flags.addr;
  }
}

constexpr const char* kAgeNames[5] = {"<1h", "<1d", "<3d", "<7d", "older"};

Json StatsJson(const ToolStats& t) {
  const StoreStats& s = t.store;
  Json classes = Json::object();
  for (int c = 0; c < kNumTrafficClasses; ++c) {
    const ClassStats& cs = s.classes[c];
    Json by_age = Json::object();
    for (int a = 0; a < 5; ++a) by_age[kAgeNames[a]] = cs.by_age[a];
    Json entry = {{"objects", cs.objects}, {"bytes", cs.bytes}, {"by_age", by_age}};
    if (t.from_server) entry["retention_seconds"] = t.retention_seconds[c];
    classes[TrafficClassName(static_cast<TrafficClass>(c))] = entry;
  }
  auto moved = [&](int64_t v) { return t.moved_bytes_known ? Json(v) : Json(nullptr); };
  Json j = {
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
        {"torn_bytes_dropped", s.torn_bytes_dropped},
        {"recovery_dropped", RecoveryDropsJson(s.recovery_dropped)}}},
      {"direct_io", s.direct_io},
      {"since_open",
       {{"puts", s.puts},
        {"put_bytes", s.put_bytes},
        {"already_present", s.already_present},
        {"key_conflicts", s.key_conflicts},
        {"deletes", s.deletes},
        {"gets", s.gets},
        {"hits", s.hits},
        {"misses", s.misses},
        {"read_bytes", s.read_bytes},
        {"corrupt_reads", s.corrupt_reads},
        {"fingerprint_mismatches", s.fingerprint_mismatches},
        {"expired", s.expired},
        {"evicted", s.evicted},
        {"evicted_bytes", moved(s.evicted_bytes)},
        {"rewritten", s.rewritten},
        {"rewritten_bytes", moved(s.rewritten_bytes)},
        {"compactions", s.compactions},
        {"group_commits", s.group_commits}}},
  };
  if (t.from_server) j["capacity_bytes"] = t.capacity_bytes;
  return j;
}

std::string Bytes(int64_t n) { return FormatByteSize(static_cast<uint64_t>(n < 0 ? 0 : n)); }

// "7d", "72h", "90s".
std::string Retention(int64_t seconds) {
  if (seconds > 0 && seconds % 86400 == 0) return absl::StrCat(seconds / 86400, "d");
  if (seconds > 0 && seconds % 3600 == 0) return absl::StrCat(seconds / 3600, "h");
  return absl::StrCat(seconds, "s");
}

void PrintStats(const std::string& where, const ToolStats& t) {
  const StoreStats& s = t.store;
  std::printf("%s\n", where.c_str());
  std::printf("  objects        %lld (%s of values)\n", static_cast<long long>(s.objects),
              Bytes(s.value_bytes).c_str());
  std::printf("  segment files  %lld, %s\n", static_cast<long long>(s.segments),
              Bytes(s.file_bytes).c_str());
  if (t.from_server) {
    std::printf("  capacity       %s; retention", Bytes(t.capacity_bytes).c_str());
    for (int c = 0; c < kNumTrafficClasses; ++c) {
      std::printf("%s %s %s", c == 0 ? "" : ",", TrafficClassName(static_cast<TrafficClass>(c)),
                  Retention(t.retention_seconds[c]).c_str());
    }
    std::printf("\n");
  }
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
  std::printf("  records skipped while opening: %s%s\n",
              RecoveryDropsText(s.recovery_dropped).c_str(),
              CorruptAtOpen(s.recovery_dropped) > 0 ? " (corruption: `verify` lists them)" : "");
  std::printf("  puts of objects already present: %lld; with other bytes (key conflicts): %lld\n",
              static_cast<long long>(s.already_present), static_cast<long long>(s.key_conflicts));
}

int ReportStats(const Flags& flags, const ToolStats& s) {
  if (flags.json) {
    Json j = StatsJson(s);
    AddWhere(flags, &j);
    std::printf("%s\n", j.dump().c_str());
  } else {
    PrintStats(Where(flags), s);
  }
  return 0;
}

int ReportVerify(const Flags& flags, const VerifyReport& r) {
  if (flags.json) {
    Json j = Json::object();
    AddWhere(flags, &j);
    j["objects_checked"] = r.objects_checked;
    j["bytes_checked"] = r.bytes_checked;
    j["corrupt"] = r.corrupt;
    j["recovery_dropped"] = RecoveryDropsJson(r.recovery_dropped);
    j["problems"] = r.problems;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: %lld objects checked (%s of values), %lld corrupt\n", Where(flags).c_str(),
                static_cast<long long>(r.objects_checked), Bytes(r.bytes_checked).c_str(),
                static_cast<long long>(r.corrupt));
    std::printf("records skipped when the store opened: %s\n",
                RecoveryDropsText(r.recovery_dropped).c_str());
    if (!r.problems.empty()) {
      std::printf(
          "problems (found while opening and verifying; corrupt objects are now misses):\n");
      for (const std::string& p : r.problems) std::printf("  %s\n", p.c_str());
    }
  }
  // A torn tail is what a crash leaves; records skipped for their checksum or header are
  // corruption, found at start-up instead of by this check.
  return r.corrupt > 0 || CorruptAtOpen(r.recovery_dropped) > 0 ? 1 : 0;
}

int ReportCompact(const Flags& flags, const ToolStats& before_stats, const ToolStats& after_stats,
                  const absl::Status& status) {
  const StoreStats& before = before_stats.store;
  const StoreStats& after = after_stats.store;
  const bool ok = status.ok();
  if (flags.json) {
    Json j = Json::object();
    AddWhere(flags, &j);
    j["ok"] = ok;
    j["before"] = StatsJson(before_stats);
    j["after"] = StatsJson(after_stats);
    if (!ok) j["error"] = std::string(status.message());
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: compacted%s\n", Where(flags).c_str(), ok ? "" : " (FAILED)");
    std::printf("  %-12s %12s %12s\n", "", "before", "after");
    std::printf("  %-12s %12s %12s\n", "file bytes", Bytes(before.file_bytes).c_str(),
                Bytes(after.file_bytes).c_str());
    std::printf("  %-12s %12lld %12lld\n", "segments", static_cast<long long>(before.segments),
                static_cast<long long>(after.segments));
    std::printf("  %-12s %12lld %12lld\n", "objects", static_cast<long long>(before.objects),
                static_cast<long long>(after.objects));
    std::printf("  %-12s %12s %12s\n", "value bytes", Bytes(before.value_bytes).c_str(),
                Bytes(after.value_bytes).c_str());
    auto moved = [&](int64_t bytes) {
      return after_stats.moved_bytes_known ? Bytes(bytes) : std::string("-");
    };
    std::printf("  expired %lld, evicted %lld (%s), rewritten %lld (%s), segments compacted %lld\n",
                static_cast<long long>(after.expired), static_cast<long long>(after.evicted),
                moved(after.evicted_bytes).c_str(), static_cast<long long>(after.rewritten),
                moved(after.rewritten_bytes).c_str(), static_cast<long long>(after.compactions));
  }
  if (!ok) {
    std::fprintf(stderr, "ferry-kv: compaction failed: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

int RunOnDirectory(const Flags& flags) {
  int exit_code = 0;
  std::unique_ptr<KvStore> store = OpenStore(flags, &exit_code);
  if (store == nullptr) return exit_code;
  if (flags.command == "stats") return ReportStats(flags, FromStore(store->Stats()));
  if (flags.command == "verify") return ReportVerify(flags, store->Verify());
  const ToolStats before = FromStore(store->Stats());
  const absl::Status status = store->Compact();
  const ToolStats after = FromStore(store->Stats());
  return ReportCompact(flags, before, after, status);
}

// A running ferry-kvstore, called over a channel of its own.
class Server {
 public:
  Server(const std::string& addr, const SharedToken& token)
      : addr_(addr),
        token_(token),
        channel_(NewChannel(addr)),
        stub_(ferry::v1::KvStore::NewStub(channel_)) {}

  grpc::Status Stats(ferry::v1::StatsResponse* response) {
    auto context = Context(kStatsDeadline);
    return stub_->Stats(context.get(), ferry::v1::StatsRequest(), response);
  }
  grpc::Status Verify(ferry::v1::VerifyResponse* response) {
    auto context = Context(kLongDeadline);
    return stub_->Verify(context.get(), ferry::v1::VerifyRequest(), response);
  }
  grpc::Status Compact(ferry::v1::StatsResponse* response) {
    auto context = Context(kLongDeadline);
    return stub_->Compact(context.get(), ferry::v1::CompactRequest(), response);
  }

  // Whether a failed call reached the server: its channel is connected.
  bool Reached() const { return channel_->GetState(false) == GRPC_CHANNEL_READY; }

  // Says why `method` failed (exit status 1).
  int Failed(const char* method, const grpc::Status& status, absl::Duration deadline) const {
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::fprintf(stderr, "ferry-kv: %s on %s: no answer within %s\n", method, addr_.c_str(),
                   absl::FormatDuration(deadline).c_str());
    } else if (!Reached()) {
      std::fprintf(stderr,
                   "ferry-kv: cannot reach a KV store at %s (%s); is ferry-kvstore running "
                   "there?\n",
                   addr_.c_str(), status.error_message().c_str());
    } else {
      std::fprintf(stderr, "ferry-kv: %s on %s failed: %s\n", method, addr_.c_str(),
                   status.error_message().c_str());
    }
    return 1;
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration deadline) const {
    auto context = NewClientContext(deadline);
    AttachSharedToken(context.get(), token_);
    return context;
  }

  const std::string addr_;
  const SharedToken token_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<ferry::v1::KvStore::Stub> stub_;
};

int RunOnServer(const Flags& flags) {
  const absl::StatusOr<SharedToken> token = LoadSharedToken("");
  if (!token.ok()) {
    std::fprintf(stderr, "ferry-kv: %s\n", std::string(token.status().message()).c_str());
    return 2;
  }
  Server server(flags.addr, *token);
  ferry::v1::StatsResponse stats;
  if (flags.command == "verify") {
    ferry::v1::VerifyResponse verify;
    const grpc::Status status = server.Verify(&verify);
    if (!status.ok()) return server.Failed("Verify", status, kLongDeadline);
    return ReportVerify(flags, FromServer(verify));
  }
  grpc::Status status = server.Stats(&stats);
  if (!status.ok()) return server.Failed("Stats", status, kStatsDeadline);
  if (flags.command == "stats") return ReportStats(flags, FromServer(stats));
  const ToolStats before = FromServer(stats);
  ferry::v1::StatsResponse compacted;
  status = server.Compact(&compacted);
  if (status.ok()) return ReportCompact(flags, before, FromServer(compacted), absl::OkStatus());
  // The server answered with an error (a storage failure): show where it stands now.
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || !server.Reached()) {
    return server.Failed("Compact", status, kLongDeadline);
  }
  const grpc::Status after = server.Stats(&stats);
  if (!after.ok()) return server.Failed("Stats", after, kStatsDeadline);
  // gRPC's codes are absl's.
  return ReportCompact(
      flags, before, FromServer(stats),
      absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message()));
}

int Main(int argc, char** argv) {
  Flags flags;
  const int parsed = ParseFlags(argc, argv, &flags);
  if (parsed >= 0) return parsed;
  return flags.addr.empty() ? RunOnDirectory(flags) : RunOnServer(flags);
}

}  // namespace
}  // namespace kv
}  // namespace ferry

int main(int argc, char** argv) { return ferry::kv::Main(argc, argv); }
