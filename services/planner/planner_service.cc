#include "services/planner/planner_service.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/clock.h"
#include "engine/common/log.h"
#include "nlohmann/json.hpp"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "services/common/metrics.h"

namespace ferry {

namespace {

// The load alone would remove replicas, and the planner holds them for one of its rules.
bool BlocksScaleIn(const PoolDecision& d) {
  return d.action == PlanAction::kHold && d.needed < d.current &&
         (d.reason == "cooldown" || d.reason == "hysteresis" || d.reason == "starting" ||
          absl::StartsWith(d.reason, "utilisation"));
}

// A decision's inputs, for the log.
std::string Inputs(const PoolDecision& d) {
  std::ostringstream out;
  out << "utilisation " << d.utilisation << ", demand " << d.demand_rate << " (now "
      << d.current_rate << "), per worker " << d.per_worker_capacity << ", needed " << d.needed
      << ", ready " << d.ready << ", starting " << d.starting << ", draining " << d.draining
      << ", start-up " << d.startup_s << " s";
  return out.str();
}

nlohmann::json DecisionJson(const PoolDecision& d, const PoolSample& pool) {
  return {{"pool", PoolRoleName(d.pool)},
          {"action", PlanActionName(d.action)},
          {"current", d.current},
          {"desired", d.desired},
          {"needed", d.needed},
          {"reason", d.reason},
          {"detail", d.detail},
          {"blocked_scale_in", BlocksScaleIn(d)},
          {"utilisation", d.utilisation},
          {"demand_rate", d.demand_rate},
          {"current_rate", d.current_rate},
          {"per_worker_capacity", d.per_worker_capacity},
          {"startup_s", d.startup_s},
          {"ready", d.ready},
          {"starting", d.starting},
          {"draining", d.draining},
          {"listed_workers", pool.workers.size()},
          {"spec_replicas", pool.spec_replicas}};
}

}  // namespace

struct PlannerService::Metrics {
  explicit Metrics(prometheus::Registry& r)
      : desired(prometheus::BuildGauge()
                    .Name("ferry_planner_desired_replicas")
                    .Help("Replicas the planner wants for the pool (an HPA's external metric "
                          "under --actuator=advice).")
                    .Register(r)),
        replicas(prometheus::BuildGauge()
                     .Name("ferry_planner_replicas")
                     .Help("The pool's replicas as the planner last saw them: ready, starting "
                           "(asked for, not ready yet), draining.")
                     .Register(r)),
        utilisation(prometheus::BuildGauge()
                        .Name("ferry_planner_utilisation")
                        .Help("The pool's utilisation the planner decided on (prefill: busy "
                              "fraction; decode: KV or running slots in use), mean over ready "
                              "workers.")
                        .Register(r)),
        decisions(prometheus::BuildCounter()
                      .Name("ferry_planner_decisions_total")
                      .Help("Decisions per pool by action (hold, scale_out, scale_in) and reason.")
                      .Register(r)),
        blocked(prometheus::BuildCounter()
                    .Name("ferry_planner_scale_in_blocked_total")
                    .Help("Rounds in which the load alone would have removed replicas but the "
                          "planner held them, by reason (cooldown, hysteresis, "
                          "utilisation_above_...).")
                    .Register(r)),
        actuator_errors(prometheus::BuildCounter()
                            .Name("ferry_planner_actuator_errors_total")
                            .Help("Actuator calls about the pool that failed (a scale refused or "
                                  "failed, its replicas unreadable).")
                            .Register(r)),
        snapshot_errors(prometheus::BuildCounter()
                            .Name("ferry_planner_snapshot_errors_total")
                            .Help("Reads of a router's /workers and /metrics that failed.")
                            .Register(r)
                            .Add({})),
        routers(prometheus::BuildGauge()
                    .Name("ferry_planner_routers")
                    .Help("Routers that answered the last round.")
                    .Register(r)
                    .Add({})) {
    for (int p = 0; p < kPoolRoles; ++p) {
      const std::string pool = PoolRoleName(static_cast<PoolRole>(p));
      actuator_errors.Add({{"pool", pool}});
    }
  }

  prometheus::Family<prometheus::Gauge>& desired;
  prometheus::Family<prometheus::Gauge>& replicas;
  prometheus::Family<prometheus::Gauge>& utilisation;
  prometheus::Family<prometheus::Counter>& decisions;
  prometheus::Family<prometheus::Counter>& blocked;
  prometheus::Family<prometheus::Counter>& actuator_errors;
  prometheus::Counter& snapshot_errors;
  prometheus::Gauge& routers;
};

absl::Status PlannerServiceOptions::Validate() const {
  if (absl::Status s = planner.Validate(); !s.ok()) return s;
  if (!(planner.interval_s > 0)) return absl::InvalidArgumentError("the interval must be > 0");
  if (reader.routers.empty() && !reader.discover) {
    return absl::InvalidArgumentError("no router to read");
  }
  if (reader.timeout <= absl::ZeroDuration() || actuator_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be > 0");
  }
  return absl::OkStatus();
}

PlannerService::PlannerService(PlannerServiceOptions options, std::unique_ptr<Actuator> actuator)
    : options_(std::move(options)),
      actuator_(std::move(actuator)),
      planner_(options_.planner),
      reader_(options_.reader),
      registry_(NewServiceRegistry("planner")),
      metrics_(std::make_unique<Metrics>(*registry_)),
      started_(RealClock().Monotonic()) {}

absl::StatusOr<std::unique_ptr<PlannerService>> PlannerService::Start(
    PlannerServiceOptions options, std::unique_ptr<Actuator> actuator) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (actuator == nullptr) return absl::InvalidArgumentError("no actuator");
  std::unique_ptr<PlannerService> service(new PlannerService(options, std::move(actuator)));
  AdminServerOptions admin;
  admin.host = options.admin_host;
  admin.port = options.admin_port;
  PlannerService* self = service.get();
  admin.routes = [self](const std::string& method, const std::string& path, const std::string&,
                        AdminReply* reply) {
    if (path != "/plan") return false;
    if (method != "GET") {
      reply->status = 405;
      reply->body = "{\"error\": \"GET only\"}";
      return true;
    }
    reply->body = self->PlanJson();
    return true;
  };
  auto server = AdminServer::Start(admin, service->registry_);
  if (!server.ok()) return server.status();
  service->admin_ = std::move(*server);
  service->admin_->SetReady(false, "no round yet");
  LOG(INFO) << "planner: reading " << options.reader.routers.size() << " router(s) every "
            << options.planner.interval_s << " s; actuator " << service->actuator_->name()
            << "; admin on " << options.admin_host << ":" << service->admin_->port();
  if (options.run_loop) service->loop_ = std::thread([self] { self->Loop(); });
  return service;
}

PlannerService::~PlannerService() { Stop(); }

int PlannerService::admin_port() const { return admin_->port(); }

void PlannerService::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  if (admin_ != nullptr) admin_->Stop();
}

void PlannerService::Loop() {
  const absl::Duration interval = absl::Seconds(options_.planner.interval_s);
  while (true) {
    const absl::Time next = absl::Now() + interval;
    RunRound();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline(absl::Condition(&stopping_), next)) break;
  }
  LOG(INFO) << "planner: stopped";
}

void PlannerService::AddActuatorView(Snapshot* snapshot, absl::Time deadline) {
  for (int p = 0; p < kPoolRoles; ++p) {
    const PoolRole pool = static_cast<PoolRole>(p);
    changing_[p] = false;
    if (!options_.planner.enabled[p]) continue;
    PoolSample& sample = snapshot->pool(pool);
    auto replicas = actuator_->Replicas(pool, deadline);
    if (!replicas.ok()) {
      if (replicas.status().code() == absl::StatusCode::kNotFound) continue;  // not a pool here
      metrics_->actuator_errors.Add({{"pool", PoolRoleName(pool)}}).Increment();
      LOG(WARNING) << "planner: " << PoolRoleName(pool) << ": the " << actuator_->name()
                   << " actuator: " << replicas.status();
      // Locally this is how a background scale ended: the planner decides the pool again.
      planner_.Rejected(pool);
      continue;
    }
    changing_[p] = replicas->changing;
    sample.spec_replicas = replicas->spec;
    if (replicas->spec >= 0) {
      sample.starting = std::max<int64_t>(0, replicas->spec - replicas->ready);
    }
  }
}

Plan PlannerService::RunRound() {
  const absl::Time now = absl::Now();
  const double time_s = absl::ToDoubleSeconds(RealClock().Monotonic() - started_);
  const absl::Duration interval = absl::Seconds(options_.planner.interval_s);
  SnapshotReader::Result read =
      reader_.Read(time_s, now + std::max(interval, options_.reader.timeout));
  for (const auto& [router, status] : read.errors) {
    metrics_->snapshot_errors.Increment();
    LOG(WARNING) << "planner: router " << router << ": " << status;
  }
  metrics_->routers.Set(read.snapshot.routers);
  AddActuatorView(&read.snapshot, absl::Now() + options_.actuator_timeout);
  Plan plan = planner_.Decide(read.snapshot);
  Apply(plan, read.snapshot, read.errors);
  admin_->SetReady(read.snapshot.routers > 0, "no router answers");
  return plan;
}

void PlannerService::ApplyPlan(const Plan& plan, const Snapshot& snapshot) {
  Apply(plan, snapshot, {});
}

void PlannerService::Apply(const Plan& plan, const Snapshot& snapshot, const RouterErrors& errors) {
  nlohmann::json round = {{"time_s", plan.time_s},
                          {"actuator", actuator_->name()},
                          {"routers", snapshot.routers},
                          {"router_errors", nlohmann::json::array()},
                          {"queued_requests", snapshot.queued_requests},
                          {"queued_tokens", snapshot.queued_tokens},
                          {"pools", nlohmann::json::array()}};
  for (const auto& [router, status] : errors) {
    round["router_errors"].push_back({{"router", router}, {"error", status.ToString()}});
  }
  std::vector<nlohmann::json> recent;
  for (const PoolDecision& d : plan.pools) {
    const std::string pool = PoolRoleName(d.pool);
    const int p = static_cast<int>(d.pool);
    metrics_->desired.Add({{"pool", pool}}).Set(static_cast<double>(d.desired));
    metrics_->replicas.Add({{"pool", pool}, {"state", "ready"}}).Set(static_cast<double>(d.ready));
    metrics_->replicas.Add({{"pool", pool}, {"state", "starting"}})
        .Set(static_cast<double>(d.starting));
    metrics_->replicas.Add({{"pool", pool}, {"state", "draining"}})
        .Set(static_cast<double>(d.draining));
    metrics_->utilisation.Add({{"pool", pool}}).Set(d.utilisation);
    metrics_->decisions
        .Add({{"pool", pool}, {"action", PlanActionName(d.action)}, {"reason", d.reason}})
        .Increment();
    nlohmann::json j = DecisionJson(d, snapshot.pool(d.pool));
    const bool change = d.action != PlanAction::kHold && d.desired != d.current;
    const bool blocked = BlocksScaleIn(d);
    std::string actuation = "none";
    if (blocked) {
      metrics_->blocked.Add({{"pool", pool}, {"reason", d.reason}}).Increment();
      LOG(INFO) << "planner: " << pool << ": scale-in " << d.current << " -> " << d.needed
                << " blocked (" << d.reason << "): " << d.detail << " [" << Inputs(d) << "]";
    }
    if (change) {
      LOG(INFO) << "planner: " << pool << ": " << PlanActionName(d.action) << " " << d.current
                << " -> " << d.desired << " (" << d.reason << "): " << d.detail << " [" << Inputs(d)
                << "]";
      if (changing_[p]) {
        // The actuator is still carrying out a change (locally: of any pool); asking now would
        // be refused. The planner decides again from the next snapshot.
        actuation = "deferred: the actuator is still changing a pool";
        planner_.Rejected(d.pool);
        LOG(INFO) << "planner: " << pool << ": " << actuation;
      } else {
        const absl::Status s = actuator_->Scale(d.pool, d.desired, snapshot.pool(d.pool).workers,
                                                absl::Now() + options_.actuator_timeout);
        if (s.ok()) {
          actuation = "asked";
        } else if (s.code() == absl::StatusCode::kUnavailable) {
          // Busy (locally: one scale at a time, and another pool's runs): not a failure.
          actuation = absl::StrCat("deferred: ", s.message());
          planner_.Rejected(d.pool);
          LOG(INFO) << "planner: " << pool << ": " << actuation;
        } else {
          actuation = absl::StrCat("failed: ", s.ToString());
          metrics_->actuator_errors.Add({{"pool", pool}}).Increment();
          planner_.Rejected(d.pool);
          LOG(WARNING) << "planner: " << pool << ": the " << actuator_->name()
                       << " actuator could not scale to " << d.desired << ": " << s;
        }
      }
    }
    j["actuation"] = actuation;
    if (change || blocked) {
      nlohmann::json entry = j;
      entry["time_s"] = plan.time_s;
      recent.push_back(std::move(entry));
    }
    round["pools"].push_back(std::move(j));
  }
  absl::MutexLock lock(&mu_);
  // Replacing what is not UTF-8 (an error may quote a peer's bytes).
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  last_round_json_ = round.dump(-1, ' ', false, kReplace);
  for (nlohmann::json& entry : recent) {
    recent_.push_back(entry.dump(-1, ' ', false, kReplace));
    while (recent_.size() > options_.recent_decisions) recent_.pop_front();
  }
}

std::string PlannerService::PlanJson() const {
  absl::MutexLock lock(&mu_);
  std::string out = absl::StrCat("{\"last\": ", last_round_json_, ", \"recent\": [");
  for (size_t i = 0; i < recent_.size(); ++i) absl::StrAppend(&out, i ? ", " : "", recent_[i]);
  absl::StrAppend(&out, "]}\n");
  return out;
}

}  // namespace ferry
