// Configuration files: JSON (comments allowed) read through typed, path-aware accessors.
//
// Every Ferry service takes flags (absl flags) and optionally one config file; values in the
// file are read with the accessors below, each of which names the file and the key path in its
// error ("ferry.json: kvstore.capacity: expected a byte size ..."). After reading, a service calls
// CheckAllKeysUsed(), so that a misspelt key is an error at start-up rather than a silently
// ignored setting.
//
//   ASSIGN_OR_RETURN(Config config, Config::LoadFile(path));
//   ASSIGN_OR_RETURN(Config store, config.Child("kvstore"));
//   RETURN_IF_ERROR(store.ReadByteSize("capacity", &options.capacity_bytes));
//   RETURN_IF_ERROR(store.ReadDuration("agent_retention", &options.agent_retention));
//   RETURN_IF_ERROR(config.CheckAllKeysUsed());
//
// Readers leave the output untouched when the key is absent (so it keeps its default) and
// return an error when the key is present with the wrong type or range. Require() turns absence
// into an error.
//
// This module uses nlohmann/json (header-only) behind this interface; callers never see it.
// Thread-compatible: a Config and the nodes obtained from it share state; use them from one
// thread at a time.

#ifndef FERRY_ENGINE_COMMON_CONFIG_H_
#define FERRY_ENGINE_COMMON_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry {

class Config {
 public:
  // `source` names the document in error messages (usually the file name).
  static absl::StatusOr<Config> Parse(absl::string_view text, absl::string_view source);
  static absl::StatusOr<Config> LoadFile(const std::string& path);

  // An empty object (no file given): every reader keeps its default.
  Config();

  // Dotted path of this node from the document root ("" for the root).
  const std::string& path() const { return path_; }

  bool Has(absl::string_view key) const;
  // NotFound naming the key's path if absent.
  absl::Status Require(absl::string_view key) const;
  // Keys of this object, in document order is not guaranteed (sorted).
  std::vector<std::string> Keys() const;

  absl::Status Read(absl::string_view key, bool* out) const;
  absl::Status Read(absl::string_view key, int32_t* out) const;
  absl::Status Read(absl::string_view key, int64_t* out) const;
  absl::Status Read(absl::string_view key, uint32_t* out) const;
  absl::Status Read(absl::string_view key, uint64_t* out) const;
  absl::Status Read(absl::string_view key, double* out) const;
  absl::Status Read(absl::string_view key, std::string* out) const;
  absl::Status Read(absl::string_view key, std::vector<std::string>* out) const;
  // An integer number of bytes or a string with a unit (units.h: "64GiB", "512MB").
  absl::Status ReadByteSize(absl::string_view key, uint64_t* out) const;
  // A string duration (units.h: "3d", "72h", "250ms"); bare numbers are refused as ambiguous.
  absl::Status ReadDuration(absl::string_view key, absl::Duration* out) const;

  // The object at `key`; an empty object if absent; an error if not an object.
  absl::StatusOr<Config> Child(absl::string_view key) const;
  // The objects of the array at `key`; empty if absent; an error if not an array of objects.
  absl::StatusOr<std::vector<Config>> Children(absl::string_view key) const;

  // InvalidArgument listing every key under this node that no reader or Child() touched.
  absl::Status CheckAllKeysUsed() const;

 private:
  struct Document;
  Config(std::shared_ptr<Document> document, const void* node, std::string path);

  std::string KeyPath(absl::string_view key) const;
  absl::Status TypeError(absl::string_view key, absl::string_view expected) const;
  // The JSON value at key (nullptr if absent), and marks the key used.
  const void* Lookup(absl::string_view key) const;
  template <typename Int>
  absl::Status ReadInteger(absl::string_view key, Int* out) const;

  std::shared_ptr<Document> document_;
  const void* node_;  // const nlohmann::json*, owned by document_
  std::string path_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_CONFIG_H_
