// CreateBackend (backend_factory.h): the CPU backend by name, an unknown name refused, and the
// CUDA plugin loaded with dlopen: where the build has the toolkit the plugin is built beside this
// test and must load, then say there is no GPU (FailedPrecondition) or make a CUDA backend; a
// path with no plugin is NotFound, with the paths tried in the message.

#include "engine/backends/backend_factory.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(BackendFactoryTest, MakesTheCpuBackend) {
  BackendOptions o;
  o.threads = 1;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name().rfind("cpu", 0), 0u) << (*b)->name();
  EXPECT_EQ((*b)->fingerprint_tag(), "");
}

TEST(BackendFactoryTest, RefusesAnUnknownKind) {
  BackendOptions o;
  o.kind = "tpu";
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("cpu or cuda"), absl::string_view::npos);
}

TEST(BackendFactoryTest, AMissingPluginIsNotFound) {
  BackendOptions o;
  o.kind = "cuda";
  o.cuda_plugin = "/nonexistent/libferry_cuda.so";
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(b.status().message().find("/nonexistent/libferry_cuda.so"), absl::string_view::npos);
}

TEST(BackendFactoryTest, LoadsTheCudaPlugin) {
  const char* built = std::getenv("FERRY_TEST_CUDA_PLUGIN");
  if (built == nullptr || std::string(built) != "1") {
    // A build without the toolkit has no plugin: the search must say so.
    BackendOptions o;
    o.kind = "cuda";
    EXPECT_EQ(CreateBackend(o).status().code(), absl::StatusCode::kNotFound);
    return;
  }
  BackendOptions o;
  o.kind = "cuda";
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(o);
  if (b.ok()) {  // a machine with a GPU
    EXPECT_EQ((*b)->name().rfind("cuda:", 0), 0u) << (*b)->name();
    EXPECT_FALSE((*b)->fingerprint_tag().empty());
    return;
  }
  // Loaded, then no usable device: FailedPrecondition with the runtime's reason.
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_NE(b.status().message().find("CUDA device"), absl::string_view::npos) << b.status();
}

}  // namespace
}  // namespace ferry
