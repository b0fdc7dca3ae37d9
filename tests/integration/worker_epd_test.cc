// The worker half of E/P/D: ferry-encoder and ferry-worker as processes on the tiny LLaVA model
// (make_tiny_vlm, transformers). Images encoded by the encoder (Encode -> a handle) and named in a
// request by handle (PromptImage.embeddings_handle + encoder_endpoint) are fetched by the worker
// (FetchEmbeddings) and stream the same tokens, bit for bit, as the same request with the image
// bytes inline and as the engine in this process: aggregated, with 1 and 2 images, and split
// (a prefill worker and a decode worker, each fetching). Failures are prompt and named: a released
// handle, a SIGKILLed encoder, a stream cut or short or out of order, an encoder slower than
// --image_fetch_timeout: UNAVAILABLE (the router encodes again); an encoder of another vision
// tower (make_tiny_vlm --seed 1) or a non-finite value FAILED_PRECONDITION; a token count not the
// placeholders' and image bytes with a handle INVALID_ARGUMENT; the worker serves on after each.
// A caller who leaves mid-fetch stops it at once; the request's deadline bounds it. The fetch
// carries the worker's shared token. The fetch metrics count each outcome. Waits on metrics and
// events, never sleeps.
//
//   worker_epd_test FERRY_WORKER MAKE_TINY_MODEL   with FERRY_TINY_VLM_DIR (llama/, llama_seed1/)
//   and FERRY_ENCODER (worker_epd_test.sh sets both)

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/v1/encoder.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvstore/wire.h"
#include "nlohmann/json.hpp"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

std::string EncoderBinary() {
  const char* bin = std::getenv("FERRY_ENCODER");
  EXPECT_NE(bin, nullptr) << "FERRY_ENCODER is not set (run through worker_epd_test.sh)";
  return bin == nullptr ? "" : bin;
}

std::unique_ptr<ServiceProcess> StartEncoder(const std::string& dir) {
  return std::make_unique<ServiceProcess>(EncoderBinary(),
                                          std::vector<std::string>{"--model", dir});
}

// Encode on the encoder at `address`: the handle (empty, with a failure, when refused).
std::string EncodeOn(const std::string& address, const std::string& bytes,
                     const std::string& token = "") {
  auto stub =
      v1::Encoder::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1::EncodeRequest request;
  request.set_image_data(bytes);
  v1::EncodeResponse response;
  const grpc::Status s = stub->Encode(&context, request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response.embeddings().handle();
}

void ReleaseOn(const std::string& address, const std::string& handle) {
  auto stub =
      v1::Encoder::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::ReleaseRequest request;
  request.set_handle(handle);
  v1::ReleaseResponse response;
  EXPECT_TRUE(stub->Release(&context, request, &response).ok());
}

// The same request with each image named by its handle on `encoder` instead of its bytes (the
// content hash stays: it is the image's identity in the block hashes).
v1::GenerateRequest ByHandle(v1::GenerateRequest r, const std::string& id,
                             const std::vector<std::string>& handles, const std::string& encoder) {
  r.mutable_request()->mutable_context()->set_request_id(id);
  for (int i = 0; i < r.request().images_size(); ++i) {
    v1::PromptImage* p = r.mutable_request()->mutable_images(i);
    p->clear_image_data();
    p->set_embeddings_handle(handles[static_cast<size_t>(i)]);
    p->set_encoder_endpoint(encoder);
  }
  return r;
}

std::string Fetches(const std::string& outcome) {
  return absl::StrCat("ferry_worker_image_fetches_total{outcome=\"", outcome, "\"}");
}

Sampling Greedy() {
  Sampling greedy;
  greedy.ignore_eos = true;
  greedy.max_tokens = 16;
  return greedy;
}

TEST(WorkerEpdTest, EmbeddingsByHandleStreamAsImageBytesInline) {
  const TinyVlm vlm = LoadTinyVlm("llama");
  auto encoder = StartEncoder(vlm.dir);
  auto worker = StartWorker(vlm.dir);
  ASSERT_TRUE(encoder->ready()) << encoder->LogTail();
  ASSERT_TRUE(worker->ready()) << worker->LogTail();
  const uint32_t p = vlm.image_tokens;
  const std::string png = TestImage("rgb.png"), jpeg = TestImage("orient6.jpg");
  const std::vector<v1::GenerateRequest> inline_requests = {
      ImageRequest("one", vlm, 10 + static_cast<int>(p) + 13, 1, {{10, png}}, Greedy()),
      ImageRequest("two", vlm, 7 + 2 * static_cast<int>(p) + 20, 2, {{7, jpeg}, {7 + p + 9, png}},
                   Greedy()),
  };
  const std::vector<std::vector<std::string>> handles = {
      {EncodeOn(encoder->address(), png)},
      {EncodeOn(encoder->address(), jpeg), EncodeOn(encoder->address(), png)},
  };
  WorkerClient client(worker->address());
  for (size_t i = 0; i < inline_requests.size(); ++i) {
    InProcessEngine ref(vlm.dir);
    const ChoiceOutput want = ref.Run(inline_requests[i])[0];
    ASSERT_EQ(want.tokens.size(), 16u);
    GenerateResult bytes = client.Generate(inline_requests[i], absl::Seconds(60));
    ASSERT_TRUE(bytes.status.ok()) << bytes.status.error_message();
    ExpectSameOutput(bytes.choices[0], want, absl::StrCat("inline bytes ", i));
    // Another worker, cold: nothing of the image in its prefix cache.
    auto cold = StartWorker(vlm.dir);
    ASSERT_TRUE(cold->ready());
    WorkerClient cold_client(cold->address());
    const v1::GenerateRequest request =
        ByHandle(inline_requests[i], absl::StrCat("handle-", i), handles[i], encoder->address());
    GenerateResult got = cold_client.Generate(request, absl::Seconds(60));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << cold->LogTail();
    EXPECT_EQ(got.usage.cached_tokens(), 0u);
    ExpectSameOutput(got.choices[0], want, absl::StrCat("by handle ", i));
    const double images = static_cast<double>(handles[i].size());
    EXPECT_EQ(MetricValue(cold->admin_port(), Fetches("fetched")), images);
    EXPECT_EQ(MetricValue(cold->admin_port(), "ferry_worker_image_fetched_bytes_total"),
              images * p * static_cast<double>(vlm.hidden) * 4);
    EXPECT_EQ(MetricValue(cold->admin_port(), "ferry_worker_image_fetch_seconds_count"), images);
    // The same worker again: the prefix cache holds the image's blocks (the content hash is
    // the identity, whichever way the rows came).
    GenerateResult hot = cold_client.Generate(
        ByHandle(inline_requests[i], absl::StrCat("hot-", i), handles[i], encoder->address()),
        absl::Seconds(60));
    ASSERT_TRUE(hot.status.ok()) << hot.status.error_message();
    EXPECT_GT(hot.usage.cached_tokens(), 0u);
    ExpectSameOutput(hot.choices[0], want, absl::StrCat("by handle, hot ", i));
  }

  // Split: the decode worker reserves (fetching the rows it would recompute with), the prefill
  // worker fetches and computes; the stream is the aggregated one.
  auto role = [](const std::string& r) {
    return std::vector<std::string>{"--role=" + r, "--transport=grpc"};
  };
  auto pw = StartWorker(vlm.dir, role("prefill"));
  auto dw = StartWorker(vlm.dir, role("decode"));
  ASSERT_TRUE(pw->ready() && dw->ready());
  WorkerClient prefill(pw->address()), decode(dw->address());
  InProcessEngine ref(vlm.dir);
  const ChoiceOutput want = ref.Run(inline_requests[1])[0];
  PdResult split = RunPd(decode, dw->address(), prefill,
                         ByHandle(inline_requests[1], "split", handles[1], encoder->address()));
  ASSERT_TRUE(split.stream.status.ok()) << split.stream.status.error_message();
  ASSERT_TRUE(split.prefill.ok()) << split.prefill.error_message() << "\n" << pw->LogTail();
  ExpectSameOutput(split.stream.choices[0], want, "split by handle");
  EXPECT_EQ(MetricValue(pw->admin_port(), Fetches("fetched")), 2);
}

TEST(WorkerEpdTest, AGoneHandleOrEncoderIsUnavailableAndTheWorkerServesOn) {
  const TinyVlm vlm = LoadTinyVlm("llama");
  auto encoder = StartEncoder(vlm.dir);
  auto worker = StartWorker(vlm.dir);
  ASSERT_TRUE(encoder->ready() && worker->ready());
  const uint32_t p = vlm.image_tokens;
  const std::string png = TestImage("rgb.png");
  const v1::GenerateRequest inline_request =
      ImageRequest("healthy", vlm, 4 + static_cast<int>(p) + 9, 3, {{4, png}}, Greedy());
  InProcessEngine ref(vlm.dir);
  const ChoiceOutput want = ref.Run(inline_request)[0];
  WorkerClient client(worker->address());
  const int admin = worker->admin_port();
  auto expect_healthy = [&](const std::string& what) {
    v1::GenerateRequest again = inline_request;
    again.mutable_request()->mutable_context()->set_request_id("healthy-" + what);
    GenerateResult ok = client.Generate(again, absl::Seconds(60));
    ASSERT_TRUE(ok.status.ok()) << what << ": " << ok.status.error_message();
    ExpectSameOutput(ok.choices[0], want, what);
  };

  // Released (as an expired handle): UNAVAILABLE, naming the handle.
  const std::string released = EncodeOn(encoder->address(), png);
  ReleaseOn(encoder->address(), released);
  absl::Time start = absl::Now();
  GenerateResult gone = client.Generate(
      ByHandle(inline_request, "released", {released}, encoder->address()), absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(gone.status.error_code(), grpc::StatusCode::UNAVAILABLE) << gone.status.error_message();
  EXPECT_NE(gone.status.error_message().find("no longer holds the handle"), std::string::npos)
      << gone.status.error_message();
  EXPECT_NE(gone.status.error_message().find(released.substr(0, 16)), std::string::npos);
  EXPECT_EQ(MetricValue(admin, Fetches("unavailable")), 1);
  expect_healthy("after a released handle");

  // Image bytes and a handle for one image: INVALID_ARGUMENT, nothing fetched.
  v1::GenerateRequest both = inline_request;
  both.mutable_request()->mutable_context()->set_request_id("both");
  both.mutable_request()->mutable_images(0)->set_embeddings_handle(released);
  both.mutable_request()->mutable_images(0)->set_encoder_endpoint(encoder->address());
  EXPECT_EQ(client.Generate(both, absl::Seconds(60)).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // The encoder SIGKILLed after Encode, before the worker fetches: UNAVAILABLE, promptly.
  const std::string live = EncodeOn(encoder->address(), png);
  encoder->Signal(SIGKILL);
  EXPECT_EQ(encoder->WaitForExit(absl::Seconds(30)), 128 + SIGKILL);
  start = absl::Now();
  GenerateResult killed = client.Generate(
      ByHandle(inline_request, "killed", {live}, encoder->address()), absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(killed.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << killed.status.error_message();
  EXPECT_EQ(MetricValue(admin, Fetches("unavailable")), 2);
  EXPECT_EQ(MetricValue(admin, Fetches("fetched")), 0);
  expect_healthy("after a killed encoder");
}

// A TCP port that accepts connections (the kernel's backlog) and never answers: a gRPC call to
// it waits for the handshake.
class SilentPort {
 public:
  SilentPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentPort() { close(fd_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(WorkerEpdTest, ACallerWhoLeavesStopsTheFetchAndFreesTheExecutor) {
  const TinyVlm vlm = LoadTinyVlm("llama");
  auto worker = StartWorker(vlm.dir);
  ASSERT_TRUE(worker->ready());
  SilentPort silent;
  const std::string png = TestImage("rgb.png");
  const v1::GenerateRequest inline_request = ImageRequest(
      "after", vlm, 4 + static_cast<int>(vlm.image_tokens) + 9, 3, {{4, png}}, Greedy());
  WorkerClient client(worker->address());
  // The caller cancels the call while the fetch waits on the silent encoder (whose own cap is
  // 30 s): the fetch stops at once.
  auto stub = v1::Worker::NewStub(
      grpc::CreateChannel(worker->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto stream =
      stub->Generate(&context, ByHandle(inline_request, "left", {"some-handle"}, silent.address()));
  EXPECT_EQ(WaitForMetric(worker->admin_port(), "ferry_worker_image_requests_encoding", 1), 1);
  const absl::Time start = absl::Now();
  context.TryCancel();
  v1::GenerateEvent event;
  while (stream->Read(&event)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(WaitForMetric(worker->admin_port(), Fetches("cancelled"), 1), 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(
      WaitForMetric(worker->admin_port(), "ferry_worker_requests_total{outcome=\"cancelled\"}", 1),
      1);
  // The request's own deadline (RequestContext.deadline_unix_ms) bounds the fetch too (another
  // silent encoder: the first one's channel may have given up connecting by now).
  SilentPort silent2;
  v1::GenerateRequest bounded = ByHandle(inline_request, "bounded", {"h"}, silent2.address());
  bounded.mutable_request()->mutable_context()->set_deadline_unix_ms(
      absl::ToUnixMillis(absl::Now() + absl::Milliseconds(500)));
  GenerateResult late = client.Generate(bounded, absl::Seconds(60));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << late.status.error_message();
  EXPECT_EQ(MetricValue(worker->admin_port(), Fetches("deadline")), 1);
  // The image executor is free again.
  GenerateResult ok = client.Generate(inline_request, absl::Seconds(60));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();

  // --image_fetch_timeout caps a fetch whatever the request's deadline: UNAVAILABLE (the router
  // encodes again elsewhere).
  auto capped = StartWorker(vlm.dir, {"--image_fetch_timeout=300ms"});
  ASSERT_TRUE(capped->ready());
  SilentPort silent3;
  WorkerClient capped_client(capped->address());
  const absl::Time capped_start = absl::Now();
  GenerateResult slow = capped_client.Generate(
      ByHandle(inline_request, "capped", {"h"}, silent3.address()), absl::Seconds(60));
  EXPECT_EQ(slow.status.error_code(), grpc::StatusCode::UNAVAILABLE) << slow.status.error_message();
  EXPECT_LT(absl::Now() - capped_start, absl::Seconds(10));
  EXPECT_EQ(MetricValue(capped->admin_port(), Fetches("unavailable")), 1);
}

// An Encoder that misbehaves in FetchEmbeddings as its handle says, after a first chunk that
// announces `rows` x `cols` float32 of `digest`: "cut" sends half the bytes then fails
// UNAVAILABLE, "short" half then OK, "gap" a second chunk at a wrong offset, "nan" a NaN, "tokens"
// announces one row too many.
class FaultyEncoder final : public v1::Encoder::Service {
 public:
  FaultyEncoder(const v1::Hash128& digest, uint32_t rows, uint32_t cols)
      : digest_(digest), rows_(rows), cols_(cols) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FaultyEncoder() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::Status FetchEmbeddings(grpc::ServerContext* /*context*/,
                               const v1::FetchEmbeddingsRequest* request,
                               grpc::ServerWriter<v1::EmbeddingsChunk>* writer) override {
    const std::string& mode = request->handle();
    const size_t bytes = size_t{rows_} * cols_ * 4;
    v1::EmbeddingsChunk first;
    v1::EmbeddingsInfo* info = first.mutable_info();
    info->set_handle(mode);
    info->set_num_tokens(mode == "tokens" ? rows_ + 1 : rows_);
    info->set_hidden_size(cols_);
    info->set_dtype(v1::D_TYPE_F32);
    info->set_size_bytes(bytes);
    *info->mutable_vision_digest() = digest_;
    const float one = 1.0f, nan = std::nanf("");
    std::string data;
    for (size_t k = 0; k < bytes / 4; ++k) {
      data.append(reinterpret_cast<const char*>(mode == "nan" && k == 5 ? &nan : &one), 4);
    }
    first.set_offset(0);
    first.set_data(data.substr(0, bytes / 2));
    writer->Write(first);
    if (mode == "cut") return grpc::Status(grpc::StatusCode::UNAVAILABLE, "cut");
    if (mode == "short") return grpc::Status::OK;
    v1::EmbeddingsChunk rest;
    rest.set_offset(mode == "gap" ? bytes / 2 + 4 : bytes / 2);
    rest.set_data(data.substr(bytes / 2));
    writer->Write(rest);
    return grpc::Status::OK;
  }

 private:
  const v1::Hash128 digest_;
  const uint32_t rows_, cols_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(WorkerEpdTest, AStreamCutOrMalformedIsRefusedAndTheWorkerServesOn) {
  const TinyVlm vlm = LoadTinyVlm("llama");
  auto encoder = StartEncoder(vlm.dir);
  auto worker = StartWorker(vlm.dir);
  ASSERT_TRUE(encoder->ready() && worker->ready());
  // The worker's tower's digest, as the real encoder of its model reports it.
  v1::EncoderStatus status;
  {
    auto stub = v1::Encoder::NewStub(
        grpc::CreateChannel(encoder->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    ASSERT_TRUE(stub->GetStatus(&context, v1::EncoderStatusRequest(), &status).ok());
  }
  FaultyEncoder faulty(status.vision_digest(), vlm.image_tokens, static_cast<uint32_t>(vlm.hidden));
  const std::string png = TestImage("rgb.png");
  const v1::GenerateRequest inline_request =
      ImageRequest("ok", vlm, 4 + static_cast<int>(vlm.image_tokens) + 9, 3, {{4, png}}, Greedy());
  WorkerClient client(worker->address());
  const std::vector<std::pair<std::string, grpc::StatusCode>> cases = {
      {"cut", grpc::StatusCode::UNAVAILABLE},
      {"short", grpc::StatusCode::UNAVAILABLE},
      {"gap", grpc::StatusCode::UNAVAILABLE},
      {"nan", grpc::StatusCode::FAILED_PRECONDITION},
      {"tokens", grpc::StatusCode::INVALID_ARGUMENT},
  };
  for (const auto& [mode, code] : cases) {
    GenerateResult got = client.Generate(ByHandle(inline_request, mode, {mode}, faulty.address()),
                                         absl::Seconds(60));
    EXPECT_EQ(got.status.error_code(), code) << mode << ": " << got.status.error_message();
    EXPECT_NE(got.status.error_message().find("image 0"), std::string::npos) << mode;
  }
  EXPECT_EQ(MetricValue(worker->admin_port(), Fetches("unavailable")), 3);
  EXPECT_EQ(MetricValue(worker->admin_port(), Fetches("refused")), 2);
  GenerateResult ok = client.Generate(inline_request, absl::Seconds(60));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST(WorkerEpdTest, TheFetchCarriesTheWorkersSharedToken) {
  const TinyVlm vlm = LoadTinyVlm("llama");
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string file = dir + "/token", other_file = dir + "/other_token";
  const std::string token = "worker-epd-test-token-0123456789";
  const std::string other_token = "another-token-of-another-stack";
  { std::ofstream(file) << token << "\n"; }
  { std::ofstream(other_file) << other_token << "\n"; }
  auto encoder = std::make_unique<ServiceProcess>(
      EncoderBinary(), std::vector<std::string>{"--model", vlm.dir, "--auth_token_file", file});
  auto stranger = std::make_unique<ServiceProcess>(
      EncoderBinary(),
      std::vector<std::string>{"--model", vlm.dir, "--auth_token_file", other_file});
  auto worker = StartWorker(vlm.dir, {"--auth_token_file=" + file});
  ASSERT_TRUE(encoder->ready() && stranger->ready() && worker->ready()) << worker->LogTail();
  const std::string png = TestImage("rgb.png");
  const v1::GenerateRequest inline_request = ImageRequest(
      "token", vlm, 4 + static_cast<int>(vlm.image_tokens) + 9, 3, {{4, png}}, Greedy());
  InProcessEngine ref(vlm.dir);
  const ChoiceOutput want = ref.Run(inline_request)[0];
  WorkerClient client(worker->address(), token);
  GenerateResult got =
      client.Generate(ByHandle(inline_request, "with-token",
                               {EncodeOn(encoder->address(), png, token)}, encoder->address()),
                      absl::Seconds(60));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  ExpectSameOutput(got.choices[0], want, "with the shared token");
  // An encoder of another token refuses the worker's: UNAVAILABLE, saying so.
  GenerateResult refused = client.Generate(
      ByHandle(inline_request, "other-token", {EncodeOn(stranger->address(), png, other_token)},
               stranger->address()),
      absl::Seconds(60));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();
  EXPECT_EQ(MetricValue(worker->admin_port(), Fetches("fetched")), 1);
  EXPECT_EQ(MetricValue(worker->admin_port(), Fetches("unavailable")), 1);
}

TEST(WorkerEpdTest, AnEncoderOfAnotherVisionTowerIsRefused) {
  const TinyVlm vlm = LoadTinyVlm("llama"), other = LoadTinyVlm("llama_seed1");
  ASSERT_EQ(other.hidden, vlm.hidden);
  ASSERT_EQ(other.image_tokens, vlm.image_tokens);
  auto encoder = StartEncoder(other.dir);
  auto worker = StartWorker(vlm.dir);
  ASSERT_TRUE(encoder->ready() && worker->ready());
  const std::string png = TestImage("rgb.png");
  const v1::GenerateRequest inline_request = ImageRequest(
      "mine", vlm, 4 + static_cast<int>(vlm.image_tokens) + 9, 3, {{4, png}}, Greedy());
  WorkerClient client(worker->address());
  GenerateResult refused = client.Generate(
      ByHandle(inline_request, "theirs", {EncodeOn(encoder->address(), png)}, encoder->address()),
      absl::Seconds(60));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << refused.status.error_message();
  EXPECT_NE(refused.status.error_message().find("vision tower"), std::string::npos)
      << refused.status.error_message();
  EXPECT_EQ(MetricValue(worker->admin_port(), Fetches("refused")), 1);
  GenerateResult ok = client.Generate(inline_request, absl::Seconds(60));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ferry::InitWorkerTests(argc, argv);
  return RUN_ALL_TESTS();
}
