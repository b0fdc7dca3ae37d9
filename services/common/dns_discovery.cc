#include "services/common/dns_discovery.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/log.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<DnsDiscovery>> DnsDiscovery::Start(
    const DnsDiscoveryOptions& options, OnChange on_change) {
  if (options.targets.empty()) return absl::InvalidArgumentError("DNS discovery: no name given");
  if (options.interval <= absl::ZeroDuration() || options.retry <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("DNS discovery: the intervals must be > 0");
  }
  if (options.stable_name_linger < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("DNS discovery: the linger must be >= 0");
  }
  std::vector<Target> targets;
  for (const std::string& t : options.targets) {
    Target target;
    if (absl::Status s = SplitHostPort(t, &target.name, &target.port); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("DNS discovery: ", s.message()));
    }
    targets.push_back(std::move(target));
  }
  absl::StatusOr<std::unique_ptr<DnsResolver>> resolver = DnsResolver::Create(options.dns);
  if (!resolver.ok()) return resolver.status();
  std::unique_ptr<DnsDiscovery> d(
      new DnsDiscovery(options, *std::move(resolver), std::move(targets), std::move(on_change)));
  const bool answered = d->Round();
  d->thread_ = std::thread([p = d.get(), answered] { p->Loop(/*failed=*/!answered); });
  return d;
}

DnsDiscovery::DnsDiscovery(const DnsDiscoveryOptions& options,
                           std::unique_ptr<DnsResolver> resolver, std::vector<Target> targets,
                           OnChange on_change)
    : options_(options),
      resolver_(std::move(resolver)),
      on_change_(std::move(on_change)),
      targets_(std::move(targets)) {}

DnsDiscovery::~DnsDiscovery() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void DnsDiscovery::ResolveSoon() {
  absl::MutexLock lock(&mu_);
  soon_ = true;
}

std::vector<std::string> DnsDiscovery::endpoints() const {
  absl::MutexLock lock(&mu_);
  return endpoints_;
}

int64_t DnsDiscovery::rounds() const {
  absl::MutexLock lock(&mu_);
  return rounds_;
}

bool DnsDiscovery::AwaitRounds(int64_t n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  const auto done = [this, n] {
    mu_.AssertHeld();
    return rounds_ >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

bool DnsDiscovery::stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

bool DnsDiscovery::Round() {
  const bool stable = options_.naming == DnsDiscoveryOptions::Naming::kStableName;
  bool answered = true;
  for (Target& target : targets_) {
    if (stopping()) return false;
    absl::StatusOr<std::vector<std::string>> addresses = resolver_->Addresses(target.name);
    std::vector<std::string> endpoints;
    if (!addresses.ok()) {
      if (!absl::IsNotFound(addresses.status())) {
        answered = false;
        LOG(WARNING) << options_.what << ": " << addresses.status().message() << " (the last "
                     << target.endpoints.size() << " endpoint(s) of " << target.name << " stay)";
        continue;
      }
      if (!target.endpoints.empty()) {
        LOG(INFO) << options_.what << ": " << target.name << " has no address now";
      }
      addresses = std::vector<std::string>();
    }
    for (const std::string& address : *addresses) {
      std::string host = address;
      if (stable) {
        if (stopping()) return false;
        absl::StatusOr<std::string> name = resolver_->NameOf(address);
        if (name.ok()) {
          names_[address] = *name;
          host = *name;
        } else if (auto known = names_.find(address); known != names_.end()) {
          host = known->second;  // the DNS did not answer: the name it gave before
          if (!absl::IsNotFound(name.status())) answered = false;
        } else if (absl::IsNotFound(name.status())) {
          LOG(WARNING) << options_.what << ": " << address << " (of " << target.name
                       << ") has no PTR record: named by its address, so its keys move if it "
                          "comes back on another one";
        } else {
          answered = false;
          LOG(WARNING) << options_.what << ": " << name.status().message() << " (" << address
                       << " left out of this round)";
          continue;
        }
      }
      endpoints.push_back(JoinHostPort(host, target.port));
    }
    if (stable) {
      // A stable name gone from the DNS stays a while: its pod may be being replaced.
      for (const std::string& e : endpoints) missing_since_.erase(e);
      const absl::Time now = absl::Now();
      const size_t answered_endpoints = endpoints.size();
      for (const std::string& e : target.endpoints) {
        if (std::find(endpoints.begin(), endpoints.begin() + answered_endpoints, e) !=
            endpoints.begin() + answered_endpoints) {
          continue;
        }
        const absl::Time since = missing_since_.try_emplace(e, now).first->second;
        if (now - since < options_.stable_name_linger) {
          endpoints.push_back(e);
        } else {
          LOG(INFO) << options_.what << ": " << e << " has been gone from the DNS for "
                    << (now - since) << ": it leaves";
          missing_since_.erase(e);
        }
      }
    }
    target.endpoints = std::move(endpoints);
  }
  // Forget the names of addresses that left (a new pod may get the address).
  if (stable && answered) {
    absl::flat_hash_map<std::string, std::string> kept;
    for (const Target& target : targets_) {
      for (const auto& [address, name] : names_) {
        for (const std::string& e : target.endpoints) {
          if (e == JoinHostPort(name, target.port)) kept.emplace(address, name);
        }
      }
    }
    names_ = std::move(kept);
  }
  std::vector<std::string> all;
  for (const Target& target : targets_) {
    all.insert(all.end(), target.endpoints.begin(), target.endpoints.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return false;
    changed = !notified_ || all != endpoints_;
    notified_ = true;
    endpoints_ = all;
  }
  if (changed) {
    LOG(INFO) << options_.what << " from DNS (" << absl::StrJoin(options_.targets, ", ")
              << "): " << (all.empty() ? "none" : absl::StrJoin(all, ", "));
    on_change_(std::move(all));
  }
  {
    absl::MutexLock lock(&mu_);
    ++rounds_;
  }
  return answered;
}

absl::Time DnsDiscovery::NextLingerEnd() const {
  absl::Time end = absl::InfiniteFuture();
  for (const auto& [endpoint, since] : missing_since_) {
    end = std::min(end, since + options_.stable_name_linger);
  }
  return end;
}

void DnsDiscovery::Loop(bool failed) {
  absl::Time last = absl::Now();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // The next round: the interval's (the retry's after a failure), or sooner when a
      // lingering stable name is due to leave.
      const absl::Time next = std::min(
          last + (failed ? std::min(options_.retry, options_.interval) : options_.interval),
          NextLingerEnd());
      const auto wake = [this] {
        mu_.AssertHeld();
        return stop_ || soon_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&wake), next);
      if (stop_) return;
      soon_ = false;
    }
    last = absl::Now();
    failed = !Round();
  }
}

}  // namespace ferry
