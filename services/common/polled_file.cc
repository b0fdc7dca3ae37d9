#include "services/common/polled_file.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace ferry {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return text.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PolledFile>> PolledFile::Start(PolledFileOptions options,
                                                              Apply apply) {
  if (options.path.empty()) return absl::InvalidArgumentError("PolledFile: no path");
  if (options.interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PolledFile: a negative interval");
  }
  std::unique_ptr<PolledFile> file(new PolledFile(std::move(options), std::move(apply)));
  {
    absl::MutexLock lock(&file->poll_mu_);
    ASSIGN_OR_RETURN(std::string content, ReadWholeFile(file->options_.path));
    if (absl::Status s = file->apply_(content); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(file->options_.path, ": ", s.message()));
    }
    file->last_ = std::move(content);
  }
  if (file->options_.interval > absl::ZeroDuration()) {
    file->thread_ = std::thread([f = file.get()] { f->Run(); });
  }
  return file;
}

PolledFile::PolledFile(PolledFileOptions options, Apply apply)
    : options_(std::move(options)), apply_(std::move(apply)) {
  if (options_.registry != nullptr) {
    auto& family = prometheus::BuildCounter()
                       .Name("ferry_secret_reloads_total")
                       .Help(
                           "New contents of polled secret files: applied, or rejected (a bad "
                           "or unreadable file; the old content stays in force).")
                       .Register(*options_.registry);
    applied_ = &family.Add({{"secret", options_.name}, {"result", "applied"}});
    rejected_ = &family.Add({{"secret", options_.name}, {"result", "rejected"}});
  }
}

PolledFile::~PolledFile() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status PolledFile::Poll(bool force) {
  absl::MutexLock lock(&poll_mu_);
  absl::StatusOr<std::string> content = ReadWholeFile(options_.path);
  if (!content.ok()) {
    // Logged once until the file reads again; the content in force stays.
    const std::string error(content.status().message());
    if (force || !last_failed_ || last_ != error) {
      LOG(ERROR) << options_.name << ": " << content.status() << "; the current one stays";
      if (rejected_ != nullptr) rejected_->Increment();
    }
    last_failed_ = true;
    last_ = error;
    return content.status();
  }
  if (!force && !last_failed_ && *content == last_) return absl::OkStatus();
  last_failed_ = false;
  last_ = *content;
  absl::Status applied = apply_(*content);
  if (!applied.ok()) {
    LOG(ERROR) << options_.name << ": the new content of " << options_.path
               << " is refused (the current one stays): " << applied;
    if (rejected_ != nullptr) rejected_->Increment();
    return applied;
  }
  LOG(INFO) << options_.name << ": applied the new content of " << options_.path;
  if (applied_ != nullptr) applied_->Increment();
  return absl::OkStatus();
}

void PolledFile::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.interval);
    if (stopping_) break;
    mu_.Unlock();
    Poll().IgnoreError();  // logged and counted by Poll
    mu_.Lock();
  }
}

}  // namespace ferry
