// The type of a vocabulary index. 32-bit and unsigned everywhere in Ferry: in the tokenizer, the
// engine, the block hash encoding and on the wire (proto uint32).

#ifndef FERRY_ENGINE_COMMON_TOKEN_ID_H_
#define FERRY_ENGINE_COMMON_TOKEN_ID_H_

#include <cstdint>

namespace ferry {

using TokenId = uint32_t;
// No token (an id outside every vocabulary).
inline constexpr TokenId kNoToken = ~TokenId{0};

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_TOKEN_ID_H_
