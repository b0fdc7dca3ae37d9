// Prefill/decode disaggregation over real processes: a prefill worker and a decode worker
// (ferry-worker --role prefill / decode) on the tiny dense, MoE and hybrid models, over UCX tcp,
// UCX shared memory and the gRPC fallback. The test plays the router: Generate on the decode
// worker, whose first event is the reservation; Prefill on the prefill worker with it; then the
// decode worker's stream. Token streams (logprobs included: the first token's come from the
// prefill worker) equal the engine in-process, greedy and seeded, n = 2, stop strings; a second
// request sharing a prefix is reused by P and partly held by D, which P does not push again;
// both pools are idle after. Faults: a pair whose KV layout differs is refused naming it; a
// push held (the prefill worker's hold file) while the decode worker is killed fails within its
// deadline and leaves P serving; a reservation whose deadline passes while the push is held
// ends the stream and its blocks come back only after the push's outcome; a cancel during the
// prefill aborts it. Migration: a request resumed mid-stream (the prompt and the output so far
// re-prefilled on P, decoding continued on D) continues exactly where the first stream stopped.
// Drain: a decode worker drained mid-stream hands the request with its KV to another decode
// worker (PushKv, no prefill), which continues it exactly; the drained worker exits 0.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/transfer_wire.h"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

const char kPrefillSteps[] = "ferry_worker_step_seconds_count{kind=\"prefill\"}";

struct PdCase {
  std::string name;
  std::string model;
  std::string transport;  // ucx | grpc
  std::string ucx_tls;
  int64_t window_pool_bytes = 0;
  // The roles whose KV moves through a staging area of host memory (--kv_staging=always: a GPU
  // worker's path, engine/kv/kv_staging.h, on the CPU backend), the others' in place.
  std::vector<std::string> staged = {};
};

const PdCase kCases[] = {
    {"dense_ucx_tcp", "llama_gqa_bf16", "ucx", "tcp"},
    {"moe_ucx_tcp", "qwen2_moe", "ucx", "tcp"},
    {"hybrid_two_pools_ucx_tcp", "qwen3_hybrid", "ucx", "tcp", 1 << 20},
    {"hybrid_grpc", "qwen3_hybrid", "grpc", ""},
    {"dense_grpc", "llama_gqa_bf16", "grpc", ""},
    {"dense_ucx_shm", "llama_gqa_bf16", "ucx", "shm"},
    {"dense_ucx_tcp_staged", "llama_gqa_bf16", "ucx", "tcp", 0, {"prefill", "decode"}},
    // Staged on one side only, two pools: each side's staging is its own business.
    {"hybrid_two_pools_grpc_decode_staged", "qwen3_hybrid", "grpc", "", 1 << 20, {"decode"}},
};

std::vector<std::string> RoleFlags(const PdCase& c, const std::string& role) {
  std::vector<std::string> flags = {"--role=" + role, "--transport=" + c.transport};
  if (std::find(c.staged.begin(), c.staged.end(), role) != c.staged.end()) {
    flags.push_back("--kv_staging=always");
  }
  if (!c.ucx_tls.empty()) flags.push_back("--ucx_tls=" + c.ucx_tls);
  if (c.window_pool_bytes > 0) {
    flags.push_back(absl::StrCat("--window_pool_bytes=", c.window_pool_bytes));
  }
  return flags;
}

std::vector<std::string> Plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class PdTest : public ::testing::TestWithParam<PdCase> {};

TEST_P(PdTest, StreamsEqualTheEngineInProcessAndPushOnlyWhatDecodeLacks) {
  const PdCase& c = GetParam();
  const std::string model = TinyModel(c.model);
  // Chunks of 24 tokens: a 40-token prompt completes its first block in the first step, which P
  // streams while it computes the rest.
  auto p = StartWorker(model, Plus(RoleFlags(c, "prefill"), {"--prefill_chunk=24"}));
  auto d = StartWorker(model, RoleFlags(c, "decode"));
  ASSERT_TRUE(p->ready() && d->ready());
  // A worker whose KV is staged says so at start (and only such a worker).
  for (const auto& [role, worker] : {std::pair{"prefill", p.get()}, std::pair{"decode", d.get()}}) {
    const bool staged = std::find(c.staged.begin(), c.staged.end(), role) != c.staged.end();
    EXPECT_EQ(worker->LogTail(1 << 20).find("through a staging area") != std::string::npos, staged)
        << role;
  }
  WorkerClient prefill(p->address()), decode(d->address());
  InProcessEngine ref(model, c.window_pool_bytes);
  const int64_t vocab = ref.model().config().vocab_size;
  const std::vector<TokenId> prompt = RandomPrompt(40, 1, vocab);

  // Greedy with logprobs.
  Sampling greedy;
  greedy.logprobs = true;
  greedy.top_logprobs = 3;
  greedy.ignore_eos = true;
  PdResult got = RunPd(decode, d->address(), prefill, MakeRequest("greedy", prompt, greedy));
  ASSERT_TRUE(got.reserved);
  ASSERT_TRUE(got.prefill.ok()) << got.prefill.error_message();
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message();
  const std::vector<ChoiceOutput> want = ref.Run(MakeRequest("greedy", prompt, greedy));
  ASSERT_EQ(got.stream.choices.size(), 1u);
  ExpectSameOutput(got.stream.choices[0], want[0], "greedy");
  EXPECT_EQ(got.stream.choices[0].tokens.size(), 12u);
  EXPECT_EQ(got.stream.usage.prompt_tokens(), 40u);
  EXPECT_EQ(got.stream.usage.completion_tokens(), 12u);
  EXPECT_EQ(got.stream.usage.cached_tokens(), 0u);
  EXPECT_EQ(got.reservation.cached_prefix_blocks(), 0u);
  EXPECT_EQ(got.reservation.reserved_blocks(), 3u);  // 40 tokens in blocks of 16
  EXPECT_GT(got.response.bytes_transferred(), 0u);
  EXPECT_GT(got.response.compute_us(), 0u);
  EXPECT_GT(got.response.transfer_us(), 0u);
  EXPECT_GT(got.response.wire_us(), 0u);
  const uint64_t bytes_per_prompt = got.response.bytes_transferred();
  // The first block went while the second chunk was computed.
  const uint64_t streamed = got.response.bytes_streamed();
  EXPECT_GT(streamed, 0u);
  EXPECT_LT(streamed, bytes_per_prompt);
  if (c.window_pool_bytes == 0) {
    EXPECT_EQ(streamed, bytes_per_prompt / 3);
  }
  uint64_t streamed_total = streamed;

  // Seeded, two choices (they share the prompt's KV on both sides).
  Sampling seeded;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.seed = 7;
  seeded.n = 2;
  seeded.logprobs = true;
  got = RunPd(decode, d->address(), prefill, MakeRequest("seeded", prompt, seeded));
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message();
  const std::vector<ChoiceOutput> want_seeded = ref.Run(MakeRequest("seeded", prompt, seeded));
  ASSERT_EQ(got.stream.choices.size(), 2u);
  for (int i = 0; i < 2; ++i) ExpectSameOutput(got.stream.choices[i], want_seeded[i], "seeded");
  // D holds the prompt's 2 full blocks from the request before (its cache): P pushes the last.
  // (With the window layers in a pool of their own D lacks the window layers' first block, which
  // was never pushed: the prefix is of no use there, exactly as in the engine.)
  const uint32_t held = c.window_pool_bytes == 0 ? 2 : 0;
  EXPECT_EQ(got.reservation.cached_prefix_blocks(), held);
  EXPECT_EQ(got.response.blocks_skipped(), held);
  if (c.window_pool_bytes == 0) {
    EXPECT_EQ(got.response.bytes_transferred(), bytes_per_prompt / 3);
    EXPECT_EQ(got.response.bytes_streamed(), 0u);
  } else {
    // P's 2 cached blocks, complete at the admission, went while it computed the last.
    EXPECT_EQ(got.response.bytes_streamed(), 2 * streamed);
  }
  streamed_total += got.response.bytes_streamed();

  // A stop string from the middle of the greedy text.
  const std::string& text = want[0].text;
  ASSERT_GE(text.size(), 4u);
  Sampling stopping = greedy;
  stopping.stop = {MiddleCharacter(text)};
  got = RunPd(decode, d->address(), prefill, MakeRequest("stop", prompt, stopping));
  ASSERT_TRUE(got.stream.status.ok());
  ExpectSameOutput(got.stream.choices[0], ref.Run(MakeRequest("stop", prompt, stopping))[0],
                   "stop string");
  streamed_total += got.response.bytes_streamed();
  // A choice that ends with its first token (the stop string in its text) needs no push.
  const bool stop_pushed = got.stream.choices[0].tokens.size() > 1;
  EXPECT_EQ(got.response.bytes_transferred() > 0, stop_pushed);

  // A second request sharing a prefix: 40 tokens (2 full blocks) then another tail. P reuses
  // its 2 blocks; D held them too (from the requests before): P pushes only the other 2.
  std::vector<TokenId> b = prompt;
  for (TokenId t : RandomPrompt(10, 3, vocab)) b.push_back(t);
  got = RunPd(decode, d->address(), prefill, MakeRequest("b", b, greedy));
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message();
  EXPECT_EQ(got.stream.usage.cached_tokens(), 32u);
  EXPECT_EQ(got.stream.usage.cached_by_source().local(), 32u);
  EXPECT_EQ(got.reservation.cached_prefix_blocks(), held);
  EXPECT_EQ(got.reservation.reserved_blocks(), 4u - held);
  EXPECT_EQ(got.response.blocks_skipped(), held);
  if (c.window_pool_bytes == 0) {
    EXPECT_EQ(got.response.bytes_transferred(), bytes_per_prompt / 3 * 2) << "2 of 4 blocks";
  }
  InProcessEngine fresh(model, c.window_pool_bytes);
  ExpectSameOutput(got.stream.choices[0], fresh.Run(MakeRequest("b", b, greedy))[0],
                   "with prefixes held on both sides");
  streamed_total += got.response.bytes_streamed();

  // Both pools back to idle; the counters say what happened.
  EXPECT_TRUE(WaitUntilIdle(prefill));
  EXPECT_TRUE(WaitUntilIdle(decode));
  EXPECT_EQ(MetricValue(d->admin_port(), "ferry_worker_kv_reservations_total{outcome=\"landed\"}"),
            4);
  EXPECT_EQ(MetricValue(p->admin_port(), "ferry_worker_kv_pushes_total{outcome=\"ok\"}"),
            stop_pushed ? 4 : 3);
  EXPECT_EQ(MetricValue(p->admin_port(), "ferry_worker_kv_blocks_skipped_total"),
            held * (stop_pushed ? 3 : 2));
  // The first request's chunk before its last; the others' cached prefixes D lacked.
  EXPECT_EQ(MetricValue(p->admin_port(), "ferry_worker_kv_streamed_bytes_total"),
            static_cast<double>(streamed_total));
  EXPECT_EQ(MetricValue(d->admin_port(), "ferry_worker_requests_total{outcome=\"completed\"}"), 4);
  for (auto* w : {p.get(), d.get()}) {
    w->Signal(SIGTERM);
    EXPECT_EQ(w->WaitForExit(absl::Seconds(30)), 0) << w->LogTail();
  }
}

INSTANTIATE_TEST_SUITE_P(Pairs, PdTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// What a router keeps of a stream to migrate it: the tokens, and after each chunk the text shown
// and the stop-string tail the worker held back.
struct StreamRecord {
  std::vector<uint32_t> tokens;
  std::vector<size_t> ends;  // token counts at chunk ends
  std::vector<std::string> shown, tails;
};

v1::GenerateRequest Resumed(v1::GenerateRequest request, const StreamRecord& r, size_t chunk,
                            const std::string& id) {
  v1::GenerateRequest resumed = ferry::Resumed(std::move(request), r.tokens, r.ends[chunk], id);
  resumed.mutable_request()
      ->mutable_resume()
      ->mutable_choices(0)
      ->mutable_sampler_state()
      ->set_stop_string_tail(r.tails[chunk]);
  return resumed;
}

class PdResumeTest : public ::testing::TestWithParam<PdCase> {};

TEST_P(PdResumeTest, AResumedRequestContinuesExactlyWhereTheFirstStreamStopped) {
  const PdCase& c = GetParam();
  const std::string model = TinyModel(c.model);
  auto p = StartWorker(model, RoleFlags(c, "prefill"));
  // A decode step of at least 20 ms: the stream writes each token as its own chunk, which the
  // cuts below need. A worker coalesces the tokens that arrive while a write is in flight, so on
  // a loaded machine 24 fast steps once came in 2 chunks.
  auto d = StartWorker(model, Plus(RoleFlags(c, "decode"), {"--test_step_delay=20ms"}));
  ASSERT_TRUE(p->ready() && d->ready());
  WorkerClient prefill(p->address()), decode(d->address());
  InProcessEngine ref(model, c.window_pool_bytes);
  const int64_t vocab = ref.model().config().vocab_size;
  const std::vector<TokenId> prompt = RandomPrompt(37, 5, vocab);

  Sampling greedy;
  greedy.logprobs = true;
  greedy.top_logprobs = 2;
  greedy.ignore_eos = true;
  greedy.max_tokens = 24;
  Sampling seeded = greedy;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.seed = 11;
  seeded.logprobs = false;
  seeded.top_logprobs = 0;
  {
    // A stop string in the second half of its text, not found before: the tail held back
    // across a cut.
    const std::string text = ref.Run(MakeRequest("probe", prompt, seeded))[0].text;
    for (size_t at = text.size() / 2; at < text.size() && seeded.stop.empty(); ++at) {
      const std::string c = MiddleCharacter(text.substr(at, 8));
      if (!c.empty() && text.find(c) >= at) seeded.stop = {c};
    }
    ASSERT_FALSE(seeded.stop.empty()) << text;
    // And 15 that never match, each beginning with a character the text ends chunks with: a
    // tail is held back after most chunks, wherever the stream's chunks end.
    std::map<std::string, int> ends;
    RunPd(decode, d->address(), prefill, MakeRequest("probe", prompt, seeded), {},
          absl::Seconds(60), [&](const v1::TokenChunk& chunk) {
            const std::string& t = chunk.text();
            if (t.empty() || chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) return;
            size_t at = t.size() - 1;
            while (at > 0 && (static_cast<unsigned char>(t[at]) & 0xC0) == 0x80) --at;
            ++ends[t.substr(at)];
          });
    for (size_t at = 0; at < text.size();) {  // every character of the text, uncounted
      size_t next = at + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) {
        ++next;
      }
      ends[text.substr(at, next - at)];
      at = next;
    }
    std::vector<std::pair<int, std::string>> by_count;
    for (const auto& [c, n] : ends) by_count.emplace_back(-n, c);
    std::sort(by_count.begin(), by_count.end());
    for (const auto& [n, c] : by_count) {
      if (seeded.stop.size() < 16 && c != seeded.stop[0]) seeded.stop.push_back(c + "\x01\x02");
    }
  }
  int runs = 1;  // the probe
  for (const auto& [name, sampling] : {std::make_pair("greedy", greedy), {"seeded", seeded}}) {
    const v1::GenerateRequest request = MakeRequest(name, prompt, sampling);
    const ChoiceOutput want = ref.Run(request)[0];
    StreamRecord record;
    PdResult full = RunPd(
        decode, d->address(), prefill, request, {}, absl::Seconds(60),
        [&](const v1::TokenChunk& chunk) {
          record.tokens.insert(record.tokens.end(), chunk.token_ids().begin(),
                               chunk.token_ids().end());
          record.ends.push_back(record.tokens.size());
          record.shown.push_back((record.shown.empty() ? "" : record.shown.back()) + chunk.text());
          record.tails.push_back(chunk.stop_string_tail());
        });
    ++runs;
    ASSERT_TRUE(full.stream.status.ok()) << name << ": " << full.stream.status.error_message();
    ExpectSameOutput(full.stream.choices[0], want, name);
    ASSERT_GE(record.ends.size(), 3u) << name;
    // Cut after the first chunk (the prefill worker's token), where a stop string's tail was
    // held back, in the middle, and before the last.
    std::set<size_t> cuts = {0, record.ends.size() / 2, record.ends.size() - 2};
    for (size_t i = 0; i + 1 < record.ends.size(); ++i) {
      if (!record.tails[i].empty()) {
        cuts.insert(i);
        break;
      }
    }
    if (sampling.temperature > 0) {
      EXPECT_NE(std::count_if(record.tails.begin(), record.tails.end(),
                              [](const std::string& t) { return !t.empty(); }),
                0)
          << "no tail was held back: the test does not test it";
    }
    for (size_t chunk : cuts) {
      const size_t k = record.ends[chunk];
      const std::string what = absl::StrCat(name, " resumed after ", k, " tokens");
      PdResult got = RunPd(decode, d->address(), prefill,
                           Resumed(request, record, chunk, absl::StrCat(name, "-", k)));
      ++runs;
      ASSERT_TRUE(got.stream.status.ok()) << what << ": " << got.stream.status.error_message();
      ASSERT_TRUE(got.prefill.ok()) << what << ": " << got.prefill.error_message();
      ChoiceOutput rest = want;
      rest.tokens.erase(rest.tokens.begin(), rest.tokens.begin() + k);
      if (!rest.logprobs.empty())
        rest.logprobs.erase(rest.logprobs.begin(), rest.logprobs.begin() + k);
      ASSERT_EQ(want.text.compare(0, record.shown[chunk].size(), record.shown[chunk]), 0) << what;
      rest.text = want.text.substr(record.shown[chunk].size());
      ExpectSameOutput(got.stream.choices[0], rest, what);
      EXPECT_EQ(got.stream.usage.prompt_tokens(), prompt.size()) << what;
      EXPECT_EQ(got.stream.usage.completion_tokens(), rest.tokens.size()) << what;
      // The decode worker held the prompt's blocks (and the output's, from the first stream).
      if (c.window_pool_bytes == 0) {
        EXPECT_GT(got.reservation.cached_prefix_blocks(), 0u) << what;
      }
    }
  }
  EXPECT_TRUE(WaitUntilIdle(prefill));
  EXPECT_TRUE(WaitUntilIdle(decode));
  EXPECT_EQ(MetricValue(d->admin_port(), "ferry_worker_requests_total{outcome=\"completed\"}"),
            runs);
}

INSTANTIATE_TEST_SUITE_P(Pairs, PdResumeTest, ::testing::Values(kCases[0], kCases[2]),
                         [](const auto& info) { return info.param.name; });

// Drain hand-off: a decode worker drained mid-stream parks the request with its KV; another decode
// worker continues it from the output so far with handoff_source_endpoint, taking the KV from
// the first (PushKv) without a prefill worker, and the continuation equals the rest of an uncut
// run bit for bit (logprobs, stop-string tails, usage). The drained worker exits 0.
class PdHandoffTest : public ::testing::TestWithParam<PdCase> {};

TEST_P(PdHandoffTest, ADrainedRequestContinuesOnAnotherDecodeWorkerWithItsKv) {
  const PdCase& c = GetParam();
  const std::string model = TinyModel(c.model);
  auto p = StartWorker(model, RoleFlags(c, "prefill"));
  auto target = StartWorker(model, RoleFlags(c, "decode"));
  ASSERT_TRUE(p->ready() && target->ready());
  WorkerClient prefill(p->address()), to(target->address());
  InProcessEngine ref(model, c.window_pool_bytes);
  const std::vector<TokenId> prompt = RandomPrompt(37, 7, ref.model().config().vocab_size);
  Sampling greedy;
  greedy.logprobs = true;
  greedy.top_logprobs = 2;
  greedy.ignore_eos = true;
  greedy.max_tokens = 40;
  Sampling seeded = greedy;
  seeded.temperature = 0.9f;
  seeded.seed = 28;
  seeded.logprobs = false;
  seeded.top_logprobs = 0;
  int handed = 0;
  for (const auto& [name, sampling, cut] :
       {std::make_tuple("greedy", greedy, 1), std::make_tuple("seeded", seeded, 12)}) {
    const std::string what = absl::StrCat(name, " drained after ", cut, "+ tokens");
    // The source slows its engine so that the drain lands mid-stream; it exits once drained.
    auto source = StartWorker(
        model, Plus(RoleFlags(c, "decode"), {"--test_step_delay=10ms", "--drain_grace=0s"}));
    ASSERT_TRUE(source->ready());
    WorkerClient from(source->address());
    const v1::GenerateRequest request = MakeRequest(name, prompt, sampling);
    const ChoiceOutput want = ref.Run(request)[0];
    StreamRecord record;
    bool drained = false;
    PdResult first = RunPd(
        from, source->address(), prefill, request, {}, absl::Seconds(60),
        [&](const v1::TokenChunk& chunk) {
          record.tokens.insert(record.tokens.end(), chunk.token_ids().begin(),
                               chunk.token_ids().end());
          record.ends.push_back(record.tokens.size());
          record.shown.push_back((record.shown.empty() ? "" : record.shown.back()) + chunk.text());
          record.tails.push_back(chunk.stop_string_tail());
          if (!drained && record.tokens.size() >= static_cast<size_t>(cut)) {
            drained = true;
            v1::DrainResponse response;
            ASSERT_TRUE(from.Drain(0, &response).ok());
          }
        });
    ASSERT_TRUE(drained) << what;
    ASSERT_EQ(first.stream.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << what << ": " << first.stream.status.error_message();
    ASSERT_TRUE(first.stream.has_error) << what;
    EXPECT_TRUE(first.stream.error.retryable()) << what;
    ASSERT_EQ(first.stream.error.handoff_endpoint(), source->address()) << what;
    const size_t k = record.tokens.size();
    ASSERT_LT(k, want.tokens.size()) << what << ": the drain came after the end";

    v1::GenerateRequest next =
        Resumed(request, record, record.ends.size() - 1, absl::StrCat(name, "-handoff"));
    next.set_aggregated(false);
    next.set_handoff_source_endpoint(source->address());
    next.set_handoff_source_request_id(name);
    bool reservation = false;
    GenerateResult got = to.Generate(next, absl::Seconds(60),
                                     [&](const v1::GenerateEvent& e) {
                                       if (e.has_reservation()) reservation = true;
                                       return true;
                                     },
                                     {static_cast<uint32_t>(k)});
    ++handed;
    ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.error_message();
    EXPECT_TRUE(reservation) << what;
    ChoiceOutput rest = want;
    rest.tokens.erase(rest.tokens.begin(), rest.tokens.begin() + k);
    if (!rest.logprobs.empty()) {
      rest.logprobs.erase(rest.logprobs.begin(), rest.logprobs.begin() + k);
    }
    ASSERT_EQ(want.text.compare(0, record.shown.back().size(), record.shown.back()), 0) << what;
    rest.text = want.text.substr(record.shown.back().size());
    ExpectSameOutput(got.choices[0], rest, what);
    EXPECT_EQ(got.usage.prompt_tokens(), prompt.size()) << what;
    EXPECT_EQ(got.usage.completion_tokens(), rest.tokens.size()) << what;
    EXPECT_EQ(source->WaitForExit(absl::Seconds(30)), 0) << what << "\n" << source->LogTail();
    EXPECT_EQ(MetricValue(target->admin_port(), "ferry_worker_handoffs_received_total"), handed);
    EXPECT_GT(MetricValue(target->admin_port(), "ferry_worker_handoff_received_bytes_total"), 0);
  }
  // Nothing was prefilled for the continuations: two requests, two prefills.
  EXPECT_EQ(MetricValue(p->admin_port(), "ferry_worker_requests_total{outcome=\"completed\"}"), 2);
  EXPECT_TRUE(WaitUntilIdle(to));
}

INSTANTIATE_TEST_SUITE_P(Pairs, PdHandoffTest, ::testing::Values(kCases[0], kCases[2], kCases[6]),
                         [](const auto& info) { return info.param.name; });

// The faults, on the tiny dense model over UCX tcp.
class PdFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TinyModel("llama_gqa_bf16");
    hold_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hold-", getpid());
    std::filesystem::remove(hold_);
  }
  std::vector<std::string> Flags(const std::string& role) {
    return {"--role=" + role,
            "--transport=ucx",
            "--ucx_tls=tcp",
            "--push_hold_file=" + hold_,
            "--reservation_timeout=3s",
            "--reservation_quarantine=3s"};
  }
  void Hold() { std::ofstream(hold_) << "hold"; }
  // Once the prefill worker (admin port `prefill_admin`) computed its request (its push held),
  // kills `victim`, then releases the push.
  std::thread KillOnceComputed(int prefill_admin, ServiceProcess* victim) {
    return std::thread([this, prefill_admin, victim] {
      WaitForMetric(prefill_admin, kPrefillSteps, 1);
      victim->Signal(SIGKILL);
      victim->WaitForExit(absl::Seconds(10));
      Release();
    });
  }
  // Puts bytes into every block `reservation` asks for (one pool), from a transport of the test's.
  void PutInto(const v1::KvReservation& reservation) {
    transfer::TransportOptions options;
    options.ucx_tls = "tcp";
    auto transport = *transfer::KvTransport::Create(options);
    auto remote = *transfer::FromProto(reservation.transfer());
    const uint64_t block = reservation.block_bytes();
    const int n = static_cast<int>(reservation.reserved_blocks());
    auto region = *transport->Allocate(n * block);
    std::vector<MemorySpan> spans;
    for (int i = 0; i < n; ++i) {
      spans.push_back({static_cast<char*>(region.span.address) + i * block, block});
    }
    auto put = *transfer::BlockTransferRequest(remote, 0, spans, transfer::TransferOp::kPut);
    put.peer = *transport->Connect(remote.address);
    put.deadline = absl::Now() + absl::Seconds(10);
    EXPECT_TRUE(transport->Transfer(std::move(put)).ok());
  }
  void Release() { std::filesystem::remove(hold_); }
  // The decode worker dies while the prefill worker's push (its first put) is held; P fails the
  // request UNAVAILABLE, frees everything and serves the next pair.
  void DecodeKilledDuringThePush(const std::vector<std::string>& prefill_flags);

  std::string model_, hold_;
};

TEST_F(PdFaultTest, APairWhoseKvLayoutDiffersIsRefusedSayingWhich) {
  // The window layers of the hybrid model in a pool of their own on P only: another layout.
  const std::string hybrid = TinyModel("qwen3_hybrid");
  auto p = StartWorker(hybrid, Plus(Flags("prefill"), {"--window_pool_bytes=1MiB"}));
  auto d = StartWorker(hybrid, Flags("decode"));
  WorkerClient prefill(p->address()), decode(d->address());
  const std::vector<TokenId> prompt = RandomPrompt(40, 1, 64);
  Sampling greedy;
  PdResult got = RunPd(decode, d->address(), prefill, MakeRequest("r", prompt, greedy));
  EXPECT_EQ(got.prefill.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(got.prefill.error_message().find("KV layout"), std::string::npos)
      << got.prefill.error_message();
  // P told D that nothing comes: the stream ends at once, not at the reservation's deadline.
  EXPECT_FALSE(got.stream.status.ok());
  EXPECT_TRUE(got.stream.has_error);
  EXPECT_TRUE(WaitUntilIdle(decode, nullptr, absl::Seconds(2)));
  // A block size that differs: refused before the engine sees it.
  auto p16 = StartWorker(hybrid, Plus(Flags("prefill"), {"--block_tokens=32"}));
  WorkerClient prefill16(p16->address());
  got = RunPd(decode, d->address(), prefill16, MakeRequest("r2", prompt, greedy));
  EXPECT_EQ(got.prefill.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(got.prefill.error_message().find("block size"), std::string::npos)
      << got.prefill.error_message();
  EXPECT_TRUE(WaitUntilIdle(decode, nullptr, absl::Seconds(2)));
  // Another model (or KV dtype): its fingerprint differs.
  auto other = StartWorker(model_, Flags("prefill"));
  WorkerClient prefill_other(other->address());
  got = RunPd(decode, d->address(), prefill_other, MakeRequest("r3", prompt, greedy));
  EXPECT_EQ(got.prefill.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(got.prefill.error_message().find("fingerprint"), std::string::npos)
      << got.prefill.error_message();
  EXPECT_TRUE(WaitUntilIdle(decode, nullptr, absl::Seconds(2)));
}

TEST_F(PdFaultTest, DecodeKilledDuringThePushLeavesThePrefillWorkerServing) {
  DecodeKilledDuringThePush({});
}

TEST_F(PdFaultTest, DecodeKilledDuringAStreamedPutLeavesThePrefillWorkerServing) {
  // Chunks of 16: the first block is streamed (and held) while the rest is computed.
  DecodeKilledDuringThePush({"--prefill_chunk=16", "--max_batch_tokens=16"});
}

void PdFaultTest::DecodeKilledDuringThePush(const std::vector<std::string>& prefill_flags) {
  auto p = StartWorker(model_, Plus(Flags("prefill"), prefill_flags));
  auto d = StartWorker(model_, Flags("decode"));
  WorkerClient prefill(p->address()), decode(d->address());
  const std::vector<TokenId> prompt = RandomPrompt(40, 1, 64);
  Sampling greedy;
  Hold();
  std::thread killer = KillOnceComputed(p->admin_port(), d.get());  // D dies while P holds the push
  PdResult got = RunPd(decode, d->address(), prefill, MakeRequest("r", prompt, greedy));
  killer.join();
  EXPECT_FALSE(got.prefill.ok());
  EXPECT_EQ(got.prefill.error_code(), grpc::StatusCode::UNAVAILABLE) << got.prefill.error_message();
  EXPECT_TRUE(WaitUntilIdle(prefill, nullptr, absl::Seconds(10)));
  EXPECT_EQ(MetricValue(p->admin_port(), "ferry_worker_kv_streamed_bytes_total"), 0);
  // P serves the next pair (another prompt: streamed again with small chunks).
  auto d2 = StartWorker(model_, Flags("decode"));
  WorkerClient decode2(d2->address());
  InProcessEngine ref(model_);
  const std::vector<TokenId> next = RandomPrompt(40, 2, 64);
  got = RunPd(decode2, d2->address(), prefill, MakeRequest("next", next, greedy));
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message();
  EXPECT_EQ(got.stream.choices[0].tokens, ref.Run(MakeRequest("next", next, greedy))[0].tokens);
  EXPECT_EQ(got.response.bytes_streamed() > 0, !prefill_flags.empty());
  EXPECT_EQ(MetricValue(p->admin_port(), "ferry_worker_kv_pushes_total{outcome=\"failed\"}"), 1);
  EXPECT_TRUE(WaitUntilIdle(prefill, nullptr, absl::Seconds(10)));
}

TEST_F(PdFaultTest, ALatePushNeverLandsInReusedBlocks) {
  // A decode worker with 8 blocks; its reservation times out after 1 s, and its blocks wait for
  // the push's outcome (up to 20 s). The test itself is the late prefill worker: it posts its
  // put into the reservation after the deadline, through its own transport.
  auto d = StartWorker(
      model_, {"--role=decode", "--transport=ucx", "--ucx_tls=tcp", "--kv_pool_bytes=32KiB",
               "--reservation_timeout=1s", "--reservation_quarantine=20s"});
  auto p = StartWorker(model_, Flags("prefill"));
  WorkerClient decode(d->address()), prefill(p->address());
  InProcessEngine ref(model_);
  const std::vector<TokenId> prompt = RandomPrompt(40, 1, 64);
  Sampling greedy;
  greedy.ignore_eos = true;
  greedy.max_tokens = 4;
  v1::KvReservation reservation;
  GenerateResult timed_out = decode.Generate(
      [&] {
        v1::GenerateRequest r = MakeRequest("late", prompt, greedy);
        r.set_aggregated(false);
        return r;
      }(),
      absl::Seconds(30),
      [&](const v1::GenerateEvent& e) {
        if (e.has_reservation()) reservation = e.reservation();
        return true;
      });
  EXPECT_EQ(timed_out.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << timed_out.status.error_message();
  ASSERT_EQ(reservation.reserved_blocks(), 3u);
  auto released = [&] {
    return MetricValue(d->admin_port(),
                       "ferry_worker_kv_reservation_blocks_released_total{outcome=\"known\"}") +
           MetricValue(d->admin_port(),
                       "ferry_worker_kv_reservation_blocks_released_total{outcome=\"quarantine\"}");
  };
  EXPECT_EQ(released(), 0) << "the blocks came back while a push could still land";
  // Meanwhile the decode worker serves another request with its other 5 blocks, correctly.
  std::vector<TokenId> other = RandomPrompt(40, 9, 64);
  PdResult next = RunPd(decode, d->address(), prefill, MakeRequest("other", other, greedy));
  ASSERT_TRUE(next.stream.status.ok()) << next.stream.status.error_message();
  EXPECT_EQ(next.stream.choices[0].tokens, ref.Run(MakeRequest("other", other, greedy))[0].tokens);
  EXPECT_EQ(released(), 0);

  // The late put: bytes into the 3 reserved blocks, well after the deadline.
  PutInto(reservation);
  // Its outcome frees the blocks at once (not the quarantine's end).
  EXPECT_EQ(WaitForMetric(d->admin_port(),
                          "ferry_worker_kv_reservation_blocks_released_total{outcome=\"known\"}", 3,
                          absl::Seconds(4)),
            3);
  EXPECT_TRUE(WaitUntilIdle(decode, nullptr, absl::Seconds(5)));
  // And the next request is served right.
  next = RunPd(decode, d->address(), prefill, MakeRequest("after", other, greedy));
  ASSERT_TRUE(next.stream.status.ok()) << next.stream.status.error_message();
  EXPECT_EQ(next.stream.choices[0].tokens, ref.Run(MakeRequest("after", other, greedy))[0].tokens);
}

TEST_F(PdFaultTest, KvThatLandsWithoutKvReadyEndsTheStreamByTheDeadline) {
  auto d = StartWorker(model_, {"--role=decode", "--transport=ucx", "--ucx_tls=tcp",
                                "--reservation_timeout=1s", "--reservation_quarantine=20s"});
  WorkerClient decode(d->address());
  v1::GenerateRequest r = MakeRequest("mute", RandomPrompt(40, 1, 64), Sampling());
  r.set_aggregated(false);
  // The test pushes the KV and then says nothing (a prefill worker that died after its put).
  GenerateResult got = decode.Generate(r, absl::Seconds(30), [&](const v1::GenerateEvent& e) {
    if (e.has_reservation()) PutInto(e.reservation());
    return true;
  });
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(got.status.error_message().find("did not call KvReady"), std::string::npos)
      << got.status.error_message();
  EXPECT_TRUE(WaitUntilIdle(decode, nullptr, absl::Seconds(5)));
  EXPECT_EQ(MetricValue(d->admin_port(),
                        "ferry_worker_kv_reservation_blocks_released_total{outcome=\"known\"}"),
            3);
}

TEST_F(PdFaultTest, ACancelledPrefillStopsAndBothPoolsComeBack) {
  // The null engine at 1000 prompt tokens/s in steps of 16: 200 tokens take 13 steps, 200 ms.
  const std::vector<std::string> slow = {"--engine=null", "--null_prefill_tokens_per_second=1000",
                                         "--prefill_chunk=16", "--max_batch_tokens=16"};
  auto p = StartWorker(model_, Plus(Flags("prefill"), slow));
  auto d = StartWorker(model_, Plus(Flags("decode"), slow));
  WorkerClient prefill(p->address()), decode(d->address());
  const std::vector<TokenId> prompt = RandomPrompt(200, 4, 64);
  Sampling greedy;
  // The Prefill call goes away (its deadline, as a router's cancel) while P computes: P aborts
  // the request at its next step and tells D, whose stream ends with the error.
  PdResult got = RunPd(decode, d->address(), prefill, MakeRequest("gone", prompt, greedy), {},
                       absl::Milliseconds(60));
  EXPECT_EQ(got.prefill.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_FALSE(got.stream.status.ok());
  EXPECT_TRUE(WaitUntilIdle(prefill, nullptr, absl::Seconds(10)));
  EXPECT_TRUE(WaitUntilIdle(decode, nullptr, absl::Seconds(10)));
  EXPECT_TRUE(got.reserved) << got.stream.status.error_message();
  EXPECT_LT(MetricValue(p->admin_port(), kPrefillSteps), 13)
      << "the cancelled prefill ran to its end";
  // The client's deadline reaches P twice: as gRPC's cancel and as P's own deadline for the
  // request; whichever P sees first names the outcome (under load it was once the deadline). The
  // call counts it when it ends, which may come after the engine is idle.
  auto ended = [&] {
    return MetricValue(p->admin_port(), "ferry_worker_requests_total{outcome=\"cancelled\"}") +
           MetricValue(p->admin_port(),
                       "ferry_worker_requests_total{outcome=\"deadline_exceeded\"}");
  };
  EXPECT_TRUE(WaitUntil([&] { return ended() >= 1; }));
  EXPECT_EQ(ended(), 1);
}

TEST_F(PdFaultTest, PrefillKilledAfterDecodeReservedFreesTheReservation) {
  auto p = StartWorker(model_, Flags("prefill"));
  auto d = StartWorker(model_, Flags("decode"));
  WorkerClient prefill(p->address()), decode(d->address());
  const std::vector<TokenId> prompt = RandomPrompt(40, 1, 64);
  Sampling greedy;
  Hold();
  std::thread killer = KillOnceComputed(p->admin_port(), p.get());
  PdResult got = RunPd(decode, d->address(), prefill, MakeRequest("r", prompt, greedy));
  killer.join();
  EXPECT_FALSE(got.prefill.ok());
  // D's stream ends by the reservation's deadline (3 s), its blocks after the quarantine (3 s).
  EXPECT_EQ(got.stream.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << got.stream.status.error_message();
  EXPECT_TRUE(WaitUntilIdle(decode, nullptr, absl::Seconds(15)));
  EXPECT_EQ(
      MetricValue(d->admin_port(),
                  "ferry_worker_kv_reservation_blocks_released_total{outcome=\"quarantine\"}"),
      3);
  // D serves the next pair.
  auto p2 = StartWorker(model_, Flags("prefill"));
  WorkerClient prefill2(p2->address());
  InProcessEngine ref(model_);
  got = RunPd(decode, d->address(), prefill2, MakeRequest("next", prompt, greedy));
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message();
  EXPECT_EQ(got.stream.choices[0].tokens, ref.Run(MakeRequest("next", prompt, greedy))[0].tokens);
}

TEST_F(PdFaultTest, CancelledPrefillsDoNotHoldBackTheNextRequest) {
  // Ten long prompts (200 tokens, 13 steps of 16 each on the null engine at 1000 tokens/s) are
  // cancelled while P computes or queues them; a short request then is computed within a step or
  // two of P's engine, not behind 130 steps of cancelled work.
  const std::vector<std::string> slow = {"--engine=null", "--null_prefill_tokens_per_second=1000",
                                         "--prefill_chunk=16", "--max_batch_tokens=16"};
  auto p = StartWorker(model_, Plus(Flags("prefill"), slow));
  auto d = StartWorker(model_, Plus(Flags("decode"), slow));
  WorkerClient decode(d->address());
  std::vector<std::thread> callers;
  std::atomic<int> cancelled{0};
  for (int i = 0; i < 10; ++i) {
    callers.emplace_back([&, i] {
      WorkerClient prefill(p->address()), own_decode(d->address());
      PdResult got =
          RunPd(own_decode, d->address(), prefill,
                MakeRequest(absl::StrCat("long", i), RandomPrompt(200, 10 + i, 64), Sampling()), {},
                absl::Milliseconds(100));
      if (got.prefill.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++cancelled;
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(cancelled.load(), 10);
  const std::string steps = kPrefillSteps;
  const double before = MetricValue(p->admin_port(), steps);
  EXPECT_LT(before, 130) << "the cancelled prefills ran on";
  WorkerClient prefill(p->address());
  Sampling one;
  one.max_tokens = 2;
  PdResult got =
      RunPd(decode, d->address(), prefill, MakeRequest("short", RandomPrompt(12, 99, 64), one));
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message();
  // Its one prefill step, and at most one more the aborts may have shared.
  EXPECT_LE(MetricValue(p->admin_port(), steps) - before, 2);
  EXPECT_TRUE(WaitUntilIdle(prefill, nullptr, absl::Seconds(10)));
  EXPECT_TRUE(WaitUntilIdle(decode, nullptr, absl::Seconds(10)));
}

}  // namespace
}  // namespace ferry
