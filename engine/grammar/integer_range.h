// Integer intervals as GBNF: the decimal literals (JSON's form: no leading zeros, "-" for
// negatives, no "-0") of the integers in [min, max], either end optional (unbounded).
//
// Pure function; thread-safe.

#ifndef FERRY_ENGINE_GRAMMAR_INTEGER_RANGE_H_
#define FERRY_ENGINE_GRAMMAR_INTEGER_RANGE_H_

#include <cstdint>
#include <optional>
#include <string>

namespace ferry::grammar {

// A GBNF expression for the integers in [min, max]; min <= max when both are given.
std::string IntegerRangeGbnf(std::optional<int64_t> min, std::optional<int64_t> max);

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_INTEGER_RANGE_H_
