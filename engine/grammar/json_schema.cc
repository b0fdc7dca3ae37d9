#include "engine/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status.h"
#include "engine/grammar/gbnf_text.h"
#include "engine/grammar/integer_range.h"
#include "engine/grammar/json_formats.h"

namespace ferry::grammar {
namespace {

using Json = nlohmann::ordered_json;

// Keywords that never constrain documents.
const std::set<std::string>& AnnotationKeywords() {
  static const std::set<std::string> k = {
      "$schema",         "$id",           "$comment",   "$anchor",  "title",     "description",
      "examples",        "default",       "deprecated", "readOnly", "writeOnly", "contentMediaType",
      "contentEncoding", "contentSchema", "$vocabulary"};
  return k;
}

// Keywords this compiler honours.
const std::set<std::string>& SupportedKeywords() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "$defs",
                                          "definitions",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "uniqueItems"};
  return k;
}

// JSON type bits, for oneOf disjointness and allOf type intersection.
enum TypeBit : unsigned {
  kNull = 1,
  kBoolean = 2,
  kObject = 4,
  kArray = 8,
  kString = 16,
  kInteger = 32,
  kFraction = 64,  // numbers that are not integers
  kAllTypes = 127,
};

std::optional<unsigned> TypeBitsOfName(const std::string& name) {
  if (name == "null") return kNull;
  if (name == "boolean") return kBoolean;
  if (name == "object") return kObject;
  if (name == "array") return kArray;
  if (name == "string") return kString;
  if (name == "integer") return kInteger;
  if (name == "number") return kInteger | kFraction;
  return std::nullopt;
}

unsigned TypeBitsOfValue(const Json& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBoolean;
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  if (v.is_number_integer() || v.is_number_unsigned()) return kInteger;
  double d = v.get<double>();
  return std::floor(d) == d ? kInteger : kFraction;
}

std::string PointerEscape(const std::string& token) {
  std::string out;
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

class Compiler {
 public:
  Compiler(const Json& root, const JsonSchemaOptions& options) : root_(root), options_(options) {}

  absl::StatusOr<std::string> Run() {
    ASSIGN_OR_RETURN(std::string expr, Compile(root_, "", 0));
    RETURN_IF_ERROR(CheckProductive());
    std::string out = absl::StrCat("root ::= ", expr, "\n");
    for (const auto& [name, body] : rules_) absl::StrAppend(&out, name, " ::= ", body, "\n");
    if (out.size() > options_.max_grammar_bytes) return GrammarTooLarge();
    return out;
  }

 private:
  static absl::Status Invalid(const std::string& path, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "JSON Schema at '", path.empty() ? "#" : absl::StrCat("#", path), "': ", what));
  }
  absl::Status GrammarTooLarge() const {
    return absl::InvalidArgumentError(absl::StrCat("JSON Schema: the grammar exceeds the limit of ",
                                                   options_.max_grammar_bytes, " bytes"));
  }

  // Whitespace allowed at a structural point: "" (compact) or " ws ".
  std::string W() {
    if (options_.whitespace == JsonWhitespace::kCompact) return " ";
    Base("ws");
    return " ws ";
  }

  // Adds a rule; returns its name.
  absl::StatusOr<std::string> AddRule(const std::string& stem, std::string body) {
    std::string name = absl::StrCat(stem, "-", rules_.size());
    grammar_bytes_ += name.size() + body.size() + 6;
    if (grammar_bytes_ > options_.max_grammar_bytes) return GrammarTooLarge();
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  // Defines one of the fixed JSON rules (and those it uses) once; returns its name.
  std::string Base(const std::string& name) {
    if (!base_done_.insert(name).second) return name;
    std::string body;
    if (name == "ws") {
      body = absl::StrCat("[ \\t\\n]{0,", options_.max_whitespace, "}");
    } else if (name == "json-value") {
      body =
          absl::StrCat(Base("json-object"), " | ", Base("json-array"), " | ", Base("json-string"),
                       " | ", Base("json-number"), " | \"true\" | \"false\" | \"null\"");
    } else if (name == "json-object") {
      const std::string w = W();
      const std::string member = absl::StrCat(Base("json-string"), w, "\":\"", w, "json-value");
      body = absl::StrCat("\"{\"", w, "(", member, " (", w, "\",\"", w, member, ")*)?", w, "\"}\"");
    } else if (name == "json-array") {
      const std::string w = W();
      body = absl::StrCat("\"[\"", w, "(json-value (", w, "\",\"", w, "json-value)*)?", w, "\"]\"");
    } else if (name == "json-string") {
      body = absl::StrCat("\"\\\"\" ", Base("json-char"), "* \"\\\"\"");
    } else if (name == "json-char") {
      body = absl::StrCat("[^\"\\\\\\x00-\\x1F] | ", JsonEscape());
    } else if (name == "json-number") {
      body = "\"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\x2D]? [0-9]+)?";
    } else if (name == "json-integer") {
      body = "\"-\"? (\"0\" | [1-9] [0-9]*)";
    }
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  // ---- Schema helpers -------------------------------------------------------------------

  absl::StatusOr<const Json*> ResolvePointer(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') {
      return Invalid(path,
                     absl::StrCat("$ref '", ref, "' is not local (only '#...' is supported)"));
    }
    const std::string pointer = ref.substr(1);
    if (!pointer.empty() && pointer[0] != '/') {
      return Invalid(path, absl::StrCat("$ref '", ref, "' is not a JSON pointer"));
    }
    try {
      const Json::json_pointer p(pointer);
      if (!root_.contains(p)) {
        return Invalid(path, absl::StrCat("$ref '", ref, "' points at nothing"));
      }
      return &root_.at(p);
    } catch (const std::exception& e) {
      return Invalid(path, absl::StrCat("$ref '", ref, "' is not a valid JSON pointer"));
    }
  }

  // Follows a chain of bare {"$ref": ...} for inspection (oneOf, allOf).
  absl::StatusOr<const Json*> Deref(const Json* schema, const std::string& path) {
    for (int i = 0; i < options_.max_depth && schema->is_object() && schema->contains("$ref");
         ++i) {
      if (!(*schema)["$ref"].is_string()) return Invalid(path, "$ref must be a string");
      ASSIGN_OR_RETURN(schema, ResolvePointer((*schema)["$ref"].get<std::string>(), path));
    }
    return schema;
  }

  static bool HasValidationKeywords(const Json& schema, absl::string_view except1,
                                    absl::string_view except2 = "") {
    for (const auto& [key, value] : schema.items()) {
      if (key == except1 || key == except2 || key == "$defs" || key == "definitions") continue;
      if (AnnotationKeywords().count(key) == 0) return true;
    }
    return false;
  }

  // The JSON types a schema can accept (a superset), for oneOf.
  absl::StatusOr<unsigned> TypeBits(const Json& schema, const std::string& path) {
    if (schema.is_boolean()) return schema.get<bool>() ? kAllTypes : 0u;
    if (schema.contains("const")) return TypeBitsOfValue(schema["const"]);
    if (schema.contains("enum") && schema["enum"].is_array()) {
      unsigned bits = 0;
      for (const Json& v : schema["enum"]) bits |= TypeBitsOfValue(v);
      return bits;
    }
    if (schema.contains("type")) return DeclaredTypes(schema["type"], path);
    return InferredTypes(schema);
  }

  absl::StatusOr<unsigned> DeclaredTypes(const Json& type, const std::string& path) {
    unsigned bits = 0;
    auto add = [&](const Json& t) -> absl::Status {
      if (!t.is_string()) return Invalid(path + "/type", "must be a string or array of strings");
      std::optional<unsigned> b = TypeBitsOfName(t.get<std::string>());
      if (!b) return Invalid(path + "/type", absl::StrCat("unknown type '", t.dump(), "'"));
      bits |= *b;
      return absl::OkStatus();
    };
    if (type.is_array()) {
      if (type.empty()) return Invalid(path + "/type", "is an empty array");
      for (const Json& t : type) RETURN_IF_ERROR(add(t));
    } else {
      RETURN_IF_ERROR(add(type));
    }
    return bits;
  }

  static unsigned InferredTypes(const Json& schema) {
    unsigned bits = 0;
    for (const char* k : {"properties", "required", "additionalProperties"}) {
      if (schema.contains(k)) bits |= kObject;
    }
    for (const char* k : {"items", "prefixItems", "additionalItems", "minItems", "maxItems"}) {
      if (schema.contains(k)) bits |= kArray;
    }
    for (const char* k : {"minLength", "maxLength", "pattern", "format"}) {
      if (schema.contains(k)) bits |= kString;
    }
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (schema.contains(k)) bits |= kInteger | kFraction;
    }
    return bits == 0 ? kAllTypes : bits;
  }

  // Values a schema is limited to (const/enum), if it is.
  static std::optional<std::vector<Json>> ValueSet(const Json& schema) {
    if (!schema.is_object()) return std::nullopt;
    if (schema.contains("const")) return std::vector<Json>{schema["const"]};
    if (schema.contains("enum") && schema["enum"].is_array()) {
      return std::vector<Json>(schema["enum"].begin(), schema["enum"].end());
    }
    return std::nullopt;
  }

  static bool ValueSetsDisjoint(const std::vector<Json>& a, const std::vector<Json>& b) {
    for (const Json& x : a) {
      for (const Json& y : b) {
        if (x == y) return false;
      }
    }
    return true;
  }

  // Whether no document can satisfy both schemas, by types, const/enum values or a property
  // both require with disjoint const/enum values (a discriminator).
  absl::StatusOr<bool> ProvablyDisjoint(const Json& a0, const Json& b0, const std::string& path) {
    ASSIGN_OR_RETURN(const Json* a, Deref(&a0, path));
    ASSIGN_OR_RETURN(const Json* b, Deref(&b0, path));
    ASSIGN_OR_RETURN(unsigned ta, TypeBits(*a, path));
    ASSIGN_OR_RETURN(unsigned tb, TypeBits(*b, path));
    if ((ta & tb) == 0) return true;
    std::optional<std::vector<Json>> va = ValueSet(*a), vb = ValueSet(*b);
    if (va && vb && ValueSetsDisjoint(*va, *vb)) return true;
    if (ta == kObject && tb == kObject && a->is_object() && b->is_object() &&
        a->contains("properties") && b->contains("properties") && a->contains("required") &&
        b->contains("required")) {
      const Json& ra = (*a)["required"];
      const Json& rb = (*b)["required"];
      for (const Json& name : ra) {
        if (!name.is_string() || std::find(rb.begin(), rb.end(), name) == rb.end()) continue;
        const std::string key = name.get<std::string>();
        const Json& pa = (*a)["properties"];
        const Json& pb = (*b)["properties"];
        if (!pa.is_object() || !pb.is_object() || !pa.contains(key) || !pb.contains(key)) continue;
        ASSIGN_OR_RETURN(const Json* sa, Deref(&pa[key], path));
        ASSIGN_OR_RETURN(const Json* sb, Deref(&pb[key], path));
        std::optional<std::vector<Json>> xa = ValueSet(*sa), xb = ValueSet(*sb);
        if (xa && xb && ValueSetsDisjoint(*xa, *xb)) return true;
      }
    }
    return false;
  }

  // allOf: two schemas combined keyword by keyword into one that accepts exactly the documents
  // both accept, or InvalidArgument where that is not simple.
  absl::Status MergeInto(Json* into, const Json& from0, const std::string& path, int depth) {
    if (depth > options_.max_depth) {
      return Invalid(path, absl::StrCat("allOf nests deeper than ", options_.max_depth));
    }
    ASSIGN_OR_RETURN(const Json* from_ptr, Deref(&from0, path));
    const Json& from = *from_ptr;
    if (from.is_boolean()) {
      if (!from.get<bool>()) return Invalid(path, "allOf has a false branch: matches nothing");
      return absl::OkStatus();
    }
    if (!from.is_object()) return Invalid(path, "allOf branch must be a schema");
    // additionalProperties sees only its own schema's properties: merging it with properties
    // from another branch would change its meaning.
    auto restricts = [](const Json& s) {
      return s.contains("additionalProperties") && s["additionalProperties"] != Json(true);
    };
    auto has_foreign_properties = [](const Json& s, const Json& other) {
      if (!s.contains("properties") || !s["properties"].is_object()) return false;
      for (const auto& [key, sub] : s["properties"].items()) {
        if (!other.contains("properties") || !other["properties"].is_object() ||
            !other["properties"].contains(key)) {
          return true;
        }
      }
      return false;
    };
    if ((restricts(*into) && has_foreign_properties(from, *into)) ||
        (restricts(from) && has_foreign_properties(*into, from))) {
      return Invalid(path,
                     "allOf: additionalProperties in one branch and properties in another "
                     "cannot be merged");
    }
    for (const auto& [key, value] : from.items()) {
      if (AnnotationKeywords().count(key) || key == "$defs" || key == "definitions") continue;
      if (key == "allOf") {
        if (!value.is_array()) return Invalid(path + "/allOf", "must be an array");
        for (size_t i = 0; i < value.size(); ++i) {
          RETURN_IF_ERROR(MergeInto(into, value[i], absl::StrCat(path, "/allOf/", i), depth + 1));
        }
        continue;
      }
      if (!into->contains(key)) {
        (*into)[key] = value;
        continue;
      }
      Json& cur = (*into)[key];
      if (cur == value) continue;
      if (key == "required" && cur.is_array() && value.is_array()) {
        for (const Json& n : value) {
          if (std::find(cur.begin(), cur.end(), n) == cur.end()) cur.push_back(n);
        }
      } else if (key == "properties" && cur.is_object() && value.is_object()) {
        for (const auto& [name, sub] : value.items()) {
          if (!cur.contains(name)) {
            cur[name] = sub;
          } else if (cur[name] != sub) {
            cur[name] = Json{{"allOf", Json::array({cur[name], sub})}};
          }
        }
      } else if (key == "type") {
        ASSIGN_OR_RETURN(unsigned a, DeclaredTypes(cur, path));
        ASSIGN_OR_RETURN(unsigned b, DeclaredTypes(value, path));
        const unsigned both = a & b;
        Json types = Json::array();
        for (const char* n : {"null", "boolean", "object", "array", "string"}) {
          if (both & *TypeBitsOfName(n)) types.push_back(n);
        }
        if ((both & kFraction) != 0) {
          types.push_back("number");
        } else if ((both & kInteger) != 0) {
          types.push_back("integer");
        }
        if (types.empty()) return Invalid(path, "allOf: the branches' types do not intersect");
        cur = types;
      } else if ((key == "minimum" || key == "minLength" || key == "minItems") && cur.is_number() &&
                 value.is_number()) {
        if (value > cur) cur = value;
      } else if ((key == "maximum" || key == "maxLength" || key == "maxItems") && cur.is_number() &&
                 value.is_number()) {
        if (value < cur) cur = value;
      } else if (key == "enum" && cur.is_array() && value.is_array()) {
        Json both = Json::array();
        for (const Json& v : cur) {
          if (std::find(value.begin(), value.end(), v) != value.end()) both.push_back(v);
        }
        if (both.empty()) return Invalid(path, "allOf: the branches' enums do not intersect");
        cur = both;
      } else {
        return Invalid(path, absl::StrCat("allOf: cannot combine the branches' different '", key,
                                          "' (only simple allOf is supported)"));
      }
    }
    return absl::OkStatus();
  }

  // ---- Productivity: does the schema admit a finite document? ----------------------------

  // Whether `schema` admits some finite document, given which $ref targets are known to
  // (ref_productive_). An over-approximation where merges are involved: it only has to catch
  // recursion without a base case, whose grammar would generate forever.
  bool Productive(const Json& schema, int depth) {
    if (depth > options_.max_depth) return true;
    if (schema.is_boolean()) return schema.get<bool>();
    if (!schema.is_object()) return true;
    if (schema.contains("$ref") && schema["$ref"].is_string()) {
      auto it = ref_productive_.find(schema["$ref"].get<std::string>());
      if (it != ref_productive_.end() && !it->second) return false;
    }
    if (schema.contains("allOf") && schema["allOf"].is_array()) {
      for (const Json& b : schema["allOf"]) {
        if (!Productive(b, depth + 1)) return false;
      }
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key) || !schema[key].is_array()) continue;
      bool any = false;
      for (const Json& b : schema[key]) any = any || Productive(b, depth + 1);
      if (!any) return false;
    }
    if (schema.contains("const") || schema.contains("enum")) return true;
    unsigned types = InferredTypes(schema);
    if (schema.contains("type")) {
      auto declared = DeclaredTypes(schema["type"], "");
      if (declared.ok()) types = *declared;
    }
    if (types & (kNull | kBoolean | kString | kInteger | kFraction)) return true;
    if (types & kObject) {
      bool ok = true;
      if (schema.contains("required") && schema["required"].is_array()) {
        for (const Json& n : schema["required"]) {
          if (!n.is_string()) continue;
          const std::string key = n.get<std::string>();
          const Json* sub = nullptr;
          if (schema.contains("properties") && schema["properties"].is_object() &&
              schema["properties"].contains(key)) {
            sub = &schema["properties"][key];
          } else if (schema.contains("additionalProperties")) {
            sub = &schema["additionalProperties"];
          }
          if (sub != nullptr && !Productive(*sub, depth + 1)) ok = false;
        }
      }
      if (ok) return true;
    }
    if (types & kArray) {
      const int64_t min = schema.contains("minItems") && schema["minItems"].is_number()
                              ? schema["minItems"].get<int64_t>()
                              : 0;
      const char* prefix_key = schema.contains("prefixItems") ? "prefixItems" : "items";
      const Json* prefix = schema.contains(prefix_key) && schema[prefix_key].is_array()
                               ? &schema[prefix_key]
                               : nullptr;
      const int64_t k = prefix ? static_cast<int64_t>(prefix->size()) : 0;
      bool ok = true;
      for (int64_t i = 0; i < std::min(min, k); ++i) ok = ok && Productive((*prefix)[i], depth + 1);
      if (min > k) {
        const char* items_key =
            prefix_key == std::string("items") && prefix ? "additionalItems" : "items";
        if (schema.contains(items_key) && !schema[items_key].is_array()) {
          ok = ok && Productive(schema[items_key], depth + 1);
        }
      }
      if (ok) return true;
    }
    return false;
  }

  absl::Status CheckProductive() {
    for (const auto& [ref, name] : ref_rules_) ref_productive_[ref] = false;
    for (size_t round = 0; round <= ref_rules_.size(); ++round) {
      bool changed = false;
      for (auto& [ref, productive] : ref_productive_) {
        if (productive) continue;
        auto target = ResolvePointer(ref, "");
        if (!target.ok() || Productive(**target, 0)) {
          productive = true;
          changed = true;
        }
      }
      if (!changed) break;
    }
    if (!Productive(root_, 0)) {
      return Invalid("", "the schema admits no finite document (recursion without a base case)");
    }
    return absl::OkStatus();
  }

  // ---- Compilation ----------------------------------------------------------------------

  absl::StatusOr<std::string> Compile(const Json& schema, const std::string& path, int depth) {
    if (++steps_ > options_.max_steps) {
      return Invalid(
          path, absl::StrCat("compiling takes more than ", options_.max_steps, " steps (limit)"));
    }
    if (depth > options_.max_depth) {
      return Invalid(path, absl::StrCat("nests deeper than the limit of ", options_.max_depth));
    }
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return Base("json-value");
      return Invalid(path, "schema 'false' matches nothing");
    }
    if (!schema.is_object()) return Invalid(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : schema.items()) {
      if (SupportedKeywords().count(key) || AnnotationKeywords().count(key)) continue;
      return Invalid(path, absl::StrCat("keyword '", key, "' is not supported"));
    }
    if (schema.contains("$ref")) {
      const Json& ref = schema["$ref"];
      if (!ref.is_string()) return Invalid(path + "/$ref", "must be a string");
      if (!HasValidationKeywords(schema, "$ref")) {
        return RefRule(ref.get<std::string>(), path + "/$ref", depth);
      }
      Json merged = schema;
      merged.erase("$ref");
      ASSIGN_OR_RETURN(const Json* target, ResolvePointer(ref.get<std::string>(), path));
      RETURN_IF_ERROR(MergeInto(&merged, *target, path + "/$ref", depth + 1));
      return Compile(merged, path, depth + 1);
    }
    if (schema.contains("allOf")) {
      const Json& all = schema["allOf"];
      if (!all.is_array() || all.empty())
        return Invalid(path + "/allOf", "must be a non-empty array");
      Json merged = schema;
      merged.erase("allOf");
      for (size_t i = 0; i < all.size(); ++i) {
        RETURN_IF_ERROR(MergeInto(&merged, all[i], absl::StrCat(path, "/allOf/", i), depth + 1));
      }
      return Compile(merged, path, depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (schema.contains(key)) return CompileUnion(schema, key, path, depth);
    }
    if (schema.contains("const") || schema.contains("enum")) {
      // The values, less those a sibling `type` excludes (other sibling keywords are not
      // checked against them).
      unsigned allowed = kAllTypes;
      if (schema.contains("type")) {
        ASSIGN_OR_RETURN(allowed, DeclaredTypes(schema["type"], path));
      }
      const bool is_const = schema.contains("const");
      const std::string vpath = path + (is_const ? "/const" : "/enum");
      Json values = is_const ? Json::array({schema["const"]}) : schema["enum"];
      if (!values.is_array() || values.empty()) return Invalid(vpath, "must be a non-empty array");
      Json kept = Json::array();
      for (const Json& v : values) {
        if ((TypeBitsOfValue(v) & allowed) != 0) kept.push_back(v);
      }
      if (kept.empty()) return Invalid(vpath, "no value is of the schema's type");
      return CompileEnum(kept, vpath);
    }
    unsigned types;
    if (schema.contains("type")) {
      ASSIGN_OR_RETURN(types, DeclaredTypes(schema["type"], path));
    } else {
      types = InferredTypes(schema);
    }
    if (types == kAllTypes && !HasValidationKeywords(schema, "type")) return Base("json-value");
    std::vector<std::string> alternatives;
    if (types & kObject) {
      ASSIGN_OR_RETURN(std::string e, CompileObject(schema, path, depth));
      alternatives.push_back(std::move(e));
    }
    if (types & kArray) {
      ASSIGN_OR_RETURN(std::string e, CompileArray(schema, path, depth));
      alternatives.push_back(std::move(e));
    }
    if (types & kString) {
      ASSIGN_OR_RETURN(std::string e, CompileString(schema, path));
      alternatives.push_back(std::move(e));
    }
    if (types & (kInteger | kFraction)) {
      ASSIGN_OR_RETURN(std::string e, CompileNumber(schema, path, (types & kFraction) == 0));
      alternatives.push_back(std::move(e));
    }
    if (types & kBoolean) alternatives.push_back("(\"true\" | \"false\")");
    if (types & kNull) alternatives.push_back("\"null\"");
    if (alternatives.size() == 1) return alternatives[0];
    return absl::StrCat("(", absl::StrJoin(alternatives, " | "), ")");
  }

  absl::StatusOr<std::string> RefRule(const std::string& ref, const std::string& path, int depth) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return it->second;
    if (static_cast<int>(ref_rules_.size()) >= options_.max_refs) {
      return Invalid(path, absl::StrCat("more than ", options_.max_refs, " $ref targets (limit)"));
    }
    ASSIGN_OR_RETURN(const Json* target, ResolvePointer(ref, path));
    // The rule's name exists before its body, so a recursive reference finds it.
    ASSIGN_OR_RETURN(std::string name, AddRule("def", ""));
    const size_t index = rules_.size() - 1;
    ref_rules_[ref] = name;
    ASSIGN_OR_RETURN(std::string body, Compile(*target, ref.substr(1), depth + 1));
    grammar_bytes_ += body.size();
    if (grammar_bytes_ > options_.max_grammar_bytes) return GrammarTooLarge();
    rules_[index].second = std::move(body);
    return name;
  }

  absl::StatusOr<std::string> CompileUnion(const Json& schema, const std::string& key,
                                           const std::string& path, int depth) {
    const std::string upath = absl::StrCat(path, "/", key);
    const Json& branches = schema[key];
    if (!branches.is_array() || branches.empty())
      return Invalid(upath, "must be a non-empty array");
    if (schema.contains("anyOf") && schema.contains("oneOf")) {
      return Invalid(path, "anyOf and oneOf together are not supported");
    }
    if (key == "oneOf") {
      for (size_t i = 0; i < branches.size(); ++i) {
        for (size_t j = i + 1; j < branches.size(); ++j) {
          ASSIGN_OR_RETURN(bool disjoint, ProvablyDisjoint(branches[i], branches[j], upath));
          if (!disjoint) {
            return Invalid(upath, absl::StrCat("oneOf branches ", i, " and ", j,
                                               " are not provably disjoint (different types or "
                                               "consts); use anyOf if either may match"));
          }
        }
      }
    }
    const bool siblings = HasValidationKeywords(schema, key);
    std::vector<std::string> alternatives;
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string bpath = absl::StrCat(upath, "/", i);
      if (!siblings) {
        if (branches[i].is_boolean() && !branches[i].get<bool>()) continue;
        ASSIGN_OR_RETURN(std::string e, Compile(branches[i], bpath, depth + 1));
        alternatives.push_back(std::move(e));
        continue;
      }
      Json merged = schema;
      merged.erase(key);
      RETURN_IF_ERROR(MergeInto(&merged, branches[i], bpath, depth + 1));
      ASSIGN_OR_RETURN(std::string e, Compile(merged, bpath, depth + 1));
      alternatives.push_back(std::move(e));
    }
    if (alternatives.empty()) return Invalid(upath, "every branch is false: matches nothing");
    if (alternatives.size() == 1) return alternatives[0];
    return AddRule("union", absl::StrJoin(alternatives, " | "));
  }

  // The canonical serialisation of a value: compact, keys in the order given, strings as
  // json.dumps(ensure_ascii=False) writes them.
  static std::string Canonical(const Json& value) {
    return value.dump(-1, ' ', false, Json::error_handler_t::replace);
  }

  absl::StatusOr<std::string> ConstLiteral(const Json& value) {
    std::string text = Canonical(value);
    grammar_bytes_ += text.size();
    if (grammar_bytes_ > options_.max_grammar_bytes) return GrammarTooLarge();
    return GbnfLiteral(text);
  }

  absl::StatusOr<std::string> CompileEnum(const Json& values, const std::string& path) {
    if (!values.is_array() || values.empty()) return Invalid(path, "must be a non-empty array");
    if (static_cast<int>(values.size()) > options_.max_enum_values) {
      return Invalid(path, absl::StrCat("has ", values.size(), " values, over the limit of ",
                                        options_.max_enum_values));
    }
    std::vector<std::string> alternatives;
    for (const Json& v : values) {
      ASSIGN_OR_RETURN(std::string lit, ConstLiteral(v));
      alternatives.push_back(std::move(lit));
    }
    if (alternatives.size() == 1) return alternatives[0];
    return AddRule("enum", absl::StrJoin(alternatives, " | "));
  }

  absl::StatusOr<std::optional<int64_t>> Count(const Json& schema, const char* key,
                                               const std::string& path) {
    if (!schema.contains(key)) return std::optional<int64_t>();
    const Json& v = schema[key];
    if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>()) {
      return Invalid(absl::StrCat(path, "/", key), "must be a non-negative integer");
    }
    const double d = v.get<double>();
    if (d > options_.max_repeat) {
      return Invalid(absl::StrCat(path, "/", key),
                     absl::StrCat("is over the limit of ", options_.max_repeat));
    }
    return std::optional<int64_t>(static_cast<int64_t>(d));
  }

  static std::string Repeat(const std::string& item, int64_t min, std::optional<int64_t> max) {
    if (max && *max == 0) return "\"\"";
    if (!max) {
      if (min == 0) return absl::StrCat("(", item, ")*");
      if (min == 1) return absl::StrCat("(", item, ")+");
      return absl::StrCat("(", item, "){", min, ",}");
    }
    if (min == *max) return min == 1 ? item : absl::StrCat("(", item, "){", min, "}");
    if (min == 0 && *max == 1) return absl::StrCat("(", item, ")?");
    return absl::StrCat("(", item, "){", min, ",", *max, "}");
  }

  absl::StatusOr<std::string> CompileString(const Json& schema, const std::string& path) {
    ASSIGN_OR_RETURN(std::optional<int64_t> min, Count(schema, "minLength", path));
    ASSIGN_OR_RETURN(std::optional<int64_t> max, Count(schema, "maxLength", path));
    if (min && max && *min > *max) return Invalid(path, "minLength is greater than maxLength");
    const bool lengths = min || max;
    const std::string quote = "\"\\\"\"";
    if (schema.contains("format") && schema.contains("pattern")) {
      return Invalid(path, "format and pattern together are not supported");
    }
    if (schema.contains("format")) {
      const Json& f = schema["format"];
      if (!f.is_string()) return Invalid(path + "/format", "must be a string");
      std::optional<std::string> expr = JsonFormatExpression(f.get<std::string>());
      if (!expr) {
        return Invalid(path + "/format",
                       absl::StrCat("format '", f.get<std::string>(),
                                    "' is not supported (date-time, date, time, uuid, email, "
                                    "ipv4, ipv6 are)"));
      }
      if (lengths) return Invalid(path, "minLength/maxLength with format are not supported");
      ASSIGN_OR_RETURN(std::string name, AddRule("format", *expr));
      return absl::StrCat(quote, " ", name, " ", quote);
    }
    if (schema.contains("pattern")) {
      const Json& p = schema["pattern"];
      if (!p.is_string()) return Invalid(path + "/pattern", "must be a string");
      if (lengths) return Invalid(path, "minLength/maxLength with pattern are not supported");
      auto expr = PatternToGbnfJsonContent(p.get<std::string>(), Base("json-char"), options_.regex);
      if (!expr.ok()) return Invalid(path + "/pattern", expr.status().message());
      ASSIGN_OR_RETURN(std::string name, AddRule("pattern", *std::move(expr)));
      return absl::StrCat(quote, " ", name, " ", quote);
    }
    if (!lengths) return Base("json-string");
    return absl::StrCat(quote, " ", Repeat(Base("json-char"), min.value_or(0), max), " ", quote);
  }

  // A numeric bound as a double, with draft 4's boolean exclusive flags folded in.
  absl::StatusOr<std::optional<double>> Bound(const Json& schema, const char* key,
                                              const char* exclusive_key, bool* exclusive,
                                              const std::string& path) {
    std::optional<double> out;
    *exclusive = false;
    if (schema.contains(key)) {
      if (!schema[key].is_number())
        return Invalid(absl::StrCat(path, "/", key), "must be a number");
      out = schema[key].get<double>();
    }
    if (schema.contains(exclusive_key)) {
      const Json& e = schema[exclusive_key];
      if (e.is_boolean()) {
        *exclusive = e.get<bool>();
      } else if (e.is_number()) {
        const double d = e.get<double>();
        const bool lower = std::string(key) == "minimum";
        if (!out || (lower ? d >= *out : d <= *out)) {
          out = d;
          *exclusive = true;
        }
      } else {
        return Invalid(absl::StrCat(path, "/", exclusive_key), "must be a number");
      }
    }
    return out;
  }

  absl::StatusOr<std::string> CompileNumber(const Json& schema, const std::string& path,
                                            bool integer) {
    bool lo_exclusive, hi_exclusive;
    ASSIGN_OR_RETURN(std::optional<double> lo,
                     Bound(schema, "minimum", "exclusiveMinimum", &lo_exclusive, path));
    ASSIGN_OR_RETURN(std::optional<double> hi,
                     Bound(schema, "maximum", "exclusiveMaximum", &hi_exclusive, path));
    if (!lo && !hi) return Base(integer ? "json-integer" : "json-number");
    if (!integer) {
      // Exact for integral bounds with a lower bound >= 0: numbers written without exponent,
      // integer part I and fraction F. x >= lo: I >= lo; x > lo: I > lo, or I == lo and F
      // not all zeros; x <= hi: I < hi, or I == hi and F all zeros; x < hi: I < hi.
      auto integral = [](std::optional<double> v) {
        return !v || (std::floor(*v) == *v && std::fabs(*v) < 9.0e15);
      };
      if (lo && *lo >= 0 && integral(lo) && integral(hi) && (!hi || *hi >= *lo)) {
        const auto l = static_cast<int64_t>(*lo);
        const std::string fraction = "(\".\" [0-9]+)?";
        std::vector<std::string> alternatives;
        if (hi) {
          const auto h = static_cast<int64_t>(*hi);
          if (l + (lo_exclusive ? 1 : 0) <= h - 1) {
            alternatives.push_back(
                absl::StrCat(IntegerRangeGbnf(l + (lo_exclusive ? 1 : 0), h - 1), " ", fraction));
          }
          if (!hi_exclusive && !(lo_exclusive && h == l)) {
            alternatives.push_back(absl::StrCat("\"", h, "\" (\".\" \"0\"+)?"));
          }
        } else {
          alternatives.push_back(absl::StrCat(
              IntegerRangeGbnf(l + (lo_exclusive ? 1 : 0), std::nullopt), " ", fraction));
        }
        if (lo_exclusive && (!hi || l < *hi)) {
          alternatives.push_back(absl::StrCat("\"", l, "\" \".\" [0-9]* [1-9] [0-9]*"));
        }
        if (alternatives.empty()) return Invalid(path, "no number lies within the bounds");
        return AddRule("number", absl::StrJoin(alternatives, " | "));
      }
      if (options_.allow_unenforced_number_bounds) return Base("json-number");
      return Invalid(path,
                     "minimum/maximum on a non-integer number cannot be enforced by the "
                     "grammar (use type integer, or allow unenforced bounds)");
    }
    constexpr double kLimit = 9.0e18;
    std::optional<int64_t> min, max;
    if (lo) {
      double v = lo_exclusive ? std::floor(*lo) + 1 : std::ceil(*lo);
      if (std::fabs(v) > kLimit) return Invalid(path, "minimum is beyond the supported range");
      min = static_cast<int64_t>(v);
    }
    if (hi) {
      double v = hi_exclusive ? std::ceil(*hi) - 1 : std::floor(*hi);
      if (std::fabs(v) > kLimit) return Invalid(path, "maximum is beyond the supported range");
      max = static_cast<int64_t>(v);
    }
    if (min && max && *min > *max) return Invalid(path, "no integer lies within the bounds");
    return AddRule("integer", IntegerRangeGbnf(min, max));
  }

  // A JSON string literal (quotes included) for a property name.
  static std::string KeyLiteral(const std::string& key) {
    return GbnfLiteral(Canonical(Json(key)));
  }

  absl::StatusOr<std::string> CompileObject(const Json& schema, const std::string& path,
                                            int depth) {
    const std::string w = W();
    // The listed properties, in order, then required names not listed.
    struct Prop {
      std::string key;
      const Json* schema;  // null: the additionalProperties schema
      std::string ppath;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> required;
    if (schema.contains("required")) {
      const Json& r = schema["required"];
      if (!r.is_array()) return Invalid(path + "/required", "must be an array of strings");
      for (const Json& n : r) {
        if (!n.is_string()) return Invalid(path + "/required", "must be an array of strings");
        required.insert(n.get<std::string>());
      }
    }
    if (schema.contains("properties")) {
      const Json& p = schema["properties"];
      if (!p.is_object()) return Invalid(path + "/properties", "must be an object");
      for (const auto& [key, sub] : p.items()) {
        const std::string ppath = absl::StrCat(path, "/properties/", PointerEscape(key));
        const bool req = required.count(key) > 0;
        if (sub.is_boolean() && !sub.get<bool>()) {
          if (req) return Invalid(ppath, "a required property's schema is false");
          continue;  // must be absent
        }
        props.push_back({key, &sub, ppath, req});
      }
    }
    // additionalProperties: absent -> the option; false -> none; true or a schema.
    const Json* extra = nullptr;
    bool extra_allowed =
        options_.additional_properties_by_default || !schema.contains("properties");
    static const Json kTrue = true;
    if (schema.contains("additionalProperties")) {
      const Json& a = schema["additionalProperties"];
      if (a.is_boolean()) {
        extra_allowed = a.get<bool>();
      } else if (a.is_object()) {
        extra_allowed = true;
        extra = &a;
      } else {
        return Invalid(path + "/additionalProperties", "must be a boolean or a schema");
      }
    }
    if (extra_allowed && extra == nullptr) extra = &kTrue;
    for (const std::string& name : required) {
      const bool listed =
          std::any_of(props.begin(), props.end(), [&](const Prop& p) { return p.key == name; });
      if (listed) continue;
      if (schema.contains("properties") && schema["properties"].contains(name)) continue;
      if (!extra_allowed) {
        return Invalid(path + "/required",
                       absl::StrCat("requires '", name,
                                    "', which is neither in properties nor allowed as an "
                                    "additional property"));
      }
      props.push_back({name, extra, path + "/additionalProperties", true});
    }
    std::vector<std::string> members;
    for (const Prop& p : props) {
      ASSIGN_OR_RETURN(std::string value, Compile(*p.schema, p.ppath, depth + 1));
      members.push_back(absl::StrCat(KeyLiteral(p.key), w, "\":\"", w, value));
    }
    // Additional members: any key not listed (a listed key twice would let the later value
    // escape that property's schema).
    std::string extra_member;
    if (extra_allowed) {
      ASSIGN_OR_RETURN(std::string value,
                       Compile(*extra, path + "/additionalProperties", depth + 1));
      std::vector<std::string> listed;
      if (schema.contains("properties")) {
        for (const auto& [key, sub] : schema["properties"].items()) listed.push_back(key);
      }
      ASSIGN_OR_RETURN(std::string key, KeyExcluding(listed));
      extra_member = absl::StrCat(key, w, "\":\"", w, value);
    }
    // Rules from the end: first_i (nothing emitted yet) and rest_i (something was: each member
    // takes a leading comma).
    const std::string comma = absl::StrCat(w, "\",\"", w);
    std::string first =
        extra_allowed ? absl::StrCat("(", extra_member, " (", comma, extra_member, ")*)?") : "\"\"";
    std::string rest = extra_allowed ? absl::StrCat("(", comma, extra_member, ")*") : "\"\"";
    for (size_t i = members.size(); i-- > 0;) {
      std::string new_first, new_rest;
      if (props[i].required) {
        new_first = absl::StrCat(members[i], " ", rest);
        new_rest = absl::StrCat(comma, members[i], " ", rest);
      } else {
        new_first = absl::StrCat("(", members[i], " ", rest, " | ", first, ")");
        new_rest = absl::StrCat("(", comma, members[i], ")? ", rest);
      }
      if (i > 0) {
        ASSIGN_OR_RETURN(first, AddRule("obj-first", std::move(new_first)));
        ASSIGN_OR_RETURN(rest, AddRule("obj-rest", std::move(new_rest)));
      } else {
        first = std::move(new_first);
      }
    }
    return AddRule("object", absl::StrCat("\"{\"", w, first, w, "\"}\""));
  }

  // A JSON escape: a backslash and one of "\/bfnrt, or 'u' and four hex digits, a surrogate only
  // as a high-low pair (so lengths in code points are exact). Keys use it too: a key is a string.
  static std::string JsonEscape() {
    const std::string hex = "[0-9a-fA-F]";
    return absl::StrCat("\"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CeEfF] ", hex, "{3} | ",
                        "[dD] [0-7] ", hex, "{2} | [dD] [89abAB] ", hex,
                        "{2} \"\\\\u\" [dD] [c-fC-F] ", hex, "{2}))");
  }

  // A JSON string (quotes included) for any key but those listed. The listed keys' canonical
  // contents form a trie over code points; at each node the key may end (unless the node spells
  // a listed key), leave the trie with a character no child starts with (then anything), or
  // follow a child. Keys that spell a listed key with non-canonical escapes are not excluded.
  absl::StatusOr<std::string> KeyExcluding(const std::vector<std::string>& listed) {
    if (listed.empty()) return Base("json-string");
    struct Node {
      std::map<uint32_t, int> children;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& key : listed) {
      const std::string c = Canonical(Json(key));
      int n = 0;
      for (uint32_t cp : DecodeUtf8(c.substr(1, c.size() - 2))) {
        auto it = trie[n].children.find(cp);
        if (it == trie[n].children.end()) {
          trie.push_back({});
          it = trie[n].children.emplace(cp, static_cast<int>(trie.size() - 1)).first;
        }
        n = it->second;
      }
      trie[n].terminal = true;
    }
    const std::string any_rest = absl::StrCat(Base("json-char"), "* \"\\\"\"");
    std::vector<std::string> names(trie.size());
    for (size_t i = trie.size(); i-- > 0;) {  // children have higher indices
      std::vector<std::string> alts;
      if (!trie[i].terminal) alts.push_back("\"\\\"\"");
      CodePointRanges excluded = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
      for (const auto& [cp, child] : trie[i].children) excluded.push_back({cp, cp});
      const CodePointRanges allowed = ComplementRanges(NormalizeRanges(std::move(excluded)));
      std::vector<std::string> leave;
      if (!allowed.empty()) leave.push_back(GbnfClass(allowed));
      if (trie[i].children.count('\\') == 0) {
        leave.push_back(JsonEscape());
      }
      if (!leave.empty()) {
        alts.push_back(absl::StrCat("(", absl::StrJoin(leave, " | "), ") ", any_rest));
      }
      for (const auto& [cp, child] : trie[i].children) {
        alts.push_back(absl::StrCat(GbnfCodePointLiteral(cp), " ", names[child]));
      }
      ASSIGN_OR_RETURN(names[i], AddRule("key", absl::StrJoin(alts, " | ")));
    }
    return absl::StrCat("\"\\\"\" ", names[0]);
  }

  static std::vector<uint32_t> DecodeUtf8(const std::string& text) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < text.size();) {
      const auto b0 = static_cast<unsigned char>(text[i]);
      const int len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : 4;
      uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
      for (int k = 1; k < len && i + k < text.size(); ++k) {
        cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
      }
      out.push_back(cp);
      i += len;
    }
    return out;
  }

  absl::StatusOr<std::string> CompileArray(const Json& schema, const std::string& path, int depth) {
    const std::string w = W();
    const std::string comma = absl::StrCat(w, "\",\"", w);
    ASSIGN_OR_RETURN(std::optional<int64_t> min_opt, Count(schema, "minItems", path));
    ASSIGN_OR_RETURN(std::optional<int64_t> max, Count(schema, "maxItems", path));
    const int64_t min = min_opt.value_or(0);
    if (max && min > *max) return Invalid(path, "minItems is greater than maxItems");
    if (schema.contains("uniqueItems") && schema["uniqueItems"] == Json(true)) {
      return Invalid(path + "/uniqueItems", "uniqueItems: true is not supported");
    }
    // Tuple part: prefixItems, or draft 4-7's array-valued items.
    const Json* prefix = nullptr;
    const Json* items = nullptr;
    std::string prefix_key = "prefixItems", items_key = "items";
    if (schema.contains("prefixItems")) {
      prefix = &schema["prefixItems"];
      if (schema.contains("items")) items = &schema["items"];
    } else if (schema.contains("items") && schema["items"].is_array()) {
      prefix = &schema["items"];
      prefix_key = "items";
      items_key = "additionalItems";
      if (schema.contains("additionalItems")) items = &schema["additionalItems"];
    } else if (schema.contains("items")) {
      items = &schema["items"];
    }
    if (prefix && !prefix->is_array()) return Invalid(path + "/" + prefix_key, "must be an array");
    static const Json kTrue = true;
    if (items == nullptr) items = &kTrue;
    const bool items_false = items->is_boolean() && !items->get<bool>();
    std::vector<std::string> prefix_exprs;
    if (prefix) {
      for (size_t i = 0; i < prefix->size(); ++i) {
        if (max && static_cast<int64_t>(i) >= *max) break;
        const std::string ipath = absl::StrCat(path, "/", prefix_key, "/", i);
        if ((*prefix)[i].is_boolean() && !(*prefix)[i].get<bool>()) {
          if (static_cast<int64_t>(i) < min)
            return Invalid(ipath, "a required item's schema is false");
          break;  // the array ends before this position
        }
        ASSIGN_OR_RETURN(std::string e, Compile((*prefix)[i], ipath, depth + 1));
        prefix_exprs.push_back(std::move(e));
      }
    }
    const int64_t k = static_cast<int64_t>(prefix_exprs.size());
    const bool tuple_cut = prefix && k < static_cast<int64_t>(prefix->size());
    // The tail after the k prefix items: between a and b more items of `items`.
    std::string tail;
    const int64_t a = std::max<int64_t>(0, min - k);
    std::optional<int64_t> b;
    if (max) b = std::max<int64_t>(0, *max - k);
    if (items_false || tuple_cut) b = 0;
    if (b && a > *b) return Invalid(path, "minItems cannot be met with the items allowed");
    std::string item;
    if (!b || *b > 0) {
      ASSIGN_OR_RETURN(item, Compile(*items, absl::StrCat(path, "/", items_key), depth + 1));
    }
    if (k == 0) {
      if (b && *b == 0) {
        tail = "\"\"";
      } else {
        std::optional<int64_t> more;
        if (b) more = *b - 1;
        const std::string seq = absl::StrCat(
            item, " ", Repeat(absl::StrCat(comma, item), std::max<int64_t>(0, a - 1), more));
        tail = a > 0 ? seq : absl::StrCat("(", seq, ")?");
      }
    } else {
      tail = b && *b == 0 ? "\"\"" : Repeat(absl::StrCat(comma, item), a, b);
    }
    // The prefix items, each optional past minItems, nested from the end.
    std::string body = tail;
    for (int64_t i = k; i-- > 0;) {
      const std::string sep = i > 0 ? comma : std::string(" ");
      std::string seq = absl::StrCat(sep, prefix_exprs[i], " ", body);
      body = i < min ? seq : absl::StrCat("(", seq, ")?");
    }
    return AddRule("array", absl::StrCat("\"[\"", w, body, w, "\"]\""));
  }

  const Json& root_;
  const JsonSchemaOptions& options_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> base_done_;
  std::map<std::string, std::string> ref_rules_;
  std::map<std::string, bool> ref_productive_;
  size_t grammar_bytes_ = 0;
  int steps_ = 0;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema,
                                             const JsonSchemaOptions& options) {
  Compiler compiler(schema, options);
  return compiler.Run();
}

absl::StatusOr<std::string> JsonSchemaTextToGbnf(absl::string_view schema_json,
                                                 const JsonSchemaOptions& options) {
  if (schema_json.size() > options.max_schema_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("JSON Schema: ", schema_json.size(),
                                                   " bytes, over the limit of ",
                                                   options.max_schema_bytes));
  }
  Json schema = Json::parse(schema_json.begin(), schema_json.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (schema.is_discarded()) {
    return absl::InvalidArgumentError("JSON Schema: the schema is not valid JSON");
  }
  return JsonSchemaToGbnf(schema, options);
}

}  // namespace ferry::grammar
