#include "router/http/http_status.h"

#include "absl/strings/ascii.h"
#include "nlohmann/json.hpp"

namespace ferry {

int HttpStatusCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;  // client closed request (nginx's convention); rarely seen by the client
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    default:
      return 500;
  }
}

absl::StatusCode StatusCodeFromHttp(int http_status) {
  if (http_status >= 200 && http_status < 300) return absl::StatusCode::kOk;
  switch (http_status) {
    case 400:
    case 413:
    case 415:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 409:
      return absl::StatusCode::kAborted;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 499:
      return absl::StatusCode::kCancelled;
    case 501:
      return absl::StatusCode::kUnimplemented;
    case 502:
    case 503:
      return absl::StatusCode::kUnavailable;
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      if (http_status >= 400 && http_status < 500) return absl::StatusCode::kFailedPrecondition;
      if (http_status >= 500 && http_status < 600) return absl::StatusCode::kInternal;
      return absl::StatusCode::kUnknown;
  }
}

absl::string_view OpenAiErrorType(absl::StatusCode code) {
  switch (HttpStatusCode(code)) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 409:
      return "conflict_error";
    case 429:
      return "rate_limit_error";
    case 499:
      return "cancelled_error";
    case 501:
      return "not_implemented_error";
    case 503:
      return "overloaded_error";
    case 504:
      return "timeout_error";
    default:
      return "server_error";
  }
}

std::string OpenAiErrorBody(const absl::Status& status, absl::string_view trace_id,
                            absl::string_view param, absl::string_view code) {
  nlohmann::json error = {
      {"message", std::string(status.message())},
      {"type", std::string(OpenAiErrorType(status.code()))},
      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::string(param))},
      {"code", code.empty() ? absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))
                            : std::string(code)},
  };
  if (!trace_id.empty()) error["trace_id"] = std::string(trace_id);
  // Replace invalid UTF-8 in messages (they may quote client input) instead of failing.
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry
