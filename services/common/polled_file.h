// A file that a service re-reads while it runs, so that a new content takes effect without a
// signal or a restart: Kubernetes Secrets (the shared token, the router's API keys) mounted as
// files. The kubelet updates such a mount by swapping a `..data` symlink to a new directory, so
// inotify on the file never fires; PolledFile re-reads the file by its path every `interval` and
// compares the content with the last one it saw.
//
// A new content goes to `apply`, which takes it (OK) or refuses it (an error: a bad file, e.g.
// an empty or too short token): refused content is logged once and the service keeps what it
// had. A file that cannot be read is treated the same way (the old content stays in force).
// Each outcome counts in ferry_secret_reloads_total{secret=<name>, result=applied|rejected}, a
// counter tests wait on.
//
// Start reads and applies the file once before it returns (an error then fails the start); a
// thread then polls it. Poll(force) does one poll at once (SIGHUP reloads, tests).
//
// Thread-safe. `apply` runs on the polling thread or the caller of Poll, never two at once, and
// must not call back into the PolledFile.

#ifndef FERRY_SERVICES_COMMON_POLLED_FILE_H_
#define FERRY_SERVICES_COMMON_POLLED_FILE_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace prometheus {
class Counter;
class Registry;
}  // namespace prometheus

namespace ferry {

struct PolledFileOptions {
  std::string path;
  // What the file holds, in log lines and the metric's `secret` label ("auth_token").
  std::string name;
  // Time between two reads; zero: no polling thread (Poll only).
  absl::Duration interval = absl::Seconds(10);
  // Where ferry_secret_reloads_total goes; null: not exported. Must outlive the PolledFile.
  prometheus::Registry* registry = nullptr;
};

class PolledFile {
 public:
  // Takes the new content (OK) or refuses it with the reason (the old one stays in force). The
  // message must not quote the content (it may be a secret).
  using Apply = std::function<absl::Status(const std::string& content)>;

  // Reads and applies the file (its error, naming the file, when it cannot be read or is
  // refused), then polls it every options.interval.
  static absl::StatusOr<std::unique_ptr<PolledFile>> Start(PolledFileOptions options, Apply apply);

  // Stops the polling thread (an apply in progress finishes first).
  ~PolledFile();
  PolledFile(const PolledFile&) = delete;
  PolledFile& operator=(const PolledFile&) = delete;

  // Reads the file and applies its content if it changed since the last read (or always, with
  // `force`). OK when applied or unchanged; the read error or the refusal otherwise.
  absl::Status Poll(bool force = false);

  const std::string& path() const { return options_.path; }

 private:
  PolledFile(PolledFileOptions options, Apply apply);
  void Run();

  const PolledFileOptions options_;
  const Apply apply_;
  prometheus::Counter* applied_ = nullptr;
  prometheus::Counter* rejected_ = nullptr;

  absl::Mutex poll_mu_;  // one poll at a time
  // The last content read (applied or refused) or read error: a change is what differs from it.
  std::string last_ ABSL_GUARDED_BY(poll_mu_);
  bool last_failed_ ABSL_GUARDED_BY(poll_mu_) = false;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_POLLED_FILE_H_
