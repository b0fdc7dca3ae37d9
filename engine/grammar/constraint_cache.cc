#include "engine/grammar/constraint_cache.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry::grammar {
namespace {

ConstraintCache::CompileFn DefaultCompile(const ConstraintOptions& options) {
  return [options](absl::string_view gbnf, std::shared_ptr<const TokenTrie> vocabulary)
             -> absl::StatusOr<std::shared_ptr<const CompiledConstraint>> {
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> c =
        CompiledConstraint::Create(gbnf, std::move(vocabulary), options);
    if (!c.ok()) return c.status();
    // A start state over the matcher's limits is the grammar's fault, as any other limit.
    if (absl::Status s = (*c)->WarmStart(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the grammar's start state is over the matcher's limits: ", s.message()));
    }
    return c;
  };
}

}  // namespace

ConstraintCache::ConstraintCache(const ConstraintCacheOptions& options, CompileFn compile)
    : options_(options),
      compile_(compile != nullptr ? std::move(compile) : DefaultCompile(options.constraint)) {}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> ConstraintCache::Get(
    const Hash128& hash, absl::string_view gbnf, std::shared_ptr<const TokenTrie> vocabulary,
    ConstraintLookup* lookup) {
  ConstraintLookup ignored;
  if (lookup == nullptr) lookup = &ignored;
  *lookup = ConstraintLookup{};
  if (vocabulary == nullptr) {
    lookup->result = ConstraintLookup::Result::kError;
    return absl::InvalidArgumentError("a constraint needs a vocabulary");
  }
  const Key key{hash, vocabulary.get()};
  std::shared_ptr<Flight> flight;
  bool mine = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      lru_.splice(lru_.end(), lru_, it->second.lru);  // most recently used last
      return it->second.constraint;
    }
    std::shared_ptr<Flight>& slot = flights_[key];
    if (slot == nullptr) {
      slot = std::make_shared<Flight>();
      mine = true;
    }
    flight = slot;
    if (!mine) ++waiters_;
  }
  if (!mine) {
    flight->done.WaitForNotification();
    {
      absl::MutexLock lock(&mu_);
      --waiters_;
    }
    if (!flight->result.ok()) lookup->result = ConstraintLookup::Result::kError;
    return flight->result;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result = compile_(gbnf, vocabulary);
  lookup->compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  lookup->result = result.ok() ? ConstraintLookup::Result::kMiss : ConstraintLookup::Result::kError;
  flight->result = result;
  {
    absl::MutexLock lock(&mu_);
    if (result.ok()) Insert(key, *result);
    flights_.erase(key);
  }
  flight->done.Notify();
  return result;
}

void ConstraintCache::Insert(const Key& key, std::shared_ptr<const CompiledConstraint> constraint) {
  const size_t bytes = constraint->EstimatedBytes();
  if (bytes > options_.max_bytes) return;  // used by its requests, not kept
  while (bytes_ + bytes > options_.max_bytes && !lru_.empty()) {
    auto victim = entries_.find(lru_.front());
    bytes_ -= victim->second.bytes;
    entries_.erase(victim);
    lru_.pop_front();
  }
  lru_.push_back(key);
  Entry& entry = entries_[key];
  entry.constraint = std::move(constraint);
  entry.bytes = bytes;
  entry.lru = std::prev(lru_.end());
  bytes_ += bytes;
}

size_t ConstraintCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

void ConstraintCache::AwaitWaitersForTest(size_t n) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return waiters_ >= n; };
  mu_.Await(absl::Condition(&enough));
}

size_t ConstraintCache::entries() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace ferry::grammar
