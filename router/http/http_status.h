// absl::Status -> HTTP: the status code a front door answers with, and the OpenAI-style error
// body ({"error": {"message", "type", "param", "code"}}) that real clients (openai, anthropic
// SDKs) parse. One table, used by every HTTP surface of Ferry.

#ifndef FERRY_ROUTER_HTTP_HTTP_STATUS_H_
#define FERRY_ROUTER_HTTP_HTTP_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {

// E.g. kInvalidArgument -> 400, kUnauthenticated -> 401, kResourceExhausted -> 429,
// kUnavailable -> 503, kDeadlineExceeded -> 504. kOk -> 200.
int HttpStatusCode(absl::StatusCode code);

// The reverse direction, for HTTP clients (an upstream's answer as a Status).
absl::StatusCode StatusCodeFromHttp(int http_status);

// OpenAI's error "type" for a code: "invalid_request_error", "authentication_error",
// "permission_error", "not_found_error", "rate_limit_error", "timeout_error", "server_error"...
absl::string_view OpenAiErrorType(absl::StatusCode code);

// {"error":{"message":...,"type":...,"param":<param or null>,"code":<code>,
//  "trace_id":...}} as compact JSON. `param` names the offending request field, if any; `code`
// is OpenAI's error code ("model_not_found", "context_length_exceeded"), by default the status
// code's name.
std::string OpenAiErrorBody(const absl::Status& status, absl::string_view trace_id,
                            absl::string_view param = "", absl::string_view code = "");

}  // namespace ferry

#endif  // FERRY_ROUTER_HTTP_HTTP_STATUS_H_
