#include "engine/common/block_hash.h"

#include <cstring>

static_assert(sizeof(ferry::TokenId) == 4, "the block hash encodes 32-bit tokens");

#include "engine/common/le_encoding.h"
#include "engine/common/log.h"

namespace ferry {
namespace {

constexpr char kRootTag[8] = {'F', 'E', 'R', 'R', 'Y', 'B', 'H', '\0'};

}  // namespace

std::string EncodeRootForHash(const BlockHashScope& scope) {
  std::string out(kRootTag, sizeof(kRootTag));
  AppendU32Le(&out, kBlockHashVersion);
  AppendHash128Le(&out, scope.model_fingerprint);
  AppendLengthPrefixed(&out, scope.cache_salt);
  AppendLengthPrefixed(&out, scope.lora_id);
  return out;
}

void EncodeBlockForHash(const Hash128& parent, absl::Span<const TokenId> tokens,
                        absl::Span<const BlockImage> images, std::string* out) {
  out->clear();
  out->reserve(16 + 4 + 4 * tokens.size() + 4 + 20 * images.size());
  AppendHash128Le(out, parent);
  AppendU32Le(out, static_cast<uint32_t>(tokens.size()));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  // The host layout of uint32_t is the specified little-endian encoding: copy in one go.
  out->append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(TokenId));
#else
  for (TokenId t : tokens) AppendU32Le(out, t);
#endif
  AppendU32Le(out, static_cast<uint32_t>(images.size()));
  for (const BlockImage& image : images) {
    AppendHash128Le(out, image.content_hash);
    AppendU32Le(out, static_cast<uint32_t>(image.offset));
  }
}

Hash128 RootBlockHash(const BlockHashScope& scope) { return Xxh3Hash128(EncodeRootForHash(scope)); }

Hash128 NextBlockHash(const Hash128& parent, absl::Span<const TokenId> tokens,
                      absl::Span<const BlockImage> images) {
  std::string bytes;
  EncodeBlockForHash(parent, tokens, images, &bytes);
  return Xxh3Hash128(bytes);
}

std::vector<Hash128> ComputeBlockHashes(const BlockHashScope& scope,
                                        absl::Span<const TokenId> tokens, uint32_t block_tokens,
                                        absl::Span<const PromptImageSpan> images) {
  CHECK_GT(block_tokens, 0u);
  const size_t num_blocks = tokens.size() / block_tokens;
  std::vector<Hash128> hashes;
  hashes.reserve(num_blocks);
  Hash128 parent = RootBlockHash(scope);
  std::string scratch;
  std::vector<BlockImage> block_images;
  size_t first_image = 0;  // images before this one end before the current block
  for (size_t b = 0; b < num_blocks; ++b) {
    const uint64_t begin = static_cast<uint64_t>(b) * block_tokens;
    const uint64_t end = begin + block_tokens;
    while (first_image < images.size() &&
           uint64_t{images[first_image].start} + images[first_image].length <= begin) {
      ++first_image;
    }
    block_images.clear();
    for (size_t i = first_image; i < images.size() && images[i].start < end; ++i) {
      const PromptImageSpan& image = images[i];
      if (uint64_t{image.start} + image.length <= begin) continue;  // ends before this block
      block_images.push_back(
          {image.content_hash,
           static_cast<int32_t>(static_cast<int64_t>(image.start) - static_cast<int64_t>(begin))});
    }
    EncodeBlockForHash(parent, tokens.subspan(begin, block_tokens), block_images, &scratch);
    parent = Xxh3Hash128(scratch);
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace ferry
