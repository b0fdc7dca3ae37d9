// JSON Schema lowered to GBNF: the grammar of the JSON documents a schema accepts, as one text
// the router validates and the worker compiles (docs/design/grammar.md, "JSON Schema").
//
// The subset (2020-12, with drafts 4-7's `definitions`, tuple `items` and `additionalItems`):
// `type` (one or an array), `properties`, `required`, `additionalProperties`, `items`,
// `prefixItems`, `minItems`/`maxItems`, `minLength`/`maxLength`, `enum`, `const`, `anyOf`,
// `oneOf` (only when its branches are provably disjoint), `allOf` (merged when the branches
// combine keyword by keyword), `$ref` to a local JSON pointer ("#", "#/$defs/...",
// "#/definitions/...", recursion included: one rule per target), `pattern` (search semantics,
// regex_to_gbnf.h), `format` (json_formats.h), and `minimum`/`maximum`/`exclusiveMinimum`/
// `exclusiveMaximum` on integers. Annotations (title, description, examples, default, ...) are
// ignored. Anything else that constrains documents is refused with InvalidArgument naming the
// keyword and its path (a JSON pointer into the schema), as are bounds on non-integer numbers
// (unless JsonSchemaOptions::allow_unenforced_number_bounds) and every limit exceeded.
//
// Policies:
//  - Canonical documents: with JsonWhitespace::kCompact no whitespace is allowed anywhere
//    outside strings (Python's json.dumps(separators=(",", ":"), ensure_ascii=False)); kBounded
//    allows up to `max_whitespace` of [ \t\n] around each structural character.
//  - Property order: as listed in `properties`; required ones always present, optional ones
//    present or absent, in that order; then the additional properties, if allowed. A schema
//    without `additionalProperties` allows none unless `additional_properties_by_default`.
//  - A schema with no `type` takes its type from its keywords (`properties` -> object, `items`
//    -> array, `pattern` -> string, ...), else any JSON value.
//  - Numbers are JSON numbers; `integer` is an integer literal (no fraction, no exponent).
//  - `enum`/`const` values are matched in their canonical compact serialisation.
//
// Pure functions; thread-safe.

#ifndef FERRY_ENGINE_GRAMMAR_JSON_SCHEMA_H_
#define FERRY_ENGINE_GRAMMAR_JSON_SCHEMA_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/regex_to_gbnf.h"
#include "nlohmann/json.hpp"

namespace ferry::grammar {

enum class JsonWhitespace {
  kCompact,  // none outside strings
  kBounded,  // up to max_whitespace of [ \t\n] around structural characters
};

struct JsonSchemaOptions {
  JsonWhitespace whitespace = JsonWhitespace::kCompact;
  int max_whitespace = 2;
  // What a schema without `additionalProperties` allows beyond its `properties`.
  bool additional_properties_by_default = false;
  // Accept minimum/maximum on non-integer numbers without enforcing them (else InvalidArgument).
  bool allow_unenforced_number_bounds = false;

  // Limits, each a clear InvalidArgument when exceeded.
  int max_depth = 64;                  // nesting of subschemas (and merges through $ref)
  int max_enum_values = 4096;          // values in one `enum`
  int max_refs = 1024;                 // distinct `$ref` targets
  int max_repeat = 10000;              // minItems/maxItems/minLength/maxLength bounds
  int max_steps = 200000;              // subschemas compiled (stops blow-ups)
  size_t max_grammar_bytes = 4 << 20;  // the GBNF text produced
  size_t max_schema_bytes = 4 << 20;   // the schema text (JsonSchemaTextToGbnf)
  RegexLimits regex;                   // for each `pattern`
};

// The GBNF grammar (`root ::= ...`) of the documents `schema` accepts. Ordered JSON, so the
// order of `properties` is the one the schema lists.
absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema,
                                             const JsonSchemaOptions& options = {});

// The same from the schema's JSON text (InvalidArgument when it does not parse).
absl::StatusOr<std::string> JsonSchemaTextToGbnf(absl::string_view schema_json,
                                                 const JsonSchemaOptions& options = {});

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_JSON_SCHEMA_H_
