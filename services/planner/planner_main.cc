// ferry-planner: sizes the prefill and decode (or aggregated) pools from live load
// (planner_service.h; how it decides: planner.h; docs/operations/planner.md). It reads the routers'
// admin pages every --interval and asks the --actuator for each change:
//
//   ferry-planner --routers=127.0.0.1:9101 --actuator=local --ferry_state=.ferry   # ./ferry up
//   --planner ferry-planner --routers=router-0:9101,router-1:9101 --actuator=kubernetes
//   ferry-planner --routers=... --actuator=advice    # decides and exports, changes nothing
//
// /metrics, /healthz, /readyz and GET /plan on the admin port; prints "admin_port=N" once serving.
// SIGTERM: the loop ends after its round, a local scale under way is waited for a little and then
// left to finish, exit 0.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "engine/common/log.h"
#include "services/common/command_line.h"
#include "services/common/dns_discovery.h"
#include "services/common/host_port.h"
#include "services/common/termination_signal.h"
#include "services/planner/actuator_factory.h"
#include "services/planner/kubernetes_flags.h"
#include "services/planner/planner.h"
#include "services/planner/planner_service.h"

ABSL_FLAG(std::vector<std::string>, routers, {},
          "the routers' admin addresses (host:port, comma-separated): every router replica, each "
          "read on its own");
ABSL_FLAG(std::vector<std::string>, routers_dns, {},
          "the routers' admin ports by DNS (name:port, comma-separated; in Kubernetes a headless "
          "Service: each of its A records is a router replica), looked up every --dns_interval; "
          "instead of --routers");
ABSL_FLAG(absl::Duration, dns_interval, absl::Seconds(5), "--routers_dns: how often to look up");
ABSL_FLAG(std::vector<std::string>, dns_servers, {},
          "--routers_dns: the DNS servers (ip or ip:port; empty: /etc/resolv.conf's)");
ABSL_FLAG(std::string, actuator, "advice",
          "what carries the decisions out: local (./ferry scale on the local stack), kubernetes "
          "(the Deployments' scale subresource) or advice (nothing: the decisions are exported)");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(10), "how often the planner decides");
ABSL_FLAG(absl::Duration, router_timeout, absl::Seconds(5), "deadline of each router page");
ABSL_FLAG(absl::Duration, actuator_timeout, absl::Seconds(10), "deadline of each actuator call");
ABSL_FLAG(std::vector<std::string>, pools,
          std::vector<std::string>({"prefill", "decode", "aggregated"}),
          "the pools sized (prefill, decode, aggregated); the others are left alone");
// PlannerOptions (planner.h).
ABSL_FLAG(absl::Duration, ttft_target, absl::Seconds(2), "the time-to-first-token target");
ABSL_FLAG(absl::Duration, itl_target, absl::Milliseconds(100), "the inter-token latency target");
ABSL_FLAG(double, target_utilisation, 0.7,
          "the utilisation a pool is sized to at the forecast load (the rest is headroom)");
ABSL_FLAG(double, scale_in_max_utilisation, 0.8,
          "no scale-in of a pool whose utilisation is above this (DeepSeek's rule; 1: off)");
ABSL_FLAG(absl::Duration, startup, absl::Seconds(60),
          "a new replica's start-up time until one is measured");
ABSL_FLAG(absl::Duration, cooldown, absl::Seconds(60),
          "no scale-in of a pool this long after its "
          "last scale event");
ABSL_FLAG(absl::Duration, scale_in_window, absl::Seconds(120),
          "scale-in only to the largest count the load needed over this window (hysteresis)");
ABSL_FLAG(double, max_scale_in_step, 0.25,
          "the largest fraction of a pool removed at once (at least one replica)");
ABSL_FLAG(absl::Duration, forecast_window, absl::Seconds(300), "the arrival trend's window");
ABSL_FLAG(double, scale_in_tolerance, 0.1,
          "scale-in sizes for the load plus this fraction, so that a load at a boundary does not "
          "flap across it");
ABSL_FLAG(absl::Duration, rate_half_life, absl::Seconds(30), "the arrival rates' smoothing");
ABSL_FLAG(double, default_prefill_tokens_per_second, 0,
          "one prefill worker's speed until measured (0: hold the pool until measured)");
ABSL_FLAG(std::string, prefill_replicas, "1:64", "the prefill pool's floor and ceiling, MIN:MAX");
ABSL_FLAG(std::string, decode_replicas, "1:64", "the decode pool's floor and ceiling, MIN:MAX");
ABSL_FLAG(std::string, aggregated_replicas, "1:64",
          "the aggregated pool's floor and ceiling, MIN:MAX");
ABSL_FLAG(int64_t, prefill_warm_idle, 0, "prefill replicas kept above what the load needs");
ABSL_FLAG(int64_t, decode_warm_idle, 0, "decode replicas kept above what the load needs");
ABSL_FLAG(int64_t, aggregated_warm_idle, 0, "aggregated replicas kept above what the load needs");
// --actuator=local.
ABSL_FLAG(std::string, ferry_script, "./ferry", "--actuator=local: the repository's ferry script");
ABSL_FLAG(std::string, ferry_state, "",
          "--actuator=local: the stack's state directory (FERRY_STATE; default $FERRY_STATE, else "
          "the script's directory's .ferry)");
ABSL_FLAG(absl::Duration, scale_grace, absl::Seconds(30),
          "--actuator=local: the drain grace of a scale-down (./ferry scale --grace)");
ABSL_FLAG(absl::Duration, scale_startup_timeout, absl::Seconds(300),
          "--actuator=local: the most a worker may take to start (FERRY_UP_TIMEOUT)");
ABSL_FLAG(std::string, admin_host, "127.0.0.1", "admin HTTP listen address");
ABSL_FLAG(int, admin_port, 0, "admin HTTP port (0: any free port)");

namespace {

constexpr char kProgram[] = "ferry-planner";

ferry::PoolLimits LimitsOrExit(const std::string& flag, const std::string& text, int64_t warm) {
  ferry::PoolLimits limits;
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &limits.min_replicas) ||
      !absl::SimpleAtoi(parts[1], &limits.max_replicas) || limits.min_replicas < 0 ||
      limits.max_replicas < limits.min_replicas) {
    ferry::ExitOnBadOption(kProgram, "--" + flag,
                           absl::InvalidArgumentError(absl::StrCat(
                               "must be MIN:MAX with 0 <= MIN <= MAX, not '", text, "'")));
  }
  if (warm < 0) {
    ferry::ExitOnBadOption(kProgram, "--" + flag, absl::InvalidArgumentError("warm idle < 0"));
  }
  limits.warm_idle = warm;
  return limits;
}

// The Kubernetes actuator, from its flags (kubernetes_flags.h), built only when chosen.
void RegisterKubernetesActuator(ferry::ActuatorConfig* config) {
  config->kubernetes = [] {
    return ferry::NewKubernetesActuator(ferry::KubernetesActuatorOptionsFromFlags());
  };
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  auto signal = TerminationSignal::Install();  // before any thread
  CHECK_OK(signal.status());
  ParseProgramCommandLine(kProgram,
                          "sizes the prefill and decode pools from live load (--routers "
                          "HOST:PORT,... --actuator local|kubernetes|advice)",
                          argc, argv);

  PlannerServiceOptions options;
  options.reader.routers = absl::GetFlag(FLAGS_routers);
  const std::vector<std::string> routers_dns = absl::GetFlag(FLAGS_routers_dns);
  if (options.reader.routers.empty() == routers_dns.empty()) {
    ExitOnBadOption(kProgram, "--routers",
                    absl::InvalidArgumentError("give --routers or --routers_dns (one of them)"));
  }
  std::unique_ptr<DnsDiscovery> discovery;  // lives as long as the service
  if (!routers_dns.empty()) {
    DnsDiscoveryOptions d;
    d.targets = routers_dns;
    d.interval = absl::GetFlag(FLAGS_dns_interval);
    d.dns.servers = absl::GetFlag(FLAGS_dns_servers);
    d.what = "routers";
    auto started = DnsDiscovery::Start(d, [](std::vector<std::string> endpoints) {
      LOG(INFO) << "ferry-planner: routers " << absl::StrJoin(endpoints, ",");
    });
    if (!started.ok()) ExitOnBadOption(kProgram, "--routers_dns", started.status());
    discovery = *std::move(started);
    options.reader.discover = [d = discovery.get()] { return d->endpoints(); };
  }
  for (const std::string& router : options.reader.routers) {
    std::string host;
    int port = 0;
    if (absl::Status s = SplitHostPort(router, &host, &port); !s.ok()) {
      ExitOnBadOption(kProgram, "--routers", s);
    }
  }
  options.reader.timeout = absl::GetFlag(FLAGS_router_timeout);
  options.actuator_timeout = absl::GetFlag(FLAGS_actuator_timeout);
  options.admin_host = absl::GetFlag(FLAGS_admin_host);
  options.admin_port = absl::GetFlag(FLAGS_admin_port);

  PlannerOptions& p = options.planner;
  p.interval_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_interval));
  p.ttft_target_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_ttft_target));
  p.itl_target_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_itl_target));
  p.target_utilisation = absl::GetFlag(FLAGS_target_utilisation);
  p.scale_in_max_utilisation = absl::GetFlag(FLAGS_scale_in_max_utilisation);
  p.startup_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_startup));
  p.cooldown_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_cooldown));
  p.scale_in_window_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_scale_in_window));
  p.max_scale_in_step = absl::GetFlag(FLAGS_max_scale_in_step);
  p.forecast_window_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_forecast_window));
  p.scale_in_tolerance = absl::GetFlag(FLAGS_scale_in_tolerance);
  p.rate_half_life_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_rate_half_life));
  p.default_prefill_tokens_per_second = absl::GetFlag(FLAGS_default_prefill_tokens_per_second);
  p.limits[static_cast<int>(PoolRole::kPrefill)] =
      LimitsOrExit("prefill_replicas", absl::GetFlag(FLAGS_prefill_replicas),
                   absl::GetFlag(FLAGS_prefill_warm_idle));
  p.limits[static_cast<int>(PoolRole::kDecode)] =
      LimitsOrExit("decode_replicas", absl::GetFlag(FLAGS_decode_replicas),
                   absl::GetFlag(FLAGS_decode_warm_idle));
  p.limits[static_cast<int>(PoolRole::kAggregated)] =
      LimitsOrExit("aggregated_replicas", absl::GetFlag(FLAGS_aggregated_replicas),
                   absl::GetFlag(FLAGS_aggregated_warm_idle));
  p.enabled = {false, false, false};
  for (const std::string& name : absl::GetFlag(FLAGS_pools)) {
    PoolRole pool;
    if (!ParsePoolRole(name, &pool)) {
      ExitOnBadOption(kProgram, "--pools",
                      absl::InvalidArgumentError(absl::StrCat("unknown pool '", name, "'")));
    }
    p.enabled[static_cast<int>(pool)] = true;
  }
  if (absl::Status s = options.Validate(); !s.ok()) ExitOnBadOption(kProgram, "options", s);

  ActuatorConfig actuator;
  actuator.name = absl::GetFlag(FLAGS_actuator);
  actuator.local.ferry_script = absl::GetFlag(FLAGS_ferry_script);
  actuator.local.state_dir = absl::GetFlag(FLAGS_ferry_state);
  if (actuator.local.state_dir.empty()) {
    const char* env = std::getenv("FERRY_STATE");
    const std::string& script = actuator.local.ferry_script;
    const size_t slash = script.rfind('/');
    actuator.local.state_dir =
        env != nullptr && *env != '\0'
            ? std::string(env)
            : (slash == std::string::npos ? "." : script.substr(0, slash)) + "/.ferry";
  }
  actuator.local.grace = absl::GetFlag(FLAGS_scale_grace);
  actuator.local.startup_timeout = absl::GetFlag(FLAGS_scale_startup_timeout);
  RegisterKubernetesActuator(&actuator);
  auto built = NewActuator(actuator);
  if (!built.ok()) ExitOnBadOption(kProgram, "--actuator", built.status());

  auto service = PlannerService::Start(options, std::move(*built));
  if (!service.ok()) ExitOnBadOption(kProgram, "start", service.status());
  std::printf("admin_port=%d\n", (*service)->admin_port());
  std::fflush(stdout);

  const int got = (*signal)->Wait();
  LOG(INFO) << "ferry-planner: signal " << got << ": stopping";
  (*service)->Stop();
  service->reset();  // the actuator with it: a local scale under way is waited for a little
  LOG(INFO) << "ferry-planner stopped";
  return 0;
}
