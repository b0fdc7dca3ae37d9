// forward_check: the C++ half of the forward-pass reference tests (forward_reference_test.sh,
// generation_reference_test.sh). The Python half is tools/python/forward_reference.py.
//
//   forward_check prompts MODEL PROMPTS.txt          > cases.json   (Ferry's tokenizer, plain text)
//   forward_check chat MODEL PROMPTS.txt             > cases.json   (one user message each, the
//                                                                    model's chat template)
//   forward_check logits MODEL CASES.json REF_DIR --weights f32|bf16 --kv f32|bf16
//                 --tolerance T [--outliers FRACTION:BOUND] [--chunks 1,7,64]
//   forward_check dump MODEL CASES.json OUT_DIR --weights f32|bf16|native --kv f32|bf16
//                 (Ferry's logits in REF_DIR's layout: a reference for another configuration)
//   forward_check greedy MODEL CASES.json OUT.json --max-new-tokens N --weights W --kv KV
//                 (Ferry's greedy tokens and top-2 margins, as llamacpp_reference.py writes them)
//   forward_check generate MODEL CASES.json REF.json --max-new-tokens N --margin M
//                 [--weights f32|bf16|native] [--kv f32|bf16] [--both-margins]
//
// MODEL is an HF directory or a GGUF file. In PROMPTS.txt each line is a prompt, with \n and \t
// escapes. `logits` runs every prompt in one step and compares each row of logits with the
// reference (REF_DIR/logits_{i}.f32): max|ferry - ref| / max|ref| <= T, except that with
// --outliers up to FRACTION of the rows may exceed T if none exceeds BOUND (bf16 activations: a
// last-bit difference upstream can flip one bf16 rounding, which moves a few rows by ~1e-3);
// with --chunks it also
// runs the longest prompt in chunks of each size and requires bit-identical logits. `generate`
// decodes greedily and requires the reference's tokens up to the first position where the
// reference's top-2 margin is below M (with --both-margins: where either's is).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/generate.h"
#include "engine/model/host_weights.h"
#include "engine/model/transformer.h"
#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

bool IsGguf(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot read " << path << "\n";
    std::exit(2);
  }
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::cerr << what << ": " << v.status() << "\n";
    std::exit(1);
  }
  return std::move(*v);
}

std::vector<std::string> ReadPrompts(const std::string& path) {
  std::vector<std::string> prompts;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n')) {
    if (line.empty()) continue;
    std::string p;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == 'n' || line[i + 1] == 't')) {
        p += line[++i] == 'n' ? '\n' : '\t';
      } else {
        p += line[i];
      }
    }
    prompts.push_back(p);
  }
  return prompts;
}

int Tokenize(const std::string& model, const std::string& prompts_file, bool chat) {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  std::string bos, eos;
  if (IsGguf(model)) {
    auto gguf = OrDie(GgufFile::Open(model), "open");
    tokenizer = OrDie(Tokenizer::FromGguf(*gguf), "tokenizer");
    if (chat) chat_template = OrDie(ChatTemplate::FromGguf(*gguf), "chat template");
  } else {
    tokenizer = OrDie(Tokenizer::FromHfDirectory(model), "tokenizer");
    if (chat) {
      const std::string config = ReadFile(model + "/tokenizer_config.json");
      chat_template = OrDie(ChatTemplate::FromTokenizerConfig(config), "chat template");
      const auto j = nlohmann::json::parse(config);
      bos = j.value("bos_token", "");
      eos = j.value("eos_token", "");
    }
  }
  nlohmann::json out;
  out["prompts"] = nlohmann::json::array();
  for (const std::string& p : ReadPrompts(prompts_file)) {
    std::vector<TokenId> ids;
    if (chat) {
      ChatTemplateInputs inputs;
      inputs.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", p}}});
      inputs.add_generation_prompt = true;
      inputs.bos_token = bos;
      inputs.eos_token = eos;
      const ChatPrompt prompt = OrDie(chat_template->Apply(inputs), "chat template");
      ids = OrDie(tokenizer->Encode(PromptSegments(prompt)), "encode");
    } else {
      ids = OrDie(tokenizer->Encode(p), "encode");
    }
    out["prompts"].push_back(ids);
  }
  std::cout << out.dump() << "\n";
  return 0;
}

struct Loaded {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<BackendKvAllocator> allocator;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<KvBlockPool> pool;
};

Loaded Load(const std::string& path, WeightDType weights, const std::string& kv) {
  Loaded l;
  l.backend = OrDie(CpuBackend::Create(), "backend");
  HostWeights host;
  if (IsGguf(path)) {
    auto gguf = OrDie(GgufFile::Open(path), "open");
    host = OrDie(LoadGgufModel(*gguf, weights, kv), "load");
  } else {
    host = OrDie(LoadHfModel(path, weights, kv), "load");
  }
  std::fprintf(stderr, "loaded %s: %.1f MB in %.2f s (%.2f GiB/s of model files) on %s\n",
               path.c_str(), host.source_bytes / 1e6, host.load_seconds,
               host.source_bytes / host.load_seconds / (1 << 30), l.backend->name().c_str());
  l.model = OrDie(Transformer::Create(host, l.backend.get()), "model");
  l.allocator = std::make_unique<BackendKvAllocator>(l.backend.get());
  const KvBlockLayout layout = l.model->KvLayoutFor(64);
  l.pool = OrDie(KvBlockPool::Create(layout, layout.BlocksFor(l.model->max_positions()),
                                     l.allocator.get(), l.backend.get()),
                 "KV pool");
  return l;
}

std::vector<std::vector<TokenId>> ReadCases(const std::string& path) {
  const auto j = nlohmann::json::parse(ReadFile(path));
  return j["prompts"].get<std::vector<std::vector<TokenId>>>();
}

std::vector<float> AllLogits(Loaded& l, const std::vector<TokenId>& prompt, int64_t chunk) {
  const int64_t n = prompt.size();
  auto blocks = OrDie(l.pool->Allocate(l.pool->layout().BlocksFor(n)), "blocks");
  std::vector<float> logits;
  const int64_t step = chunk > 0 ? chunk : n;
  for (int64_t b = 0; b < n; b += step) {
    const ForwardSequence seq{absl::MakeConstSpan(prompt).subspan(b, std::min(step, n - b)), b,
                              blocks, true};
    if (absl::Status s = l.model->Forward({seq}, *l.pool, &logits); !s.ok()) {
      std::cerr << "forward: " << s << "\n";
      std::exit(1);
    }
  }
  (void)l.pool->Release(blocks);
  return logits;
}

int Dump(const std::string& model, const std::string& cases_file, const std::string& out_dir,
         WeightDType weights, const std::string& kv) {
  Loaded l = Load(model, weights, kv);
  const auto cases = ReadCases(cases_file);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<float> logits = AllLogits(l, cases[i], 0);
    std::ofstream out(out_dir + "/logits_" + std::to_string(i) + ".f32", std::ios::binary);
    out.write(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
    if (!out) {
      std::cerr << "cannot write " << out_dir << "\n";
      return 1;
    }
  }
  return 0;
}

int Logits(const std::string& model, const std::string& cases_file, const std::string& ref_dir,
           WeightDType weights, const std::string& kv, double tolerance, double outlier_fraction,
           double outlier_bound, const std::vector<int64_t>& chunks) {
  Loaded l = Load(model, weights, kv);
  const auto cases = ReadCases(cases_file);
  const int64_t vocab = l.model->config().vocab_size;
  double worst = 0;
  int failures = 0;
  size_t rows = 0, outliers = 0;
  double seconds = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string ref_bytes = ReadFile(ref_dir + "/logits_" + std::to_string(i) + ".f32");
    if (ref_bytes.size() != cases[i].size() * vocab * 4) {
      std::cerr << "reference " << i << " has " << ref_bytes.size() << " bytes, expected "
                << cases[i].size() * vocab * 4 << "\n";
      return 1;
    }
    const float* ref = reinterpret_cast<const float*>(ref_bytes.data());
    const auto start = std::chrono::steady_clock::now();
    const std::vector<float> got = AllLogits(l, cases[i], 0);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double prompt_worst = 0;
    for (size_t r = 0; r < cases[i].size(); ++r) {
      double max_ref = 0, max_diff = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        max_ref = std::max(max_ref, std::fabs(double{ref[r * vocab + v]}));
        max_diff = std::max(max_diff, std::fabs(double{got[r * vocab + v]} - ref[r * vocab + v]));
      }
      const double rel = max_diff / max_ref;
      prompt_worst = std::max(prompt_worst, rel);
      if (!(rel <= tolerance)) ++outliers;
      if (!(rel <= std::max(tolerance, outlier_bound))) ++failures;
      ++rows;
    }
    worst = std::max(worst, prompt_worst);
    std::printf("prompt %2zu: %3zu tokens, max rel err %.3g%s\n", i, cases[i].size(), prompt_worst,
                prompt_worst <= tolerance ? "" : "  (above tolerance)");
  }
  if (outliers > outlier_fraction * rows) ++failures;
  std::printf(
      "%zu prompts, %zu rows: worst max|ferry-ref|/max|ref| = %.3g (tolerance %.3g); "
      "%zu rows above it (%.2f%%, allowed %.2f%% up to %.3g); %.1f prompt tokens/s\n",
      cases.size(), rows, worst, tolerance, outliers, 100.0 * outliers / rows,
      100.0 * outlier_fraction, outlier_bound, rows / seconds);
  if (!chunks.empty()) {
    size_t longest = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].size() > cases[longest].size()) longest = i;
    }
    const std::vector<float> whole = AllLogits(l, cases[longest], 0);
    for (int64_t chunk : chunks) {
      const std::vector<float> chunked = AllLogits(l, cases[longest], chunk);
      const bool same = chunked.size() == whole.size() &&
                        std::memcmp(chunked.data(), whole.data(), whole.size() * 4) == 0;
      std::printf("prompt %zu (%zu tokens) in chunks of %ld: %s\n", longest, cases[longest].size(),
                  static_cast<long>(chunk), same ? "bit-identical logits" : "DIFFERENT logits");
      if (!same) ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

// Top-1 minus top-2 of a row of logits.
double TopTwoMargin(const std::vector<float>& row) {
  double first = -INFINITY, second = -INFINITY;
  for (float v : row) {
    if (v > first) {
      second = first;
      first = v;
    } else if (v > second) {
      second = v;
    }
  }
  return first - second;
}

int Greedy(const std::string& model, const std::string& cases_file, const std::string& out_file,
           int64_t max_new, WeightDType weights, const std::string& kv) {
  Loaded l = Load(model, weights, kv);
  nlohmann::json results = nlohmann::json::array();
  for (const auto& prompt : ReadCases(cases_file)) {
    GenerateOptions options;
    options.max_new_tokens = max_new;
    options.keep_logits = true;
    const GenerateResult got = OrDie(Generate(*l.model, *l.pool, prompt, options), "generate");
    std::vector<double> margins;
    for (const auto& row : got.logits) margins.push_back(TopTwoMargin(row));
    results.push_back({{"tokens", got.tokens}, {"margins", margins}});
  }
  std::ofstream out(out_file);
  out << nlohmann::json{{"results", results}}.dump() << "\n";
  return out ? 0 : 1;
}

int Generation(const std::string& model, const std::string& cases_file, const std::string& ref_file,
               int64_t max_new, double margin, WeightDType weights, const std::string& kv,
               bool both_margins) {
  Loaded l = Load(model, weights, kv);
  const auto cases = ReadCases(cases_file);
  const auto ref = nlohmann::json::parse(ReadFile(ref_file))["results"];
  // A hybrid model also generates with its sliding-window layers in a pool of their own, in
  // 4-token blocks and prefill chunks so that the window slides often: the same tokens.
  std::unique_ptr<KvBlockPool> full_pool, window_pool;
  if (l.model->FullKvLayoutFor(4).num_layers > 0) {
    const KvBlockLayout full = l.model->FullKvLayoutFor(4);
    full_pool = OrDie(KvBlockPool::Create(full, full.BlocksFor(l.model->max_positions()),
                                          l.allocator.get(), l.backend.get()),
                      "KV pool");
    window_pool = OrDie(
        KvBlockPool::Create(l.model->WindowKvLayoutFor(4), 64, l.allocator.get(), l.backend.get()),
        "window pool");
  }
  int failures = 0;
  int64_t compared = 0, cut = 0;
  double decode_seconds = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    GenerateOptions options;
    options.max_new_tokens = max_new;
    options.keep_logits = both_margins;
    const GenerateResult got = OrDie(Generate(*l.model, *l.pool, cases[i], options), "generate");
    decode_seconds += got.decode_seconds;
    if (window_pool != nullptr) {
      GenerateOptions chunked = options;
      chunked.prefill_chunk = 4;
      const GenerateResult split =
          OrDie(Generate(*l.model, *full_pool, cases[i], chunked, window_pool.get()), "generate");
      const bool same = split.tokens == got.tokens;
      std::printf("prompt %2zu with a window pool: %s tokens, at most %ld window blocks held\n", i,
                  same ? "the same" : "DIFFERENT", static_cast<long>(split.window_blocks_peak));
      if (!same) ++failures;
    }
    const auto want = ref[i]["tokens"].get<std::vector<TokenId>>();
    const auto margins = ref[i]["margins"].get<std::vector<double>>();
    int64_t limit = max_new;
    for (int64_t t = 0; t < max_new; ++t) {
      const bool close =
          margins[t] < margin || (both_margins && t < static_cast<int64_t>(got.logits.size()) &&
                                  TopTwoMargin(got.logits[t]) < margin);
      if (close) {
        limit = t;
        break;
      }
    }
    int64_t first_diff = -1;
    for (int64_t t = 0; t < limit; ++t) {
      if (got.tokens[t] != want[t]) {
        first_diff = t;
        break;
      }
    }
    compared += limit;
    cut += max_new - limit;
    std::printf(
        "prompt %2zu: %3zu prompt tokens, %ld of %ld tokens compared%s\n", i, cases[i].size(),
        static_cast<long>(limit), static_cast<long>(max_new),
        first_diff < 0 ? ", identical" : (", DIFFERENT at " + std::to_string(first_diff)).c_str());
    if (first_diff >= 0) ++failures;
  }
  std::printf(
      "%zu prompts: %ld generated tokens compared with the reference's greedy decoding, %ld cut by "
      "a top-2 margin below %.3g; decode %.1f tokens/s\n",
      cases.size(), static_cast<long>(compared), static_cast<long>(cut), margin,
      cases.size() * max_new / decode_seconds);
  return failures == 0 ? 0 : 1;
}

std::string Flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  return fallback;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  const std::string cmd = argc > 1 ? argv[1] : "";
  if ((cmd == "prompts" || cmd == "chat") && argc == 4)
    return Tokenize(argv[2], argv[3], cmd == "chat");
  if (cmd == "logits" && argc >= 5) {
    const auto parsed = ParseWeightDType(Flag(argc, argv, "--weights", "f32"));
    if (!parsed.ok()) {
      std::cerr << parsed.status() << "\n";
      return 2;
    }
    const WeightDType w = *parsed;
    double tolerance = 0;
    if (!absl::SimpleAtod(Flag(argc, argv, "--tolerance", "1e-4"), &tolerance)) return 2;
    std::vector<int64_t> chunks;
    for (absl::string_view c :
         absl::StrSplit(Flag(argc, argv, "--chunks", ""), ',', absl::SkipEmpty())) {
      int64_t n;
      if (!absl::SimpleAtoi(c, &n) || n < 1) return 2;
      chunks.push_back(n);
    }
    double fraction = 0, bound = 0;
    const std::string outliers = Flag(argc, argv, "--outliers", "0:0");
    const std::vector<std::string> parts = absl::StrSplit(outliers, ':');
    if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &fraction) ||
        !absl::SimpleAtod(parts[1], &bound)) {
      return 2;
    }
    return Logits(argv[2], argv[3], argv[4], w, Flag(argc, argv, "--kv", "f32"), tolerance,
                  fraction, bound, chunks);
  }
  if (cmd == "dump" && argc >= 5) {
    const auto weights = ParseWeightDType(Flag(argc, argv, "--weights", "f32"));
    if (!weights.ok()) {
      std::cerr << weights.status() << "\n";
      return 2;
    }
    return Dump(argv[2], argv[3], argv[4], *weights, Flag(argc, argv, "--kv", "f32"));
  }
  if (cmd == "greedy" && argc >= 5) {
    const auto weights = ParseWeightDType(Flag(argc, argv, "--weights", "f32"));
    int64_t n = 0;
    if (!weights.ok() || !absl::SimpleAtoi(Flag(argc, argv, "--max-new-tokens", "16"), &n)) {
      return 2;
    }
    return Greedy(argv[2], argv[3], argv[4], n, *weights, Flag(argc, argv, "--kv", "f32"));
  }
  if (cmd == "generate" && argc >= 5) {
    int64_t n = 0;
    double margin = 0;
    if (!absl::SimpleAtoi(Flag(argc, argv, "--max-new-tokens", "16"), &n) ||
        !absl::SimpleAtod(Flag(argc, argv, "--margin", "1e-3"), &margin)) {
      return 2;
    }
    const auto weights = ParseWeightDType(Flag(argc, argv, "--weights", "f32"));
    if (!weights.ok()) {
      std::cerr << weights.status() << "\n";
      return 2;
    }
    bool both = false;
    for (int i = 5; i < argc; ++i) both = both || std::string(argv[i]) == "--both-margins";
    return Generation(argv[2], argv[3], argv[4], n, margin, *weights,
                      Flag(argc, argv, "--kv", "f32"), both);
  }
  std::cerr << "usage: see the top of engine/model/forward_check.cc\n";
  return 2;
}
