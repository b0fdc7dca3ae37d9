// The bounded JSON parser: the same documents as ordered_json::parse (key order, numbers' types,
// duplicate keys: last value at the first position), large objects and arrays within the limits,
// each limit refused at its first excess with where it was met, and syntax errors as nlohmann
// words them.

#include "router/api/bounded_json.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

Json Parse(const std::string& text, const JsonLimits& limits = {}) {
  Json out;
  absl::Status s = ParseBoundedJson(text, limits, &out);
  EXPECT_TRUE(s.ok()) << s << " for " << text.substr(0, 200);
  return out;
}

JsonParseError Refuse(const std::string& text, const JsonLimits& limits) {
  Json out;
  JsonParseError error;
  absl::Status s = ParseBoundedJson(text, limits, &out, &error);
  EXPECT_FALSE(s.ok()) << text.substr(0, 200);
  EXPECT_EQ(s.message(), error.message);
  return error;
}

TEST(BoundedJsonTest, DocumentsAreWhatOrderedJsonParseGives) {
  for (const std::string text : {
           R"({"z": 1, "a": [true, false, null], "m": {"y": -3, "b": 18446744073709551615}})",
           R"([1.5, -0.0, 1e300, "\u00e9\ud83d\ude00", "", {}, [], [[[]]]])",
           R"("just a string")",
           R"(42)",
           R"({"k": {"k": {"k": [1, {"k": 2}]}}, "": ""})",
       }) {
    const Json got = Parse(text);
    const Json want = Json::parse(text);
    EXPECT_EQ(got, want) << text;
    EXPECT_EQ(got.dump(), want.dump()) << text;  // key order and number types too
  }
  const Json numbers = Parse(R"([-1, 1, 1.0])");
  EXPECT_TRUE(numbers[0].is_number_integer() && !numbers[0].is_number_unsigned());
  EXPECT_TRUE(numbers[1].is_number_unsigned());
  EXPECT_TRUE(numbers[2].is_number_float());
}

TEST(BoundedJsonTest, ADuplicateKeyTakesItsLastValueAtItsFirstPosition) {
  // As ordered_json::parse and Python's json.loads: small objects (a scan) and large ones (the
  // hash index) alike.
  for (int extra : {0, 20}) {
    std::string text = R"({"a": 1, "b": {"x": [1, 2]}, )";
    for (int i = 0; i < extra; ++i) absl::StrAppend(&text, "\"k", i, "\": ", i, ", ");
    text += R"("b": [3], "c": 4, "a": 5})";
    const Json got = Parse(text);
    EXPECT_EQ(got.dump(), Json::parse(text).dump()) << text;
    EXPECT_EQ(got.begin().key(), "a");
    EXPECT_EQ(got["a"], 5);
    EXPECT_EQ(got["b"], Json::array({3}));
    EXPECT_EQ(got.size(), 3u + extra);
  }
}

TEST(BoundedJsonTest, LargeObjectsAndArraysParseWithinTheLimits) {
  std::string object = "{";
  for (int i = 0; i < 300000; ++i) absl::StrAppend(&object, i == 0 ? "" : ",", "\"", i, "\":1");
  object += "}";
  const Json o = Parse(object);
  ASSERT_EQ(o.size(), 300000u);
  int expected = 0;
  for (auto it = o.begin(); it != o.end(); ++it) {
    ASSERT_EQ(it.key(), std::to_string(expected++));  // the text's order
  }
  std::string array = "[";
  for (int i = 0; i < 1000000; ++i) array += i == 0 ? "7" : ",7";
  array += "]";
  EXPECT_EQ(Parse(array).size(), 1000000u);
}

TEST(BoundedJsonTest, EachLimitIsRefusedWhereItIsMet) {
  JsonLimits limits;
  limits.max_depth = 4;
  limits.max_values = 10;
  limits.max_string_bytes = 5;

  EXPECT_TRUE(Parse(R"({"a": [[{"b": 1}]]})", limits).is_object());  // depth 4
  JsonParseError deep = Refuse(R"({"a": [1, [{"b": [1]}]]})", limits);
  EXPECT_EQ(deep.kind, JsonParseError::Kind::kDepth);
  EXPECT_EQ(deep.path, "a[1][0].b");
  EXPECT_NE(deep.message.find("deeper than 4"), std::string::npos) << deep.message;
  const std::string very_deep = std::string(1000000, '[') + std::string(1000000, ']');
  JsonParseError very = Refuse(very_deep, JsonLimits{});
  EXPECT_EQ(very.kind, JsonParseError::Kind::kDepth);
  EXPECT_EQ(very.path, "[0][0][0][0][0][0][0][0]...");  // a path names 8 keys or indices at most

  // 10 keys and elements in all pass; the 11th does not (duplicates count).
  EXPECT_TRUE(Parse(R"({"a": [1, 2, 3], "b": {"c": 1, "d": [1, 2, 3]}})", limits).is_object());
  JsonParseError many = Refuse(R"({"a": [1, 2, 3], "b": {"c": 1, "d": [1, 2, 3, 4]}})", limits);
  EXPECT_EQ(many.kind, JsonParseError::Kind::kValues);
  EXPECT_EQ(many.path, "b.d");
  EXPECT_NE(many.message.find("more than 10 keys and array elements"), std::string::npos);
  EXPECT_EQ(
      Refuse(R"({"a":1,"a":1,"a":1,"a":1,"a":1,"a":1,"a":1,"a":1,"a":1,"a":1,"a":1})", limits).kind,
      JsonParseError::Kind::kValues);

  EXPECT_TRUE(Parse(R"({"abcde": "vwxyz"})", limits).is_object());
  JsonParseError long_value = Refuse(R"({"a": {"b": ["x", "toolong"]}})", limits);
  EXPECT_EQ(long_value.kind, JsonParseError::Kind::kStringBytes);
  EXPECT_EQ(long_value.path, "a.b[1]");
  EXPECT_NE(long_value.message.find("a string longer than 5 bytes"), std::string::npos);
  JsonParseError long_key = Refuse(R"({"a": {"toolong": 1}})", limits);
  EXPECT_EQ(long_key.kind, JsonParseError::Kind::kStringBytes);
  EXPECT_EQ(long_key.path, "a");
  EXPECT_NE(long_key.message.find("a key longer than 5 bytes"), std::string::npos);
  // Decoded bytes: an escape counts as what it stands for.
  EXPECT_TRUE(Parse(R"(["\u00e9\u00e9"])", limits).is_array());
}

TEST(BoundedJsonTest, SyntaxErrorsSayWhatNlohmannSays) {
  for (const std::string text : {"", "{", R"({"a" 1})", "[1,]", "{} x", "[1e999]", "\"\xff\""}) {
    JsonParseError e = Refuse(text, JsonLimits{});
    EXPECT_EQ(e.kind, JsonParseError::Kind::kSyntax) << text;
    EXPECT_NE(e.message.find("[json.exception."), std::string::npos) << e.message;
  }
  // 1e999 is out of range, as nlohmann says.
  EXPECT_NE(Refuse("[1e999]", JsonLimits{}).message.find("number overflow"), std::string::npos);
}

}  // namespace
}  // namespace ferry
