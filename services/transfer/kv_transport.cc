#include "services/transfer/kv_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"

namespace ferry {
namespace transfer {

absl::string_view TransferOpName(TransferOp op) { return op == TransferOp::kPut ? "put" : "get"; }

absl::Status ValidateTransferRequest(const TransferRequest& request) {
  if (request.segments.empty()) return absl::InvalidArgumentError("transfer has no segments");
  if (request.segments.size() > kMaxSegmentsPerTransfer) {
    return absl::InvalidArgumentError(absl::StrCat("transfer has ", request.segments.size(),
                                                   " segments; at most ", kMaxSegmentsPerTransfer,
                                                   " are allowed"));
  }
  if (request.deadline == absl::InfiniteFuture() || request.deadline == absl::InfinitePast()) {
    return absl::InvalidArgumentError("transfer needs a finite deadline");
  }
  if (request.transfer_id.size() > kMaxTransferIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer_id is ", request.transfer_id.size(),
                                                   " bytes; at most ", kMaxTransferIdBytes));
  }
  if (request.remote.remote_key.empty()) {
    return absl::InvalidArgumentError("remote region has no key");
  }
  const uint64_t remote_begin = request.remote.address;
  const uint64_t remote_end = remote_begin + request.remote.length;
  if (remote_end < remote_begin) {
    return absl::InvalidArgumentError("remote region wraps around the address space");
  }
  // (written address, length) of each segment, to check that no two writes overlap.
  std::vector<std::pair<uint64_t, uint64_t>> writes;
  writes.reserve(request.segments.size());
  for (size_t i = 0; i < request.segments.size(); ++i) {
    const TransferSegment& s = request.segments[i];
    if (s.length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("segment ", i, " has length 0"));
    }
    if (s.local_address + s.length < s.local_address) {
      return absl::InvalidArgumentError(
          absl::StrCat("segment ", i, "'s local range wraps around the address space"));
    }
    if (s.remote_address < remote_begin || s.remote_address > remote_end ||
        s.length > remote_end - s.remote_address) {
      return absl::InvalidArgumentError(
          absl::StrCat("segment ", i, " (", s.length, " bytes at remote 0x",
                       absl::Hex(s.remote_address), ") is outside the remote region [0x",
                       absl::Hex(remote_begin), ", 0x", absl::Hex(remote_end), ")"));
    }
    writes.emplace_back(request.op == TransferOp::kPut ? s.remote_address : s.local_address,
                        s.length);
  }
  std::sort(writes.begin(), writes.end());
  for (size_t i = 1; i < writes.size(); ++i) {
    if (writes[i - 1].first + writes[i - 1].second > writes[i].first) {
      return absl::InvalidArgumentError(
          absl::StrCat("segments overlap on the written side at 0x", absl::Hex(writes[i].first)));
    }
  }
  return absl::OkStatus();
}

namespace {

// A callback's status, handed to a waiting thread.
struct Outcome {
  absl::Notification done;
  absl::Status status;
};

}  // namespace

absl::Status KvTransport::Transfer(TransferRequest request) {
  auto outcome = std::make_shared<Outcome>();
  absl::StatusOr<TransferId> id = Post(std::move(request), [outcome](absl::Status status) {
    outcome->status = std::move(status);
    outcome->done.Notify();
  });
  if (!id.ok()) return id.status();
  outcome->done.WaitForNotification();
  return outcome->status;
}

absl::Status KvTransport::WaitNotification(const std::string& transfer_id, absl::Time deadline) {
  auto outcome = std::make_shared<Outcome>();
  AwaitNotification(transfer_id, deadline, [outcome](absl::Status status) {
    outcome->status = std::move(status);
    outcome->done.Notify();
  });
  outcome->done.WaitForNotification();
  return outcome->status;
}

absl::StatusOr<MemorySpan> TransportKvAllocator::Allocate(size_t bytes) {
  absl::StatusOr<LocalRegion> region = transport_->Allocate(bytes);
  if (!region.ok()) return region.status();
  constexpr size_t kPage = 4096;  // see the header: keeps the pool's pages from looking unused
  auto* memory = static_cast<unsigned char*>(region->span.address);
  for (size_t offset = 0; offset < region->span.length; offset += kPage) memory[offset] = 1;
  absl::MutexLock lock(&mu_);
  regions_.push_back(*region);
  return region->span;
}

void TransportKvAllocator::Free(const MemorySpan& span) {
  RegionId id = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [&](const LocalRegion& r) { return r.span.address == span.address; });
    if (it == regions_.end()) {
      LOG(ERROR) << "TransportKvAllocator: Free of " << span.address
                 << ", which this allocator did not allocate (ignored)";
      return;
    }
    id = it->id;
    regions_.erase(it);
    if (detached_) return;  // the transport freed it
  }
  const absl::Time deadline = absl::Now() + free_wait_;
  absl::Status status = transport_->Deregister(id);
  while (status.code() == absl::StatusCode::kFailedPrecondition && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));  // a transfer still uses the region
    status = transport_->Deregister(id);
  }
  if (!status.ok()) {
    LOG(ERROR) << "TransportKvAllocator: cannot deregister the region at " << span.address << " ("
               << span.length << " bytes): " << status << "; it stays registered";
  }
}

void TransportKvAllocator::Detach() {
  absl::MutexLock lock(&mu_);
  detached_ = true;
}

absl::StatusOr<LocalRegion> TransportKvAllocator::RegionOf(const void* address) const {
  absl::MutexLock lock(&mu_);
  for (const LocalRegion& r : regions_) {
    if (r.span.address == address) return r;
  }
  return absl::NotFoundError("no allocation of this allocator starts at that address");
}

}  // namespace transfer
}  // namespace ferry
