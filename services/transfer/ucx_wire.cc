#include "services/transfer/ucx_wire.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/transfer/kv_transport.h"

namespace ferry {
namespace transfer {
namespace ucx_internal {

std::string EncodeIdentity(const ProcessIdentity& id) {
  std::string out = id.boot_id;
  AppendLe(&out, id.pid_namespace, 8);
  AppendLe(&out, id.pid, 4);
  AppendLe(&out, id.start_time, 8);
  return out;
}

ProcessIdentity DecodeIdentity(absl::string_view in) {
  ProcessIdentity id;
  id.boot_id = std::string(in.substr(0, kBootIdBytes));
  id.pid_namespace = ReadLe(in, kBootIdBytes, 8);
  id.pid = static_cast<uint32_t>(ReadLe(in, kBootIdBytes + 8, 4));
  id.start_time = ReadLe(in, kBootIdBytes + 12, 8);
  return id;
}

std::string EncodeDataEndpoint(const DataEndpoint& endpoint) {
  std::string out;
  AppendLe(&out, endpoint.port, 2);
  const size_t count = std::min(endpoint.ipv4.size(), kMaxDataAddresses);
  AppendLe(&out, count, 1);
  for (size_t i = 0; i < kMaxDataAddresses; ++i) {
    AppendLe(&out, i < count ? endpoint.ipv4[i] : 0, 4);
  }
  return out;
}

DataEndpoint DecodeDataEndpoint(absl::string_view in) {
  DataEndpoint endpoint;
  endpoint.port = static_cast<uint16_t>(ReadLe(in, 0, 2));
  const size_t count = std::min<size_t>(ReadLe(in, 2, 1), kMaxDataAddresses);
  for (size_t i = 0; i < count; ++i) {
    endpoint.ipv4.push_back(static_cast<uint32_t>(ReadLe(in, 3 + 4 * i, 4)));
  }
  return endpoint;
}

std::string EncodeNotification(const std::string& transfer_id, const absl::Status& status) {
  std::string out;
  const uint32_t code = static_cast<uint32_t>(status.code());
  const uint32_t length = static_cast<uint32_t>(transfer_id.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(code >> (8 * i)));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(length >> (8 * i)));
  out += transfer_id;
  out.append(status.message().data(), std::min<size_t>(status.message().size(), 512));
  return out;
}

bool DecodeNotification(absl::string_view in, std::string* transfer_id, absl::Status* status) {
  if (in.size() < 8) return false;
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
    return v;
  };
  const uint32_t code = u32(0), length = u32(4);
  if (length > kMaxTransferIdBytes || in.size() < 8 + length || code > 16) return false;
  *transfer_id = std::string(in.substr(8, length));
  const absl::string_view message = in.substr(8 + length);
  *status = code == 0 ? absl::OkStatus()
                      : absl::Status(static_cast<absl::StatusCode>(code),
                                     absl::StrCat("initiator reports: ", message));
  return true;
}

}  // namespace ucx_internal
}  // namespace transfer
}  // namespace ferry
