#include "engine/common/config.h"

#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status.h"
#include "engine/common/units.h"
#include "nlohmann/json.hpp"

namespace ferry {

using Json = nlohmann::json;

struct Config::Document {
  std::string source;
  Json root;
  // Paths touched by a reader or by Child()/Children().
  std::set<std::string> used;
};

namespace {

const Json& AsJson(const void* node) { return *static_cast<const Json*>(node); }

std::string Describe(const Json& value) {
  std::string dump = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (dump.size() > 40) dump = dump.substr(0, 37) + "...";
  return absl::StrCat(value.type_name(), " ", dump);
}

void CollectUnused(const Json& node, const std::string& path, const std::set<std::string>& used,
                   std::vector<std::string>* unused) {
  if (!node.is_object()) return;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string child = path.empty() ? it.key() : absl::StrCat(path, ".", it.key());
    if (used.count(child) == 0) {
      unused->push_back(child);
      continue;
    }
    if (it.value().is_object()) {
      // Read whole by a leaf reader only if no key below was used: then it is a leaf value.
      CollectUnused(it.value(), child, used, unused);
    } else if (it.value().is_array()) {
      for (size_t i = 0; i < it.value().size(); ++i) {
        const std::string element = absl::StrCat(child, "[", i, "]");
        if (used.count(element) > 0) CollectUnused(it.value()[i], element, used, unused);
      }
    }
  }
}

}  // namespace

Config::Config() : Config(std::make_shared<Document>(), nullptr, "") {
  document_->root = Json::object();
  node_ = &document_->root;
}

Config::Config(std::shared_ptr<Document> document, const void* node, std::string path)
    : document_(std::move(document)), node_(node), path_(std::move(path)) {}

absl::StatusOr<Config> Config::Parse(absl::string_view text, absl::string_view source) {
  auto document = std::make_shared<Document>();
  document->source = std::string(source);
  try {
    document->root = Json::parse(text.begin(), text.end(), /*cb=*/nullptr,
                                 /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for huge numbers
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (!document->root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the top level must be a JSON object, got ", document->root.type_name()));
  }
  const void* root = &document->root;
  return Config(std::move(document), root, "");
}

absl::StatusOr<Config> Config::LoadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot open config file ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return ErrnoStatus(errno, absl::StrCat("cannot read config file ", path));
  return Parse(text.str(), path);
}

std::string Config::KeyPath(absl::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
}

absl::Status Config::TypeError(absl::string_view key, absl::string_view expected) const {
  const Json& value = AsJson(node_).at(std::string(key));
  return absl::InvalidArgumentError(absl::StrCat(
      document_->source, ": ", KeyPath(key), ": expected ", expected, ", got ", Describe(value)));
}

const void* Config::Lookup(absl::string_view key) const {
  const Json& node = AsJson(node_);
  auto it = node.find(std::string(key));
  if (it == node.end()) return nullptr;
  document_->used.insert(KeyPath(key));
  return &*it;
}

bool Config::Has(absl::string_view key) const { return AsJson(node_).contains(std::string(key)); }

absl::Status Config::Require(absl::string_view key) const {
  if (Has(key)) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrCat(document_->source, ": ", KeyPath(key), ": required but missing"));
}

std::vector<std::string> Config::Keys() const {
  std::vector<std::string> keys;
  for (auto it = AsJson(node_).begin(); it != AsJson(node_).end(); ++it) keys.push_back(it.key());
  return keys;
}

absl::Status Config::Read(absl::string_view key, bool* out) const {
  const void* found = Lookup(key);
  if (found == nullptr) return absl::OkStatus();
  if (!AsJson(found).is_boolean()) return TypeError(key, "true or false");
  *out = AsJson(found).get<bool>();
  return absl::OkStatus();
}

template <typename Int>
absl::Status Config::ReadInteger(absl::string_view key, Int* out) const {
  const void* found = Lookup(key);
  if (found == nullptr) return absl::OkStatus();
  const Json& value = AsJson(found);
  const std::string expected = absl::StrCat("an integer in [", std::numeric_limits<Int>::min(),
                                            ", ", std::numeric_limits<Int>::max(), "]");
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<Int>::max())) return TypeError(key, expected);
    *out = static_cast<Int>(v);
    return absl::OkStatus();
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (std::is_unsigned<Int>::value && v < 0) return TypeError(key, expected);
    if (!std::is_unsigned<Int>::value &&
        (v < static_cast<int64_t>(std::numeric_limits<Int>::min()) ||
         v > static_cast<int64_t>(std::numeric_limits<Int>::max()))) {
      return TypeError(key, expected);
    }
    *out = static_cast<Int>(v);
    return absl::OkStatus();
  }
  return TypeError(key, expected);
}

absl::Status Config::Read(absl::string_view key, int32_t* out) const {
  return ReadInteger(key, out);
}
absl::Status Config::Read(absl::string_view key, int64_t* out) const {
  return ReadInteger(key, out);
}
absl::Status Config::Read(absl::string_view key, uint32_t* out) const {
  return ReadInteger(key, out);
}
absl::Status Config::Read(absl::string_view key, uint64_t* out) const {
  return ReadInteger(key, out);
}

absl::Status Config::Read(absl::string_view key, double* out) const {
  const void* found = Lookup(key);
  if (found == nullptr) return absl::OkStatus();
  if (!AsJson(found).is_number()) return TypeError(key, "a number");
  *out = AsJson(found).get<double>();
  return absl::OkStatus();
}

absl::Status Config::Read(absl::string_view key, std::string* out) const {
  const void* found = Lookup(key);
  if (found == nullptr) return absl::OkStatus();
  if (!AsJson(found).is_string()) return TypeError(key, "a string");
  *out = AsJson(found).get<std::string>();
  return absl::OkStatus();
}

absl::Status Config::Read(absl::string_view key, std::vector<std::string>* out) const {
  const void* found = Lookup(key);
  if (found == nullptr) return absl::OkStatus();
  const Json& value = AsJson(found);
  if (!value.is_array()) return TypeError(key, "an array of strings");
  std::vector<std::string> strings;
  for (const Json& element : value) {
    if (!element.is_string()) return TypeError(key, "an array of strings");
    strings.push_back(element.get<std::string>());
  }
  *out = std::move(strings);
  return absl::OkStatus();
}

absl::Status Config::ReadByteSize(absl::string_view key, uint64_t* out) const {
  const void* found = Lookup(key);
  if (found == nullptr) return absl::OkStatus();
  const Json& value = AsJson(found);
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return absl::OkStatus();
  }
  if (value.is_string()) {
    auto parsed = ParseByteSize(value.get<std::string>());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(document_->source, ": ", KeyPath(key), ": ", parsed.status().message()));
    }
    *out = *parsed;
    return absl::OkStatus();
  }
  return TypeError(key, "a byte size (a non-negative integer or a string such as \"64GiB\")");
}

absl::Status Config::ReadDuration(absl::string_view key, absl::Duration* out) const {
  const void* found = Lookup(key);
  if (found == nullptr) return absl::OkStatus();
  const Json& value = AsJson(found);
  if (!value.is_string()) {
    return TypeError(key, "a duration string such as \"3d\", \"72h\" or \"250ms\"");
  }
  auto parsed = ParseConfigDuration(value.get<std::string>());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(document_->source, ": ", KeyPath(key), ": ", parsed.status().message()));
  }
  *out = *parsed;
  return absl::OkStatus();
}

absl::StatusOr<Config> Config::Child(absl::string_view key) const {
  const void* found = Lookup(key);
  if (found == nullptr) {
    static const Json* const kEmptyObject = new Json(Json::object());
    return Config(document_, kEmptyObject, KeyPath(key));
  }
  if (!AsJson(found).is_object()) return TypeError(key, "an object");
  return Config(document_, found, KeyPath(key));
}

absl::StatusOr<std::vector<Config>> Config::Children(absl::string_view key) const {
  std::vector<Config> children;
  const void* found = Lookup(key);
  if (found == nullptr) return children;
  const Json& value = AsJson(found);
  if (!value.is_array()) return TypeError(key, "an array of objects");
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_object()) return TypeError(key, "an array of objects");
    const std::string element = absl::StrCat(KeyPath(key), "[", i, "]");
    document_->used.insert(element);
    children.push_back(Config(document_, &value[i], element));
  }
  return children;
}

absl::Status Config::CheckAllKeysUsed() const {
  std::vector<std::string> unused;
  CollectUnused(AsJson(node_), path_, document_->used, &unused);
  if (unused.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(document_->source, ": unknown key",
                                                 unused.size() > 1 ? "s" : "", ": ",
                                                 absl::StrJoin(unused, ", ")));
}

}  // namespace ferry
