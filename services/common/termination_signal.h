// Graceful termination: turns SIGTERM and SIGINT into an event a service's main thread waits
// for, so that it can stop admitting work, drain, and exit cleanly (Kubernetes sends SIGTERM and
// waits terminationGracePeriodSeconds before SIGKILL).
//
// A second SIGTERM/SIGINT while the first is being handled exits the process at once with
// status 128 + signal, the usual "press Ctrl-C twice" escape.
//
// SIGHUP (a daemon's "reload your configuration") calls the OnHangup callback, on the signal
// thread; without one it is logged and ignored (it no longer kills the process).
//
// Install() must run in main() before any other thread starts: it blocks the signals in the
// calling thread, and threads created later inherit that mask, so the signals reach only the
// dedicated sigwait thread instead of interrupting arbitrary threads.

#ifndef FERRY_SERVICES_COMMON_TERMINATION_SIGNAL_H_
#define FERRY_SERVICES_COMMON_TERMINATION_SIGNAL_H_

#include <pthread.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace ferry {

// Thread-safe. At most one instance per process.
class TerminationSignal {
 public:
  static absl::StatusOr<std::unique_ptr<TerminationSignal>> Install();
  ~TerminationSignal();

  // Blocks until SIGTERM or SIGINT arrives or Trigger() is called; returns the signal number
  // (0 for Trigger()).
  int Wait();

  // Like Wait() with a timeout; returns -1 when it expires.
  int WaitFor(absl::Duration timeout);

  bool triggered() const { return notified_.load(); }

  // Requests termination from inside the process (admin endpoint, tests).
  void Trigger();

  // What SIGHUP does from now on (replaces the previous callback).
  void OnHangup(std::function<void()> callback);

 private:
  TerminationSignal() = default;
  void Run();
  void NotifyOnce(int signal_number);

  std::atomic<bool> notified_{false};
  absl::Notification notification_;
  std::atomic<int> signal_{0};
  std::atomic<bool> stopping_{false};
  absl::Mutex hangup_mu_;
  std::function<void()> on_hangup_ ABSL_GUARDED_BY(hangup_mu_);
  std::thread thread_;
  pthread_t thread_handle_{};
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_TERMINATION_SIGNAL_H_
