// StepGraphBook: the bookkeeping of a backend that records steps (backend.h "Recorded steps"; the
// CUDA backend's graphs): for each step key, whether the step runs as it comes, is recorded, or
// is replayed, and which recordings are kept.
//
// A key's first step runs as it comes (its buffers grow to their size then, outside any
// recording), its second is recorded, and later ones replay the recording. Recordings hold
// addresses of the backend's buffers: when one of those is remade (the backend's `generation`
// changes), every recording is dropped and every key starts over. At most `capacity` keys are
// remembered; the least recently used is forgotten first, its recording dropped. A key whose
// recording failed runs as it comes from then on (until it is forgotten).
//
// Recordings are opaque handles (a cudaGraphExec_t); the book never destroys one: every handle
// it lets go of is handed back in `drop` for the backend to destroy.
//
// Thread-compatible: the thread that drives the backend owns it.

#ifndef FERRY_ENGINE_BACKENDS_STEP_GRAPH_BOOK_H_
#define FERRY_ENGINE_BACKENDS_STEP_GRAPH_BOOK_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace ferry {

class StepGraphBook {
 public:
  enum class Action { kRun, kRecord, kReplay };
  struct Stats {
    int64_t run = 0;       // steps run as they came
    int64_t recorded = 0;  // recordings made
    int64_t replayed = 0;  // steps replayed
    int64_t failed = 0;    // recordings that failed
    int64_t dropped = 0;   // recordings let go (evicted, or their buffers remade)
  };

  explicit StepGraphBook(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // What to do with a step of `key` while the backend's buffers are at `generation`; with
  // kReplay, *recording is the key's. Handles the book lets go of are appended to `drop`.
  Action Next(uint64_t key, uint64_t generation, void** recording, std::vector<void*>* drop);
  // After kRecord: the recording made, kept for the key.
  void Recorded(uint64_t key, void* recording);
  // After kRecord: no recording was made; `failed` (the step cannot be recorded): the key runs
  // as it comes from now on; else it is recorded again next time.
  void NotRecorded(uint64_t key, bool failed);
  // Lets go of every recording (the backend is being destroyed).
  void Clear(std::vector<void*>* drop);

  const Stats& stats() const { return stats_; }
  size_t recordings() const;

 private:
  enum class State { kSeen, kRecording, kRecorded, kFailed };
  struct Entry {
    uint64_t key = 0;
    State state = State::kSeen;
    void* recording = nullptr;
  };
  using List = std::list<Entry>;

  void Forget(List::iterator it, std::vector<void*>* drop);

  const size_t capacity_;
  uint64_t generation_ = 0;
  List lru_;  // most recently used first
  std::unordered_map<uint64_t, List::iterator> entries_;
  Stats stats_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_STEP_GRAPH_BOOK_H_
