// Tokenizer::FromTokenizerJson: the tokenizer described by an HF tokenizer.json.

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::json;

absl::Status Unsupported(absl::string_view what, const Json& node) {
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: unsupported ", what, ": ",
                   node.dump(-1, ' ', false, Json::error_handler_t::replace).substr(0, 200)));
}

std::string TypeOf(const Json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : "";
}

// {"String": "x"} or {"Regex": "x"}: the literal, or a compiled regex.
absl::Status ReadPattern(const Json& pattern, std::string* literal,
                         std::shared_ptr<const UnicodeRegex>* regex) {
  if (pattern.contains("String")) {
    *literal = pattern["String"].get<std::string>();
    return absl::OkStatus();
  }
  if (pattern.contains("Regex")) {
    ASSIGN_OR_RETURN(std::unique_ptr<UnicodeRegex> compiled,
                     UnicodeRegex::Compile(pattern["Regex"].get<std::string>()));
    *regex = std::move(compiled);
    return absl::OkStatus();
  }
  return Unsupported("pattern", pattern);
}

// Escapes a literal for Oniguruma.
std::string EscapeRegex(absl::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

absl::Status ReadNormalizer(const Json& node, std::vector<NormalizerStep>* steps) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(node);
  NormalizerStep step;
  if (type == "Sequence") {
    for (const Json& child : node["normalizers"]) RETURN_IF_ERROR(ReadNormalizer(child, steps));
    return absl::OkStatus();
  } else if (type == "NFC") {
    step.kind = NormalizerStep::Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = NormalizerStep::Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = NormalizerStep::Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = NormalizerStep::Kind::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = NormalizerStep::Kind::kLowercase;
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    RETURN_IF_ERROR(ReadPattern(node["pattern"], &step.pattern, &step.regex));
    step.content = node["content"].get<std::string>();
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    step.content = node["prepend"].get<std::string>();
  } else if (type == "Strip") {
    step.kind = NormalizerStep::Kind::kStrip;
    step.strip_left = node.value("strip_left", false);
    step.strip_right = node.value("strip_right", false);
  } else {
    return Unsupported("normalizer", node);
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<SplitBehavior> ReadBehavior(const Json& node) {
  const std::string b = node.get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return Unsupported("split behavior", node);
}

absl::StatusOr<PrependScheme> ReadPrependScheme(const Json& node) {
  if (node.contains("prepend_scheme")) {
    const std::string scheme = node["prepend_scheme"].get<std::string>();
    if (scheme == "always") return PrependScheme::kAlways;
    if (scheme == "first") return PrependScheme::kFirst;
    if (scheme == "never") return PrependScheme::kNever;
    return Unsupported("prepend_scheme", node);
  }
  // Older files: add_prefix_space.
  return node.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

absl::Status ReadPreTokenizer(const Json& node, std::vector<PreTokenizerStep>* steps,
                              bool* byte_level) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(node);
  if (*byte_level) {
    return Unsupported("pre-tokenizer after ByteLevel (ByteLevel must come last)", node);
  }
  if (type == "Sequence") {
    for (const Json& child : node["pretokenizers"]) {
      RETURN_IF_ERROR(ReadPreTokenizer(child, steps, byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(PreTokenizerStep step,
                     PreTokenizer::ByteLevelStep(node.value("add_prefix_space", false),
                                                 node.value("use_regex", true)));
    steps->push_back(std::move(step));
    *byte_level = true;
    return absl::OkStatus();
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(PreTokenizerStep step,
                     PreTokenizer::DigitsStep(node.value("individual_digits", false)));
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "Split") {
    std::string literal;
    std::shared_ptr<const UnicodeRegex> regex;
    RETURN_IF_ERROR(ReadPattern(node["pattern"], &literal, &regex));
    ASSIGN_OR_RETURN(const SplitBehavior behavior, ReadBehavior(node["behavior"]));
    const bool invert = node.value("invert", false);
    if (regex == nullptr) {
      ASSIGN_OR_RETURN(PreTokenizerStep step,
                       PreTokenizer::SplitStep(EscapeRegex(literal), behavior, invert));
      steps->push_back(std::move(step));
    } else {
      PreTokenizerStep step;
      step.kind = PreTokenizerStep::Kind::kSplit;
      step.regex = std::move(regex);
      step.behavior = behavior;
      step.invert = invert;
      steps->push_back(std::move(step));
    }
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    step.replacement = node.value("replacement", std::string("\xe2\x96\x81"));
    ASSIGN_OR_RETURN(step.prepend_scheme, ReadPrependScheme(node));
    step.split = node.value("split", true);
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  return Unsupported("pre-tokenizer", node);
}

absl::Status ReadDecoder(const Json& node, std::vector<DecoderStep>* steps) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(node);
  DecoderStep step;
  if (type == "Sequence") {
    for (const Json& child : node["decoders"]) RETURN_IF_ERROR(ReadDecoder(child, steps));
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    std::shared_ptr<const UnicodeRegex> regex;
    RETURN_IF_ERROR(ReadPattern(node["pattern"], &step.pattern, &regex));
    if (regex != nullptr) return Unsupported("regex Replace decoder", node);
    step.content = node["content"].get<std::string>();
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    step.content = node["content"].get<std::string>();
    step.start = node.value("start", 0);
    step.stop = node.value("stop", 0);
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    step.pattern = node.value("replacement", std::string("\xe2\x96\x81"));
    ASSIGN_OR_RETURN(const PrependScheme scheme, ReadPrependScheme(node));
    step.prepend_scheme_never = scheme == PrependScheme::kNever;
  } else {
    return Unsupported("decoder", node);
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ReadModel(const Json& node, bool byte_level, BpeModel* out) {
  if (TypeOf(node) != "BPE") return Unsupported("model (only BPE is implemented)", node);
  if (!node.value("dropout", Json()).is_null()) return Unsupported("BPE dropout", node["dropout"]);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (node.contains(key) && !node[key].is_null() && !node[key].get<std::string>().empty()) {
      return Unsupported(key, node[key]);
    }
  }
  std::vector<std::string> vocab;
  for (auto it = node["vocab"].begin(); it != node["vocab"].end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: bad id ", id));
    }
    if (static_cast<size_t>(id) >= vocab.size()) vocab.resize(id + 1);
    vocab[id] = it.key();
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const Json& m : node["merges"]) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) return Unsupported("merge", m);
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return Unsupported("merge", m);
    }
  }
  BpeOptions options;
  options.byte_level = byte_level;
  options.byte_fallback = node.value("byte_fallback", false);
  options.fuse_unk = node.value("fuse_unk", false);
  options.ignore_merges = node.value("ignore_merges", false);
  if (node.contains("unk_token") && node["unk_token"].is_string()) {
    options.unk_token = node["unk_token"].get<std::string>();
  }
  ASSIGN_OR_RETURN(*out, BpeModel::Create(std::move(vocab), merges, options));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(absl::string_view text) {
  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer());
  try {
    const Json root = Json::parse(text.begin(), text.end());
    std::vector<NormalizerStep> normalizers;
    RETURN_IF_ERROR(ReadNormalizer(root.value("normalizer", Json()), &normalizers));
    std::vector<PreTokenizerStep> pre;
    bool byte_level = false;
    RETURN_IF_ERROR(ReadPreTokenizer(root.value("pre_tokenizer", Json()), &pre, &byte_level));
    std::vector<DecoderStep> decoders;
    RETURN_IF_ERROR(ReadDecoder(root.value("decoder", Json()), &decoders));
    BpeModel model;
    RETURN_IF_ERROR(ReadModel(root.at("model"), byte_level, &model));
    tokenizer->model_ = std::move(model);
    tokenizer->normalizer_ = Normalizer(std::move(normalizers));
    tokenizer->pre_tokenizer_ = PreTokenizer(std::move(pre));
    tokenizer->decoder_ = Decoder(std::move(decoders));
    for (const Json& added : root.value("added_tokens", Json::array())) {
      AddedToken token;
      token.id = added.at("id").get<TokenId>();
      token.content = added.at("content").get<std::string>();
      token.special = added.value("special", false);
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        if (added.value(flag, false)) return Unsupported(absl::StrCat("added token ", flag), added);
      }
      if (added.value("normalized", false) && !tokenizer->normalizer_.empty()) {
        return Unsupported("normalized added token with a normalizer", added);
      }
      tokenizer->added_.push_back(std::move(token));
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
  RETURN_IF_ERROR(tokenizer->Finish());
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJsonFile(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  auto tokenizer = FromTokenizerJson(text.str());
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

namespace {

// tokenizer_config.json spells a token as "text" or {"content": "text", ...}; null means none.
absl::StatusOr<std::optional<std::string>> ConfigToken(const Json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return std::optional<std::string>();
  const Json& value = config[key];
  if (value.is_string()) return std::optional<std::string>(value.get<std::string>());
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return std::optional<std::string>(value["content"].get<std::string>());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer_config.json: ", key, " is neither a string nor {\"content\": ...}"));
}

}  // namespace

absl::Status Tokenizer::ApplyTokenizerConfig(absl::string_view json) {
  try {
    const Json config = Json::parse(json.begin(), json.end());
    if (!config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
    }
    auto id_of = [&](const std::string& content) -> absl::StatusOr<TokenId> {
      for (size_t id = 0; id < token_strings_.size(); ++id) {
        if (token_strings_[id] == content) return static_cast<TokenId>(id);
      }
      return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json names the token '",
                                                     content, "', which is not in tokenizer.json"));
    };
    ASSIGN_OR_RETURN(const std::optional<std::string> bos, ConfigToken(config, "bos_token"));
    ASSIGN_OR_RETURN(const std::optional<std::string> eos, ConfigToken(config, "eos_token"));
    if (bos.has_value()) {
      ASSIGN_OR_RETURN(bos_id_, id_of(*bos));
    }
    if (eos.has_value()) {
      ASSIGN_OR_RETURN(eos_id_, id_of(*eos));
    }
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
      add_bos_ = config["add_bos_token"].get<bool>();
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfDirectory(const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   FromTokenizerJsonFile(absl::StrCat(dir, "/tokenizer.json")));
  const std::string config_path = absl::StrCat(dir, "/tokenizer_config.json");
  std::ifstream in(config_path, std::ios::binary);
  if (in) {
    std::ostringstream text;
    text << in.rdbuf();
    const absl::Status status = tokenizer->ApplyTokenizerConfig(text.str());
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(config_path, ": ", status.message()));
    }
  }
  return tokenizer;
}

}  // namespace ferry
