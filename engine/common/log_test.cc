#include "engine/common/log.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

class CapturingSink : public LogSink {
 public:
  void Send(const LogRecord& record) override {
    absl::MutexLock lock(&mu_);
    lines_.push_back(FormatLogRecord(record, LogFormat::kJson));
    severities_.push_back(record.severity);
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  std::vector<LogSeverity> severities() {
    absl::MutexLock lock(&mu_);
    return severities_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_;
  std::vector<LogSeverity> severities_;
};

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override { SetLogSink(&sink_); }
  void TearDown() override {
    SetLogSink(nullptr);
    SetMinLogSeverity(LogSeverity::kInfo);
  }
  CapturingSink sink_;
};

TEST_F(LogTest, RecordsCarrySeverityFileLineAndMessage) {
  LOG(INFO) << "loaded " << 30 << " layers";
  LOG(WARNING) << "slow";
  const auto lines = sink_.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("\"level\":\"INFO\""), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("\"file\":\"log_test.cc\""), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("\"msg\":\"loaded 30 layers\""), std::string::npos) << lines[0];
  EXPECT_EQ(sink_.severities()[1], LogSeverity::kWarning);
}

TEST_F(LogTest, MinSeverityFilters) {
  SetMinLogSeverity(LogSeverity::kError);
  LOG(INFO) << "dropped";
  LOG(WARNING) << "dropped";
  LOG(ERROR) << "kept";
  ASSERT_EQ(sink_.lines().size(), 1u);
  EXPECT_EQ(sink_.severities()[0], LogSeverity::kError);
}

TEST(LogFormatTest, JsonEscapesAndTextLayout) {
  const std::string message = "quote \" backslash \\ newline \n tab \t ctrl \x01";
  LogRecord record{
      absl::FromUnixMicros(1'700'000'000'123'456), LogSeverity::kError, "x.cc", 7, 42, message};
  EXPECT_EQ(FormatLogRecord(record, LogFormat::kJson),
            "{\"ts\":\"2023-11-14T22:13:20.123456Z\",\"level\":\"ERROR\",\"thread\":42,"
            "\"file\":\"x.cc\",\"line\":7,\"msg\":\"quote \\\" backslash \\\\ newline \\n tab "
            "\\t ctrl \\u0001\"}");
  record.message = "hello";
  EXPECT_EQ(FormatLogRecord(record, LogFormat::kText),
            "E20231114 22:13:20.123456     42 x.cc:7] hello");
}

TEST_F(LogTest, ATraceIdTagsItsRecordOnly) {
  const std::string trace = "req-7f3a";
  LOG(WARNING) << LogTraceId(trace) << "failed on worker " << 2;
  LOG(INFO) << "no request";
  const auto lines = sink_.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("\"trace_id\":\"req-7f3a\",\"msg\":\"failed on worker 2\""),
            std::string::npos)
      << lines[0];
  EXPECT_EQ(lines[1].find("trace_id"), std::string::npos) << lines[1];
  // Into another stream the tag writes nothing.
  std::ostringstream other;
  other << LogTraceId(trace) << "x";
  EXPECT_EQ(other.str(), "x");
}

TEST(LogFormatTest, TraceIdInJsonAndText) {
  LogRecord record{absl::FromUnixMicros(1'700'000'000'123'456),
                   LogSeverity::kInfo,
                   "x.cc",
                   7,
                   42,
                   "moved",
                   "abc\"1"};
  EXPECT_EQ(FormatLogRecord(record, LogFormat::kJson),
            "{\"ts\":\"2023-11-14T22:13:20.123456Z\",\"level\":\"INFO\",\"thread\":42,"
            "\"file\":\"x.cc\",\"line\":7,\"trace_id\":\"abc\\\"1\",\"msg\":\"moved\"}");
  EXPECT_EQ(FormatLogRecord(record, LogFormat::kText),
            "I20231114 22:13:20.123456     42 x.cc:7] [trace abc\"1] moved");
}

TEST(LogDeathTest, CheckFailuresAbortWithTheirValues) {
  int three = 3;
  EXPECT_DEATH(CHECK(three == 4) << "context", "Check failed: three == 4 context");
  EXPECT_DEATH(CHECK_EQ(three, 4), "Check failed: three == 4 \\(3 vs. 4\\)");
  EXPECT_DEATH(CHECK_LT(three, 2), "three < 2 \\(3 vs. 2\\)");
  EXPECT_DEATH(CHECK_OK(absl::InternalError("boom")), "is INTERNAL: boom");
  EXPECT_DEATH(LOG(FATAL) << "fatal message", "fatal message");
}

TEST(LogDeathTest, PassingChecksEvaluateOnceAndDoNothing) {
  int calls = 0;
  auto next = [&] { return ++calls; };
  CHECK_EQ(next(), 1);
  CHECK(next() == 2);
  CHECK_OK(absl::OkStatus());
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace ferry
