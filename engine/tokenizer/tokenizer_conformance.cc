// tokenizer_conformance: encodes and decodes every string of a corpus with Ferry's tokenizer and
// compares the result with a reference's (HF `tokenizers` or llama.cpp, written by
// tools/python/tokenizer_reference.py). Exits non-zero on the first mismatch, printing it.
//
//   tokenizer_conformance (--gguf FILE | --json FILE) CORPUS.json EXPECTED.json
//
// CORPUS.json: an array of strings. EXPECTED.json: an array of {"ids": [...], "text": "..."}, the
// ids of each string encoded with special tokens recognised, and the text decoded from them.

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using Json = nlohmann::json;

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: tokenizer_conformance (--gguf FILE | --json FILE) CORPUS EXPECTED\n";
    return 2;
  }
  const std::string kind = argv[1], source = argv[2];
  absl::StatusOr<std::unique_ptr<ferry::Tokenizer>> tokenizer;
  std::unique_ptr<ferry::GgufFile> gguf;
  if (kind == "--gguf") {
    auto file = ferry::GgufFile::Open(source);
    if (!file.ok()) {
      std::cerr << file.status() << "\n";
      return 1;
    }
    gguf = std::move(*file);
    tokenizer = ferry::Tokenizer::FromGguf(*gguf);
  } else {
    tokenizer = ferry::Tokenizer::FromTokenizerJsonFile(source);
  }
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  const Json corpus = ReadJson(argv[3]);
  const Json expected = ReadJson(argv[4]);
  if (corpus.size() != expected.size() || corpus.empty()) {
    std::cerr << "corpus and expected sizes differ or are empty\n";
    return 1;
  }
  int failures = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    auto ids = (*tokenizer)->Encode(text, /*allow_special=*/true);
    const auto want_ids = expected[i]["ids"].get<std::vector<ferry::TokenId>>();
    if (!ids.ok() || *ids != want_ids) {
      std::cerr << "encode mismatch on string " << i << ": " << Json(text).dump()
                << "\n  ours: " << (ids.ok() ? Json(*ids).dump() : ids.status().ToString())
                << "\n  reference: " << Json(want_ids).dump() << "\n";
      if (++failures >= 5) return 1;
      continue;
    }
    auto decoded = (*tokenizer)->Decode(*ids);
    const std::string want_text = expected[i]["text"].get<std::string>();
    if (!decoded.ok() || *decoded != want_text) {
      std::cerr << "decode mismatch on string " << i << ": ours "
                << (decoded.ok()
                        ? Json(*decoded).dump(-1, ' ', false, Json::error_handler_t::replace)
                        : decoded.status().ToString())
                << " reference " << Json(want_text).dump() << "\n";
      if (++failures >= 5) return 1;
    }
  }
  if (failures > 0) return 1;
  std::cout << corpus.size() << " strings: identical ids and decoded text\n";
  return 0;
}
