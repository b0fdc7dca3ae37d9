#include "router/encode/encoder_choice.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>

namespace ferry {

Hash128 EncoderScore(const Hash128& content, const std::string& endpoint) {
  std::string key(16 + endpoint.size(), '\0');
  std::memcpy(key.data(), &content.lo, 8);
  std::memcpy(key.data() + 8, &content.hi, 8);
  std::memcpy(key.data() + 16, endpoint.data(), endpoint.size());
  return Xxh3Hash128(key);
}

std::vector<size_t> EncoderOrder(const Hash128& content,
                                 const std::vector<EncoderLoadView>& encoders, int64_t slack) {
  int64_t shortest = std::numeric_limits<int64_t>::max();
  for (const EncoderLoadView& e : encoders) {
    if (e.up) shortest = std::min(shortest, std::max<int64_t>(0, e.backlog));
  }
  struct Ranked {
    bool long_queue;
    Hash128 score;
    size_t index;
  };
  std::vector<Ranked> ranked;
  for (size_t i = 0; i < encoders.size(); ++i) {
    const EncoderLoadView& e = encoders[i];
    if (!e.up) continue;
    const bool long_queue = e.backlog - shortest > std::max(slack, shortest);
    ranked.push_back({long_queue, EncoderScore(content, e.endpoint), i});
  }
  std::sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    // Short queues first; then the higher score; ties (equal endpoints) by index.
    return std::make_tuple(a.long_queue, b.score.hi, b.score.lo, a.index) <
           std::make_tuple(b.long_queue, a.score.hi, a.score.lo, b.index);
  });
  std::vector<size_t> order;
  order.reserve(ranked.size());
  for (const Ranked& r : ranked) order.push_back(r.index);
  return order;
}

}  // namespace ferry
