#include "tools/calibrate/cpu_contention.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace ferry {

CpuContention::Sample CpuContention::Read() {
  Sample s;
  s.at = std::chrono::steady_clock::now();
  // "cpu  user nice system idle iowait irq softirq steal guest guest_nice" (guest is in user).
  std::ifstream stat("/proc/stat");
  std::string cpu;
  int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal &&
      cpu == "cpu") {
    s.busy_ticks = user + nice + system + irq + softirq + steal;
  }
  // /proc/self/stat: utime and stime are fields 14 and 15, after the parenthesised name.
  std::ifstream self("/proc/self/stat");
  std::string line;
  std::getline(self, line);
  const size_t paren = line.rfind(')');
  if (paren != std::string::npos) {
    std::istringstream rest(line.substr(paren + 2));
    std::string field;
    int64_t utime = 0, stime = 0;
    for (int i = 3; i <= 13 && rest >> field; ++i) {
    }
    if (rest >> utime >> stime) s.self_ticks = utime + stime;
  }
  return s;
}

void CpuContention::Restart() { start_ = Read(); }

double CpuContention::OthersShare() const {
  const Sample now = Read();
  const double seconds = std::chrono::duration<double>(now.at - start_.at).count();
  const long hz = sysconf(_SC_CLK_TCK);
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  if (seconds <= 0 || hz <= 0) return 0;
  const double others = static_cast<double>((now.busy_ticks - start_.busy_ticks) -
                                            (now.self_ticks - start_.self_ticks)) /
                        static_cast<double>(hz);
  return std::clamp(others / (seconds * cpus), 0.0, 1.0);
}

}  // namespace ferry
