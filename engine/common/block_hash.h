// Chained block hashes: the keys of every KV cache in Ferry (engine prefix cache, router's view
// of worker caches, KV store).
//
// Router, engines and store must agree on these bit for bit, or every lookup silently misses, so
// the exact bytes are specified here, once, and pinned by golden vectors computed by an
// independent Python implementation of this text (tools/python/block_hash_reference.py).
//
// Specification, version 1. H(x) = XXH3-128 of the byte string x with seed 0. All integers are
// little-endian; a 128-bit hash is written as its low 64 bits then its high 64 bits.
//
//   root = H( "FERRYBH\0"                       8 bytes: 46 45 52 52 59 42 48 00
//             u32 version                       = 1
//             hash128 model_fingerprint         (model_fingerprint.h)
//             u32 len(cache_salt)  cache_salt   the tenant's salt, raw bytes
//             u32 len(lora_id)     lora_id      adapter name, UTF-8; empty for none
//           )
//
//   h_i  = H( hash128 parent                    h_{i-1}; root for block 0
//             u32 n_tokens                      tokens in this block (always B: full blocks only)
//             u32 token[0..n_tokens)            token ids, as unsigned 32-bit
//             u32 n_images                      images overlapping this block, in prompt order
//             n_images x { hash128 content_hash, i32 offset }
//           )
//
// An image's content_hash is H(the encoded image bytes), as the request carries them
// (PromptImage.image_data in worker.proto): the same file gives the same hash everywhere.
//
// `offset` is the position of the image's first placeholder token relative to the block's first
// token: negative when the image began in an earlier block. Block i covers prompt positions
// [i*B, (i+1)*B); only full blocks get a hash.
//
// Per-request constants (model, salt, adapter) enter once, through the root, and reach every
// block by chaining: two requests share block i's hash only if they share the whole prefix up to
// and including block i, under the same model, tenant salt and adapter.

#ifndef FERRY_ENGINE_COMMON_BLOCK_HASH_H_
#define FERRY_ENGINE_COMMON_BLOCK_HASH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "engine/common/token_id.h"

namespace ferry {

inline constexpr uint32_t kBlockHashVersion = 1;

// What makes the same tokens mean different KV: enters the root hash.
struct BlockHashScope {
  Hash128 model_fingerprint;
  std::string cache_salt;
  std::string lora_id;
};

// An image in the prompt: its content hash and the absolute positions of its placeholder tokens.
struct PromptImageSpan {
  Hash128 content_hash;
  uint32_t start = 0;   // absolute position of the first placeholder token
  uint32_t length = 0;  // number of placeholder tokens
};

// An image as one block sees it (see `offset` in the specification above).
struct BlockImage {
  Hash128 content_hash;
  int32_t offset = 0;
};

// The exact bytes hashed for the root, and for one block (exposed for tests and tools).
std::string EncodeRootForHash(const BlockHashScope& scope);
void EncodeBlockForHash(const Hash128& parent, absl::Span<const TokenId> tokens,
                        absl::Span<const BlockImage> images, std::string* out);

Hash128 RootBlockHash(const BlockHashScope& scope);

// h_i from h_{i-1}.
Hash128 NextBlockHash(const Hash128& parent, absl::Span<const TokenId> tokens,
                      absl::Span<const BlockImage> images);

// Hashes of every full block of `tokens`, in order (tokens.size() / block_tokens of them).
// `images` must be sorted by start; those overlapping a block enter its hash. Thread-compatible
// and allocation-light: one scratch buffer per call. block_tokens must be > 0.
std::vector<Hash128> ComputeBlockHashes(const BlockHashScope& scope,
                                        absl::Span<const TokenId> tokens, uint32_t block_tokens,
                                        absl::Span<const PromptImageSpan> images = {});

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_BLOCK_HASH_H_
