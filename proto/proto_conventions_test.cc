// Checks the conventions of shared/design/STYLE.md §8 on every compiled ferry.v1 file: the
// versioned package, enums whose zero value is <ENUM_NAME>_UNSPECIFIED, and plural names for
// repeated fields.

#include <string>
#include <vector>

#include "ferry/v1/common.pb.h"
#include "ferry/v1/encoder.pb.h"
#include "ferry/v1/kvstore.pb.h"
#include "ferry/v1/transfer.pb.h"
#include "ferry/v1/worker.pb.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;

std::vector<const FileDescriptor*> FerryFiles() {
  return {
      ferry::v1::Hash128::descriptor()->file(),
      ferry::v1::WorkerStatus::descriptor()->file(),
      ferry::v1::ExistsRequest::descriptor()->file(),
      ferry::v1::EncodeRequest::descriptor()->file(),
      ferry::v1::TransferWriteChunk::descriptor()->file(),
  };
}

// "TRAFFIC_CLASS" for "TrafficClass", "D_TYPE" for "DType".
std::string UpperSnake(const std::string& camel) {
  std::string out;
  for (char c : camel) {
    if (c >= 'A' && c <= 'Z' && !out.empty()) out.push_back('_');
    out.push_back(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  }
  return out;
}

void CheckEnum(const EnumDescriptor* e) {
  SCOPED_TRACE(e->full_name());
  ASSERT_GT(e->value_count(), 0);
  EXPECT_EQ(e->value(0)->number(), 0);
  EXPECT_EQ(e->value(0)->name(), UpperSnake(e->name()) + "_UNSPECIFIED");
  for (int i = 1; i < e->value_count(); ++i) {
    EXPECT_EQ(e->value(i)->name().rfind(UpperSnake(e->name()) + "_", 0), 0u)
        << e->value(i)->name() << " lacks the enum's prefix";
  }
}

void CheckMessage(const Descriptor* m) {
  SCOPED_TRACE(m->full_name());
  for (int i = 0; i < m->field_count(); ++i) {
    const FieldDescriptor* f = m->field(i);
    if (f->is_repeated() && !f->is_map()) {
      EXPECT_EQ(f->name().back(), 's') << f->name() << " is repeated but not plural";
    }
  }
  for (int i = 0; i < m->enum_type_count(); ++i) CheckEnum(m->enum_type(i));
  for (int i = 0; i < m->nested_type_count(); ++i) CheckMessage(m->nested_type(i));
}

TEST(ProtoConventionsTest, PackageIsVersioned) {
  for (const FileDescriptor* file : FerryFiles()) {
    EXPECT_EQ(file->package(), "ferry.v1") << file->name();
    EXPECT_EQ(file->syntax(), FileDescriptor::SYNTAX_PROTO3) << file->name();
  }
}

TEST(ProtoConventionsTest, EnumsStartAtUnspecified) {
  int enums = 0;
  for (const FileDescriptor* file : FerryFiles()) {
    for (int i = 0; i < file->enum_type_count(); ++i) {
      CheckEnum(file->enum_type(i));
      ++enums;
    }
  }
  EXPECT_GE(enums, 9);  // the top-level enums of ferry.v1 today; more may come
}

TEST(ProtoConventionsTest, RepeatedFieldsArePlural) {
  for (const FileDescriptor* file : FerryFiles()) {
    for (int i = 0; i < file->message_type_count(); ++i) CheckMessage(file->message_type(i));
  }
}

TEST(ProtoConventionsTest, ServicesHaveTheBriefsMethods) {
  const auto* worker = ferry::v1::WorkerStatus::descriptor()->file()->FindServiceByName("Worker");
  ASSERT_NE(worker, nullptr);
  for (const char* method : {"Prefill", "Generate", "KvReady", "Abort", "Drain", "Watch"}) {
    EXPECT_NE(worker->FindMethodByName(method), nullptr) << method;
  }
  EXPECT_TRUE(worker->FindMethodByName("Generate")->server_streaming());
  EXPECT_TRUE(worker->FindMethodByName("Watch")->server_streaming());

  const auto* store = ferry::v1::ExistsRequest::descriptor()->file()->FindServiceByName("KvStore");
  ASSERT_NE(store, nullptr);
  for (const char* method : {"Exists", "Get", "Put", "Delete", "Stats"}) {
    EXPECT_NE(store->FindMethodByName(method), nullptr) << method;
  }
  EXPECT_TRUE(store->FindMethodByName("Put")->client_streaming());
}

TEST(ProtoConventionsTest, TokenChunkRoundTrips) {
  ferry::v1::TokenChunk chunk;
  chunk.set_request_id("req-1");
  chunk.set_first_output_index(7);
  chunk.add_token_ids(42);
  chunk.add_token_ids(4294967295u);
  chunk.set_finish_reason(ferry::v1::FINISH_REASON_LENGTH);
  std::string wire;
  ASSERT_TRUE(chunk.SerializeToString(&wire));
  ferry::v1::TokenChunk back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.request_id(), "req-1");
  EXPECT_EQ(back.first_output_index(), 7u);
  ASSERT_EQ(back.token_ids_size(), 2);
  EXPECT_EQ(back.token_ids(1), 4294967295u);
  EXPECT_EQ(back.finish_reason(), ferry::v1::FINISH_REASON_LENGTH);
}

}  // namespace
}  // namespace ferry
