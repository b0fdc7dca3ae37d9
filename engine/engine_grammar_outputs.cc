// engine_grammar_outputs: constrained requests on the default model (SmolLM2-135M-Instruct, bf16,
// the engine in process) for engine_grammar_validity_test.sh, whose Python half validates every
// output with jsonschema.
//
//   engine_grammar_outputs SCHEMAS.json REQUESTS OUT.jsonl
//     SCHEMAS.json: [{"name", "prompt", "max_tokens", "schema", "weight" (default 1)}]. Each
//     schema is compiled (JsonSchemaTextToGbnf, the default policies) and REQUESTS requests are
//     spread over the schemas round robin, each schema `weight` times per cycle, the prompt in
//     SmolLM2's chat template (unless "chat" is false: then the text as it is, e.g. a few-shot
//     list), at temperature 1 with seeds 1..REQUESTS, all submitted at once
//     (the engine batches them, max_running 64). Prints one JSON line per request: {"schema",
//     "seed", "finish", "text_hex" (the output's bytes without a final stop token), "prefix_ok" (a
//     fresh GrammarMatcher accepts those bytes: a prefix of a sentence), "accepting" (they are a
//     whole sentence), "tokens"}. Exits 1 when a schema does not compile or a request is refused.
//     Needs FERRY_MODEL_GGUF.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/grammar/compiled_constraint.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/json_schema.h"
#include "engine/smollm2_test_model.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

struct Output {
  size_t schema = 0;
  uint64_t seed = 0;
  std::vector<TokenId> tokens;
  bool stop_token = false;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

std::string Hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

int Fail(const std::string& what) {
  std::cerr << "engine_grammar_outputs: " << what << "\n";
  return 1;
}

int Run(const std::string& schemas_path, int requests, const std::string& out_path) {
  std::ifstream in(schemas_path);
  std::stringstream text;
  text << in.rdbuf();
  auto schemas = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (!in || schemas.is_discarded() || !schemas.is_array() || schemas.empty()) {
    return Fail("cannot read a JSON array of schemas from " + schemas_path);
  }

  SmolLm2TestModel& m = SharedSmolLm2();
  BackendKvAllocator allocator(m.backend.get());
  auto pool = KvBlockPool::Create(m.model->KvLayoutFor(16), 1024, &allocator, m.backend.get());
  if (!pool.ok()) return Fail(pool.status().ToString());
  EngineOptions options;
  options.max_batch_tokens = 1024;
  options.max_running = 64;
  auto engine = Engine::Create(m.model.get(), pool->get(), m.tokenizer.get(), options);
  if (!engine.ok()) return Fail(engine.status().ToString());
  auto vocabulary = (*engine)->Vocabulary();
  if (!vocabulary.ok()) return Fail(vocabulary.status().ToString());

  std::vector<std::shared_ptr<const grammar::CompiledConstraint>> constraints;
  for (const auto& s : schemas) {
    auto gbnf = grammar::JsonSchemaTextToGbnf(s["schema"].dump());
    if (!gbnf.ok()) return Fail(absl::StrCat(s["name"].dump(), ": ", gbnf.status().ToString()));
    auto c = grammar::CompiledConstraint::Create(*gbnf, *vocabulary);
    if (!c.ok()) return Fail(absl::StrCat(s["name"].dump(), ": ", c.status().ToString()));
    constraints.push_back(*std::move(c));
  }

  std::vector<size_t> cycle;  // schema indices, each `weight` times
  for (size_t k = 0; k < schemas.size(); ++k) {
    for (int w = 0; w < schemas[k].value("weight", 1); ++w) cycle.push_back(k);
  }
  std::map<std::string, Output> outputs;
  for (int i = 0; i < requests; ++i) {
    const size_t k = cycle[i % cycle.size()];
    const std::string id = absl::StrCat("r", i);
    Output& o = outputs[id];
    o.schema = k;
    o.seed = i + 1;
    EngineRequest r;
    r.id = id;
    const std::string text = schemas[k]["prompt"].get<std::string>();
    auto prompt = schemas[k].value("chat", true)
                      ? m.tokenizer->Encode(absl::StrCat("<|im_start|>user\n", text,
                                                         "<|im_end|>\n<|im_start|>assistant\n"),
                                            /*allow_special=*/true)
                      : m.tokenizer->Encode(text);
    if (!prompt.ok()) return Fail(prompt.status().ToString());
    r.prompt = *std::move(prompt);
    r.max_tokens = schemas[k]["max_tokens"].get<int64_t>();
    r.sampling.temperature = 1.0f;
    r.sampling.seed = o.seed;
    r.constraint = constraints[k];
    r.on_event = [&o](const TokenEvent& e) {
      if (e.has_token) o.tokens.push_back(e.token);
      if (e.finish != FinishReason::kNone) {
        o.finish = e.finish;
        o.stop_token = e.stop_token;
        o.error = e.error;
      }
    };
    absl::Status submitted = (*engine)->Submit(std::move(r));
    if (!submitted.ok()) return Fail(absl::StrCat(id, ": ", submitted.ToString()));
  }
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    auto worked = (*engine)->Step();
    if (!worked.ok()) return Fail(worked.status().ToString());
    if (!*worked) break;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::ofstream out(out_path);
  int64_t tokens = 0;
  for (const auto& [id, o] : outputs) {
    std::vector<TokenId> ids = o.tokens;
    if (o.stop_token && !ids.empty()) ids.pop_back();
    tokens += o.tokens.size();
    std::string bytes;
    for (TokenId t : ids) bytes += constraints[o.schema]->vocabulary()->TokenBytes(t);
    // The check of a prefix is the byte matcher's, not the token masks that produced it.
    auto matcher = grammar::GrammarMatcher::Create(constraints[o.schema]->grammar());
    if (!matcher.ok()) return Fail(matcher.status().ToString());
    const bool prefix_ok = matcher->AdvanceBytes(bytes) == grammar::GrammarMatcher::Step::kOk;
    out << nlohmann::json{{"schema", schemas[o.schema]["name"]},
                          {"seed", o.seed},
                          {"finish", FinishReasonName(o.finish)},
                          {"error", o.error},
                          {"text_hex", Hex(bytes)},
                          {"prefix_ok", prefix_ok},
                          {"accepting", prefix_ok && matcher->Accepting()},
                          {"tokens", o.tokens.size()}}
               .dump()
        << "\n";
  }
  std::printf("%d requests, %lld tokens in %.1f s (%.0f tokens/s)\n", requests,
              static_cast<long long>(tokens), seconds, tokens / seconds);
  return out ? 0 : Fail("cannot write " + out_path);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: engine_grammar_outputs SCHEMAS.json REQUESTS OUT.jsonl\n";
    return 1;
  }
  return ferry::Run(argv[1], std::stoi(argv[2]), argv[3]);
}
