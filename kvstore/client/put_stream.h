// One ferry.v1.KvStore/Put call whose values are sent from the caller's memory (the KV store
// client's Put; kvstore/client/kv_client.h). A generated ClientWriter<PutChunk> takes a message
// whose `data` field is a std::string: the value is copied into it, then again when gRPC
// serializes the message. Here each message goes to gRPC as two slices: the chunk's other fields,
// serialized, with the `data` field's tag and length, then the caller's bytes themselves as a
// static slice (grpc::Slice::STATIC_SLICE), which gRPC frames and hands to the socket without
// copying them. On the wire it is the same PutChunk (protobuf fields may come in any order), so
// nodes see no difference.
//
//   PutStream stream(generic_stub, &context);               // context: deadline, metadata
//   stream.Write(chunk_without_data, value.substr(0, n));   // false: the stream is broken
//   grpc::Status status = stream.Finish(&response);
//
// The bytes passed to Write must stay valid and unchanged until Finish returns (gRPC may still
// hold them until the call ends); the pool blocks a StoreWriter sends keep their references until
// the Put returns. Thread-compatible: one caller thread; gRPC's callback threads report to it.
// Every wait ends with the call: its context's deadline bounds it.

#ifndef FERRY_KVSTORE_CLIENT_PUT_STREAM_H_
#define FERRY_KVSTORE_CLIENT_PUT_STREAM_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/strings/string_view.h"
#include "ferry/v1/kvstore.pb.h"

namespace ferry {
namespace kv {

class PutStream {
 public:
  // Starts the call. `stub` and `context` must outlive the stream.
  PutStream(grpc::GenericStub* stub, grpc::ClientContext* context);
  // Finishes the call if Finish was not called.
  ~PutStream();
  PutStream(const PutStream&) = delete;
  PutStream& operator=(const PutStream&) = delete;

  // Sends `chunk` (its `data` empty) with `data` as its data; returns once gRPC took the
  // message. False when the stream is broken (Finish says why); nothing more can be written.
  bool Write(const ferry::v1::PutChunk& chunk, absl::string_view data);

  // Ends the writes (if the stream is not broken) and waits for the node's answer. Once.
  grpc::Status Finish(ferry::v1::PutResponse* response);

 private:
  class Reactor;
  std::shared_ptr<Reactor> reactor_;
  bool finished_ = false;
};

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_CLIENT_PUT_STREAM_H_
