#include "engine/common/model_fingerprint.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/le_encoding.h"
#include "engine/common/status.h"

namespace ferry {
namespace {

constexpr char kTag[8] = {'F', 'E', 'R', 'R', 'Y', 'F', 'P', '\0'};

bool IsKnownKvDtype(const std::string& dtype) {
  return dtype == "f32" || dtype == "f16" || dtype == "bf16" || dtype == "fp8_e4m3";
}

}  // namespace

void ModelFingerprintBuilder::AddFile(const std::string& name, const Hash128& digest) {
  if (!files_.emplace(name, digest).second && duplicate_name_.empty()) duplicate_name_ = name;
}

absl::Status ModelFingerprintBuilder::AddFileFromDisk(const std::string& name,
                                                      const std::string& path) {
  ASSIGN_OR_RETURN(const Hash128 digest, DigestFile(path));
  AddFile(name, digest);
  return absl::OkStatus();
}

void ModelFingerprintBuilder::SetTokenizerDigest(const Hash128& digest) {
  has_tokenizer_ = true;
  tokenizer_digest_ = digest;
}

void ModelFingerprintBuilder::SetWeightDtype(const std::string& dtype) { weight_dtype_ = dtype; }

void ModelFingerprintBuilder::SetKvLayout(const KvLayout& layout) {
  has_layout_ = true;
  layout_ = layout;
}

absl::StatusOr<std::string> ModelFingerprintBuilder::Encode() const {
  if (!duplicate_name_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model fingerprint: file '", duplicate_name_, "' added twice"));
  }
  if (files_.empty()) {
    return absl::FailedPreconditionError("model fingerprint: no model files were added");
  }
  if (!has_tokenizer_) {
    return absl::FailedPreconditionError("model fingerprint: no tokenizer digest");
  }
  if (!has_layout_) return absl::FailedPreconditionError("model fingerprint: no KV layout");
  const bool native = absl::StartsWith(weight_dtype_, "native:") && weight_dtype_.size() > 7;
  if (weight_dtype_ != "f32" && weight_dtype_ != "bf16" && !native) {
    return absl::InvalidArgumentError(absl::StrCat("model fingerprint: weight dtype '",
                                                   weight_dtype_,
                                                   "' (expected f32, bf16 or native:FORMATS)"));
  }
  if (!IsKnownKvDtype(layout_.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("model fingerprint: unknown KV dtype '",
                                                   layout_.dtype,
                                                   "' (expected f32, f16, bf16 or fp8_e4m3)"));
  }
  if (layout_.cached_layers == 0 || layout_.kv_heads == 0 || layout_.head_dim == 0 ||
      layout_.format_version == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model fingerprint: KV layout has a zero field (layers=", layout_.cached_layers,
        " kv_heads=", layout_.kv_heads, " head_dim=", layout_.head_dim,
        " format_version=", layout_.format_version, ")"));
  }
  std::string out(kTag, sizeof(kTag));
  AppendU32Le(&out, kModelFingerprintVersion);
  AppendU32Le(&out, static_cast<uint32_t>(files_.size()));
  for (const auto& [name, digest] : files_) {  // std::map: sorted bytewise by name
    AppendLengthPrefixed(&out, name);
    AppendHash128Le(&out, digest);
  }
  AppendHash128Le(&out, tokenizer_digest_);
  AppendLengthPrefixed(&out, layout_.dtype);
  AppendU32Le(&out, layout_.cached_layers);
  AppendU32Le(&out, layout_.kv_heads);
  AppendU32Le(&out, layout_.head_dim);
  AppendU32Le(&out, layout_.format_version);
  AppendLengthPrefixed(&out, weight_dtype_);
  return out;
}

absl::StatusOr<Hash128> ModelFingerprintBuilder::Finish() const {
  ASSIGN_OR_RETURN(const std::string bytes, Encode());
  return Xxh3Hash128(bytes);
}

Hash128 ExtendModelFingerprint(const Hash128& text, const Hash128& vision) {
  constexpr char kVisionTag[8] = {'F', 'E', 'R', 'R', 'Y', 'V', 'I', 'S'};
  std::string out(kVisionTag, sizeof(kVisionTag));
  AppendHash128Le(&out, text);
  AppendHash128Le(&out, vision);
  return Xxh3Hash128(out);
}

Hash128 ExtendModelFingerprintForCompute(const Hash128& fp, const std::string& tag) {
  constexpr char kComputeTag[8] = {'F', 'E', 'R', 'R', 'Y', 'C', 'M', 'P'};
  std::string out(kComputeTag, sizeof(kComputeTag));
  AppendHash128Le(&out, fp);
  const uint32_t n = static_cast<uint32_t>(tag.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += tag;
  return Xxh3Hash128(out);
}

}  // namespace ferry
