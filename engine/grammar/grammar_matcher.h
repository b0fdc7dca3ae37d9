// GrammarMatcher: runs a Grammar over bytes, telling after each byte whether the input so far is
// a prefix of some sentence (Advance succeeds) and whether it is a whole one (Accepting()), with
// cheap rollback to any earlier byte (token masks try many tokens from the same state).
//
// The design is llama.cpp's grammar sampler's: a pushdown automaton over the rule graph that keeps
// the set of all stacks alive. A stack is a path of return positions ending in a byte-set element
// to match next; stacks are hash-consed persistent lists (nodes (position, parent) in an arena,
// equal stacks have equal ids), so a step copies nothing and duplicate stacks collapse. A rule
// reference whose continuation is the end of its alternative pushes nothing (tail calls), so
// right-recursive repetition (`r ::= x r | ""`) runs in constant stack space. Left recursion is
// refused when the grammar is built (Grammar::Validate), so expansion always terminates.
//
// History: every byte pushes a frame (its stacks, their next-byte set, the arena size), and
// Rollback truncates frames and arena (the intern table supports deletion in reverse insertion
// order), so a checkpoint is an integer and a rollback costs what the rolled-back bytes created.
//
// Bounds (MatcherLimits): stacks alive after one byte, expansion steps per byte, and arena nodes
// in all; a byte that would exceed one is refused with Step::kLimit and the state is unchanged
// (an ambiguous grammar whose stacks explode stops there rather than eating memory).
//
// Thread-compatible: one matcher per generation stream; the Grammar is shared, const.

#ifndef FERRY_ENGINE_GRAMMAR_GRAMMAR_MATCHER_H_
#define FERRY_ENGINE_GRAMMAR_GRAMMAR_MATCHER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/grammar/grammar.h"

namespace ferry::grammar {

struct MatcherLimits {
  // Distinct stacks alive after one byte.
  size_t max_stacks = 4096;
  // Expansion steps (rule entries and returns) for one byte.
  size_t max_expansions = 1 << 16;
  // Stack nodes held in all (over the whole history).
  size_t max_nodes = 1 << 22;
};

class GrammarMatcher {
 public:
  enum class Step { kOk, kRejected, kLimit };

  // ResourceExhausted when the start state alone exceeds the limits.
  static absl::StatusOr<GrammarMatcher> Create(std::shared_ptr<const Grammar> grammar,
                                               const MatcherLimits& limits = {});

  // A matcher whose only stack is `positions` (top first; the top must be a byte-set element),
  // over a boundary when `truncated`: a stack that pops to the boundary shows as Boundary()
  // (the truncated context would decide what follows). For the token matcher's mask cache.
  static absl::StatusOr<GrammarMatcher> CreateAt(std::shared_ptr<const Grammar> grammar,
                                                 absl::Span<const uint32_t> positions,
                                                 bool truncated, const MatcherLimits& limits = {});

  // Consumes `byte` if some stack can; otherwise (kRejected, or kLimit when a bound was hit)
  // the state is unchanged.
  Step Advance(uint8_t byte);
  // Advance over each byte; on failure rolls back to where it started.
  Step AdvanceBytes(absl::string_view bytes);

  // Whether the bytes so far form a complete sentence of the grammar.
  bool Accepting() const { return frames_.back().accepting; }
  // Whether a stack popped to the boundary with the last byte (CreateAt's truncated stacks).
  bool Boundary() const { return frames_.back().boundary; }
  // The current stacks' ids (the empty stack 0 when accepting, the boundary 1, then others).
  absl::Span<const uint32_t> Stacks() const {
    return absl::MakeConstSpan(heads_).subspan(frames_.back().heads_begin);
  }
  // Positions of the top `max_depth` nodes of stack `head`, top first; `truncated` when the
  // stack goes deeper (or ends at a boundary).
  void StackPositions(uint32_t head, size_t max_depth, std::vector<uint32_t>* out,
                      bool* truncated) const;
  static constexpr uint32_t kBoundaryNode = 1;

  // The bytes that some stack can consume next (empty: only the end can follow, if accepting).
  const ByteSet& NextBytes() const { return frames_.back().next; }

  // A checkpoint is the number of bytes consumed; Rollback(c) returns to it (c <= Checkpoint()).
  size_t Checkpoint() const { return frames_.size() - 1; }
  void Rollback(size_t checkpoint);

  // For tests and metrics.
  size_t stack_count() const { return heads_.size() - frames_.back().heads_begin; }
  size_t node_count() const { return nodes_.size(); }
  // How many bytes were refused with kLimit so far.
  size_t limit_hits() const { return limit_hits_; }

 private:
  struct Node {
    uint32_t pos;     // next element to match (kBytes), or a return position; kNoPos for root
    uint32_t parent;  // the stack below; 0 is the empty stack
  };
  struct Frame {
    uint32_t heads_begin;  // this frame's stacks are heads_[heads_begin, next frame's begin)
    uint32_t node_end;     // nodes_.size() when the frame was made
    bool accepting;
    bool boundary;
    ByteSet next;
  };
  static constexpr uint32_t kNoPos = ~uint32_t{0};

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar, const MatcherLimits& limits);

  // Expands the pending (position, parent) work into stacks appended to heads_.
  Step Expand();
  // Closes the frame whose heads start at `begin`: dedupes them, computes next bytes.
  Step FinishFrame(uint32_t begin, uint32_t node_mark);
  uint32_t Intern(uint32_t pos, uint32_t parent);
  void TruncateNodes(uint32_t size);
  void Rehash(size_t capacity);
  size_t Slot(uint32_t pos, uint32_t parent) const;

  std::shared_ptr<const Grammar> grammar_;
  MatcherLimits limits_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> table_;  // open addressing, linear probing; 0 = empty slot
  std::vector<uint32_t> heads_;
  std::vector<Frame> frames_;
  std::vector<Node> work_;  // reused expansion worklist
  // Items expanded in the current step (generation-stamped open addressing), so an item that
  // many paths reach is expanded once: ambiguous grammars cost their distinct items, not paths.
  bool FirstVisit(uint32_t pos, uint32_t parent);
  void NewStep();
  std::vector<uint64_t> seen_keys_;
  std::vector<uint32_t> seen_gen_;
  uint32_t generation_ = 0;
  size_t seen_count_ = 0;
  size_t expansions_ = 0;
  bool over_limit_ = false;
  size_t limit_hits_ = 0;
};

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_GRAMMAR_MATCHER_H_
