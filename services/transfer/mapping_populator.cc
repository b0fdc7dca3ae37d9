#include "services/transfer/mapping_populator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/common/log.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace ferry::transfer {

MappingPopulator::~MappingPopulator() { Stop(); }

void MappingPopulator::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    jobs_.clear();
    thread.swap(thread_);
  }
  if (thread.joinable()) thread.join();
}

uint64_t MappingPopulator::Add(void* address, size_t length) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(address) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(address) + length) / page * page;
  absl::MutexLock lock(&mu_);
  const uint64_t ticket = next_ticket_++;
  if (stopping_ || unsupported_ || end <= begin) return ticket;
  jobs_.push_back(Job{ticket, begin, end});
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  return ticket;
}

void MappingPopulator::Forget(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(
      std::remove_if(jobs_.begin(), jobs_.end(), [&](const Job& j) { return j.ticket == ticket; }),
      jobs_.end());
  const auto done = [this, ticket]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stepping_ != ticket; };
  mu_.Await(absl::Condition(&done));
}

bool MappingPopulator::Idle() const {
  absl::MutexLock lock(&mu_);
  return jobs_.empty() && stepping_ == 0;
}

uint64_t MappingPopulator::populated_bytes() const {
  absl::MutexLock lock(&mu_);
  return populated_;
}

void MappingPopulator::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    const auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !jobs_.empty();
    };
    mu_.Await(absl::Condition(&work));
    if (stopping_) return;
    Job& job = jobs_.front();
    const uint64_t ticket = job.ticket;
    const uintptr_t from = job.next;
    const uintptr_t to = std::min<uintptr_t>(job.end, from + kStepBytes);
    job.next = to;
    if (job.next >= job.end) jobs_.pop_front();
    stepping_ = ticket;
    mu_.Unlock();
    const int result = madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE);
    const int error = errno;
    mu_.Lock();
    stepping_ = 0;
    if (result == 0) {
      populated_ += to - from;
    } else if (error == EINVAL && !unsupported_) {
      unsupported_ = true;  // an older kernel: the pages fault in as they are written
      jobs_.clear();
      LOG(INFO) << "KV transport: this kernel cannot populate peer mappings ahead";
    } else {
      // The mapping went (or is not populatable): drop the rest of it.
      jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(),
                                 [&](const Job& j) { return j.ticket == ticket; }),
                  jobs_.end());
    }
  }
}

}  // namespace ferry::transfer
