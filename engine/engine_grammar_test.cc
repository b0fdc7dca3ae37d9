// Constrained decoding in the engine on the default model (SmolLM2-135M-Instruct, bf16): with a
// JSON Schema's grammar and an enum-of-strings grammar, at temperature 1 over several seeds,
// every `stop` output is a sentence of the grammar and every `length` output a prefix of one
// (checked with a fresh GrammarMatcher over the output's bytes, not with the masks); greedy is
// the masked argmax of the raw logits; a constrained request gives the same tokens alone, in a
// batch of constrained and free requests, and resumed from the middle; n > 1 choices are each
// valid; a foreign vocabulary or a resumed token the grammar refuses is an InvalidArgument. Also
// prints decode tokens/s at batch 16, constrained and free. Needs FERRY_MODEL_GGUF.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <utility>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/log.h"
#include "engine/engine.h"
#include "engine/gguf/gguf_file.h"
#include "engine/grammar/compiled_constraint.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/json_schema.h"
#include "engine/model/host_weights.h"
#include "engine/model/transformer.h"
#include "engine/smollm2_test_model.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using Shared = SmolLm2TestModel;

Shared& Model() { return SharedSmolLm2(); }

struct Output {
  std::vector<TokenId> tokens;
  std::vector<std::vector<float>> logits;
  bool stop_token = false;
  SamplerState sampler_state;
  std::string held;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

class EngineRun {
 public:
  EngineRun() {
    Shared& m = Model();
    allocator_ = std::make_unique<BackendKvAllocator>(m.backend.get());
    pool_ = *KvBlockPool::Create(m.model->KvLayoutFor(16), 512, allocator_.get(), m.backend.get());
    EngineOptions options;
    options.prefill_chunk = 256;
    options.max_batch_tokens = 1024;
    engine_ = *Engine::Create(m.model.get(), pool_.get(), m.tokenizer.get(), options);
  }
  absl::Status Submit(EngineRequest r, bool keep_logits = false) {
    const std::string id = r.id;
    r.keep_logits = keep_logits;
    r.on_event = [this, id](const TokenEvent& e) {
      Output& o = out_[{id, e.choice}];
      if (e.has_token) {
        o.tokens.push_back(e.token);
        o.logits.push_back(e.logits);
      }
      if (e.finish != FinishReason::kNone) {
        o.finish = e.finish;
        o.stop_token = e.stop_token;
        o.sampler_state = e.sampler_state;
        o.held = e.held_text;
        o.error = e.error;
      }
    };
    return engine_->Submit(std::move(r));
  }
  void Drain() {
    while (true) {
      auto worked = engine_->Step();
      ASSERT_TRUE(worked.ok()) << worked.status();
      if (!*worked) return;
    }
  }
  Output& out(const std::string& id, int32_t choice = 0) { return out_[{id, choice}]; }
  Engine& engine() { return *engine_; }

 private:
  std::unique_ptr<BackendKvAllocator> allocator_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<Engine> engine_;
  std::map<std::pair<std::string, int32_t>, Output> out_;
};

std::shared_ptr<const grammar::CompiledConstraint> Compile(EngineRun& run,
                                                           const std::string& gbnf) {
  auto vocabulary = run.engine().Vocabulary();
  CHECK(vocabulary.ok()) << vocabulary.status();
  auto c = grammar::CompiledConstraint::Create(gbnf, *vocabulary);
  CHECK(c.ok()) << c.status();
  return *c;
}

std::string PersonGbnf() {
  auto gbnf = grammar::JsonSchemaTextToGbnf(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":10},)"
      R"("age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"],)"
      R"("additionalProperties":false})");
  CHECK(gbnf.ok()) << gbnf.status();
  return *gbnf;
}

const char kColorGbnf[] = R"(root ::= "\"" ("red" | "green" | "blue" | "dark red") "\"")";

EngineRequest Req(const std::string& id, const char* prompt, int64_t max_tokens, uint64_t seed,
                  std::shared_ptr<const grammar::CompiledConstraint> constraint) {
  EngineRequest r;
  r.id = id;
  r.prompt = *Model().tokenizer->Encode(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = seed == 0 ? 0.0f : 1.0f;
  r.sampling.seed = seed;
  r.constraint = std::move(constraint);
  return r;
}

const char kPersonPrompt[] = "A person as JSON with a name and an age:";
const char kColorPrompt[] = "My favourite colour, in quotes:";

// The output's bytes (without a final stop token) through a fresh byte matcher: a whole
// sentence for a stop, a prefix for a length finish.
void ExpectValid(const Output& o, const grammar::CompiledConstraint& c, const std::string& what) {
  ASSERT_TRUE(o.finish == FinishReason::kStop || o.finish == FinishReason::kLength)
      << what << ": finish " << FinishReasonName(o.finish) << " " << o.error;
  std::vector<TokenId> tokens = o.tokens;
  if (o.stop_token) tokens.pop_back();
  std::string bytes;
  for (TokenId t : tokens) bytes += c.vocabulary()->TokenBytes(t);
  auto m = grammar::GrammarMatcher::Create(c.grammar());
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->AdvanceBytes(bytes), grammar::GrammarMatcher::Step::kOk)
      << what << ": output not a prefix of the grammar: " << bytes;
  if (o.finish == FinishReason::kStop) {
    EXPECT_TRUE(m->Accepting()) << what << ": stopped before the grammar completed: " << bytes;
  }
}

TEST(EngineGrammarTest, SampledOutputsObeyTheGrammar) {
  EngineRun run;
  const auto person = Compile(run, PersonGbnf());
  const auto color = Compile(run, kColorGbnf);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    ASSERT_TRUE(run.Submit(Req("p" + std::to_string(seed), kPersonPrompt, 40, seed, person)).ok());
    ASSERT_TRUE(run.Submit(Req("c" + std::to_string(seed), kColorPrompt, 8, seed, color)).ok());
  }
  run.Drain();
  int stops = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Output& p = run.out("p" + std::to_string(seed));
    ExpectValid(p, *person, "person seed " + std::to_string(seed));
    stops += p.finish == FinishReason::kStop;
    const Output& c = run.out("c" + std::to_string(seed));
    ExpectValid(c, *color, "color seed " + std::to_string(seed));
    EXPECT_EQ(c.finish, FinishReason::kStop) << "seed " << seed;
  }
  EXPECT_GT(stops, 0);
}

TEST(EngineGrammarTest, GreedyIsTheMaskedArgmax) {
  EngineRun run;
  const auto person = Compile(run, PersonGbnf());
  ASSERT_TRUE(run.Submit(Req("g", kPersonPrompt, 30, 0, person), /*keep_logits=*/true).ok());
  run.Drain();
  const Output& o = run.out("g");
  ExpectValid(o, *person, "greedy");
  std::vector<uint32_t> stop_ids(run.engine().eos_token_ids().begin(),
                                 run.engine().eos_token_ids().end());
  auto m = person->NewMatcher(stop_ids);
  ASSERT_TRUE(m.ok());
  const size_t vocab = o.logits[0].size();
  std::vector<uint32_t> mask(grammar::TokenMatcher::MaskWords(vocab));
  for (size_t i = 0; i < o.tokens.size(); ++i) {
    m->ComputeMask(absl::MakeSpan(mask));
    TokenId best = -1;
    float best_l = -std::numeric_limits<float>::infinity();
    for (size_t t = 0; t < vocab; ++t) {
      if (((mask[t / 32] >> (t % 32)) & 1) && (best < 0 || o.logits[i][t] > best_l)) {
        best = static_cast<TokenId>(t);
        best_l = o.logits[i][t];
      }
    }
    ASSERT_EQ(o.tokens[i], best) << "token " << i;
    ASSERT_TRUE(m->Accept(static_cast<uint32_t>(o.tokens[i])).ok());
  }
}

TEST(EngineGrammarTest, SameTokensAloneBatchedAndResumed) {
  EngineRun alone;
  const auto person = Compile(alone, PersonGbnf());
  const uint64_t seed = 7;
  ASSERT_TRUE(alone.Submit(Req("r", kPersonPrompt, 24, seed, person)).ok());
  alone.Drain();
  const Output want = alone.out("r");
  ExpectValid(want, *person, "alone");
  ASSERT_GT(want.tokens.size(), 6u);

  EngineRun batch;  // another engine, the same vocabulary (compared by content)
  ASSERT_TRUE(batch.Submit(Req("free", kColorPrompt, 12, 3, nullptr)).ok());
  ASSERT_TRUE(batch.Submit(Req("color", kColorPrompt, 8, 5, Compile(batch, kColorGbnf))).ok());
  ASSERT_TRUE(batch.Submit(Req("greedy", kPersonPrompt, 10, 0, person)).ok());
  ASSERT_TRUE(batch.Submit(Req("r", kPersonPrompt, 24, seed, person)).ok());
  batch.Drain();
  EXPECT_EQ(batch.out("r").tokens, want.tokens) << "in a batch";

  EngineRun resumed;
  ASSERT_TRUE(resumed.Submit(Req("head", kPersonPrompt, 6, seed, person)).ok());
  resumed.Drain();
  const Output head = resumed.out("head");
  ASSERT_EQ(head.finish, FinishReason::kLength);
  EngineRequest rest = Req("rest", kPersonPrompt, 24, seed, person);
  rest.resume = {ResumePoint{head.tokens, head.sampler_state, head.held}};
  ASSERT_TRUE(resumed.Submit(std::move(rest)).ok());
  resumed.Drain();
  std::vector<TokenId> joined = head.tokens;
  const Output& tail = resumed.out("rest");
  joined.insert(joined.end(), tail.tokens.begin(), tail.tokens.end());
  EXPECT_EQ(joined, want.tokens) << "resumed after 6 tokens";
  EXPECT_EQ(tail.finish, want.finish);
}

TEST(EngineGrammarTest, EveryChoiceObeysTheGrammar) {
  EngineRun run;
  const auto person = Compile(run, PersonGbnf());
  EngineRequest r = Req("n", kPersonPrompt, 40, 11, person);
  r.n = 4;
  ASSERT_TRUE(run.Submit(std::move(r)).ok());
  run.Drain();
  for (int32_t c = 0; c < 4; ++c)
    ExpectValid(run.out("n", c), *person, "choice " + std::to_string(c));
}

TEST(EngineGrammarTest, ACompleteGrammarEndsTheChoiceDespiteMinTokensOrIgnoreEos) {
  EngineRun run;
  const auto color = Compile(run, kColorGbnf);
  EngineRequest min = Req("min", kColorPrompt, 30, 2, color);
  min.min_tokens = 25;  // more than any color takes: the grammar allows only EOS before it
  ASSERT_TRUE(run.Submit(std::move(min)).ok());
  EngineRequest no_eos = Req("no_eos", kColorPrompt, 30, 2, color);
  no_eos.ignore_eos = true;  // complete, nothing continues it, no stop id: ends without a token
  ASSERT_TRUE(run.Submit(std::move(no_eos)).ok());
  run.Drain();
  const Output& m = run.out("min");
  ExpectValid(m, *color, "min_tokens");
  EXPECT_EQ(m.finish, FinishReason::kStop);
  EXPECT_TRUE(m.stop_token);
  EXPECT_LT(m.tokens.size(), 25u);
  const Output& n = run.out("no_eos");
  ExpectValid(n, *color, "ignore_eos");
  EXPECT_EQ(n.finish, FinishReason::kStop);
  EXPECT_FALSE(n.stop_token);
  EXPECT_EQ(n.tokens.size() + 1, m.tokens.size());  // the same tokens but the EOS
}

TEST(EngineGrammarTest, ForeignVocabularyAndRefusedResumeAreInvalid) {
  EngineRun run;
  auto small = grammar::TokenTrie::Build({"a", "b", "\""});
  ASSERT_TRUE(small.ok());
  auto foreign = grammar::CompiledConstraint::Create(kColorGbnf, *small);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(run.Submit(Req("f", kColorPrompt, 8, 1, *foreign)).code(),
            absl::StatusCode::kInvalidArgument);

  const auto color = Compile(run, kColorGbnf);
  EngineRequest r = Req("bad", kColorPrompt, 8, 1, color);
  ResumePoint p;
  p.generated = *Model().tokenizer->Encode("purple");
  for (TokenId t : p.generated) p.sampler_state.Observe(t);
  r.resume = {p};
  absl::Status s = run.Submit(std::move(r));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  auto bad = grammar::CompiledConstraint::Create("root ::= missing", *run.engine().Vocabulary());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// A special token the request keeps as text (a tool-call marker) has its text in that request's
// vocabulary, so a grammar that spells it allows the special token; other requests' vocabularies
// give it no bytes, and a constraint made for one kept set is refused for another.
TEST(EngineGrammarTest, KeptSpecialTokensAreTextOnlyForTheRequestsThatKeepThem) {
  EngineRun run;
  const Tokenizer& tokenizer = *Model().tokenizer;
  auto marker_ids = tokenizer.Encode("<|im_start|>", /*allow_special=*/true);
  ASSERT_TRUE(marker_ids.ok());
  ASSERT_EQ(marker_ids->size(), 1u);
  const TokenId marker = (*marker_ids)[0];
  ASSERT_TRUE(tokenizer.IsSpecial(marker));
  auto plain = run.engine().Vocabulary();
  auto kept = run.engine().Vocabulary({marker});
  ASSERT_TRUE(plain.ok() && kept.ok());
  EXPECT_NE(plain->get(), kept->get());
  EXPECT_EQ((*plain)->TokenBytes(marker), "");
  EXPECT_EQ((*kept)->TokenBytes(marker), "<|im_start|>");
  EXPECT_EQ(run.engine().Vocabulary({marker, marker})->get(), kept->get());  // cached per set
  EXPECT_EQ(run.engine().Vocabulary({TokenId{100}})->get(), plain->get());   // not special
  // Bounded: more kept sets than kept push the oldest out (built again when asked).
  std::vector<TokenId> specials;
  for (TokenId t = 0; t < 64 && specials.size() < Engine::kMaxKeptVocabularies + 1; ++t) {
    if (tokenizer.IsSpecial(t) && t != marker) specials.push_back(t);
  }
  if (specials.size() == Engine::kMaxKeptVocabularies + 1) {
    for (TokenId t : specials) ASSERT_TRUE(run.engine().Vocabulary({t}).ok());
    EXPECT_NE(run.engine().Vocabulary({marker})->get(), kept->get());
  }
  auto constraint = grammar::CompiledConstraint::Create(R"(root ::= "<|im_start|>" "x")",
                                                        *run.engine().Vocabulary({marker}));
  ASSERT_TRUE(constraint.ok()) << constraint.status();
  auto m = (*constraint)->NewMatcher({});
  ASSERT_TRUE(m.ok());
  std::vector<uint32_t> mask(grammar::TokenMatcher::MaskWords((*kept)->vocab_size()));
  m->ComputeMask(absl::MakeSpan(mask));
  EXPECT_TRUE((mask[marker / 32] >> (marker % 32)) & 1) << "the marker's special token";

  EngineRequest r = Req("kept", kColorPrompt, 16, 0, *constraint);
  r.keep_special_token_ids = {marker};
  ASSERT_TRUE(run.Submit(r).ok());
  run.Drain();
  const Output& o = run.out("kept");
  std::string bytes;
  for (TokenId t : o.tokens) bytes += (*constraint)->vocabulary()->TokenBytes(t);
  EXPECT_EQ(bytes.rfind("<|im_start|>", 0), 0u) << bytes;
  EngineRequest other = Req("not-kept", kColorPrompt, 4, 0, *constraint);
  absl::Status s = run.Submit(std::move(other));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("kept special tokens"), std::string::npos) << s;
}

// Mostly not a check: the first mask of a new grammar, cold (computed on first use, as on the
// engine thread without the compile cache) and after CompiledConstraint::WarmStart (what the
// worker's compile does); both masks equal.
TEST(EngineGrammarTest, PrintsTheFirstMaskColdAndWarmed) {
  EngineRun run;
  auto vocabulary = run.engine().Vocabulary();
  ASSERT_TRUE(vocabulary.ok());
  auto ms_since = [](std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  auto first_mask = [&](const grammar::CompiledConstraint& c, std::vector<uint32_t>* mask) {
    auto m = c.NewMatcher({});
    EXPECT_TRUE(m.ok());
    mask->assign(grammar::TokenMatcher::MaskWords((*vocabulary)->vocab_size()), 0);
    const auto start = std::chrono::steady_clock::now();
    m->ComputeMask(absl::MakeSpan(*mask));
    return ms_since(start);
  };
  // A JSON object (its start allows '{' only) and free text (its start allows most tokens).
  const std::pair<const char*, std::string> grammars[] = {
      {"person", PersonGbnf()}, {"text", R"(root ::= [a-zA-Z0-9 ,.]{1,200} "\n")"}};
  for (const auto& [name, gbnf] : grammars) {
    auto cold = grammar::CompiledConstraint::Create(gbnf, *vocabulary);
    auto warm = grammar::CompiledConstraint::Create(gbnf, *vocabulary);
    ASSERT_TRUE(cold.ok() && warm.ok());
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE((*warm)->WarmStart().ok());
    const double warming = ms_since(start);
    std::vector<uint32_t> cold_mask, warm_mask;
    const double cold_ms = first_mask(**cold, &cold_mask);
    const double warm_ms = first_mask(**warm, &warm_mask);
    EXPECT_EQ(cold_mask, warm_mask) << name;
    std::printf("%s: first mask of a new grammar cold %.3f ms, warmed %.3f ms (warming %.3f ms)\n",
                name, cold_ms, warm_ms, warming);
  }
}

// Not a check: decode tokens/s at batch 16 with and without a grammar (10+ persons, so
// that the choices run to max_tokens as the free ones do; one run each, on whatever else this
// machine is doing).
TEST(EngineGrammarTest, PrintsConstrainedVsFreeDecodeSpeed) {
  EngineRun run;
  auto gbnf = grammar::JsonSchemaTextToGbnf(
      R"({"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},)"
      R"("age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false},"minItems":10})");
  ASSERT_TRUE(gbnf.ok()) << gbnf.status();
  const auto person = Compile(run, *gbnf);
  // Free, constrained, free again (the two free runs show the noise).
  double rate[2] = {0, 0};
  int round = 0;
  for (int constrained : {0, 1, 0}) {
    ++round;
    for (int i = 0; i < 16; ++i) {
      EngineRequest r = Req("w" + std::to_string(round) + "_" + std::to_string(i), kPersonPrompt, 1,
                            i + 1, constrained ? person : nullptr);
      ASSERT_TRUE(run.Submit(std::move(r)).ok());
    }
    run.Drain();  // the prompt's blocks cached: the timed run is mostly decode
    for (int i = 0; i < 16; ++i) {
      EngineRequest r = Req("s" + std::to_string(round) + "_" + std::to_string(i), kPersonPrompt,
                            32, i + 1, constrained ? person : nullptr);
      r.ignore_eos = true;
      ASSERT_TRUE(run.Submit(std::move(r)).ok());
    }
    const auto start = std::chrono::steady_clock::now();
    const int64_t before = run.engine().stats().generated_tokens;
    run.Drain();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double r = (run.engine().stats().generated_tokens - before) / seconds;
    rate[constrained] = std::max(rate[constrained], r);
    std::printf("%s: %lld tokens in %.3f s\n", constrained ? "constrained" : "free",
                static_cast<long long>(run.engine().stats().generated_tokens - before), seconds);
  }
  std::printf(
      "decode at batch 16: free (the better run) %.1f tokens/s, constrained %.1f tokens/s "
      "(%.2fx)\n",
      rate[0], rate[1], rate[1] / rate[0]);
}

}  // namespace
}  // namespace ferry
