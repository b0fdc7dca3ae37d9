#include "engine/common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace ferry {
namespace {

std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
std::atomic<int> g_min_severity{static_cast<int>(LogSeverity::kInfo)};

absl::Mutex g_sink_mu;
LogSink* g_sink ABSL_GUARDED_BY(g_sink_mu) = nullptr;

int CurrentThreadId() {
  thread_local const int tid = static_cast<int>(syscall(SYS_gettid));
  return tid;
}

absl::string_view BaseName(const char* path) {
  absl::string_view p(path);
  size_t slash = p.rfind('/');
  return slash == absl::string_view::npos ? p : p.substr(slash + 1);
}

void AppendJsonString(std::string* out, absl::string_view s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

}  // namespace

absl::string_view LogSeverityName(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kDebug:
      return "DEBUG";
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARNING";
    case LogSeverity::kError:
      return "ERROR";
    case LogSeverity::kFatal:
      return "FATAL";
  }
  return "UNKNOWN";
}

std::string FormatLogRecord(const LogRecord& record, LogFormat format) {
  std::string out;
  if (format == LogFormat::kJson) {
    out.append("{\"ts\":");
    AppendJsonString(&out,
                     absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", record.time, absl::UTCTimeZone()));
    out.append(",\"level\":");
    AppendJsonString(&out, LogSeverityName(record.severity));
    out.append(",\"thread\":");
    absl::StrAppend(&out, record.thread_id);
    out.append(",\"file\":");
    AppendJsonString(&out, record.file);
    absl::StrAppend(&out, ",\"line\":", record.line);
    if (!record.trace_id.empty()) {
      out.append(",\"trace_id\":");
      AppendJsonString(&out, record.trace_id);
    }
    out.append(",\"msg\":");
    AppendJsonString(&out, record.message);
    out.push_back('}');
    return out;
  }
  // glog-like text: "I20261129 10:41:22.123456  4242 file.cc:12] message". Newlines inside the
  // message are kept; each record still starts on its own line.
  out.push_back(LogSeverityName(record.severity)[0]);
  out.append(absl::FormatTime("%Y%m%d %H:%M:%E6S", record.time, absl::UTCTimeZone()));
  absl::StrAppendFormat(&out, " %6d %s:%d] ", record.thread_id, record.file, record.line);
  if (!record.trace_id.empty()) absl::StrAppend(&out, "[trace ", record.trace_id, "] ");
  out.append(record.message.data(), record.message.size());
  return out;
}

std::ostream& operator<<(std::ostream& os, const LogTraceId& trace) {
  if (auto* stream = dynamic_cast<log_internal::LogStream*>(&os)) {
    stream->trace_id.assign(trace.id.data(), trace.id.size());
  }
  return os;
}

void SetLogFormat(LogFormat format) { g_format.store(static_cast<int>(format)); }

LogFormat GetLogFormat() { return static_cast<LogFormat>(g_format.load()); }

void SetMinLogSeverity(LogSeverity severity) { g_min_severity.store(static_cast<int>(severity)); }

bool LogEnabled(LogSeverity severity) {
  return severity == LogSeverity::kFatal || static_cast<int>(severity) >= g_min_severity.load();
}

absl::StatusOr<LogSeverity> ParseLogSeverity(absl::string_view name) {
  if (name == "debug") return LogSeverity::kDebug;
  if (name == "info") return LogSeverity::kInfo;
  if (name == "warning") return LogSeverity::kWarning;
  if (name == "error") return LogSeverity::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", name, "' (debug, info, warning, error)"));
}

void SetLogSink(LogSink* sink) {
  absl::MutexLock lock(&g_sink_mu);
  g_sink = sink;
}

namespace log_internal {

LogMessage::LogMessage(const char* file, int line, LogSeverity severity)
    : file_(file), line_(line), severity_(severity) {}

LogMessage::~LogMessage() { Emit(); }

void LogMessage::Emit() {
  if (emitted_) return;
  emitted_ = true;
  const bool fatal = severity_ == LogSeverity::kFatal;
  if (!fatal && static_cast<int>(severity_) < g_min_severity.load()) return;
  const std::string message = stream_.str();
  LogRecord record{absl::Now(),       severity_, BaseName(file_), line_,
                   CurrentThreadId(), message,   stream_.trace_id};
  {
    absl::MutexLock lock(&g_sink_mu);
    if (g_sink != nullptr) {
      g_sink->Send(record);
    } else {
      std::string line =
          FormatLogRecord(record, static_cast<LogFormat>(g_format.load(std::memory_order_relaxed)));
      line.push_back('\n');
      std::fwrite(line.data(), 1, line.size(), stderr);
      if (severity_ >= LogSeverity::kError) std::fflush(stderr);
    }
  }
  if (fatal) {
    std::fflush(stderr);
    std::abort();
  }
}

LogMessageFatal::LogMessageFatal(const char* file, int line, absl::string_view failure)
    : message_(file, line, LogSeverity::kFatal) {
  if (!failure.empty()) message_.stream() << failure << " ";
}

LogMessageFatal::~LogMessageFatal() {
  message_.Emit();
  std::abort();  // Emit() already aborted; this tells the compiler.
}

}  // namespace log_internal
}  // namespace ferry
