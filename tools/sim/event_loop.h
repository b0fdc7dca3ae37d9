// The discrete-event simulator's clock and agenda (ARCHITECTURE.md §1 `--engine=sim`, the
// discrete-event mode): callbacks scheduled at simulated times run in time order (ties in the
// order they were scheduled, so a run is deterministic), and the loop is the Clock of every
// engine it drives, so their queue times and TTLs read simulated time. Nothing sleeps: a run
// of hours of simulated time takes the CPU time of its events.
//
// Thread-compatible: one thread runs the loop and everything it calls. SleepFor is a programming
// error here (nothing may block the simulation); it CHECK-fails.

#ifndef FERRY_TOOLS_SIM_EVENT_LOOP_H_
#define FERRY_TOOLS_SIM_EVENT_LOOP_H_

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "engine/common/clock.h"

namespace ferry {

class EventLoop final : public Clock {
 public:
  using Callback = std::function<void()>;

  // Seconds since the simulation started.
  double now() const { return now_; }
  // Runs `callback` at `time` (>= now(); an earlier time runs at now()).
  void At(double time, Callback callback);
  void After(double delay, Callback callback) { At(now_ + delay, std::move(callback)); }
  // Runs the earliest event; false when none is left.
  bool RunOne();
  // Runs events until none is left, or the next one is after `until` (the clock then stops at
  // `until`), or `stop` says so (checked after each event).
  void Run(double until, const std::function<bool()>& stop = nullptr);
  size_t pending() const { return queue_.size(); }
  int64_t events_run() const { return events_run_; }

  // Clock: simulated time (Now() from the Unix epoch plus now()).
  absl::Time Now() const override;
  absl::Duration Monotonic() const override;
  void SleepFor(absl::Duration duration) override;

 private:
  struct Entry {
    double time;
    uint64_t order;
    Callback callback;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.time != b.time ? a.time > b.time : a.order > b.order;
    }
  };

  double now_ = 0;
  uint64_t next_order_ = 0;
  int64_t events_run_ = 0;
  std::priority_queue<Entry, std::vector<Entry>, Later> queue_;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_SIM_EVENT_LOOP_H_
