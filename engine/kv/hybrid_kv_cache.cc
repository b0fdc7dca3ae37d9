#include "engine/kv/hybrid_kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"

namespace ferry {

namespace {

// Gives back every held block of `table` (kNoBlock entries skipped) and empties it.
void ReleaseTable(KvBlockPool& pool, std::vector<BlockId>& table) {
  std::vector<BlockId> held;
  for (BlockId b : table) {
    if (b != kNoBlock) held.push_back(b);
  }
  CHECK(pool.Release(held).ok());
  table.clear();
}

}  // namespace

HybridKvCache::HybridKvCache(KvBlockPool* pool, KvBlockPool* window_pool,
                             const HybridKvCacheOptions& options)
    : pool_(pool),
      window_pool_(window_pool),
      options_(options),
      block_tokens_(pool->layout().block_tokens),
      cache_(pool, options.prefix_cache_bytes) {
  if (window_pool_ != nullptr) {
    // A prefix is of use only as far as its window layers' blocks are cached too: the journal
    // reports both (KvEventJournal).
    window_cache_ = std::make_unique<PrefixCache>(window_pool_, options.window_cache_bytes);
    window_cache_->SetTtl(options.window_cache_ttl,
                          options.clock != nullptr ? options.clock : &RealClock());
  }
}

bool HybridKvCache::CanEverHold(int64_t positions) const {
  return pool_->layout().BlocksFor(positions) <= pool_->num_blocks();
}

void HybridKvCache::SetFreeListener(std::function<void()> listener) {
  if (window_pool_ != nullptr) window_pool_->SetFreeListener(listener);
  pool_->SetFreeListener(std::move(listener));
}

int64_t HybridKvCache::FirstWindowBlock(int64_t position) const {
  return std::max<int64_t>(0, position + 1 - options_.max_window) / block_tokens_;
}

int64_t HybridKvCache::Shortfall(int64_t need) const {
  int64_t short_of = std::max<int64_t>(0, need - pool_->num_free());
  if (window_pool_ != nullptr) {
    short_of = std::max<int64_t>(short_of, need - window_pool_->num_free());
  }
  return short_of;
}

int64_t HybridKvCache::EvictFor(int64_t need) {
  int64_t evicted = 0;
  if (need > pool_->num_free()) evicted += cache_.Evict(need - pool_->num_free());
  if (window_pool_ != nullptr && need > window_pool_->num_free()) {
    evicted += window_cache_->Evict(need - window_pool_->num_free());
  }
  return evicted;
}

void HybridKvCache::Grow(KvTables* tables, int64_t need) {
  auto more = pool_->Allocate(need);
  CHECK(more.ok());
  tables->blocks.insert(tables->blocks.end(), more->begin(), more->end());
  if (window_pool_ != nullptr) {
    auto window = window_pool_->Allocate(need);
    CHECK(window.ok());
    tables->window_blocks.insert(tables->window_blocks.end(), window->begin(), window->end());
  }
}

void HybridKvCache::Release(KvTables* tables, bool trim) {
  ReleaseTable(*pool_, tables->blocks);
  if (trim) cache_.TrimToCap();
  if (window_pool_ != nullptr) {
    ReleaseTable(*window_pool_, tables->window_blocks);
    if (trim) window_cache_->TrimToCap();
  }
  tables->window_begin = 0;
}

void HybridKvCache::Truncate(KvTables* tables, int64_t positions) {
  const int64_t keep = pool_->layout().BlocksFor(positions);
  std::vector<BlockId> spare;
  while (static_cast<int64_t>(tables->blocks.size()) > keep) {
    spare.push_back(tables->blocks.back());
    tables->blocks.pop_back();
  }
  if (!spare.empty()) ReleaseTable(*pool_, spare);
  if (window_pool_ != nullptr && static_cast<int64_t>(tables->window_blocks.size()) > keep) {
    std::vector<BlockId> spare_window(tables->window_blocks.begin() + keep,
                                      tables->window_blocks.end());
    tables->window_blocks.resize(keep);
    ReleaseTable(*window_pool_, spare_window);
  }
}

void HybridKvCache::Slide(KvTables* tables, int64_t computed) {
  if (window_pool_ == nullptr) return;
  const int64_t first = std::min<int64_t>(FirstWindowBlock(computed), tables->window_blocks.size());
  for (; tables->window_begin < first; ++tables->window_begin) {
    BlockId& b = tables->window_blocks[tables->window_begin];
    if (b == kNoBlock) continue;
    CHECK(window_pool_->Release(absl::MakeConstSpan(&b, 1)).ok());
    b = kNoBlock;
  }
}

void HybridKvCache::Admitted(KvTables* tables, int64_t computed) {
  if (window_pool_ == nullptr) return;
  // Window blocks a replay rebuilds are never cached (the first of them may hold positions no
  // replay made exact).
  tables->window_begin = FirstWindowBlock(computed);
  tables->window_cached = static_cast<int64_t>(tables->blocks.size());
}

bool HybridKvCache::Share(const KvTables& from, int64_t positions, KvTables* into) {
  const int64_t full = positions / block_tokens_;
  const bool partial = positions % block_tokens_ != 0;
  // The partial block's copies, in each pool.
  auto copy_of = [&](KvBlockPool& pool, PrefixCache& cache) -> BlockId {
    if (!partial) return kNoBlock;
    auto b = pool.Allocate(1);
    if (!b.ok() && cache.Evict(1) > 0) b = pool.Allocate(1);
    return b.ok() ? (*b)[0] : kNoBlock;
  };
  const BlockId copy = copy_of(*pool_, cache_);
  const BlockId window_copy =
      window_pool_ != nullptr ? copy_of(*window_pool_, *window_cache_) : kNoBlock;
  const bool copied =
      !partial || (copy != kNoBlock && (window_pool_ == nullptr || window_copy != kNoBlock));
  if (!copied) {
    if (copy != kNoBlock) CHECK(pool_->Release(absl::MakeConstSpan(&copy, 1)).ok());
    if (window_copy != kNoBlock) {
      CHECK(window_pool_->Release(absl::MakeConstSpan(&window_copy, 1)).ok());
    }
    return false;
  }
  into->blocks.assign(from.blocks.begin(), from.blocks.begin() + full);
  CHECK(pool_->AddRef(into->blocks).ok());
  if (partial) {
    CHECK(pool_->CopyBlock(from.blocks[full], copy).ok());
    into->blocks.push_back(copy);
  }
  if (window_pool_ != nullptr) {
    // The window blocks still held (full ones shared, the partial one copied).
    into->window_blocks.assign(from.window_blocks.begin(), from.window_blocks.begin() + full);
    std::vector<BlockId> shared;
    for (BlockId b : into->window_blocks) {
      if (b != kNoBlock) shared.push_back(b);
    }
    CHECK(window_pool_->AddRef(shared).ok());
    if (partial) {
      CHECK(window_pool_->CopyBlock(from.window_blocks[full], window_copy).ok());
      into->window_blocks.push_back(window_copy);
    }
    into->window_begin = std::min<int64_t>(from.window_begin, full);
    into->window_cached = std::min<int64_t>(from.window_cached, full);
  }
  return true;
}

void HybridKvCache::TakeCachedPrefix(absl::Span<const Hash128> hashes, int64_t full,
                                     KvTables* tables, WindowReplay* replay) {
  full = std::min<int64_t>(full, static_cast<int64_t>(hashes.size()));
  if (window_pool_ == nullptr) {
    tables->blocks = cache_.Lookup(hashes.subspan(0, full));
    return;
  }
  // k cached blocks are of use when the window cache also holds the window layers' blocks
  // that the row after them (at k * block_tokens) sees: blocks [FirstWindowBlock, k).
  int64_t longest = 0;
  while (longest < full && cache_.Contains(hashes[longest])) ++longest;
  auto window_cached = [&](int64_t k) {
    for (int64_t i = FirstWindowBlock(k * block_tokens_); i < k; ++i) {
      if (!window_cache_->Contains(hashes[i])) return false;
    }
    return true;
  };
  int64_t k = longest;
  while (k > 0 && !window_cached(k)) --k;
  if (replay != nullptr) {
    replay->longest = longest;
    replay->windowed = k;
  }
  if (replay != nullptr && k < longest) {
    // The whole prefix with a replay of its last positions, when that computes fewer positions
    // than starting after the k blocks whose window blocks are cached.
    const int64_t end = longest * block_tokens_;
    const int64_t exact = options_.exact_replay_tokens;
    const bool bounded = options_.bounded_replay && options_.bounded_replay_tokens < exact;
    const int64_t from =
        std::max<int64_t>(0, end - (bounded ? options_.bounded_replay_tokens : exact));
    const int64_t first = from / block_tokens_;
    if (end - from < (longest - k) * block_tokens_ &&
        MakeRoom(window_pool_, window_cache_.get(), longest - first)) {
      auto fresh = window_pool_->Allocate(longest - first);
      CHECK(fresh.ok());
      tables->blocks = cache_.Lookup(hashes.subspan(0, longest));
      CHECK_EQ(static_cast<int64_t>(tables->blocks.size()), longest);
      tables->window_blocks.assign(first, kNoBlock);
      tables->window_blocks.insert(tables->window_blocks.end(), fresh->begin(), fresh->end());
      replay->from = from;
      replay->end = end;
      replay->approximate = bounded && from > 0;
      return;
    }
    // (Making room may have evicted window blocks k needed.)
    while (k > 0 && !window_cached(k)) --k;
  }
  tables->blocks = cache_.Lookup(hashes.subspan(0, k));
  CHECK_EQ(static_cast<int64_t>(tables->blocks.size()), k);
  const int64_t begin = FirstWindowBlock(k * block_tokens_);
  tables->window_blocks.assign(begin, kNoBlock);
  const std::vector<BlockId> window = window_cache_->LookupAll(hashes.subspan(begin, k - begin));
  CHECK_EQ(static_cast<int64_t>(window.size()), k - begin);
  tables->window_blocks.insert(tables->window_blocks.end(), window.begin(), window.end());
}

void HybridKvCache::Cache(absl::Span<const Hash128> hashes, KvTables* tables, int64_t from,
                          int64_t to) {
  if (from < to) {
    cache_.Insert(hashes.subspan(from, to - from),
                  absl::MakeConstSpan(tables->blocks).subspan(from, to - from));
  }
  if (window_pool_ == nullptr) return;
  for (int64_t i = tables->window_cached; i < to; ++i) {
    const BlockId b = tables->window_blocks[i];
    if (b != kNoBlock) window_cache_->Insert({hashes[i]}, absl::MakeConstSpan(&b, 1));
  }
  tables->window_cached = std::max(tables->window_cached, to);
}

void HybridKvCache::CacheImported(absl::Span<const Hash128> hashes,
                                  absl::Span<const BlockId> blocks) {
  cache_.Insert(hashes, blocks);
}

void HybridKvCache::ReleaseFull(std::vector<BlockId>* blocks) {
  if (blocks->empty()) return;
  CHECK(pool_->Release(*blocks).ok());
  blocks->clear();
  cache_.TrimToCap();
}

void HybridKvCache::EvictAll() {
  cache_.Evict(cache_.blocks());
  if (window_cache_ != nullptr) window_cache_->Evict(window_cache_->blocks());
}

int64_t HybridKvCache::ExpireWindowBlocks() {
  return window_cache_ != nullptr ? window_cache_->Expire() : 0;
}

int64_t HybridKvCache::window_cached_blocks() const {
  return window_cache_ != nullptr ? window_cache_->blocks() : 0;
}

void HybridKvCache::PublishEvents(KvEventJournal* journal) {
  const int64_t dropped =
      cache_.dropped_events() + (window_cache_ != nullptr ? window_cache_->dropped_events() : 0);
  if (dropped != dropped_events_) {
    // A cache lost events (more in one step than it keeps): the journal starts over from what
    // the caches hold.
    dropped_events_ = dropped;
    cache_.TakeEvents();
    if (window_cache_ != nullptr) window_cache_->TakeEvents();
    journal->Reset(cache_.Hashes(),
                   window_cache_ != nullptr ? window_cache_->Hashes() : std::vector<Hash128>{});
    return;
  }
  journal->Append(cache_.TakeEvents(), /*window=*/false);
  if (window_cache_ != nullptr) journal->Append(window_cache_->TakeEvents(), /*window=*/true);
}

bool HybridKvCache::MakeRoom(KvBlockPool* pool, PrefixCache* cache, int64_t n) {
  while (pool->num_free() < n) {
    if (cache->Evict(n - pool->num_free()) == 0) return false;
  }
  return true;
}

absl::StatusOr<KvReservation> HybridKvCache::ReserveImport(absl::Span<const Hash128> hashes,
                                                           int64_t max_fresh) {
  // The full-attention pool only: the cached prefix, then as many fresh blocks as may be had.
  KvReservation out;
  out.blocks = cache_.Lookup(hashes);
  out.cached_blocks = static_cast<int64_t>(out.blocks.size());
  int64_t fresh = std::min<int64_t>(static_cast<int64_t>(hashes.size()) - out.cached_blocks,
                                    std::max<int64_t>(0, max_fresh));
  while (pool_->num_free() < fresh && cache_.Evict(fresh - pool_->num_free()) > 0) {
  }
  fresh = std::min(fresh, pool_->num_free());
  if (fresh <= 0 && out.cached_blocks < static_cast<int64_t>(hashes.size())) {
    ReleaseTable(*pool_, out.blocks);
    return absl::ResourceExhaustedError(absl::StrCat("no KV block is free to import into (",
                                                     pool_->num_blocks(), " blocks, ",
                                                     cache_.blocks(), " cached)"));
  }
  auto blocks = pool_->Allocate(fresh);
  CHECK(blocks.ok());
  out.blocks.insert(out.blocks.end(), blocks->begin(), blocks->end());
  return out;
}

absl::StatusOr<KvReservation> HybridKvCache::Reserve(absl::Span<const Hash128> hashes,
                                                     int64_t positions) {
  KvReservation out;
  const int64_t total = pool_->layout().BlocksFor(positions);
  // The prefix blocks must leave at least one position to compute (as a sequence's admission).
  const int64_t full = std::min<int64_t>(static_cast<int64_t>(hashes.size()),
                                         std::max<int64_t>(0, positions - 1) / block_tokens_);
  KvTables prefix;
  TakeCachedPrefix(hashes, full, &prefix);
  out.blocks = std::move(prefix.blocks);
  out.window_blocks = std::move(prefix.window_blocks);
  out.cached_blocks = static_cast<int64_t>(out.blocks.size());
  const int64_t fresh = total - out.cached_blocks;
  // The window layers need blocks only from the one the next row (at `positions`) sees; the
  // cached prefix's window blocks come along, the entries between stay kNoBlock.
  const int64_t window_from =
      window_pool_ == nullptr ? total
                              : std::max<int64_t>(out.cached_blocks, FirstWindowBlock(positions));
  const int64_t window_fresh = total - window_from;
  bool ok = positions >= 0 && total <= pool_->num_blocks() && MakeRoom(pool_, &cache_, fresh);
  if (ok && window_pool_ != nullptr) {
    ok = window_fresh <= window_pool_->num_blocks() &&
         MakeRoom(window_pool_, window_cache_.get(), window_fresh);
  }
  absl::StatusOr<std::vector<BlockId>> blocks = std::vector<BlockId>{};
  absl::StatusOr<std::vector<BlockId>> window = std::vector<BlockId>{};
  if (ok) blocks = pool_->Allocate(fresh);
  if (ok && blocks.ok() && window_pool_ != nullptr) window = window_pool_->Allocate(window_fresh);
  if (!ok || !blocks.ok() || !window.ok()) {
    if (blocks.ok()) CHECK(pool_->Release(*blocks).ok());
    ReleaseTable(*pool_, out.blocks);
    if (window_pool_ != nullptr) ReleaseTable(*window_pool_, out.window_blocks);
    return absl::ResourceExhaustedError(
        absl::StrCat("the KV pool cannot reserve ", total, " blocks now (", pool_->num_free(),
                     " of ", pool_->num_blocks(), " free, ", cache_.blocks(), " cached)"));
  }
  out.blocks.insert(out.blocks.end(), blocks->begin(), blocks->end());
  if (window_pool_ != nullptr) {
    out.window_blocks.resize(window_from, kNoBlock);
    out.window_blocks.insert(out.window_blocks.end(), window->begin(), window->end());
  }
  return out;
}

}  // namespace ferry
