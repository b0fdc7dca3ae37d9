// The file seam of the KV store: the few file operations the store needs, so that tests can put a
// fault-injecting layer underneath (fault_file_system.h) and so that direct I/O is decided in one
// place.
//
// Direct I/O (O_DIRECT) bypasses the page cache: buffers, offsets and lengths must then be
// multiples of kDirectIoAlignment. Open() asks for it and falls back to buffered I/O where the
// filesystem refuses it (tmpfs); File::direct() says which one a file got.

#ifndef FERRY_KVSTORE_FILE_SYSTEM_H_
#define FERRY_KVSTORE_FILE_SYSTEM_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ferry {
namespace kv {

inline constexpr size_t kDirectIoAlignment = 4096;

// Thread-safe: positional reads and writes may run concurrently (on disjoint ranges).
class File {
 public:
  virtual ~File() = default;
  // Writes all of `n` bytes at `offset`.
  virtual absl::Status Write(uint64_t offset, const void* data, size_t n) = 0;
  // Writes the buffers one after the other from `offset` (pwritev), all of them.
  virtual absl::Status WriteV(uint64_t offset, absl::Span<const iovec> buffers) = 0;
  // Reads up to `n` bytes at `offset`; fewer only at the end of the file.
  virtual absl::StatusOr<size_t> Read(uint64_t offset, void* data, size_t n) const = 0;
  // Makes every byte written so far durable (fdatasync).
  virtual absl::Status Sync() = 0;
  virtual absl::Status Truncate(uint64_t size) = 0;
  virtual absl::StatusOr<uint64_t> Size() const = 0;
  virtual bool direct() const = 0;
};

enum class OpenMode { kRead, kReadWrite, kCreate /* read-write, must not exist */ };

// Thread-safe.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode,
                                                     bool direct) = 0;
  // Names (not paths) of the entries of `dir`, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& dir) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  // Creates `dir` and any missing parent (ok when it exists).
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // Makes the creation and removal of entries of `dir` durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // An exclusive advisory lock on `path` (created if missing), held until the returned object is
  // destroyed or the process ends; FailedPrecondition when another process holds it.
  virtual absl::StatusOr<std::unique_ptr<File>> Lock(const std::string& path) = 0;
};

// The process's POSIX file system. Never destroyed.
FileSystem& PosixFileSystem();

// A buffer aligned for direct I/O.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) { Resize(bytes); }
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Grows to at least `bytes` (rounded up to the alignment); contents are not kept.
  void Resize(size_t bytes);
  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

inline uint64_t AlignUp(uint64_t n) {
  return (n + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
}

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_FILE_SYSTEM_H_
