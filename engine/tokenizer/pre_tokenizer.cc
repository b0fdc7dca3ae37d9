#include "engine/tokenizer/pre_tokenizer.h"

#include <utility>

#include "absl/strings/str_replace.h"
#include "engine/common/status.h"

namespace ferry {
namespace {

// Splits `piece` by the matches of `regex` according to `behavior` (HF's
// NormalizedString::split), appending the [begin, end) ranges (relative to `piece`) of the
// resulting non-empty pieces, in order.
absl::Status SplitByRegex(absl::string_view piece, const UnicodeRegex& regex,
                          SplitBehavior behavior, bool invert,
                          std::vector<std::pair<size_t, size_t>>* out) {
  std::vector<std::pair<size_t, size_t>> matches;
  RETURN_IF_ERROR(regex.FindAll(piece, &matches));
  // Segments covering the piece: (begin, end, is_delimiter).
  struct Segment {
    size_t begin, end;
    bool delimiter;
  };
  std::vector<Segment> segments;
  size_t pos = 0;
  for (const auto& [b, e] : matches) {
    if (b > pos) segments.push_back({pos, b, invert});
    segments.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < piece.size()) segments.push_back({pos, piece.size(), invert});

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out->emplace_back(b, e);
  };
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.delimiter) emit(s.begin, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Segment& s : segments) emit(s.begin, s.end);
      break;
    case SplitBehavior::kContiguous: {
      size_t i = 0;
      while (i < segments.size()) {
        size_t j = i + 1;
        if (segments[i].delimiter) {
          while (j < segments.size() && segments[j].delimiter) ++j;
        }
        emit(segments[i].begin, segments[j - 1].end);
        i = j;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      // A delimiter joins the piece before it.
      size_t start = 0;
      bool open = false;
      for (const Segment& s : segments) {
        if (s.delimiter) {
          emit(open ? start : s.begin, s.end);
          open = false;
        } else {
          if (open) emit(start, s.begin);
          start = s.begin;
          open = true;
        }
      }
      if (open) emit(start, piece.size());
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // A delimiter joins the piece after it.
      size_t start = 0;
      bool pending = false;
      for (const Segment& s : segments) {
        if (s.delimiter) {
          if (pending) emit(start, s.begin);
          start = s.begin;
          pending = true;
        } else {
          emit(pending ? start : s.begin, s.end);
          pending = false;
        }
      }
      if (pending) emit(start, piece.size());
      break;
    }
  }
  return absl::OkStatus();
}

// The same, as strings.
absl::Status SplitByRegex(const std::string& piece, const UnicodeRegex& regex,
                          SplitBehavior behavior, bool invert, std::vector<std::string>* out) {
  std::vector<std::pair<size_t, size_t>> ranges;
  RETURN_IF_ERROR(SplitByRegex(absl::string_view(piece), regex, behavior, invert, &ranges));
  for (const auto& [b, e] : ranges) out->push_back(piece.substr(b, e - b));
  return absl::OkStatus();
}

}  // namespace

PreTokenizer::PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {
  for (const PreTokenizerStep& step : steps_) {
    if (step.kind == PreTokenizerStep::Kind::kMetaspace ||
        (step.kind == PreTokenizerStep::Kind::kByteLevel && step.add_prefix_space)) {
      splits_only_ = false;
    }
  }
}

absl::Status PreTokenizer::SplitRanges(absl::string_view text,
                                       std::vector<std::pair<size_t, size_t>>* ranges) const {
  std::vector<std::pair<size_t, size_t>> current = {{0, text.size()}}, next, pieces;
  for (const PreTokenizerStep& step : steps_) {
    if (step.regex == nullptr) continue;  // ByteLevel without its regex: no split
    const bool split = step.kind == PreTokenizerStep::Kind::kSplit;
    next.clear();
    for (const auto& [begin, end] : current) {
      pieces.clear();
      RETURN_IF_ERROR(SplitByRegex(text.substr(begin, end - begin), *step.regex,
                                   split ? step.behavior : SplitBehavior::kIsolated,
                                   split && step.invert, &pieces));
      for (const auto& [b, e] : pieces) next.emplace_back(begin + b, begin + e);
    }
    current.swap(next);
  }
  for (const auto& r : current) {
    if (r.second > r.first) ranges->push_back(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<PreTokenizerStep> PreTokenizer::SplitStep(absl::string_view pattern,
                                                         SplitBehavior behavior, bool invert) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kSplit;
  ASSIGN_OR_RETURN(std::unique_ptr<UnicodeRegex> regex, UnicodeRegex::Compile(pattern));
  step.regex = std::move(regex);
  step.behavior = behavior;
  step.invert = invert;
  return step;
}

absl::StatusOr<PreTokenizerStep> PreTokenizer::DigitsStep(bool individual_digits) {
  // HF's Digits splits on char::is_numeric(): Unicode categories Nd, Nl and No, i.e. \p{N}.
  return SplitStep("\\p{N}",
                   individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                   /*invert=*/false);
}

absl::StatusOr<PreTokenizerStep> PreTokenizer::ByteLevelStep(bool add_prefix_space,
                                                             bool use_regex) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  step.add_prefix_space = add_prefix_space;
  if (use_regex) {
    ASSIGN_OR_RETURN(std::unique_ptr<UnicodeRegex> regex, UnicodeRegex::Compile(kGpt2Pattern));
    step.regex = std::move(regex);
  }
  return step;
}

absl::Status PreTokenizer::Split(absl::string_view text, bool at_start,
                                 std::vector<std::string>* pieces) const {
  std::vector<std::string> current = {std::string(text)};
  std::vector<std::string> next;
  for (const PreTokenizerStep& step : steps_) {
    next.clear();
    for (size_t i = 0; i < current.size(); ++i) {
      std::string& piece = current[i];
      switch (step.kind) {
        case PreTokenizerStep::Kind::kSplit:
          RETURN_IF_ERROR(SplitByRegex(piece, *step.regex, step.behavior, step.invert, &next));
          break;
        case PreTokenizerStep::Kind::kByteLevel:
          if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, " ");
          if (step.regex != nullptr) {
            RETURN_IF_ERROR(
                SplitByRegex(piece, *step.regex, SplitBehavior::kIsolated, false, &next));
          } else {
            next.push_back(std::move(piece));
          }
          break;
        case PreTokenizerStep::Kind::kMetaspace: {
          std::string replaced = absl::StrReplaceAll(piece, {{" ", step.replacement}});
          const bool prepend = step.prepend_scheme == PrependScheme::kAlways ||
                               (step.prepend_scheme == PrependScheme::kFirst && at_start && i == 0);
          if (prepend && replaced.compare(0, step.replacement.size(), step.replacement) != 0) {
            replaced.insert(0, step.replacement);
          }
          if (step.split) {
            // Split before every replacement character (HF: MergedWithNext on the character).
            size_t start = 0;
            size_t at = replaced.find(step.replacement, 1);
            while (at != std::string::npos) {
              if (at > start) next.push_back(replaced.substr(start, at - start));
              start = at;
              at = replaced.find(step.replacement, at + step.replacement.size());
            }
            if (start < replaced.size()) next.push_back(replaced.substr(start));
          } else if (!replaced.empty()) {
            next.push_back(std::move(replaced));
          }
          break;
        }
      }
    }
    current.swap(next);
  }
  for (std::string& piece : current) {
    if (!piece.empty()) pieces->push_back(std::move(piece));
  }
  return absl::OkStatus();
}

}  // namespace ferry
