// Conversions between the KV store's wire types (proto/ferry/v1) and the library's, shared by
// the service, the client and the operator tool.

#ifndef FERRY_KVSTORE_WIRE_H_
#define FERRY_KVSTORE_WIRE_H_

#include "engine/common/hash128.h"
#include "ferry/v1/common.pb.h"
#include "kvstore/format.h"

namespace ferry {
namespace kv {

inline Hash128 HashFromProto(const ferry::v1::Hash128& h) { return Hash128{h.lo(), h.hi()}; }

inline void HashToProto(const Hash128& h, ferry::v1::Hash128* out) {
  out->set_lo(h.lo);
  out->set_hi(h.hi);
}

// UNSPECIFIED (and any class this build does not know) is chat.
inline TrafficClass ClassFromProto(ferry::v1::TrafficClass c) {
  switch (c) {
    case ferry::v1::TRAFFIC_CLASS_AGENT:
      return TrafficClass::kAgent;
    case ferry::v1::TRAFFIC_CLASS_BATCH:
      return TrafficClass::kBatch;
    default:
      return TrafficClass::kChat;
  }
}

inline ferry::v1::TrafficClass ClassToProto(TrafficClass c) {
  switch (c) {
    case TrafficClass::kChat:
      return ferry::v1::TRAFFIC_CLASS_CHAT;
    case TrafficClass::kAgent:
      return ferry::v1::TRAFFIC_CLASS_AGENT;
    case TrafficClass::kBatch:
      return ferry::v1::TRAFFIC_CLASS_BATCH;
  }
  return ferry::v1::TRAFFIC_CLASS_UNSPECIFIED;
}

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_WIRE_H_
