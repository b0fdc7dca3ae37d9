// ferry bench kvstore: the KV store library (kvstore/kv_store.h) and its gRPC service
// (kvstore/service/kv_service.h, through the sharding client kvstore/client/kv_client.h) against
// fio on the same directory, for 256 KiB, 1 MiB and 4 MiB objects, N concurrent clients.
//
// Per object size, in a fresh store directory:
//   1. library puts: N threads, each KvStore::Put of one item per call (distinct keys, values cut
//      from random bytes generated before timing), total bytes_per_size;
//   2. service puts: the same through the service on loopback: an in-process GrpcServer with a
//      KvStoreService over a fresh store of the same options (its own directory), N threads each
//      with its own KvClient (one node, replication 1), KvClient::Put of one object per call;
//   3. fio sequential writes of the same total size, block size, concurrency and I/O mode
//      (--numjobs=N --iodepth=1 --ioengine=psync --direct=1), to fresh files in the library's
//      directory: once without any sync and once with --fdatasync=1;
//   4. fio random reads (--rw=randread) over the files of the --fdatasync=1 run, a file set of
//      the same total size as what the library stored;
//   5. library gets: N threads, each KvStore::Get of one random stored key per call, as many
//      gets as objects stored (the same bytes as fio reads);
//   6. service gets: the same through the clients, KvClient::Get of one key per call.
// Steps 1-3 run --reps times (default 3; each round in fresh stores and fresh fio files), then
// steps 4-6 as many times on the last round's data; rounds rotate which of library, service and
// fio goes first, so that all meet the same phases of a shared (virtual) disk, and each figure is
// the best round's (as in timing.h: noise only ever subtracts). Throughput is bytes over the wall
// time of all N clients (fio: bytes over the longest job's runtime); latency is per call (fio:
// completion latency per I/O), of the best round. CPU is the whole process's (user + system over
// wall time), so the service's rows count the client threads, gRPC's threads on both sides and
// the store's.
//
// Fairness of the write baseline. The library acknowledges a put only after an fdatasync that
// covers it: puts queued while the previous group was being written share one write and one
// fdatasync (group commit, one writer thread). fio --fdatasync=1 gives the same guarantee per
// client (each job's write is followed by an fdatasync before its next write), each job flushing
// on its own; that is the figure the write ratio is taken against, since it is what a client
// gets from the device with every acknowledged write durable. fio without a sync is printed too:
// the device's bandwidth with nothing durable (O_DIRECT data may still sit in a volatile write
// cache), an upper bound no durable store reaches. fio writes with --fallocate=none into fresh
// files, as the library appends to fresh segments without preallocating.
//
// When the store fell back to buffered I/O (StoreStats::direct_io false: a filesystem without
// O_DIRECT such as tmpfs), fio runs with --direct=1 and also with --direct=0, and the ratios are
// taken against --direct=0, the library's I/O mode.
//
// Prints a table, then one JSON line.

#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/common/hash128.h"
#include "kvstore/client/kv_client.h"
#include "kvstore/kv_store.h"
#include "kvstore/service/kv_service.h"
#include "nlohmann/json.hpp"
#include "services/common/allocator_tuning.h"
#include "services/common/grpc_server.h"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // the output keeps its key order

struct Flags {
  std::string dir;  // an empty directory of the filesystem to measure (the wrapper makes one)
  std::string fio = "fio";
  int jobs = 4;
  int64_t mib_per_size = 1024;
  int reps = 3;  // rounds of every measurement; the best counts
  std::string sizes = "256k,1m,4m";
  std::string open_json;  // kvstore_open_bench's result, when the wrapper ran it
};

struct Size {
  int64_t bytes;
  const char* label;  // table
  const char* key;    // JSON
};
constexpr Size kSizes[] = {
    {int64_t{256} << 10, "256 KiB", "256k"},
    {int64_t{1} << 20, "1 MiB", "1m"},
    {int64_t{4} << 20, "4 MiB", "4m"},
};

// One timed phase of N clients.
struct Phase {
  double seconds = 0;
  int64_t bytes = 0;
  double p50_ms = 0, p99_ms = 0;
  double cpu_cores = 0;  // process CPU time (user + system) over wall time
  double mb_s() const { return seconds > 0 ? bytes / seconds / 1e6 : 0; }
};

struct FioRun {
  std::string command;
  bool ok = false;
  std::string error;
  double mb_s = 0;
  double p50_ms = 0, p99_ms = 0;            // completion latency of one read or write
  double sync_p50_ms = 0, sync_p99_ms = 0;  // fdatasync latency (--fdatasync=1 only)
  double cpu_cores = 0;                     // fio's usr + sys over its runtime, in cores
};

struct FioSet {
  int direct = 1;
  FioRun write, write_sync, read;
};

struct SizeResult {
  Size size;
  int64_t objects = 0;
  Phase put, get;          // the library
  Phase svc_put, svc_get;  // the service
  kv::StoreStats stats;    // the last round's store, after the gets
  int64_t puts = 0, group_commits = 0, evicted = 0, compactions = 0;  // all rounds' puts
  int64_t svc_puts = 0, svc_group_commits = 0;  // the service's stores, all rounds
  std::vector<FioSet> fio;  // direct=1; and direct=0 when the store fell back to buffered I/O
  const FioSet& baseline() const { return fio.back(); }
};

double CpuSeconds() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

double PercentileMs(std::vector<double>& seconds, double p) {
  if (seconds.empty()) return 0;
  std::sort(seconds.begin(), seconds.end());
  const size_t i =
      std::min(seconds.size() - 1, static_cast<size_t>(std::ceil(p / 100.0 * seconds.size())) - 1);
  return seconds[i] * 1e3;
}

// Runs op(thread, i) for i in [0, per_thread) on each of `jobs` threads, timing every call.
// op returns the bytes it moved, or -1 on failure (the phase then fails).
template <typename Op>
std::optional<Phase> RunClients(int jobs, int64_t per_thread, Op op) {
  std::vector<std::vector<double>> latencies(jobs);
  std::vector<int64_t> bytes(jobs, 0);
  std::atomic<bool> failed{false};
  const double cpu0 = CpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < jobs; ++t) {
    threads.emplace_back([&, t] {
      latencies[t].reserve(per_thread);
      for (int64_t i = 0; i < per_thread && !failed.load(std::memory_order_relaxed); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t n = op(t, i);
        const auto t1 = std::chrono::steady_clock::now();
        if (n < 0) {
          failed = true;
          return;
        }
        bytes[t] += n;
        latencies[t].push_back(std::chrono::duration<double>(t1 - t0).count());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failed) return std::nullopt;
  Phase phase;
  phase.seconds = seconds;
  phase.cpu_cores = (CpuSeconds() - cpu0) / seconds;
  std::vector<double> all;
  for (int t = 0; t < jobs; ++t) {
    phase.bytes += bytes[t];
    all.insert(all.end(), latencies[t].begin(), latencies[t].end());
  }
  phase.p50_ms = PercentileMs(all, 50);
  phase.p99_ms = PercentileMs(all, 99);
  return phase;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// fio's percentile `p` of the latency `kind` (clat_ns, lat_ns) of `io` in milliseconds; 0 when
// absent.
double FioPercentileMs(const Json& io, const char* kind, const char* p) {
  const Json none;
  const Json& lat = io.contains(kind) ? io.at(kind) : none;
  if (!lat.contains("percentile") || !lat.at("percentile").contains(p)) return 0;
  return lat.at("percentile").at(p).get<double>() / 1e6;
}

// Runs fio with `args` (the same file names every time: --name=kvbench_fio in `dir`) and reads
// its JSON report (one group: --group_reporting).
FioRun RunFio(const Flags& flags, const std::vector<std::string>& args, bool read) {
  FioRun run;
  run.command = absl::StrCat(flags.fio, " ", absl::StrJoin(args, " "));
  std::string shell = ShellQuote(flags.fio);
  for (const std::string& a : args) absl::StrAppend(&shell, " ", ShellQuote(a));
  FILE* pipe = popen(shell.c_str(), "r");
  if (pipe == nullptr) {
    run.error = absl::StrCat("popen: ", std::strerror(errno));
    return run;
  }
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int rc = pclose(pipe);
  // fio may print notes before the report.
  const size_t brace = out.find('{');
  if (rc != 0 || brace == std::string::npos) {
    run.error = WIFEXITED(rc) ? absl::StrCat("fio exited with status ", WEXITSTATUS(rc))
                              : absl::StrCat("fio ended abnormally (wait status ", rc, ")");
    return run;
  }
  const Json report = Json::parse(out.substr(brace), nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.contains("jobs") || report.at("jobs").empty()) {
    run.error = "fio printed no JSON report";
    return run;
  }
  const Json& job = report.at("jobs").at(0);
  const char* dir = read ? "read" : "write";
  if (job.value("error", 0) != 0 || !job.contains(dir)) {
    run.error = absl::StrCat("fio job error ", job.value("error", 0));
    return run;
  }
  const Json& io = job.at(dir);
  run.mb_s = io.value("bw_bytes", 0.0) / 1e6;
  run.p50_ms = FioPercentileMs(io, "clat_ns", "50.000000");
  run.p99_ms = FioPercentileMs(io, "clat_ns", "99.000000");
  if (job.contains("sync")) {
    run.sync_p50_ms = FioPercentileMs(job.at("sync"), "lat_ns", "50.000000");
    run.sync_p99_ms = FioPercentileMs(job.at("sync"), "lat_ns", "99.000000");
  }
  // With --group_reporting, usr_cpu and sys_cpu are per job (CPU time over the jobs' summed
  // runtime): times the summed runtime over the group's (the longest job's) gives cores busy.
  const double runtime_ms = io.value("runtime", 0.0);
  run.cpu_cores = (job.value("usr_cpu", 0.0) + job.value("sys_cpu", 0.0)) / 100.0 *
                  (runtime_ms > 0 ? job.value("job_runtime", 0.0) / runtime_ms : flags.jobs);
  run.ok = io.value("io_bytes", int64_t{0}) > 0;
  if (!run.ok) run.error = "fio moved no bytes";
  return run;
}

void RemoveFioFiles(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind("kvbench_fio.", 0) == 0) fs::remove(e.path(), ec);
  }
}

// fio's arguments for one run in `dir` (the same file names every time).
std::vector<std::string> FioArgs(const Flags& flags, const std::string& dir, int64_t block,
                                 int64_t per_job_bytes, int direct,
                                 const std::vector<std::string>& mode) {
  std::vector<std::string> args = {"--name=kvbench_fio"};
  args.insert(args.end(), mode.begin(), mode.end());
  const std::vector<std::string> common = {
      absl::StrCat("--directory=", dir),
      absl::StrCat("--bs=", block),
      absl::StrCat("--size=", per_job_bytes),
      absl::StrCat("--numjobs=", flags.jobs),
      "--iodepth=1",
      "--ioengine=psync",
      absl::StrCat("--direct=", direct),
      "--group_reporting",
      "--output-format=json",
  };
  args.insert(args.end(), common.begin(), common.end());
  return args;
}

// Keeps the faster of two runs of the same thing (a failed run never wins); returns the run's
// figure for the progress lines ("failed" when it failed).
std::string KeepBest(FioRun& best, FioRun run) {
  const std::string note = run.ok ? absl::StrFormat("%.0f", run.mb_s) : "failed";
  if (!best.ok && !run.ok && best.command.empty()) best = std::move(run);
  if (run.ok && (!best.ok || run.mb_s > best.mb_s)) best = std::move(run);
  return note;
}
std::string KeepBest(std::optional<Phase>& best, const Phase& run) {
  if (!best || run.mb_s() > best->mb_s()) best = run;
  return absl::StrFormat("%.0f", run.mb_s());
}

// The service measured: a KvStoreService over its own store, behind an in-process gRPC server on
// loopback, as ferry-kvstore runs it (the default KvServiceOptions and their message bound).
struct ServiceNode {
  std::string dir;
  std::unique_ptr<kv::KvStore> store;
  std::unique_ptr<kv::KvStoreService> service;
  std::unique_ptr<GrpcServer> server;

  static std::unique_ptr<ServiceNode> Start(const std::string& dir,
                                            const kv::StoreOptions& options) {
    auto node = std::make_unique<ServiceNode>();
    node->dir = dir;
    auto opened = kv::KvStore::Open(dir, options);
    if (!opened.ok()) {
      std::fprintf(stderr, "kvstore: opening %s: %s\n", dir.c_str(),
                   opened.status().ToString().c_str());
      return nullptr;
    }
    node->store = std::move(*opened);
    kv::KvServiceOptions service_options;
    service_options.capacity_bytes = options.capacity_bytes;
    node->service = std::make_unique<kv::KvStoreService>(node->store.get(), service_options);
    GrpcServerOptions grpc_options;
    grpc_options.address = "127.0.0.1:0";
    grpc_options.max_receive_message_bytes = kv::MaxMessageBytes(service_options);
    grpc_options.max_send_message_bytes = kv::MaxMessageBytes(service_options);
    auto server = GrpcServer::Start(grpc_options, {node->service.get()});
    if (!server.ok()) {
      std::fprintf(stderr, "kvstore: starting the service: %s\n",
                   server.status().ToString().c_str());
      return nullptr;
    }
    node->server = std::move(*server);
    return node;
  }

  ~ServiceNode() {
    server.reset();  // every call has returned
    service.reset();
    store.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// One KvClient per client thread (each its own channel, so its own connection), connected before
// timing: a first RPC pays the connection setup.
std::vector<std::unique_ptr<kv::KvClient>> ServiceClients(const Flags& flags,
                                                          const std::string& address) {
  kv::ClientOptions options;
  options.nodes = {address};
  options.replication = 1;
  options.deadline = absl::Seconds(30);
  // Values travel in chunks of at most 1 MiB (the client's default; objects up to 1 MiB go in one
  // message), the faster choice: at 4 MiB objects (4 clients, 2 cores, best of 3, two runs each)
  // 1 MiB chunks put 372-377 MB/s and got 414-448 MB/s, whole-object 4 MiB chunks 283-315 and
  // 249-290 (smaller messages pipeline: one is serialized or parsed while another is in flight).
  options.max_chunk_bytes = int64_t{1} << 20;
  std::vector<std::unique_ptr<kv::KvClient>> clients;
  for (int t = 0; t < flags.jobs; ++t) {
    auto client = kv::KvClient::Create(options);
    if (!client.ok()) {
      std::fprintf(stderr, "kvstore: kv client: %s\n", client.status().ToString().c_str());
      return {};
    }
    (*client)->Exists({Hash128{}}, Hash128{});
    if (!(*client)->nodes()[0].up) {
      std::fprintf(stderr, "kvstore: the service at %s does not answer\n", address.c_str());
      return {};
    }
    clients.push_back(std::move(*client));
  }
  return clients;
}

// Runs the steps in a rotating order: round r starts with steps[r % n]. Stops at the first that
// fails.
bool RunRotated(int round, const std::vector<std::function<bool()>>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[(round + i) % steps.size()]()) return false;
  }
  return true;
}

std::optional<SizeResult> RunSize(const Flags& flags, const Size& size, const std::string& random,
                                  bool* direct_io) {
  SizeResult r;
  r.size = size;
  const int64_t per_thread =
      std::max<int64_t>(1, (flags.mib_per_size << 20) / size.bytes / flags.jobs);
  r.objects = per_thread * flags.jobs;
  const int64_t per_job_bytes = per_thread * size.bytes;

  kv::StoreOptions options;
  options.segment_bytes = int64_t{256} << 20;
  // Room for everything written, several times over: nothing is evicted or compacted.
  options.capacity_bytes = std::max<int64_t>(int64_t{64} << 30, 8 * r.objects * size.bytes);
  kv::ObjectMeta meta;
  meta.fingerprint = Xxh3Hash128("kvbench model");
  meta.layout_tag = 1;
  meta.token_count = 64;
  // Values: windows of the random bytes at 4 KiB steps, so objects differ.
  const int64_t windows = (static_cast<int64_t>(random.size()) - size.bytes) / 4096 + 1;
  auto value = [&](int64_t i) {
    return absl::string_view(random.data() + (i * 7919 % windows) * 4096, size.bytes);
  };
  std::vector<Hash128> keys(r.objects);
  for (int64_t i = 0; i < r.objects; ++i) {
    keys[i] = Xxh3Hash128(absl::StrCat("kvbench ", size.key, " ", i));
  }

  // Writes: each round into a fresh store, a fresh service store and fresh fio files; the last
  // round's are read. Rounds rotate which of the three goes first.
  std::unique_ptr<kv::KvStore> store;
  std::unique_ptr<ServiceNode> node;
  std::string dir;
  std::optional<Phase> best_put, best_get, best_svc_put, best_svc_get;
  std::vector<int> modes = {1};
  for (int rep = 0; rep < flags.reps; ++rep) {
    if (store != nullptr) {
      store.reset();
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
    node.reset();
    dir = absl::StrCat(flags.dir, "/kv-", size.key, "-", rep);
    auto opened = kv::KvStore::Open(dir, options);
    if (!opened.ok()) {
      std::fprintf(stderr, "kvstore: opening %s: %s\n", dir.c_str(),
                   opened.status().ToString().c_str());
      return std::nullopt;
    }
    store = std::move(*opened);
    *direct_io = store->Stats().direct_io;
    if (!*direct_io) modes = {1, 0};
    r.fio.resize(modes.size());

    std::string lib_note, svc_note, fio_note;
    auto library_puts = [&]() -> bool {
      std::atomic<bool> put_error{false};
      auto put = RunClients(flags.jobs, per_thread, [&](int t, int64_t i) -> int64_t {
        const int64_t k = t * per_thread + i;
        const kv::PutItem item{keys[k], meta, value(k)};
        const absl::Status s = store->Put({item});
        if (!s.ok()) {
          if (!put_error.exchange(true)) {
            std::fprintf(stderr, "kvstore: put failed: %s\n", s.ToString().c_str());
          }
          return -1;
        }
        return size.bytes;
      });
      if (!put) return false;
      lib_note = absl::StrCat(" library put ", KeepBest(best_put, *put), " MB/s;");
      const kv::StoreStats stats = store->Stats();
      r.puts += stats.puts;
      r.group_commits += stats.group_commits;
      r.evicted += stats.evicted;
      r.compactions += stats.compactions;
      return true;
    };
    auto service_puts = [&]() -> bool {
      node = ServiceNode::Start(absl::StrCat(flags.dir, "/svc-", size.key, "-", rep), options);
      if (node == nullptr) return false;
      const auto clients = ServiceClients(flags, node->server->address());
      if (clients.empty()) return false;
      std::atomic<bool> put_error{false};
      auto put = RunClients(flags.jobs, per_thread, [&](int t, int64_t i) -> int64_t {
        const int64_t k = t * per_thread + i;
        const kv::ClientObject object{keys[k], meta, value(k)};
        if (clients[t]->Put({object}) != 1) {
          if (!put_error.exchange(true)) {
            std::fprintf(stderr, "kvstore: a service put was not stored\n");
          }
          return -1;
        }
        return size.bytes;
      });
      if (!put) return false;
      svc_note = absl::StrCat(" service put ", KeepBest(best_svc_put, *put), " MB/s;");
      const kv::StoreStats stats = node->store->Stats();
      r.svc_puts += stats.puts;
      r.svc_group_commits += stats.group_commits;
      return true;
    };
    auto fio_writes = [&]() -> bool {
      for (size_t m = 0; m < modes.size(); ++m) {
        FioSet& set = r.fio[m];
        set.direct = modes[m];
        // Fresh files each time, as the library writes fresh segments; the files of the durable
        // run stay for the reads.
        RemoveFioFiles(dir);
        const std::string plain =
            KeepBest(set.write, RunFio(flags,
                                       FioArgs(flags, dir, size.bytes, per_job_bytes, modes[m],
                                               {"--rw=write", "--fallocate=none"}),
                                       false));
        RemoveFioFiles(dir);
        const std::string durable = KeepBest(
            set.write_sync, RunFio(flags,
                                   FioArgs(flags, dir, size.bytes, per_job_bytes, modes[m],
                                           {"--rw=write", "--fallocate=none", "--fdatasync=1"}),
                                   false));
        absl::StrAppend(&fio_note, " fio direct=", modes[m], " write --fdatasync=1 ", durable,
                        " MB/s, no sync ", plain, " MB/s;");
      }
      return true;
    };
    if (!RunRotated(rep, {library_puts, service_puts, fio_writes})) return std::nullopt;
    std::fprintf(stderr, "kvstore: %s, round %d of %d:%s%s%s\n", size.label, rep + 1, flags.reps,
                 lib_note.c_str(), svc_note.c_str(), fio_note.c_str());
  }

  // Reads: the last store and service store, and the files of fio's last durable write run (the
  // same total size; fio lays them out itself if that run failed).
  std::vector<std::mt19937_64> rngs, svc_rngs;
  for (int t = 0; t < flags.jobs; ++t) {
    rngs.emplace_back(1000 + t);
    svc_rngs.emplace_back(2000 + t);
  }
  const auto clients = ServiceClients(flags, node->server->address());
  if (clients.empty()) return std::nullopt;
  for (int rep = 0; rep < flags.reps; ++rep) {
    std::string lib_note, svc_note, fio_note;
    auto library_gets = [&]() -> bool {
      auto get = RunClients(flags.jobs, per_thread, [&](int t, int64_t) -> int64_t {
        const Hash128& key = keys[rngs[t]() % r.objects];
        std::vector<kv::GetResult> got = store->Get({key}, meta.fingerprint);
        if (!got[0].found || static_cast<int64_t>(got[0].value.size()) != size.bytes) return -1;
        return size.bytes;
      });
      if (!get) {
        std::fprintf(stderr, "kvstore: %s: a get missed an object the bench stored\n", size.label);
        return false;
      }
      lib_note = absl::StrCat(" library get ", KeepBest(best_get, *get), " MB/s;");
      return true;
    };
    auto service_gets = [&]() -> bool {
      auto get = RunClients(flags.jobs, per_thread, [&](int t, int64_t) -> int64_t {
        const Hash128& key = keys[svc_rngs[t]() % r.objects];
        std::vector<kv::ClientGetResult> got = clients[t]->Get({key}, meta.fingerprint);
        if (!got[0].found || static_cast<int64_t>(got[0].value.size()) != size.bytes) return -1;
        return size.bytes;
      });
      if (!get) {
        std::fprintf(stderr, "kvstore: %s: a service get missed an object the bench stored\n",
                     size.label);
        return false;
      }
      svc_note = absl::StrCat(" service get ", KeepBest(best_svc_get, *get), " MB/s;");
      return true;
    };
    auto fio_reads = [&]() -> bool {
      for (size_t m = 0; m < modes.size(); ++m) {
        const FioRun run = RunFio(
            flags, FioArgs(flags, dir, size.bytes, per_job_bytes, modes[m], {"--rw=randread"}),
            true);
        absl::StrAppend(&fio_note, " fio direct=", modes[m], " randread ",
                        KeepBest(r.fio[m].read, run), " MB/s;");
      }
      return true;
    };
    if (!RunRotated(rep, {library_gets, service_gets, fio_reads})) return std::nullopt;
    std::fprintf(stderr, "kvstore: %s, round %d of %d:%s%s%s\n", size.label, rep + 1, flags.reps,
                 lib_note.c_str(), svc_note.c_str(), fio_note.c_str());
  }
  r.put = *best_put;
  r.get = *best_get;
  r.svc_put = *best_svc_put;
  r.svc_get = *best_svc_get;
  r.stats = store->Stats();
  store.reset();
  node.reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

std::string Cell(const FioRun& f, double v, const char* fmt) {
  if (!f.ok) return "failed";
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

double Round(double v, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

OrderedJson RatioOrNull(double lib, const FioRun& f) {
  if (!f.ok || f.mb_s <= 0) return nullptr;
  return Round(lib / f.mb_s, 3);
}

int Usage() {
  std::fprintf(stderr,
               "usage: kvstore_bench_bin --dir DIR [--jobs N] [--mib-per-size M] [--reps R] "
               "[--sizes 256k,1m,4m] [--fio PATH] [--open-json FILE]\n");
  return 2;
}

int Main(int argc, char** argv) {
  // As ferry-kvstore does (the service runs in this process).
  TuneAllocatorForLargeBuffers();
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return Usage();
    const std::string v = argv[++i];
    if (a == "--dir") {
      flags.dir = v;
    } else if (a == "--jobs") {
      flags.jobs = std::atoi(v.c_str());
    } else if (a == "--mib-per-size") {
      flags.mib_per_size = std::atoll(v.c_str());
    } else if (a == "--reps") {
      flags.reps = std::atoi(v.c_str());
    } else if (a == "--sizes") {
      flags.sizes = v;
    } else if (a == "--fio") {
      flags.fio = v;
    } else if (a == "--open-json") {
      flags.open_json = v;
    } else {
      return Usage();
    }
  }
  if (flags.dir.empty() || flags.jobs < 1 || flags.mib_per_size < 4 || flags.reps < 1) {
    return Usage();
  }

  // Random bytes, made once, untimed: every value is a window of them.
  std::string random((int64_t{64} << 20) + (int64_t{4} << 20), '\0');
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= random.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(random.data() + i, &x, 8);
  }

  std::vector<SizeResult> results;
  bool direct_io = true;
  for (const Size& size : kSizes) {
    if (!absl::StrContains(absl::StrCat(",", flags.sizes, ","), absl::StrCat(",", size.key, ","))) {
      continue;
    }
    bool d = true;
    std::optional<SizeResult> r = RunSize(flags, size, random, &d);
    if (!r) return 1;
    direct_io = direct_io && d;
    results.push_back(std::move(*r));
  }

  if (results.empty()) return Usage();  // --sizes named none of them

  // The table.
  std::printf(
      "kvstore: KvStore (kvstore/kv_store.h) and its gRPC service on loopback vs fio %s, in %s\n",
      direct_io ? "(direct I/O)" : "(store fell back to BUFFERED I/O)", flags.dir.c_str());
  std::printf(
      "  %d clients; per size: %lld MiB put (one item per Put), as many Gets of random "
      "stored keys (one key per Get); best of %d rounds\n",
      flags.jobs, static_cast<long long>(flags.mib_per_size), flags.reps);
  if (!direct_io) {
    std::printf(
        "  NOTE: the filesystem refused O_DIRECT: the store uses buffered I/O; fio ran with "
        "--direct=1 and --direct=0, ratios against --direct=0\n");
  }
  std::printf("  %-8s %-34s %9s %9s %9s %6s %7s\n", "size", "", "MB/s", "p50 ms", "p99 ms", "CPU",
              "ratio");
  for (const SizeResult& r : results) {
    const FioSet& base = r.baseline();
    auto lib_row = [&](const char* name, const Phase& p, const FioRun& f) {
      const std::string ratio = f.ok ? absl::StrFormat("%.2f", p.mb_s() / f.mb_s) : "-";
      std::printf("  %-8s %-34s %9.1f %9.2f %9.2f %6.2f %7s\n", r.size.label, name, p.mb_s(),
                  p.p50_ms, p.p99_ms, p.cpu_cores, ratio.c_str());
    };
    auto fio_row = [&](const std::string& name, const FioRun& f) {
      std::printf("  %-8s %-34s %9s %9s %9s %6s\n", r.size.label, name.c_str(),
                  Cell(f, f.mb_s, "%.1f").c_str(), Cell(f, f.p50_ms, "%.2f").c_str(),
                  Cell(f, f.p99_ms, "%.2f").c_str(), Cell(f, f.cpu_cores, "%.2f").c_str());
      if (f.ok && f.sync_p50_ms > 0) {
        std::printf("  %-8s %-34s %9s %9.2f %9.2f\n", "", "  (its fdatasync per write)", "",
                    f.sync_p50_ms, f.sync_p99_ms);
      }
    };
    lib_row("library Put", r.put, base.write_sync);
    lib_row("service Put", r.svc_put, base.write_sync);
    for (const FioSet& s : r.fio) {
      const std::string io = absl::StrCat(" direct=", s.direct);
      fio_row(absl::StrCat("fio write, fdatasync=1", io), s.write_sync);
      fio_row(absl::StrCat("fio write, no sync", io), s.write);
    }
    lib_row("library Get", r.get, base.read);
    lib_row("service Get", r.svc_get, base.read);
    for (const FioSet& s : r.fio) {
      fio_row(absl::StrCat("fio randread", " direct=", s.direct), s.read);
    }
    std::printf(
        "  %-8s library: %lld group commits for %lld puts (%.1f puts per fdatasync), "
        "%lld segments, %lld evicted, %lld compactions\n",
        "", static_cast<long long>(r.group_commits), static_cast<long long>(r.puts),
        r.group_commits > 0 ? double(r.puts) / r.group_commits : 0.0,
        static_cast<long long>(r.stats.segments), static_cast<long long>(r.evicted),
        static_cast<long long>(r.compactions));
    std::printf("  %-8s service: %lld group commits for %lld puts (%.1f puts per fdatasync)\n", "",
                static_cast<long long>(r.svc_group_commits), static_cast<long long>(r.svc_puts),
                r.svc_group_commits > 0 ? double(r.svc_puts) / r.svc_group_commits : 0.0);
  }
  std::printf(
      "  (ratio: library or service MB/s over fio's with the same durability and I/O mode: Put "
      "vs fio write --fdatasync=1, Get vs fio randread;\n"
      "   service: KvClient -> gRPC on 127.0.0.1 -> KvStoreService -> its own store, in this "
      "process, one object per call;\n"
      "   fio latency is per read/write call (clat), the fdatasync after each write shown "
      "below it; CPU: cores busy, process-wide for the library and the service (clients, gRPC "
      "and store threads))\n");
  std::printf("  fio commands (1 MiB):\n");
  for (const SizeResult& r : results) {
    if (r.size.bytes != (int64_t{1} << 20)) continue;
    for (const FioSet& s : r.fio) {
      for (const FioRun* f : {&s.write, &s.write_sync, &s.read}) {
        std::printf("    %s%s\n", f->command.c_str(),
                    f->ok ? "" : absl::StrCat("   [", f->error, "]").c_str());
      }
    }
  }

  // The goal is at 1 MiB (null figures when --sizes left it out).
  const SizeResult* one = nullptr;
  for (const SizeResult& r : results) {
    if (r.size.bytes == int64_t{1} << 20) one = &r;
  }
  const OrderedJson read_ratio =
      one == nullptr ? OrderedJson() : RatioOrNull(one->get.mb_s(), one->baseline().read);
  const OrderedJson write_ratio =
      one == nullptr ? OrderedJson() : RatioOrNull(one->put.mb_s(), one->baseline().write_sync);
  const OrderedJson svc_read_ratio =
      one == nullptr ? OrderedJson() : RatioOrNull(one->svc_get.mb_s(), one->baseline().read);
  const bool goal = read_ratio.is_number() && write_ratio.is_number() &&
                    svc_read_ratio.is_number() && read_ratio.get<double>() >= 0.8 &&
                    write_ratio.get<double>() >= 0.7 && svc_read_ratio.get<double>() >= 0.5;
  std::printf(
      "  goal at 1 MiB: library read >= 0.8x fio (%s), write >= 0.7x fio (%s); service read >= "
      "0.5x fio (%s): %s\n",
      read_ratio.dump().c_str(), write_ratio.dump().c_str(), svc_read_ratio.dump().c_str(),
      goal ? "met" : "NOT met");

  // Opening: read from kvstore_open_bench's result.
  OrderedJson open_per_million;
  if (!flags.open_json.empty()) {
    std::ifstream in(flags.open_json);
    const Json o = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (o.is_object() && o.contains("open_seconds_per_million")) {
      open_per_million = Round(o["open_seconds_per_million"].get<double>(), 3);
      std::printf(
          "  opening: %.3f s per million objects (best of 3 opens of %lld objects in %lld "
          "sealed 256 MiB segments: footers read, records never)\n",
          o["open_seconds_per_million"].get<double>(), o["objects"].get<long long>(),
          o["segments"].get<long long>());
    }
  }

  OrderedJson j;
  j["bench"] = "kvstore";
  j["lib_read_vs_fio_1m"] = read_ratio;
  j["lib_write_vs_fio_1m"] = write_ratio;
  j["lib_get_p99_ms_1m"] = one == nullptr ? OrderedJson() : OrderedJson(Round(one->get.p99_ms, 3));
  j["svc_read_vs_fio_1m"] = svc_read_ratio;
  j["svc_get_p99_ms_1m"] =
      one == nullptr ? OrderedJson() : OrderedJson(Round(one->svc_get.p99_ms, 3));
  j["goal_met"] = goal;
  j["open_seconds_per_million"] = open_per_million;
  j["direct_io"] = direct_io;
  j["jobs"] = flags.jobs;
  j["bytes_per_size"] = flags.mib_per_size << 20;
  j["reps"] = flags.reps;
  for (const SizeResult& r : results) {
    const std::string k = r.size.key;
    const FioSet& base = r.baseline();
    j["lib_put_mb_s_" + k] = Round(r.put.mb_s(), 1);
    j["lib_put_p50_ms_" + k] = Round(r.put.p50_ms, 3);
    j["lib_put_p99_ms_" + k] = Round(r.put.p99_ms, 3);
    j["lib_get_mb_s_" + k] = Round(r.get.mb_s(), 1);
    j["lib_get_p50_ms_" + k] = Round(r.get.p50_ms, 3);
    j["lib_get_p99_ms_" + k] = Round(r.get.p99_ms, 3);
    j["lib_puts_per_group_commit_" + k] =
        Round(r.group_commits > 0 ? double(r.puts) / r.group_commits : 0, 2);
    j["svc_put_mb_s_" + k] = Round(r.svc_put.mb_s(), 1);
    j["svc_put_p50_ms_" + k] = Round(r.svc_put.p50_ms, 3);
    j["svc_put_p99_ms_" + k] = Round(r.svc_put.p99_ms, 3);
    j["svc_get_mb_s_" + k] = Round(r.svc_get.mb_s(), 1);
    j["svc_get_p50_ms_" + k] = Round(r.svc_get.p50_ms, 3);
    j["svc_get_p99_ms_" + k] = Round(r.svc_get.p99_ms, 3);
    auto fio = [&](const FioRun& f, double v) -> OrderedJson {
      if (!f.ok) return nullptr;
      return Round(v, 3);
    };
    j["fio_write_sync_mb_s_" + k] = fio(base.write_sync, base.write_sync.mb_s);
    j["fio_write_mb_s_" + k] = fio(base.write, base.write.mb_s);
    j["fio_write_sync_p50_ms_" + k] = fio(base.write_sync, base.write_sync.p50_ms);
    j["fio_write_sync_p99_ms_" + k] = fio(base.write_sync, base.write_sync.p99_ms);
    j["fio_fdatasync_p50_ms_" + k] = fio(base.write_sync, base.write_sync.sync_p50_ms);
    j["fio_fdatasync_p99_ms_" + k] = fio(base.write_sync, base.write_sync.sync_p99_ms);
    j["fio_read_mb_s_" + k] = fio(base.read, base.read.mb_s);
    j["fio_read_p50_ms_" + k] = fio(base.read, base.read.p50_ms);
    j["fio_read_p99_ms_" + k] = fio(base.read, base.read.p99_ms);
    if (k != "1m") {
      j["lib_read_vs_fio_" + k] = RatioOrNull(r.get.mb_s(), base.read);
      j["lib_write_vs_fio_" + k] = RatioOrNull(r.put.mb_s(), base.write_sync);
      j["svc_read_vs_fio_" + k] = RatioOrNull(r.svc_get.mb_s(), base.read);
    }
    j["svc_write_vs_fio_" + k] = RatioOrNull(r.svc_put.mb_s(), base.write_sync);
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) { return ferry::bench::Main(argc, argv); }
