#include "engine/grammar/grammar_matcher.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry::grammar {
namespace {

inline uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, const MatcherLimits& limits)
    : grammar_(std::move(grammar)), limits_(limits) {}

absl::StatusOr<GrammarMatcher> GrammarMatcher::Create(std::shared_ptr<const Grammar> grammar,
                                                      const MatcherLimits& limits) {
  if (grammar == nullptr || grammar->root >= grammar->rules.size()) {
    return absl::InvalidArgumentError("matcher needs a validated grammar");
  }
  GrammarMatcher m(std::move(grammar), limits);
  m.nodes_.push_back(Node{kNoPos, 0});  // 0: the empty stack
  m.nodes_.push_back(Node{kNoPos, 0});  // 1: the boundary of a truncated stack (CreateAt)
  m.Rehash(1024);
  m.expansions_ = 0;
  m.over_limit_ = false;
  m.NewStep();
  for (uint32_t alt : m.grammar_->rules[m.grammar_->root].alternatives) {
    m.work_.push_back(Node{alt, 0});
  }
  Step step = m.Expand();
  if (step == Step::kOk) step = m.FinishFrame(0, 2);
  if (step == Step::kLimit) {
    return absl::ResourceExhaustedError(
        "the grammar's start state exceeds the matcher's limits (stacks or expansions)");
  }
  return m;
}

absl::StatusOr<GrammarMatcher> GrammarMatcher::CreateAt(std::shared_ptr<const Grammar> grammar,
                                                        absl::Span<const uint32_t> positions,
                                                        bool truncated,
                                                        const MatcherLimits& limits) {
  if (grammar == nullptr || positions.empty() || positions[0] >= grammar->elements.size() ||
      grammar->elements[positions[0]].kind != Element::kBytes) {
    return absl::InvalidArgumentError("CreateAt needs a stack whose top is a byte set");
  }
  GrammarMatcher m(std::move(grammar), limits);
  m.nodes_.push_back(Node{kNoPos, 0});
  m.nodes_.push_back(Node{kNoPos, 0});
  m.Rehash(1024);
  uint32_t parent = truncated ? kBoundaryNode : 0;
  for (size_t i = positions.size(); i-- > 0;) {
    if (positions[i] >= m.grammar_->elements.size()) {
      return absl::InvalidArgumentError("CreateAt: a position outside the grammar");
    }
    parent = m.Intern(positions[i], parent);
  }
  m.heads_.push_back(parent);
  Step step = m.FinishFrame(0, static_cast<uint32_t>(m.nodes_.size()));
  if (step != Step::kOk) return absl::ResourceExhaustedError("CreateAt: over the limits");
  return m;
}

void GrammarMatcher::StackPositions(uint32_t head, size_t max_depth, std::vector<uint32_t>* out,
                                    bool* truncated) const {
  out->clear();
  uint32_t n = head;
  while (n > kBoundaryNode && out->size() < max_depth) {
    out->push_back(nodes_[n].pos);
    n = nodes_[n].parent;
  }
  *truncated = n != 0;
}

void GrammarMatcher::NewStep() {
  seen_count_ = 0;
  if (++generation_ == 0) {  // wrapped: clear the stamps once
    std::fill(seen_gen_.begin(), seen_gen_.end(), 0);
    generation_ = 1;
  }
}

size_t GrammarMatcher::Slot(uint32_t pos, uint32_t parent) const {
  return Mix((uint64_t{pos} << 32) | parent) & (table_.size() - 1);
}

void GrammarMatcher::Rehash(size_t capacity) {
  table_.assign(capacity, 0);
  // Reinserting in id order keeps the table as if built in insertion order, which LIFO
  // deletion relies on.
  for (uint32_t id = 1; id < nodes_.size(); ++id) {
    size_t s = Slot(nodes_[id].pos, nodes_[id].parent);
    while (table_[s] != 0) s = (s + 1) & (table_.size() - 1);
    table_[s] = id;
  }
}

uint32_t GrammarMatcher::Intern(uint32_t pos, uint32_t parent) {
  size_t mask = table_.size() - 1;
  size_t s = Slot(pos, parent);
  while (table_[s] != 0) {
    const Node& n = nodes_[table_[s]];
    if (n.pos == pos && n.parent == parent) return table_[s];
    s = (s + 1) & mask;
  }
  if (nodes_.size() >= limits_.max_nodes) {
    over_limit_ = true;
    return 0;
  }
  uint32_t id = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back(Node{pos, parent});
  table_[s] = id;
  if (nodes_.size() * 2 > table_.size()) Rehash(table_.size() * 2);
  return id;
}

void GrammarMatcher::TruncateNodes(uint32_t size) {
  // Deleting the most recently inserted key of a linear-probing table is clearing its slot:
  // every key inserted after it is gone already, and no older key probed past it.
  size_t mask = table_.size() - 1;
  while (nodes_.size() > size) {
    const Node& n = nodes_.back();
    uint32_t id = static_cast<uint32_t>(nodes_.size() - 1);
    size_t s = Slot(n.pos, n.parent);
    while (table_[s] != id) s = (s + 1) & mask;
    table_[s] = 0;
    nodes_.pop_back();
  }
}

bool GrammarMatcher::FirstVisit(uint32_t pos, uint32_t parent) {
  if (seen_keys_.empty() || (seen_count_ + 1) * 2 > seen_keys_.size()) {
    // Grow (or start): a fresh table, so this step's earlier items are forgotten; that only
    // costs repeated work, never a wrong result.
    size_t cap = seen_keys_.empty() ? 1024 : seen_keys_.size() * 2;
    seen_keys_.assign(cap, 0);
    seen_gen_.assign(cap, 0);
    generation_ = 1;
    seen_count_ = 0;
  }
  uint64_t key = (uint64_t{pos} << 32) | parent;
  size_t mask = seen_keys_.size() - 1;
  size_t s = Mix(key) & mask;
  while (seen_gen_[s] == generation_) {
    if (seen_keys_[s] == key) return false;
    s = (s + 1) & mask;
  }
  seen_gen_[s] = generation_;
  seen_keys_[s] = key;
  ++seen_count_;
  return true;
}

GrammarMatcher::Step GrammarMatcher::Expand() {
  const Grammar& g = *grammar_;
  while (!work_.empty()) {
    Node item = work_.back();
    work_.pop_back();
    const Element& e = g.elements[item.pos];
    // Byte-set items become stacks, deduplicated when the frame closes; the others are
    // expanded once per step.
    if (e.kind != Element::kBytes && !FirstVisit(item.pos, item.parent)) continue;
    if (++expansions_ > limits_.max_expansions) {
      work_.clear();
      return Step::kLimit;
    }
    switch (e.kind) {
      case Element::kEnd:
        if (item.parent <= kBoundaryNode) {
          heads_.push_back(item.parent);
        } else {
          work_.push_back(nodes_[item.parent]);
        }
        break;
      case Element::kBytes:
        heads_.push_back(Intern(item.pos, item.parent));
        break;
      case Element::kRule: {
        uint32_t cont = g.elements[item.pos + 1].kind == Element::kEnd
                            ? item.parent
                            : Intern(item.pos + 1, item.parent);
        const std::vector<uint32_t>& alts = g.rules[e.value].alternatives;
        for (size_t i = alts.size(); i-- > 0;) work_.push_back(Node{alts[i], cont});
        break;
      }
    }
    if (over_limit_) {
      work_.clear();
      return Step::kLimit;
    }
  }
  return Step::kOk;
}

GrammarMatcher::Step GrammarMatcher::FinishFrame(uint32_t begin, uint32_t node_mark) {
  auto first = heads_.begin() + begin;
  std::sort(first, heads_.end());
  heads_.erase(std::unique(first, heads_.end()), heads_.end());
  if (heads_.size() - begin > limits_.max_stacks) return Step::kLimit;
  if (heads_.size() == begin) return Step::kRejected;
  Frame f;
  f.heads_begin = begin;
  f.node_end = static_cast<uint32_t>(nodes_.size());
  f.accepting = heads_[begin] == 0;
  size_t first_stack = begin + (f.accepting ? 1 : 0);
  f.boundary = first_stack < heads_.size() && heads_[first_stack] == kBoundaryNode;
  if (f.boundary) ++first_stack;
  const Grammar& g = *grammar_;
  for (size_t i = first_stack; i < heads_.size(); ++i) {
    f.next.Union(g.byte_sets[g.elements[nodes_[heads_[i]].pos].value]);
  }
  (void)node_mark;
  frames_.push_back(f);
  return Step::kOk;
}

GrammarMatcher::Step GrammarMatcher::Advance(uint8_t byte) {
  const Frame& cur = frames_.back();
  if (!cur.next.Contains(byte)) return Step::kRejected;
  const Grammar& g = *grammar_;
  uint32_t begin = static_cast<uint32_t>(heads_.size());
  uint32_t node_mark = static_cast<uint32_t>(nodes_.size());
  uint32_t cur_begin = cur.heads_begin;
  expansions_ = 0;
  over_limit_ = false;
  NewStep();
  Step step = Step::kOk;
  for (uint32_t i = cur_begin; i < begin; ++i) {
    uint32_t h = heads_[i];
    if (h <= kBoundaryNode) continue;
    Node n = nodes_[h];
    if (!g.byte_sets[g.elements[n.pos].value].Contains(byte)) continue;
    work_.push_back(Node{n.pos + 1, n.parent});
    step = Expand();
    if (step != Step::kOk) break;
  }
  if (step == Step::kOk) step = FinishFrame(begin, node_mark);
  if (step != Step::kOk) {
    heads_.resize(begin);
    TruncateNodes(node_mark);
    if (step == Step::kLimit) ++limit_hits_;
  }
  return step;
}

GrammarMatcher::Step GrammarMatcher::AdvanceBytes(absl::string_view bytes) {
  size_t start = Checkpoint();
  for (char c : bytes) {
    Step step = Advance(static_cast<uint8_t>(c));
    if (step != Step::kOk) {
      Rollback(start);
      return step;
    }
  }
  return Step::kOk;
}

void GrammarMatcher::Rollback(size_t checkpoint) {
  if (checkpoint >= Checkpoint()) return;
  const Frame& next = frames_[checkpoint + 1];
  heads_.resize(next.heads_begin);
  TruncateNodes(frames_[checkpoint].node_end);
  frames_.resize(checkpoint + 1);
}

}  // namespace ferry::grammar
