// grammar_decode_bench: decode throughput of the engine in process (SmolLM2-135M, bf16 weights,
// the CPU backend on all cores) at batch 16, with a JSON Schema constraint and without (the
// baseline, same run), for `ferry bench grammar` (grammar_bench.py prints the table).
//
//   grammar_decode_bench MODEL.gguf [ROUNDS]
//
// Each round runs the free batch, then the constrained one (which goes first alternates round
// by round, so the machine's load drifts over both alike): 16 requests of the same prompt
// (cached by a one-token warm-up of the batch, so the timed run is decode), temperature 1, seeds
// 1..16, 64 tokens each, ignore_eos. The grammar is an array of at least 10 person objects (a
// bounded name, an integer age, an email), so every constrained choice runs to max_tokens as the
// free ones do. Round 0 is a warm-up (the grammar's mask cache starts empty there) and is
// printed, not counted. Prints one JSON object: {"free_tok_s", "constrained_tok_s" (medians
// over the counted rounds), "ratio", "rounds", "first_constrained_tok_s"}.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/gguf/gguf_file.h"
#include "engine/grammar/compiled_constraint.h"
#include "engine/grammar/json_schema.h"
#include "engine/model/host_weights.h"
#include "engine/model/transformer.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

constexpr int kBatch = 16;
constexpr int64_t kTokens = 64;
constexpr char kPrompt[] = "A list of people as JSON, each with a name, an age and an email:";
constexpr char kSchema[] =
    R"({"type":"array","minItems":10,"items":{"type":"object","properties":{)"
    R"("name":{"type":"string","maxLength":16},"age":{"type":"integer","minimum":0,"maximum":120},)"
    R"("email":{"type":"string","format":"email"}},"required":["name","age","email"],)"
    R"("additionalProperties":false}})";

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::cerr << "grammar_decode_bench: " << what << ": " << v.status() << "\n";
    std::exit(1);
  }
  return *std::move(v);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(const std::string& gguf_path, int rounds) {
  auto gguf = OrDie(GgufFile::Open(gguf_path), "open");
  auto backend = OrDie(CpuBackend::Create(), "backend");
  HostWeights host = OrDie(LoadGgufModel(*gguf, WeightDType::kBF16, "bf16"), "load");
  auto model = OrDie(Transformer::Create(host, backend.get()), "model");
  auto tokenizer = OrDie(Tokenizer::FromGguf(*gguf), "tokenizer");
  BackendKvAllocator allocator(backend.get());
  auto pool =
      OrDie(KvBlockPool::Create(model->KvLayoutFor(16), 512, &allocator, backend.get()), "pool");
  EngineOptions options;
  options.max_batch_tokens = 1024;
  auto engine = OrDie(Engine::Create(model.get(), pool.get(), tokenizer.get(), options), "engine");
  auto gbnf = OrDie(grammar::JsonSchemaTextToGbnf(kSchema), "schema");
  auto vocabulary = OrDie(engine->Vocabulary(), "vocabulary");
  auto constraint = OrDie(grammar::CompiledConstraint::Create(gbnf, vocabulary), "grammar");
  const std::vector<TokenId> prompt = OrDie(tokenizer->Encode(kPrompt), "encode");

  int64_t finished_short = 0;
  auto batch = [&](const std::string& tag, int64_t max_tokens, bool constrained) {
    for (int i = 0; i < kBatch; ++i) {
      EngineRequest r;
      r.id = absl::StrCat(tag, "_", i);
      r.prompt = prompt;
      r.max_tokens = max_tokens;
      r.ignore_eos = true;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = i + 1;
      if (constrained) r.constraint = constraint;
      r.on_event = [&finished_short, max_tokens](const TokenEvent& e) {
        if (e.finish != FinishReason::kNone && e.finish != FinishReason::kLength &&
            max_tokens > 1) {
          ++finished_short;
        }
      };
      auto s = engine->Submit(std::move(r));
      if (!s.ok()) {
        std::cerr << "grammar_decode_bench: submit: " << s << "\n";
        std::exit(1);
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const int64_t before = engine->stats().generated_tokens;
    while (OrDie(engine->Step(), "step")) {
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return (engine->stats().generated_tokens - before) / seconds;
  };

  std::vector<double> free_rates, constrained_rates;
  double first_constrained = 0;
  for (int round = 0; round <= rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool constrained = (k == 0) == (round % 2 == 1);
      const std::string tag = absl::StrCat(constrained ? "c" : "f", round);
      batch(tag + "_warm", 1, constrained);  // the prompt's blocks cached
      const double rate = batch(tag, kTokens, constrained);
      std::fprintf(stderr, "round %d %s: %.1f tokens/s\n", round,
                   constrained ? "constrained" : "free", rate);
      if (round == 0) {
        if (constrained) first_constrained = rate;
        continue;
      }
      (constrained ? constrained_rates : free_rates).push_back(rate);
    }
  }
  if (finished_short > 0) {
    std::cerr << "grammar_decode_bench: " << finished_short
              << " choices ended before max_tokens; the rates are not comparable\n";
    return 1;
  }
  const double free_rate = Median(free_rates);
  const double constrained_rate = Median(constrained_rates);
  std::cout << nlohmann::json{{"free_tok_s", free_rate},
                              {"constrained_tok_s", constrained_rate},
                              {"ratio", constrained_rate / free_rate},
                              {"rounds", rounds},
                              {"batch", kBatch},
                              {"tokens_per_request", kTokens},
                              {"first_constrained_tok_s", first_constrained}}
                   .dump()
            << "\n";
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: grammar_decode_bench MODEL.gguf [ROUNDS]\n";
    return 1;
  }
  return ferry::Run(argv[1], argc == 3 ? std::stoi(argv[2]) : 5);
}
