#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/log.h"
#include "services/transfer/streaming_copy.h"
#include "services/transfer/ucx_transport_internal.h"
#include "services/transfer/ucx_wire.h"

namespace ferry {
namespace transfer {
namespace ucx_internal {

// --- The active-message protocol ----------------------------------------------------------------
//
// Puts: the initiator sends the data as kPutData messages of at most kAmChunkBytes (each names
// the remote address and the region's secret; the owner checks both, then copies the data into
// place with streaming stores, streaming_copy.h), then kPutCommit with the byte count, its
// outcome and its own address. A put of kDataSocketMinBytes or more to a peer with a bulk-data
// listener sends the same data and commit as frames of at most kDataFrameBytes on its own TCP
// connection instead (ucx_data_socket.h), which the owner reads straight into place: one copy,
// where UCX's tcp transport reads into its buffer first. The commit follows the data on the same
// connection, so the owner has taken every byte before it sees the commit. The owner, once
// every byte has arrived, tells its AwaitNotification and answers kPutAck over its own connection
// to the initiator; the initiator's transfer completes with the ack. Gets: kGetRequest names the
// ranges; the owner checks them all, sends kGetData messages straight from its registered memory
// and then kGetDone, and tells its AwaitNotification; the initiator copies each chunk into the
// segment it names and completes when kGetDone has come and every byte with it. The owner never
// writes or reads outside a region whose secret the message carries.
//
// The owner connects to the initiator (ReplyPeer) and sends its replies only after
// ucp_worker_progress has returned, never from the message's callback: UCX 1.13's tcp transport
// pairs a new endpoint with a connection the peer opened to it (same address and sequence number)
// by moving that connection's receive buffer to the new endpoint. Done from inside the callback
// while messages that came after the current one are still in that buffer, the receive loop it
// returns to finds its buffer gone and frees a null one (SIGSEGV in uct_tcp_ep_progress_am_rx).

ucs_status_ptr_t UcxTransport::SendAm(Peer* peer, AmOp* op, const void* data, size_t length,
                                      ucp_mem_h memh, bool reply) {
  ucp_request_param_t param = {};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | (reply ? UCP_AM_SEND_FLAG_REPLY : 0);
  param.cb.send = &UcxTransport::OnAmOpDone;
  param.user_data = op;
  if (memh != nullptr) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = memh;
  }
  return ucp_am_send_nbx(peer->ep, kFerryAmId, &op->header, sizeof(AmHeader), data, length, &param);
}

void UcxTransport::SendOneWay(Peer* peer, const AmHeader& header, std::string payload, bool reply) {
  auto* op = new AmOp;
  op->owner = this;
  op->header = header;
  op->payload = std::move(payload);
  ucs_status_ptr_t p = SendAm(peer, op, op->payload.data(), op->payload.size(), nullptr, reply);
  if (UCS_PTR_IS_ERR(p)) {
    LOG(WARNING) << "KV transport: reply to peer " << peer->id
                 << " failed: " << ucs_status_string(UCS_PTR_STATUS(p));
  }
  if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
}

void UcxTransport::OnAmOpDone(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<AmOp*>(user_data);
  UcxTransport* self = op->owner;
  if (op->transfer != 0) {
    auto it = self->transfers_.find(op->transfer);
    if (it != self->transfers_.end()) {
      Transfer* t = it->second.get();
      --t->inflight;
      if (status != UCS_OK && t->status.ok()) {
        t->status =
            UcsError(absl::StrCat("transfer ", t->id, " ", TransferOpName(t->request.op)), status);
      }
      self->touched_.push_back(t->id);
    }
  } else if (op->serve != 0) {
    auto it = self->serves_.find(op->serve);
    if (it != self->serves_.end()) {
      Serve* serve = it->second.get();
      --serve->inflight;
      if (status != UCS_OK && serve->status.ok()) {
        serve->status = UcsError("serving a get", status);
      }
      self->touched_serves_.push_back(serve->token);
    }
  }
  ucp_request_free(request);
  delete op;
}

void UcxTransport::SendFrame(Transfer* t, const DataFrameHeader& header, const void* data,
                             std::string payload) {
  Peer* peer = t->peer;
  if (peer->data == nullptr) {
    peer->data = std::make_unique<DataSender>(peer->data_endpoint, peer->same_host);
  }
  ++t->inflight;
  peer->data->Send(header, data, std::move(payload), [this, id = t->id](absl::Status status) {
    Enqueue([this, id, status = std::move(status)] { OnFrameSent(id, status); });
  });
}

void UcxTransport::OnFrameSent(TransferId id, absl::Status status) {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return;
  Transfer* t = it->second.get();
  --t->inflight;
  if (!status.ok()) {
    if (t->status.ok()) t->status = status;
    if (t->peer != nullptr && !t->peer->failed && t->peer->data_endpoint.port != 0) {
      // The bulk-data connection failed while UCX's did not (yet): later puts to the peer go as
      // active messages.
      LOG(WARNING) << "KV transport: bulk-data connection to peer " << t->peer->id
                   << " failed, puts go as active messages from now on: " << status;
      t->peer->data_endpoint.port = 0;
    }
  }
  Pump(t);
}

void UcxTransport::PumpAm(Transfer* t) {
  const bool put = t->request.op == TransferOp::kPut;
  if (put && !t->routed) {
    t->routed = true;
    t->via_socket = t->peer->data_endpoint.port != 0 && t->bytes >= kDataSocketMinBytes;
  }
  if (put && t->via_socket) {
    while (t->status.ok() && t->phase == Phase::kPosting && t->next < t->request.segments.size() &&
           t->inflight < kMaxInflightFrames) {
      const TransferSegment& s = t->request.segments[t->next];
      const uint64_t length = std::min<uint64_t>(kDataFrameBytes, s.length - t->seg_offset);
      DataFrameHeader header;
      header.am = AmHeader{static_cast<uint32_t>(AmType::kPutData), 0, t->token,
                           s.remote_address + t->seg_offset, t->secret};
      header.length = length;
      SendFrame(t, header, reinterpret_cast<const void*>(s.local_address + t->seg_offset), {});
      t->seg_offset += length;
      if (t->seg_offset == s.length) {
        ++t->next;
        t->seg_offset = 0;
      }
    }
  } else if (put) {
    while (t->status.ok() && t->phase == Phase::kPosting && t->next < t->request.segments.size() &&
           t->inflight < kMaxInflightOps) {
      const TransferSegment& s = t->request.segments[t->next];
      const uint64_t length = std::min<uint64_t>(kAmChunkBytes, s.length - t->seg_offset);
      auto* op = new AmOp;
      op->owner = this;
      op->transfer = t->id;
      op->header = AmHeader{static_cast<uint32_t>(AmType::kPutData), 0, t->token,
                            s.remote_address + t->seg_offset, t->secret};
      ucs_status_ptr_t p =
          SendAm(t->peer, op, reinterpret_cast<const void*>(s.local_address + t->seg_offset),
                 length, t->memhs[t->next]);
      if (UCS_PTR_IS_ERR(p)) {
        t->status = UcsError(absl::StrCat("transfer ", t->id, " put"), UCS_PTR_STATUS(p));
      } else if (p != nullptr) {
        ++t->inflight;
      }
      if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
      t->seg_offset += length;
      if (t->seg_offset == s.length) {
        ++t->next;
        t->seg_offset = 0;
      }
    }
  } else if (t->status.ok() && t->phase == Phase::kPosting) {
    // One request names every range; the data comes back as kGetData.
    std::string payload;
    AppendLe(&payload, address_.size(), 4);
    payload += address_;
    AppendLe(&payload, t->request.transfer_id.size(), 4);
    payload += t->request.transfer_id;
    for (const TransferSegment& s : t->request.segments) {
      AppendLe(&payload, s.remote_address, 8);
      AppendLe(&payload, s.length, 8);
    }
    auto* op = new AmOp;
    op->owner = this;
    op->transfer = t->id;
    op->header = AmHeader{static_cast<uint32_t>(AmType::kGetRequest), 0, t->token, 0, t->secret};
    op->payload = std::move(payload);
    ucs_status_ptr_t p = SendAm(t->peer, op, op->payload.data(), op->payload.size(), nullptr);
    if (UCS_PTR_IS_ERR(p)) {
      t->status = UcsError(absl::StrCat("transfer ", t->id, " get request"), UCS_PTR_STATUS(p));
    } else if (p != nullptr) {
      ++t->inflight;
    }
    if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
    t->next = t->request.segments.size();
  }
  AdvanceAm(t);
}

void UcxTransport::AdvanceAm(Transfer* t) {
  if (t->phase == Phase::kDone || t->inflight > 0) return;
  const bool put = t->request.op == TransferOp::kPut;
  if (t->phase == Phase::kPosting) {
    if (t->status.ok() && t->next < t->request.segments.size()) return;  // PumpAm sends the rest
    if (put && !t->peer->failed) {
      // The commit: the owner acknowledges once every byte is in place (or reports why not).
      std::string payload;
      AppendLe(&payload, address_.size(), 4);
      payload += address_;
      payload += EncodeNotification(t->request.transfer_id, t->status);
      if (t->via_socket) {
        // After the data on the same connection (see "The active-message protocol").
        DataFrameHeader header;
        header.am = AmHeader{static_cast<uint32_t>(AmType::kPutCommit),
                             static_cast<uint32_t>(t->status.code()), t->token, t->bytes, 0};
        header.length = payload.size();
        SendFrame(t, header, nullptr, std::move(payload));
        t->phase = Phase::kAwaitingPeer;
        return;
      }
      auto* op = new AmOp;
      op->owner = this;
      op->transfer = t->id;
      op->header = AmHeader{static_cast<uint32_t>(AmType::kPutCommit),
                            static_cast<uint32_t>(t->status.code()), t->token, t->bytes, 0};
      op->payload = std::move(payload);
      ucs_status_ptr_t p = SendAm(t->peer, op, op->payload.data(), op->payload.size(), nullptr);
      if (UCS_PTR_IS_ERR(p) && t->status.ok()) {
        t->status = UcsError(absl::StrCat("transfer ", t->id, " commit"), UCS_PTR_STATUS(p));
      } else if (p != nullptr && !UCS_PTR_IS_ERR(p)) {
        ++t->inflight;
      }
      if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
    }
    t->phase = Phase::kAwaitingPeer;
    if (t->inflight > 0) return;
  }
  if (t->phase == Phase::kAwaitingPeer) {
    // Wait for the owner unless the transfer already failed here (the owner learns from the
    // commit, or from its own deadline).
    const bool complete = t->peer_done && (put || t->received == t->bytes);
    if (t->status.ok() && !complete) return;
  }
  t->phase = Phase::kDone;
  Finish(t);
}

absl::StatusOr<UcxTransport::Region*> UcxTransport::RemoteAccess(uint64_t address, uint64_t length,
                                                                 uint64_t secret) {
  auto it = regions_.upper_bound(address);
  if (it == regions_.begin()) {
    return absl::OutOfRangeError("the range is not inside a registered region");
  }
  Region& region = std::prev(it)->second;
  const uint64_t begin = reinterpret_cast<uint64_t>(region.span.address);
  if (address - begin > region.span.length || length > region.span.length - (address - begin)) {
    return absl::OutOfRangeError("the range is not inside a registered region");
  }
  if (region.secret != secret) {
    return absl::PermissionDeniedError("the key does not match the region");
  }
  return &region;
}

void UcxTransport::OnPutData(const AmHeader& h, absl::string_view data) {
  IncomingPut& in = incoming_puts_[h.token];
  if (in.expires == absl::Time()) in.expires = absl::Now() + options_.early_notification_ttl;
  if (!in.status.ok()) return;
  {
    absl::MutexLock lock(&regions_mu_);
    absl::StatusOr<Region*> region = RemoteAccess(h.a, data.size(), h.b);
    if (region.ok()) {
      StreamingCopy(reinterpret_cast<void*>(h.a), data.data(), data.size());
      in.received += data.size();
    } else {
      in.status = region.status();
      LOG(WARNING) << "KV transport: refused " << data.size() << " bytes at "
                   << absl::StrCat("0x", absl::Hex(h.a)) << ": " << region.status();
    }
  }
  // Data that overtook its commit on another lane: the commit waited for it.
  MaybeFinalizePut(h.token, in);
}

absl::StatusOr<uint64_t> UcxTransport::OnDataBegin(const DataFrameHeader& h) {
  absl::MutexLock lock(&regions_mu_);
  absl::StatusOr<Region*> region = RemoteAccess(h.am.a, h.length, h.am.b);
  if (!region.ok()) return region.status();
  ++(*region)->receiving;
  return (*region)->id;
}

void UcxTransport::OnDataEnd(const DataFrameHeader& h, uint64_t region_id, uint64_t received,
                             absl::Status status) {
  {
    absl::MutexLock lock(&regions_mu_);
    for (auto& [start, region] : regions_) {
      if (region.id == region_id) --region.receiving;
    }
  }
  Enqueue([this, token = h.am.token, received, status = std::move(status)] {
    IncomingPut& in = incoming_puts_[token];
    if (in.expires == absl::Time()) in.expires = absl::Now() + options_.early_notification_ttl;
    in.received += received;
    // A connection that broke mid-frame carries no commit: the put is never committed and
    // expires (its await fails at its deadline).
    if (!status.ok() && in.status.ok()) in.status = status;
    MaybeFinalizePut(token, in);
  });
}

void UcxTransport::FailIncoming(uint64_t token, absl::Status status) {
  IncomingPut& in = incoming_puts_[token];
  if (in.expires == absl::Time()) in.expires = absl::Now() + options_.early_notification_ttl;
  if (in.status.ok()) in.status = std::move(status);
  MaybeFinalizePut(token, in);
}

void UcxTransport::MaybeFinalizePut(uint64_t token, IncomingPut& in) {
  if (in.committed && (in.received >= in.total || !in.status.ok() || !in.outcome.ok())) {
    FinalizePut(token, in);
  }
}

void UcxTransport::OnPutCommit(const AmHeader& h, absl::string_view data) {
  if (data.size() < 4) return;
  const uint64_t address_length = ReadLe(data, 0, 4);
  if (data.size() < 4 + address_length) return;
  std::string transfer_id;
  absl::Status outcome;
  if (!DecodeNotification(data.substr(4 + address_length), &transfer_id, &outcome)) return;
  IncomingPut& in = incoming_puts_[h.token];
  in.committed = true;
  in.total = h.a;
  in.outcome = std::move(outcome);
  in.transfer_id = std::move(transfer_id);
  in.initiator = std::string(data.substr(4, address_length));
  in.expires = absl::Now() + options_.early_notification_ttl;
  MaybeFinalizePut(h.token, in);
}

void UcxTransport::FinalizePut(uint64_t token, IncomingPut& in) {
  absl::Status status =
      !in.outcome.ok()  ? in.outcome
      : !in.status.ok() ? in.status
      : in.received == in.total
          ? absl::OkStatus()
          : absl::DataLossError(absl::StrCat("received ", in.received, " of ", in.total, " bytes"));
  if (!in.transfer_id.empty()) board_.Deliver(in.transfer_id, status);
  if (in.outcome.ok()) {
    // The initiator waits for the acknowledgement; it leaves once ucp_worker_progress returns.
    pending_acks_.push_back(PendingAck{std::move(in.initiator),
                                       AmHeader{static_cast<uint32_t>(AmType::kPutAck),
                                                static_cast<uint32_t>(status.code()), token, 0, 0},
                                       std::string(status.message())});
  }
  incoming_puts_.erase(token);
}

void UcxTransport::SendPendingAcks() {
  std::vector<PendingAck> acks;
  acks.swap(pending_acks_);
  if (stopping_) return;  // shutting down: nothing is acknowledged
  for (PendingAck& ack : acks) {
    const bool hello = ack.header.type == static_cast<uint32_t>(AmType::kHelloAck);
    absl::StatusOr<Peer*> peer = ReplyPeer(ack.initiator);
    if (!peer.ok()) {
      LOG(WARNING) << "KV transport: cannot "
                   << (hello ? "answer a handshake" : "acknowledge a put") << ": " << peer.status();
      continue;
    }
    SendOneWay(*peer, ack.header, std::move(ack.message));
  }
}

void UcxTransport::ExpireIncoming(absl::Time now) {
  for (auto it = incoming_puts_.begin(); it != incoming_puts_.end();) {
    if (it->second.expires <= now) {
      IncomingPut& in = it->second;
      LOG(WARNING) << "KV transport: dropped an incomplete incoming put (" << in.received
                   << " bytes, " << (in.committed ? "committed" : "never committed") << ")";
      if (in.committed && !in.transfer_id.empty()) {
        board_.Deliver(in.transfer_id, absl::DataLossError(absl::StrCat(
                                           "received ", in.received, " of ", in.total, " bytes")));
      }
      it = incoming_puts_.erase(it);
    } else {
      ++it;
    }
  }
}

void UcxTransport::OnGetRequest(const AmHeader& h, absl::string_view data) {
  auto serve = std::make_unique<Serve>();
  serve->token = h.token;
  // Parse: address, transfer id, ranges.
  if (data.size() < 4) return;
  const uint64_t address_length = ReadLe(data, 0, 4);
  if (data.size() < 8 + address_length) return;
  const std::string initiator(data.substr(4, address_length));
  const uint64_t id_length = ReadLe(data, 4 + address_length, 4);
  size_t at = 8 + address_length;
  if (id_length > kMaxTransferIdBytes || data.size() < at + id_length) return;
  serve->transfer_id = std::string(data.substr(at, id_length));
  at += id_length;
  if ((data.size() - at) % 16 != 0) return;
  if (serves_.count(h.token) != 0) {
    LOG(WARNING) << "KV transport: dropped a get request for a get already being served";
    return;
  }
  serve->initiator = initiator;
  {
    absl::MutexLock lock(&regions_mu_);
    Region* region = nullptr;
    for (; at < data.size(); at += 16) {
      const uint64_t address = ReadLe(data, at, 8), length = ReadLe(data, at + 8, 8);
      absl::StatusOr<Region*> r = RemoteAccess(address, length, h.b);
      if (!r.ok() || (region != nullptr && *r != region)) {
        serve->status =
            r.ok() ? absl::InvalidArgumentError("ranges span several regions") : r.status();
        serve->ranges.clear();
        break;
      }
      region = *r;
      serve->ranges.emplace_back(address, length);
    }
    if (serve->status.ok() && region != nullptr) {
      ++region->serving;
      serve->region = region->id;
      serve->memh = region->memh;
    }
  }
  serves_[h.token] = std::move(serve);
  // Connected to and served once ucp_worker_progress returns.
  touched_serves_.push_back(h.token);
}

void UcxTransport::PumpServe(Serve* serve) {
  if (serve->peer == 0) {
    // The first pump (never inside ucp_worker_progress): the connection to the initiator, which
    // also carries the completion of a get OnGetRequest refused.
    if (stopping_) {
      serve->status = absl::CancelledError("KV transport is shutting down");
    } else if (absl::StatusOr<Peer*> p = ReplyPeer(serve->initiator); p.ok()) {
      serve->peer = (*p)->id;
    } else {
      LOG(WARNING) << "KV transport: cannot serve a get: " << p.status();
      serve->status =
          absl::UnavailableError(absl::StrCat("initiator unreachable: ", p.status().message()));
    }
  }
  Peer* peer = FindPeer(serve->peer);
  if (peer == nullptr || peer->failed) {
    if (serve->status.ok()) serve->status = absl::UnavailableError("initiator failed");
  }
  while (serve->status.ok() && serve->next < serve->ranges.size() &&
         serve->inflight < kMaxInflightOps) {
    const auto [address, length] = serve->ranges[serve->next];
    const uint64_t chunk = std::min<uint64_t>(kAmChunkBytes, length - serve->offset);
    auto* op = new AmOp;
    op->owner = this;
    op->serve = serve->token;
    op->header = AmHeader{static_cast<uint32_t>(AmType::kGetData), 0, serve->token, serve->next,
                          serve->offset};
    ucs_status_ptr_t p = SendAm(peer, op, reinterpret_cast<const void*>(address + serve->offset),
                                chunk, serve->memh);
    if (UCS_PTR_IS_ERR(p)) {
      serve->status = UcsError("serving a get", UCS_PTR_STATUS(p));
    } else if (p != nullptr) {
      ++serve->inflight;
    }
    if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
    serve->offset += chunk;
    if (serve->offset == length) {
      ++serve->next;
      serve->offset = 0;
    }
  }
  if (serve->inflight > 0) return;
  if (serve->status.ok() && serve->next < serve->ranges.size()) return;
  // Every chunk has left (or the get failed): tell the initiator and the owner's await.
  if (peer != nullptr && !peer->failed) {
    SendOneWay(peer,
               AmHeader{static_cast<uint32_t>(AmType::kGetDone),
                        static_cast<uint32_t>(serve->status.code()), serve->token, 0, 0},
               std::string(serve->status.message()));
  }
  if (!serve->transfer_id.empty()) board_.Deliver(serve->transfer_id, serve->status);
  if (serve->region != 0) {
    absl::MutexLock lock(&regions_mu_);
    for (auto& [start, region] : regions_) {
      if (region.id == serve->region) --region.serving;
    }
  }
  serves_.erase(serve->token);
}

void UcxTransport::OnReply(const AmHeader& h, absl::string_view data) {
  auto it = transfers_.find(h.token ^ token_salt_);
  if (it == transfers_.end()) return;  // finished already (failed, cancelled): late data dropped
  Transfer* t = it->second.get();
  if (t->phase == Phase::kDone) return;
  const auto type = static_cast<AmType>(h.type);
  if (type == AmType::kGetData) {
    if (t->request.op != TransferOp::kGet || h.a >= t->request.segments.size()) return;
    const TransferSegment& s = t->request.segments[h.a];
    if (h.b > s.length || data.size() > s.length - h.b) {
      if (t->status.ok()) t->status = absl::DataLossError("get data outside its segment");
    } else if (t->status.ok()) {
      StreamingCopy(reinterpret_cast<void*>(s.local_address + h.b), data.data(), data.size());
      t->received += data.size();
    }
  } else {
    t->peer_done = true;
    if (h.code != 0 && t->status.ok()) {
      t->status = absl::Status(static_cast<absl::StatusCode>(std::min<uint32_t>(h.code, 16)),
                               absl::StrCat("peer reports: ", data));
    }
  }
  touched_.push_back(t->id);
}

// Runs inside ucp_worker_progress. What it starts that needs a connection to the sender (a put's
// acknowledgement, a get's data and completion) waits until ucp_worker_progress has returned: a
// connection made from here can crash UCX 1.13's tcp transport (see "The active-message protocol").
ucs_status_t UcxTransport::OnAm(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  if (self->stopping_) return UCS_OK;  // shutting down: nothing is served or acknowledged
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || header_length != sizeof(AmHeader)) {
    // Every Ferry message is sent eagerly with an AmHeader.
    LOG(WARNING) << "KV transport: dropped a malformed message (" << length << " bytes)";
    return UCS_OK;
  }
  AmHeader h;
  std::memcpy(&h, header, sizeof(h));
  const absl::string_view bytes(static_cast<const char*>(data), length);
  switch (static_cast<AmType>(h.type)) {
    case AmType::kNotify: {
      std::string transfer_id;
      absl::Status status;
      if (DecodeNotification(bytes, &transfer_id, &status)) {
        self->board_.Deliver(transfer_id, std::move(status));
      }
      break;
    }
    case AmType::kPutData:
      self->OnPutData(h, bytes);
      break;
    case AmType::kPutCommit:
      self->OnPutCommit(h, bytes);
      break;
    case AmType::kGetRequest:
      self->OnGetRequest(h, bytes);
      break;
    case AmType::kPutAck:
    case AmType::kGetData:
    case AmType::kGetDone:
      self->OnReply(h, bytes);
      break;
    case AmType::kHello:
      // Answered over the reply connection once ucp_worker_progress has returned.
      if (length > 0 && length <= kMaxAddressBytes) {
        self->pending_acks_.push_back(
            PendingAck{std::string(bytes),
                       AmHeader{static_cast<uint32_t>(AmType::kHelloAck), 0, h.token, 0, 0}, ""});
      }
      break;
    case AmType::kHelloAck: {
      absl::MutexLock lock(&self->peers_mu_);
      auto it = self->peer_info_.find(h.token);
      if (it != self->peer_info_.end()) it->second.ready = true;
      break;
    }
    default:
      LOG(WARNING) << "KV transport: dropped a message of unknown type " << h.type;
  }
  return UCS_OK;
}

}  // namespace ucx_internal
}  // namespace transfer
}  // namespace ferry
