// Checks Ferry's block hashes and model fingerprints against cases computed by an independent
// implementation (tools/python/block_hash_reference.py): reads the cases (JSON) from the file
// named by argv[1], recomputes each one, and exits non-zero on the first mismatch.

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/common/block_hash.h"
#include "engine/common/model_fingerprint.h"
#include "nlohmann/json.hpp"

namespace {

using Json = nlohmann::json;

ferry::Hash128 ParseHash(const Json& value) {
  auto hash = ferry::Hash128::FromHex(value.get<std::string>());
  if (!hash.ok()) {
    std::cerr << "bad hash in cases: " << hash.status() << "\n";
    std::exit(2);
  }
  return *hash;
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: hash_conformance CASES.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  const Json cases = Json::parse(text.str());

  int checked = 0;
  for (const Json& c : cases.at("block_hash_cases")) {
    ferry::BlockHashScope scope{ParseHash(c.at("model_fingerprint")),
                                Unhex(c.at("cache_salt_hex").get<std::string>()),
                                c.at("lora_id").get<std::string>()};
    std::vector<ferry::TokenId> tokens = c.at("tokens").get<std::vector<ferry::TokenId>>();
    std::vector<ferry::PromptImageSpan> images;
    for (const Json& image : c.at("images")) {
      images.push_back({ParseHash(image.at("content_hash")), image.at("start").get<uint32_t>(),
                        image.at("length").get<uint32_t>()});
    }
    const auto hashes =
        ferry::ComputeBlockHashes(scope, tokens, c.at("block_tokens").get<uint32_t>(), images);
    const Json& expected = c.at("expected");
    if (hashes.size() != expected.size()) {
      std::cerr << "case " << checked << ": " << hashes.size() << " hashes, reference has "
                << expected.size() << "\n";
      return 1;
    }
    for (size_t i = 0; i < hashes.size(); ++i) {
      if (hashes[i].ToHex() != expected[i].get<std::string>()) {
        std::cerr << "case " << checked << " block " << i << ": " << hashes[i].ToHex()
                  << " != reference " << expected[i].get<std::string>() << "\n";
        return 1;
      }
    }
    ++checked;
  }
  int fingerprints = 0;
  for (const Json& c : cases.at("fingerprint_cases")) {
    ferry::ModelFingerprintBuilder builder;
    for (auto it = c.at("files").begin(); it != c.at("files").end(); ++it) {
      builder.AddFile(it.key(), ParseHash(it.value()));
    }
    builder.SetTokenizerDigest(ParseHash(c.at("tokenizer_digest")));
    builder.SetKvLayout(
        ferry::KvLayout{c.at("kv_dtype").get<std::string>(), c.at("cached_layers").get<uint32_t>(),
                        c.at("kv_heads").get<uint32_t>(), c.at("head_dim").get<uint32_t>()});
    builder.SetWeightDtype(c.at("weight_dtype").get<std::string>());
    auto fp = builder.Finish();
    if (!fp.ok() || fp->ToHex() != c.at("expected").get<std::string>()) {
      std::cerr << "fingerprint case " << fingerprints << ": "
                << (fp.ok() ? fp->ToHex() : fp.status().ToString()) << " != reference "
                << c.at("expected").get<std::string>() << "\n";
      return 1;
    }
    ++fingerprints;
  }
  if (checked == 0 || fingerprints == 0) {
    std::cerr << "no cases were read\n";
    return 1;
  }
  std::cout << checked << " block hash cases and " << fingerprints
            << " fingerprint cases match the reference\n";
  return 0;
}
