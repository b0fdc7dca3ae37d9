// Tokenizer::FromGguf: the tokenizer described by a GGUF file's tokenizer.ggml.* metadata.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/gguf_pre_tokenizers.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry {
namespace {

// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int64_t kTokenTypeControl = 3;
constexpr int64_t kTokenTypeUserDefined = 4;

absl::StatusOr<std::optional<TokenId>> OptionalId(const GgufFile& gguf, absl::string_view key,
                                                  size_t vocab_size) {
  if (!gguf.Has(key)) return std::optional<TokenId>();
  ASSIGN_OR_RETURN(const int64_t id, gguf.GetInt(key));
  if (id < 0 || static_cast<size_t>(id) >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF ", key, " = ", id, " is outside the vocabulary of ", vocab_size));
  }
  return std::optional<TokenId>(static_cast<TokenId>(id));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(const std::string model, gguf.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat(
        "GGUF tokenizer model '", model,
        "' is not supported (supported: 'gpt2', byte-level BPE; SentencePiece GGUF vocabularies "
        "('llama') store scores, not merges, and are not implemented)"));
  }
  ASSIGN_OR_RETURN(const std::vector<absl::string_view> tokens,
                   gguf.GetStringArray("tokenizer.ggml.tokens"));
  ASSIGN_OR_RETURN(const std::vector<absl::string_view> merge_strings,
                   gguf.GetStringArray("tokenizer.ggml.merges"));
  std::vector<int64_t> types(tokens.size(), 1);
  if (gguf.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(types, gguf.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF tokenizer.ggml.token_type has ",
                                                     types.size(), " entries for ", tokens.size(),
                                                     " tokens"));
    }
  }
  std::string pre = "gpt2";
  if (gguf.Has("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(pre, gguf.GetString("tokenizer.ggml.pre"));
  }

  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer());
  ASSIGN_OR_RETURN(tokenizer->pre_tokenizer_, GgufPreTokenizer(pre));

  std::vector<std::string> vocab;
  vocab.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    vocab.emplace_back(tokens[id]);
    if (types[id] == kTokenTypeControl || types[id] == kTokenTypeUserDefined) {
      tokenizer->added_.push_back(
          {static_cast<TokenId>(id), std::string(tokens[id]), types[id] == kTokenTypeControl});
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merge_strings.size());
  for (size_t i = 0; i < merge_strings.size(); ++i) {
    const absl::string_view m = merge_strings[i];
    const size_t space = m.find(' ', 1);
    if (space == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF merge ", i, " ('", m, "') is not two tokens separated by a space"));
    }
    merges.emplace_back(std::string(m.substr(0, space)), std::string(m.substr(space + 1)));
  }
  BpeOptions options;
  options.byte_level = true;
  ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::Create(std::move(vocab), merges, options));
  tokenizer->model_ = std::move(bpe);
  tokenizer->decoder_ = Decoder({DecoderStep{DecoderStep::Kind::kByteLevel}});
  ASSIGN_OR_RETURN(tokenizer->bos_id_,
                   OptionalId(gguf, "tokenizer.ggml.bos_token_id", tokens.size()));
  ASSIGN_OR_RETURN(tokenizer->eos_id_,
                   OptionalId(gguf, "tokenizer.ggml.eos_token_id", tokens.size()));
  if (gguf.Has("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(tokenizer->add_bos_, gguf.GetBool("tokenizer.ggml.add_bos_token"));
  }
  RETURN_IF_ERROR(tokenizer->Finish());
  return tokenizer;
}

}  // namespace ferry
