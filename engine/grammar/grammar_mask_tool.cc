// grammar_mask_tool: Ferry's token masks over a GGUF model's vocabulary, for the differential
// against llguidance (grammar_reference_test.sh) and for timing.
//
//   grammar_mask_tool masks GGUF CASES.json
//     CASES.json: {"stop_ids": [ids], "cases": [{"name", "grammar" (GBNF),
//                  "sequences": [[token ids], ...]}]}
//     Prints one JSON line per prefix of each sequence: {"case", "seq", "k", "accepting",
//     "mask" (hex of the little-endian 32-bit words)}, then {"case", "seq", "consumed"}: the
//     number of tokens accepted before the first refused one (or all). A grammar that does not
//     compile prints {"case", "error"}. Each mask is checked against the exact trie walk's
//     (ComputeMaskByWalk).
//   grammar_mask_tool masks-bin GGUF CASES.json MASKS.bin
//     The same for many grammars (the schema differential): no walk, and each distinct mask is
//     written once to MASKS.bin (raw little-endian words, MaskWords(vocab) each, in order of first
//     use); the JSON lines carry "mask_id" (its index there) instead of "mask".
//   grammar_mask_tool bench GGUF GRAMMAR.gbnf TOKENS.json REPEAT [TIMES_OUT]
//     Times ComputeMask after every prefix of each token sequence in TOKENS.json ([[ids], ...]),
//     REPEAT times with one shared MaskCache: the first pass is cold (cache entries made as
//     met), the rest warm; prints {"n", "p50_us", "p99_us", "max_us" (warm), "cold_p50_us",
//     "cold_p99_us", "cold_max_us", "cache_entries", "trie_ms"}. FERRY_MASK_CACHE_DEPTH sets
//     MaskCacheOptions::depth. TIMES_OUT, if given, gets every warm time (microseconds, one a
//     line), for `ferry bench grammar` to pool schemas.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/mask_cache.h"
#include "engine/grammar/token_matcher.h"
#include "engine/grammar/token_vocabulary.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using ferry::grammar::Grammar;
using ferry::grammar::TokenMatcher;
using ferry::grammar::TokenTrie;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Hex(const std::vector<uint32_t>& words) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(words.size() * 8);
  for (uint32_t w : words) {
    for (int i = 0; i < 4; ++i) {
      uint8_t b = static_cast<uint8_t>(w >> (8 * i));
      out.push_back(kDigits[b >> 4]);
      out.push_back(kDigits[b & 15]);
    }
  }
  return out;
}

int Fail(const std::string& what) {
  std::cerr << "grammar_mask_tool: " << what << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    return Fail(
        "usage: grammar_mask_tool masks GGUF CASES.json | masks-bin GGUF CASES.json MASKS.bin | "
        "bench GGUF GRAMMAR TOKENS REPEAT "
        "[TIMES_OUT]");
  }
  std::string mode = argv[1];
  auto gguf = ferry::GgufFile::Open(argv[2]);
  if (!gguf.ok()) return Fail(gguf.status().ToString());
  auto tokenizer = ferry::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) return Fail(tokenizer.status().ToString());
  auto t0 = std::chrono::steady_clock::now();
  auto trie = TokenTrie::Build(ferry::grammar::TokenBytesOf(**tokenizer));
  if (!trie.ok()) return Fail(trie.status().ToString());
  double trie_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  size_t words = TokenMatcher::MaskWords((*trie)->vocab_size());

  if ((mode == "masks" && argc == 4) || (mode == "masks-bin" && argc == 5)) {
    const bool walk = mode == "masks";
    std::ofstream bin;
    absl::flat_hash_map<std::string, int64_t> mask_ids;  // mask bytes -> index in MASKS.bin
    if (!walk) bin.open(argv[4], std::ios::binary);
    nlohmann::json cases = nlohmann::json::parse(ReadFile(argv[3]));
    std::vector<uint32_t> stop_ids = cases["stop_ids"].get<std::vector<uint32_t>>();
    for (const auto& c : cases["cases"]) {
      std::string name = c["name"];
      auto grammar = ferry::grammar::ParseGbnf(c["grammar"].get<std::string>());
      if (!grammar.ok()) {
        std::cout << nlohmann::json{{"case", name}, {"error", grammar.status().ToString()}}.dump()
                  << "\n";
        continue;
      }
      auto shared = std::make_shared<const Grammar>(*std::move(grammar));
      auto cache = std::make_shared<ferry::grammar::MaskCache>(shared, *trie);
      int seq_index = 0;
      for (const auto& seq : c["sequences"]) {
        auto m = TokenMatcher::Create(shared, *trie, stop_ids, {}, cache);
        if (!m.ok()) return Fail(m.status().ToString());
        std::vector<uint32_t> mask(words), walked(words);
        std::vector<uint32_t> ids = seq.get<std::vector<uint32_t>>();
        size_t consumed = 0;
        for (size_t k = 0; k <= ids.size(); ++k) {
          m->ComputeMask(absl::MakeSpan(mask));
          if (walk) m->ComputeMaskByWalk(absl::MakeSpan(walked));
          if (walk && mask != walked) {
            return Fail(absl::StrCat(name, " sequence ", seq_index, " prefix ", k,
                                     ": the cached mask differs from the trie walk's"));
          }
          nlohmann::json line{
              {"case", name}, {"seq", seq_index}, {"k", k}, {"accepting", m->Accepting()}};
          if (walk) {
            line["mask"] = Hex(mask);
          } else {
            std::string bytes(reinterpret_cast<const char*>(mask.data()), mask.size() * 4);
            auto [it, added] = mask_ids.emplace(bytes, mask_ids.size());
            if (added) bin.write(bytes.data(), bytes.size());
            line["mask_id"] = it->second;
          }
          std::cout << line.dump() << "\n";
          if (k == ids.size() || !m->Accept(ids[k]).ok()) break;
          consumed = k + 1;
        }
        std::cout
            << nlohmann::json{{"case", name}, {"seq", seq_index}, {"consumed", consumed}}.dump()
            << "\n";
        ++seq_index;
      }
    }
    if (!walk && !bin) return Fail(absl::StrCat("cannot write ", argv[4]));
    return 0;
  }
  if (mode == "bench" && (argc == 6 || argc == 7)) {
    auto grammar = ferry::grammar::ParseGbnf(ReadFile(argv[3]));
    if (!grammar.ok()) return Fail(grammar.status().ToString());
    auto shared = std::make_shared<const Grammar>(*std::move(grammar));
    nlohmann::json seqs = nlohmann::json::parse(ReadFile(argv[4]));
    int repeat = std::stoi(argv[5]);
    // Pass 0 starts with an empty cache (cold); later passes share it (warm).
    ferry::grammar::MaskCacheOptions cache_options;
    if (const char* depth = std::getenv("FERRY_MASK_CACHE_DEPTH")) {
      cache_options.depth = std::stoul(depth);
    }
    auto cache = std::make_shared<ferry::grammar::MaskCache>(shared, *trie, cache_options);
    std::vector<double> us, cold_us;
    std::vector<uint32_t> mask(words);
    for (int r = 0; r < repeat; ++r) {
      for (const auto& seq : seqs) {
        auto m = TokenMatcher::Create(shared, *trie, {0}, {}, cache);
        if (!m.ok()) return Fail(m.status().ToString());
        for (uint32_t id : seq.get<std::vector<uint32_t>>()) {
          auto s = std::chrono::steady_clock::now();
          m->ComputeMask(absl::MakeSpan(mask));
          double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s)
                         .count();
          (r == 0 ? cold_us : us).push_back(t);
          auto st = m->Accept(id);
          if (!st.ok()) return Fail(absl::StrCat("bench sequence refused: ", st.ToString()));
        }
      }
    }
    if (repeat < 2) return Fail("bench needs REPEAT >= 2 (one cold pass, then warm ones)");
    if (argc == 7) {
      std::ofstream times(argv[6]);
      for (double t : us) times << t << "\n";
      if (!times) return Fail(absl::StrCat("cannot write ", argv[6]));
    }
    std::sort(us.begin(), us.end());
    std::sort(cold_us.begin(), cold_us.end());
    auto pct = [](const std::vector<double>& v, double p) {
      return v[std::min(v.size() - 1, size_t(p * v.size()))];
    };
    std::cout << nlohmann::json{{"n", us.size()},
                                {"p50_us", pct(us, 0.5)},
                                {"p99_us", pct(us, 0.99)},
                                {"max_us", us.back()},
                                {"cold_p50_us", pct(cold_us, 0.5)},
                                {"cold_p99_us", pct(cold_us, 0.99)},
                                {"cold_max_us", cold_us.back()},
                                {"cache_entries", cache->size()},
                                {"trie_ms", trie_ms}}
                     .dump()
              << "\n";
    return 0;
  }
  return Fail("unknown mode " + mode);
}
