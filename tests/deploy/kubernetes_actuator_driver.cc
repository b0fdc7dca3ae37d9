// Drives the Kubernetes actuator (services/planner/kubernetes_actuator.h) for
// kubernetes_actuator_contract_test.py: one JSON command a line on stdin, one JSON answer a line
// on stdout, in order.
//
//   kubernetes_actuator_driver --api_server=URL [--token_file=F] [--ca_file=F] [--namespace=NS]
//                              [--max_response_bytes=N]
//   {"op": "replicas", "pool": "decode", "timeout_ms": 2000}
//     -> {"code": "OK", "message": "", "spec": 2, "ready": 1, "changing": false}
//   {"op": "scale", "pool": "decode", "replicas": 1, "timeout_ms": 2000,
//    "workers": [{"id": "10.0.0.1:50051", "ready": true, "draining": false, "inflight": 3,
//                 "running_requests": 3, "queued_requests": 0, "running_tokens": 900}]}
//     -> {"code": "OK", "message": ""}
// An error answers {"code": "PERMISSION_DENIED", "message": "..."} (absl's code name). The
// actuator failing to start prints {"code": ..., "message": ...} and exits 1.

#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "services/planner/kubernetes_actuator.h"

namespace {

using Json = nlohmann::json;

Json Answer(const absl::Status& status) {
  return {{"code", absl::StatusCodeToString(status.code())},
          {"message", std::string(status.message())}};
}

ferry::WorkerSample Worker(const Json& j) {
  ferry::WorkerSample w;
  w.id = j.value("id", "");
  w.ready = j.value("ready", true);
  w.draining = j.value("draining", false);
  w.inflight = j.value("inflight", int64_t{0});
  w.running_requests = j.value("running_requests", int64_t{0});
  w.queued_requests = j.value("queued_requests", int64_t{0});
  w.running_tokens = j.value("running_tokens", int64_t{0});
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::KubernetesActuatorOptions options;
  options.token_file = "";
  options.ca_file = "";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--api_server") {
      options.api_server = value;
    } else if (key == "--token_file") {
      options.token_file = value;
    } else if (key == "--ca_file") {
      options.ca_file = value;
    } else if (key == "--namespace") {
      options.namespace_name = value;
    } else if (key == "--max_response_bytes" &&
               absl::SimpleAtoi(value, &options.max_response_bytes)) {
    } else {
      std::cerr << "unknown argument " << arg << "\n";
      return 2;
    }
  }
  auto actuator = ferry::NewKubernetesActuator(options);
  if (!actuator.ok()) {
    std::cout << Answer(actuator.status()).dump() << std::endl;
    return 1;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    const Json command = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!command.is_object()) {
      std::cout << Answer(absl::InvalidArgumentError("not a JSON object")).dump() << std::endl;
      continue;
    }
    ferry::PoolRole pool;
    if (!ferry::ParsePoolRole(command.value("pool", ""), &pool)) {
      std::cout << Answer(absl::InvalidArgumentError("unknown pool")).dump() << std::endl;
      continue;
    }
    const absl::Time deadline =
        absl::Now() + absl::Milliseconds(command.value("timeout_ms", int64_t{5000}));
    const std::string op = command.value("op", "");
    Json answer;
    if (op == "replicas") {
      const auto replicas = (*actuator)->Replicas(pool, deadline);
      answer = Answer(replicas.status());
      if (replicas.ok()) {
        answer["spec"] = replicas->spec;
        answer["ready"] = replicas->ready;
        answer["changing"] = replicas->changing;
      }
    } else if (op == "scale") {
      std::vector<ferry::WorkerSample> workers;
      for (const Json& w : command.value("workers", Json::array())) workers.push_back(Worker(w));
      answer = Answer(
          (*actuator)->Scale(pool, command.value("replicas", int64_t{-1}), workers, deadline));
    } else {
      answer = Answer(absl::InvalidArgumentError("unknown op"));
    }
    std::cout << answer.dump() << std::endl;
  }
  return 0;
}
