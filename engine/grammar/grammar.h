// Grammar: the compiled form of a context-free grammar over bytes, what the matcher runs.
//
// The GBNF parser (gbnf_parser.h) lowers llama.cpp's dialect to this IR: a list of rules, each a
// list of alternatives, each a sequence of elements. An element is either a byte set (a 256-bit
// class: code points are lowered to their UTF-8 byte sequences, so matching is byte by byte) or a
// reference to a rule. Repetitions and groups become generated rules (`x*` is `r ::= x r | ""`),
// so the matcher knows only sequences, alternation and rule references.
//
// Layout is flat for the matcher's hot path: all alternatives' elements live in one array, each
// alternative ended by an kEnd element, and a position in a grammar is an index into it.
//
// Validate() checks the invariants the matcher relies on: every reference defined, the root
// present, and no left recursion (a rule reaching itself before consuming a byte, also through
// rules that can match the empty string), which a pushdown matcher would expand forever.
//
// Immutable once built; thread-safe to share (const).

#ifndef FERRY_ENGINE_GRAMMAR_GRAMMAR_H_
#define FERRY_ENGINE_GRAMMAR_GRAMMAR_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ferry::grammar {

// A set of bytes, one bit per byte value.
struct ByteSet {
  std::array<uint64_t, 4> bits{};

  bool Contains(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  void Union(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i];
  }
  bool Empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const ByteSet& o) const { return bits == o.bits; }
};

struct Element {
  enum Kind : uint8_t { kEnd, kBytes, kRule };
  Kind kind = kEnd;
  // kBytes: index into Grammar::byte_sets. kRule: the rule's index.
  uint32_t value = 0;
};

struct Rule {
  std::string name;  // user rules: their name; generated ones: what made them ("root/rep@3:7")
  bool generated = false;
  // Start positions (indices into Grammar::elements) of the alternatives.
  std::vector<uint32_t> alternatives;
};

struct Grammar {
  std::vector<Rule> rules;
  std::vector<Element> elements;
  std::vector<ByteSet> byte_sets;
  uint32_t root = 0;

  // Checks references, the root and left recursion; fills `nullable`.
  absl::Status Validate();
  // Per rule: whether it can match the empty string (set by Validate).
  std::vector<bool> nullable;

  // A readable dump (one rule per line), for tests and debugging.
  std::string DebugString() const;
};

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_GRAMMAR_H_
