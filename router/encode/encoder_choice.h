// Which encoder an image goes to (the router's E/P/D path, docs/serving/encoder.md "The router's
// side"): a pure rule over the encoders' last Watch status, so it is tested without a network.
//
//   - Affinity: rendezvous (highest random weight) hashing of the image's content hash over the
//     encoders that are up: each encoder scores XXH3-128(content hash, endpoint), the highest
//     first. The same image goes to the same encoder (the one that holds it in its cache) while
//     the set of up encoders stays; an encoder going down moves only its own images.
//   - Load: an encoder whose backlog (queued + encoding, from its Watch) exceeds the shortest
//     backlog among the up encoders by more than max(slack, that shortest backlog) (it is more
//     than twice as long, and longer by more than `slack`) goes after the others, in the same
//     rendezvous order: it is still tried when they fail.
//   - Encoders that are down (no Watch stream, draining, or the wrong model) are not tried.
//
// Pure functions; no state.

#ifndef FERRY_ROUTER_ENCODE_ENCODER_CHOICE_H_
#define FERRY_ROUTER_ENCODE_ENCODER_CHOICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/hash128.h"

namespace ferry {

struct EncoderLoadView {
  std::string endpoint;
  bool up = false;
  int64_t backlog = 0;  // images queued + being encoded
};

// The default slack of the load rule (images).
inline constexpr int64_t kEncoderBacklogSlack = 8;

// The rendezvous score of `endpoint` for the image `content` (higher: tried first).
Hash128 EncoderScore(const Hash128& content, const std::string& endpoint);

// The indices into `encoders` to try for the image `content`, in order (see above). Empty when no
// encoder is up.
std::vector<size_t> EncoderOrder(const Hash128& content,
                                 const std::vector<EncoderLoadView>& encoders,
                                 int64_t slack = kEncoderBacklogSlack);

}  // namespace ferry

#endif  // FERRY_ROUTER_ENCODE_ENCODER_CHOICE_H_
