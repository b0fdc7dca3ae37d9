// Tokenizer: text <-> token ids, exactly as the model's reference tokenizer does it.
//
// Loads HF `tokenizer.json` files (BPE models, byte-level or SentencePiece-style; the normalizers,
// pre-tokenizers and decoders in normalizer.h, pre_tokenizer.h, decoder.h) and GGUF metadata
// (`tokenizer.ggml.*`, with the pre-tokenizer named by `tokenizer.ggml.pre` looked up in a table:
// gguf_pre_tokenizers.h). Parts Ferry does not implement fail to load with an error naming them.
//
// Injection safety: special-token strings ("<|im_start|>", "<|eot_id|>", ...) inside text become
// their special ids only in segments whose caller allows it (chat-template text); in user text
// they are tokenized as the characters they are. Otherwise segments do not change the result:
// the text between two added tokens is tokenized whole, across segment boundaries, so
// Encode(segments) equals HF's encoding of their concatenation except where user text holds a
// special token's string.
//
// Encode never adds BOS/EOS (HF's post-processor); the chat template decides that.
//
// Immutable after loading; thread-safe.

#ifndef FERRY_ENGINE_TOKENIZER_TOKENIZER_H_
#define FERRY_ENGINE_TOKENIZER_TOKENIZER_H_

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/common/token_id.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/pre_tokenizer.h"

namespace ferry {

class GgufFile;

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
};

// A piece of input with its injection policy.
struct TextSegment {
  absl::string_view text;
  // Whether special-token strings in `text` become special ids (template text) or stay text.
  bool allow_special = false;
};

class Tokenizer {
 public:
  // From the text of a tokenizer.json file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJson(absl::string_view json);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJsonFile(const std::string& path);
  // From an HF model directory: tokenizer.json, plus tokenizer_config.json when present
  // (bos_token, eos_token, add_bos_token).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfDirectory(const std::string& dir);
  // Applies tokenizer_config.json's special-token settings to a loaded tokenizer.
  absl::Status ApplyTokenizerConfig(absl::string_view json);
  // From the tokenizer.ggml.* metadata of a GGUF file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);

  // `text` must be valid UTF-8 (InvalidArgument naming the byte offset otherwise). Plain text
  // longer than parallel_threshold() is cut at boundaries the pre-tokenizer cannot cross and
  // encoded on ThreadPool::Shared(), with a result identical to the sequential one.
  absl::StatusOr<std::vector<TokenId>> Encode(absl::string_view text,
                                              bool allow_special = false) const;
  // The segments' concatenation, special tokens matched only inside segments that allow them.
  absl::StatusOr<std::vector<TokenId>> Encode(absl::Span<const TextSegment> segments) const;

  // The text as the model sees it after normalization (NFC etc.; the input itself when the
  // tokenizer has no normalizer). Byte-level tokenizers decode Encode(text) to exactly this.
  absl::StatusOr<std::string> Normalize(absl::string_view text) const;

  // Text of `ids`; invalid UTF-8 produced by partial byte tokens becomes U+FFFD (as in HF).
  // Unknown ids are an error.
  absl::StatusOr<std::string> Decode(absl::Span<const TokenId> ids,
                                     bool skip_special = false) const;
  // The raw bytes of `ids` (no UTF-8 repair), for the incremental detokenizer.
  absl::StatusOr<std::string> DecodeBytes(absl::Span<const TokenId> ids,
                                          bool skip_special = false) const;

  size_t vocab_size() const { return token_strings_.size(); }
  // True for <0xXX> tokens when the decoder has ByteFallback: such a token's text depends on the
  // byte tokens that follow it (an invalid group decodes to one U+FFFD per byte), so streaming
  // holds it back until the group ends.
  bool IsByteFallbackToken(TokenId id) const {
    return id < byte_fallback_tokens_.size() && byte_fallback_tokens_[id];
  }
  // The vocabulary string of an id ("" when out of range).
  const std::string& TokenString(TokenId id) const;
  bool IsSpecial(TokenId id) const { return special_ids_.contains(id); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  std::optional<TokenId> bos_id() const { return bos_id_; }
  std::optional<TokenId> eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }

  // Whether long inputs may be encoded in parallel: true for pipelines made only of the known
  // split patterns (GPT-2, Llama-3, Qwen2, digits) and Unicode normal forms, whose pieces never
  // cross a "non-space, newline, ASCII letter" boundary.
  bool parallel_safe() const { return parallel_safe_; }
  size_t parallel_threshold() const { return parallel_threshold_; }
  // For tests and benchmarks: inputs above `bytes` go parallel (0 disables parallel encoding).
  void set_parallel_threshold(size_t bytes) { parallel_threshold_ = bytes; }

  // The cut points EncodeText would use for `text` (exposed for tests).
  std::vector<size_t> ParallelBoundaries(absl::string_view text, size_t chunk_bytes) const;

 private:
  Tokenizer() = default;

  // Normalizes, pre-tokenizes and runs BPE over plain text, in parallel chunks when safe.
  absl::Status EncodeText(absl::string_view text, bool at_start, std::vector<TokenId>* out) const;
  absl::Status EncodePlain(absl::string_view text, bool at_start, std::vector<TokenId>* out) const;
  // Fills token_strings_, byte_level_bytes_ and special_ids_ once model_, added_ and decoder_
  // are set, and sorts added_ for matching.
  absl::Status Finish();

  std::optional<BpeModel> model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Decoder decoder_;
  std::vector<AddedToken> added_;              // sorted by content length, longest first
  std::vector<std::string> token_strings_;     // id -> vocabulary (or added) string
  std::vector<std::string> byte_level_bytes_;  // id -> bytes, when the decoder is ByteLevel
  std::vector<bool> byte_fallback_tokens_;     // see IsByteFallbackToken
  absl::flat_hash_set<TokenId> special_ids_;
  // First bytes of added tokens: all of them, and the non-special ones (user text may hold those).
  std::array<bool, 256> first_byte_any_{};
  std::array<bool, 256> first_byte_plain_{};
  std::optional<TokenId> bos_id_, eos_id_;
  bool add_bos_ = false;
  bool parallel_safe_ = false;
  size_t parallel_threshold_ = 64 * 1024;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_TOKENIZER_H_
