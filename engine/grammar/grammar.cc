#include "engine/grammar/grammar.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ferry::grammar {
namespace {

std::string ByteSetString(const ByteSet& set) {
  std::string out = "[";
  for (int b = 0; b < 256; ++b) {
    if (!set.Contains(static_cast<uint8_t>(b))) continue;
    int e = b;
    while (e + 1 < 256 && set.Contains(static_cast<uint8_t>(e + 1))) ++e;
    if (b >= 0x21 && b < 0x7f && b != '\\' && b != ']' && b != '-') {
      out += static_cast<char>(b);
    } else {
      absl::StrAppendFormat(&out, "\\x%02X", b);
    }
    if (e > b) {
      out += "-";
      if (e >= 0x21 && e < 0x7f && e != '\\' && e != ']' && e != '-') {
        out += static_cast<char>(e);
      } else {
        absl::StrAppendFormat(&out, "\\x%02X", e);
      }
    }
    b = e;
  }
  return out + "]";
}

}  // namespace

absl::Status Grammar::Validate() {
  if (root >= rules.size()) return absl::InvalidArgumentError("grammar has no root rule");
  for (const Rule& rule : rules) {
    for (uint32_t start : rule.alternatives) {
      uint32_t p = start;
      while (true) {
        if (p >= elements.size()) {
          return absl::InternalError(absl::StrCat("rule ", rule.name, " runs off the elements"));
        }
        const Element& e = elements[p];
        if (e.kind == Element::kEnd) break;
        if (e.kind == Element::kRule && e.value >= rules.size()) {
          return absl::InternalError(
              absl::StrCat("rule ", rule.name, " refers to rule ", e.value, " of ", rules.size()));
        }
        if (e.kind == Element::kBytes && e.value >= byte_sets.size()) {
          return absl::InternalError(absl::StrCat("rule ", rule.name, " has a bad byte set"));
        }
        ++p;
      }
    }
  }
  // Nullable rules, to a fixed point.
  nullable.assign(rules.size(), false);
  bool changed = true;
  while (changed) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (nullable[r]) continue;
      for (uint32_t start : rules[r].alternatives) {
        bool all = true;
        for (uint32_t p = start; elements[p].kind != Element::kEnd; ++p) {
          const Element& e = elements[p];
          if (e.kind == Element::kBytes || !nullable[e.value]) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  // Left edges: R -> S when S can come first in R (after nullable rules only).
  std::vector<std::vector<uint32_t>> left(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    for (uint32_t start : rules[r].alternatives) {
      for (uint32_t p = start; elements[p].kind == Element::kRule; ++p) {
        left[r].push_back(elements[p].value);
        if (!nullable[elements[p].value]) break;
      }
    }
  }
  // Iterative DFS for a cycle; colors: 0 new, 1 on the path, 2 done.
  std::vector<uint8_t> color(rules.size(), 0);
  std::vector<std::pair<uint32_t, size_t>> path;
  for (uint32_t start = 0; start < rules.size(); ++start) {
    if (color[start] != 0) continue;
    path.push_back({start, 0});
    color[start] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == left[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      uint32_t s = left[r][next++];
      if (color[s] == 1) {
        std::vector<std::string> names;
        bool in = false;
        for (const auto& [q, unused] : path) {
          if (q == s) in = true;
          if (in) names.push_back(rules[q].name);
        }
        names.push_back(rules[s].name);
        return absl::InvalidArgumentError(
            absl::StrCat("left recursion (a rule reaches itself before matching any character; "
                         "the matcher cannot expand it): ",
                         absl::StrJoin(names, " -> ")));
      }
      if (color[s] == 0) {
        color[s] = 1;
        path.push_back({s, 0});
      }
    }
  }
  return absl::OkStatus();
}

std::string Grammar::DebugString() const {
  std::string out;
  for (size_t r = 0; r < rules.size(); ++r) {
    absl::StrAppend(&out, rules[r].name, " ::=");
    for (size_t a = 0; a < rules[r].alternatives.size(); ++a) {
      if (a > 0) out += " |";
      for (uint32_t p = rules[r].alternatives[a]; elements[p].kind != Element::kEnd; ++p) {
        const Element& e = elements[p];
        out += " ";
        if (e.kind == Element::kRule) {
          out += rules[e.value].name;
        } else {
          out += ByteSetString(byte_sets[e.value]);
        }
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace ferry::grammar
