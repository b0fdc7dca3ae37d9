// main() of the worker's multi-process tests: gtest's flags, then the paths of ferry-worker and
// make_tiny_model.py (worker_test_util.h).

#include "gtest/gtest.h"
#include "tests/integration/worker_test_util.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ferry::InitWorkerTests(argc, argv);
  return RUN_ALL_TESTS();
}
