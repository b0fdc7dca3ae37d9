#include "router/encode/encoder_pool.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ferry/v1/encoder.grpc.pb.h"
#include "gtest/gtest.h"
#include "router/encode/encoder_choice.h"
#include "services/common/grpc_server.h"

namespace ferry {
namespace {

constexpr uint32_t kImageTokens = 16;

// An encoder that answers Encode with `encode_status` (a handle naming itself when OK) and serves
// `status` on Watch until the call is cancelled or Close() is called.
class FakeEncoder final : public v1::Encoder::Service {
 public:
  explicit FakeEncoder(std::string name) : name_(std::move(name)) {
    status_.set_num_image_tokens(kImageTokens);
  }

  void SetEncodeStatus(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    encode_status_ = std::move(status);
  }
  void SetStatus(v1::EncoderStatus status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
  }
  int encodes() const {
    absl::MutexLock lock(&mu_);
    return encodes_;
  }

  grpc::Status Encode(grpc::ServerContext*, const v1::EncodeRequest* request,
                      v1::EncodeResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++encodes_;
    if (!encode_status_.ok()) return encode_status_;
    EXPECT_TRUE(request->has_content_hash());
    response->mutable_embeddings()->set_handle(absl::StrCat(name_, "-handle"));
    response->mutable_embeddings()->set_num_tokens(kImageTokens);
    return grpc::Status::OK;
  }

  // The status at once, then again every 50 ms (a heartbeat, as the real encoder's) until the
  // client or the server ends the call.
  grpc::Status Watch(grpc::ServerContext* context, const v1::EncoderWatchRequest*,
                     grpc::ServerWriter<v1::EncoderStatus>* writer) override {
    absl::MutexLock lock(&mu_);
    while (!context->IsCancelled()) {
      const v1::EncoderStatus status = status_;
      mu_.Unlock();
      const bool written = writer->Write(status);
      mu_.Lock();
      if (!written) break;
      tick_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
    }
    return grpc::Status::OK;
  }

 private:
  const std::string name_;
  mutable absl::Mutex mu_;
  grpc::Status encode_status_ ABSL_GUARDED_BY(mu_);
  v1::EncoderStatus status_ ABSL_GUARDED_BY(mu_);
  int encodes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar tick_;
};

class EncoderPoolTest : public ::testing::Test {
 protected:
  // The pool first: its threads call on_state (mu_, up_) until it is gone.
  void TearDown() override { pool_.reset(); }

  void StartEncoders(int n) {
    for (int i = 0; i < n; ++i) {
      encoders_.push_back(std::make_unique<FakeEncoder>(absl::StrCat("e", i)));
      auto server = GrpcServer::Start({}, {encoders_.back().get()});
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
      addresses_.push_back(servers_.back()->address());
      index_[servers_.back()->address()] = i;
    }
  }

  void StartPool() {
    EncoderPoolOptions options;
    options.endpoints = addresses_;
    options.expected_image_tokens = kImageTokens;
    options.on_state = [this](const std::string& endpoint, bool up) {
      absl::MutexLock lock(&mu_);
      up_[endpoint] = up;
    };
    auto pool = EncoderPool::Start(std::move(options));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }

  // Waits until the pool's state of each encoder is `up` (by index).
  void WaitStates(const std::vector<bool>& up) {
    absl::MutexLock lock(&mu_);
    auto reached = [&] {
      mu_.AssertHeld();  // (the Condition runs under mu_)
      for (size_t i = 0; i < up.size(); ++i) {
        auto it = up_.find(addresses_[i]);
        if ((it != up_.end() && it->second) != up[i]) return false;
      }
      return true;
    };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30)));
  }

  // The encoder (index) the rule prefers for `image` when all are up and idle.
  int Preferred(const Hash128& image) {
    std::vector<EncoderLoadView> views;
    for (const std::string& a : addresses_) views.push_back({a, true, 0});
    return index_[addresses_[EncoderOrder(image, views)[0]]];
  }

  absl::StatusOr<EncodedImage> Encode(const Hash128& image) {
    return pool_->Encode("bytes", image, absl::Now() + absl::Seconds(10), "test");
  }

  std::vector<std::unique_ptr<FakeEncoder>> encoders_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  std::vector<std::string> addresses_;
  std::map<std::string, int> index_;
  std::unique_ptr<EncoderPool> pool_;
  absl::Mutex mu_;
  std::map<std::string, bool> up_ ABSL_GUARDED_BY(mu_);
};

TEST_F(EncoderPoolTest, RefusesBadEndpoints) {
  for (const std::vector<std::string>& endpoints :
       std::vector<std::vector<std::string>>{{"nohost"}, {"host:0"}, {":80"}, {"h:99999"}}) {
    EncoderPoolOptions options;
    options.endpoints = endpoints;
    EXPECT_EQ(EncoderPool::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(EncoderPoolTest, TheSetChangesAndImagesMoveWithIt) {
  StartEncoders(2);
  const std::vector<std::string> both = addresses_;
  addresses_ = {both[0]};
  StartPool();  // the first only
  addresses_ = both;
  WaitStates({true, false});
  const Hash128 image = Xxh3Hash128("image");
  auto encoded = Encode(image);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(encoded->endpoint, both[0]);
  // Both: the image goes to its preferred one.
  ASSERT_TRUE(pool_->SetEndpoints(both).ok());
  WaitStates({true, true});
  EXPECT_EQ(pool_->size(), 2u);
  encoded = Encode(image);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(encoded->endpoint, both[Preferred(image)]);
  // The preferred one leaves: reported down, the image goes to the other.
  const int other = 1 - Preferred(image);
  ASSERT_TRUE(pool_->SetEndpoints({both[other]}).ok());
  std::vector<bool> states(2, false);
  states[other] = true;
  WaitStates(states);
  EXPECT_EQ(pool_->size(), 1u);
  encoded = Encode(image);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(encoded->endpoint, both[other]);
  // None: nothing to try; a bad one refused, the set kept.
  EXPECT_EQ(pool_->SetEndpoints({"nohost"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->size(), 1u);
  ASSERT_TRUE(pool_->SetEndpoints({}).ok());
  WaitStates({false, false});
  EXPECT_EQ(Encode(image).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(EncoderPoolTest, NoneUpIsUnavailable) {
  StartEncoders(1);
  servers_[0]->Shutdown(absl::ZeroDuration());
  StartPool();
  EXPECT_EQ(pool_->up(), 0);
  EXPECT_EQ(Encode(Xxh3Hash128("a")).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(EncoderPoolTest, TheSameImageGoesToTheSameEncoder) {
  StartEncoders(3);
  StartPool();
  WaitStates({true, true, true});
  for (int i = 0; i < 20; ++i) {
    const Hash128 image = Xxh3Hash128(absl::StrCat("image-", i));
    auto a = Encode(image);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->endpoint, addresses_[Preferred(image)]);
    EXPECT_EQ(a->handle, absl::StrCat("e", Preferred(image), "-handle"));
    EXPECT_EQ(a->tried, 1);
    EXPECT_EQ(a->num_tokens, kImageTokens);
  }
}

TEST_F(EncoderPoolTest, FailsOverOnUnavailableAndResourceExhausted) {
  StartEncoders(2);
  StartPool();
  WaitStates({true, true});
  const Hash128 image = Xxh3Hash128("image");
  const int first = Preferred(image), second = 1 - first;
  for (grpc::StatusCode code : {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::RESOURCE_EXHAUSTED,
                                grpc::StatusCode::DEADLINE_EXCEEDED}) {
    encoders_[first]->SetEncodeStatus(grpc::Status(code, "no"));
    auto encoded = Encode(image);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    EXPECT_EQ(encoded->endpoint, addresses_[second]);
    EXPECT_EQ(encoded->tried, 2);
  }
  // Both failing: the last error.
  encoders_[second]->SetEncodeStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "neither"));
  EXPECT_EQ(Encode(image).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(EncoderPoolTest, ARefusalOfTheImageIsNotFailedOver) {
  StartEncoders(2);
  StartPool();
  WaitStates({true, true});
  const Hash128 image = Xxh3Hash128("image");
  const int first = Preferred(image), second = 1 - first;
  encoders_[first]->SetEncodeStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
  EXPECT_EQ(Encode(image).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(encoders_[second]->encodes(), 0);
}

TEST_F(EncoderPoolTest, DrainingWrongModelAndStoppedEncodersAreDown) {
  StartEncoders(3);
  v1::EncoderStatus draining;
  draining.set_num_image_tokens(kImageTokens);
  draining.set_draining(true);
  encoders_[0]->SetStatus(draining);
  v1::EncoderStatus other;
  other.set_num_image_tokens(kImageTokens * 2);
  encoders_[1]->SetStatus(other);
  StartPool();
  WaitStates({false, false, true});
  EXPECT_EQ(pool_->up(), 1);
  for (int i = 0; i < 10; ++i) {
    auto encoded = Encode(Xxh3Hash128(absl::StrCat("image-", i)));
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    EXPECT_EQ(encoded->endpoint, addresses_[2]);
  }
  EXPECT_EQ(encoders_[0]->encodes() + encoders_[1]->encodes(), 0);
  // The last one stops: its stream ends, it is down.
  servers_[2]->Shutdown(absl::ZeroDuration());
  WaitStates({false, false, false});
  EXPECT_EQ(Encode(Xxh3Hash128("x")).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(EncoderPoolTest, ALongQueueIsTriedLast) {
  StartEncoders(2);
  const Hash128 image = Xxh3Hash128("image");
  const int first = Preferred(image), second = 1 - first;
  v1::EncoderStatus busy;
  busy.set_num_image_tokens(kImageTokens);
  busy.set_queued(30);
  busy.set_encoding(1);
  encoders_[first]->SetStatus(busy);
  StartPool();
  WaitStates({true, true});
  auto encoded = Encode(image);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(encoded->endpoint, addresses_[second]);
  EXPECT_EQ(encoders_[first]->encodes(), 0);
}

}  // namespace
}  // namespace ferry
