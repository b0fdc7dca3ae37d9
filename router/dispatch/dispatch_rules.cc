#include "router/dispatch/dispatch_rules.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry {

namespace {

// Indices of `workers` on one side (prefill, or the stream's: aggregated and decode), less those
// that failed `job` while another on that side did not.
std::vector<size_t> Side(absl::Span<const WorkerLoadView> workers, const JobRecord& job,
                         bool prefill) {
  std::vector<size_t> side;
  bool others = false;
  for (size_t i = 0; i < workers.size(); ++i) {
    if ((workers[i].kind == WorkerKind::kPrefill) != prefill) continue;
    side.push_back(i);
    others = others || job.excluded.count(workers[i].id) == 0;
  }
  if (others) {
    side.erase(std::remove_if(side.begin(), side.end(),
                              [&](size_t i) { return job.excluded.count(workers[i].id) > 0; }),
               side.end());
  }
  return side;
}

}  // namespace

std::vector<size_t> StreamCandidates(absl::Span<const WorkerLoadView> workers,
                                     const JobRecord& job) {
  std::vector<size_t> stream = Side(workers, job, /*prefill=*/false);
  const bool prefill = !PrefillCandidates(workers, job).empty();
  if (!prefill) {
    stream.erase(std::remove_if(stream.begin(), stream.end(),
                                [&](size_t i) { return workers[i].kind == WorkerKind::kDecode; }),
                 stream.end());
  }
  return stream;
}

std::vector<size_t> PrefillCandidates(absl::Span<const WorkerLoadView> workers,
                                      const JobRecord& job) {
  return Side(workers, job, /*prefill=*/true);
}

std::vector<size_t> HandoffTargets(absl::Span<const WorkerLoadView> workers,
                                   absl::Span<const std::string> endpoints, const JobRecord& job) {
  std::vector<size_t> targets;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerLoadView& w = workers[i];
    if (w.kind != job.handoff.role || w.id == job.handoff.source) continue;
    if (i < endpoints.size() && endpoints[i] == job.handoff.endpoint) continue;
    if (job.excluded.count(w.id) > 0) continue;
    targets.push_back(i);
  }
  return targets;
}

Admission AdmitNew(bool any_worker_up, bool stopping, size_t queued, const DispatchLimits& limits) {
  if (!any_worker_up) {
    return {Admit::kReject,
            absl::UnavailableError("no worker can take requests: none is up, or all are draining")};
  }
  if (stopping) return {Admit::kReject, absl::UnavailableError("the router is shutting down")};
  if (queued == 0) return {Admit::kStart, absl::OkStatus()};
  if (static_cast<int64_t>(queued) >= limits.max_queued) {
    return {Admit::kReject,
            absl::ResourceExhaustedError(absl::StrCat("every worker is busy and ", queued,
                                                      " requests are waiting; retry later"))};
  }
  return {Admit::kQueue, absl::OkStatus()};
}

Admission AdmitUnstarted(size_t queued, const DispatchLimits& limits) {
  if (static_cast<int64_t>(queued) >= limits.max_queued) {
    return {Admit::kReject, absl::ResourceExhaustedError(
                                "every worker is busy and the queue is full; retry later")};
  }
  return {Admit::kQueue, absl::OkStatus()};
}

absl::Status QueuedWait(const JobRecord& job, absl::Time now, bool any_worker_up) {
  if (now >= job.deadline) {
    return absl::DeadlineExceededError("the request waited for a worker until its deadline");
  }
  if (!any_worker_up) {
    return absl::UnavailableError("no worker can take requests: none is up, or all are draining");
  }
  return absl::OkStatus();
}

bool RetryableCode(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kResourceExhausted;
}

std::string MigrationCause(bool worker_down, bool error_event, absl::StatusCode code) {
  if (worker_down) return "worker_down";
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
      return error_event ? "worker_error" : "stream_broken";
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDataLoss:
      return "worker_error";
    default:
      return "";
  }
}

std::string FailureCause(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline";
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
      return "no_worker";
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDataLoss:
      return "worker_error";
    default:  // the request's own fault (invalid, too long): not a failure of the service
      return "";
  }
}

Decision DecideAfterAttempt(const JobRecord& job, const AttemptOutcome& outcome,
                            const DispatchLimits& limits, absl::Time now) {
  Decision d;
  d.end = outcome.status;
  const absl::Status& status = outcome.status;
  // This attempt was a drain hand-off: one that failed before a new token falls back to a
  // re-prefill (under the next attempt id: the target may still hold this one).
  const bool handoff_attempt = job.handoff.active();
  d.handoff_source = job.handoff.source;
  const bool failed_handoff = handoff_attempt && !outcome.started && !status.ok();
  const std::string cause = failed_handoff ? "handoff_failed" : outcome.migrate_cause;
  // The worker stopped the request draining, with its KV kept for a hand-off.
  const std::string handoff_endpoint = outcome.error_event && !status.ok() && !failed_handoff
                                           ? outcome.handoff_endpoint
                                           : std::string();
  const bool before_deadline = now < job.deadline;
  // A stream that sent tokens (in this attempt or an earlier one) and failed: continue it
  // elsewhere from what the client received.
  const bool had_output = outcome.started || job.migrations > 0;
  bool show_error = outcome.error_event;
  if (!status.ok() && !outcome.started && outcome.retryable && !job.cancelled &&
      job.attempts <= limits.max_retries && before_deadline && !failed_handoff &&
      !(had_output && !handoff_endpoint.empty())) {
    d.next = Next::kRetry;
    d.exclude = outcome.failed;
    d.show_error_event = outcome.error_event;  // (if the restart finds no worker)
    return d;
  }
  if (!status.ok() && had_output && !job.cancelled && !cause.empty()) {
    if (job.AllChoicesFinished()) {
      // Every choice had ended; only the usage was lost: done.
      d.end = absl::OkStatus();
      show_error = false;
    } else if (!job.tracked) {
      d.failure = "untracked";
    } else if (job.choices != 1) {
      d.failure = "several_choices";
    } else if (job.migrations >= limits.max_migrations) {
      d.failure = "migration_limit";
    } else if (!before_deadline) {
      d.failure = "deadline";
    } else {
      d.next = Next::kMigrate;
      d.exclude = outcome.worker;
      d.cause = cause;
      d.stopped_attempt = job.AttemptId();
      d.carried = job.ReceivedTokens();
      // A hand-off continues from the last token's KV: there must be one.
      if (!handoff_endpoint.empty() && d.carried > 0) {
        d.cause = "drain_handoff";
        d.handoff.endpoint = handoff_endpoint;
        d.handoff.source = outcome.worker;
        d.handoff.request_id = d.stopped_attempt;
        d.handoff.role = job.role;
      }
    }
  } else if (!status.ok() && !job.cancelled) {
    d.failure = FailureCause(status);
  }
  if (!d.failure.empty() && had_output) {
    d.end = absl::Status(
        status.code(),
        absl::StrCat(status.message(), "; the request cannot continue on another worker (",
                     d.failure == "untracked"         ? "its output is not tracked"
                     : d.failure == "several_choices" ? "it has several choices"
                     : d.failure == "migration_limit"
                         ? absl::StrCat("it moved ", job.migrations, " times")
                         : "its deadline passed",
                     ")"));
  }
  if (failed_handoff && !job.cancelled) {
    d.handoff_outcome = d.next == Next::kMigrate ? "fell_back"
                        : d.end.ok()             ? "completed"
                                                 : "failed";
  }
  d.show_error_event = show_error && !d.end.ok();
  return d;
}

void ApplyDecision(const Decision& decision, JobRecord* job) {
  job->handoff = HandoffPlan();
  switch (decision.next) {
    case Next::kRetry:
      job->excluded.insert(decision.exclude);
      break;
    case Next::kMigrate:
      job->excluded.insert(decision.exclude);
      ++job->migrations;
      job->resumed_tokens = decision.carried;
      job->handoff = decision.handoff;
      break;
    case Next::kQueue:
    case Next::kEnd:
      break;
  }
}

void RestartFoundNoWorker(size_t queued, bool stopping, const DispatchLimits& limits,
                          Decision* decision) {
  if (static_cast<int64_t>(queued) < limits.max_queued && !stopping) {
    decision->next = Next::kQueue;
    return;
  }
  decision->next = Next::kEnd;
  decision->failure = "no_worker";
}

}  // namespace ferry
