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
  stream.erase(std::remove_if(stream.begin(), stream.end(),
                              [&](size_t i) {
                                return workers[i].kind == WorkerKind::kDecode &&
                                       (!prefill || !KvRoom(workers[i], job));
                              }),
               stream.end());
  return stream;
}

bool KvRoom(const WorkerLoadView& w, const JobRecord& job) {
  auto refused = job.kv_refused.find(w.id);
  if (refused != job.kv_refused.end() && w.load_reports <= refused->second) return false;
  if (w.total_kv_blocks <= 0 || job.block_tokens <= 0) return true;  // nothing reported yet
  const int64_t bt = job.block_tokens;
  const int64_t needed =
      std::max(job.kv_blocks_needed, (job.prompt_tokens + job.resumed_tokens + bt - 1) / bt);
  const int64_t unreported = (w.unreported_kv_tokens + bt - 1) / bt;
  return w.free_kv_blocks + w.cached_kv_blocks - unreported >= needed;
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
  // The worker that pre-copied the KV so far, if it can take it: it holds most of the KV.
  for (size_t i : targets) {
    if (!job.precopy_target.empty() && workers[i].id == job.precopy_target) return {i};
  }
  return targets;
}

namespace {

Admission Decide(bool stopping, int64_t queued, int64_t queued_tokens, int64_t tokens,
                 const DispatchLimits& limits, bool start_if_empty) {
  if (stopping) return {Admit::kReject, absl::UnavailableError("the router is shutting down")};
  if (queued == 0 && start_if_empty) return {Admit::kStart, absl::OkStatus()};
  if (queued >= limits.max_queued) {
    return {Admit::kReject, absl::ResourceExhaustedError(absl::StrCat(
                                "no worker can take the request now and ", queued,
                                " requests are waiting for one (the queue is full); retry later"))};
  }
  if (limits.max_queued_tokens > 0 && queued > 0 &&
      queued_tokens + tokens > limits.max_queued_tokens) {
    return {Admit::kReject,
            absl::ResourceExhaustedError(absl::StrCat("no worker can take the request now and the ",
                                                      queued, " requests waiting for one hold ",
                                                      queued_tokens, " prompt tokens (at most ",
                                                      limits.max_queued_tokens, "); retry later"))};
  }
  return {Admit::kQueue, absl::OkStatus()};
}

}  // namespace

Admission AdmitNew(bool stopping, int64_t queued, int64_t queued_tokens, int64_t tokens,
                   const DispatchLimits& limits) {
  return Decide(stopping, queued, queued_tokens, tokens, limits, /*start_if_empty=*/true);
}

Admission AdmitUnstarted(bool stopping, int64_t queued, int64_t queued_tokens, int64_t tokens,
                         const DispatchLimits& limits) {
  return Decide(stopping, queued, queued_tokens, tokens, limits, /*start_if_empty=*/false);
}

void EnterQueue(JobRecord* job, absl::Time now) {
  job->queued = true;
  job->queued_at = now;
}

absl::Duration LeaveQueue(JobRecord* job, absl::Time now) {
  job->queued = false;
  if (job->queued_at != absl::InfiniteFuture()) {
    job->waited += std::max(now - job->queued_at, absl::ZeroDuration());
  }
  job->queued_at = absl::InfiniteFuture();
  return job->waited;
}

const char* QueuePool(absl::Span<const WorkerLoadView> workers, const JobRecord& job,
                      bool started) {
  auto name = [](WorkerKind kind) {
    return kind == WorkerKind::kPrefill  ? "prefill"
           : kind == WorkerKind::kDecode ? "decode"
                                         : "aggregated";
  };
  if (started) return name(job.role);
  const bool decode = std::any_of(workers.begin(), workers.end(), [](const WorkerLoadView& w) {
    return w.kind == WorkerKind::kDecode;
  });
  if (!decode) return "aggregated";
  return PrefillCandidates(workers, job).empty() ? "prefill" : "decode";
}

std::string WaitCause(const JobRecord& job, bool any_worker_up) {
  if (!any_worker_up) return "none_up";
  if (job.kv_blocks_needed > 0) return "kv";
  return "busy";
}

QueueExpiry QueuedWait(const JobRecord& job, absl::Time now, const std::string& wait_cause,
                       const DispatchLimits& limits) {
  QueueExpiry e;
  const absl::Time timeout = job.queued_at == absl::InfiniteFuture()
                                 ? absl::InfiniteFuture()
                                 : job.queued_at + (limits.queue_timeout - job.waited);
  if (now < job.deadline && now < timeout) return e;
  e.reason = job.deadline <= timeout ? "deadline" : "queue_timeout";
  const std::string why =
      wait_cause == "none_up" ? "none is up, or all are draining"
      : wait_cause == "kv"
          ? absl::StrCat("no decode worker had room for its KV (", job.kv_blocks_needed, " blocks)")
          : "every worker was busy";
  e.status = absl::UnavailableError(absl::StrCat(
      "no worker could take the request ",
      e.reason == "deadline" ? "before its deadline"
                             : absl::StrCat("within ", absl::FormatDuration(limits.queue_timeout)),
      ": ", why, "; retry later"));
  return e;
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
  d.progressed = outcome.started;
  // The workers the attempt touched, told to Abort it when the request goes on: the stream's
  // (not a draining one keeping its KV for the hand-off), the prefill worker.
  auto abort_attempt = [&] {
    d.stopped_attempt = job.AttemptId();
    if (!outcome.worker.empty() && handoff_endpoint.empty()) d.abort_on.push_back(outcome.worker);
    if (!outcome.prefill_worker.empty() && outcome.prefill_worker != outcome.worker) {
      d.abort_on.push_back(outcome.prefill_worker);
    }
  };
  const bool may_restart = !status.ok() && !outcome.started && !job.cancelled && before_deadline;
  if (may_restart && outcome.kv_blocks_needed > 0 && !failed_handoff) {
    // KV pressure: a transient. It waits for a decode worker with room.
    d.next = Next::kQueue;
    d.kv_refused_by = outcome.worker;
    d.kv_reports = outcome.kv_reports;
    d.kv_blocks_needed = outcome.kv_blocks_needed;
    d.show_error_event = outcome.error_event;  // (if it ends waiting)
    // (Nothing to abort: the decode worker ended the attempt itself, before any prefill.)
    return d;
  }
  if (may_restart && status.code() == absl::StatusCode::kAlreadyExists &&
      job.collisions < limits.max_collisions) {
    d.next = Next::kRetry;
    d.collision = true;
    abort_attempt();
    return d;
  }
  if (may_restart && outcome.retryable && job.retries < limits.max_retries && !failed_handoff &&
      !(had_output && !handoff_endpoint.empty())) {
    d.next = Next::kRetry;
    d.exclude = outcome.failed;
    d.show_error_event = outcome.error_event;  // (if the restart finds no worker)
    abort_attempt();
    return d;
  }
  if (status.code() == absl::StatusCode::kAlreadyExists) {
    // The router's own bug, never the client's conflict: a 500, not a 409.
    d.end = absl::InternalError(
        absl::StrCat("the router reused a request id on a worker (", status.message(), ")"));
    show_error = false;
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
      abort_attempt();
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
    d.failure = FailureCause(d.end);
  }
  if (!d.failure.empty() && had_output) {
    d.end = absl::Status(
        d.end.code(),
        absl::StrCat(d.end.message(), "; the request cannot continue on another worker (",
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
  if (decision.progressed) job->waited = absl::ZeroDuration();
  switch (decision.next) {
    case Next::kRetry:
      if (decision.collision) {
        ++job->collisions;
      } else {
        ++job->retries;
        job->excluded.insert(decision.exclude);
      }
      break;
    case Next::kMigrate:
      job->excluded.insert(decision.exclude);
      ++job->migrations;
      job->resumed_tokens = decision.carried;
      job->handoff = decision.handoff;
      break;
    case Next::kQueue:
      if (decision.kv_blocks_needed > 0) {
        job->kv_blocks_needed = decision.kv_blocks_needed;
        job->kv_refused[decision.kv_refused_by] = decision.kv_reports;
      }
      break;
    case Next::kEnd:
      break;
  }
}

void RestartFoundNoWorker(bool stopping, Decision* decision) {
  if (!stopping) {
    decision->next = Next::kQueue;
    return;
  }
  decision->next = Next::kEnd;
  decision->failure = "no_worker";
}

}  // namespace ferry
