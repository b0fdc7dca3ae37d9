#include "engine/common/hash128.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status.h"
#include "xxhash.h"

namespace ferry {
namespace {

Hash128 FromXxh(XXH128_hash_t h) { return Hash128{h.low64, h.high64}; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Hash128::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

absl::StatusOr<Hash128> Hash128::FromHex(absl::string_view hex) {
  if (hex.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("a 128-bit hash is 32 hex digits, got ", hex.size(), " characters"));
  }
  uint64_t halves[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const int v = HexValue(hex[i]);
    if (v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("not a hex digit at position ", i, " of the hash"));
    }
    halves[i / 16] = (halves[i / 16] << 4) | static_cast<uint64_t>(v);
  }
  return Hash128{halves[1], halves[0]};
}

std::ostream& operator<<(std::ostream& os, const Hash128& hash) { return os << hash.ToHex(); }

Hash128 Xxh3Hash128(absl::string_view bytes) {
  return FromXxh(XXH3_128bits(bytes.data(), bytes.size()));
}

struct Xxh3Hasher128::State {
  XXH3_state_t* xxh = nullptr;
};

Xxh3Hasher128::Xxh3Hasher128() : state_(std::make_unique<State>()) {
  state_->xxh = XXH3_createState();
  // Allocation failure of a ~600-byte state is not recoverable here.
  if (state_->xxh == nullptr) std::abort();
  XXH3_128bits_reset(state_->xxh);
}

Xxh3Hasher128::~Xxh3Hasher128() { XXH3_freeState(state_->xxh); }

void Xxh3Hasher128::Update(absl::string_view bytes) {
  XXH3_128bits_update(state_->xxh, bytes.data(), bytes.size());
}

Hash128 Xxh3Hasher128::Finish() const { return FromXxh(XXH3_128bits_digest(state_->xxh)); }

absl::StatusOr<Hash128> DigestFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return ErrnoStatus(err, absl::StrCat("cannot open ", path));
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  Xxh3Hasher128 hasher;
  std::vector<char> buffer(4 << 20);
  while (true) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot read ", path));
    }
    if (n == 0) break;
    hasher.Update(absl::string_view(buffer.data(), static_cast<size_t>(n)));
  }
  close(fd);
  return hasher.Finish();
}

}  // namespace ferry
