#include "services/worker/kv_handoff.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/common/model_fingerprint.h"
#include "services/transfer/transfer_wire.h"

namespace ferry {

KvFacts KvFactsOf(const Engine& engine, const KvBlockPool& pool, const KvBlockPool* window_pool) {
  KvFacts facts;
  facts.fingerprint = engine.model().fingerprint();
  facts.block_tokens = engine.block_tokens();
  facts.block_bytes = pool.layout().block_bytes();
  facts.window_block_bytes = window_pool != nullptr ? window_pool->layout().block_bytes() : 0;
  return facts;
}

std::string RandomTransferSuffix() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16));
}

namespace {

// The slices of `blocks`' landing in `staging`'s host memory (added to `landing`).
absl::Status AddSlices(KvStaging& staging, uint32_t region, absl::Span<const BlockId> blocks,
                       transfer::PeerDescriptor* out, KvLanding* landing) {
  auto lent = staging.Import(blocks);
  if (!lent.ok()) return lent.status();
  landing->push_back(*lent);
  const MemorySpan span = staging.region();
  const auto base = reinterpret_cast<uint64_t>(span.address);
  for (const MemorySpan& s : (*lent)->spans()) {
    const auto address = reinterpret_cast<uint64_t>(s.address);
    if (address < base || address + s.length > base + span.length) {
      return absl::InternalError("a reserved block lies outside its pool's registered region");
    }
    out->block_slices.push_back({region, address - base, s.length});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::KvReservation> DescribeReservation(
    const std::string& request_id, const KvReservation& blocks, const ReservationTarget& target,
    const KvFacts& facts, const std::string& transfer_id, const std::string& window_transfer_id,
    absl::Time deadline, KvLanding* landing) {
  landing->clear();
  const int64_t total = static_cast<int64_t>(blocks.blocks.size());
  if (blocks.cached_blocks >= total) {
    return absl::InternalError("a reservation with nothing to push");
  }
  transfer::PeerDescriptor d;
  d.kind = std::string(target.transport->kind());
  d.address = target.transport->address();
  d.transfer_id = transfer_id;
  d.regions.push_back(target.pool_region);
  absl::Status added =
      AddSlices(*target.staging, 0,
                absl::MakeConstSpan(blocks.blocks).subspan(blocks.cached_blocks), &d, landing);
  if (!added.ok()) return added;
  v1::KvReservation r;
  r.set_request_id(request_id);
  r.set_cached_prefix_blocks(static_cast<uint32_t>(blocks.cached_blocks));
  r.set_reserved_blocks(static_cast<uint32_t>(total - blocks.cached_blocks));
  if (target.window_staging != nullptr) {
    if (static_cast<int64_t>(blocks.window_blocks.size()) != total) {
      return absl::InternalError("the window table does not match the reservation's");
    }
    int64_t first = blocks.cached_blocks;
    while (first < total && blocks.window_blocks[first] == kNoBlock) ++first;
    for (int64_t i = first; i < total; ++i) {
      if (blocks.window_blocks[i] == kNoBlock) {
        return absl::InternalError("the window table has a gap inside the window");
      }
    }
    d.regions.push_back(target.window_region);
    added = AddSlices(*target.window_staging, 1,
                      absl::MakeConstSpan(blocks.window_blocks).subspan(first), &d, landing);
    if (!added.ok()) return added;
    r.set_window_first_block(static_cast<uint32_t>(first));
    r.set_window_transfer_id(window_transfer_id);
  }
  *r.mutable_transfer() = transfer::ToProto(d);
  r.mutable_model_fingerprint()->set_lo(facts.fingerprint.lo);
  r.mutable_model_fingerprint()->set_hi(facts.fingerprint.hi);
  r.set_block_tokens(static_cast<uint32_t>(facts.block_tokens));
  r.set_block_bytes(facts.block_bytes);
  r.set_window_block_bytes(facts.window_block_bytes);
  r.set_kv_format_version(kKvFormatVersion);
  r.set_deadline_unix_ms(absl::ToUnixMillis(deadline));
  return r;
}

namespace {

// FailedPrecondition when `r` was made by a worker whose KV is not laid out as `mine`.
absl::Status CheckSameKv(const v1::KvReservation& r, const KvFacts& mine) {
  const Hash128 theirs{r.model_fingerprint().lo(), r.model_fingerprint().hi()};
  if (theirs != mine.fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat("the decode worker's model fingerprint (", theirs.ToHex(),
                     ") is not this prefill worker's (", mine.fingerprint.ToHex(), ")"));
  }
  if (r.block_tokens() != static_cast<uint32_t>(mine.block_tokens)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the decode worker's block size (", r.block_tokens(),
                     " tokens) is not this prefill worker's (", mine.block_tokens, ")"));
  }
  if (r.kv_format_version() != kKvFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("the decode worker's KV format version (", r.kv_format_version(),
                     ") is not this prefill worker's (", kKvFormatVersion, ")"));
  }
  if (r.block_bytes() != mine.block_bytes || r.window_block_bytes() != mine.window_block_bytes) {
    auto pools = [](uint64_t bytes, uint64_t window) {
      return window == 0 ? absl::StrCat(bytes, " bytes per block in one pool")
                         : absl::StrCat(bytes, " + ", window,
                                        " bytes per block (window layers in a pool of their own)");
    };
    return absl::FailedPreconditionError(absl::StrCat(
        "the decode worker's KV layout (", pools(r.block_bytes(), r.window_block_bytes()),
        ") is not this prefill worker's (", pools(mine.block_bytes, mine.window_block_bytes),
        "): KV dtype, model or pool settings differ"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckReservation(const v1::KvReservation& r, const KvFacts& mine,
                              int64_t table_blocks) {
  if (absl::Status same = CheckSameKv(r, mine); !same.ok()) return same;
  const int64_t covered = static_cast<int64_t>(r.cached_prefix_blocks()) + r.reserved_blocks();
  if (covered != table_blocks || r.reserved_blocks() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the reservation covers ", covered, " blocks (", r.reserved_blocks(),
                     " to push) but the request's KV is ", table_blocks, " blocks"));
  }
  const int64_t window_slices = mine.window_block_bytes == 0
                                    ? 0
                                    : table_blocks - static_cast<int64_t>(r.window_first_block());
  if (window_slices < 0 || (mine.window_block_bytes != 0 && window_slices == 0) ||
      r.transfer().block_slices_size() != static_cast<int>(r.reserved_blocks() + window_slices)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the reservation has ", r.transfer().block_slices_size(), " block slices for ",
                     r.reserved_blocks(), " blocks (and ", window_slices, " window blocks)"));
  }
  if (r.transfer().transfer_id().empty() ||
      (mine.window_block_bytes != 0 && r.window_transfer_id().empty())) {
    return absl::InvalidArgumentError("the reservation names no transfer id");
  }
  return absl::OkStatus();
}

namespace {

// The earlier of the reservation's deadline and `deadline`.
absl::Time PutDeadline(const v1::KvReservation& reservation, absl::Time deadline) {
  if (reservation.deadline_unix_ms() <= 0) return deadline;
  return std::min(deadline, absl::FromUnixMillis(reservation.deadline_unix_ms()));
}

// A put of `blocks` (their host memory from `staging`, lent to `source`) into `remote`'s slices
// first_slice, first_slice + 1, ..., with remote's transfer id; their bytes added to `bytes`.
absl::StatusOr<transfer::TransferRequest> BlocksPut(const transfer::PeerDescriptor& remote,
                                                    size_t first_slice,
                                                    absl::Span<const BlockId> blocks,
                                                    KvStaging& staging, absl::Time deadline,
                                                    uint64_t* bytes,
                                                    std::shared_ptr<KvHostBlocks>* source) {
  auto host = staging.Export(blocks);
  if (!host.ok()) return host.status();
  const std::vector<MemorySpan>& spans = (*host)->spans();
  auto put = transfer::BlockTransferRequest(remote, first_slice, spans, transfer::TransferOp::kPut);
  if (!put.ok()) return put.status();
  put->deadline = deadline;
  for (const MemorySpan& s : spans) *bytes += s.length;
  *source = *std::move(host);
  return put;
}

}  // namespace

absl::StatusOr<std::vector<transfer::TransferRequest>> PushTransfers(
    const v1::KvReservation& reservation, const std::vector<BlockId>& blocks,
    const std::vector<BlockId>& window_blocks, KvStaging& staging, KvStaging* window_staging,
    int64_t from_block, int64_t window_floor, absl::Time deadline, uint64_t* bytes,
    std::vector<std::shared_ptr<KvHostBlocks>>* sources) {
  sources->clear();
  const KvBlockPool& pool = staging.pool();
  auto remote = transfer::FromProto(reservation.transfer());
  if (!remote.ok()) return remote.status();
  deadline = PutDeadline(reservation, deadline);
  *bytes = 0;
  std::vector<transfer::TransferRequest> out;
  const size_t cached = reservation.cached_prefix_blocks();
  const size_t from =
      std::max<size_t>(cached, static_cast<size_t>(std::max<int64_t>(0, from_block)));
  if (from >= blocks.size()) return absl::InvalidArgumentError("nothing to push");
  std::shared_ptr<KvHostBlocks> source;
  auto put = BlocksPut(*remote, from - cached, absl::MakeConstSpan(blocks).subspan(from), staging,
                       deadline, bytes, &source);
  if (!put.ok()) return put.status();
  out.push_back(*std::move(put));
  sources->push_back(std::move(source));
  if (window_staging != nullptr) {
    const size_t first = reservation.window_first_block();
    if (window_blocks.size() != blocks.size() || first >= window_blocks.size()) {
      return absl::InvalidArgumentError("the window table does not match the reservation");
    }
    // Blocks before a bounded replay's floor were never computed here: not pushed.
    const size_t start = std::max(first, static_cast<size_t>(std::max<int64_t>(0, window_floor)) /
                                             static_cast<size_t>(pool.layout().block_tokens));
    if (start >= window_blocks.size()) {
      return absl::InvalidArgumentError("the window floor is past the window table");
    }
    std::vector<BlockId> held(window_blocks.begin() + start, window_blocks.end());
    if (std::find(held.begin(), held.end(), kNoBlock) != held.end()) {
      return absl::InternalError("the window layers' KV is not held for the reservation's blocks");
    }
    transfer::PeerDescriptor window_remote = *remote;
    window_remote.transfer_id = reservation.window_transfer_id();
    auto window_put = BlocksPut(window_remote, reservation.reserved_blocks() + (start - first),
                                held, *window_staging, deadline, bytes, &source);
    if (!window_put.ok()) return window_put.status();
    out.push_back(*std::move(window_put));
    sources->push_back(std::move(source));
  }
  return out;
}

absl::Status CheckPrecopyReservation(const v1::KvReservation& r, const KvFacts& mine) {
  if (absl::Status same = CheckSameKv(r, mine); !same.ok()) return same;
  if (r.reserved_blocks() == 0 ||
      r.transfer().block_slices_size() != static_cast<int>(r.reserved_blocks())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pre-copy reservation has ", r.transfer().block_slices_size(),
                     " block slices for ", r.reserved_blocks(), " blocks"));
  }
  if (r.transfer().transfer_id().empty()) {
    return absl::InvalidArgumentError("the reservation names no transfer id");
  }
  return absl::OkStatus();
}

absl::StatusOr<transfer::TransferRequest> PrecopyTransfer(const v1::KvReservation& reservation,
                                                          absl::Span<const BlockId> blocks,
                                                          KvStaging& staging, absl::Time deadline,
                                                          uint64_t* bytes,
                                                          std::shared_ptr<KvHostBlocks>* source) {
  const size_t cached = reservation.cached_prefix_blocks();
  if (blocks.size() != cached + reservation.reserved_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("the pre-copy holds ", blocks.size(),
                                                   " blocks for a reservation of ",
                                                   cached + reservation.reserved_blocks()));
  }
  auto remote = transfer::FromProto(reservation.transfer());
  if (!remote.ok()) return remote.status();
  *bytes = 0;
  return BlocksPut(*remote, 0, blocks.subspan(cached), staging, PutDeadline(reservation, deadline),
                   bytes, source);
}

absl::StatusOr<transfer::TransferRequest> StreamTransfer(const v1::KvReservation& reservation,
                                                         int64_t first_block,
                                                         absl::Span<const BlockId> blocks,
                                                         KvStaging& staging, absl::Time deadline,
                                                         uint64_t* bytes,
                                                         std::shared_ptr<KvHostBlocks>* source) {
  const int64_t cached = reservation.cached_prefix_blocks();
  const int64_t end = first_block + static_cast<int64_t>(blocks.size());
  if (blocks.empty() || first_block < cached || end > cached + reservation.reserved_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("blocks ", first_block, "..", end - 1, " are not among the reservation's ",
                     cached, "..", cached + reservation.reserved_blocks() - 1));
  }
  auto remote = transfer::FromProto(reservation.transfer());
  if (!remote.ok()) return remote.status();
  remote->transfer_id.clear();  // D learns of streamed puts through the last ones
  *bytes = 0;
  return BlocksPut(*remote, static_cast<size_t>(first_block - cached), blocks, staging,
                   PutDeadline(reservation, deadline), bytes, source);
}

}  // namespace ferry
