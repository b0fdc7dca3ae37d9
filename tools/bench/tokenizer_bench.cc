// The C++ half of `ferry bench tokenizer` (tokenizer_bench.sh runs it next to HF `tokenizers`):
// encode MB/s on one thread and on all threads, and decode tokens/s, with the default model's
// vocabulary (SmolLM2, 49k, from its GGUF) over a corpus of documents (a JSON array of strings).
// Prints one JSON object. Special-token strings in the corpus are recognised, as HF's
// encode_batch does, so that the token counts can be compared.
//
//   tokenizer_bench GGUF CORPUS.json

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/common/mutex_mode.h"
#include "engine/common/thread_pool.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/bench/timing.h"

using ferry::bench::BestSeconds;

int main(int argc, char** argv) {
  ferry::UseProgramMutexMode();
  if (argc != 3) {
    std::fprintf(stderr, "usage: tokenizer_bench GGUF CORPUS.json\n");
    return 2;
  }
  auto gguf = ferry::GgufFile::Open(argv[1]);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  auto loaded = ferry::Tokenizer::FromGguf(**gguf);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  ferry::Tokenizer& tokenizer = **loaded;
  std::ifstream in(argv[2]);
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<std::string> docs = nlohmann::json::parse(text.str());
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();

  std::vector<std::vector<ferry::TokenId>> ids(docs.size());
  bool ok = true;
  tokenizer.set_parallel_threshold(0);  // one thread: no segmentation
  const double one = BestSeconds(3, [&] {
    for (size_t i = 0; i < docs.size(); ++i) {
      auto r = tokenizer.Encode(docs[i], /*allow_special=*/true);
      ok = ok && r.ok();
      if (r.ok()) ids[i] = std::move(*r);
    }
  });
  ferry::ThreadPool& pool = ferry::ThreadPool::Shared();
  const double all = BestSeconds(3, [&] {
    pool.ParallelFor(docs.size(), [&](size_t i) {
      auto r = tokenizer.Encode(docs[i], /*allow_special=*/true);
      if (r.ok()) ids[i] = std::move(*r);
    });
  });
  // One large input (the corpus as one text), cut at safe boundaries and encoded on all threads.
  std::string joined;
  for (const std::string& d : docs) joined += d;
  tokenizer.set_parallel_threshold(64 * 1024);
  const double single_input =
      BestSeconds(2, [&] { ok = ok && tokenizer.Encode(joined, /*allow_special=*/true).ok(); });

  size_t tokens = 0;
  for (const auto& v : ids) tokens += v.size();
  const double decode = BestSeconds(3, [&] {
    for (const auto& v : ids) ok = ok && tokenizer.Decode(v).ok();
  });
  std::printf(
      "{\"bytes\":%zu,\"tokens\":%zu,\"threads\":%d,\"encode_mb_s_1t\":%.2f,"
      "\"encode_mb_s_all\":%.2f,\"encode_mb_s_one_input_all\":%.2f,\"decode_tok_s\":%.0f,"
      "\"ok\":%s}\n",
      bytes, tokens, pool.threads(), bytes / one / 1e6, bytes / all / 1e6,
      joined.size() / single_input / 1e6, tokens / decode, ok ? "true" : "false");
  return ok ? 0 : 1;
}
