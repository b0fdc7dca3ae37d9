// ferry-worker with a vision-language model (the tiny LLaVA-style model make_tiny_vlm writes, its
// Llama text model, its sliding-window variant and its hybrid one, here on one pool): Generate with
// the images' encoded bytes inline (PromptImage.image_data, content_hash the bytes' XXH3-128). The
// worker's stream equals the engine in this process given the same bytes (decoded, oriented,
// preprocessed and encoded as the worker does; that path against transformers is
// engine/llava_reference_test): with 1 and 2 images, alone and batched with other requests, at
// prefill chunks of 5 and 64 tokens, with the prefix cache cold and hot. A request resumed on
// another worker (a migration: the router sends the whole request again, image bytes included)
// encodes them again and continues exactly. Bad images are INVALID_ARGUMENT: corrupt or truncated
// bytes, dimensions over the decoder's cap, a content hash that is not theirs, a placeholder count
// that is not the tower's, image bytes sent to a text-only worker. The hybrid variant (a window on
// one of the text model's 2 layers) on two pools replays the window layer over an image's rows
// exactly: aggregated, split and resumed. The image executor's queue is bounded, and a request
// cancelled while it waits there is never decoded.
//
// argv as the other worker tests; FERRY_TINY_VLM_DIR holds the models (llama/, sliding_window/
// and hybrid/), made by worker_vlm_test.sh with make_tiny_vlm.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/model/host_weights.h"
#include "gtest/gtest.h"
#include "kvstore/wire.h"
#include "nlohmann/json.hpp"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

class WorkerVlmTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WorkerVlmTest, ImageBytesStreamAsTheEngineInProcess) {
  const TinyVlm vlm = LoadTinyVlm(GetParam());
  const std::string png = TestImage("rgb.png"), jpeg = TestImage("orient6.jpg"),
                    grey = TestImage("grey.jpg");
  Sampling greedy;
  greedy.ignore_eos = true;
  greedy.max_tokens = 16;
  Sampling seeded = greedy;
  seeded.temperature = 0.9f;
  seeded.seed = 11;
  const uint32_t p = vlm.image_tokens;
  const std::vector<v1::GenerateRequest> requests = {
      ImageRequest("one", vlm, 10 + static_cast<int>(p) + 13, 1, {{10, png}}, greedy),
      ImageRequest("two", vlm, 7 + 2 * static_cast<int>(p) + 20, 2, {{7, jpeg}, {7 + p + 9, png}},
                   greedy),
      ImageRequest("seeded", vlm, 3 + static_cast<int>(p) + 30, 3, {{3, grey}}, seeded),
      MakeRequest("text", RandomPrompt(40, 4, vlm.image_token), greedy),
  };
  std::vector<ChoiceOutput> want;
  for (const v1::GenerateRequest& r : requests) {
    InProcessEngine ref(vlm.dir);
    want.push_back(ref.Run(r)[0]);
    ASSERT_EQ(want.back().tokens.size(), greedy.max_tokens) << r.request().context().request_id();
  }
  // The images matter: without them (text tokens at their places) the stream differs.
  {
    InProcessEngine ref(vlm.dir);
    v1::GenerateRequest plain = requests[1];
    plain.mutable_request()->clear_images();
    EXPECT_NE(ref.Run(plain)[0].tokens, want[1].tokens);
  }
  for (const std::string chunk : {"5", "64"}) {
    auto worker = StartWorker(vlm.dir, {"--prefill_chunk=" + chunk});
    ASSERT_TRUE(worker->ready()) << worker->LogTail();
    WorkerClient client(worker->address());
    // Alone, cold.
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::string what = absl::StrCat(chunk, "-token chunks, alone: ", i);
      GenerateResult got = client.Generate(requests[i], absl::Seconds(60));
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.error_message();
      EXPECT_EQ(got.usage.cached_tokens(), 0u) << what;
      ExpectSameOutput(got.choices[0], want[i], what);
    }
    // Hot: the same requests again reuse the blocks (images included) and stream the same.
    double with_bytes = 3;  // requests sent with image bytes so far (the cold ones)
    for (size_t i = 0; i < 3; ++i) {
      const std::string what = absl::StrCat(chunk, "-token chunks, cache hot: ", i);
      v1::GenerateRequest again = requests[i];
      again.mutable_request()->mutable_context()->set_request_id(what);
      GenerateResult got = client.Generate(again, absl::Seconds(60));
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.error_message();
      EXPECT_GT(got.usage.cached_tokens(), 0u) << what;
      ExpectSameOutput(got.choices[0], want[i], what);
      // The images inside the cached prefix sent as nothing (expect_cached, the router's skip):
      // never encoded, the same stream.
      v1::GenerateRequest skipped = again;
      skipped.mutable_request()->mutable_context()->set_request_id(what + ", expect_cached");
      int absent = 0;
      for (v1::PromptImage& image : *skipped.mutable_request()->mutable_images()) {
        if (image.placeholder_start() + image.placeholder_length() > got.usage.cached_tokens()) {
          continue;
        }
        image.clear_image_data();
        image.set_expect_cached(true);
        ++absent;
      }
      ASSERT_GT(absent, 0) << what;
      // Every request sent with bytes so far counted, and no other (the count follows the
      // encode, which may come after the answer): one skipping all its images is not.
      with_bytes += 1;  // `again`
      const std::string encoded = "ferry_worker_image_requests_total{outcome=\"encoded\"}";
      EXPECT_EQ(WaitForMetric(worker->admin_port(), encoded, with_bytes), with_bytes) << what;
      GenerateResult hot = client.Generate(skipped, absl::Seconds(60));
      ASSERT_TRUE(hot.status.ok()) << what << ": " << hot.status.error_message();
      ExpectSameOutput(hot.choices[0], want[i], what + ", expect_cached");
      if (absent < skipped.request().images_size()) with_bytes += 1;
    }
    EXPECT_EQ(WaitForMetric(worker->admin_port(),
                            "ferry_worker_image_requests_total{outcome=\"encoded\"}", with_bytes),
              with_bytes);
    // Not cached after all (a prediction miss): UNAVAILABLE and retryable, before any token.
    {
      v1::GenerateRequest miss =
          ImageRequest("miss", vlm, 10 + static_cast<int>(p) + 13, 77, {{10, png}}, greedy);
      v1::PromptImage* image = miss.mutable_request()->mutable_images(0);
      image->clear_image_data();
      image->set_expect_cached(true);
      GenerateResult got = client.Generate(miss, absl::Seconds(60));
      EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE)
          << got.status.error_message();
      EXPECT_TRUE(got.has_error && got.error.retryable()) << got.error.ShortDebugString();
      EXPECT_TRUE(got.choices.empty() || got.choices[0].tokens.empty());
      EXPECT_EQ(WaitForMetric(worker->admin_port(), "ferry_worker_absent_image_rows_total", 1), 1);
    }
    // Batched: all at once from several threads, on a worker whose cache is cold.
    auto batch_worker = StartWorker(vlm.dir, {"--prefill_chunk=" + chunk});
    ASSERT_TRUE(batch_worker->ready());
    std::vector<GenerateResult> got(requests.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < requests.size(); ++i) {
      threads.emplace_back([&, i] {
        WorkerClient c(batch_worker->address());
        got[i] = c.Generate(requests[i], absl::Seconds(60));
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::string what = absl::StrCat(chunk, "-token chunks, batched: ", i);
      ASSERT_TRUE(got[i].status.ok()) << what << ": " << got[i].status.error_message();
      ExpectSameOutput(got[i].choices[0], want[i], what);
    }
  }
}

TEST_P(WorkerVlmTest, AResumedRequestEncodesItsImagesAgainAndContinuesExactly) {
  const TinyVlm vlm = LoadTinyVlm(GetParam());
  Sampling seeded;
  seeded.ignore_eos = true;
  seeded.max_tokens = 16;
  seeded.temperature = 0.9f;
  seeded.seed = 5;
  const uint32_t p = vlm.image_tokens;
  const v1::GenerateRequest request =
      ImageRequest("moved", vlm, 5 + 2 * static_cast<int>(p) + 11, 9,
                   {{5, TestImage("base.jpg")}, {5 + p + 3, TestImage("rgba.png")}}, seeded);
  auto first = StartWorker(vlm.dir);
  auto second = StartWorker(vlm.dir);
  ASSERT_TRUE(first->ready() && second->ready());
  WorkerClient a(first->address()), b(second->address());
  GenerateResult whole = a.Generate(request, absl::Seconds(60));
  ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
  const std::vector<uint32_t>& tokens = whole.choices[0].tokens;
  ASSERT_EQ(tokens.size(), 16u);
  for (size_t k : {1, 6, 15}) {
    const std::string what = absl::StrCat("resumed after ", k);
    GenerateResult rest = b.Generate(Resumed(request, tokens, k, what), absl::Seconds(60), {},
                                     {static_cast<uint32_t>(k)});
    ASSERT_TRUE(rest.status.ok()) << what << ": " << rest.status.error_message();
    EXPECT_EQ(rest.choices[0].tokens,
              std::vector<uint32_t>(tokens.begin() + static_cast<long>(k), tokens.end()))
        << what;
  }
}

TEST_P(WorkerVlmTest, APrefillDecodeSplitAndADrainHandOffWithImagesContinueExactly) {
  const TinyVlm vlm = LoadTinyVlm(GetParam());
  auto role = [](const std::string& r) {
    return std::vector<std::string>{"--role=" + r, "--transport=grpc"};
  };
  auto p = StartWorker(vlm.dir, role("prefill"));
  auto target = StartWorker(vlm.dir, role("decode"));
  std::vector<std::string> slow = role("decode");
  slow.push_back("--test_step_delay=10ms");
  slow.push_back("--drain_grace=0s");
  auto source = StartWorker(vlm.dir, slow);
  ASSERT_TRUE(p->ready() && target->ready() && source->ready());
  WorkerClient prefill(p->address()), to(target->address()), from(source->address());
  Sampling greedy;
  greedy.ignore_eos = true;
  greedy.max_tokens = 24;
  const uint32_t n = vlm.image_tokens;
  const v1::GenerateRequest request = ImageRequest(
      "split", vlm, 6 + 2 * static_cast<int>(n) + 10, 12,
      {{6, TestImage("s444.jpg")}, {6 + n + 2, TestImage("palette_trns.png")}}, greedy);
  InProcessEngine ref(vlm.dir);
  const ChoiceOutput want = ref.Run(request)[0];
  ASSERT_EQ(want.tokens.size(), 24u);

  // Split: both sides encode the images (the decode side for its block hashes and recompute).
  v1::GenerateRequest whole = request;
  whole.mutable_request()->mutable_context()->set_request_id("split-whole");
  PdResult split = RunPd(to, target->address(), prefill, whole);
  ASSERT_TRUE(split.stream.status.ok()) << split.stream.status.error_message();
  ASSERT_TRUE(split.prefill.ok()) << split.prefill.error_message();
  ExpectSameOutput(split.stream.choices[0], want, "split, replayed");

  // Drained after a few tokens: parked with its KV, continued on the target from that KV.
  std::vector<uint32_t> seen;
  bool drained = false;
  PdResult first =
      RunPd(from, source->address(), prefill, request, {}, absl::Seconds(60),
            [&](const v1::TokenChunk& chunk) {
              seen.insert(seen.end(), chunk.token_ids().begin(), chunk.token_ids().end());
              if (!drained && seen.size() >= 3) {
                drained = true;
                v1::DrainResponse response;
                ASSERT_TRUE(from.Drain(0, &response).ok());
              }
            });
  ASSERT_TRUE(drained);
  ASSERT_EQ(first.stream.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << first.stream.status.error_message();
  ASSERT_EQ(first.stream.error.handoff_endpoint(), source->address());
  const size_t k = seen.size();
  ASSERT_LT(k, want.tokens.size());
  v1::GenerateRequest next = Resumed(request, seen, k, "split-handoff");
  next.set_aggregated(false);
  next.set_handoff_source_endpoint(source->address());
  next.set_handoff_source_request_id("split");
  GenerateResult rest = to.Generate(next, absl::Seconds(60), {}, {static_cast<uint32_t>(k)});
  ASSERT_TRUE(rest.status.ok()) << rest.status.error_message();
  EXPECT_EQ(rest.choices[0].tokens,
            std::vector<uint32_t>(want.tokens.begin() + static_cast<long>(k), want.tokens.end()));
  EXPECT_EQ(MetricValue(target->admin_port(), "ferry_worker_handoffs_received_total"), 1);
  EXPECT_EQ(source->WaitForExit(absl::Seconds(30)), 0) << source->LogTail();
}

TEST_P(WorkerVlmTest, BadImagesAreInvalidArgumentSayingWhy) {
  const TinyVlm vlm = LoadTinyVlm(GetParam());
  auto worker = StartWorker(vlm.dir);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  Sampling greedy;
  const std::string png = TestImage("rgb.png");
  const uint32_t p = vlm.image_tokens;
  auto expect_invalid = [&](v1::GenerateRequest r, const std::string& needle) {
    GenerateResult got = client.Generate(r, absl::Seconds(60));
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << needle << ": " << got.status.error_message();
    EXPECT_NE(got.status.error_message().find(needle), std::string::npos)
        << got.status.error_message();
  };
  const v1::GenerateRequest good =
      ImageRequest("good", vlm, static_cast<int>(p) + 8, 1, {{4, png}}, greedy);
  for (const std::string name : {"truncated_rgb.png", "truncated_base.jpg", "huge_dims.png"}) {
    v1::GenerateRequest bad = good;
    const std::string bytes = TestImage(name);
    v1::PromptImage* image = bad.mutable_request()->mutable_images(0);
    image->set_image_data(bytes);
    kv::HashToProto(Xxh3Hash128(bytes), image->mutable_content_hash());
    SCOPED_TRACE(name);
    expect_invalid(bad, "image 0: ");
  }
  v1::GenerateRequest garbage = good;
  garbage.mutable_request()->mutable_images(0)->set_image_data("not an image at all");
  kv::HashToProto(Xxh3Hash128("not an image at all"),
                  garbage.mutable_request()->mutable_images(0)->mutable_content_hash());
  expect_invalid(garbage, "image 0: ");
  v1::GenerateRequest hash = good;
  kv::HashToProto(Hash128{1, 2}, hash.mutable_request()->mutable_images(0)->mutable_content_hash());
  expect_invalid(hash, "is not the image bytes'");
  v1::GenerateRequest count = good;
  count.mutable_request()->mutable_images(0)->set_placeholder_length(p - 1);
  expect_invalid(count, absl::StrCat("rows per image"));
  // The worker still serves the good one, routed with the vision model's fingerprint (the text
  // model's extended with the tower's); the text model's own fingerprint is another model's.
  InProcessEngine ref(vlm.dir);
  v1::GenerateRequest routed = good;
  kv::HashToProto(ref.model().fingerprint(),
                  routed.mutable_request()->mutable_model()->mutable_fingerprint());
  GenerateResult ok = client.Generate(routed, absl::Seconds(60));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  absl::StatusOr<HostWeights> text_only = LoadHfModel(vlm.dir, WeightDType::kBF16);
  ASSERT_TRUE(text_only.ok()) << text_only.status();
  EXPECT_NE(text_only->fingerprint, ref.model().fingerprint());
  kv::HashToProto(text_only->fingerprint,
                  routed.mutable_request()->mutable_model()->mutable_fingerprint());
  routed.mutable_request()->mutable_context()->set_request_id("text-fingerprint");
  EXPECT_EQ(client.Generate(routed, absl::Seconds(60)).status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // A text-only worker refuses image bytes.
  auto text = StartWorker(TinyModel("llama_gqa_bf16"));
  ASSERT_TRUE(text->ready());
  WorkerClient text_client(text->address());
  v1::GenerateRequest to_text = MakeRequest("text-only", RandomPrompt(30, 2, 200), greedy);
  *to_text.mutable_request()->add_images() = BytesImage(to_text, 4, 8, 7, png);
  GenerateResult refused = text_client.Generate(to_text, absl::Seconds(60));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("need a worker with a vision model"),
            std::string::npos)
      << refused.status.error_message();
}

// The image executor's queue is bounded, and a request whose caller leaves while it waits is
// never decoded. With --max_queued_image_requests=1 and the executor held by the test seam (so
// nothing races the queue): one request is on the executor, one waits, a third is
// RESOURCE_EXHAUSTED, and a text-only request passes them all; the waiting one's caller cancels.
// Released, the first streams as the engine in-process, the cancelled one is counted cancelled
// (not encoded), and the gauges return to 0.
TEST(WorkerVlmQueueTest, TheImageQueueIsBoundedAndACallerWhoLeavesIsNotEncoded) {
  const TinyVlm vlm = LoadTinyVlm("llama");
  const std::string hold = absl::StrCat(std::getenv("TEST_TMPDIR"), "/image_hold");
  std::ofstream(hold) << "held\n";
  auto worker =
      StartWorker(vlm.dir, {"--max_queued_image_requests=1", "--image_hold_file=" + hold});
  ASSERT_TRUE(worker->ready()) << worker->LogTail();
  const int admin = worker->admin_port();
  Sampling greedy;
  greedy.ignore_eos = true;
  greedy.max_tokens = 8;
  const int p = static_cast<int>(vlm.image_tokens);
  const std::string png = TestImage("rgb.png");
  auto image_request = [&](const std::string& id, uint32_t seed) {
    return ImageRequest(id, vlm, 4 + p + 6, seed, {{4, png}}, greedy);
  };
  const v1::GenerateRequest first = image_request("first", 1);
  InProcessEngine ref(vlm.dir);
  const ChoiceOutput want = ref.Run(first)[0];

  GenerateResult first_result;
  std::thread first_thread([&] {
    WorkerClient c(worker->address());
    first_result = c.Generate(first, absl::Seconds(120));
  });
  EXPECT_EQ(WaitForMetric(admin, "ferry_worker_image_requests_encoding", 1), 1);
  // The second takes the queue's one place...
  WorkerClient client(worker->address());
  grpc::ClientContext second_context;
  second_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto second = client.stub().Generate(&second_context, image_request("second", 2));
  EXPECT_EQ(WaitForMetric(admin, "ferry_worker_image_requests_waiting", 1), 1);
  // ...so a third is refused at once.
  GenerateResult third = client.Generate(image_request("third", 3), absl::Seconds(30));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(third.status.error_message().find("image encoding queue is full"), std::string::npos)
      << third.status.error_message();
  EXPECT_EQ(MetricValue(admin, "ferry_worker_image_requests_total{outcome=\"rejected\"}"), 1);
  // A request without images never waits for the image executor.
  GenerateResult text = client.Generate(
      MakeRequest("text", RandomPrompt(20, 4, vlm.image_token), greedy), absl::Seconds(60));
  ASSERT_TRUE(text.status.ok()) << text.status.error_message();
  EXPECT_EQ(text.choices[0].tokens.size(), greedy.max_tokens);
  // The waiting request's caller leaves.
  second_context.TryCancel();
  v1::GenerateEvent event;
  while (second->Read(&event)) {
  }
  EXPECT_EQ(second->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(MetricValue(admin, "ferry_worker_image_requests_waiting"), 1);  // still queued

  std::remove(hold.c_str());
  first_thread.join();
  ASSERT_TRUE(first_result.status.ok()) << first_result.status.error_message();
  ExpectSameOutput(first_result.choices[0], want, "the request held on the image executor");
  EXPECT_EQ(WaitForMetric(admin, "ferry_worker_image_requests_total{outcome=\"cancelled\"}", 1), 1);
  EXPECT_EQ(MetricValue(admin, "ferry_worker_image_requests_total{outcome=\"encoded\"}"), 1);
  EXPECT_EQ(MetricValue(admin, "ferry_worker_requests_total{outcome=\"cancelled\"}"), 1);
  EXPECT_EQ(MetricValue(admin, "ferry_worker_image_requests_waiting"), 0);
  EXPECT_EQ(MetricValue(admin, "ferry_worker_image_requests_encoding"), 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, WorkerVlmTest,
                         ::testing::Values("llama", "sliding_window", "hybrid"),
                         [](const auto& info) { return info.param; });

// The hybrid model (layer 0 full attention, layer 1 a window of 8) on two pools whose window cache
// keeps nothing: a request sharing a cached prefix takes its 2 full blocks and replays the window
// layer over the 7 positions before them (25-31), all of them rows of the image at 20-35, which
// the replay takes from the request's encoded image. Aggregated, split (the prefill worker
// replays) and resumed on a worker that holds the prefix, the tokens are the engine's without any
// cache.
TEST(WorkerVlmHybridTest, AWindowReplayOverAnImageAnswersAsWithoutTheCache) {
  const TinyVlm vlm = LoadTinyVlm("hybrid");
  ASSERT_EQ(vlm.image_tokens, 16u);
  const std::vector<std::string> flags = {"--window_pool_bytes=1MiB", "--window_cache_bytes=0"};
  auto agg = StartWorker(vlm.dir, flags);
  auto other = StartWorker(vlm.dir, flags);
  auto role = [&](const std::string& r) {
    std::vector<std::string> f = {"--role=" + r, "--transport=grpc"};
    f.insert(f.end(), flags.begin(), flags.end());
    return f;
  };
  auto p = StartWorker(vlm.dir, role("prefill"));
  auto d = StartWorker(vlm.dir, role("decode"));
  ASSERT_TRUE(agg->ready() && other->ready() && p->ready() && d->ready()) << agg->LogTail();
  WorkerClient on_agg(agg->address()), on_other(other->address()), prefill(p->address()),
      decode(d->address());
  // Sampled (greedy decoding of the tiny random model repeats one token, with the image or
  // without), with logprobs: the same floats, bit for bit.
  Sampling sampled;
  sampled.ignore_eos = true;
  sampled.max_tokens = 16;
  sampled.temperature = 0.9f;
  sampled.seed = 7;
  sampled.logprobs = true;
  sampled.top_logprobs = 2;
  // 60 tokens, the image at 20-35; the first request is its first 40 (2 full blocks of 16, the
  // image's rows 20-31 in the second), one token generated and its KV never computed.
  const v1::GenerateRequest second =
      ImageRequest("second", vlm, 60, 21, {{20, TestImage("rgb.png")}}, sampled);
  v1::GenerateRequest first = second;
  first.mutable_request()->mutable_context()->set_request_id("first");
  first.mutable_request()->mutable_prompt_token_ids()->Truncate(40);
  first.mutable_request()->mutable_sampling()->set_max_tokens(1);
  InProcessEngine ref(vlm.dir);
  const ChoiceOutput want = ref.Run(second)[0];
  ASSERT_EQ(want.tokens.size(), 16u);
  {  // (The image matters: without it the stream differs.)
    InProcessEngine plain_ref(vlm.dir);
    v1::GenerateRequest plain = second;
    plain.mutable_request()->clear_images();
    EXPECT_NE(plain_ref.Run(plain)[0].tokens, want.tokens);
  }
  const std::string replays = "ferry_worker_window_cache_lookups_total{result=\"replay\"}";
  const std::string replayed = "ferry_worker_window_replayed_tokens_total";

  // Aggregated.
  for (WorkerClient* c : {&on_agg, &on_other}) {
    ASSERT_TRUE(c->Generate(first, absl::Seconds(60)).status.ok());
  }
  GenerateResult whole = on_agg.Generate(second, absl::Seconds(60));
  ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
  EXPECT_EQ(whole.usage.cached_tokens(), 32u);
  ExpectSameOutput(whole.choices[0], want, "aggregated, replayed");
  EXPECT_EQ(WaitForMetric(agg->admin_port(), replays, 1), 1);
  EXPECT_EQ(WaitForMetric(agg->admin_port(), replayed, 7), 7);

  // Split: the prefill worker takes the prefix and replays.
  PdResult warm = RunPd(decode, d->address(), prefill, first);
  ASSERT_TRUE(warm.stream.status.ok()) << warm.stream.status.error_message();
  v1::GenerateRequest split_request = second;
  split_request.mutable_request()->mutable_context()->set_request_id("split");
  PdResult split = RunPd(decode, d->address(), prefill, split_request);
  ASSERT_TRUE(split.prefill.ok()) << split.prefill.error_message();
  ASSERT_TRUE(split.stream.status.ok()) << split.stream.status.error_message();
  ExpectSameOutput(split.stream.choices[0], want, "split, replayed");
  EXPECT_EQ(WaitForMetric(p->admin_port(), replays, 1), 1);
  EXPECT_EQ(WaitForMetric(p->admin_port(), replayed, 7), 7);

  // Resumed after 5 tokens on the other worker, which holds the 40-token prefix: 65 positions,
  // the same 2 blocks cached and the same 7 positions replayed.
  const size_t k = 5;
  GenerateResult rest = on_other.Generate(Resumed(second, want.tokens, k, "resumed"),
                                          absl::Seconds(60), {}, {static_cast<uint32_t>(k)});
  ASSERT_TRUE(rest.status.ok()) << rest.status.error_message();
  EXPECT_EQ(rest.usage.cached_tokens(), 32u);
  EXPECT_EQ(rest.choices[0].tokens,
            std::vector<uint32_t>(want.tokens.begin() + static_cast<long>(k), want.tokens.end()));
  EXPECT_EQ(WaitForMetric(other->admin_port(), replays, 1), 1);
  EXPECT_EQ(WaitForMetric(other->admin_port(), replayed, 7), 7);
}

}  // namespace
}  // namespace ferry
