// ferry bench swa [--prompts N] [--prompt_tokens T] [--window W] [--replay R] [--tokens K]
//                 [--threads N]: what a bounded window replay (engine.h "SWA replay") gives up
// against the exact one, on a trained model. SmolLM2-135M bf16 (FERRY_MODEL_GGUF) with a
// sliding window of W (128) imposed on its even layers (15 of 30, as gpt-oss alternates windows
// of 128 with full layers: a hybrid SmolLM2 was not trained as, but the same one for both modes),
// the window layers in a pool of their own; N (100) prompts of T (2,048) tokens cut from the
// license texts in /usr/share/common-licenses, K (32) greedy tokens each.
//
// Per prompt, on two engines in the same state (one exact, one bounded to R = 128 positions): a
// first request leaves the prompt's full blocks cached, the window cache expires (a fake clock
// moved past its TTL), then the prompt again, whose cached prefix is replayed: exactly (15 x 127
// positions) or bounded. Reported: the bounded answers' tokens equal to the exact ones (position
// by position), the prompts answered identically, the mean run of agreeing tokens before the
// first difference, the positions each mode replayed, and each one's time to the first token
// against the prompt computed uncached (the first request's, in the same run). The exact answers
// are also checked against the uncached first token. A table, then one JSON line.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/fake_clock.h"
#include "engine/engine.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/host_weights.h"
#include "engine/model/transformer.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "swa_bench: %s\n", message.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Fail(absl::StrCat(what, ": ", v.status().message()));
  return *std::move(v);
}

struct Flags {
  int prompts = 100;
  int prompt_tokens = 2048;
  int window = 128;
  int replay = 128;
  int tokens = 32;
  int threads = 0;
};

// One engine over the shared model, with its own pools and clock, stepped by the caller.
class Runner {
 public:
  Runner(Transformer* model, Backend* backend, FakeClock* clock, bool bounded, int replay,
         int prompt_tokens, int tokens) {
    allocator_ = std::make_unique<BackendKvAllocator>(backend);
    const int64_t blocks = (prompt_tokens + tokens) / 64 + 4;
    pool_ = OrDie(
        KvBlockPool::Create(model->FullKvLayoutFor(64), blocks, allocator_.get(), backend), "pool");
    window_pool_ =
        OrDie(KvBlockPool::Create(model->WindowKvLayoutFor(64), blocks, allocator_.get(), backend),
              "window pool");
    EngineOptions o;
    o.clock = clock;
    o.swa_replay = bounded ? EngineOptions::SwaReplay::kBounded : EngineOptions::SwaReplay::kExact;
    o.swa_replay_tokens = replay;
    engine_ = OrDie(Engine::Create(model, pool_.get(), nullptr, o, window_pool_.get()), "engine");
  }

  struct Result {
    std::vector<TokenId> tokens;
    int64_t cached = 0, replayed = 0;
    double ttft = 0;  // seconds to the first token
  };

  Result Run(const std::string& id, const std::vector<TokenId>& prompt, int max_tokens) {
    Result r;
    EngineRequest req;
    req.id = id;
    req.prompt = prompt;
    req.max_tokens = max_tokens;
    req.ignore_eos = true;
    req.sampling.temperature = 0;
    const auto start = Clock::now();
    req.on_event = [&](const TokenEvent& e) {
      if (e.has_token && r.tokens.empty()) {
        r.ttft = std::chrono::duration<double>(Clock::now() - start).count();
      }
      if (e.has_token) r.tokens.push_back(e.token);
      r.cached = e.cached_tokens;
      r.replayed = e.replayed_tokens;
    };
    if (absl::Status s = engine_->Submit(std::move(req)); !s.ok()) Fail(s.ToString());
    Drain();
    return r;
  }

  void Drain() {
    while (true) {
      auto worked = engine_->Step();
      if (!worked.ok()) Fail(worked.status().ToString());
      if (!*worked) return;
    }
  }

  void Clear() {
    engine_->ClearPrefixCache();
    Drain();
  }

 private:
  std::unique_ptr<BackendKvAllocator> allocator_;
  std::unique_ptr<KvBlockPool> pool_, window_pool_;
  std::unique_ptr<Engine> engine_;
};

// The license texts of this machine, as one string.
std::string Corpus() {
  std::string all;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    all += text.str();
    all += "\n\n";
  }
  return all;
}

int Main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    int* target = arg == "--prompts"         ? &flags.prompts
                  : arg == "--prompt_tokens" ? &flags.prompt_tokens
                  : arg == "--window"        ? &flags.window
                  : arg == "--replay"        ? &flags.replay
                  : arg == "--tokens"        ? &flags.tokens
                  : arg == "--threads"       ? &flags.threads
                                             : nullptr;
    if (target == nullptr || i + 1 >= argc || !absl::SimpleAtoi(argv[i + 1], target) ||
        *target < 0) {
      Fail("unknown or bad argument " + arg +
           " (--prompts, --prompt_tokens, --window, --replay, --tokens, --threads N)");
    }
    ++i;
  }
  if (flags.threads == 0)
    flags.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const char* path = std::getenv("FERRY_MODEL_GGUF");
  if (path == nullptr) Fail("FERRY_MODEL_GGUF is not set; run ./ferry bench swa");
  auto gguf = OrDie(GgufFile::Open(path), "open the model");
  auto tokenizer = OrDie(Tokenizer::FromGguf(*gguf), "tokenizer");
  HostWeights host = OrDie(LoadGgufModel(*gguf, WeightDType::kBF16, "bf16"), "load the model");
  for (int64_t l = 0; l < host.config.num_layers; ++l) {
    host.config.sliding_windows.push_back(l % 2 == 0 ? flags.window : 0);
  }
  CpuBackendOptions options;
  options.threads = flags.threads;
  auto backend = OrDie(CpuBackend::Create(options), "backend");
  auto model = OrDie(Transformer::Create(host, backend.get()), "model");
  host = HostWeights();

  const std::vector<TokenId> corpus = OrDie(tokenizer->Encode(Corpus()), "tokenize the corpus");
  if (static_cast<int>(corpus.size()) < flags.prompt_tokens) Fail("the corpus is too short");
  const int64_t room = static_cast<int64_t>(corpus.size()) - flags.prompt_tokens;
  std::fprintf(stderr,
               "swa: SmolLM2 with windows of %d on its even layers (exact replay %lld positions), "
               "%d prompts of %d tokens from %zu corpus tokens, bounded to %d\n",
               flags.window, static_cast<long long>(model->exact_replay_tokens()), flags.prompts,
               flags.prompt_tokens, corpus.size(), flags.replay);

  FakeClock clock;
  Runner exact(model.get(), backend.get(), &clock, false, flags.replay, flags.prompt_tokens,
               flags.tokens);
  Runner bounded(model.get(), backend.get(), &clock, true, flags.replay, flags.prompt_tokens,
                 flags.tokens);
  int64_t same = 0, total = 0, identical = 0, agree_run = 0;
  int64_t exact_replayed = 0, bounded_replayed = 0, first_token_mismatch = 0;
  double uncached_seconds = 0, exact_seconds = 0, bounded_seconds = 0;
  for (int i = 0; i < flags.prompts; ++i) {
    const int64_t at = flags.prompts > 1 ? room * i / (flags.prompts - 1) : 0;
    const std::vector<TokenId> prompt(corpus.begin() + at,
                                      corpus.begin() + at + flags.prompt_tokens);
    const std::string id = absl::StrCat("p", i);
    // The first requests: the prompt computed, its blocks cached; the first token uncached.
    const Runner::Result first = exact.Run(id + "-first", prompt, 1);
    bounded.Run(id + "-first", prompt, 1);
    uncached_seconds += first.ttft;
    clock.Advance(absl::Seconds(181));  // past the window cache's TTL
    const Runner::Result e = exact.Run(id, prompt, flags.tokens);
    const Runner::Result b = bounded.Run(id, prompt, flags.tokens);
    if (e.tokens.empty() || b.tokens.empty()) Fail("a request produced no token");
    if (e.tokens[0] != first.tokens[0]) ++first_token_mismatch;
    exact_replayed += e.replayed;
    bounded_replayed += b.replayed;
    exact_seconds += e.ttft;
    bounded_seconds += b.ttft;
    size_t run = 0;
    while (run < e.tokens.size() && run < b.tokens.size() && e.tokens[run] == b.tokens[run]) ++run;
    agree_run += static_cast<int64_t>(run);
    for (size_t t = 0; t < std::min(e.tokens.size(), b.tokens.size()); ++t) {
      same += e.tokens[t] == b.tokens[t];
    }
    total += static_cast<int64_t>(e.tokens.size());
    identical += e.tokens == b.tokens;
    exact.Clear();
    bounded.Clear();
    if ((i + 1) % 10 == 0) std::fprintf(stderr, "swa: %d prompts\n", i + 1);
  }
  if (first_token_mismatch > 0) {
    Fail(absl::StrCat(first_token_mismatch, " exact replays changed the first token"));
  }
  const double n = flags.prompts;
  std::printf(
      "\nswa bench: SmolLM2 bf16 with a sliding window of %d on its 15 even layers, %d "
      "prompts of %d tokens (license texts), %d greedy tokens each\n",
      flags.window, flags.prompts, flags.prompt_tokens, flags.tokens);
  std::printf("%-10s %16s %14s %16s\n", "replay", "positions/prompt", "TTFT ms",
              "uncached TTFT ms");
  std::printf("%-10s %16.0f %14.1f %16.1f\n", "exact", exact_replayed / n, exact_seconds / n * 1e3,
              uncached_seconds / n * 1e3);
  std::printf("%-10s %16.0f %14.1f %16.1f\n", "bounded", bounded_replayed / n,
              bounded_seconds / n * 1e3, uncached_seconds / n * 1e3);
  std::printf(
      "bounded vs exact: %lld of %lld tokens agree (%.1f%%), %lld of %d answers identical, "
      "%.1f tokens agree before the first difference on average\n",
      static_cast<long long>(same), static_cast<long long>(total), 100.0 * same / total,
      static_cast<long long>(identical), flags.prompts, agree_run / n);
  const nlohmann::json json = {{"bench", "swa"},
                               {"prompts", flags.prompts},
                               {"prompt_tokens", flags.prompt_tokens},
                               {"window", flags.window},
                               {"replay_tokens", flags.replay},
                               {"exact_replayed_per_prompt", exact_replayed / n},
                               {"bounded_replayed_per_prompt", bounded_replayed / n},
                               {"token_agreement", static_cast<double>(same) / total},
                               {"identical_answers", identical},
                               {"mean_agreeing_prefix", agree_run / n},
                               {"uncached_ttft_ms", uncached_seconds / n * 1e3},
                               {"exact_ttft_ms", exact_seconds / n * 1e3},
                               {"bounded_ttft_ms", bounded_seconds / n * 1e3}};
  std::printf("%s\n", json.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
