// gRPC's own log lines (gpr_log: connection failures, its internal errors) through Ferry's log
// (engine/common/log.h), so that they take --log_format and --log_level like every other line: a
// JSON log stays one JSON object a line. Their file and line are gRPC's; "gRPC" starts the message.
//
// Call once from main, after the command line is parsed and before the first gRPC object is made;
// process-wide.

#ifndef FERRY_SERVICES_COMMON_GRPC_LOG_H_
#define FERRY_SERVICES_COMMON_GRPC_LOG_H_

namespace ferry {

void RouteGrpcLogs();

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_GRPC_LOG_H_
