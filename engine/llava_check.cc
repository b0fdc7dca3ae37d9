// llava_check: a LLaVA-style model end to end in-process, the C++ half of
// engine/llava_reference_test.sh (the Python half is tools/python/llava_reference.py, transformers'
// LlavaProcessor and LlavaForConditionalGeneration). Testonly.
//
//   llava_check prepare MODEL CASES.json > PREPARED.json
//   llava_check logits MODEL PREPARED.json REF_DIR --tolerance T [--chunks 1,7,64]
//   llava_check generate MODEL PREPARED.json REF.json --max-new-tokens N --margin M
//               [--prefill-chunk C]
//
// MODEL is an HF LLaVA directory (LoadLlavaModel: the text model and the vision tower, fp32
// weights and fp32 KV, the exact path). CASES.json: {"cases": [{"text": T, "images": [PATH...]}]}.
// `prepare` renders one user message (the images' parts, then the text) with the model's chat
// template, tokenizes it with the engine's tokenizer, expands each image token to the tower's
// placeholder count (ExpandImagePlaceholders) and writes {"cases": [{"prompt": RENDERED TEXT,
// "images": [...], "ids": [...], "spans": [[start, length]...]}]}; the reference checks that
// LlavaProcessor gives the same ids from the rendered text and the images.
// Each image is read as a request's would be: DecodeImage, ApplyOrientation (EXIF), Preprocess
// with the directory's preprocessor_config.json, VisionTower::Encode.
// `logits` first checks that the model's fingerprint is the text model's extended with the
// tower's digest; then it runs each prompt in one Transformer step with the images' rows as input
// embeddings and compares every row with REF_DIR/logits_{i}.f32: max|ferry - ref| / max|ref| <= T;
// with
// --chunks it also runs the longest prompt in chunks of each size (images cut across chunks) and
// requires bit-identical logits. `generate` submits every prompt at once to an Engine (images
// as EngineRequest::images, greedy, end of sequence ignored, prefill chunks of C tokens, default
// 7) and requires the reference's tokens up to the first position where the reference's top-2
// margin is below M.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/hash128.h"
#include "engine/common/model_fingerprint.h"
#include "engine/engine.h"
#include "engine/model/transformer.h"
#include "engine/model/vision/image_placeholders.h"
#include "engine/model/vision/llava_model.h"
#include "engine/model/vision/vision_config.h"
#include "engine/prompt_image.h"
#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "media/image/image.h"
#include "media/image/preprocess.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::json;

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
T OrDie(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) {
    std::cerr << what << ": " << v.status() << "\n";
    std::exit(1);
  }
  return std::move(*v);
}

int Prepare(const std::string& model, const std::string& cases_file) {
  const std::unique_ptr<Tokenizer> tokenizer =
      OrDie(Tokenizer::FromHfDirectory(model), "tokenizer");
  const std::string config_text = ReadFile(model + "/tokenizer_config.json");
  const auto chat_template = OrDie(ChatTemplate::FromTokenizerConfig(config_text), "chat template");
  const Json tc = Json::parse(config_text);
  // The tower's placeholder count and image token (the processor's patch_size and strategy).
  const VisionConfig vision = OrDie(ReadVisionConfig(model), "vision config");
  const auto image_token = static_cast<TokenId>(vision.image_token_index);
  const int64_t image_tokens = vision.num_image_tokens();
  Json out;
  out["cases"] = Json::array();
  const Json all = Json::parse(ReadFile(cases_file));
  for (const Json& c : all.at("cases")) {
    nlohmann::ordered_json content = nlohmann::ordered_json::array();
    for (size_t i = 0; i < c["images"].size(); ++i) content.push_back({{"type", "image"}});
    content.push_back({{"type", "text"}, {"text", c["text"].get<std::string>()}});
    ChatTemplateInputs inputs;
    inputs.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", content}}});
    inputs.add_generation_prompt = true;
    inputs.bos_token = tc.value("bos_token", "");
    inputs.eos_token = tc.value("eos_token", "");
    const ChatPrompt prompt = OrDie(chat_template->Apply(inputs), "chat template");
    const std::vector<TokenId> ids = OrDie(tokenizer->Encode(PromptSegments(prompt)), "encode");
    const ExpandedPrompt expanded =
        OrDie(ExpandImagePlaceholders(ids, image_token, image_tokens, c["images"].size(), 1 << 20),
              "expand");
    Json spans = Json::array();
    for (const ImagePlaceholderSpan& s : expanded.images) spans.push_back({s.start, s.length});
    out["cases"].push_back({{"prompt", prompt.text},
                            {"images", c["images"]},
                            {"ids", expanded.tokens},
                            {"spans", spans}});
  }
  std::cout << out.dump() << "\n";
  return 0;
}

struct Loaded {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<BackendKvAllocator> allocator;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<KvBlockPool> pool;
  std::unique_ptr<VisionTower> tower;
  media::PreprocessConfig preprocess;
};

Loaded Load(const std::string& dir) {
  Loaded l;
  l.backend = OrDie(CpuBackend::Create(), "backend");
  LlavaModel llava = OrDie(LoadLlavaModel(dir, WeightDType::kF32, "f32"), "load");
  const ModelConfig& c = llava.text.config;
  std::string eos;
  for (TokenId t : c.eos_token_ids) eos += " " + std::to_string(t);
  std::string windows;  // each layer's sliding window (0: full attention)
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    windows += (layer == 0 ? "" : " ") + std::to_string(c.window(layer));
  }
  std::fprintf(stderr,
               "loaded %s: text %s, %lld layers, %lld positions, rope_theta %g, eps %g, tied %d, "
               "windows [%s], eos%s; %lld image tokens; fingerprint %s\n",
               dir.c_str(), c.architecture.c_str(), static_cast<long long>(c.num_layers),
               static_cast<long long>(c.max_position_embeddings), c.rope_theta, c.rms_norm_eps,
               c.tie_word_embeddings ? 1 : 0, windows.c_str(), eos.c_str(),
               static_cast<long long>(llava.tower.num_image_tokens()),
               llava.text.fingerprint.ToHex().c_str());
  l.model = OrDie(Transformer::Create(llava.text, l.backend.get()), "model");
  l.tower = std::make_unique<VisionTower>(std::move(llava.tower));
  l.preprocess = OrDie(media::ParsePreprocessorConfig(ReadFile(dir + "/preprocessor_config.json")),
                       "preprocessor_config.json");
  l.allocator = std::make_unique<BackendKvAllocator>(l.backend.get());
  const KvBlockLayout layout = l.model->KvLayoutFor(16);
  l.pool = OrDie(KvBlockPool::Create(
                     layout, layout.BlocksFor(std::min<int64_t>(l.model->max_positions(), 1 << 14)),
                     l.allocator.get(), l.backend.get()),
                 "KV pool");
  return l;
}

struct Case {
  std::vector<TokenId> ids;
  std::vector<PromptImageInput> images;
};

// The images of each prepared case, encoded by the tower (each distinct file once).
std::vector<Case> ReadCases(Loaded& l, const std::string& prepared) {
  std::map<std::string, PromptImageInput> encoded;  // by path: hash and embeddings
  std::vector<Case> cases;
  const Json all = Json::parse(ReadFile(prepared));
  for (const Json& c : all.at("cases")) {
    Case k;
    k.ids = c["ids"].get<std::vector<TokenId>>();
    for (size_t i = 0; i < c["images"].size(); ++i) {
      const std::string path = c["images"][i].get<std::string>();
      if (encoded.count(path) == 0) {
        const std::string bytes = ReadFile(path);
        const media::ImageInfo info = OrDie(media::ProbeImage(bytes), path);
        const media::RgbImage image =
            media::ApplyOrientation(OrDie(media::DecodeImage(bytes), path), info.orientation);
        const media::PixelValues pixels = OrDie(media::Preprocess(image, l.preprocess), path);
        PromptImageInput e;
        e.content_hash = Xxh3Hash128(bytes);
        e.embeddings =
            std::make_shared<const std::vector<float>>(OrDie(l.tower->Encode(pixels.data), path));
        encoded[path] = e;
      }
      PromptImageInput image = encoded[path];
      image.placeholder_start = c["spans"][i][0].get<int64_t>();
      image.placeholder_length = c["spans"][i][1].get<int64_t>();
      k.images.push_back(image);
    }
    cases.push_back(std::move(k));
  }
  return cases;
}

// Every row's logits of `c`, in chunks of `chunk` tokens (0: one step); each chunk gets the
// image rows that fall inside it.
std::vector<float> AllLogits(Loaded& l, const Case& c, int64_t chunk) {
  const int64_t n = c.ids.size();
  const int64_t hidden = l.model->config().hidden_size;
  auto blocks = OrDie(l.pool->Allocate(l.pool->layout().BlocksFor(n)), "blocks");
  std::vector<float> logits;  // Forward appends each step's rows
  const int64_t step = chunk > 0 ? chunk : n;
  for (int64_t b = 0; b < n; b += step) {
    const int64_t len = std::min(step, n - b);
    std::vector<InputEmbeddingRows> rows;
    for (const PromptImageInput& image : c.images) {
      const int64_t from = std::max(b, image.placeholder_start);
      const int64_t to = std::min(b + len, image.placeholder_start + image.placeholder_length);
      if (from >= to) continue;
      rows.push_back({from - b, to - from,
                      image.embeddings->data() + (from - image.placeholder_start) * hidden});
    }
    ForwardSequence seq{absl::MakeConstSpan(c.ids).subspan(b, len), b, blocks, true};
    seq.input_embeddings = rows;
    if (absl::Status s = l.model->Forward({seq}, *l.pool, &logits); !s.ok()) {
      std::cerr << "forward: " << s << "\n";
      std::exit(1);
    }
  }
  (void)l.pool->Release(blocks);
  return logits;
}

int Logits(const std::string& model, const std::string& prepared, const std::string& ref_dir,
           double tolerance, const std::vector<int64_t>& chunks) {
  Loaded l = Load(model);
  // The fingerprint covers the tower: the text model's, extended with the tower's digest.
  const Hash128 text = OrDie(LoadHfModel(model, WeightDType::kF32, "f32"), "load").fingerprint;
  const bool extended = l.model->fingerprint() == ExtendModelFingerprint(text, l.tower->digest()) &&
                        l.model->fingerprint() != text;
  std::printf("fingerprint %s = ExtendModelFingerprint(text model's %s, tower digest %s): %s\n",
              l.model->fingerprint().ToHex().c_str(), text.ToHex().c_str(),
              l.tower->digest().ToHex().c_str(), extended ? "yes" : "NO");
  if (!extended) return 1;
  const std::vector<Case> cases = ReadCases(l, prepared);
  const int64_t vocab = l.model->config().vocab_size;
  double worst = 0;
  int failures = 0;
  size_t rows = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string ref_bytes = ReadFile(ref_dir + "/logits_" + std::to_string(i) + ".f32");
    const size_t n = cases[i].ids.size();
    if (ref_bytes.size() != n * vocab * 4) {
      std::cerr << "reference " << i << " has " << ref_bytes.size() << " bytes, expected "
                << n * vocab * 4 << "\n";
      return 1;
    }
    const float* ref = reinterpret_cast<const float*>(ref_bytes.data());
    const std::vector<float> got = AllLogits(l, cases[i], 0);
    double prompt_worst = 0, image_rows_worst = 0;
    for (size_t r = 0; r < n; ++r) {
      double max_ref = 0, max_diff = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        max_ref = std::max(max_ref, std::fabs(double{ref[r * vocab + v]}));
        max_diff = std::max(max_diff, std::fabs(double{got[r * vocab + v]} - ref[r * vocab + v]));
      }
      const double rel = max_diff / max_ref;
      prompt_worst = std::max(prompt_worst, rel);
      for (const PromptImageInput& image : cases[i].images) {
        if (static_cast<int64_t>(r) >= image.placeholder_start &&
            static_cast<int64_t>(r) < image.placeholder_start + image.placeholder_length) {
          image_rows_worst = std::max(image_rows_worst, rel);
        }
      }
      if (!(rel <= tolerance)) ++failures;
      ++rows;
    }
    worst = std::max(worst, prompt_worst);
    std::printf("prompt %2zu: %zu image(s), %3zu tokens, max rel err %.3g (image rows %.3g)%s\n", i,
                cases[i].images.size(), n, prompt_worst, image_rows_worst,
                prompt_worst <= tolerance ? "" : "  (above tolerance)");
  }
  std::printf("%zu prompts, %zu rows: worst max|ferry-ref|/max|ref| = %.3g (tolerance %.3g)\n",
              cases.size(), rows, worst, tolerance);
  if (!chunks.empty()) {
    size_t longest = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].ids.size() > cases[longest].ids.size()) longest = i;
    }
    const std::vector<float> whole = AllLogits(l, cases[longest], 0);
    for (int64_t chunk : chunks) {
      const std::vector<float> chunked = AllLogits(l, cases[longest], chunk);
      const bool same = chunked.size() == whole.size() &&
                        std::memcmp(chunked.data(), whole.data(), whole.size() * 4) == 0;
      double diff = chunked.size() == whole.size() ? 0 : INFINITY;
      for (size_t k = 0; k < whole.size() && k < chunked.size(); ++k) {
        diff = std::max(diff, std::fabs(double{chunked[k]} - whole[k]));
      }
      if (!same)
        std::printf("  chunked logits: %zu floats, whole %zu, max diff %.3g\n", chunked.size(),
                    whole.size(), diff);
      std::printf("prompt %zu (%zu tokens, %zu images) in chunks of %ld: %s\n", longest,
                  cases[longest].ids.size(), cases[longest].images.size(), static_cast<long>(chunk),
                  same ? "bit-identical logits" : "DIFFERENT logits");
      if (!same) ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

int Generate(const std::string& model, const std::string& prepared, const std::string& ref_file,
             int64_t max_new, double margin, int64_t prefill_chunk) {
  Loaded l = Load(model);
  const std::vector<Case> cases = ReadCases(l, prepared);
  const Json ref = Json::parse(ReadFile(ref_file)).at("results");
  if (ref.size() != cases.size()) {
    std::cerr << "the reference has " << ref.size() << " results for " << cases.size()
              << " cases\n";
    return 1;
  }
  EngineOptions options;
  options.prefill_chunk = prefill_chunk;
  auto engine = OrDie(Engine::Create(l.model.get(), l.pool.get(), nullptr, options), "engine");
  std::vector<std::vector<TokenId>> got(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EngineRequest r;
    r.id = std::to_string(i);
    r.prompt = cases[i].ids;
    r.images = cases[i].images;
    r.sampling.temperature = 0;
    r.max_tokens = max_new;
    r.ignore_eos = true;
    r.on_event = [&got, i](const TokenEvent& e) {
      if (e.has_token) got[i].push_back(e.token);
    };
    if (absl::Status s = engine->Submit(std::move(r)); !s.ok()) {
      std::cerr << "submit " << i << ": " << s << "\n";
      return 1;
    }
  }
  for (;;) {
    const bool worked = OrDie(engine->Step(), "step");
    if (!worked) break;
  }
  int failures = 0;
  int64_t compared = 0, cut = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto want = ref[i]["tokens"].get<std::vector<TokenId>>();
    const auto margins = ref[i]["margins"].get<std::vector<double>>();
    // Up to the first near-tie, where either token may be chosen.
    size_t need = 0;
    while (need < want.size() && need < margins.size() && margins[need] >= margin) ++need;
    size_t same = 0;
    while (same < want.size() && same < got[i].size() && got[i][same] == want[same]) ++same;
    const bool ok = got[i].size() == static_cast<size_t>(max_new) && same >= need;
    compared += need;
    if (need < want.size()) ++cut;
    std::printf(
        "prompt %2zu: %zu image(s), %3zu tokens: %zu of %zu greedy tokens the same "
        "(%zu before a reference margin < %.0e)%s\n",
        i, cases[i].images.size(), cases[i].ids.size(), same, want.size(), need, margin,
        ok ? "" : "  MISMATCH");
    if (!ok) ++failures;
  }
  std::printf("%zu prompts: %lld tokens compared, %lld prompts cut at a near-tie; %s\n",
              cases.size(), static_cast<long long>(compared), static_cast<long long>(cut),
              failures == 0 ? "all identical" : "MISMATCHES");
  return failures == 0 ? 0 : 1;
}

double Flag(int argc, char** argv, const std::string& name, double fallback) {
  for (int i = 0; i + 1 < argc; ++i) {
    double v;
    if (argv[i] == name && absl::SimpleAtod(argv[i + 1], &v)) return v;
  }
  return fallback;
}

std::vector<int64_t> ChunksFlag(int argc, char** argv) {
  std::vector<int64_t> chunks;
  for (int i = 0; i + 1 < argc; ++i) {
    if (std::string(argv[i]) != "--chunks") continue;
    for (absl::string_view s : absl::StrSplit(argv[i + 1], ',')) {
      int64_t v;
      if (absl::SimpleAtoi(s, &v) && v > 0) chunks.push_back(v);
    }
  }
  return chunks;
}

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "prepare" && argc >= 4) return Prepare(argv[2], argv[3]);
  if (mode == "logits" && argc >= 5) {
    return Logits(argv[2], argv[3], argv[4], Flag(argc, argv, "--tolerance", 1e-4),
                  ChunksFlag(argc, argv));
  }
  if (mode == "generate" && argc >= 5) {
    return Generate(argv[2], argv[3], argv[4],
                    static_cast<int64_t>(Flag(argc, argv, "--max-new-tokens", 20)),
                    Flag(argc, argv, "--margin", 1e-4),
                    static_cast<int64_t>(Flag(argc, argv, "--prefill-chunk", 7)));
  }
  std::cerr << "usage: llava_check prepare MODEL CASES.json | logits MODEL PREPARED.json REF_DIR "
               "--tolerance T [--chunks 1,7,64] | generate MODEL PREPARED.json REF.json "
               "--max-new-tokens N --margin M [--prefill-chunk C]\n";
  return 2;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
