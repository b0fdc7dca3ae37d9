// ConstraintCache: compiled grammars (CompiledConstraint) by (grammar hash, vocabulary), so that
// every request of a grammar after the first skips the parse and reuses the grammar's warm mask
// cache. A worker keeps one; the router's constraint carries the hash (XXH3-128 of the GBNF
// text, common.proto's OutputConstraint), which the caller has checked against the text.
//
// Bounded by bytes: each entry counts CompiledConstraint::EstimatedBytes() (its IR and its mask
// cache when full; the vocabulary is shared and not counted), and the least recently used
// entries go when the total would exceed max_bytes. A grammar larger than max_bytes alone is
// compiled and returned but not kept. An evicted constraint lives on in the requests that hold
// it, until they end.
//
// Single flight: concurrent Gets of one uncompiled key wait for one compile, run on the first
// caller's thread with no lock held; the others block until it is done (a compile is bounded by
// the GBNF limits, so the wait is too). The compile warms the start state's masks
// (CompiledConstraint::WarmStart), so a grammar's first token does not compute them on the engine
// thread.
//
// Errors are not cached: a bad grammar (InvalidArgument with the parser's message) or one over a
// limit (InvalidArgument too, a start state over the matcher's limits included) is reported to the
// caller that compiled it and to the callers waiting on that compile, and the next Get compiles it
// again. The router validates grammars before they reach a worker, so errors here are rare, and
// keeping them would let bad grammars push good ones out.
//
// Thread-safe.

#ifndef FERRY_ENGINE_GRAMMAR_CONSTRAINT_CACHE_H_
#define FERRY_ENGINE_GRAMMAR_CONSTRAINT_CACHE_H_

#include <cstddef>
#include <functional>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/common/hash128.h"
#include "engine/grammar/compiled_constraint.h"
#include "engine/grammar/token_trie.h"

namespace ferry::grammar {

struct ConstraintCacheOptions {
  size_t max_bytes = size_t{1} << 30;
  // The compile's limits (GBNF text bytes and IR sizes, matcher and mask cache bounds).
  ConstraintOptions constraint;
};

// How one Get was served, for metrics.
struct ConstraintLookup {
  enum class Result {
    kHit,    // from the cache, or from another caller's compile it waited for
    kMiss,   // compiled by this call
    kError,  // the compile (this call's or the one it waited for) failed
  };
  Result result = Result::kHit;
  // The compile's wall time when this call compiled (kMiss, or kError of its own compile), else 0.
  double compile_seconds = 0;
};

class ConstraintCache {
 public:
  // What a miss runs (a test seam; the default: CompiledConstraint::Create, then WarmStart).
  using CompileFn = std::function<absl::StatusOr<std::shared_ptr<const CompiledConstraint>>(
      absl::string_view gbnf, std::shared_ptr<const TokenTrie> vocabulary)>;

  explicit ConstraintCache(const ConstraintCacheOptions& options, CompileFn compile = nullptr);

  // The constraint of `gbnf`, whose XXH3-128 is `hash`, for `vocabulary` (non-null). `lookup`
  // (optional) receives how it was served.
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Get(
      const Hash128& hash, absl::string_view gbnf, std::shared_ptr<const TokenTrie> vocabulary,
      ConstraintLookup* lookup = nullptr);

  // The estimated bytes and the number of the entries held now.
  size_t bytes() const;
  size_t entries() const;
  const ConstraintCacheOptions& options() const { return options_; }

  // Test seam: returns once `n` callers wait on another caller's compile.
  void AwaitWaitersForTest(size_t n) const;

 private:
  struct Key {
    Hash128 hash;
    // An entry holds its vocabulary (CompiledConstraint::vocabulary), so the address is not
    // reused while the entry exists.
    const TokenTrie* vocabulary = nullptr;
    friend bool operator==(const Key& a, const Key& b) {
      return a.hash == b.hash && a.vocabulary == b.vocabulary;
    }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.hash, k.vocabulary);
    }
  };
  struct Entry {
    std::shared_ptr<const CompiledConstraint> constraint;
    size_t bytes = 0;
    std::list<Key>::iterator lru;  // its place in lru_
  };
  // A compile in progress: `result` is written once, before `done` is notified.
  struct Flight {
    absl::Notification done;
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result;
  };

  // Keeps `constraint` (unless it alone is over the budget) and evicts the least recently used
  // entries beyond max_bytes.
  void Insert(const Key& key, std::shared_ptr<const CompiledConstraint> constraint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ConstraintCacheOptions options_;
  const CompileFn compile_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);  // least recently used first
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<Key, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  size_t waiters_ ABSL_GUARDED_BY(mu_) = 0;  // callers waiting on a flight
};

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_CONSTRAINT_CACHE_H_
