// Structured output through ferry-worker on the default model (SmolLM2-135M-Instruct): a request
// whose SamplingParams carry a GBNF constraint gives the same tokens as the engine in this
// process with that grammar (compiled there without the worker's cache), greedy and seeded, and
// its text matches the regular expression the grammar spells (std::regex, not the grammar
// engine); the worker counts the compile once and then hits its cache. In P/D (a prefill and a
// decode worker over the gRPC transport) the first token, sampled by the prefill worker, obeys
// the grammar (it differs from the unconstrained first token) and the stream equals the
// aggregated one; a request resumed after some tokens (aggregated, and re-prefilled in P/D as a
// migration does) continues exactly as the fault-free stream. A wrong hash and a bad grammar are
// INVALID_ARGUMENT with their messages. Needs FERRY_MODEL_GGUF (set by ./ferry test).

#include <cstdio>
#include <cstdlib>
#include <regex>

#include "engine/common/hash128.h"
#include "gtest/gtest.h"
#include "kvstore/wire.h"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

// A person as one line of JSON, and the same language as a regular expression.
constexpr char kGbnf[] =
    R"(root ::= "{\"name\": \"" [a-zA-Z ]{1,12} "\", \"age\": " [1-9] [0-9]? "}")";
constexpr char kRegex[] = R"(\{"name": "[a-zA-Z ]{1,12}", "age": [1-9][0-9]?\})";

v1::GenerateRequest Constrained(v1::GenerateRequest request, const std::string& gbnf) {
  v1::OutputConstraint* c = request.mutable_request()->mutable_sampling()->mutable_constraint();
  c->set_kind(v1::CONSTRAINT_KIND_GRAMMAR);
  c->set_grammar(gbnf);
  kv::HashToProto(Xxh3Hash128(gbnf), c->mutable_hash());
  return request;
}

const char* Model() {
  const char* model = std::getenv("FERRY_MODEL_GGUF");
  EXPECT_NE(model, nullptr) << "FERRY_MODEL_GGUF is not set; run through ./ferry test";
  return model;
}

std::vector<std::string> Flags(const std::string& role) {
  return {"--role=" + role, "--transport=grpc", "--kv_pool_bytes=16MiB", "--threads=1"};
}

void ExpectMatchesTheGrammar(const ChoiceOutput& o, const std::string& what) {
  EXPECT_EQ(o.finish, v1::FINISH_REASON_STOP) << what << ": " << o.text;
  EXPECT_TRUE(std::regex_match(o.text, std::regex(kRegex))) << what << ": " << o.text;
}

// The rest of `want` after its first `k` tokens (tokens and finish; the text is compared whole).
void ExpectContinues(const GenerateResult& got, const ChoiceOutput& want, size_t k,
                     const std::string& what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.error_message();
  ASSERT_EQ(got.choices.size(), 1u) << what;
  std::vector<uint32_t> rest(want.tokens.begin() + k, want.tokens.end());
  EXPECT_EQ(got.choices[0].tokens, rest) << what;
  EXPECT_EQ(got.choices[0].finish, want.finish) << what;
}

TEST(WorkerGrammarTest, ConstrainedStreamsEqualTheEngineAggregatedPdAndResumed) {
  const char* model = Model();
  ASSERT_NE(model, nullptr);
  auto a = StartWorker(model, {"--kv_pool_bytes=16MiB", "--threads=1"});
  auto p = StartWorker(model, Flags("prefill"));
  auto d = StartWorker(model, Flags("decode"));
  ASSERT_TRUE(a->ready() && p->ready() && d->ready());
  WorkerClient aggregated(a->address()), prefill(p->address()), decode(d->address());
  InProcessEngine ref(model, 0, "bf16", "bf16", 16, 16 << 20);
  const std::vector<TokenId> prompt =
      Encode(ref.tokenizer(), "Here is a famous scientist, described in one line of JSON:");

  Sampling greedy;
  greedy.max_tokens = 40;
  Sampling seeded = greedy;
  seeded.temperature = 1.0f;
  seeded.seed = 3;
  // The unconstrained first token is not one the grammar allows: the P/D check below shows the
  // mask at the prefill worker.
  const std::vector<ChoiceOutput> free = ref.Run(MakeRequest("free", prompt, greedy));
  ASSERT_FALSE(free[0].tokens.empty());

  int compiles = 0;
  for (const auto& [name, sampling] : {std::make_pair("greedy", greedy), {"seeded", seeded}}) {
    const v1::GenerateRequest request = Constrained(MakeRequest(name, prompt, sampling), kGbnf);
    const ChoiceOutput want = ref.Run(request)[0];
    ExpectMatchesTheGrammar(want, std::string(name) + " in process");
    GenerateResult got = aggregated.Generate(request, absl::Seconds(120));
    ASSERT_TRUE(got.status.ok()) << name << ": " << got.status.error_message();
    ExpectSameOutput(got.choices[0], want, std::string(name) + " aggregated");
    ExpectMatchesTheGrammar(got.choices[0], std::string(name) + " aggregated");
    std::printf("%s: %s (%zu tokens)\n", name, got.choices[0].text.c_str(),
                got.choices[0].tokens.size());
    if (compiles++ == 0) {
      EXPECT_NE(want.tokens[0], free[0].tokens[0]) << "the grammar does not change the first token";
    }

    // P/D: the prefill worker samples the first token under the mask.
    v1::GenerateRequest pd_request = request;
    pd_request.mutable_request()->mutable_context()->set_request_id(std::string(name) + "-pd");
    PdResult pd = RunPd(decode, d->address(), prefill, pd_request);
    ASSERT_TRUE(pd.prefill.ok()) << name << ": " << pd.prefill.error_message();
    ASSERT_TRUE(pd.stream.status.ok()) << name << ": " << pd.stream.status.error_message();
    ExpectSameOutput(pd.stream.choices[0], want, std::string(name) + " P/D");

    // Resumed after a few tokens: aggregated, and migrated in P/D (re-prefilled, then decoded).
    const size_t k = std::min<size_t>(5, want.tokens.size() - 1);
    ExpectContinues(aggregated.Generate(Resumed(request, want.tokens, k, std::string(name) + "-r"),
                                        absl::Seconds(120)),
                    want, k, std::string(name) + " resumed");
    PdResult migrated = RunPd(decode, d->address(), prefill,
                              Resumed(pd_request, want.tokens, k, std::string(name) + "-m"));
    ASSERT_TRUE(migrated.prefill.ok()) << name << ": " << migrated.prefill.error_message();
    ExpectContinues(migrated.stream, want, k, std::string(name) + " migrated");
  }
  // One compile per worker, the other requests hit (aggregated: 2 requests + 1 resume per loop).
  EXPECT_EQ(WaitForMetric(a->admin_port(), "ferry_worker_grammar_cache_total{result=\"miss\"}", 1),
            1);
  EXPECT_EQ(WaitForMetric(a->admin_port(), "ferry_worker_grammar_cache_total{result=\"hit\"}", 3),
            3);
  EXPECT_GE(WaitForMetric(a->admin_port(), "ferry_worker_grammar_masks_total", 1), 1);
  EXPECT_GT(WaitForMetric(a->admin_port(), "ferry_worker_grammar_cache_bytes", 1), 0);
  EXPECT_EQ(WaitForMetric(p->admin_port(), "ferry_worker_grammar_cache_total{result=\"miss\"}", 1),
            1);

  // Refusals: a hash that is not the grammar's, a grammar the parser refuses.
  v1::GenerateRequest bad_hash = Constrained(MakeRequest("bad-hash", prompt, greedy), kGbnf);
  bad_hash.mutable_request()->mutable_sampling()->mutable_constraint()->mutable_hash()->set_lo(1);
  GenerateResult refused = aggregated.Generate(bad_hash, absl::Seconds(30));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("constraint hash"), std::string::npos)
      << refused.status.error_message();
  refused = aggregated.Generate(
      Constrained(MakeRequest("bad-grammar", prompt, greedy), "root ::= nothing"),
      absl::Seconds(30));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("undefined rule 'nothing'"), std::string::npos)
      << refused.status.error_message();
  EXPECT_EQ(WaitForMetric(a->admin_port(), "ferry_worker_grammar_cache_total{result=\"error\"}", 1),
            1);

  for (auto* w : {&a, &p, &d}) {
    (*w)->Signal(SIGTERM);
    EXPECT_EQ((*w)->WaitForExit(absl::Seconds(30)), 0) << (*w)->LogTail();
  }
}

}  // namespace
}  // namespace ferry
