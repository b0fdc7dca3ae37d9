// Fuzz target for encoding and decoding, on two small tokenizers trained by HF `tokenizers`
// (testdata/: a Llama-3-style byte-level one and a Mistral-style Metaspace + byte-fallback one).
//
// Input: byte 0 selects the tokenizer (bit 0), whether special tokens are allowed (bit 1) and
// whether the rest is text or token ids (bit 2). Text must encode (or be refused as invalid
// UTF-8); byte-level tokenizers must decode back to the normalized text; the incremental
// detokenizer must agree with Decode. Ids must decode or be refused, never crash.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "engine/common/log.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace {

const ferry::Tokenizer& Load(int which) {
  static const auto* tokenizers = [] {
    auto* v = new std::vector<std::unique_ptr<ferry::Tokenizer>>();
    for (const char* path : {"engine/tokenizer/testdata/llama3_bytelevel_600.json",
                             "engine/tokenizer/testdata/mistral_metaspace_600.json"}) {
      auto t = ferry::Tokenizer::FromTokenizerJsonFile(path);
      CHECK_OK(t.status()) << " (run from the repository or runfiles root)";
      v->push_back(std::move(*t));
    }
    return v;
  }();
  return *(*tokenizers)[which];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t control = data[0];
  const ferry::Tokenizer& tokenizer = Load(control & 1);
  const bool allow_special = (control & 2) != 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);

  std::vector<ferry::TokenId> ids;
  if ((control & 4) == 0) {
    auto encoded = tokenizer.Encode(rest, allow_special);
    CHECK_EQ(encoded.ok(), ferry::IsValidUtf8(rest)) << encoded.status();
    if (!encoded.ok()) return 0;
    ids = *encoded;
    auto decoded = tokenizer.Decode(ids);
    CHECK(decoded.ok()) << decoded.status();
    if ((control & 1) == 0) CHECK(*decoded == *tokenizer.Normalize(rest));
  } else {
    for (size_t i = 0; i + 1 < rest.size(); i += 2) {
      ids.push_back(static_cast<ferry::TokenId>(
          (static_cast<uint8_t>(rest[i]) << 8 | static_cast<uint8_t>(rest[i + 1])) %
          (tokenizer.vocab_size() + 16)));
    }
    auto decoded = tokenizer.Decode(ids);
    bool all_known = true;
    for (ferry::TokenId id : ids) all_known = all_known && id < tokenizer.vocab_size();
    if (!decoded.ok()) {
      CHECK(!all_known) << decoded.status();
      return 0;
    }
  }
  auto full = tokenizer.Decode(ids);
  if (!full.ok()) return 0;
  ferry::IncrementalDetokenizer detok(tokenizer);
  std::string streamed;
  for (ferry::TokenId id : ids) {
    auto delta = detok.Push(id);
    if (!delta.ok()) return 0;  // an id that is a hole in the vocabulary
    streamed += *delta;
    CHECK(full->compare(0, streamed.size(), streamed) == 0)
        << "tokenizer " << (control & 1) << " ids " << absl::StrJoin(ids, ",") << " streamed '"
        << streamed << "' full '" << *full << "'";
  }
  auto tail = detok.Finish();
  CHECK(tail.ok()) << tail.status();
  CHECK(streamed + *tail == *full);
  return 0;
}
