// How much of the machine's CPU time other processes took while a measurement ran: the busy
// time of all CPUs (/proc/stat) less this process's own (/proc/self/stat), as a fraction of the
// CPUs' time over the interval. A calibration measured while something else computed is slower
// than the machine (with every core an engine thread, one busy core stalls each step's
// barrier), so tools/calibrate reports this next to its figures and warns when it is high.
//
// Thread-compatible. Linux only (elsewhere, and when /proc cannot be read, it reads 0).

#ifndef FERRY_TOOLS_CALIBRATE_CPU_CONTENTION_H_
#define FERRY_TOOLS_CALIBRATE_CPU_CONTENTION_H_

#include <chrono>
#include <cstdint>

namespace ferry {

class CpuContention {
 public:
  CpuContention() { Restart(); }
  void Restart();
  // Other processes' share of all CPUs' time since the last Restart, in [0, 1].
  double OthersShare() const;

 private:
  struct Sample {
    int64_t busy_ticks = 0;  // every CPU, every process
    int64_t self_ticks = 0;  // this process's threads
    std::chrono::steady_clock::time_point at;
  };
  static Sample Read();
  Sample start_;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_CALIBRATE_CPU_CONTENTION_H_
