// ferry-encoder as a process on the tiny LLaVA model (make_tiny_vlm, transformers): Encode twice
// (the second from the cache), FetchEmbeddings bit-identical to services/vision's ImageEncoder run
// in this process on the same directory at the same precision (f32 and bf16), chunking, Release
// then Fetch NOT_FOUND, lookups by hash, TTL expiry, bad images INVALID_ARGUMENT, the queue bound
// (RESOURCE_EXHAUSTED), single flight (two callers, one encode), a caller that leaves while
// queued (its encode skipped), the shared token, the Watch stream (at once, then on change), and
// a SIGTERM drain that completes the encode in flight, refuses new ones, shows draining on Watch
// and ends it UNAVAILABLE, and exits 0. Waits on the encoder's metrics, GetStatus and Watch, never
// sleeps (but for the TTL, whose expiry time the encoder states).
//
//   encoder_test FERRY_ENCODER   with FERRY_TINY_VLM_DIR (encoder_test.sh makes it)

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/hash128.h"
#include "engine/model/vision/vision_tower.h"
#include "ferry/v1/encoder.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/vision/image_encoder.h"
#include "tests/integration/service_process.h"

namespace ferry {
namespace {

std::string g_encoder;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TestImage(const std::string& name) {
  const std::string bytes = ReadFile(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/ferry/media/image/testdata/fuzz_corpus/", name));
  EXPECT_FALSE(bytes.empty()) << name;
  return bytes;
}

std::string ModelDir() {
  const char* dir = std::getenv("FERRY_TINY_VLM_DIR");
  return dir == nullptr ? "" : absl::StrCat(dir, "/llama");
}

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// Waits until `metric` on the admin port reaches `value` (30 s at most).
bool WaitForMetric(int admin_port, const std::string& metric, double value) {
  return WaitUntil([&] { return MetricValue(admin_port, metric) >= value; });
}

class Client {
 public:
  explicit Client(const std::string& address)
      : stub_(ferry::v1::Encoder::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

  grpc::Status Encode(const std::string& bytes, ferry::v1::EncodeResponse* out,
                      absl::Duration timeout = absl::Seconds(60),
                      const ferry::v1::Hash128* hash = nullptr, const std::string& token = "") {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    ferry::v1::EncodeRequest request;
    request.set_image_data(bytes);
    if (hash != nullptr) *request.mutable_content_hash() = *hash;
    return stub_->Encode(&context, request, out);
  }

  // The rows' bytes, reassembled; the chunks seen.
  grpc::Status Fetch(const std::string& handle, std::string* bytes, int* chunks = nullptr,
                     ferry::v1::EmbeddingsInfo* info = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    ferry::v1::FetchEmbeddingsRequest request;
    request.set_handle(handle);
    auto reader = stub_->FetchEmbeddings(&context, request);
    ferry::v1::EmbeddingsChunk chunk;
    bytes->clear();
    int n = 0;
    while (reader->Read(&chunk)) {
      if (n == 0 && info != nullptr) *info = chunk.info();
      EXPECT_EQ(chunk.offset(), bytes->size());
      bytes->append(chunk.data());
      ++n;
    }
    if (chunks != nullptr) *chunks = n;
    return reader->Finish();
  }

  grpc::Status Release(const std::string& handle) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    ferry::v1::ReleaseRequest request;
    request.set_handle(handle);
    ferry::v1::ReleaseResponse response;
    return stub_->Release(&context, request, &response);
  }

  // A Watch stream (30 s deadline) on `context`.
  std::unique_ptr<grpc::ClientReader<ferry::v1::EncoderStatus>> Watch(
      grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return stub_->Watch(context, ferry::v1::EncoderWatchRequest());
  }

  grpc::Status Status(ferry::v1::EncoderStatus* out) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return stub_->GetStatus(&context, ferry::v1::EncoderStatusRequest(), out);
  }

 private:
  std::unique_ptr<ferry::v1::Encoder::Stub> stub_;
};

// The rows ImageEncoder gives in this process, as the bytes FetchEmbeddings sends.
std::string InProcessRows(const std::string& dir, VisionPrecision precision,
                          const std::string& image) {
  absl::StatusOr<VisionTower> tower = VisionTower::Load(dir, precision);
  EXPECT_TRUE(tower.ok()) << tower.status();
  if (!tower.ok()) return "";
  const int64_t tokens = tower->num_image_tokens();
  auto encoder = ImageEncoder::Create(dir, *std::move(tower), media::ImageLimits{});
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  if (!encoder.ok()) return "";
  auto rows = (*encoder)->Encode(image, Xxh3Hash128(image), tokens);
  EXPECT_TRUE(rows.ok()) << rows.status();
  if (!rows.ok()) return "";
  return std::string(reinterpret_cast<const char*>((*rows)->data()),
                     (*rows)->size() * sizeof(float));
}

std::vector<std::string> Args(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--model", ModelDir()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

class EncoderPrecisionTest : public ::testing::TestWithParam<const char*> {};

TEST_P(EncoderPrecisionTest, EncodeCachedFetchBitIdenticalRelease) {
  const std::string weights = GetParam();
  ServiceProcess encoder(g_encoder, Args({"--weights", weights, "--max_chunk_bytes", "1KiB"}));
  ASSERT_TRUE(encoder.ready()) << encoder.LogTail();
  Client client(encoder.address());
  const VisionPrecision precision =
      weights == "f32" ? VisionPrecision::kF32 : VisionPrecision::kBf16;
  grpc::ClientContext watch_context;
  auto watch = client.Watch(&watch_context);
  ferry::v1::EncoderStatus watched;
  ASSERT_TRUE(watch->Read(&watched));  // at once
  EXPECT_EQ(watched.endpoint(), encoder.address());
  EXPECT_EQ(watched.images_encoded(), 0u);
  EXPECT_EQ(watched.num_image_tokens(), 16u);

  for (const char* name : {"rgb.png", "orient6.jpg"}) {
    SCOPED_TRACE(name);
    const std::string image = TestImage(name);
    ferry::v1::EncodeResponse first, second;
    const absl::Time t0 = absl::Now();
    ASSERT_TRUE(client.Encode(image, &first).ok());
    const absl::Time t1 = absl::Now();
    EXPECT_FALSE(first.cached());
    ASSERT_TRUE(client.Encode(image, &second).ok());
    const absl::Time t2 = absl::Now();
    EXPECT_TRUE(second.cached());
    std::printf("%s %s (%zu bytes): Encode %.2f ms, cached Encode %.2f ms\n", weights.c_str(), name,
                image.size(), absl::ToDoubleMilliseconds(t1 - t0),
                absl::ToDoubleMilliseconds(t2 - t1));
    const Hash128 hash = Xxh3Hash128(image);
    EXPECT_EQ(first.content_hash().lo(), hash.lo);
    EXPECT_EQ(first.content_hash().hi(), hash.hi);
    EXPECT_NE(first.embeddings().handle(), second.embeddings().handle());
    EXPECT_EQ(first.embeddings().dtype(), ferry::v1::D_TYPE_F32);
    EXPECT_EQ(first.embeddings().size_bytes(),
              uint64_t{first.embeddings().num_tokens()} * first.embeddings().hidden_size() * 4);

    std::string a, b;
    int chunks = 0;
    ferry::v1::EmbeddingsInfo info;
    ASSERT_TRUE(client.Fetch(first.embeddings().handle(), &a, &chunks, &info).ok());
    EXPECT_EQ(a.size(), first.embeddings().size_bytes());
    EXPECT_EQ(chunks, static_cast<int>((a.size() + 1023) / 1024));  // --max_chunk_bytes 1KiB
    EXPECT_GT(chunks, 1);
    EXPECT_EQ(info.num_tokens(), first.embeddings().num_tokens());
    EXPECT_EQ(info.vision_digest().lo(), first.embeddings().vision_digest().lo());
    ASSERT_TRUE(client.Fetch(second.embeddings().handle(), &b).ok());
    EXPECT_EQ(a, b);
    EXPECT_TRUE(a == InProcessRows(ModelDir(), precision, image))
        << "the encoder's rows differ from ImageEncoder's in this process";

    // Release: that handle is gone, the other stays; Release is idempotent.
    ASSERT_TRUE(client.Release(first.embeddings().handle()).ok());
    EXPECT_EQ(client.Fetch(first.embeddings().handle(), &a).error_code(),
              grpc::StatusCode::NOT_FOUND);
    EXPECT_TRUE(client.Release(first.embeddings().handle()).ok());
    EXPECT_TRUE(client.Fetch(second.embeddings().handle(), &b).ok());

    // A lookup by hash alone.
    ferry::v1::EncodeResponse looked;
    ASSERT_TRUE(client.Encode("", &looked, absl::Seconds(30), &first.content_hash()).ok());
    EXPECT_TRUE(looked.cached());
    std::string c;
    ASSERT_TRUE(client.Fetch(looked.embeddings().handle(), &c).ok());
    EXPECT_EQ(c, b);
  }
  ferry::v1::Hash128 unknown;
  unknown.set_lo(1);
  ferry::v1::EncodeResponse none;
  EXPECT_EQ(client.Encode("", &none, absl::Seconds(30), &unknown).error_code(),
            grpc::StatusCode::NOT_FOUND);

  while (watched.images_encoded() < 2 && watch->Read(&watched)) {  // the stream sees the change
  }
  EXPECT_EQ(watched.images_encoded(), 2u);
  watch_context.TryCancel();
  ferry::v1::EncoderStatus status;
  ASSERT_TRUE(client.Status(&status).ok());
  EXPECT_EQ(status.model(), "llama");
  EXPECT_EQ(status.endpoint(), encoder.address());
  EXPECT_EQ(status.images_encoded(), 2u);
  EXPECT_EQ(status.cache_hits(), 4u);
  EXPECT_EQ(status.handles(), 4u);  // 2 per image: 2 kept, 1 released, 1 lookup
  EXPECT_EQ(MetricValue(encoder.admin_port(), "ferry_encoder_images_encoded_total"), 2);
  EXPECT_EQ(MetricValue(encoder.admin_port(), "ferry_encoder_cache_lookups_total{result=\"hit\"}"),
            4);  // per image: the second Encode and the lookup by hash
  EXPECT_GT(MetricValue(encoder.admin_port(), "ferry_encoder_fetch_bytes_total"), 0);
  EXPECT_EQ(HttpGet(encoder.admin_port(), "/readyz"), 200);
  EXPECT_EQ(HttpGet(encoder.admin_port(), "/healthz"), 200);
}

INSTANTIATE_TEST_SUITE_P(Weights, EncoderPrecisionTest, ::testing::Values("f32", "bf16"));

TEST(EncoderTest, BadImagesAreInvalidArgument) {
  ServiceProcess encoder(g_encoder, Args({"--max_image_bytes", "64KiB"}));
  ASSERT_TRUE(encoder.ready()) << encoder.LogTail();
  Client client(encoder.address());
  ferry::v1::EncodeResponse out;
  for (const char* name : {"truncated_rgb.png", "truncated_base.jpg", "huge_dims.png"}) {
    const grpc::Status s = client.Encode(TestImage(name), &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << name << ": " << s.error_message();
  }
  EXPECT_EQ(client.Encode("not an image at all", &out).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(client.Encode(std::string(65 << 10, 'x'), &out).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ferry::v1::Hash128 wrong;
  wrong.set_lo(7);
  EXPECT_EQ(client.Encode(TestImage("rgb.png"), &out, absl::Seconds(30), &wrong).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(client.Encode("", &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The encoder is fine after them.
  EXPECT_TRUE(client.Encode(TestImage("rgb.png"), &out).ok());
  EXPECT_EQ(MetricValue(encoder.admin_port(), "ferry_encoder_images_encoded_total"), 1);
}

TEST(EncoderTest, HandlesExpireAfterTheirTtl) {
  ServiceProcess encoder(g_encoder, Args({"--embeddings_ttl", "300ms"}));
  ASSERT_TRUE(encoder.ready()) << encoder.LogTail();
  Client client(encoder.address());
  ferry::v1::EncodeResponse out;
  ASSERT_TRUE(client.Encode(TestImage("rgb.png"), &out).ok());
  const absl::Time expires = absl::FromUnixMillis(out.embeddings().expires_unix_ms());
  EXPECT_LE(expires, absl::Now() + absl::Milliseconds(300));
  // The handle goes (the event: a Fetch answers NOT_FOUND), and not before its stated expiry.
  std::string bytes;
  grpc::StatusCode code = grpc::StatusCode::OK;
  ASSERT_TRUE(WaitUntil([&] {
    code = client.Fetch(out.embeddings().handle(), &bytes).error_code();
    EXPECT_TRUE(code == grpc::StatusCode::OK || absl::Now() >= expires) << code;
    return code != grpc::StatusCode::OK;
  }));
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
  // The embeddings stay cached (unpinned): the next Encode is a hit.
  ASSERT_TRUE(client.Encode(TestImage("rgb.png"), &out).ok());
  EXPECT_TRUE(out.cached());
}

TEST(EncoderTest, QueueBoundSingleFlightAndCallersWhoLeave) {
  const std::string hold = TmpPath("queue_hold");
  { std::ofstream(hold) << "hold"; }
  ServiceProcess encoder(g_encoder, Args({"--max_queued", "1", "--encode_hold_file", hold}));
  ASSERT_TRUE(encoder.ready()) << encoder.LogTail();
  const int admin = encoder.admin_port();
  Client client(encoder.address());
  const std::string a = TestImage("rgb.png"), b = TestImage("base.jpg"), c = TestImage("s444.jpg"),
                    d = TestImage("grey.jpg");

  // a runs (held), twice: one flight.
  auto a1 = std::async(std::launch::async, [&] {
    ferry::v1::EncodeResponse r;
    return std::make_pair(client.Encode(a, &r), r);
  });
  ASSERT_TRUE(WaitForMetric(admin, "ferry_encoder_encoding", 1)) << encoder.LogTail();
  auto a2 = std::async(std::launch::async, [&] {
    ferry::v1::EncodeResponse r;
    return std::make_pair(client.Encode(a, &r), r);
  });
  ASSERT_TRUE(WaitForMetric(admin, "ferry_encoder_cache_lookups_total{result=\"miss\"}", 2));
  // b waits in the queue with a short deadline and leaves.
  ferry::v1::EncodeResponse rb;
  auto b1 = std::async(std::launch::async,
                       [&] { return client.Encode(b, &rb, absl::Milliseconds(500)); });
  ASSERT_TRUE(WaitForMetric(admin, "ferry_encoder_queue_depth", 1));
  // The queue is full: c is refused at once.
  ferry::v1::EncodeResponse rc;
  const grpc::Status refused = client.Encode(c, &rc);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_EQ(MetricValue(admin, "ferry_encoder_refused_total{reason=\"queue_full\"}"), 1);
  EXPECT_EQ(b1.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  std::remove(hold.c_str());
  auto [s1, r1] = a1.get();
  auto [s2, r2] = a2.get();
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  ASSERT_TRUE(s2.ok()) << s2.error_message();
  EXPECT_NE(r1.embeddings().handle(), r2.embeddings().handle());
  EXPECT_FALSE(r1.cached());
  EXPECT_FALSE(r2.cached());
  // b's job found its caller gone: skipped, never encoded.
  ASSERT_TRUE(WaitForMetric(admin, "ferry_encoder_cancelled_total", 1));
  EXPECT_EQ(MetricValue(admin, "ferry_encoder_images_encoded_total"), 1);
  // The executor is free again.
  ferry::v1::EncodeResponse rd;
  EXPECT_TRUE(client.Encode(d, &rd).ok());
  EXPECT_EQ(MetricValue(admin, "ferry_encoder_images_encoded_total"), 2);
}

TEST(EncoderTest, SharedToken) {
  const std::string file = TmpPath("token");
  const std::string token = "encoder-test-token-0123456789";
  { std::ofstream(file) << token << "\n"; }
  ServiceProcess encoder(g_encoder, Args({"--auth_token_file", file}));
  ASSERT_TRUE(encoder.ready()) << encoder.LogTail();
  Client client(encoder.address());
  ferry::v1::EncodeResponse out;
  EXPECT_EQ(client.Encode(TestImage("rgb.png"), &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(client.Encode(TestImage("rgb.png"), &out, absl::Seconds(60), nullptr, token).ok());
}

TEST(EncoderTest, SigtermDrainsTheEncodeInFlightAndExitsZero) {
  const std::string hold = TmpPath("drain_hold");
  { std::ofstream(hold) << "hold"; }
  ServiceProcess encoder(g_encoder, Args({"--encode_hold_file", hold}));
  ASSERT_TRUE(encoder.ready()) << encoder.LogTail();
  const int admin = encoder.admin_port();
  auto owned = std::make_unique<Client>(encoder.address());
  Client& client = *owned;
  auto in_flight = std::async(std::launch::async, [&] {
    ferry::v1::EncodeResponse r;
    return std::make_pair(client.Encode(TestImage("rgb.png"), &r), r);
  });
  ASSERT_TRUE(WaitForMetric(admin, "ferry_encoder_encoding", 1)) << encoder.LogTail();
  auto watch_context = std::make_unique<grpc::ClientContext>();
  auto watch = client.Watch(watch_context.get());
  ferry::v1::EncoderStatus watched;
  ASSERT_TRUE(watch->Read(&watched));
  EXPECT_FALSE(watched.draining());
  encoder.Signal(SIGTERM);
  // The Watch stream says so (the drain cannot end before the hold goes).
  while (!watched.draining() && watch->Read(&watched)) {
  }
  EXPECT_TRUE(watched.draining());
  // Draining: not ready, and a new Encode is refused.
  ferry::v1::EncoderStatus status;
  ASSERT_TRUE(WaitUntil([&] { return client.Status(&status).ok() && status.draining(); }));
  EXPECT_EQ(HttpGet(admin, "/readyz"), 503);
  ASSERT_TRUE(WaitForMetric(admin, "ferry_encoder_encoding", 1));
  ferry::v1::EncodeResponse refused;
  EXPECT_EQ(client.Encode(TestImage("base.jpg"), &refused).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  std::remove(hold.c_str());
  auto [done, response] = in_flight.get();
  EXPECT_TRUE(done.ok()) << done.error_message();
  EXPECT_FALSE(response.embeddings().handle().empty());
  while (watch->Read(&watched)) {  // the drain ends the stream
  }
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  // gRPC's shutdown waits about 5 s for a connected client to go.
  watch.reset();
  watch_context.reset();
  owned.reset();
  EXPECT_EQ(encoder.WaitForExit(absl::Seconds(60)), 0) << encoder.LogTail();
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2 || std::getenv("FERRY_TINY_VLM_DIR") == nullptr) {
    std::fprintf(stderr, "usage: encoder_test FERRY_ENCODER (with FERRY_TINY_VLM_DIR)\n");
    return 2;
  }
  ferry::g_encoder = argv[1];
  return RUN_ALL_TESTS();
}
