#include "kvstore/fault_file_system.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace kv {

class FaultFile : public File {
 public:
  FaultFile(FaultFileSystem* fs, std::string path, std::unique_ptr<File> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}

  absl::Status Write(uint64_t offset, const void* data, size_t n) override {
    absl::MutexLock lock(&fs_->mu_);
    if (fs_->crashed_) return absl::UnavailableError("crashed");
    absl::Status s = base_->Write(offset, data, n);
    FaultFileSystem::State& st = fs_->files_[path_];
    st.written = std::max<uint64_t>(st.written, offset + n);
    return s;
  }
  absl::Status WriteV(uint64_t offset, absl::Span<const iovec> buffers) override {
    absl::MutexLock lock(&fs_->mu_);
    if (fs_->crashed_) return absl::UnavailableError("crashed");
    absl::Status s = base_->WriteV(offset, buffers);
    uint64_t n = 0;
    for (const iovec& b : buffers) n += b.iov_len;
    FaultFileSystem::State& st = fs_->files_[path_];
    st.written = std::max<uint64_t>(st.written, offset + n);
    return s;
  }
  absl::StatusOr<size_t> Read(uint64_t offset, void* data, size_t n) const override {
    if (absl::Status s = fs_->Check(); !s.ok()) return s;
    return base_->Read(offset, data, n);
  }
  absl::Status Sync() override {
    absl::MutexLock lock(&fs_->mu_);
    if (fs_->crashed_) return absl::UnavailableError("crashed");
    absl::Status s = base_->Sync();
    if (s.ok()) {
      auto size = base_->Size();
      if (size.ok()) fs_->files_[path_].synced = *size;
    }
    return s;
  }
  absl::Status Truncate(uint64_t size) override {
    absl::MutexLock lock(&fs_->mu_);
    if (fs_->crashed_) return absl::UnavailableError("crashed");
    absl::Status s = base_->Truncate(size);
    FaultFileSystem::State& st = fs_->files_[path_];
    st.written = size;
    st.synced = std::min(st.synced, size);
    return s;
  }
  absl::StatusOr<uint64_t> Size() const override {
    if (absl::Status s = fs_->Check(); !s.ok()) return s;
    return base_->Size();
  }
  bool direct() const override { return base_->direct(); }

 private:
  FaultFileSystem* const fs_;
  const std::string path_;
  std::unique_ptr<File> base_;
};

absl::Status FaultFileSystem::Check() const {
  absl::MutexLock lock(&mu_);
  return crashed_ ? absl::UnavailableError("crashed") : absl::OkStatus();
}

bool FaultFileSystem::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

absl::StatusOr<std::unique_ptr<File>> FaultFileSystem::Open(const std::string& path, OpenMode mode,
                                                            bool direct) {
  if (absl::Status s = Check(); !s.ok()) return s;
  auto file = base_->Open(path, mode, direct);
  if (!file.ok()) return file.status();
  {
    absl::MutexLock lock(&mu_);
    if (!files_.count(path)) {
      // A file that existed before this layer saw it is durable as it is.
      State st;
      auto size = (*file)->Size();
      st.written = st.synced = size.ok() ? *size : 0;
      st.name_durable = mode != OpenMode::kCreate;
      if (mode == OpenMode::kCreate) st.written = st.synced = 0;
      files_[path] = st;
    }
  }
  return std::unique_ptr<File>(new FaultFile(this, path, std::move(*file)));
}

absl::StatusOr<std::vector<std::string>> FaultFileSystem::List(const std::string& dir) {
  if (absl::Status s = Check(); !s.ok()) return s;
  return base_->List(dir);
}

absl::Status FaultFileSystem::Remove(const std::string& path) {
  if (absl::Status s = Check(); !s.ok()) return s;
  absl::Status s = base_->Remove(path);
  absl::MutexLock lock(&mu_);
  files_.erase(path);
  return s;
}

absl::Status FaultFileSystem::CreateDir(const std::string& dir) {
  if (absl::Status s = Check(); !s.ok()) return s;
  return base_->CreateDir(dir);
}

absl::Status FaultFileSystem::SyncDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  if (crashed_) return absl::UnavailableError("crashed");
  absl::Status s = base_->SyncDir(dir);
  if (s.ok()) {
    for (auto& [path, st] : files_) {
      if (absl::StartsWith(path, dir + "/")) st.name_durable = true;
    }
  }
  return s;
}

absl::StatusOr<std::unique_ptr<File>> FaultFileSystem::Lock(const std::string& path) {
  if (absl::Status s = Check(); !s.ok()) return s;
  return base_->Lock(path);
}

int64_t FaultFileSystem::Crash() {
  absl::MutexLock lock(&mu_);
  crashed_ = true;
  int64_t dropped = 0;
  for (auto& [path, st] : files_) {
    auto file = base_->Open(path, OpenMode::kReadWrite, false);
    if (!file.ok()) continue;
    auto size = (*file)->Size();
    if (!st.name_durable) {
      dropped += size.ok() ? static_cast<int64_t>(*size) : 0;
      file->reset();
      base_->Remove(path).IgnoreError();
      continue;
    }
    if (size.ok() && *size > st.synced) {
      dropped += static_cast<int64_t>(*size - st.synced);
      (*file)->Truncate(st.synced).IgnoreError();
    }
  }
  files_.clear();
  return dropped;
}

}  // namespace kv
}  // namespace ferry
