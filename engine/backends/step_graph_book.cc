#include "engine/backends/step_graph_book.h"

namespace ferry {

StepGraphBook::Action StepGraphBook::Next(uint64_t key, uint64_t generation, void** recording,
                                          std::vector<void*>* drop) {
  if (generation != generation_) {
    Clear(drop);
    generation_ = generation;
  }
  auto found = entries_.find(key);
  if (found == entries_.end()) {
    if (lru_.size() >= capacity_) Forget(std::prev(lru_.end()), drop);
    lru_.push_front(Entry{key, State::kSeen, nullptr});
    entries_[key] = lru_.begin();
    ++stats_.run;
    return Action::kRun;
  }
  lru_.splice(lru_.begin(), lru_, found->second);
  Entry& e = *found->second;
  switch (e.state) {
    case State::kRecorded:
      *recording = e.recording;
      ++stats_.replayed;
      return Action::kReplay;
    case State::kSeen:
      e.state = State::kRecording;
      return Action::kRecord;
    case State::kRecording:  // the last kRecord was never answered: try again
      return Action::kRecord;
    case State::kFailed:
      break;
  }
  ++stats_.run;
  return Action::kRun;
}

void StepGraphBook::Recorded(uint64_t key, void* recording) {
  auto found = entries_.find(key);
  if (found == entries_.end()) return;  // (never: the key was just asked for)
  found->second->state = State::kRecorded;
  found->second->recording = recording;
  ++stats_.recorded;
}

void StepGraphBook::NotRecorded(uint64_t key, bool failed) {
  auto found = entries_.find(key);
  if (found == entries_.end()) return;
  found->second->state = failed ? State::kFailed : State::kSeen;
  if (failed) ++stats_.failed;
}

void StepGraphBook::Clear(std::vector<void*>* drop) {
  while (!lru_.empty()) Forget(lru_.begin(), drop);
}

size_t StepGraphBook::recordings() const {
  size_t n = 0;
  for (const Entry& e : lru_) n += e.state == State::kRecorded ? 1 : 0;
  return n;
}

void StepGraphBook::Forget(List::iterator it, std::vector<void*>* drop) {
  if (it->state == State::kRecorded) {
    drop->push_back(it->recording);
    ++stats_.dropped;
  }
  entries_.erase(it->key);
  lru_.erase(it);
}

}  // namespace ferry
