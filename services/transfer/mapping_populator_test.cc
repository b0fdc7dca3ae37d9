#include "services/transfer/mapping_populator.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ferry::transfer {
namespace {

constexpr size_t kBytes = size_t{64} << 20;

// Page faults this thread took so far.
long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// A shared-memory object written through one mapping (the owner's), mapped a second time (the
// peer's view, as UCX's posix transport maps a remote region).
struct SharedRegion {
  SharedRegion() {
    fd = memfd_create("mapping_populator_test", 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kBytes), 0);
    owner = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    std::memset(owner, 0x5a, kBytes);
  }
  void* Map() { return mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); }
  ~SharedRegion() {
    munmap(owner, kBytes);
    close(fd);
  }
  int fd = -1;
  void* owner = nullptr;
};

bool WaitIdle(const MappingPopulator& p) {
  for (int i = 0; i < 2000 && !p.Idle(); ++i) absl::SleepFor(absl::Milliseconds(5));
  return p.Idle();
}

TEST(MappingPopulatorTest, APopulatedMappingIsWrittenWithoutPageFaults) {
  SharedRegion region;
  const long pages = static_cast<long>(kBytes / sysconf(_SC_PAGESIZE));
  // Without it, every page of a fresh mapping faults on its first write.
  void* plain = region.Map();
  long before = MinorFaults();
  std::memset(plain, 1, kBytes);
  EXPECT_GE(MinorFaults() - before, pages / 2);
  munmap(plain, kBytes);

  MappingPopulator populator;
  void* view = region.Map();
  populator.Add(view, kBytes);
  ASSERT_TRUE(WaitIdle(populator));
  EXPECT_EQ(populator.populated_bytes(), kBytes);
  EXPECT_EQ(static_cast<unsigned char*>(view)[12345], 1) << "the contents are unchanged";
  before = MinorFaults();
  std::memset(view, 2, kBytes);
  EXPECT_LT(MinorFaults() - before, pages / 100);
  EXPECT_EQ(static_cast<unsigned char*>(region.owner)[kBytes - 1], 2);
  munmap(view, kBytes);
}

TEST(MappingPopulatorTest, AForgottenMappingIsLeftAloneAndTheQueueGoesOn) {
  SharedRegion region;
  MappingPopulator populator;
  void* first = region.Map();
  void* second = region.Map();
  const uint64_t a = populator.Add(first, kBytes);
  const uint64_t b = populator.Add(second, kBytes);
  EXPECT_NE(a, b);
  populator.Forget(a);  // it may be mid-step: Forget returns after that step
  munmap(first, kBytes);
  ASSERT_TRUE(WaitIdle(populator));
  EXPECT_GE(populator.populated_bytes(), kBytes);  // all of the second, maybe a step of the first
  EXPECT_LE(populator.populated_bytes(), kBytes + MappingPopulator::kStepBytes);
  populator.Forget(b);  // done already: nothing to wait for
  munmap(second, kBytes);
  // Unaligned and empty ranges are trimmed to whole pages, never beyond.
  populator.Add(static_cast<char*>(region.owner) + 1, 100);
  EXPECT_TRUE(WaitIdle(populator));
}

TEST(MappingPopulatorTest, DestroyedWithWorkQueued) {
  SharedRegion region;
  void* view = region.Map();
  {
    MappingPopulator populator;
    populator.Add(view, kBytes);
    populator.Add(view, kBytes);
  }  // stops after the step in progress
  munmap(view, kBytes);
}

}  // namespace
}  // namespace ferry::transfer
