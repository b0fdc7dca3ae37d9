// The model fingerprint: a Hash128 that identifies everything that determines a KV cache's
// bytes, so that a cache (engine, router view, KV store) can never serve KV computed by a
// different model. It enters every block hash through the root (block_hash.h).
//
// It is never just a name: it covers the content digests of the model's files (weights and
// config, or the one GGUF file), the tokenizer's digest, the KV element type and layout, the KV
// format version, and the type the weights are computed in (fp32 and bf16 weights of the same
// file produce different KV). Redeploying a name with new weights gives a new fingerprint.
//
// Encoding, version 2 (integers little-endian, hash128 = low 64 bits then high 64 bits):
//
//   H( "FERRYFP\0"                              8 bytes
//      u32 version                              = 2
//      u32 n_files, then per file, sorted by name (bytewise):
//          u32 len(name) name  hash128 digest   name: path relative to the model root
//      hash128 tokenizer_digest
//      u32 len(kv_dtype) kv_dtype               "f32", "f16", "bf16", "fp8_e4m3"
//      u32 cached_layers  u32 kv_heads  u32 head_dim
//      u32 kv_format_version
//      u32 len(weight_dtype) weight_dtype       "f32", "bf16", or "native:" and the formats the
//                                               matrices are computed in ("native:q4_1,q8_0")
//    )
//
// where H is XXH3-128 with seed 0.
//
// A vision-language model's fingerprint extends that of its text model with the digest of its
// vision tower and projector (ExtendModelFingerprint: the tower's configuration and weights, as
// engine/model/vision computes them), so that KV computed from image embeddings of a different
// tower never matches, even where the text model's files alone would:
//
//   H( "FERRYVIS"  hash128 text_fingerprint  hash128 vision_digest )
//
// A model computed another way than the CPU reference computes it (a GPU backend's arithmetic,
// one rank's share of a tensor-parallel split, whose KV blocks hold some heads only) extends its
// fingerprint with a tag naming that computation (ExtendModelFingerprintForCompute), so such KV
// never passes for the reference's:
//
//   H( "FERRYCMP"  hash128 fingerprint  u32 len(tag) tag )
//
// e.g. tag "backend=cuda:bf16-activations:cublas" or "tensor_parallel=0/2".

#ifndef FERRY_ENGINE_COMMON_MODEL_FINGERPRINT_H_
#define FERRY_ENGINE_COMMON_MODEL_FINGERPRINT_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "engine/common/hash128.h"

namespace ferry {

inline constexpr uint32_t kModelFingerprintVersion = 2;

// Bumped whenever the byte layout of a KV block changes (element order, padding, scales).
// 2: keys stored column-wise per head ([head_dim][slot]; engine/kv/kv_block_pool.h).
inline constexpr uint32_t kKvFormatVersion = 2;

// The shape and type of the KV that caches hold for one block (full-attention layers only;
// sliding-window layers are never shared through caches).
struct KvLayout {
  std::string dtype;  // "f32", "f16", "bf16" or "fp8_e4m3"
  uint32_t cached_layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t format_version = kKvFormatVersion;
};

// Collects the fingerprint's inputs. Thread-compatible.
class ModelFingerprintBuilder {
 public:
  // A file of the model (weights, config.json, or the GGUF file), by its path relative to the
  // model root and its content digest (DigestFile in hash128.h). Adding a name twice is an error
  // reported by Finish().
  void AddFile(const std::string& name, const Hash128& digest);

  // Digests the file at `path` and adds it under `name`.
  absl::Status AddFileFromDisk(const std::string& name, const std::string& path);

  void SetTokenizerDigest(const Hash128& digest);
  void SetKvLayout(const KvLayout& layout);
  // The type the engine holds and computes the weights in: "f32", "bf16", or "native:FORMATS"
  // (the file's block formats, computed in place).
  void SetWeightDtype(const std::string& dtype);

  // The exact bytes hashed (see the header comment), or an error if an input is missing or
  // invalid: no files, no tokenizer digest, an unknown dtype, a zero dimension, a repeated name,
  // no weight dtype.
  absl::StatusOr<std::string> Encode() const;

  absl::StatusOr<Hash128> Finish() const;

 private:
  std::map<std::string, Hash128> files_;
  std::string duplicate_name_;
  bool has_tokenizer_ = false;
  Hash128 tokenizer_digest_;
  bool has_layout_ = false;
  KvLayout layout_;
  std::string weight_dtype_;
};

// The fingerprint of a model whose text part has fingerprint `text` and whose vision tower and
// projector have digest `vision` (see the header comment).
Hash128 ExtendModelFingerprint(const Hash128& text, const Hash128& vision);

// The fingerprint of a model of fingerprint `fp` computed as `tag` names (see the header comment).
Hash128 ExtendModelFingerprintForCompute(const Hash128& fp, const std::string& tag);

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_MODEL_FINGERPRINT_H_
