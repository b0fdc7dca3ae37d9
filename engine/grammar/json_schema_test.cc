// Unit tests of the JSON Schema compiler's output shape, policies and errors. Acceptance of
// documents is checked against llguidance and jsonschema in json_schema_reference_test.
#include "engine/grammar/json_schema.h"

#include <gtest/gtest.h>

#include <string>

namespace ferry::grammar {
namespace {

std::string Compile(const std::string& schema, const JsonSchemaOptions& options = {}) {
  auto g = JsonSchemaTextToGbnf(schema, options);
  return g.ok() ? *g : "ERROR: " + std::string(g.status().message());
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(JsonSchemaTest, Primitives) {
  EXPECT_TRUE(Contains(Compile(R"({"type":"integer"})"), "root ::= json-integer\n"));
  EXPECT_TRUE(Contains(Compile(R"({"type":"boolean"})"), "root ::= (\"true\" | \"false\")\n"));
  EXPECT_EQ(Compile(R"({"const":{"a":[1,"x"]}})"), "root ::= \"{\\\"a\\\":[1,\\\"x\\\"]}\"\n");
  EXPECT_TRUE(Contains(Compile(R"({"enum":["a",null,2]})"), "\"\\\"a\\\"\" | \"null\" | \"2\""));
  EXPECT_TRUE(Contains(Compile("{}"), "root ::= json-value\n"));
  EXPECT_TRUE(Contains(Compile("true"), "root ::= json-value\n"));
}

TEST(JsonSchemaTest, ObjectPropertyOrder) {
  const std::string g = Compile(
      R"({"type":"object","properties":{"b":{"type":"null"},"a":{"type":"null"}},"required":["b"]})");
  // b first (as listed), a optional after it, nothing else (no additionalProperties).
  EXPECT_TRUE(Contains(g, "\"\\\"b\\\"\" \":\" \"null\"")) << g;
  EXPECT_TRUE(Contains(g, "\",\" \"\\\"a\\\"\" \":\" \"null\")?")) << g;
  EXPECT_FALSE(Contains(g, "key-")) << g;
}

TEST(JsonSchemaTest, CompactAndBoundedWhitespace) {
  EXPECT_FALSE(Contains(Compile(R"({"type":"array"})"), "ws"));
  JsonSchemaOptions bounded;
  bounded.whitespace = JsonWhitespace::kBounded;
  bounded.max_whitespace = 3;
  const std::string g = Compile(R"({"type":"array"})", bounded);
  EXPECT_TRUE(Contains(g, "ws ::= [ \\t\\n]{0,3}\n")) << g;
}

TEST(JsonSchemaTest, RecursiveRefIsOneRule) {
  const std::string g = Compile(R"({"$defs":{"node":{"type":"object","properties":{
      "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["next"]}},
      "$ref":"#/$defs/node"})");
  EXPECT_TRUE(Contains(g, "root ::= def-")) << g;
  EXPECT_FALSE(Contains(g, "ERROR")) << g;
}

TEST(JsonSchemaTest, OneOfNeedsDisjointBranches) {
  EXPECT_FALSE(Contains(Compile(R"({"oneOf":[{"type":"string"},{"type":"integer"}]})"), "ERROR"));
  EXPECT_FALSE(Contains(Compile(R"({"oneOf":[{"const":1},{"const":2}]})"), "ERROR"));
  EXPECT_FALSE(Contains(Compile(R"({"oneOf":[
      {"type":"object","properties":{"k":{"const":"a"}},"required":["k"]},
      {"type":"object","properties":{"k":{"const":"b"}},"required":["k"]}]})"),
                        "ERROR"));
  const std::string g = Compile(R"({"oneOf":[{"type":"number"},{"type":"integer"}]})");
  EXPECT_TRUE(Contains(g,
                       "ERROR: JSON Schema at '#/oneOf': oneOf branches 0 and 1 are not "
                       "provably disjoint"))
      << g;
}

TEST(JsonSchemaTest, AllOfMerges) {
  const std::string g = Compile(R"({"allOf":[
      {"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
      {"properties":{"b":{"type":"string"}},"required":["b"]}]})");
  EXPECT_TRUE(Contains(g, "\\\"a\\\"")) << g;
  EXPECT_TRUE(Contains(g, "\\\"b\\\"")) << g;
  EXPECT_TRUE(Contains(Compile(R"({"allOf":[{"pattern":"a"},{"pattern":"b"}]})"),
                       "cannot combine the branches' different 'pattern'"));
}

TEST(JsonSchemaTest, Errors) {
  struct Case {
    const char* schema;
    const char* message;
  };
  const Case cases[] = {
      {R"({"type":"object","properties":{"a":{"not":{}}}})",
       "at '#/properties/a': keyword 'not' is not supported"},
      {R"({"type":"string","pattern":"(a)\\1"})",
       "at '#/pattern': regex \"(a)\\1\" uses a backreference"},
      {R"({"type":"string","pattern":"(?=x)y"})", "lookaround"},
      {R"({"type":"string","format":"hostname"})", "format 'hostname' is not supported"},
      {R"({"$ref":"http://x/y"})", "is not local"},
      {R"({"$ref":"#/$defs/missing"})", "points at nothing"},
      {R"({"type":"frog"})", "unknown type"},
      {R"({"type":"number","minimum":0.5})", "cannot be enforced"},
      {R"({"type":"number","minimum":-1,"maximum":1})", "cannot be enforced"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "no integer lies within the bounds"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
      {R"({"type":"array","minItems":3,"prefixItems":[{}],"items":false})",
       "minItems cannot be met"},
      {R"({"type":"string","minLength":1,"pattern":"a"})", "with pattern are not supported"},
      {"[1,", "not valid JSON"},
      {"false", "matches nothing"},
      {R"({"$ref":"#"})", "admits no finite document"},
      {R"({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]})",
       "admits no finite document"},
  };
  for (const Case& c : cases) {
    const std::string g = Compile(c.schema);
    EXPECT_TRUE(Contains(g, "ERROR: ")) << c.schema << " -> " << g;
    EXPECT_TRUE(Contains(g, c.message)) << c.schema << " -> " << g;
  }
}

TEST(JsonSchemaTest, Limits) {
  JsonSchemaOptions small;
  small.max_enum_values = 2;
  EXPECT_TRUE(Contains(Compile(R"({"enum":[1,2,3]})", small), "over the limit of 2"));
  small.max_depth = 3;
  EXPECT_TRUE(Contains(Compile(R"({"items":{"items":{"items":{"items":{}}}}})", small),
                       "nests deeper than the limit of 3"));
  small.max_grammar_bytes = 100;
  EXPECT_TRUE(Contains(Compile(R"({"const":")" + std::string(200, 'x') + "\"}", small),
                       "exceeds the limit of 100 bytes"));
  small.max_repeat = 10;
  EXPECT_TRUE(Contains(Compile(R"({"type":"array","maxItems":11})", small), "over the limit"));
  // Exponential anyOf through $refs stays linear: each target is one rule.
  std::string defs = "\"d0\":{\"type\":\"null\"}";
  for (int i = 1; i <= 20; ++i) {
    const std::string prev = "{\"$ref\":\"#/$defs/d" + std::to_string(i - 1) + "\"}";
    defs += ",\"d" + std::to_string(i) + "\":{\"anyOf\":[" + prev +
            ",{\"type\":\"array\",\"items\":" + prev + "}]}";
  }
  const std::string g = Compile("{\"$defs\":{" + defs + "},\"$ref\":\"#/$defs/d20\"}");
  EXPECT_FALSE(Contains(g, "ERROR")) << g;
  EXPECT_LT(g.size(), 10000u);
}

TEST(JsonSchemaTest, AnnotationsIgnored) {
  EXPECT_EQ(Compile(R"({"type":"null","title":"t","description":"d","examples":[null],
                        "default":null,"$schema":"https://json-schema.org/draft/2020-12/schema"})"),
            "root ::= \"null\"\n");
}

}  // namespace
}  // namespace ferry::grammar
