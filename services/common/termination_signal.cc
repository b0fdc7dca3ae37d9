#include "services/common/termination_signal.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"

namespace ferry {
namespace {

std::atomic<bool> g_installed{false};

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TerminationSignal>> TerminationSignal::Install() {
  if (g_installed.exchange(true)) {
    return absl::FailedPreconditionError("TerminationSignal is already installed");
  }
  sigset_t set = TerminationSet();
  const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (rc != 0) {
    g_installed = false;
    return absl::InternalError(absl::StrCat("pthread_sigmask: ", strerror(rc)));
  }
  auto handler = std::unique_ptr<TerminationSignal>(new TerminationSignal());
  handler->thread_ = std::thread([h = handler.get()] { h->Run(); });
  handler->thread_handle_ = handler->thread_.native_handle();
  return handler;
}

TerminationSignal::~TerminationSignal() {
  stopping_ = true;
  pthread_kill(thread_handle_, SIGTERM);  // wakes sigwait; Run() sees stopping_ and returns
  thread_.join();
  g_installed = false;
}

void TerminationSignal::Run() {
  const sigset_t set = TerminationSet();
  while (true) {
    int signal_number = 0;
    if (sigwait(&set, &signal_number) != 0) continue;
    if (stopping_) return;
    if (signal_number == SIGHUP) {
      std::function<void()> callback;
      {
        absl::MutexLock lock(&hangup_mu_);
        callback = on_hangup_;
      }
      if (callback) {
        LOG(INFO) << "received SIGHUP: reloading";
        callback();
      } else {
        LOG(INFO) << "received SIGHUP: nothing to reload, ignored";
      }
      continue;
    }
    if (notified_.load()) {
      // Second signal: the operator does not want to wait for the drain.
      static constexpr char kMessage[] = "second termination signal: exiting now\n";
      (void)!write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
      _exit(128 + signal_number);
    }
    LOG(INFO) << "received " << strsignal(signal_number) << ", shutting down gracefully";
    NotifyOnce(signal_number);
  }
}

void TerminationSignal::NotifyOnce(int signal_number) {
  if (notified_.exchange(true)) return;
  signal_ = signal_number;
  notification_.Notify();
}

int TerminationSignal::Wait() {
  notification_.WaitForNotification();
  return signal_;
}

int TerminationSignal::WaitFor(absl::Duration timeout) {
  if (!notification_.WaitForNotificationWithTimeout(timeout)) return -1;
  return signal_;
}

void TerminationSignal::Trigger() { NotifyOnce(0); }

void TerminationSignal::OnHangup(std::function<void()> callback) {
  absl::MutexLock lock(&hangup_mu_);
  on_hangup_ = std::move(callback);
}

}  // namespace ferry
