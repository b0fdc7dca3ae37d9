// ferry bench transfer, the C++ side: KvTransport (services/transfer/kv_transport.h) moving bytes
// between two processes on this machine, and memcpy of the same sizes. tools/bench/
// transfer_bench.sh runs it per transport next to ucx_perftest and prints the table and the JSON.
//
// Two roles in one binary. The initiator (the default) starts a copy of itself as the target
// (posix_spawn of /proc/self/exe with --role target, stdin and stdout on pipes). The target
// creates a transport of the same kind, allocates one registered region (KvTransport::Allocate,
// touched once so that no page fault lands in a measurement), writes one line
// "descriptor <hex>" (a ferry.v1.TransferDescriptor from transfer_wire.h's ToProto, hex-encoded)
// and then does nothing but wait for "quit" (or EOF) on stdin: its transport's own threads serve
// the initiator's one-sided operations. The initiator allocates its source region the same way,
// connects and measures, with no transfer_id (no notification to the target):
//
//   put_b1 / get_b1   one segment of SIZE per transfer, transfers back to back, each waiting for
//                     its completion (KvTransport::Transfer); the same offsets every time (as
//                     ucx_perftest reuses one buffer);
//   put_b64           64 segments of SIZE per transfer at distinct offsets of the target region
//                     (a transfer's written segments must not overlap), as many as fit when 64 do
//                     not (256 MiB region: 16 at 16 MiB, 4 at 64 MiB; the row says how many);
//   scatter_put/get   the request-shaped transfer: 64 blocks of 1,474,560 bytes (the bf16 KV of
//                     64 tokens of SmolLM2-135M: 30 layers x K,V x 3 KV heads x 64 x 2 bytes, so
//                     a 4,096-token request), one segment each, at random non-adjacent block
//                     positions of a 128-block pool on both sides, in a random order (nothing can
//                     be coalesced);
//   contig_put/get    the same 94,371,840 bytes as one segment: the contiguous rate the scatter
//                     rate is compared with.
//   scatter_put_cold  the request-shaped put as a hand-off meets it: one transfer at a time,
//                     each after the transport idled for kColdGap (250 ms: its threads asleep,
//                     the cores idle, as while a prefill computes), between source and
//                     destination blocks not in any cache (each side cycles through max(1 GiB,
//                     4 x the last-level cache) of blocks; a prefill's KV is not cached either:
//                     the weights stream through the cache after each layer writes it). mb_s is
//                     the median of the single transfers' rates (kColdTransfers of them; --quick:
//                     5). scatter_put rewrites the same blocks back to back, which after the first
//                     transfer sit in the cache (an L3 of 90 MiB or more holds them all), every
//                     thread awake: the transport at its best, which a pushed request never meets.
// --scatter_blocks 4,16,64 measures both scatter puts at each of those block counts (the first N
// of the scattered blocks: the KV of 256, 1,024 and 4,096 tokens; ferry bench pd's baseline), and
// --scatter_only measures nothing else (after the check).
// Every point runs one warm-up transfer, then --rounds (2) rounds of transfers until --min_seconds
// (0.3) have passed; MB/s is bytes over that time (10^6 bytes per second), of the best round.
// --quick: one round of 0.1 s. Before the timings the initiator checks that the scattered bytes
// arrive: one scatter put, then a get of the same remote blocks into the unused local blocks,
// compared with the source.
//
// memcpy (--memcpy_only): single thread, a source and a destination buffer of SIZE each (cache
// resident where SIZE fits, as ucx_perftest's buffer is), best of 3 rounds of ~min_seconds/3.
//
// Output, one line per point on stdout, for the driver to parse:
//   result kind=ucx tls=tcp transport=ucx:tcp case=put_b64 segment_bytes=262144 segments=64
//          transfers=N bytes=B seconds=S mb_s=M us_per_transfer=U
// plus "info ..." lines; progress and errors go to stderr.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/common/status.h"
#include "ferry/v1/common.pb.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/transfer_wire.h"

extern char** environ;

namespace ferry::bench {
namespace {

using transfer::KvTransport;
using transfer::LocalRegion;
using transfer::PeerDescriptor;
using transfer::PeerId;
using transfer::RegionDescriptor;
using transfer::TransferOp;
using transfer::TransferRequest;
using transfer::TransferSegment;

constexpr int kBatch = 64;
// The target's region: room for 64 distinct segments up to 4 MiB, and for the scatter pool.
constexpr uint64_t kTargetRegionBytes = uint64_t{256} << 20;
// 64 tokens x 30 layers x 2 (K, V) x 3 KV heads x 64 head_dim x 2 bytes (bf16).
constexpr uint64_t kBlockBytes = uint64_t{64} * 30 * 2 * 3 * 64 * 2;
constexpr int kScatterBlocks = 64;
constexpr int kPoolBlocks = 128;
constexpr uint64_t kPoolBytes = kBlockBytes * kPoolBlocks;
// The cold scatter put's destination blocks: at least this many bytes of them, and 4x the
// last-level cache (every other block of the region is one: twice that much region).
constexpr uint64_t kMinColdBytes = uint64_t{1} << 30;
constexpr absl::Duration kColdGap = absl::Milliseconds(250);
constexpr int kColdTransfers = 15;

uint64_t ColdRegionBytes() {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const uint64_t want = std::max<uint64_t>(kMinColdBytes, llc > 0 ? 4 * uint64_t(llc) : 0);
  return 2 * ((want + kBlockBytes - 1) / kBlockBytes * kBlockBytes);
}

// No transfer here takes anywhere near this (256 MiB at 50 MB/s: 5 s).
constexpr absl::Duration kTransferDeadline = absl::Seconds(30);
// A transfer's callback runs by its deadline (kv_transport.h); this much later the bench gives up
// on the transport rather than hang.
constexpr absl::Duration kWatchdogGrace = absl::Seconds(10);
constexpr int kTargetStartSeconds = 60;

struct Flags {
  std::string role = "initiator";  // or "target" (started by the initiator)
  std::string kind = "ucx";
  std::string ucx_tls;  // empty: UCX_TLS from the environment
  std::string sizes = "4k,16k,64k,256k,1m,4m,16m,64m";
  bool quick = false;
  bool memcpy_only = false;
  bool gets = true;
  bool scatter_only = false;
  std::string scatter_blocks = "64";  // block counts of the scatter put
  double min_seconds = 0.3;           // per round of a point
  int rounds = 2;                     // per point; the best counts
  uint64_t region_bytes = 0;          // target role: what to allocate
  uint64_t seed = 1;
};

int Usage() {
  std::fprintf(
      stderr,
      "usage: transfer_bench [--kind ucx|grpc] [--ucx_tls tcp|shm|...] [--sizes "
      "4k,16k,...,64m] [--min_seconds S] [--rounds R] [--quick] [--no_gets] [--memcpy_only] "
      "[--scatter_blocks 4,16,64] [--scatter_only] [--seed N]\n");
  return 2;
}

// "4k", "256K", "1m", "64M", "1g" or a plain byte count; 0 when unparsable.
uint64_t ParseSize(absl::string_view s) {
  uint64_t unit = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'k':
      case 'K':
        unit = uint64_t{1} << 10;
        break;
      case 'm':
      case 'M':
        unit = uint64_t{1} << 20;
        break;
      case 'g':
      case 'G':
        unit = uint64_t{1} << 30;
        break;
    }
    if (unit != 1) s.remove_suffix(1);
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(s, &n)) return 0;
  return n * unit;
}

std::string SizeLabel(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t Address(const void* p) { return reinterpret_cast<uint64_t>(p); }

// --- the target --------------------------------------------------------------------------------

transfer::TransportOptions TransportOptionsFor(const Flags& flags) {
  transfer::TransportOptions options;
  options.kind = flags.kind;
  options.ucx_tls = flags.ucx_tls;
  return options;
}

int RunTarget(const Flags& flags) {
  // Errors go to stdout too, so that the initiator can say why the target did not start.
  auto fail = [](const absl::Status& s) {
    std::printf("error %s\n", std::string(absl::CEscape(s.ToString())).c_str());
    std::fflush(stdout);
    return 1;
  };
  absl::StatusOr<std::unique_ptr<KvTransport>> transport =
      KvTransport::Create(TransportOptionsFor(flags));
  if (!transport.ok()) return fail(transport.status());
  absl::StatusOr<LocalRegion> region = (*transport)->Allocate(flags.region_bytes);
  if (!region.ok()) return fail(region.status());
  std::memset(region->span.address, 0, region->span.length);  // fault the pages in now
  PeerDescriptor descriptor;
  descriptor.kind = std::string((*transport)->kind());
  descriptor.address = (*transport)->address();
  descriptor.regions.push_back(region->descriptor);
  std::string bytes;
  if (!transfer::ToProto(descriptor).SerializeToString(&bytes)) {
    return fail(absl::InternalError("cannot serialize the transfer descriptor"));
  }
  std::printf("descriptor %s\n", absl::BytesToHexString(bytes).c_str());
  std::fflush(stdout);
  char line[64];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
    if (absl::StartsWith(line, "quit")) break;
  }
  const absl::Status s = (*transport)->Deregister(region->id);
  if (!s.ok()) std::fprintf(stderr, "transfer target: deregister: %s\n", s.ToString().c_str());
  return 0;
}

// --- the initiator's handle on the target process ---------------------------------------------

class TargetProcess {
 public:
  static absl::StatusOr<std::unique_ptr<TargetProcess>> Start(const Flags& flags,
                                                              uint64_t region_bytes) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
    if (pipe2(from_child, O_CLOEXEC) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      return absl::InternalError("pipe2 failed");
    }
    std::vector<std::string> args = {
        "transfer_bench", "--role",         "target",
        "--kind",         flags.kind,       "--ucx_tls",
        flags.ucx_tls,    "--region_bytes", absl::StrCat(region_bytes)};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // dup2 clears O_CLOEXEC on the new descriptors; every other pipe end closes at exec.
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    if (rc != 0) {
      close(to_child[1]);
      close(from_child[0]);
      return absl::InternalError(absl::StrCat("posix_spawn: ", std::strerror(rc)));
    }
    return std::unique_ptr<TargetProcess>(new TargetProcess(pid, to_child[1], from_child[0]));
  }

  ~TargetProcess() { Stop(); }

  // For when the bench must leave at once.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // The first line the target writes: its descriptor, or why it failed.
  absl::StatusOr<PeerDescriptor> ReadDescriptor() {
    ASSIGN_OR_RETURN(std::string line, ReadLine(absl::Seconds(kTargetStartSeconds)));
    if (absl::StartsWith(line, "error ")) {
      std::string message;
      absl::CUnescape(line.substr(6), &message);
      return absl::UnavailableError(absl::StrCat("the target process failed: ", message));
    }
    if (!absl::StartsWith(line, "descriptor ")) {
      return absl::InternalError(absl::StrCat("unexpected line from the target: ", line));
    }
    v1::TransferDescriptor proto;
    if (!proto.ParseFromString(absl::HexStringToBytes(line.substr(11)))) {
      return absl::InternalError("the target's descriptor does not parse");
    }
    return transfer::FromProto(proto);
  }

  // Tells the target to quit and reaps it (killed if it has not exited within 10 s).
  void Stop() {
    if (pid_ <= 0) return;
    if (to_ >= 0) {
      const char quit[] = "quit\n";
      (void)!write(to_, quit, sizeof(quit) - 1);
      close(to_);
      to_ = -1;
    }
    int status = 0;
    for (int i = 0; i < 1000; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (pid_ > 0) {
      std::fprintf(stderr, "transfer: the target process did not exit in 10 s; killing it\n");
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    if (from_ >= 0) close(from_);
    from_ = -1;
  }

 private:
  TargetProcess(pid_t pid, int to, int from) : pid_(pid), to_(to), from_(from) {}

  absl::StatusOr<std::string> ReadLine(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string line;
    while (true) {
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0) return absl::DeadlineExceededError("the target process did not answer");
      pollfd p{from_, POLLIN, 0};
      const int n = poll(&p, 1, static_cast<int>(ms));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) continue;
      char c;
      const ssize_t r = read(from_, &c, 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return absl::UnavailableError("the target process exited before answering");
      if (c == '\n') return line;
      line.push_back(c);
    }
  }

  pid_t pid_;
  int to_;
  int from_;
};

// --- measurements ------------------------------------------------------------------------------

struct Point {
  std::string name;  // put_b1, put_b64, get_b1, scatter_put, ...
  uint64_t segment_bytes = 0;
  int segments = 0;
  int64_t transfers = 0;
  double seconds = 0;
  double median_mb_s = 0;  // set: the figure is the median of single transfers (cold case)
  uint64_t bytes() const { return segment_bytes * segments * transfers; }
  double mb_s() const {
    return median_mb_s > 0 ? median_mb_s : seconds > 0 ? bytes() / seconds / 1e6 : 0;
  }
};

struct Session {
  const Flags* flags = nullptr;
  TargetProcess* target = nullptr;
  KvTransport* transport = nullptr;
  PeerId peer = 0;
  std::string peer_transport;
  LocalRegion local;
  RegionDescriptor remote;
};

void PrintPoint(const Session& s, const Point& p) {
  std::printf(
      "result kind=%s tls=%s transport=%s case=%s segment_bytes=%llu segments=%d transfers=%lld "
      "bytes=%llu seconds=%.6f mb_s=%.2f us_per_transfer=%.2f\n",
      s.flags->kind.c_str(), s.flags->ucx_tls.empty() ? "-" : s.flags->ucx_tls.c_str(),
      s.peer_transport.c_str(), p.name.c_str(), static_cast<unsigned long long>(p.segment_bytes),
      p.segments, static_cast<long long>(p.transfers), static_cast<unsigned long long>(p.bytes()),
      p.seconds, p.mb_s(), p.transfers > 0 ? p.seconds / p.transfers * 1e6 : 0.0);
  std::fflush(stdout);
  std::fprintf(stderr, "transfer: %s %s %-11s %8s x %2d: %10.1f MB/s (%lld transfers, %.2f s)\n",
               s.flags->kind.c_str(), s.flags->ucx_tls.c_str(), p.name.c_str(),
               SizeLabel(p.segment_bytes).c_str(), p.segments, p.mb_s(),
               static_cast<long long>(p.transfers), p.seconds);
}

absl::Status TransferOnce(const Session& s, TransferOp op,
                          const std::vector<TransferSegment>& segments) {
  TransferRequest request;
  request.peer = s.peer;
  request.op = op;
  request.remote = s.remote;
  request.segments = segments;
  request.deadline = absl::Now() + kTransferDeadline;
  struct Outcome {
    absl::Notification done;
    absl::Status status;
  };
  auto outcome = std::make_shared<Outcome>();
  const absl::StatusOr<transfer::TransferId> id =
      s.transport->Post(std::move(request), [outcome](absl::Status status) {
        outcome->status = std::move(status);
        outcome->done.Notify();
      });
  if (!id.ok()) return id.status();
  if (!outcome->done.WaitForNotificationWithTimeout(kTransferDeadline + kWatchdogGrace)) {
    // The transport broke its contract; it may still touch the memory, so nothing is freed: say
    // so and leave at once.
    std::printf(
        "error kind=%s tls=%s message=a transfer did not complete within %s of its deadline\n",
        s.flags->kind.c_str(), s.flags->ucx_tls.empty() ? "-" : s.flags->ucx_tls.c_str(),
        absl::FormatDuration(kWatchdogGrace).c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "transfer: %s %s: a transfer outlived its deadline; giving up\n",
                 s.flags->kind.c_str(), s.flags->ucx_tls.c_str());
    s.target->Kill();
    std::_Exit(1);
  }
  return outcome->status;
}

// One warm-up transfer, then --rounds rounds of transfers back to back until min_seconds have
// passed; the fastest round counts (as in timing.h).
absl::StatusOr<Point> Measure(const Session& s, std::string name, TransferOp op,
                              const std::vector<TransferSegment>& segments) {
  Point best;
  RETURN_IF_ERROR(TransferOnce(s, op, segments));
  for (int round = 0; round < s.flags->rounds; ++round) {
    Point p;
    p.name = name;
    p.segment_bytes = segments.front().length;
    p.segments = static_cast<int>(segments.size());
    const double start = Now();
    double now = start;
    do {
      RETURN_IF_ERROR(TransferOnce(s, op, segments));
      ++p.transfers;
      now = Now();
    } while (now - start < s.flags->min_seconds);
    p.seconds = now - start;
    if (round == 0 || p.mb_s() > best.mb_s()) best = p;
  }
  PrintPoint(s, best);
  return best;
}

// The cold scatter put of `n` blocks (see the header): each transfer after kColdGap, between
// blocks of both regions not touched for ColdRegionBytes() / 2; only the transfers are timed.
// The median rate counts.
absl::Status MeasureCold(const Session& s, int n, std::mt19937_64& rng) {
  const uint64_t lbase = Address(s.local.span.address);
  // Slots on each side: every other block after the warm scatter pool's.
  const uint64_t local_slots = (s.local.span.length / kBlockBytes - kPoolBlocks) / 2;
  const uint64_t remote_slots = (s.remote.length / kBlockBytes - kPoolBlocks) / 2;
  uint64_t next = 0;
  auto once = [&](double* seconds) -> absl::Status {
    std::vector<TransferSegment> segments;
    for (int i = 0; i < n; ++i, ++next) {
      const uint64_t local = kPoolBlocks + 2 * (next % local_slots);
      const uint64_t remote = kPoolBlocks + 2 * (next % remote_slots);
      segments.push_back(
          {lbase + local * kBlockBytes, s.remote.address + remote * kBlockBytes, kBlockBytes});
    }
    std::shuffle(segments.begin(), segments.end(), rng);
    absl::SleepFor(kColdGap);
    const double start = Now();
    RETURN_IF_ERROR(TransferOnce(s, TransferOp::kPut, segments));
    *seconds = Now() - start;
    return absl::OkStatus();
  };
  double seconds = 0;
  RETURN_IF_ERROR(once(&seconds));  // warm-up
  Point p;
  p.name = "scatter_put_cold";
  p.segment_bytes = kBlockBytes;
  p.segments = n;
  std::vector<double> rates;
  for (int i = 0; i < (s.flags->quick ? 5 : kColdTransfers); ++i) {
    RETURN_IF_ERROR(once(&seconds));
    ++p.transfers;
    p.seconds += seconds;
    rates.push_back(static_cast<double>(n * kBlockBytes) / seconds / 1e6);
  }
  std::sort(rates.begin(), rates.end());
  p.median_mb_s = rates[rates.size() / 2];
  PrintPoint(s, p);
  return absl::OkStatus();
}

// `count` block positions in [0, pool) with no two adjacent, in a random order.
std::vector<int> ScatteredBlocks(std::mt19937_64& rng, int pool, int count) {
  // Every other block, shifted by one from a random point on: the only way to place count =
  // pool / 2 blocks without neighbours (pool >= 2 * count).
  const int shift_from = std::uniform_int_distribution<int>(0, count)(rng);
  std::vector<int> blocks;
  for (int k = 0; k < count; ++k) blocks.push_back(2 * k + (k >= shift_from ? 1 : 0));
  std::shuffle(blocks.begin(), blocks.end(), rng);
  return blocks;
}

absl::Status RunTransport(const Flags& flags, const std::vector<uint64_t>& sizes) {
  const uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  const uint64_t target_bytes =
      std::max({kTargetRegionBytes, kPoolBytes + ColdRegionBytes(), max_size});
  const uint64_t source_bytes = std::max(kPoolBytes + ColdRegionBytes(), max_size);

  ASSIGN_OR_RETURN(std::unique_ptr<TargetProcess> target,
                   TargetProcess::Start(flags, target_bytes));
  ASSIGN_OR_RETURN(PeerDescriptor descriptor, target->ReadDescriptor());
  if (descriptor.regions.size() != 1) {
    return absl::InternalError("the target described no region");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvTransport> transport,
                   KvTransport::Create(TransportOptionsFor(flags)));
  ASSIGN_OR_RETURN(LocalRegion local, transport->Allocate(source_bytes));
  // Random bytes (not zero pages), so that the check below means something.
  {
    std::mt19937_64 fill(flags.seed * 7919 + 1);
    uint64_t* words = static_cast<uint64_t*>(local.span.address);
    for (size_t i = 0; i < local.span.length / 8; ++i) words[i] = fill();
  }
  ASSIGN_OR_RETURN(PeerId peer, transport->Connect(descriptor.address));
  Session s;
  s.flags = &flags;
  s.target = target.get();
  s.transport = transport.get();
  s.peer = peer;
  s.peer_transport = transport->PeerTransport(peer);
  s.local = local;
  s.remote = descriptor.regions[0];
  if (s.peer_transport.empty()) s.peer_transport = "-";
  std::printf("info kind=%s tls=%s transport=%s target_region=%llu source_region=%llu\n",
              flags.kind.c_str(), flags.ucx_tls.empty() ? "-" : flags.ucx_tls.c_str(),
              s.peer_transport.c_str(), static_cast<unsigned long long>(target_bytes),
              static_cast<unsigned long long>(source_bytes));
  std::fflush(stdout);
  std::fprintf(stderr, "transfer: %s %s: connected, peer transport %s\n", flags.kind.c_str(),
               flags.ucx_tls.c_str(), s.peer_transport.c_str());
  const uint64_t lbase = Address(local.span.address);
  const uint64_t rbase = s.remote.address;

  // The request-shaped transfer first, checked: scattered blocks put, read back elsewhere.
  std::mt19937_64 rng(flags.seed);
  const std::vector<int> local_blocks = ScatteredBlocks(rng, kPoolBlocks, kScatterBlocks);
  const std::vector<int> remote_blocks = ScatteredBlocks(rng, kPoolBlocks, kScatterBlocks);
  std::vector<bool> used(kPoolBlocks, false);
  for (int b : local_blocks) used[b] = true;
  std::vector<int> spare_blocks;  // local blocks the scatter put does not read: get targets
  for (int b = 0; b < kPoolBlocks; ++b) {
    if (!used[b]) spare_blocks.push_back(b);
  }
  std::shuffle(spare_blocks.begin(), spare_blocks.end(), rng);
  std::vector<TransferSegment> scatter_put, scatter_get;
  for (int i = 0; i < kScatterBlocks; ++i) {
    scatter_put.push_back({lbase + local_blocks[i] * kBlockBytes,
                           rbase + remote_blocks[i] * kBlockBytes, kBlockBytes});
    scatter_get.push_back({lbase + spare_blocks[i] * kBlockBytes,
                           rbase + remote_blocks[i] * kBlockBytes, kBlockBytes});
  }
  RETURN_IF_ERROR(TransferOnce(s, TransferOp::kPut, scatter_put));
  RETURN_IF_ERROR(TransferOnce(s, TransferOp::kGet, scatter_get));
  const char* lp = static_cast<const char*>(local.span.address);
  for (int i = 0; i < kScatterBlocks; ++i) {
    if (std::memcmp(lp + local_blocks[i] * kBlockBytes, lp + spare_blocks[i] * kBlockBytes,
                    kBlockBytes) != 0) {
      return absl::DataLossError(
          absl::StrCat("block ", i, " read back after a scatter put differs from what was put"));
    }
  }
  std::printf("info check=ok scattered_blocks=%d block_bytes=%llu\n", kScatterBlocks,
              static_cast<unsigned long long>(kBlockBytes));

  // Per size: one segment per transfer, then a batch, then gets of one segment.
  for (uint64_t size : flags.scatter_only ? std::vector<uint64_t>{} : sizes) {
    RETURN_IF_ERROR(Measure(s, "put_b1", TransferOp::kPut, {{lbase, rbase, size}}).status());
    const uint64_t fit = std::min<uint64_t>(kBatch, s.remote.length / size);
    const uint64_t local_slots = std::max<uint64_t>(1, local.span.length / size);
    std::vector<TransferSegment> batch;
    for (uint64_t i = 0; i < fit; ++i) {
      batch.push_back({lbase + (i % local_slots) * size, rbase + i * size, size});
    }
    RETURN_IF_ERROR(Measure(s, "put_b64", TransferOp::kPut, batch).status());
    if (flags.gets) {
      RETURN_IF_ERROR(Measure(s, "get_b1", TransferOp::kGet, {{lbase, rbase, size}}).status());
    }
  }

  for (absl::string_view count : absl::StrSplit(flags.scatter_blocks, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(count, &n) || n < 1 || n > kScatterBlocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("--scatter_blocks: ", count, " is not a count in 1..", kScatterBlocks));
    }
    const std::vector<TransferSegment> first(scatter_put.begin(), scatter_put.begin() + n);
    RETURN_IF_ERROR(Measure(s, "scatter_put", TransferOp::kPut, first).status());
    RETURN_IF_ERROR(MeasureCold(s, n, rng));
  }
  if (flags.scatter_only) {
    transport->Disconnect(peer);
    RETURN_IF_ERROR(transport->Deregister(local.id));
    target->Stop();
    return absl::OkStatus();
  }
  const uint64_t contig = kBlockBytes * kScatterBlocks;
  RETURN_IF_ERROR(Measure(s, "contig_put", TransferOp::kPut, {{lbase, rbase, contig}}).status());
  if (flags.gets) {
    RETURN_IF_ERROR(Measure(s, "scatter_get", TransferOp::kGet, scatter_get).status());
    RETURN_IF_ERROR(Measure(s, "contig_get", TransferOp::kGet, {{lbase, rbase, contig}}).status());
  }

  transport->Disconnect(peer);
  RETURN_IF_ERROR(transport->Deregister(local.id));
  target->Stop();
  return absl::OkStatus();
}

// --- memcpy ------------------------------------------------------------------------------------

volatile char g_memcpy_sink;

void RunMemcpy(const Flags& flags, const std::vector<uint64_t>& sizes) {
  for (uint64_t size : sizes) {
    std::unique_ptr<char[]> src(new char[size]);
    std::unique_ptr<char[]> dst(new char[size]);
    std::memset(src.get(), 0x5a, size);
    std::memset(dst.get(), 0, size);
    // Calibrate: copies per round for ~min_seconds / 3.
    double t0 = Now();
    int64_t calib = 0;
    do {
      std::memcpy(dst.get(), src.get(), size);
      ++calib;
    } while (Now() - t0 < 0.02);
    const double per_copy = (Now() - t0) / calib;
    const int64_t copies = std::max<int64_t>(1, flags.min_seconds / 3 / per_copy);
    double best = 1e30;
    for (int round = 0; round < 3; ++round) {
      const double start = Now();
      for (int64_t i = 0; i < copies; ++i) {
        src[i % size] = static_cast<char>(i);  // a different copy each time
        std::memcpy(dst.get(), src.get(), size);
      }
      best = std::min(best, Now() - start);
    }
    g_memcpy_sink = dst[size / 2];  // the copies have an observable effect
    const double mb_s = size * copies / best / 1e6;
    std::printf(
        "result kind=memcpy tls=- transport=memcpy case=memcpy segment_bytes=%llu segments=1 "
        "transfers=%lld bytes=%llu seconds=%.6f mb_s=%.2f us_per_transfer=%.3f\n",
        static_cast<unsigned long long>(size), static_cast<long long>(copies),
        static_cast<unsigned long long>(size * copies), best, mb_s, best / copies * 1e6);
    std::fflush(stdout);
    std::fprintf(stderr, "transfer: memcpy %8s: %10.1f MB/s\n", SizeLabel(size).c_str(), mb_s);
  }
}

int Main(int argc, char** argv) {
  Flags flags;
  bool min_seconds_set = false;
  bool rounds_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string v;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    auto value = [&]() -> bool {
      if (eq != std::string::npos) return true;
      if (i + 1 >= argc) return false;
      v = argv[++i];
      return true;
    };
    if (a == "--quick") {
      flags.quick = true;
    } else if (a == "--memcpy_only") {
      flags.memcpy_only = true;
    } else if (a == "--no_gets") {
      flags.gets = false;
    } else if (a == "--scatter_only") {
      flags.scatter_only = true;
    } else if (!value()) {
      return Usage();
    } else if (a == "--role") {
      flags.role = v;
    } else if (a == "--kind") {
      flags.kind = v;
    } else if (a == "--ucx_tls") {
      flags.ucx_tls = v;
    } else if (a == "--sizes") {
      flags.sizes = v;
    } else if (a == "--scatter_blocks") {
      flags.scatter_blocks = v;
    } else if (a == "--min_seconds") {
      if (!absl::SimpleAtod(v, &flags.min_seconds)) return Usage();
      min_seconds_set = true;
    } else if (a == "--rounds") {
      if (!absl::SimpleAtoi(v, &flags.rounds) || flags.rounds < 1) return Usage();
      rounds_set = true;
    } else if (a == "--region_bytes") {
      if (!absl::SimpleAtoi(v, &flags.region_bytes)) return Usage();
    } else if (a == "--seed") {
      if (!absl::SimpleAtoi(v, &flags.seed)) return Usage();
    } else {
      return Usage();
    }
  }
  if (flags.role == "target") return RunTarget(flags);
  if (flags.role != "initiator") return Usage();
  if (flags.quick && !min_seconds_set) flags.min_seconds = 0.1;
  if (flags.quick && !rounds_set) flags.rounds = 1;

  std::vector<uint64_t> sizes;
  for (absl::string_view s : absl::StrSplit(flags.sizes, ',', absl::SkipEmpty())) {
    const uint64_t bytes = ParseSize(s);
    if (bytes == 0) return Usage();
    sizes.push_back(bytes);
  }
  if (sizes.empty()) return Usage();

  signal(SIGPIPE, SIG_IGN);  // a target that died is reported, not a reason to die
  if (flags.memcpy_only) {
    RunMemcpy(flags, sizes);
    return 0;
  }
  const absl::Status status = RunTransport(flags, sizes);
  if (!status.ok()) {
    std::printf("error kind=%s tls=%s message=%s\n", flags.kind.c_str(),
                flags.ucx_tls.empty() ? "-" : flags.ucx_tls.c_str(),
                std::string(absl::CEscape(status.ToString())).c_str());
    std::fprintf(stderr, "transfer: %s %s: %s\n", flags.kind.c_str(), flags.ucx_tls.c_str(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) { return ferry::bench::Main(argc, argv); }
