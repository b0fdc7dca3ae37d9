#include "services/planner/kubernetes_objects.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxMessageBytes = 1024;
constexpr size_t kMaxBodyQuoteBytes = 256;

absl::StatusOr<Json> ParseJson(absl::string_view body, absl::string_view what) {
  Json doc = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the response is not JSON"));
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the response is not a JSON object"));
  }
  return doc;
}

// The member `key` of `obj` (an object), or null when absent.
const Json* Member(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// obj[a][b]..., null when any level is absent (or not an object).
const Json* Path(const Json& obj, std::initializer_list<const char*> keys) {
  const Json* at = &obj;
  for (const char* key : keys) {
    at = Member(*at, key);
    if (at == nullptr) return nullptr;
  }
  return at;
}

// A non-negative integer field within int32 (replica counts), or `absent` when the field is
// absent or null.
absl::StatusOr<int64_t> Count(const Json& obj, std::initializer_list<const char*> keys,
                              int64_t absent, absl::string_view what, absl::string_view field) {
  const Json* v = Path(obj, keys);
  if (v == nullptr || v->is_null()) return absent;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(u);
    }
  } else if (v->is_number_integer()) {
    const int64_t i = v->get<int64_t>();
    if (i >= 0) return i;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", field, " is not a non-negative integer"));
}

absl::StatusOr<std::string> String(const Json& obj, std::initializer_list<const char*> keys,
                                   absl::string_view what, absl::string_view field) {
  const Json* v = Path(obj, keys);
  if (v == nullptr || v->is_null()) return std::string();
  if (!v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", field, " is not a string"));
  }
  return v->get<std::string>();
}

// Printable ASCII and UTF-8 bytes kept, control characters as spaces, cut at `limit` bytes.
std::string Printable(absl::string_view text, size_t limit) {
  std::string out;
  out.reserve(std::min(text.size(), limit));
  for (const char c : text) {
    if (out.size() >= limit) {
      out += "...";
      break;
    }
    const unsigned char u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7f ? ' ' : c);
  }
  return out;
}

absl::StatusCode CodeForHttp(int http_code) {
  switch (http_code) {
    case 400:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
    case 410:
      return absl::StatusCode::kNotFound;
    case 409:
      return absl::StatusCode::kAborted;
    case 429:
    case 502:
    case 503:
      return absl::StatusCode::kUnavailable;
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      break;
  }
  if (http_code >= 400 && http_code < 500) return absl::StatusCode::kFailedPrecondition;
  return absl::StatusCode::kInternal;
}

}  // namespace

absl::StatusOr<DeploymentState> ParseDeployment(absl::string_view body) {
  constexpr absl::string_view kWhat = "Deployment";
  auto doc = ParseJson(body, kWhat);
  if (!doc.ok()) return doc.status();
  const Json* kind = Member(*doc, "kind");
  if (kind != nullptr && !(kind->is_string() && kind->get<std::string>() == "Deployment")) {
    return absl::InvalidArgumentError("Deployment: the response's kind is not Deployment");
  }
  DeploymentState d;
  // The API server defaults spec.replicas to 1 and always returns it.
  auto spec = Count(*doc, {"spec", "replicas"}, 1, kWhat, "spec.replicas");
  auto replicas = Count(*doc, {"status", "replicas"}, 0, kWhat, "status.replicas");
  auto ready = Count(*doc, {"status", "readyReplicas"}, 0, kWhat, "status.readyReplicas");
  auto generation = Count(*doc, {"metadata", "generation"}, 0, kWhat, "metadata.generation");
  auto observed =
      Count(*doc, {"status", "observedGeneration"}, 0, kWhat, "status.observedGeneration");
  for (const auto* s : {&spec, &replicas, &ready, &generation, &observed}) {
    if (!s->ok()) return s->status();
  }
  d.spec_replicas = *spec;
  d.replicas = *replicas;
  d.ready_replicas = *ready;
  d.generation = *generation;
  d.observed_generation = *observed;
  return d;
}

absl::StatusOr<ScaleState> ParseScale(absl::string_view body) {
  constexpr absl::string_view kWhat = "Scale";
  auto doc = ParseJson(body, kWhat);
  if (!doc.ok()) return doc.status();
  const Json* kind = Member(*doc, "kind");
  if (kind != nullptr && !(kind->is_string() && kind->get<std::string>() == "Scale")) {
    return absl::InvalidArgumentError("Scale: the response's kind is not Scale");
  }
  ScaleState s;
  auto replicas = Count(*doc, {"spec", "replicas"}, 0, kWhat, "spec.replicas");
  if (!replicas.ok()) return replicas.status();
  auto version = String(*doc, {"metadata", "resourceVersion"}, kWhat, "metadata.resourceVersion");
  if (!version.ok()) return version.status();
  s.spec_replicas = *replicas;
  s.resource_version = std::move(*version);
  return s;
}

absl::StatusOr<std::vector<PodState>> ParsePodList(absl::string_view body) {
  constexpr absl::string_view kWhat = "PodList";
  auto doc = ParseJson(body, kWhat);
  if (!doc.ok()) return doc.status();
  const Json* items = Member(*doc, "items");
  if (items == nullptr || items->is_null()) return std::vector<PodState>();
  if (!items->is_array()) return absl::InvalidArgumentError("PodList: items is not an array");
  std::vector<PodState> pods;
  pods.reserve(items->size());
  for (const Json& item : *items) {
    if (!item.is_object()) {
      return absl::InvalidArgumentError("PodList: an item is not an object");
    }
    PodState pod;
    auto name = String(item, {"metadata", "name"}, kWhat, "metadata.name");
    if (!name.ok()) return name.status();
    if (name->empty()) return absl::InvalidArgumentError("PodList: a pod has no metadata.name");
    auto ip = String(item, {"status", "podIP"}, kWhat, "status.podIP");
    if (!ip.ok()) return ip.status();
    auto deleted =
        String(item, {"metadata", "deletionTimestamp"}, kWhat, "metadata.deletionTimestamp");
    if (!deleted.ok()) return deleted.status();
    auto cost = String(item, {"metadata", "annotations", kPodDeletionCostAnnotation}, kWhat,
                       "the pod-deletion-cost annotation");
    if (!cost.ok()) return cost.status();
    pod.name = std::move(*name);
    pod.ip = std::move(*ip);
    pod.deleting = !deleted->empty();
    pod.deletion_cost = std::move(*cost);
    pods.push_back(std::move(pod));
  }
  return pods;
}

std::string ScalePatch(int64_t replicas, const std::string& resource_version) {
  Json patch = {{"spec", {{"replicas", replicas}}}};
  if (!resource_version.empty()) {
    patch["metadata"] = {{"resourceVersion", resource_version}};
  }
  return patch.dump();
}

std::string PodDeletionCostPatch(int32_t cost) {
  const Json patch = {
      {"metadata", {{"annotations", {{kPodDeletionCostAnnotation, std::to_string(cost)}}}}}};
  return patch.dump();
}

absl::Status ApiError(int http_code, absl::string_view body, absl::string_view what) {
  std::string message;
  const Json doc = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (const Json* m = Member(doc, "message"); m != nullptr && m->is_string()) {
    message = Printable(m->get_ref<const std::string&>(), kMaxMessageBytes);
  } else if (body.empty()) {
    message = "(empty body)";
  } else {
    message = Printable(body, kMaxBodyQuoteBytes);
  }
  return absl::Status(CodeForHttp(http_code),
                      absl::StrCat(what, ": HTTP ", http_code, ": ", message));
}

}  // namespace ferry
