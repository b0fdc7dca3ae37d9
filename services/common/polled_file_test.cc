// PolledFile: the first read at start, changes applied once, bad content refused with the old
// one kept, an unreadable file, a Kubernetes-style `..data` symlink swap, and the polling thread
// picking a change up by itself.

#include "services/common/polled_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace ferry {
namespace {

std::string TestDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_EQ(system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir).c_str()), 0);
  return dir;
}

// Replaces the file's content at once (a poller never reads it half written).
void Write(const std::string& path, const std::string& text) {
  std::ofstream(path + ".next") << text;
  ASSERT_EQ(std::rename((path + ".next").c_str(), path.c_str()), 0);
}

double Reloads(prometheus::Registry& registry, const std::string& result) {
  for (const auto& family : registry.Collect()) {
    if (family.name != "ferry_secret_reloads_total") continue;
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        if (label.name == "result" && label.value == result) return metric.counter.value;
      }
    }
  }
  return -1;
}

// Applies contents that do not start with "bad"; records what it took.
struct Recorder {
  absl::Mutex mu;
  std::vector<std::string> applied ABSL_GUARDED_BY(mu);

  PolledFile::Apply Apply() {
    return [this](const std::string& content) {
      if (content.rfind("bad", 0) == 0) return absl::InvalidArgumentError("starts with bad");
      absl::MutexLock lock(&mu);
      applied.push_back(content);
      return absl::OkStatus();
    };
  }
  std::vector<std::string> Applied() {
    absl::MutexLock lock(&mu);
    return applied;
  }
};

TEST(PolledFileTest, AppliesEachNewContentOnceAndKeepsTheOldOnAnError) {
  const std::string path = TestDir("changes") + "/secret";
  Write(path, "one");
  prometheus::Registry registry;
  Recorder r;
  auto file = PolledFile::Start({path, "test", absl::ZeroDuration(), &registry}, r.Apply());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(r.Applied(), std::vector<std::string>({"one"}));
  EXPECT_TRUE((*file)->Poll().ok());  // unchanged: nothing applied
  EXPECT_EQ(r.Applied().size(), 1u);
  EXPECT_EQ(Reloads(registry, "applied"), 0);  // the start is not a reload

  Write(path, "two");
  EXPECT_TRUE((*file)->Poll().ok());
  EXPECT_EQ(r.Applied(), std::vector<std::string>({"one", "two"}));
  EXPECT_EQ(Reloads(registry, "applied"), 1);

  Write(path, "bad content");
  EXPECT_EQ((*file)->Poll().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*file)->Poll().ok());  // the same bad content: refused once, not again
  EXPECT_EQ(Reloads(registry, "rejected"), 1);
  EXPECT_EQ(r.Applied().size(), 2u);

  ASSERT_EQ(std::remove(path.c_str()), 0);
  EXPECT_EQ((*file)->Poll().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*file)->Poll().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Reloads(registry, "rejected"), 2);  // the missing file counted once

  Write(path, "two");  // back to the content in force: applied again (it was replaced since)
  EXPECT_TRUE((*file)->Poll().ok());
  EXPECT_EQ(r.Applied(), std::vector<std::string>({"one", "two", "two"}));
  EXPECT_TRUE((*file)->Poll(/*force=*/true).ok());  // a forced poll applies even the same
  EXPECT_EQ(r.Applied().size(), 4u);
  EXPECT_EQ(Reloads(registry, "applied"), 3);
}

TEST(PolledFileTest, StartFailsOnAMissingOrRefusedFile) {
  const std::string dir = TestDir("start");
  Recorder r;
  auto missing = PolledFile::Start({dir + "/none", "test", absl::ZeroDuration()}, r.Apply());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  Write(dir + "/bad", "bad");
  auto refused = PolledFile::Start({dir + "/bad", "test", absl::ZeroDuration()}, r.Apply());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(dir + "/bad"), absl::string_view::npos);
  EXPECT_TRUE(r.Applied().empty());
}

// The kubelet's update of a Secret volume: the file is a symlink through `..data`, which is
// swapped (renamed over) to point at a new timestamped directory. The file itself never changes.
TEST(PolledFileTest, SeesAKubeletSymlinkSwap) {
  const std::string dir = TestDir("kubelet");
  ASSERT_EQ(
      system(absl::StrCat("cd ", dir, " && mkdir ..2024_01 ..2024_02 && ",
                          "echo -n old > ..2024_01/token && echo -n new > ..2024_02/token && ",
                          "ln -s ..2024_01 ..data && ln -s ..data/token token")
                 .c_str()),
      0);
  Recorder r;
  auto file = PolledFile::Start({dir + "/token", "test", absl::ZeroDuration()}, r.Apply());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(
      system(absl::StrCat("cd ", dir, " && ln -s ..2024_02 ..data_tmp && mv -T ..data_tmp ..data")
                 .c_str()),
      0);
  EXPECT_TRUE((*file)->Poll().ok());
  EXPECT_EQ(r.Applied(), std::vector<std::string>({"old", "new"}));
}

TEST(PolledFileTest, ItsThreadPicksUpAChange) {
  const std::string path = TestDir("thread") + "/secret";
  Write(path, "one");
  Recorder r;
  auto file = PolledFile::Start({path, "test", absl::Milliseconds(1)}, r.Apply());
  ASSERT_TRUE(file.ok()) << file.status();
  Write(path, "two");
  absl::MutexLock lock(&r.mu);
  EXPECT_TRUE(r.mu.AwaitWithTimeout(
      absl::Condition(
          +[](std::vector<std::string>* applied) { return applied->size() == 2; }, &r.applied),
      absl::Seconds(30)));
  EXPECT_EQ(r.applied.back(), "two");
}

}  // namespace
}  // namespace ferry
