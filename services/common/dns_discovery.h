// Discovery of a pool's members by DNS (ARCHITECTURE.md §7 Registry): the endpoints behind one or
// more "name:port" targets, kept current on a thread of its own, for the router's workers and the
// KV store nodes of the router and the workers. In Kubernetes each target is a headless Service:
// its A/AAAA records are its pods (with publishNotReadyAddresses, starting and draining pods too).
//
//   DnsDiscoveryOptions o;
//   o.targets = {"ferry-prefill:50051", "ferry-decode:50051"};
//   auto d = DnsDiscovery::Start(o, [&](std::vector<std::string> endpoints) {
//     registry->SetWorkers(endpoints);                      // {"10.0.3.7:50051", ...}
//   });
//
// Endpoints are "address:port", or with Naming::kStableName "name:port" where the name is the
// address's PTR record: a StatefulSet pod's stable DNS name (ferry-kvstore-0.ferry-kvstore.ns.svc.
// cluster.local), which survives the pod's restart on a new IP, so the KV store client's placement
// (rendezvous hashing over the endpoint strings) does not move keys when a node restarts (the
// client dials the name; its gRPC channel looks the name up again when a connection fails). An
// address without a PTR record (NotFound) is named by its address, with a warning. A stable name
// that leaves the DNS stays an endpoint for `stable_name_linger` (a minute by default; a round runs
// when it ends): a StatefulSet pod being replaced has no record until its successor exists, and
// meanwhile its keys are misses (the client marks it down) rather than moved to other nodes.
// Addresses (Naming::kAddress) and stable names with a zero linger leave with the round that
// misses them.
//
// Each round resolves every target. A target whose lookup fails for want of an answer (timeout,
// server failure) keeps its last endpoints: a DNS outage never empties a pool. A target the DNS
// says has no record is empty (a pool scaled to zero). Rounds run every `interval`, or after
// `retry` when the last one failed, and at once on ResolveSoon() (callers ask when a member's
// connection fails). `on_change` gets the sorted union of the targets' endpoints whenever it
// differs from the last it got, and once after the first round (even if empty), on the
// discovery's thread (the first one on the caller's, inside Start), never concurrently.
//
// Thread-safe. The destructor stops the thread: a round in progress ends after its current lookup
// (within DnsOptions::timeout) without calling on_change; on_change is never called after the
// destructor returns.

#ifndef FERRY_SERVICES_COMMON_DNS_DISCOVERY_H_
#define FERRY_SERVICES_COMMON_DNS_DISCOVERY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/dns_resolver.h"

namespace ferry {

struct DnsDiscoveryOptions {
  enum class Naming { kAddress, kStableName };
  // "name:port" each (at least one).
  std::vector<std::string> targets;
  Naming naming = Naming::kAddress;
  absl::Duration interval = absl::Seconds(5);
  // After a round with a failed lookup: the next one this soon (at most `interval`).
  absl::Duration retry = absl::Seconds(1);
  // How long a stable name absent from the DNS stays an endpoint (Naming::kStableName; >= 0).
  absl::Duration stable_name_linger = absl::Minutes(1);
  DnsOptions dns;
  // What the endpoints are, for the log ("workers", "KV store nodes").
  std::string what = "endpoints";
};

class DnsDiscovery {
 public:
  using OnChange = std::function<void(std::vector<std::string> endpoints)>;

  // Runs the first round before it returns (its failures are logged, not returned: the pool may
  // not exist yet), then the thread. InvalidArgument for bad options (no target, a target that is
  // not name:port, an interval <= 0) or a bad resolver configuration.
  static absl::StatusOr<std::unique_ptr<DnsDiscovery>> Start(const DnsDiscoveryOptions& options,
                                                             OnChange on_change);
  ~DnsDiscovery();
  DnsDiscovery(const DnsDiscovery&) = delete;
  DnsDiscovery& operator=(const DnsDiscovery&) = delete;

  // Starts a round now (or right after the one running).
  void ResolveSoon();

  // The endpoints last given to on_change.
  std::vector<std::string> endpoints() const;
  // Rounds completed.
  int64_t rounds() const;
  // Whether `n` rounds have completed within `timeout` (tests wait on it).
  bool AwaitRounds(int64_t n, absl::Duration timeout) const;

 private:
  struct Target {
    std::string name;
    int port = 0;
    std::vector<std::string> endpoints;  // as of the last answer
  };

  DnsDiscovery(const DnsDiscoveryOptions& options, std::unique_ptr<DnsResolver> resolver,
               std::vector<Target> targets, OnChange on_change);
  // One round; returns whether every lookup was answered (false also when stopped in it).
  bool Round();
  bool stopping() const;
  // Rounds until stopped; `failed`: whether the last round (Start's) failed.
  void Loop(bool failed);
  // When the first lingering stable name is due to leave (InfiniteFuture: none lingers).
  absl::Time NextLingerEnd() const;

  const DnsDiscoveryOptions options_;
  const std::unique_ptr<DnsResolver> resolver_;
  const OnChange on_change_;
  std::vector<Target> targets_;  // the round's (only Start and the thread touch it)
  // PTR names already known, by address (kStableName): a name lookup that fails keeps its name.
  absl::flat_hash_map<std::string, std::string> names_;
  // Stable-name endpoints absent from the DNS: when a round first missed them.
  absl::flat_hash_map<std::string, absl::Time> missing_since_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool soon_ ABSL_GUARDED_BY(mu_) = false;
  int64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> endpoints_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_DNS_DISCOVERY_H_
