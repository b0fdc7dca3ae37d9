#include "tools/calibrate/link_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/status.h"
#include "services/transfer/kv_transport.h"

namespace ferry {
namespace {

using transfer::KvTransport;
using transfer::LocalRegion;
using transfer::TransferOp;
using transfer::TransferRequest;
using transfer::TransferSegment;

constexpr uint64_t kPageBytes = 4096;
constexpr absl::Duration kDeadline = absl::Seconds(30);

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

absl::StatusOr<LinkTiming> MeasureLink(const LinkProbeOptions& options) {
  if (options.block_bytes == 0) return absl::InvalidArgumentError("link probe: no block size");
  const int largest = *std::max_element(options.block_counts.begin(), options.block_counts.end());
  const int64_t pool_blocks = static_cast<int64_t>(options.pool_bytes / options.block_bytes);
  if (pool_blocks < 2 * largest) {
    return absl::InvalidArgumentError(
        absl::StrCat("link probe: ", pool_blocks, " blocks per side for puts of ", largest));
  }
  transfer::TransportOptions topt;
  topt.kind = options.kind;
  topt.ucx_tls = options.ucx_tls;
  ASSIGN_OR_RETURN(std::unique_ptr<KvTransport> sender, KvTransport::Create(topt));
  ASSIGN_OR_RETURN(std::unique_ptr<KvTransport> receiver, KvTransport::Create(topt));
  const uint64_t bytes = static_cast<uint64_t>(pool_blocks) * options.block_bytes;
  ASSIGN_OR_RETURN(LocalRegion src, sender->Allocate(bytes));
  ASSIGN_OR_RETURN(LocalRegion dst, receiver->Allocate(bytes));
  // Every page touched (and not zero: a guest may take zero pages back), as a pool in use is.
  std::memset(src.span.address, 0x3c, src.span.length);
  std::memset(dst.span.address, 0x3c, dst.span.length);
  ASSIGN_OR_RETURN(const transfer::PeerId peer, sender->Connect(receiver->address()));

  LinkTiming out;
  out.transport = sender->PeerTransport(peer);
  const uint64_t src_base = reinterpret_cast<uint64_t>(src.span.address);
  std::mt19937_64 rng(7);
  std::vector<int64_t> order(pool_blocks);
  std::iota(order.begin(), order.end(), 0);
  auto put = [&](const std::vector<TransferSegment>& segments) -> absl::StatusOr<double> {
    TransferRequest r;
    r.peer = peer;
    r.op = TransferOp::kPut;
    r.remote = dst.descriptor;
    r.segments = segments;
    r.deadline = absl::Now() + kDeadline;
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(sender->Transfer(std::move(r)));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Random blocks on both sides, in a random order (nothing coalesces).
  auto scattered = [&](int count) {
    std::vector<TransferSegment> segments;
    std::shuffle(order.begin(), order.end(), rng);
    for (int i = 0; i < count; ++i) {
      const uint64_t from = static_cast<uint64_t>(order[i]) * options.block_bytes;
      const uint64_t to = static_cast<uint64_t>(order[pool_blocks - 1 - i]) * options.block_bytes;
      segments.push_back({src_base + from, dst.descriptor.address + to, options.block_bytes});
    }
    return segments;
  };
  // Warm-up: the connection's first transfers.
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(put(scattered(largest)).status());

  std::vector<double> seconds;
  for (int r = 0; r < options.latency_repeats; ++r) {
    const uint64_t at = static_cast<uint64_t>(order[r % pool_blocks]) * options.block_bytes;
    ASSIGN_OR_RETURN(const double s,
                     put({{src_base + at, dst.descriptor.address + at, kPageBytes}}));
    seconds.push_back(s);
  }
  out.samples.push_back({static_cast<double>(kPageBytes), Median(seconds)});
  for (int count : options.block_counts) {
    seconds.clear();
    for (int r = 0; r < options.repeats; ++r) {
      ASSIGN_OR_RETURN(const double s, put(scattered(count)));
      seconds.push_back(s);
    }
    out.samples.push_back({static_cast<double>(count * options.block_bytes), Median(seconds)});
  }
  ASSIGN_OR_RETURN(out.fit, FitLatencyAndBandwidth(out.samples));
  sender->Disconnect(peer);
  RETURN_IF_ERROR(sender->Deregister(src.id));
  RETURN_IF_ERROR(receiver->Deregister(dst.id));
  return out;
}

}  // namespace ferry
