// A Ferry service binary run as a child process for multi-process tests: started with its
// arguments, ready once it printed "grpc_port=N admin_port=M" (the router: http_port=N) on stdout,
// its stderr kept in a log file under TEST_TMPDIR, and killed (SIGKILL) and reaped when the object
// goes away, whatever happened in between. The child also gets SIGKILL if the test process dies
// first (PR_SET_PDEATHSIG), so a crashed test leaves no process behind.
//
// Thread-compatible.

#ifndef FERRY_TESTS_INTEGRATION_SERVICE_PROCESS_H_
#define FERRY_TESTS_INTEGRATION_SERVICE_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace ferry {

class ServiceProcess {
 public:
  ServiceProcess(const std::string& binary, const std::vector<std::string>& args,
                 absl::Duration ready_timeout = absl::Seconds(120));
  ~ServiceProcess();
  ServiceProcess(const ServiceProcess&) = delete;
  ServiceProcess& operator=(const ServiceProcess&) = delete;

  bool ready() const { return ready_; }
  int grpc_port() const { return grpc_port_; }  // the service's port (the router's: HTTP)
  int admin_port() const { return admin_port_; }
  std::string address() const;  // 127.0.0.1:grpc_port
  pid_t pid() const { return pid_; }

  void Signal(int signal_number);
  // The exit status (0..255), 128 + signal when a signal ended it, or -1 when it is still running
  // after `timeout`.
  int WaitForExit(absl::Duration timeout);
  bool running();
  // The last `bytes` of its stderr.
  std::string LogTail(size_t bytes = 4000) const;

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
  bool reaped_ = false;
  int grpc_port_ = 0;
  int admin_port_ = 0;
  int stdout_fd_ = -1;
  std::string log_path_;
};

// GET http://127.0.0.1:port/target: the status code (-1 when nothing answers) and the body.
int HttpGet(int port, const std::string& target, std::string* body = nullptr);

// POST http://127.0.0.1:port/target with a JSON body and extra `headers` (name, value): the
// status code (-1 when nothing answers) and the body.
int HttpPost(int port, const std::string& target, const std::string& json_body,
             const std::vector<std::pair<std::string, std::string>>& headers = {},
             std::string* body = nullptr);

// The value of the first sample of `metric` (name with labels, as printed: `a{b="c"}`) on the
// admin port's /metrics, or -1.
double MetricValue(int admin_port, const std::string& metric);

// Polls `done` (every few milliseconds: it reads another process's state, an event this process
// cannot be told of) until it is true or `timeout` passes; whether it became true.
bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(30));

}  // namespace ferry

#endif  // FERRY_TESTS_INTEGRATION_SERVICE_PROCESS_H_
