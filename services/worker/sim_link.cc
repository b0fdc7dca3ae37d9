#include "services/worker/sim_link.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace ferry {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

}  // namespace

void LinkShares::Advance(double now, std::vector<std::pair<uint64_t, double>>* served) {
  while (!remaining_.empty()) {
    double least = kInfinity;
    for (const auto& [id, bytes] : remaining_) least = std::min(least, bytes);
    const double n = static_cast<double>(remaining_.size());
    // Each of the n gets bandwidth / n: the least is served at now_ + least x n / bandwidth.
    const double finish = bandwidth_ > 0 ? now_ + least * n / bandwidth_ : now_;
    if (finish > now) break;
    now_ = finish;
    for (auto it = remaining_.begin(); it != remaining_.end();) {
      it->second -= least;
      if (it->second <= 0) {
        served->push_back({it->first, finish});
        it = remaining_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (now <= now_) return;
  if (!remaining_.empty()) {
    const double each = (now - now_) * bandwidth_ / static_cast<double>(remaining_.size());
    for (auto& [id, bytes] : remaining_) bytes = std::max(0.0, bytes - each);
  }
  now_ = now;
}

void LinkShares::Add(uint64_t id, double bytes, double now,
                     std::vector<std::pair<uint64_t, double>>* served) {
  Advance(now, served);
  remaining_[id] = std::max(0.0, bytes);
}

bool LinkShares::Remove(uint64_t id, double now, std::vector<std::pair<uint64_t, double>>* served) {
  Advance(now, served);
  return remaining_.erase(id) > 0;
}

double LinkShares::NextFinish() const {
  if (remaining_.empty()) return kInfinity;
  if (bandwidth_ <= 0) return now_;
  double least = kInfinity;
  for (const auto& [id, bytes] : remaining_) least = std::min(least, bytes);
  return now_ + least * static_cast<double>(remaining_.size()) / bandwidth_;
}

SimLink::SimLink(double bandwidth_bytes_per_s, double latency_s)
    : latency_s_(std::max(0.0, latency_s)),
      origin_(absl::Now()),
      shares_(bandwidth_bytes_per_s),
      thread_([this] { Loop(); }) {}

SimLink::~SimLink() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.Signal();
  }
  thread_.join();
}

void SimLink::NoteServed(const std::vector<std::pair<uint64_t, double>>& served) {
  for (const auto& [id, at] : served) {
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    it->second.served = true;
    it->second.done_at = origin_ + absl::Seconds(at + latency_s_);
  }
}

void SimLink::Start(double bytes, absl::Time deadline, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      const uint64_t id = next_id_++;
      std::vector<std::pair<uint64_t, double>> served;
      shares_.Add(id, bytes, SecondsAt(absl::Now()), &served);
      Pending& p = pending_[id];
      p.deadline = deadline;
      p.done = std::move(done);
      NoteServed(served);
      changed_.Signal();
      return;
    }
  }
  done(false);  // the link is going away
}

bool SimLink::Transfer(double bytes, absl::Time deadline) {
  struct Outcome {
    absl::Notification notified;
    bool served = false;
  };
  auto outcome = std::make_shared<Outcome>();
  Start(bytes, deadline, [outcome](bool served) {
    outcome->served = served;
    outcome->notified.Notify();
  });
  outcome->notified.WaitForNotification();
  return outcome->served;
}

int SimLink::in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pending_.size());
}

void SimLink::Loop() {
  std::vector<std::pair<uint64_t, double>> served;
  std::vector<std::pair<Done, bool>> outcomes;
  mu_.Lock();
  while (true) {
    const absl::Time now = absl::Now();
    served.clear();
    shares_.Advance(SecondsAt(now), &served);
    NoteServed(served);
    absl::Time wake = absl::InfiniteFuture();
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = it->second;
      const bool ready = p.served && p.done_at <= now && p.done_at <= p.deadline;
      if (ready || p.deadline <= now || stopping_) {
        if (!p.served) {
          served.clear();
          shares_.Remove(it->first, SecondsAt(now), &served);
          NoteServed(served);
        }
        outcomes.push_back({std::move(p.done), ready});
        it = pending_.erase(it);
        continue;
      }
      wake = std::min(wake, p.served ? std::min(p.done_at, p.deadline) : p.deadline);
      ++it;
    }
    if (!outcomes.empty()) {
      mu_.Unlock();
      for (auto& [done, ok] : outcomes) done(ok);
      outcomes.clear();
      mu_.Lock();
      continue;  // time moved on while they ran
    }
    if (stopping_) break;
    const double next = shares_.NextFinish();
    if (next < std::numeric_limits<double>::infinity()) {
      wake = std::min(wake, origin_ + absl::Seconds(next));
    }
    changed_.WaitWithDeadline(&mu_, wake);
  }
  mu_.Unlock();
}

}  // namespace ferry
