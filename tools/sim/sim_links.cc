#include "tools/sim/sim_links.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace ferry {
namespace {
constexpr double kInfinite = std::numeric_limits<double>::infinity();
// A flow this close to its end is done: simulated time is a double (about 1e-14 s at 100 s), so
// rate x elapsed leaves residues of a fraction of a byte that would otherwise end later by
// nothing at all, forever.
constexpr double kEpsilonSeconds = 1e-9;
constexpr double kEpsilonBytes = 1.0;
}  // namespace

int SimLinks::AddLink(double bandwidth, double latency) {
  links_.push_back(Link{bandwidth, latency, 0});
  return static_cast<int>(links_.size()) - 1;
}

void SimLinks::Transfer(const std::vector<int>& links, double bytes, std::function<void()> done) {
  double latency = 0;
  for (int l : links) latency = std::max(latency, links_[static_cast<size_t>(l)].latency);
  Flow flow;
  flow.links = links;
  flow.remaining = std::max(0.0, bytes);
  flow.done = std::move(done);
  bytes_moved_ += flow.remaining;
  if (latency <= 0) {
    Start(std::move(flow));
    return;
  }
  auto shared = std::make_shared<Flow>(std::move(flow));
  loop_->After(latency, [this, shared] { Start(std::move(*shared)); });
}

void SimLinks::Start(Flow flow) {
  Update();  // progress up to now at the old rates
  for (int l : flow.links) ++links_[static_cast<size_t>(l)].active;
  flows_.emplace(next_flow_++, std::move(flow));
  Update();
}

void SimLinks::Update() {
  const double now = loop_->now();
  const double elapsed = now - last_update_;
  last_update_ = now;
  std::vector<std::function<void()>> finished;
  for (auto it = flows_.begin(); it != flows_.end();) {
    Flow& f = it->second;
    if (f.rate == kInfinite) {
      f.remaining = 0;
    } else {
      f.remaining -= f.rate * elapsed;
    }
    if (f.remaining <= std::max(kEpsilonBytes, f.rate * kEpsilonSeconds)) {
      for (int l : f.links) --links_[static_cast<size_t>(l)].active;
      finished.push_back(std::move(f.done));
      it = flows_.erase(it);
    } else {
      ++it;
    }
  }
  double next_end = kInfinite;
  for (auto& [id, f] : flows_) {
    f.rate = kInfinite;
    for (int l : f.links) {
      const Link& link = links_[static_cast<size_t>(l)];
      if (link.bandwidth > 0) f.rate = std::min(f.rate, link.bandwidth / link.active);
    }
    next_end = std::min(next_end, f.rate == kInfinite ? 0.0 : f.remaining / f.rate);
  }
  if (next_end != kInfinite) {
    next_end = std::max(next_end, kEpsilonSeconds);
    const uint64_t generation = ++generation_;
    loop_->After(next_end, [this, generation] {
      if (generation == generation_) Update();
    });
  }
  for (auto& done : finished) {
    if (done) done();
  }
}

}  // namespace ferry
