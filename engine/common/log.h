// Ferry's one logging and CHECK facility.
//
// Debian's Abseil (20220623) has no absl/log, and Ferry keeps engine/common free of heavier
// dependencies, so this small module provides what the code base needs:
//
//   LOG(INFO) << "loaded " << n << " tensors";        // DEBUG, INFO, WARNING, ERROR, FATAL
//   if (LogEnabled(LogSeverity::kDebug)) LOG(DEBUG) << Explain(x);  // skip the formatting
//   CHECK(ptr != nullptr) << "engine not started";    // programmer bugs only: aborts
//   CHECK_EQ(a, b);  CHECK_LT(i, n);  DCHECK(x);
//
// Errors that callers can handle are absl::Status values, never CHECK failures.
//
// Output is one line per message on stderr, either text ("I20261129 10:41:22.123456 4242
// file.cc:12] message", glog-like) or JSON lines ({"ts":..., "level":..., ...}) for log
// collectors; choose with SetLogFormat() (the binaries' --log_format). Tests may install a sink
// to capture records.
//
// A record about one request carries its trace id, streamed first:
//
//   LOG(WARNING) << LogTraceId(trace_id_) << "request failed: " << status;
//
// JSON lines then have a "trace_id" field and text lines "[trace TRACE_ID] " before the message,
// so a collector can gather every line of one request across the router and the workers.
//
// Thread-safe: records from different threads never interleave within a line.

#ifndef FERRY_ENGINE_COMMON_LOG_H_
#define FERRY_ENGINE_COMMON_LOG_H_

#include <memory>
#include <sstream>
#include <string>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry {

enum class LogSeverity { kDebug = -1, kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// "DEBUG", "INFO", "WARNING", "ERROR", "FATAL".
absl::string_view LogSeverityName(LogSeverity severity);

enum class LogFormat { kText, kJson };

struct LogRecord {
  absl::Time time;
  LogSeverity severity;
  absl::string_view file;  // base name of the source file
  int line;
  int thread_id;
  absl::string_view message;
  absl::string_view trace_id;  // empty when the record is about no one request
};

// Streamed into a LOG(...), tags the record with a request's trace id (the last one streamed
// wins); into any other stream, writes nothing.
struct LogTraceId {
  explicit LogTraceId(absl::string_view trace_id) : id(trace_id) {}
  absl::string_view id;
};
std::ostream& operator<<(std::ostream& os, const LogTraceId& trace);

// Receives every emitted record. Implementations must be thread-safe.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void Send(const LogRecord& record) = 0;
};

// Formats a record as one line (without the trailing newline).
std::string FormatLogRecord(const LogRecord& record, LogFormat format);

// Process-wide settings; safe to call at any time from any thread.
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();
void SetMinLogSeverity(LogSeverity severity);  // FATAL is always emitted; INFO by default
// Whether a record of `severity` would be emitted now (to skip costly messages).
bool LogEnabled(LogSeverity severity);
// "debug", "info", "warning", "error" (a --log_level flag's values); InvalidArgument otherwise.
absl::StatusOr<LogSeverity> ParseLogSeverity(absl::string_view name);
// Replaces the stderr output with `sink` (not owned; nullptr restores stderr). Tests use this.
void SetLogSink(LogSink* sink);

namespace log_internal {

// A LOG's stream: the message, and the trace id a LogTraceId set.
class LogStream : public std::ostringstream {
 public:
  std::string trace_id;
};

// Collects one message and emits it when destroyed; FATAL then aborts the process.
class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();

  std::ostream& stream() { return stream_; }

  // Emits the record now (once); aborts the process if FATAL. The destructor calls it.
  void Emit();

 private:
  bool emitted_ = false;
  const char* file_;
  int line_;
  LogSeverity severity_;
  LogStream stream_;
};

// A FATAL message whose destructor is known not to return (for CHECK in value contexts).
class LogMessageFatal {
 public:
  LogMessageFatal(const char* file, int line, absl::string_view failure);
  LogMessageFatal(const LogMessageFatal&) = delete;
  LogMessageFatal& operator=(const LogMessageFatal&) = delete;
  ABSL_ATTRIBUTE_NORETURN ~LogMessageFatal();

  std::ostream& stream() { return message_.stream(); }

 private:
  LogMessage message_;
};

// Returns nullptr when `a op b` holds, otherwise "expr (a vs. b)".
template <typename A, typename B, typename Op>
std::unique_ptr<std::string> CheckOp(const A& a, const B& b, Op op, const char* expr) {
  if (ABSL_PREDICT_TRUE(op(a, b))) return nullptr;
  std::ostringstream os;
  os << expr << " (" << a << " vs. " << b << ")";
  return std::make_unique<std::string>(os.str());
}

}  // namespace log_internal
}  // namespace ferry

#define FERRY_LOG_DEBUG \
  ::ferry::log_internal::LogMessage(__FILE__, __LINE__, ::ferry::LogSeverity::kDebug)
#define FERRY_LOG_INFO \
  ::ferry::log_internal::LogMessage(__FILE__, __LINE__, ::ferry::LogSeverity::kInfo)
#define FERRY_LOG_WARNING \
  ::ferry::log_internal::LogMessage(__FILE__, __LINE__, ::ferry::LogSeverity::kWarning)
#define FERRY_LOG_ERROR \
  ::ferry::log_internal::LogMessage(__FILE__, __LINE__, ::ferry::LogSeverity::kError)
#define FERRY_LOG_FATAL ::ferry::log_internal::LogMessageFatal(__FILE__, __LINE__, "")

#define LOG(severity) FERRY_LOG_##severity.stream()

// The loop body runs at most once: LogMessageFatal's destructor aborts.
#define CHECK(condition)                   \
  while (ABSL_PREDICT_FALSE(!(condition))) \
  ::ferry::log_internal::LogMessageFatal(__FILE__, __LINE__, "Check failed: " #condition).stream()

#define FERRY_CHECK_OP_(op, a, b)                                                                \
  while (::std::unique_ptr<::std::string> ferry_check_failure_ = ::ferry::log_internal::CheckOp( \
             (a), (b), [](const auto& x, const auto& y) { return x op y; }, #a " " #op " " #b))  \
  ::ferry::log_internal::LogMessageFatal(__FILE__, __LINE__,                                     \
                                         "Check failed: " + *ferry_check_failure_)               \
      .stream()

#define CHECK_EQ(a, b) FERRY_CHECK_OP_(==, a, b)
#define CHECK_NE(a, b) FERRY_CHECK_OP_(!=, a, b)
#define CHECK_LT(a, b) FERRY_CHECK_OP_(<, a, b)
#define CHECK_LE(a, b) FERRY_CHECK_OP_(<=, a, b)
#define CHECK_GT(a, b) FERRY_CHECK_OP_(>, a, b)
#define CHECK_GE(a, b) FERRY_CHECK_OP_(>=, a, b)

// Aborts with the status when `status_expr` is not OK (for states that cannot be errors).
#define CHECK_OK(status_expr)                                                                      \
  if (const ::absl::Status ferry_check_status_ = (status_expr);                                    \
      ABSL_PREDICT_TRUE(ferry_check_status_.ok())) {                                               \
  } else                                                                                           \
    ::ferry::log_internal::LogMessageFatal(                                                        \
        __FILE__, __LINE__, "Check failed: " #status_expr " is " + ferry_check_status_.ToString()) \
        .stream()

#ifdef NDEBUG
#define DCHECK(condition) \
  while (false) CHECK(condition)
#else
#define DCHECK(condition) CHECK(condition)
#endif

#endif  // FERRY_ENGINE_COMMON_LOG_H_
