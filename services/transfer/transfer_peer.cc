// The other process of the KV transport's multi-process test (kv_transport_process_test.cc): it
// hosts one KvTransport (--kind ucx|grpc, --ucx_tls tcp|shm|...) and is driven by the test over
// a line protocol on stdin/stdout, so the test can kill it at any point of a transfer.
//
// Protocol. The peer reads one command per line and answers each with exactly one line, in
// order: "ok[ VALUES]" or "error CODE MESSAGE", CODE being an absl::StatusCode name
// ("UNAVAILABLE"). Nothing else goes to stdout: the peer keeps stdout for its replies and points
// file descriptor 1 at stderr, where logs (its own, UCX's) go. At start, before any
// command, it prints "ok ready KIND" once the transport is up, or "error CODE MESSAGE" and exits
// with status 2 (UNIMPLEMENTED: the transport is not built; UNAVAILABLE: UCX finds no usable
// transport among --ucx_tls). End of input acts as "quit".
//
//   alloc BYTES                  -> ok REGION
//       KvTransport::Allocate (zeroed).
//   fill REGION SEED             -> ok
//   zero REGION                  -> ok
//       The whole region := FillPattern(SEED) (transfer_test_pattern.h), or zeros.
//   descriptor REGION...         -> ok BASE64
//       A serialized ferry.v1.TransferDescriptor: this transport's kind and address, and the
//       regions in the order given.
//   connect BASE64               -> ok PEER TRANSPORT
//       Connect to the descriptor's address; its regions are that peer's remote regions 0, 1, ...
//       below. TRANSPORT: PeerTransport(PEER), "-" if empty.
//   post TAG OP PEER REGION RINDEX DEADLINE_MS ID SEGMENTS   -> ok
//       Post an OP (put|get) between local REGION and PEER's remote region RINDEX, with transfer
//       id ID ("-": none). SEGMENTS: "LOFF:ROFF:LEN,..." with offsets from the regions' starts.
//       The outcome goes to TAG.
//   flood TAG OP PEER REGION RINDEX DEADLINE_MS COUNT ID SEGMENTS   -> ok started
//       Posts the same OP COUNT times, one transfer after the other (each with its own deadline),
//       transfer k with id "ID.k" ("-": none); replies once the first is posted. TAG's outcome:
//       OK after all COUNT, else the first failure.
//   await TAG ID DEADLINE_MS     -> ok
//       AwaitNotification(ID); the outcome goes to TAG.
//   wait TAG                     -> ok MILLIS | error CODE MESSAGE
//       Blocks until TAG's outcome (MILLIS: from the post or await to the outcome); forgets TAG.
//   hash REGION OFF:LEN,...      -> ok HEX...
//       XXH3-64 of each range of the region, 16 hex digits each.
//   regions                      -> ok N
//       registered_regions().
//   dereg REGION                 -> ok
//       Deregister.
//   quit                         -> ok
//       Stops the floods and destroys the transport, then replies and exits 0.
//
// Numbers are decimal. Errors of a command (a bad argument, an unknown region) are "error ..."
// replies too; the peer keeps running.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/common/log.h"
#include "ferry/v1/common.pb.h"
#include "grpc/grpc.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/transfer_test_pattern.h"
#include "services/transfer/transfer_wire.h"
#include "xxhash.h"

ABSL_FLAG(std::string, kind, "ucx", "KV transport: ucx or grpc");
ABSL_FLAG(std::string, ucx_tls, "", "UCX transports (UCX_TLS syntax: tcp, shm, ...)");
ABSL_FLAG(std::string, listen_address, "127.0.0.1:0", "gRPC: the transport's listen address");

namespace ferry {
namespace transfer {
namespace {

std::string ErrorLine(const absl::Status& status) {
  std::string message(status.message());
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return absl::StrCat("error ", absl::StatusCodeToString(status.code()), " ", message);
}

// The outcome of a post, flood or await.
struct Outcome {
  absl::Time start = absl::Now();
  absl::Notification done;
  absl::Status status;
  absl::Time end;

  void Set(absl::Status s) {
    status = std::move(s);
    end = absl::Now();
    done.Notify();
  }
};

struct Range {
  uint64_t offset = 0;
  uint64_t length = 0;
};

class TransferPeer {
 public:
  explicit TransferPeer(std::unique_ptr<KvTransport> transport)
      : transport_(std::move(transport)) {}

  ~TransferPeer() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : floods_) t.join();
    transport_.reset();
  }

  // One command line -> one reply line (without the newline).
  std::string Handle(const std::string& line) {
    std::vector<std::string> args = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (args.empty()) return ErrorLine(absl::InvalidArgumentError("empty command"));
    const std::string command = args[0];
    args.erase(args.begin());
    absl::StatusOr<std::string> reply = Dispatch(command, args);
    if (!reply.ok()) return ErrorLine(reply.status());
    return reply->empty() ? "ok" : absl::StrCat("ok ", *reply);
  }

 private:
  absl::StatusOr<std::string> Dispatch(const std::string& command,
                                       const std::vector<std::string>& args) {
    if (command == "alloc") return Alloc(args);
    if (command == "fill" || command == "zero") return Fill(command == "zero", args);
    if (command == "descriptor") return Descriptor(args);
    if (command == "connect") return ConnectTo(args);
    if (command == "post") return PostTransfer(args);
    if (command == "flood") return Flood(args);
    if (command == "await") return Await(args);
    if (command == "wait") return Wait(args);
    if (command == "hash") return Hash(args);
    if (command == "regions") return absl::StrCat(transport_->registered_regions());
    if (command == "dereg") return Dereg(args);
    return absl::InvalidArgumentError(absl::StrCat("unknown command '", command, "'"));
  }

  static absl::Status WantArgs(const std::vector<std::string>& args, size_t n) {
    if (args.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected ", n, " arguments, got ", args.size()));
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<uint64_t> Number(const std::string& text) {
    uint64_t value = 0;
    if (!absl::SimpleAtoi(text, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a number"));
    }
    return value;
  }

  absl::StatusOr<LocalRegion> RegionArg(const std::string& text) const {
    absl::StatusOr<uint64_t> id = Number(text);
    if (!id.ok()) return id.status();
    auto it = regions_.find(*id);
    if (it == regions_.end()) return absl::NotFoundError(absl::StrCat("no region ", *id));
    return it->second;
  }

  // "A:B,..." (with `parts` numbers per item) -> the numbers, item by item.
  static absl::StatusOr<std::vector<std::vector<uint64_t>>> Tuples(const std::string& text,
                                                                   size_t parts) {
    std::vector<std::vector<uint64_t>> tuples;
    for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
      std::vector<std::string> fields = absl::StrSplit(item, ':');
      if (fields.size() != parts) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", item, "' does not have ", parts, " fields"));
      }
      std::vector<uint64_t> tuple;
      for (const std::string& f : fields) {
        absl::StatusOr<uint64_t> n = Number(f);
        if (!n.ok()) return n.status();
        tuple.push_back(*n);
      }
      tuples.push_back(std::move(tuple));
    }
    return tuples;
  }

  absl::StatusOr<std::string> Alloc(const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, 1); !s.ok()) return s;
    absl::StatusOr<uint64_t> bytes = Number(args[0]);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<LocalRegion> region = transport_->Allocate(*bytes);
    if (!region.ok()) return region.status();
    regions_[region->id] = *region;
    return absl::StrCat(region->id);
  }

  absl::StatusOr<std::string> Fill(bool zero, const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, zero ? 1 : 2); !s.ok()) return s;
    absl::StatusOr<LocalRegion> region = RegionArg(args[0]);
    if (!region.ok()) return region.status();
    uint8_t* data = static_cast<uint8_t*>(region->span.address);
    if (zero) {
      std::fill(data, data + region->span.length, 0);
      return std::string();
    }
    absl::StatusOr<uint64_t> seed = Number(args[1]);
    if (!seed.ok()) return seed.status();
    FillPattern(*seed, 0, data, region->span.length);
    return std::string();
  }

  absl::StatusOr<std::string> Descriptor(const std::vector<std::string>& args) {
    PeerDescriptor descriptor;
    descriptor.kind = std::string(transport_->kind());
    descriptor.address = transport_->address();
    for (const std::string& arg : args) {
      absl::StatusOr<LocalRegion> region = RegionArg(arg);
      if (!region.ok()) return region.status();
      descriptor.regions.push_back(region->descriptor);
    }
    return absl::Base64Escape(ToProto(descriptor).SerializeAsString());
  }

  absl::StatusOr<std::string> ConnectTo(const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, 1); !s.ok()) return s;
    std::string bytes;
    v1::TransferDescriptor proto;
    if (!absl::Base64Unescape(args[0], &bytes) || !proto.ParseFromString(bytes)) {
      return absl::InvalidArgumentError("not a base64 ferry.v1.TransferDescriptor");
    }
    absl::StatusOr<PeerDescriptor> descriptor = FromProto(proto);
    if (!descriptor.ok()) return descriptor.status();
    absl::StatusOr<PeerId> peer = transport_->Connect(descriptor->address);
    if (!peer.ok()) return peer.status();
    remotes_[*peer] = descriptor->regions;
    const std::string via = transport_->PeerTransport(*peer);
    return absl::StrCat(*peer, " ", via.empty() ? "-" : via);
  }

  // PEER REGION RINDEX at args[first..first+2] and SEGMENTS at args[segments_at] -> the request
  // (without op, deadline and id).
  absl::StatusOr<TransferRequest> Request(const std::vector<std::string>& args, size_t first,
                                          size_t segments_at) {
    absl::StatusOr<uint64_t> peer = Number(args[first]);
    if (!peer.ok()) return peer.status();
    absl::StatusOr<LocalRegion> local = RegionArg(args[first + 1]);
    if (!local.ok()) return local.status();
    absl::StatusOr<uint64_t> rindex = Number(args[first + 2]);
    if (!rindex.ok()) return rindex.status();
    auto remote = remotes_.find(*peer);
    if (remote == remotes_.end()) return absl::NotFoundError(absl::StrCat("no peer ", *peer));
    if (*rindex >= remote->second.size()) {
      return absl::NotFoundError(absl::StrCat("peer ", *peer, " has no region ", *rindex));
    }
    absl::StatusOr<std::vector<std::vector<uint64_t>>> segments = Tuples(args[segments_at], 3);
    if (!segments.ok()) return segments.status();
    TransferRequest request;
    request.peer = *peer;
    request.remote = remote->second[*rindex];
    const uint64_t local_base = reinterpret_cast<uint64_t>(local->span.address);
    for (const std::vector<uint64_t>& s : *segments) {
      request.segments.push_back({local_base + s[0], request.remote.address + s[1], s[2]});
    }
    return request;
  }

  static absl::StatusOr<TransferOp> Op(const std::string& text) {
    if (text == "put") return TransferOp::kPut;
    if (text == "get") return TransferOp::kGet;
    return absl::InvalidArgumentError("OP is put or get");
  }

  absl::StatusOr<std::string> PostTransfer(const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, 8); !s.ok()) return s;
    const std::string& tag = args[0];
    absl::StatusOr<TransferOp> op = Op(args[1]);
    if (!op.ok()) return op.status();
    absl::StatusOr<uint64_t> deadline_ms = Number(args[5]);
    if (!deadline_ms.ok()) return deadline_ms.status();
    absl::StatusOr<TransferRequest> request = Request(args, 2, 7);
    if (!request.ok()) return request.status();
    request->op = *op;
    request->deadline = absl::Now() + absl::Milliseconds(*deadline_ms);
    if (args[6] != "-") request->transfer_id = args[6];
    auto outcome = std::make_shared<Outcome>();
    absl::StatusOr<TransferId> id = transport_->Post(
        *std::move(request), [outcome](absl::Status status) { outcome->Set(std::move(status)); });
    if (!id.ok()) return id.status();
    outcomes_[tag] = outcome;
    return std::string();
  }

  absl::StatusOr<std::string> Flood(const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, 9); !s.ok()) return s;
    const std::string& tag = args[0];
    absl::StatusOr<TransferOp> op = Op(args[1]);
    if (!op.ok()) return op.status();
    absl::StatusOr<uint64_t> deadline_ms = Number(args[5]);
    if (!deadline_ms.ok()) return deadline_ms.status();
    absl::StatusOr<uint64_t> count = Number(args[6]);
    if (!count.ok()) return count.status();
    if (*count == 0) return absl::InvalidArgumentError("COUNT is at least 1");
    absl::StatusOr<TransferRequest> request = Request(args, 2, 8);
    if (!request.ok()) return request.status();
    request->op = *op;
    const std::string id_prefix = args[7];
    auto outcome = std::make_shared<Outcome>();
    auto first_posted = std::make_shared<Outcome>();
    floods_.emplace_back([this, request = *std::move(request), id_prefix, count = *count,
                          deadline = absl::Milliseconds(*deadline_ms), outcome, first_posted] {
      absl::Status result;
      for (uint64_t k = 0; k < count; ++k) {
        {
          absl::MutexLock lock(&mu_);
          if (stop_) {
            result = absl::CancelledError("the peer is quitting");
            break;
          }
        }
        TransferRequest r = request;
        r.deadline = absl::Now() + deadline;
        if (id_prefix != "-") r.transfer_id = absl::StrCat(id_prefix, ".", k);
        auto one = std::make_shared<Outcome>();
        absl::StatusOr<TransferId> id =
            transport_->Post(std::move(r), [one](absl::Status status) { one->Set(status); });
        if (k == 0) first_posted->Set(id.status());
        if (!id.ok()) {
          result = id.status();
          break;
        }
        one->done.WaitForNotification();
        if (!one->status.ok()) {
          result = absl::Status(one->status.code(),
                                absl::StrCat("transfer ", k, ": ", one->status.message()));
          break;
        }
      }
      if (!first_posted->done.HasBeenNotified()) first_posted->Set(result);
      outcome->Set(result);
    });
    first_posted->done.WaitForNotification();
    outcomes_[tag] = outcome;
    if (!first_posted->status.ok()) return first_posted->status;
    return std::string("started");
  }

  absl::StatusOr<std::string> Await(const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, 3); !s.ok()) return s;
    absl::StatusOr<uint64_t> deadline_ms = Number(args[2]);
    if (!deadline_ms.ok()) return deadline_ms.status();
    auto outcome = std::make_shared<Outcome>();
    outcomes_[args[0]] = outcome;
    transport_->AwaitNotification(
        args[1], absl::Now() + absl::Milliseconds(*deadline_ms),
        [outcome](absl::Status status) { outcome->Set(std::move(status)); });
    return std::string();
  }

  absl::StatusOr<std::string> Wait(const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, 1); !s.ok()) return s;
    auto it = outcomes_.find(args[0]);
    if (it == outcomes_.end()) return absl::NotFoundError(absl::StrCat("no tag ", args[0]));
    std::shared_ptr<Outcome> outcome = it->second;
    outcomes_.erase(it);
    outcome->done.WaitForNotification();
    if (!outcome->status.ok()) return outcome->status;
    return absl::StrCat(absl::ToInt64Milliseconds(outcome->end - outcome->start));
  }

  absl::StatusOr<std::string> Hash(const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, 2); !s.ok()) return s;
    absl::StatusOr<LocalRegion> region = RegionArg(args[0]);
    if (!region.ok()) return region.status();
    absl::StatusOr<std::vector<std::vector<uint64_t>>> ranges = Tuples(args[1], 2);
    if (!ranges.ok()) return ranges.status();
    std::vector<std::string> hashes;
    const uint8_t* data = static_cast<const uint8_t*>(region->span.address);
    for (const std::vector<uint64_t>& r : *ranges) {
      if (r[0] > region->span.length || r[1] > region->span.length - r[0]) {
        return absl::OutOfRangeError(absl::StrCat("range ", r[0], ":", r[1], " is outside the ",
                                                  region->span.length, "-byte region"));
      }
      hashes.push_back(absl::StrFormat("%016x", XXH3_64bits(data + r[0], r[1])));
    }
    return absl::StrJoin(hashes, " ");
  }

  absl::StatusOr<std::string> Dereg(const std::vector<std::string>& args) {
    if (absl::Status s = WantArgs(args, 1); !s.ok()) return s;
    absl::StatusOr<LocalRegion> region = RegionArg(args[0]);
    if (!region.ok()) return region.status();
    if (absl::Status s = transport_->Deregister(region->id); !s.ok()) return s;
    regions_.erase(region->id);
    return std::string();
  }

  std::unique_ptr<KvTransport> transport_;
  // The main thread's state (commands run one at a time).
  std::map<RegionId, LocalRegion> regions_;
  std::map<PeerId, std::vector<RegionDescriptor>> remotes_;
  std::map<std::string, std::shared_ptr<Outcome>> outcomes_;
  std::vector<std::thread> floods_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// Where replies go: the original stdout. File descriptor 1 itself is pointed at stderr, since
// libraries write there too (UCX logs to stdout by default).
FILE* g_replies = nullptr;

void Reply(const std::string& line) {
  std::fputs(line.c_str(), g_replies);
  std::fputc('\n', g_replies);
  std::fflush(g_replies);
}

int Main() {
  g_replies = ::fdopen(::dup(STDOUT_FILENO), "w");
  CHECK(g_replies != nullptr) << "cannot duplicate stdout";
  CHECK_EQ(::dup2(STDERR_FILENO, STDOUT_FILENO), STDOUT_FILENO) << "cannot redirect stdout";
  TransportOptions options;
  options.kind = absl::GetFlag(FLAGS_kind);
  options.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
  options.listen_address = absl::GetFlag(FLAGS_listen_address);
  absl::StatusOr<std::unique_ptr<KvTransport>> transport = KvTransport::Create(options);
  if (!transport.ok()) {
    Reply(ErrorLine(transport.status()));
    return 2;
  }
  const std::string kind((*transport)->kind());
  auto peer = std::make_unique<TransferPeer>(*std::move(transport));
  Reply(absl::StrCat("ok ready ", kind));
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "quit") break;
    Reply(peer->Handle(line));
  }
  peer.reset();
  Reply("ok");
  return 0;
}

}  // namespace
}  // namespace transfer
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // gRPC (1.51) shuts its library down when the last gRPC object goes, which can wait ~10 s for
  // its executor thread; holding one reference lets "quit" answer at once.
  grpc_init();
  return ferry::transfer::Main();
}
