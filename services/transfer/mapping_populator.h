// Faults in, in the background, the pages of peer memory mapped into this process.
//
// UCX's shared-memory transports (posix, sysv) map a peer's registered region into the
// initiator's address space when its remote key is unpacked; a put is then a memcpy into that
// mapping, and every page the memcpy reaches for the first time takes a page fault. Measured on
// a decode worker's KV pool: half of a push's time went to those faults until the whole pool had
// been written once. The UCX transport hands each such mapping here; one background thread
// populates it (madvise MADV_POPULATE_WRITE, which maps the pages writable without changing
// their contents) in steps of kStepBytes, oldest mapping first.
//
// Ownership and threading: thread-safe. Add returns a ticket; Forget(ticket) must be called
// before the mapping goes away: it returns once no step touches that mapping any more. The
// destructor (or Stop) ends the thread after the step in progress (mappings still queued are
// dropped).

#ifndef FERRY_SERVICES_TRANSFER_MAPPING_POPULATOR_H_
#define FERRY_SERVICES_TRANSFER_MAPPING_POPULATOR_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ferry::transfer {

class MappingPopulator {
 public:
  static constexpr size_t kStepBytes = size_t{32} << 20;

  MappingPopulator() = default;
  ~MappingPopulator();
  MappingPopulator(const MappingPopulator&) = delete;
  MappingPopulator& operator=(const MappingPopulator&) = delete;

  // Queues [address, address + length) (page-aligned inward). Returns its ticket (never 0).
  uint64_t Add(void* address, size_t length);
  // The mapping is going: it is dropped from the queue, and a step on it finishes first.
  void Forget(uint64_t ticket);
  // Drops what is queued and waits for the step in progress; Add does nothing afterwards.
  void Stop();
  // True when nothing is queued or being populated (for tests).
  bool Idle() const;
  // Bytes populated so far, over all mappings.
  uint64_t populated_bytes() const;

 private:
  struct Job {
    uint64_t ticket = 0;
    uintptr_t next = 0, end = 0;
  };
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t stepping_ ABSL_GUARDED_BY(mu_) = 0;  // the ticket of the step in progress, or 0
  uint64_t populated_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool unsupported_ ABSL_GUARDED_BY(mu_) = false;  // the kernel lacks MADV_POPULATE_WRITE
  std::thread thread_ ABSL_GUARDED_BY(mu_);        // started by the first Add
};

}  // namespace ferry::transfer

#endif  // FERRY_SERVICES_TRANSFER_MAPPING_POPULATOR_H_
