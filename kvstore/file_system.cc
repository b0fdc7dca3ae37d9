#include "kvstore/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace kv {
namespace {

absl::Status Errno(const std::string& what, const std::string& path, int err) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

class PosixFile : public File {
 public:
  PosixFile(std::string path, int fd, bool direct)
      : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixFile() override { ::close(fd_); }

  absl::Status Write(uint64_t offset, const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Errno("write", path_, errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return absl::OkStatus();
  }

  absl::Status WriteV(uint64_t offset, absl::Span<const iovec> buffers) override {
    std::vector<iovec> left(buffers.begin(), buffers.end());
    size_t first = 0;
    while (first < left.size()) {
      const int count = static_cast<int>(std::min<size_t>(left.size() - first, IOV_MAX));
      const ssize_t w = ::pwritev(fd_, &left[first], count, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Errno("write", path_, errno);
      }
      offset += static_cast<uint64_t>(w);
      // Skip what was written (a short write may end inside a buffer).
      size_t done = static_cast<size_t>(w);
      while (first < left.size() && done >= left[first].iov_len) done -= left[first++].iov_len;
      if (done > 0) {
        left[first].iov_base = static_cast<char*>(left[first].iov_base) + done;
        left[first].iov_len -= done;
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(uint64_t offset, void* data, size_t n) const override {
    char* p = static_cast<char*>(data);
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Errno("read", path_, errno);
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  }

  absl::Status Sync() override {
    if (::fdatasync(fd_) != 0) return Errno("fdatasync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return Errno("truncate", path_, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return Errno("stat", path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  bool direct() const override { return direct_; }

 private:
  const std::string path_;
  const int fd_;
  const bool direct_;
};

class Posix : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode,
                                             bool direct) override {
    int flags = O_CLOEXEC;
    switch (mode) {
      case OpenMode::kRead:
        flags |= O_RDONLY;
        break;
      case OpenMode::kReadWrite:
        flags |= O_RDWR;
        break;
      case OpenMode::kCreate:
        flags |= O_RDWR | O_CREAT | O_EXCL;
        break;
    }
    int fd = -1;
    bool got_direct = false;
    if (direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      got_direct = fd >= 0;
      // Filesystems without direct I/O (tmpfs) refuse it with EINVAL: buffered instead. An
      // O_CREAT that failed that way may have created the file already.
      if (fd < 0 && errno == EINVAL && mode == OpenMode::kCreate) flags &= ~O_EXCL;
    }
    if (fd < 0 && (!direct || errno == EINVAL)) fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return Errno("open", path, errno);
    return std::unique_ptr<File>(new PosixFile(path, fd, got_direct));
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return Errno("list", dir, errno);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    return names;
  }

  absl::Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return Errno("remove", path, errno);
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& dir) override {
    // Each missing component, as mkdir -p.
    for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
      const std::string part = dir.substr(0, slash);
      if (!part.empty() && ::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
        return Errno("mkdir", part, errno);
      }
      if (slash == std::string::npos) break;
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Errno("open", dir, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return Errno("fsync", dir, err);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<File>> Lock(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("open", path, errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, " is locked: another process has this store open"));
      }
      return Errno("lock", path, err);
    }
    return std::unique_ptr<File>(new PosixFile(path, fd, false));
  }
};

}  // namespace

FileSystem& PosixFileSystem() {
  static Posix* fs = new Posix;
  return *fs;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void AlignedBuffer::Resize(size_t bytes) {
  bytes = AlignUp(bytes);
  if (bytes <= size_) return;
  std::free(data_);
  data_ = nullptr;
  size_ = 0;
  void* p = nullptr;
  if (::posix_memalign(&p, kDirectIoAlignment, bytes) != 0) std::abort();
  data_ = static_cast<char*>(p);
  size_ = bytes;
}

}  // namespace kv
}  // namespace ferry
