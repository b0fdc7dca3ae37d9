// Fuzz target for the Kubernetes API parsers: any body yields a value or a Status, never a crash,
// and an error Status quotes the body only bounded.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "services/planner/kubernetes_objects.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  (void)ferry::ParseDeployment(body);
  (void)ferry::ParseScale(body);
  (void)ferry::ParsePodList(body);
  const absl::Status error = ferry::ApiError(500, body, "GET /x");
  if (error.ok() || error.message().size() > 1200) std::abort();
  return 0;
}
