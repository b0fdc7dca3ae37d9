#include "services/common/grpc_log.h"

#include <grpc/support/log.h>

#include "engine/common/log.h"

namespace ferry {
namespace {

void ToFerryLog(gpr_log_func_args* args) {
  LogSeverity severity = LogSeverity::kInfo;
  if (args->severity == GPR_LOG_SEVERITY_ERROR) {
    severity = LogSeverity::kError;
  } else if (args->severity == GPR_LOG_SEVERITY_DEBUG) {
    severity = LogSeverity::kDebug;
  }
  if (!LogEnabled(severity)) return;
  log_internal::LogMessage(args->file, args->line, severity).stream() << "gRPC: " << args->message;
}

}  // namespace

void RouteGrpcLogs() { gpr_set_log_function(&ToFerryLog); }

}  // namespace ferry
