// How a Ferry program runs its absl::Mutex locks.
//
// Debian's Abseil is built with its lock-order (deadlock) detector on: each absl::Mutex
// acquisition records the order of the locks held, which costs about 16 ns and aborts the process
// when two locks were ever taken in both orders. Tests keep it on (a lock-order cycle fails the
// test that reaches it); programs, which have passed those tests, turn it off once at start, so a
// lock on a hot path (the router's KV index, the engine's inbox) costs what an uncontended mutex
// should. services/common's ParseProgramCommandLine calls it; so do the benchmarks' mains.
//
// Thread-safety: call from main before any thread starts.

#ifndef FERRY_ENGINE_COMMON_MUTEX_MODE_H_
#define FERRY_ENGINE_COMMON_MUTEX_MODE_H_

namespace ferry {

void UseProgramMutexMode();

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_MUTEX_MODE_H_
