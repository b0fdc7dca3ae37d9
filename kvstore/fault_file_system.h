// A FileSystem for crash tests: passes everything to another FileSystem and remembers what is
// durable, so that Crash() can drop every byte that was not fsynced, as a power loss would
// (kill -9 cannot: the page cache survives it).
//
// Model: a file's durable length is its length at its last Sync(); a file created since the
// last SyncDir() of its directory is not durable at all. Crash() truncates every file it has
// seen to its durable length, removes files whose creation was never made durable, and makes
// every later operation (on any file opened through it) fail with Unavailable. Writes are
// assumed to be appends or in-place rewrites of bytes beyond the durable length, which is how
// the KV store writes. Removals are applied at once (a real crash could resurrect an unlinked
// file whose directory was not synced; the store tolerates that, it is not simulated).
//
// Thread-safe.

#ifndef FERRY_KVSTORE_FAULT_FILE_SYSTEM_H_
#define FERRY_KVSTORE_FAULT_FILE_SYSTEM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kvstore/file_system.h"

namespace ferry {
namespace kv {

class FaultFileSystem : public FileSystem {
 public:
  explicit FaultFileSystem(FileSystem* base) : base_(base) {}

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode,
                                             bool direct) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::StatusOr<std::unique_ptr<File>> Lock(const std::string& path) override;

  // Drops what was not durable; every operation afterwards fails. Returns the bytes dropped.
  int64_t Crash();
  bool crashed() const;

  struct State {
    uint64_t written = 0;  // the file's length as far as this layer has seen
    uint64_t synced = 0;   // durable length
    bool name_durable = true;
  };

 private:
  friend class FaultFile;
  absl::Status Check() const;

  FileSystem* const base_;
  mutable absl::Mutex mu_;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, State> files_ ABSL_GUARDED_BY(mu_);  // by path
};

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_FAULT_FILE_SYSTEM_H_
