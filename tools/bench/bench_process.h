// What the benchmarks that start Ferry's real binaries share (simfidelity, stack): running a
// child program to its end with a timeout (ferry-load, ferry-calibrate), and the CPU time that
// processes and the whole machine spent, to tell a benchmark's own work from a busy neighbour's.
//
// RunCommand's child dies with the calling process (PR_SET_PDEATHSIG); its stdout and stderr go
// to files under the directory given, which the caller owns. Functions that read /proc do not
// fail: what they cannot read is 0. Thread-compatible (RunCommand's file names come from a
// process-wide counter: call it from one thread).

#ifndef FERRY_TOOLS_BENCH_BENCH_PROCESS_H_
#define FERRY_TOOLS_BENCH_BENCH_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ferry {
namespace bench {

using Clock = std::chrono::steady_clock;

// Seconds since `t`.
double Since(Clock::time_point t);
std::string ReadFile(const std::string& path);
// The last `bytes` bytes of `text` (all of it when shorter).
std::string Tail(const std::string& text, size_t bytes);

struct CommandResult {
  int exit_code = -1;  // 0..255, 128 + signal, or -1 when it could not start
  bool timed_out = false;
  std::string out;         // its stdout
  std::string err_tail;    // the end of its stderr
  double cpu_seconds = 0;  // user + system, all its threads
};

// Runs `binary args` to its end or `timeout_s` (then SIGKILL); its output goes to
// `dir`/`name`-N.out and .err.
CommandResult RunCommand(const std::string& binary, const std::vector<std::string>& args,
                         double timeout_s, const std::string& dir, const std::string& name);

// CPU seconds (user + system, every thread) of a running process.
double ProcessCpuSeconds(pid_t pid);

// Busy and steal CPU seconds of the whole machine (/proc/stat, all CPUs).
struct MachineCpu {
  double busy = 0, steal = 0;
};
MachineCpu ReadMachineCpu();

int Cores();

}  // namespace bench
}  // namespace ferry

#endif  // FERRY_TOOLS_BENCH_BENCH_PROCESS_H_
