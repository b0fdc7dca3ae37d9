// Every calibration file under deploy/sim (passed as arguments) loads, is in the canonical form
// the tool writes, says where it comes from, and describes hardware on which work costs time:
// prefill grows with tokens and with context, decode steps cost something, KV has a size.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/sim_timing.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

std::vector<std::string>* files = nullptr;

TEST(CalibrationFilesTest, EveryFileLoadsAndDescribesCostlyWork) {
  ASSERT_NE(files, nullptr);
  ASSERT_FALSE(files->empty()) << "no calibration files given";
  for (const std::string& path : *files) {
    SCOPED_TRACE(path);
    const absl::StatusOr<SimCalibration> c = LoadSimCalibration(path);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_FALSE(c->name.empty());
    EXPECT_FALSE(c->source.empty());
    EXPECT_GT(c->kv_bytes_per_token, 0);
    // The file is exactly what SimCalibrationJson writes for it (as ferry-calibrate writes
    // files): canonical, so a regenerated file differs from the old one only where it should.
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str(), SimCalibrationJson(*c));
    const SimTiming t(*c);
    const std::vector<SimRow> prefill_short = {{0, 64}}, prefill_long = {{0, 1024}};
    const std::vector<SimRow> prefill_late = {{4096, 1024}};
    EXPECT_GT(t.StepSeconds(prefill_long), t.StepSeconds(prefill_short));
    EXPECT_GT(t.StepSeconds(prefill_late), t.StepSeconds(prefill_long));
    const std::vector<SimRow> decode_one = {{1024, 1}};
    const std::vector<SimRow> decode_many(64, SimRow{1024, 1});
    EXPECT_GT(t.StepSeconds(decode_one), 0);
    EXPECT_GT(t.StepSeconds(decode_many), t.StepSeconds(decode_one));
    // One decode step is cheaper than a 1024-token prefill.
    EXPECT_LT(t.StepSeconds(decode_one), t.StepSeconds(prefill_long));
  }
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  std::vector<std::string> paths(argv + 1, argv + argc);
  ferry::files = &paths;
  return RUN_ALL_TESTS();
}
