#include "services/planner/local_actuator.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"

extern char** environ;

namespace ferry {

namespace {

constexpr size_t kTailBytes = 2048;

absl::Status Errno(const std::string& what, int error) {
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrCat(what, ": ", std::strerror(error)));
}

// `text` less its terminal escapes (the script colours its log lines), its last lines kept.
std::string PlainTail(const std::string& text) {
  std::string plain;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\033') {
      while (i < text.size() && !absl::ascii_isalpha(text[i])) ++i;
      continue;
    }
    plain.push_back(text[i]);
  }
  std::vector<absl::string_view> lines = absl::StrSplit(plain, '\n', absl::SkipWhitespace());
  if (lines.size() > 8) lines.erase(lines.begin(), lines.end() - 8);
  return absl::StrJoin(lines, " | ");
}

}  // namespace

absl::Status LocalActuatorOptions::Validate() const {
  if (ferry_script.empty()) return absl::InvalidArgumentError("the ferry script is not given");
  if (state_dir.empty())
    return absl::InvalidArgumentError("the stack's state directory is not given");
  if (grace < absl::Seconds(1)) return absl::InvalidArgumentError("the grace must be >= 1s");
  if (startup_timeout <= absl::ZeroDuration() || margin < absl::ZeroDuration() ||
      script_wait < absl::ZeroDuration() || shutdown_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be positive");
  }
  return absl::OkStatus();
}

const char* LocalActuator::ScriptPool(PoolRole pool) {
  return pool == PoolRole::kAggregated ? "worker" : PoolRoleName(pool);
}

absl::StatusOr<std::unique_ptr<LocalActuator>> LocalActuator::Create(LocalActuatorOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (access(options.ferry_script.c_str(), X_OK) != 0) {
    return Errno(absl::StrCat("the ferry script ", options.ferry_script), errno);
  }
  if (options.output_file.empty()) {
    options.output_file = absl::StrCat(options.state_dir, "/logs/planner-scale.log");
  }
  return std::unique_ptr<LocalActuator>(new LocalActuator(std::move(options)));
}

LocalActuator::LocalActuator(LocalActuatorOptions options) : options_(std::move(options)) {}

LocalActuator::~LocalActuator() {
  if (running_ == nullptr) return;
  if (!WaitIdle(absl::Now() + options_.shutdown_wait)) {
    LOG(WARNING) << "./ferry scale " << ScriptPool(running_->pool) << " " << running_->to
                 << " (pid " << running_->pid << ") still runs; it is left to finish";
    close(running_->pidfd);
  }
}

absl::StatusOr<int64_t> LocalActuator::RecordedWorkers(PoolRole pool) const {
  const std::string path = absl::StrCat(options_.state_dir, "/order");
  std::ifstream in(path);
  if (!in) {
    return absl::UnavailableError(
        absl::StrCat("the local stack is not running (no ", path, "; ./ferry up starts it)"));
  }
  const std::string prefix = ScriptPool(pool);
  int64_t count = 0;
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view name = absl::StripAsciiWhitespace(line);
    int index = 0;
    if (absl::StartsWith(name, prefix) && name.size() > prefix.size() &&
        absl::ascii_isdigit(name[prefix.size()]) &&
        absl::SimpleAtoi(name.substr(prefix.size()), &index)) {
      ++count;
    }
  }
  if (count == 0) {
    return absl::NotFoundError(absl::StrCat("the local stack has no ", prefix, " pool"));
  }
  return count;
}

std::string LocalActuator::OutputTail() const {
  std::ifstream in(options_.output_file, std::ios::binary);
  if (!in) return "(no output)";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(std::max<std::streamoff>(0, size - static_cast<std::streamoff>(kTailBytes)));
  std::stringstream tail;
  tail << in.rdbuf();
  return PlainTail(tail.str());
}

void LocalActuator::Reap(absl::Time until) {
  if (running_ == nullptr) return;
  Running& r = *running_;
  const absl::Duration wait = std::max(absl::ZeroDuration(), until - absl::Now());
  pollfd fd{r.pidfd, POLLIN, 0};
  const int ready =
      poll(&fd, 1, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(wait), 60000)));
  int status = 0;
  const std::string what = absl::StrCat("./ferry scale ", ScriptPool(r.pool), " ", r.to);
  if (ready <= 0 || waitpid(r.pid, &status, WNOHANG) != r.pid) {
    if (!r.overdue_reported && absl::Now() > r.deadline) {
      r.overdue_reported = true;
      failed_[static_cast<int>(r.pool)] =
          absl::DeadlineExceededError(absl::StrCat(what, " (pid ", r.pid,
                                                   ") still runs past its deadline; it is left to "
                                                   "finish: ",
                                                   OutputTail()));
    }
    return;
  }
  close(r.pidfd);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    LOG(INFO) << what << " done: " << OutputTail();
  } else {
    const std::string how = WIFEXITED(status)
                                ? absl::StrCat("exited ", WEXITSTATUS(status))
                                : absl::StrCat("was killed by signal ", WTERMSIG(status));
    failed_[static_cast<int>(r.pool)] =
        absl::InternalError(absl::StrCat(what, " ", how, ": ", OutputTail()));
  }
  running_.reset();
}

bool LocalActuator::WaitIdle(absl::Time deadline) {
  while (running_ != nullptr) {
    Reap(deadline);
    if (running_ != nullptr && absl::Now() >= deadline) return false;
  }
  return true;
}

absl::StatusOr<PoolReplicas> LocalActuator::Replicas(PoolRole pool, absl::Time) {
  Reap(absl::InfinitePast());
  absl::Status& failed = failed_[static_cast<int>(pool)];
  if (!failed.ok()) {
    const absl::Status report = failed;
    failed = absl::OkStatus();
    return report;
  }
  PoolReplicas out;
  if (running_ != nullptr && running_->pool == pool) {
    out.spec = running_->to;
    out.ready = std::min(running_->from, running_->to);
    out.changing = true;
    return out;
  }
  auto recorded = RecordedWorkers(pool);
  if (!recorded.ok()) return recorded.status();
  out.spec = *recorded;
  out.ready = *recorded;
  out.changing = running_ != nullptr;
  return out;
}

absl::Status LocalActuator::Scale(PoolRole pool, int64_t replicas, const std::vector<WorkerSample>&,
                                  absl::Time) {
  Reap(absl::InfinitePast());
  if (running_ != nullptr) {
    return absl::UnavailableError(absl::StrCat("./ferry scale ", ScriptPool(running_->pool), " ",
                                               running_->to, " still runs"));
  }
  const int64_t max = pool == PoolRole::kAggregated ? 99 : 49;
  if (replicas < 1 || replicas > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(ScriptPool(pool), " replicas must be 1..", max, ", not ", replicas));
  }
  auto from = RecordedWorkers(pool);
  if (!from.ok()) return from.status();
  if (*from == replicas) return absl::OkStatus();

  const std::string grace = absl::StrCat(absl::ToInt64Seconds(options_.grace), "s");
  std::vector<std::string> args = {options_.ferry_script,    "scale",   ScriptPool(pool),
                                   std::to_string(replicas), "--grace", grace};
  std::vector<std::string> env = {absl::StrCat("FERRY_STATE=", options_.state_dir)};
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "FERRY_STATE=")) env.emplace_back(*e);
  }
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, options_.output_file.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addclosefrom_np(&files, 3);  // no listener of ours in the workers
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);  // the planner blocks SIGTERM for its sigwait
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  const int error =
      posix_spawn(&pid, options_.ferry_script.c_str(), &files, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (error != 0) {
    return Errno(
        absl::StrCat("starting ", options_.ferry_script, " (output to ", options_.output_file, ")"),
        error);
  }
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    // Without a pidfd it cannot be watched: wait for it here rather than lose it.
    const int open_error = errno;
    int status = 0;
    waitpid(pid, &status, 0);
    return Errno("pidfd_open", open_error);
  }
  auto r = std::make_unique<Running>();
  r->pid = pid;
  r->pidfd = pidfd;
  r->pool = pool;
  r->from = *from;
  r->to = replicas;
  const absl::Duration budget =
      replicas > *from ? options_.startup_timeout * (replicas - *from) : options_.grace;
  r->deadline = absl::Now() + budget + options_.script_wait + options_.margin;
  LOG(INFO) << "started " << absl::StrJoin(args, " ") << " (pid " << pid << ", " << ScriptPool(pool)
            << " " << *from << " -> " << replicas << ", deadline in "
            << absl::FormatDuration(r->deadline - absl::Now()) << ", output "
            << options_.output_file << ")";
  running_ = std::move(r);
  return absl::OkStatus();
}

}  // namespace ferry
