// The KV hand-off between a decode worker and a prefill worker (ARCHITECTURE.md §3 steps 3-6), as
// plain functions over the wire messages, so that both sides agree by construction:
//
//   decode worker D:  Engine::Reserve -> DescribeReservation -> GenerateEvent{reservation}
//   prefill worker P: CheckReservation (same model, block size, KV layout?) -> compute,
//                     StreamTransfer for blocks complete before the compute ends ->
//                     PushTransfers for the rest (one put per pool, from P's blocks into D's
//                     through each side's KvStaging: in place on host memory, through pinned
//                     staging areas on a GPU; these name the transfer ids D awaits)
//
// A reservation names D's pools as transfer regions (region 0 the KV pool, region 1 the window
// pool of a hybrid model on two pools) and one slice per block to push, in table order: the
// pool's blocks from cached_prefix_blocks on, then the window pool's from window_first_block on
// (worker.proto KvReservation). Blocks D already holds (its cached prefix) are not pushed.
//
// Stateless; thread-safe.

#ifndef FERRY_SERVICES_WORKER_KV_HANDOFF_H_
#define FERRY_SERVICES_WORKER_KV_HANDOFF_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/common/hash128.h"
#include "engine/engine.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/kv/kv_staging.h"
#include "ferry/v1/worker.pb.h"
#include "services/transfer/kv_transport.h"

namespace ferry {

// What a worker's KV looks like; two workers exchange KV only when these agree.
struct KvFacts {
  Hash128 fingerprint;
  int32_t block_tokens = 0;
  uint64_t block_bytes = 0;
  uint64_t window_block_bytes = 0;  // 0: one pool
};

KvFacts KvFactsOf(const Engine& engine, const KvBlockPool& pool, const KvBlockPool* window_pool);

// 64 random bits in hex, for transfer ids that are never reused: a request id (unique among live
// requests) followed by this.
std::string RandomTransferSuffix();

// Where a decode worker's KV lands for peers: the host memory of each pool's KvStaging (the pool
// itself, or its staging area), and its registration with the transport.
struct ReservationTarget {
  const transfer::KvTransport* transport = nullptr;
  transfer::RegionDescriptor pool_region;  // the registration of staging->region()
  KvStaging* staging = nullptr;
  transfer::RegionDescriptor window_region;  // with a window pool
  KvStaging* window_staging = nullptr;       // null: one pool
};

// What a reservation lends of the staging areas: the pool's landing, then the window pool's.
// Held until no push can reach it; committed into the blocks once every push has landed.
using KvLanding = std::vector<std::shared_ptr<KvHostBlocks>>;

// The reservation message for `blocks` (Engine::Reserve's, for a request whose table has
// blocks.blocks.size() blocks), the transfers named `transfer_id` (and `window_transfer_id`),
// due by `deadline`; `landing` gets the host memory its slices name. RESOURCE_EXHAUSTED when a
// staging area has no room for it now.
absl::StatusOr<ferry::v1::KvReservation> DescribeReservation(
    const std::string& request_id, const KvReservation& blocks, const ReservationTarget& target,
    const KvFacts& facts, const std::string& transfer_id, const std::string& window_transfer_id,
    absl::Time deadline, KvLanding* landing);

// FailedPrecondition, naming what differs, when `reservation` was made by a worker whose model,
// block size or KV layout is not `mine`; InvalidArgument when it does not describe a table of
// `table_blocks` blocks.
absl::Status CheckReservation(const ferry::v1::KvReservation& reservation, const KvFacts& mine,
                              int64_t table_blocks);

// The puts that move a handed-off table (`blocks`, and `window_blocks` on two pools) into the
// reservation's slices: the pool's from table block `from_block` on (blocks before it were
// streamed; at least one must be left), then (two pools) the window pool's. They carry the
// reservation's transfer ids, so they go last, once every streamed put has completed. The caller
// sets `peer`; the deadline is the reservation's (or `deadline`, if earlier). Bytes in all of
// them: `bytes`. The bytes are read from `sources` (one per put, the blocks' host memory from
// `staging` and `window_staging`), which the caller holds until its put has completed. After a
// bounded window replay (TokenEvent::window_floor) the window table holds no block before the
// floor's: those of the reservation's window slices stay unwritten (the decode side, told the
// floor, never reads them).
absl::StatusOr<std::vector<transfer::TransferRequest>> PushTransfers(
    const ferry::v1::KvReservation& reservation, const std::vector<BlockId>& blocks,
    const std::vector<BlockId>& window_blocks, KvStaging& staging, KvStaging* window_staging,
    int64_t from_block, int64_t window_floor, absl::Time deadline, uint64_t* bytes,
    std::vector<std::shared_ptr<KvHostBlocks>>* sources);

// Drain pre-copy (PrefetchKv / PushKv with precopy). The check of a target's reservation for
// blocks cached_prefix_blocks.. of a request still running on the source: same model, block size
// and KV layout as `mine` (FailedPrecondition), one slice per reserved block and a transfer id
// (InvalidArgument); the pool's blocks only, however many pools the model has.
absl::Status CheckPrecopyReservation(const ferry::v1::KvReservation& reservation,
                                     const KvFacts& mine);
// The put of `blocks` (the table's first cached_prefix_blocks + reserved_blocks blocks, held for
// the push) from cached_prefix_blocks on into the reservation's slices, with its transfer id;
// `source` as PushTransfers' `sources`.
absl::StatusOr<transfer::TransferRequest> PrecopyTransfer(
    const ferry::v1::KvReservation& reservation, absl::Span<const BlockId> blocks,
    KvStaging& staging, absl::Time deadline, uint64_t* bytes,
    std::shared_ptr<KvHostBlocks>* source);

// A put of pool blocks that completed before the compute ended (`blocks`: the table's blocks
// first_block, first_block + 1, ...) into their slices, without a transfer id: the decode worker
// learns of it only through the later PushTransfers puts. InvalidArgument when the range is not
// within the blocks to push. Deadline, `bytes` and `source` as above.
absl::StatusOr<transfer::TransferRequest> StreamTransfer(
    const ferry::v1::KvReservation& reservation, int64_t first_block,
    absl::Span<const BlockId> blocks, KvStaging& staging, absl::Time deadline, uint64_t* bytes,
    std::shared_ptr<KvHostBlocks>* source);

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_KV_HANDOFF_H_
