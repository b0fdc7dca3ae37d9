// Links that KV moves over in the discrete-event simulator (a worker's NIC, a worker's path to
// the KV store), shared by processor sharing: each link divides its bandwidth equally among the
// transfers using it, and a transfer that uses several links (a hand-off leaves one worker's NIC
// and enters another's) moves at the smallest of its shares. Rates are recomputed whenever a
// transfer starts or ends, so a transfer's time is exact for this model under any overlap.
// A link's latency is paid once, before its transfer starts moving bytes.
//
// The same model as the real-time simulated worker's link (services/worker/sim_link.h), which
// shares one link among its process's concurrent pushes.
//
// Thread-compatible: driven by the EventLoop's thread.

#ifndef FERRY_TOOLS_SIM_SIM_LINKS_H_
#define FERRY_TOOLS_SIM_SIM_LINKS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "tools/sim/event_loop.h"

namespace ferry {

class SimLinks {
 public:
  explicit SimLinks(EventLoop* loop) : loop_(loop) {}

  // A link of `bandwidth` bytes/s (0: infinite) and `latency` seconds; returns its index.
  int AddLink(double bandwidth, double latency);
  // Moves `bytes` over `links` (latency: the largest of theirs); `done` runs at the end, on the
  // loop.
  void Transfer(const std::vector<int>& links, double bytes, std::function<void()> done);
  // Transfers moving over `link` now.
  int active(int link) const { return links_[static_cast<size_t>(link)].active; }
  double bytes_moved() const { return bytes_moved_; }

 private:
  struct Link {
    double bandwidth = 0;
    double latency = 0;
    int active = 0;
  };
  struct Flow {
    std::vector<int> links;
    double remaining = 0;
    double rate = 0;  // bytes/s; infinite links only: +inf
    std::function<void()> done;
  };

  void Start(Flow flow);
  // Brings every flow's progress to now, ends the finished ones, recomputes the rates and
  // schedules the next end.
  void Update();

  EventLoop* const loop_;
  std::vector<Link> links_;
  std::map<uint64_t, Flow> flows_;
  uint64_t next_flow_ = 0;
  uint64_t generation_ = 0;  // an end scheduled before the latest change is stale
  double last_update_ = 0;
  double bytes_moved_ = 0;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_SIM_SIM_LINKS_H_
