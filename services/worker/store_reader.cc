#include "services/worker/store_reader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/block_hash.h"
#include "engine/common/log.h"
#include "engine/prompt_image.h"

namespace ferry {

StoreReader::StoreReader(kv::KvClient* client, Engine* engine, KvBlockPool* pool,
                         const Hash128& fingerprint, WorkerMetrics* metrics,
                         const StoreReaderOptions& options)
    : client_(client),
      engine_(engine),
      pool_(pool),
      fingerprint_(fingerprint),
      metrics_(metrics),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : &RealClock()) {
  staging_ = options_.staging;
  if (staging_ == nullptr) {
    auto in_place = KvStaging::InPlace(pool_);
    CHECK_OK(in_place.status());
    own_staging_ = *std::move(in_place);
    staging_ = own_staging_.get();
  }
  CHECK(&staging_->pool() == pool_) << "the store reader's staging is another pool's";
  if (options_.transport != nullptr) {
    const uint64_t base = options_.pool_region.address;
    const MemorySpan host = staging_->region();
    const auto address = reinterpret_cast<uint64_t>(host.address);
    if (address < base || address + host.length > base + options_.pool_region.length) {
      LOG(ERROR) << "store reads: the blocks' host memory is not in the region registered with "
                    "the KV transport; reads come in the Get streams";
    } else {
      transfer::PeerDescriptor d;
      d.kind = std::string(options_.transport->kind());
      d.address = options_.transport->address();
      d.regions.push_back(options_.pool_region);
      destination_ = std::move(d);
    }
  }
  for (int i = 0; i < std::max(1, options_.threads); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

StoreReader::~StoreReader() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

void StoreReader::ReleaseImports(KvBlockPool& pool, EngineRequest& request) {
  if (request.role == EngineRole::kDecodeOnly || request.imported_blocks.empty()) return;
  CHECK_OK(pool.Release(request.imported_blocks));
  request.imported_blocks.clear();
  request.imported_cached_blocks = 0;
}

void StoreReader::Read(EngineRequest request, absl::Time deadline, Done done, StoreHint hint) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ && tasks_.size() < options_.max_queued) {
      tasks_.push_back(Task{std::move(request), deadline, std::move(done), hint});
      cv_.Signal();
      return;
    }
  }
  metrics_->StoreLookup("skipped");
  StoreRead read;
  read.result = "skipped";
  done(std::move(request), read);
}

int64_t StoreReader::quarantined_blocks() {
  absl::MutexLock lock(&mu_);
  ReleaseQuarantined();  // (the reader's threads also do, at each one's time)
  return QuarantinedLocked();
}

absl::Duration StoreReader::ReleaseQuarantined() {
  const absl::Duration now = clock_->Monotonic();
  absl::Duration next = absl::InfiniteDuration();
  bool released = false;
  for (size_t i = 0; i < quarantine_.size();) {
    if (quarantine_[i].until <= now) {
      CHECK_OK(pool_->Release(quarantine_[i].blocks));
      quarantine_[i].landing.reset();  // its slots: no failed node writes them any more
      quarantine_[i] = std::move(quarantine_.back());
      quarantine_.pop_back();
      released = true;
    } else {
      next = std::min(next, quarantine_[i].until - now);
      ++i;
    }
  }
  if (released) metrics_->StoreQuarantinedBlocks(QuarantinedLocked());
  return next;
}

int64_t StoreReader::QuarantinedLocked() const {
  int64_t n = 0;
  for (const Quarantine& q : quarantine_) n += static_cast<int64_t>(q.blocks.size());
  return n;
}

void StoreReader::Loop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        const absl::Duration next = ReleaseQuarantined();
        if (!tasks_.empty()) break;
        // Stopping: the reads are done; quarantined blocks still wait for their time.
        if (stopping_ && quarantine_.empty()) return;
        cv_.WaitWithTimeout(&mu_, next);
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    const StoreRead read = Run(task.request, task.deadline, task.hint);
    metrics_->StoreLookup(read.result);
    if (read.blocks > 0) {
      const char* path = read.by_transport ? "transport" : "stream";
      metrics_->StoreRead(read.bytes, read.seconds, path);
      std::atomic<bool>& logged = read.by_transport ? logged_transport_ : logged_stream_;
      if (!logged.exchange(true)) {
        LOG(INFO) << "store reads: the first by "
                  << (read.by_transport
                          ? absl::StrCat("the KV transport (", destination_->kind,
                                         "), straight into the pool's blocks")
                          : std::string("the Get stream, copied into the pool's blocks"))
                  << ": " << read.blocks << " blocks in " << read.seconds * 1e3 << " ms";
      }
    }
    task.done(std::move(task.request), read);
  }
}

transfer::PeerDescriptor StoreReader::Describe(absl::Span<const MemorySpan> spans) const {
  transfer::PeerDescriptor d = *destination_;
  const uint64_t base = d.regions[0].address;
  for (const MemorySpan& s : spans) {
    d.block_slices.push_back({0, reinterpret_cast<uint64_t>(s.address) - base, s.length});
  }
  return d;
}

absl::StatusOr<KvReservation> StoreReader::Reserve(std::vector<Hash128> hashes, int64_t max_fresh) {
  // Shared with the engine's callback, which may come after this read gave up waiting: it then
  // gives the blocks back itself.
  struct Answer {
    absl::Mutex mu;
    absl::CondVar cv;
    bool answered ABSL_GUARDED_BY(mu) = false;
    bool abandoned ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<KvReservation> reservation ABSL_GUARDED_BY(mu) = absl::UnknownError("no answer");
  };
  auto answer = std::make_shared<Answer>();
  KvBlockPool* pool = pool_;
  engine_->ReserveImport(std::move(hashes), max_fresh,
                         [answer, pool](absl::StatusOr<KvReservation> got) {
                           absl::MutexLock lock(&answer->mu);
                           if (answer->abandoned) {
                             if (got.ok()) {
                               CHECK_OK(pool->Release(got->blocks));
                             }
                             return;
                           }
                           answer->reservation = std::move(got);
                           answer->answered = true;
                           answer->cv.SignalAll();
                         });
  absl::MutexLock lock(&answer->mu);
  const absl::Time give_up = absl::Now() + options_.reserve_timeout;
  while (!answer->answered && !answer->cv.WaitWithDeadline(&answer->mu, give_up)) {
  }
  if (!answer->answered) {
    answer->abandoned = true;
    return absl::DeadlineExceededError("the engine did not answer the reservation in time");
  }
  return std::move(answer->reservation);
}

int64_t StoreReader::StorePrefix(absl::Span<const Hash128> chain, int64_t local,
                                 const StoreHint& hint) {
  const int64_t full = static_cast<int64_t>(chain.size());
  if (hint.probed >= 0 && (hint.prefix < hint.probed || hint.probed >= full)) {
    // The router's probe answers it: the store's run ends within what it asked (or covers this
    // whole chain).
    metrics_->StoreExistence("router");
    return std::min(hint.prefix, full);
  }
  // Not asked, or every block asked was there and this chain is longer (the router probed
  // fewer blocks): ask from where the cache and the hint leave off.
  const int64_t known = hint.probed >= 0 ? hint.probed : 0;
  const int64_t from = std::max(local, known);
  metrics_->StoreExistence("own");
  return from + client_->Exists(chain.subspan(from), fingerprint_).prefix;
}

StoreRead StoreReader::Run(EngineRequest& request, absl::Time deadline, const StoreHint& hint) {
  const auto start = std::chrono::steady_clock::now();
  StoreRead read;
  auto finish = [&](const char* result) {
    read.result = result;
    read.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return read;
  };
  const int32_t bt = pool_->layout().block_tokens;
  const int64_t full = (static_cast<int64_t>(request.prompt.size()) - 1) / bt;
  if (full <= 0 || request.role == EngineRole::kDecodeOnly) return finish("memory");
  if (absl::Now() >= deadline) return finish("skipped");
  const std::vector<Hash128> hashes = ComputeBlockHashes(
      {fingerprint_, request.cache_salt, ""},
      absl::MakeConstSpan(request.prompt).subspan(0, full * bt), bt, ImageSpans(request.images));
  // What the engine's cache holds (a hint: it may evict or add blocks before the reservation).
  const int64_t local = engine_->kv_events().CachedPrefix(hashes);
  if (local >= full) return finish("memory");
  const int64_t present = StorePrefix(hashes, local, hint) - local;
  if (present <= 0) return finish("miss");
  const int64_t max_blocks =
      options_.max_blocks > 0 ? options_.max_blocks : std::max<int64_t>(1, pool_->num_blocks() / 2);
  auto reserved =
      Reserve(std::vector<Hash128>(hashes.begin(), hashes.begin() + local + present), max_blocks);
  if (!reserved.ok()) {
    LOG(WARNING) << "request " << request.id
                 << ": no blocks to read its prefix into: " << reserved.status();
    return finish("skipped");
  }
  const int64_t cached = reserved->cached_blocks;
  const int64_t fresh = static_cast<int64_t>(reserved->blocks.size()) - cached;
  int64_t loaded = 0;
  if (fresh > 0) {
    const std::vector<BlockId> targets(reserved->blocks.begin() + cached, reserved->blocks.end());
    auto landing = staging_->Import(targets);
    if (!landing.ok()) {
      // No room in the staging area now: the request is computed, as on a miss.
      LOG(WARNING) << "request " << request.id
                   << ": no KV staging for its prefix: " << landing.status();
      CHECK_OK(pool_->Release(reserved->blocks));
      return finish("skipped");
    }
    const std::vector<MemorySpan>* spans = &(*landing)->spans();
    // The run in `streams` slices, read at once (this thread reads the first).
    const int64_t streams = std::clamp<int64_t>(options_.streams, 1, fresh);
    std::vector<kv::GetIntoResult> got(static_cast<size_t>(fresh));
    auto read_slice = [&](int64_t s) {
      const int64_t from = fresh * s / streams, to = fresh * (s + 1) / streams;
      kv::GetIntoDestination destination;
      for (int64_t i = from; i < to; ++i) {
        destination.spans.push_back(
            absl::Span<char>(static_cast<char*>((*spans)[i].address), (*spans)[i].length));
      }
      if (destination_.has_value()) {
        destination.descriptor = Describe(absl::MakeConstSpan(*spans).subspan(from, to - from));
      }
      const std::vector<kv::GetIntoResult> part = client_->GetInto(
          absl::MakeConstSpan(hashes).subspan(cached + from, to - from), fingerprint_, destination);
      std::copy(part.begin(), part.end(), got.begin() + from);
    };
    std::vector<std::thread> others;
    for (int64_t s = 1; s < streams; ++s) others.emplace_back(read_slice, s);
    read_slice(0);
    for (std::thread& t : others) t.join();
    // The run ends at the first block that is not this pool's, whole and checked.
    const uint64_t tag = pool_->layout().Tag();
    const char* why = "missing";
    for (; loaded < fresh; ++loaded) {
      const kv::GetIntoResult& r = got[loaded];
      if (!r.found) break;
      if (r.meta.layout_tag != tag || r.meta.token_count != static_cast<uint32_t>(bt)) {
        why = "rejected";
        break;
      }
    }
    if (loaded > 0) {
      // Into the blocks (a copy to the device when staged; nothing in place).
      absl::Status committed = (*landing)->Commit(loaded);
      if (!committed.ok()) {
        LOG(ERROR) << "request " << request.id
                   << ": the KV read from the store is not taken: " << committed;
        loaded = 0;
        why = "failed";
      }
    }
    for (int64_t i = 0; i < loaded; ++i) read.by_transport |= got[i].by_transport;
    // The rest go back to the pool, but those a failed node may still write only once it can
    // no longer.
    std::vector<BlockId> back, held;
    for (int64_t i = loaded; i < fresh; ++i) (got[i].unsettled ? held : back).push_back(targets[i]);
    metrics_->StoreReadBlocks("loaded", loaded);
    if (!back.empty()) metrics_->StoreReadBlocks(why, static_cast<int64_t>(back.size()));
    CHECK_OK(pool_->Release(back));
    if (!held.empty()) {
      metrics_->StoreReadBlocks("unsettled", static_cast<int64_t>(held.size()));
      read.quarantined = static_cast<int64_t>(held.size());
      LOG(WARNING) << "request " << request.id << ": " << held.size()
                   << " blocks a failed KV store node may still write are held back from the "
                      "pool for "
                   << options_.unsettled_quarantine;
      absl::MutexLock lock(&mu_);
      quarantine_.push_back({clock_->Monotonic() + options_.unsettled_quarantine, std::move(held),
                             *std::move(landing)});
      metrics_->StoreQuarantinedBlocks(QuarantinedLocked());
      cv_.SignalAll();  // the waiting threads' next release time
    }
  }
  if (loaded == 0) {
    CHECK_OK(pool_->Release(absl::MakeConstSpan(reserved->blocks).subspan(0, cached)));
    return finish(fresh > 0 ? "miss" : "memory");
  }
  if (options_.sim_timing != nullptr) {
    // The simulated store: the loaded blocks' KV at the calibrated read speed, counted from the
    // read's start (its real time overlaps).
    double modeled = options_.sim_timing->StoreReadSeconds(loaded * bt);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    modeled = std::min(modeled, elapsed + absl::ToDoubleSeconds(deadline - absl::Now()));
    if (modeled > elapsed) {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::duration<double>(modeled)));
    }
  }
  request.imported_blocks.assign(reserved->blocks.begin(),
                                 reserved->blocks.begin() + cached + loaded);
  request.imported_cached_blocks = cached;
  read.blocks = loaded;
  read.bytes = loaded * static_cast<int64_t>(pool_->layout().block_bytes());
  return finish("hit");
}

}  // namespace ferry
