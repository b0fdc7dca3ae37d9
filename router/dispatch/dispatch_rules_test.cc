// The dispatch rules against fake workers (load views) and a fake clock: every way an attempt
// ends, admission and the queue, candidates, tracking. What the router's multi-process tests
// (tests/fault, router_routing_test) see of these rules, decided here one case at a time.

#include "router/dispatch/dispatch_rules.h"

#include <string>
#include <vector>

#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"
#include "router/dispatch/job_record.h"

namespace ferry {
namespace {

WorkerLoadView Worker(const std::string& id, WorkerKind kind) {
  WorkerLoadView v;
  v.id = id;
  v.kind = kind;
  return v;
}

std::vector<std::string> Ids(const std::vector<WorkerLoadView>& workers,
                             const std::vector<size_t>& indices) {
  std::vector<std::string> ids;
  for (size_t i : indices) ids.push_back(workers[i].id);
  return ids;
}

class DispatchRulesTest : public ::testing::Test {
 protected:
  DispatchRulesTest() : clock_(absl::FromUnixSeconds(1000)) {
    job_.request_id = "req-1";
    job_.deadline = clock_.Now() + absl::Seconds(60);
    job_.prompt_tokens = 100;
    job_.attempts = 1;  // the attempt that ends
  }

  // An attempt that failed on `worker` with `status`, as the router's stream sees it.
  AttemptOutcome Failed(const std::string& worker, absl::Status status, bool started,
                        bool retryable, bool error_event = false, bool down = false) {
    AttemptOutcome o;
    o.worker = worker;
    o.failed = worker;
    o.status = std::move(status);
    o.started = started;
    o.retryable = retryable;
    o.error_event = error_event;
    o.migrate_cause = MigrationCause(down, error_event, o.status.code());
    return o;
  }

  // The client received `n` tokens of the one choice.
  void Received(int n, bool finished = false) {
    std::vector<uint32_t> ids(n, 7);
    ReceivedChunk chunk;
    chunk.first_output_index = job_.progress.empty() ? 0 : job_.progress[0].tokens.size();
    chunk.token_ids = ids;
    chunk.finished = finished;
    int64_t delta = 0;
    ASSERT_EQ(Track(&job_, chunk, 0, tracking_, &delta), TrackResult::kAdded);
  }

  Decision Decide(const AttemptOutcome& outcome) {
    return DecideAfterAttempt(job_, outcome, limits_, clock_.Now());
  }

  FakeClock clock_;
  DispatchLimits limits_;
  TrackingLimits tracking_;
  JobRecord job_;
};

TEST_F(DispatchRulesTest, AnAttemptThatCompletedEnds) {
  AttemptOutcome ok;
  ok.worker = ok.failed = "w1";
  const Decision d = Decide(ok);
  EXPECT_EQ(d.next, Next::kEnd);
  EXPECT_TRUE(d.end.ok());
  EXPECT_EQ(d.failure, "");
  EXPECT_FALSE(d.show_error_event);
}

TEST_F(DispatchRulesTest, AFailureBeforeTheFirstTokenRetriesElsewhereUnderTheNextId) {
  AttemptOutcome o = Failed("d1", absl::UnavailableError("gone"), false, true);
  o.prefill_worker = "p1";
  const Decision d = Decide(o);
  EXPECT_EQ(d.next, Next::kRetry);
  EXPECT_EQ(d.exclude, "d1");
  // The abandoned attempt is aborted on every worker it touched (the prefill worker may still
  // run it).
  EXPECT_EQ(d.stopped_attempt, "req-1");
  EXPECT_EQ(d.abort_on, std::vector<std::string>({"d1", "p1"}));
  ApplyDecision(d, &job_);
  EXPECT_EQ(job_.excluded.count("d1"), 1u);
  EXPECT_EQ(job_.retries, 1);
  ++job_.attempts;  // the next attempt starts
  EXPECT_EQ(job_.AttemptId(), "req-1.a2");
  EXPECT_EQ(job_.migrations, 0);
}

TEST_F(DispatchRulesTest, AWorkerThatAlreadyRunsTheAttemptIdIsACollisionNeverA409) {
  const Decision d = Decide(Failed("p1", absl::AlreadyExistsError("running here"), false, false));
  EXPECT_EQ(d.next, Next::kRetry);
  EXPECT_TRUE(d.collision);
  EXPECT_EQ(d.exclude, "");
  EXPECT_EQ(d.abort_on, std::vector<std::string>({"p1"}));
  ApplyDecision(d, &job_);
  EXPECT_EQ(job_.retries, 0);  // not counted against max_retries
  EXPECT_EQ(job_.collisions, 1);
  EXPECT_TRUE(job_.excluded.empty());

  // Past max_collisions it ends as the router's bug (500), never the client's conflict (409).
  job_.collisions = limits_.max_collisions;
  const Decision e =
      Decide(Failed("p1", absl::AlreadyExistsError("running here"), false, false, true));
  EXPECT_EQ(e.next, Next::kEnd);
  EXPECT_EQ(e.end.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(e.failure, "worker_error");
  EXPECT_FALSE(e.show_error_event);
}

TEST_F(DispatchRulesTest, AKvRefusalWaitsForRoomWithoutARetryOrAnExclusion) {
  AttemptOutcome o = Failed("d1", absl::ResourceExhaustedError("no KV"), false, true, true);
  o.kv_blocks_needed = 10;
  o.kv_reports = 7;
  for (int i = 0; i < 5; ++i) {  // however often: KV pressure is a transient
    const Decision d = Decide(o);
    ASSERT_EQ(d.next, Next::kQueue);
    EXPECT_TRUE(d.abort_on.empty());  // the decode worker ended it; no prefill began
    ApplyDecision(d, &job_);
  }
  EXPECT_EQ(job_.retries, 0);
  EXPECT_TRUE(job_.excluded.empty());
  EXPECT_EQ(job_.kv_blocks_needed, 10);

  // Only decode workers with room (free, or held by the prefix cache) take it; the one that
  // refused only after it reported again.
  WorkerLoadView p1 = Worker("p1", WorkerKind::kPrefill);
  WorkerLoadView d1 = Worker("d1", WorkerKind::kDecode);
  WorkerLoadView d2 = Worker("d2", WorkerKind::kDecode);
  job_.block_tokens = 16;  // its 100 prompt tokens: 7 blocks; the refusal said 10
  d1.total_kv_blocks = d2.total_kv_blocks = 100;
  d1.free_kv_blocks = 20;
  d1.load_reports = 7;  // the report it refused with
  d2.free_kv_blocks = 4;
  d2.cached_kv_blocks = 5;
  std::vector<WorkerLoadView> pd = {p1, d1, d2};
  EXPECT_TRUE(StreamCandidates(pd, job_).empty());
  pd[2].cached_kv_blocks = 6;
  EXPECT_EQ(Ids(pd, StreamCandidates(pd, job_)), std::vector<std::string>{"d2"});
  pd[1].load_reports = 8;
  EXPECT_EQ(Ids(pd, StreamCandidates(pd, job_)), std::vector<std::string>({"d1", "d2"}));
  // Aggregated workers are not concerned.
  const std::vector<WorkerLoadView> aggregated = {Worker("a1", WorkerKind::kAggregated)};
  EXPECT_EQ(StreamCandidates(aggregated, job_).size(), 1u);

  // It still ends when the client left or the deadline passed.
  job_.cancelled = true;
  EXPECT_EQ(Decide(o).next, Next::kEnd);
}

TEST_F(DispatchRulesTest, TheRetryBudgetIsSharedAndTheLastFailureNamesItsCause) {
  job_.retries = limits_.max_retries;  // three attempts started
  const Decision d = Decide(Failed("w3", absl::UnavailableError("gone"), false, true));
  EXPECT_EQ(d.next, Next::kEnd);
  EXPECT_EQ(d.failure, "no_worker");
  EXPECT_EQ(d.end.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d.end.message(), "gone");  // no output: nothing to say about moving it

  const Decision e = Decide(Failed("w3", absl::InternalError("bug"), false, true, true));
  EXPECT_EQ(e.failure, "worker_error");
  EXPECT_TRUE(e.show_error_event);
}

TEST_F(DispatchRulesTest, NotRetryableOrPastTheDeadlineOrCancelledEnds) {
  Decision d = Decide(Failed("w1", absl::InvalidArgumentError("too long"), false, false));
  EXPECT_EQ(d.next, Next::kEnd);
  EXPECT_EQ(d.failure, "");  // the request's own fault: no failure of the service

  clock_.Advance(absl::Seconds(61));
  d = Decide(Failed("w1", absl::UnavailableError("gone"), false, true));
  EXPECT_EQ(d.next, Next::kEnd);
  EXPECT_EQ(d.failure, "no_worker");  // an Unavailable end counts as no worker, even late

  job_.cancelled = true;
  job_.deadline = clock_.Now() + absl::Seconds(60);
  d = Decide(Failed("w1", absl::CancelledError("client"), false, true));
  EXPECT_EQ(d.next, Next::kEnd);
  EXPECT_EQ(d.failure, "");
  EXPECT_EQ(d.handoff_outcome, "");
}

TEST_F(DispatchRulesTest, AStreamThatSentTokensMigratesWithItsOutput) {
  Received(5);
  const Decision d = Decide(Failed("w1", absl::UnavailableError("broken"), true, true));
  EXPECT_EQ(d.next, Next::kMigrate);
  EXPECT_EQ(d.cause, "stream_broken");
  EXPECT_EQ(d.carried, 5);
  EXPECT_EQ(d.stopped_attempt, "req-1");
  EXPECT_FALSE(d.handoff.active());
  ApplyDecision(d, &job_);
  ++job_.attempts;
  EXPECT_EQ(job_.AttemptId(), "req-1.a2");
  EXPECT_EQ(job_.resumed_tokens, 5);
  EXPECT_EQ(job_.excluded.count("w1"), 1u);
  // The output is re-prefilled: the next worker computes prompt and output.
  EXPECT_EQ(job_.Route().prompt_tokens, 105);
  RouteChoice choice;
  choice.predicted_local_tokens = 64;
  EXPECT_EQ(job_.Uncached(choice), 41);

  // The migrated attempt fails before its own first token: a retry, under the next id.
  const Decision r = Decide(Failed("w2", absl::UnavailableError("gone"), false, true));
  EXPECT_EQ(r.next, Next::kRetry);
  EXPECT_EQ(r.stopped_attempt, "req-1.a2");
  ApplyDecision(r, &job_);
  ++job_.attempts;
  EXPECT_EQ(job_.AttemptId(), "req-1.a3");
}

TEST_F(DispatchRulesTest, TheMigrationCauseFollowsHowTheStreamEnded) {
  EXPECT_EQ(MigrationCause(true, false, absl::StatusCode::kCancelled), "worker_down");
  EXPECT_EQ(MigrationCause(false, false, absl::StatusCode::kUnavailable), "stream_broken");
  EXPECT_EQ(MigrationCause(false, true, absl::StatusCode::kUnavailable), "worker_error");
  EXPECT_EQ(MigrationCause(false, false, absl::StatusCode::kInternal), "worker_error");
  EXPECT_EQ(MigrationCause(false, false, absl::StatusCode::kDeadlineExceeded), "");
  EXPECT_EQ(MigrationCause(false, false, absl::StatusCode::kCancelled), "");
}

TEST_F(DispatchRulesTest, ARequestThatCannotMoveEndsSayingWhy) {
  Received(3);
  job_.migrations = limits_.max_migrations;
  Decision d = Decide(Failed("w1", absl::UnavailableError("broken"), true, true));
  EXPECT_EQ(d.next, Next::kEnd);
  EXPECT_EQ(d.failure, "migration_limit");
  EXPECT_EQ(d.end.message(),
            "broken; the request cannot continue on another worker (it moved 3 times)");

  job_.migrations = 0;
  clock_.Advance(absl::Seconds(61));
  d = Decide(Failed("w1", absl::UnavailableError("broken"), true, true));
  EXPECT_EQ(d.failure, "deadline");
  EXPECT_EQ(d.end.message(),
            "broken; the request cannot continue on another worker (its deadline passed)");

  job_.deadline = clock_.Now() + absl::Seconds(60);
  job_.choices = 2;
  d = Decide(Failed("w1", absl::UnavailableError("broken"), true, true));
  EXPECT_EQ(d.failure, "several_choices");

  job_.choices = 1;
  job_.tracked = false;
  d = Decide(Failed("w1", absl::UnavailableError("broken"), true, true));
  EXPECT_EQ(d.failure, "untracked");

  // A failure that may not move (the worker's deadline) ends with its own cause.
  job_.tracked = true;
  d = Decide(Failed("w1", absl::DeadlineExceededError("late"), true, false));
  EXPECT_EQ(d.failure, "deadline");
}

TEST_F(DispatchRulesTest, AStreamThatFailedAfterEveryChoiceEndedJustEnds) {
  Received(4, /*finished=*/true);
  const Decision d = Decide(Failed("w1", absl::UnavailableError("broken"), true, true, true));
  EXPECT_EQ(d.next, Next::kEnd);
  EXPECT_TRUE(d.end.ok());
  EXPECT_FALSE(d.show_error_event);
  EXPECT_EQ(d.failure, "");
}

TEST_F(DispatchRulesTest, ADrainStopWithOutputIsHandedOffToTheSameRole) {
  Received(6);
  job_.role = WorkerKind::kDecode;
  AttemptOutcome o = Failed("d1", absl::UnavailableError("draining"), true, true, true);
  o.handoff_endpoint = "127.0.0.1:7500";
  const Decision d = Decide(o);
  EXPECT_EQ(d.next, Next::kMigrate);
  EXPECT_EQ(d.cause, "drain_handoff");
  EXPECT_EQ(d.handoff.endpoint, "127.0.0.1:7500");
  EXPECT_EQ(d.handoff.source, "d1");
  EXPECT_EQ(d.handoff.request_id, "req-1");
  EXPECT_EQ(d.handoff.role, WorkerKind::kDecode);
  ApplyDecision(d, &job_);
  EXPECT_TRUE(job_.handoff.active());

  // The targets: decode workers, neither the source (by id or endpoint) nor one that failed it.
  const std::vector<WorkerLoadView> workers = {
      Worker("d1", WorkerKind::kDecode),  Worker("d2", WorkerKind::kDecode),
      Worker("d3", WorkerKind::kDecode),  Worker("d4", WorkerKind::kDecode),
      Worker("p1", WorkerKind::kPrefill), Worker("a1", WorkerKind::kAggregated)};
  const std::vector<std::string> endpoints = {
      "127.0.0.1:7500", "127.0.0.1:7500", "127.0.0.1:7502", "127.0.0.1:7503", "", ""};
  job_.excluded.insert("d3");
  EXPECT_EQ(Ids(workers, HandoffTargets(workers, endpoints, job_)),
            std::vector<std::string>({"d4"}));

  // A pre-copy's target is the only one while it can take the hand-off; one that cannot (the
  // source, one that failed the job, one gone) leaves the others.
  job_.excluded.clear();
  job_.precopy_target = "d3";
  EXPECT_EQ(Ids(workers, HandoffTargets(workers, endpoints, job_)),
            std::vector<std::string>({"d3"}));
  job_.excluded.insert("d3");
  EXPECT_EQ(Ids(workers, HandoffTargets(workers, endpoints, job_)),
            std::vector<std::string>({"d4"}));
  job_.precopy_target = "d9";
  job_.excluded.clear();
  EXPECT_EQ(Ids(workers, HandoffTargets(workers, endpoints, job_)),
            std::vector<std::string>({"d3", "d4"}));
}

TEST_F(DispatchRulesTest, ADrainStopWithoutOutputIsAPlainRetryOrReprefill) {
  AttemptOutcome o = Failed("d1", absl::UnavailableError("draining"), false, true, true);
  o.handoff_endpoint = "127.0.0.1:7500";
  EXPECT_EQ(Decide(o).next, Next::kRetry);  // nothing to hand off yet

  // An earlier migration carried no token: a re-prefill migration, not a hand-off.
  job_.migrations = 1;
  const Decision d = Decide(o);
  EXPECT_EQ(d.next, Next::kMigrate);
  EXPECT_EQ(d.cause, "worker_error");
  EXPECT_FALSE(d.handoff.active());
}

TEST_F(DispatchRulesTest, AHandoffThatFailsBeforeATokenFallsBackToReprefill) {
  Received(6);
  job_.migrations = 1;
  job_.handoff = {"127.0.0.1:7500", "d1", "req-1", WorkerKind::kDecode};
  // Even an end that could not move otherwise (the target cancelled it) falls back.
  Decision d = Decide(Failed("d2", absl::CancelledError("target gone"), false, false));
  EXPECT_EQ(d.next, Next::kMigrate);
  EXPECT_EQ(d.cause, "handoff_failed");
  EXPECT_EQ(d.handoff_outcome, "fell_back");
  EXPECT_EQ(d.handoff_source, "d1");
  ApplyDecision(d, &job_);
  EXPECT_FALSE(job_.handoff.active());
  ++job_.attempts;
  EXPECT_EQ(job_.AttemptId(), "req-1.a2");

  // One that cannot move on fails; one whose choices had all ended completed.
  job_.handoff = {"127.0.0.1:7500", "d1", "req-1.m1", WorkerKind::kDecode};
  job_.migrations = limits_.max_migrations;
  d = Decide(Failed("d2", absl::UnavailableError("gone"), false, true));
  EXPECT_EQ(d.handoff_outcome, "failed");
  EXPECT_EQ(d.failure, "migration_limit");
  job_.progress[0].finished = true;
  d = Decide(Failed("d2", absl::UnavailableError("gone"), false, true));
  EXPECT_EQ(d.handoff_outcome, "completed");
}

TEST_F(DispatchRulesTest, ARestartThatFindsNoWorkerWaitsAtTheFrontUnlessTheRouterStops) {
  Decision d = Decide(Failed("w1", absl::UnavailableError("gone"), false, true, true));
  ASSERT_EQ(d.next, Next::kRetry);
  RestartFoundNoWorker(/*stopping=*/false, &d);  // even beyond the queue's bounds
  EXPECT_EQ(d.next, Next::kQueue);

  d = Decide(Failed("w1", absl::UnavailableError("gone"), false, true, true));
  RestartFoundNoWorker(/*stopping=*/true, &d);
  EXPECT_EQ(d.next, Next::kEnd);
  EXPECT_EQ(d.failure, "no_worker");
  EXPECT_EQ(d.end.message(), "gone");
  EXPECT_TRUE(d.show_error_event);
}

TEST_F(DispatchRulesTest, AdmissionKeepsArrivalOrderWithinTheQueuesBounds) {
  limits_.max_queued = 2;
  limits_.max_queued_tokens = 1000;
  EXPECT_EQ(AdmitNew(true, 0, 0, 100, limits_).status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(AdmitNew(false, 0, 0, 100, limits_).what, Admit::kStart);
  EXPECT_EQ(AdmitNew(false, 1, 100, 100, limits_).what, Admit::kQueue);  // never overtakes
  const Admission full = AdmitNew(false, 2, 200, 100, limits_);
  EXPECT_EQ(full.what, Admit::kReject);
  EXPECT_EQ(full.status.code(), absl::StatusCode::kResourceExhausted);
  const Admission tokens = AdmitNew(false, 1, 950, 100, limits_);
  EXPECT_EQ(tokens.what, Admit::kReject);
  EXPECT_EQ(tokens.status.code(), absl::StatusCode::kResourceExhausted);
  // One request larger than the token bound still waits alone.
  EXPECT_EQ(AdmitUnstarted(false, 0, 0, 5000, limits_).what, Admit::kQueue);
  EXPECT_EQ(AdmitUnstarted(false, 1, 100, 100, limits_).what, Admit::kQueue);
  EXPECT_EQ(AdmitUnstarted(false, 2, 200, 100, limits_).status.code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(DispatchRulesTest, AQueuedRequestWaitsUpToTheQueueTimeoutOrItsDeadline) {
  limits_.queue_timeout = absl::Seconds(30);
  EnterQueue(&job_, clock_.Now());
  // No worker up is no reason to fail: it waits.
  EXPECT_FALSE(QueuedWait(job_, clock_.Now(), "none_up", limits_).expired());
  clock_.Advance(absl::Seconds(20));
  EXPECT_EQ(LeaveQueue(&job_, clock_.Now()), absl::Seconds(20));
  clock_.Advance(absl::Seconds(100));  // it ran a long while, and was refused (no token)
  // Refused again (KV pressure) and back in the queue: its earlier stays count, not its run.
  EnterQueue(&job_, clock_.Now());
  job_.deadline = clock_.Now() + absl::Seconds(60);
  clock_.Advance(absl::Seconds(9));
  EXPECT_FALSE(QueuedWait(job_, clock_.Now(), "kv", limits_).expired());
  clock_.Advance(absl::Seconds(1));
  QueueExpiry e = QueuedWait(job_, clock_.Now(), "kv", limits_);
  EXPECT_EQ(LeaveQueue(&job_, clock_.Now()), absl::Seconds(30));
  EXPECT_EQ(e.reason, "queue_timeout");
  EXPECT_EQ(e.status.code(), absl::StatusCode::kUnavailable);  // 503 with Retry-After
  EXPECT_NE(e.status.message().find("room for its KV"), absl::string_view::npos);
  EXPECT_EQ(FailureCause(e.status), "no_worker");

  // A token ends the wait: the next one starts afresh.
  Decision d;
  d.progressed = true;
  ApplyDecision(d, &job_);
  LeaveQueue(&job_, clock_.Now());
  EnterQueue(&job_, clock_.Now());
  EXPECT_FALSE(QueuedWait(job_, clock_.Now(), "busy", limits_).expired());

  // The request's own deadline, when sooner.
  job_.deadline = clock_.Now() + absl::Seconds(5);
  clock_.Advance(absl::Seconds(5));
  e = QueuedWait(job_, clock_.Now(), "none_up", limits_);
  EXPECT_EQ(e.reason, "deadline");
  EXPECT_NE(e.status.message().find("none is up"), absl::string_view::npos);
}

TEST_F(DispatchRulesTest, WorkersThatFailedAJobAreAvoidedWhileAnotherCanTakeIt) {
  const std::vector<WorkerLoadView> aggregated = {Worker("a1", WorkerKind::kAggregated),
                                                  Worker("a2", WorkerKind::kAggregated)};
  job_.excluded = {"a1"};
  EXPECT_EQ(Ids(aggregated, StreamCandidates(aggregated, job_)), std::vector<std::string>{"a2"});
  job_.excluded = {"a1", "a2"};  // none left: they get it again
  EXPECT_EQ(Ids(aggregated, StreamCandidates(aggregated, job_)),
            std::vector<std::string>({"a1", "a2"}));

  // P/D: decode workers stream only while a prefill worker can take the request; each side
  // relaxes on its own.
  const std::vector<WorkerLoadView> pd = {Worker("p1", WorkerKind::kPrefill),
                                          Worker("d1", WorkerKind::kDecode),
                                          Worker("d2", WorkerKind::kDecode)};
  job_.excluded = {"p1", "d1"};
  EXPECT_EQ(Ids(pd, StreamCandidates(pd, job_)), std::vector<std::string>{"d2"});
  EXPECT_EQ(Ids(pd, PrefillCandidates(pd, job_)), std::vector<std::string>{"p1"});
  const std::vector<WorkerLoadView> decode_only = {Worker("d1", WorkerKind::kDecode)};
  EXPECT_TRUE(StreamCandidates(decode_only, job_).empty());
}

TEST_F(DispatchRulesTest, TrackingStopsOverACapOrOnAGapAndLetsGoOfItsTokens) {
  tracking_.max_tokens_per_request = 8;
  Received(5);
  std::vector<uint32_t> more(4, 1);
  ReceivedChunk over;
  over.first_output_index = 5;
  over.token_ids = more;
  int64_t delta = 0;
  EXPECT_EQ(Track(&job_, over, 5, tracking_, &delta), TrackResult::kOverCap);
  EXPECT_EQ(delta, -5);
  EXPECT_FALSE(job_.tracked);
  EXPECT_EQ(Track(&job_, over, 0, tracking_, &delta), TrackResult::kNotTracked);
  EXPECT_EQ(delta, 0);

  JobRecord other;
  ReceivedChunk gap;
  gap.first_output_index = 3;  // the record holds nothing of choice 0 yet
  gap.token_ids = more;
  EXPECT_EQ(Track(&other, gap, 0, tracking_, &delta), TrackResult::kInconsistent);
  ReceivedChunk total;
  total.token_ids = more;
  tracking_.max_tokens = 10;
  JobRecord third;
  EXPECT_EQ(Track(&third, total, 7, tracking_, &delta), TrackResult::kOverCap);  // all requests

  JobRecord kept;
  EXPECT_EQ(Track(&kept, total, 0, tracking_, &delta), TrackResult::kAdded);
  EXPECT_EQ(delta, 4);
  EXPECT_EQ(Untrack(&kept), 4);
  EXPECT_TRUE(kept.progress.empty());
}

TEST_F(DispatchRulesTest, QueuePoolIsTheTakerOrThePoolThatCouldNotTakeIt) {
  const std::vector<WorkerLoadView> aggregated = {Worker("a1", WorkerKind::kAggregated)};
  const std::vector<WorkerLoadView> decode_only = {Worker("d1", WorkerKind::kDecode)};
  const std::vector<WorkerLoadView> pd = {Worker("p1", WorkerKind::kPrefill),
                                          Worker("d1", WorkerKind::kDecode)};
  EXPECT_STREQ(QueuePool(aggregated, job_, /*started=*/false), "aggregated");
  EXPECT_STREQ(QueuePool(decode_only, job_, /*started=*/false), "prefill");
  EXPECT_STREQ(QueuePool(pd, job_, /*started=*/false), "decode");
  EXPECT_STREQ(QueuePool({}, job_, /*started=*/false), "aggregated");
  job_.role = WorkerKind::kDecode;
  EXPECT_STREQ(QueuePool({}, job_, /*started=*/true), "decode");
}

}  // namespace
}  // namespace ferry
