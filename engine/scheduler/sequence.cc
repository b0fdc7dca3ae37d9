#include "engine/scheduler/sequence.h"

#include "engine/common/block_hash.h"

namespace ferry {

std::unique_ptr<Sequence> NewSequence(const std::shared_ptr<RunningRequest>& req, int32_t choice,
                                      int64_t arrival, const Tokenizer* tokenizer) {
  auto seq = std::make_unique<Sequence>();
  seq->req = req;
  seq->choice = choice;
  seq->arrival = arrival;
  seq->prompt_len = static_cast<int64_t>(req->r.prompt.size());
  seq->tokens = req->r.prompt;
  seq->stop = StopStringMatcher(req->r.stop);
  if (tokenizer != nullptr) {
    seq->detok = std::make_unique<IncrementalDetokenizer>(*tokenizer, /*skip_special=*/true,
                                                          req->r.keep_special_token_ids);
  }
  return seq;
}

void HashFullBlocks(Sequence& seq, int64_t full, int32_t block_tokens) {
  while (static_cast<int64_t>(seq.hashes.size()) < full) {
    const int64_t i = static_cast<int64_t>(seq.hashes.size());
    const Hash128 parent = i == 0 ? seq.req->root : seq.hashes.back();
    seq.hashes.push_back(NextBlockHash(
        parent, absl::MakeConstSpan(seq.tokens).subspan(i * block_tokens, block_tokens),
        ImagesInBlock(seq.req->image_spans, i * block_tokens, block_tokens)));
  }
}

}  // namespace ferry
