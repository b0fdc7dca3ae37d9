#include "router/api/bounded_json.h"

#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

// An object's members while it is open. Not its ordered_map: that vector's pairs have const keys,
// so growing it copies every member it holds (deeply); these pairs move. The object gets them,
// each moved once, when it closes.
using Members = std::vector<std::pair<std::string, Json>>;

// Objects of at most this many keys find a duplicate by a scan (no index to build).
constexpr size_t kScannedKeys = 8;

// The keys and indices an error's path names at most.
constexpr size_t kPathParts = 8;

// The key index of an open object: positions in its Members, hashed and compared by the key at
// the position, and looked up by a key (no key is copied into the index).
struct KeyHash {
  using is_transparent = void;
  const Members* members;
  size_t operator()(size_t i) const { return (*this)(absl::string_view((*members)[i].first)); }
  size_t operator()(absl::string_view key) const { return absl::Hash<absl::string_view>()(key); }
};
struct KeyEq {
  using is_transparent = void;
  const Members* members;
  absl::string_view Key(size_t i) const { return (*members)[i].first; }
  bool operator()(size_t a, size_t b) const { return Key(a) == Key(b); }
  bool operator()(size_t a, absl::string_view b) const { return Key(a) == b; }
  bool operator()(absl::string_view a, size_t b) const { return a == Key(b); }
};
using KeyIndex = absl::flat_hash_set<size_t, KeyHash, KeyEq>;

// One open container. Frames live in a deque and are reused: an index's functors point at its
// frame's members, which never move.
struct Frame {
  Frame() = default;
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  Json* value = nullptr;           // the array or object, where its parent holds it
  Json::array_t* array = nullptr;  // an array's elements
  bool object = false;
  Members members;    // object: its members so far
  size_t member = 0;  // object: the member whose value comes next
  KeyIndex index{0, KeyHash{&members}, KeyEq{&members}};  // past kScannedKeys keys
  bool indexed = false;
};

// nlohmann's SAX handler interface (json_sax): builds the document, counting as it goes; returns
// false (which stops the parser) at the first error.
class BoundedBuilder {
 public:
  BoundedBuilder(const JsonLimits& limits, Json* root) : limits_(limits), root_(root) {}

  bool null() { return Put(Json(nullptr)) != nullptr; }
  bool boolean(bool b) { return Put(Json(b)) != nullptr; }
  bool number_integer(Json::number_integer_t i) { return Put(Json(i)) != nullptr; }
  bool number_unsigned(Json::number_unsigned_t u) { return Put(Json(u)) != nullptr; }
  bool number_float(Json::number_float_t d, const std::string&) { return Put(Json(d)) != nullptr; }
  bool string(std::string& s) {
    if (s.size() > limits_.max_string_bytes) return StringTooLong(/*key=*/false);
    return Put(Json(std::move(s))) != nullptr;
  }
  bool binary(Json::binary_t&) {  // JSON text has none
    return Fail(JsonParseError::Kind::kSyntax, "", "binary values are not JSON");
  }

  bool start_object(size_t) { return Open(Json::value_t::object); }
  bool start_array(size_t) { return Open(Json::value_t::array); }

  bool key(std::string& k) {
    if (k.size() > limits_.max_string_bytes) return StringTooLong(/*key=*/true);
    if (!Count()) return false;
    Frame& f = *top_;
    // A key seen before takes the new value where it stands (the last value wins).
    if (f.indexed) {
      auto it = f.index.find(absl::string_view(k));
      if (it != f.index.end()) return Revisit(f, *it);
    } else {
      for (size_t i = 0; i < f.members.size(); ++i) {
        if (f.members[i].first == k) return Revisit(f, i);
      }
    }
    f.members.emplace_back(std::move(k), Json());
    f.member = f.members.size() - 1;
    if (f.indexed) {
      f.index.insert(f.member);
    } else if (f.members.size() > kScannedKeys) {
      f.index.reserve(2 * f.members.size());
      for (size_t i = 0; i < f.members.size(); ++i) f.index.insert(i);
      f.indexed = true;
    }
    return true;
  }

  bool end_object() {
    Frame& f = *top_;
    Json::object_t& object = *f.value->get_ptr<Json::object_t*>();
    object.reserve(f.members.size());
    for (auto& [k, v] : f.members) object.emplace_back(std::move(k), std::move(v));
    f.members.clear();
    f.index.clear();
    f.indexed = false;
    Close();
    return true;
  }
  bool end_array() {
    Close();
    return true;
  }

  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    return Fail(JsonParseError::Kind::kSyntax, "", e.what());
  }

  JsonParseError& error() { return error_; }

 private:
  // Stores `v` where the document expects its next value; where it went, or null (an error).
  Json* Put(Json&& v) {
    if (top_ == nullptr) {
      *root_ = std::move(v);
      return root_;
    }
    if (top_->object) {
      Json& slot = top_->members[top_->member].second;
      slot = std::move(v);
      return &slot;
    }
    if (!Count()) return nullptr;
    top_->array->push_back(std::move(v));
    return &top_->array->back();
  }

  bool Open(Json::value_t type) {
    if (depth_ >= static_cast<size_t>(limits_.max_depth)) {
      return Fail(JsonParseError::Kind::kDepth, SlotPath(),
                  absl::StrCat("JSON nested deeper than ", limits_.max_depth, " levels"));
    }
    Json* value = Put(Json(type));
    if (value == nullptr) return false;
    if (frames_.size() == depth_) frames_.emplace_back();
    Frame& f = frames_[depth_];
    f.value = value;
    f.object = type == Json::value_t::object;
    f.array = f.object ? nullptr : value->get_ptr<Json::array_t*>();
    ++depth_;
    top_ = &f;
    return true;
  }

  void Close() {
    --depth_;
    top_ = depth_ == 0 ? nullptr : &frames_[depth_ - 1];
  }

  bool Revisit(Frame& f, size_t i) {
    f.member = i;
    f.members[i].second = Json();
    return true;
  }

  // One more key or array element.
  bool Count() {
    if (++values_ <= limits_.max_values) return true;
    return Fail(JsonParseError::Kind::kValues, Path(depth_),
                absl::StrCat("more than ", limits_.max_values, " keys and array elements in all"));
  }

  bool StringTooLong(bool key) {
    // A value's path is its slot's; a key's, the object's.
    return Fail(JsonParseError::Kind::kStringBytes, key ? Path(depth_) : SlotPath(),
                absl::StrCat(key ? "a key" : "a string", " longer than ", limits_.max_string_bytes,
                             " bytes"));
  }

  // The path of where the next value goes: the open container's current key, or its next index.
  std::string SlotPath() const { return Path(depth_, /*slot=*/true); }

  // The path of the container open at `depth` (1: the document, ""), and with `slot` that of its
  // current slot. At most kPathParts keys and indices, then "...".
  std::string Path(size_t depth, bool slot = false) const {
    std::vector<std::pair<bool, std::string>> parts;  // (an index, its text)
    // The container at depth d + 1 is the value in frame d - 1's current slot (arrays: their last
    // element, already stored; the slot itself: the next one).
    for (size_t d = 1; d <= depth && parts.size() <= kPathParts; ++d) {
      if (d == depth && !slot) break;
      const Frame& f = frames_[d - 1];
      if (f.object) {
        parts.emplace_back(false, f.members[f.member].first);
      } else {
        const size_t n = f.value->size();
        parts.emplace_back(true, absl::StrCat("[", d == depth ? n : n - 1, "]"));
      }
    }
    std::string path;
    for (size_t i = 0; i < parts.size() && i < kPathParts; ++i) {
      if (i > 0 && !parts[i].first) path += ".";
      path += parts[i].second;
    }
    if (parts.size() > kPathParts) path += "...";
    return path;
  }

  bool Fail(JsonParseError::Kind kind, std::string path, std::string message) {
    if (error_.kind == JsonParseError::Kind::kNone) {
      error_.kind = kind;
      error_.path = std::move(path);
      error_.message = std::move(message);
    }
    return false;
  }

  const JsonLimits& limits_;
  Json* const root_;
  std::deque<Frame> frames_;  // frames_[0, depth_) are open
  size_t depth_ = 0;
  Frame* top_ = nullptr;  // frames_[depth_ - 1]
  uint64_t values_ = 0;
  JsonParseError error_;
};

}  // namespace

absl::Status ParseBoundedJson(absl::string_view text, const JsonLimits& limits, Json* out,
                              JsonParseError* error) {
  *out = Json();
  BoundedBuilder builder(limits, out);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &builder);
  if (ok && builder.error().kind == JsonParseError::Kind::kNone) return absl::OkStatus();
  JsonParseError& e = builder.error();
  if (e.kind == JsonParseError::Kind::kNone) {  // the parser stopped without saying why
    e.kind = JsonParseError::Kind::kSyntax;
    e.message = "not valid JSON";
  }
  absl::Status status = absl::InvalidArgumentError(e.message);
  if (error != nullptr) *error = std::move(e);
  return status;
}

}  // namespace ferry
