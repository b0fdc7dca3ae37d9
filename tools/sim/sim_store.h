// The shared KV store in the discrete-event simulator: block hash -> the block's bytes (the
// simulated KV's tiny blocks, so that KV read back is checked like any other), bounded by a
// block count with least-recently-used eviction, as a ferry-kvstore node's capacity would bound
// it. Reads take the store link's time (SimLinks); writes are free (the real workers write
// asynchronously, off the request path).
//
// Thread-compatible.

#ifndef FERRY_TOOLS_SIM_SIM_STORE_H_
#define FERRY_TOOLS_SIM_SIM_STORE_H_

#include <cstdint>
#include <list>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"

namespace ferry {

class SimStore {
 public:
  explicit SimStore(int64_t max_blocks) : max_blocks_(max_blocks) {}

  void Put(const Hash128& hash, std::string bytes);
  // How many leading hashes of `hashes` it holds.
  int64_t Prefix(absl::Span<const Hash128> hashes) const;
  // The block's bytes (and it becomes the most recently used), or null.
  const std::string* Get(const Hash128& hash);

  int64_t blocks() const { return static_cast<int64_t>(map_.size()); }
  int64_t evicted() const { return evicted_; }

 private:
  struct Entry {
    std::string bytes;
    std::list<Hash128>::iterator lru;
  };
  const int64_t max_blocks_;
  std::list<Hash128> lru_;  // front: most recent
  absl::flat_hash_map<Hash128, Entry> map_;
  int64_t evicted_ = 0;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_SIM_SIM_STORE_H_
