"""ferry bench recovery: how long a client's stream stalls when the decode worker serving it dies,
and when it is drained (SIGTERM) and hands its requests off with their KV.

A router, one prefill and two decode workers (SmolLM2, UCX tcp; the decode workers with
--drain_grace=2s) on this machine.

Kill rounds: each sends a streaming completion of a fresh prompt (token ids, so contexts are
exact), kills (SIGKILL) the decode worker streaming it at a token position drawn from a fixed seed,
and measures the time from the kill to the next token on the same client stream: detection (the
broken stream), the re-prefill of the prompt and the output so far on the prefill worker (the
prompt is a hit in its memory), the KV push, and the first resumed step. The killed worker is
started again on its port before the next round.

The reference, measured in the same run and the same cache state: the TTFT of a new request whose
prompt is another fresh prompt of the same length, cached first, followed by as many new tokens as
the migration carried over (the resumed context as the re-prefill saw it). A user without migration
would instead re-ask: that TTFT, plus regenerating the lost tokens.

Every stream must complete; on the first rounds (not timed) each one is run fault-free first and
must give the same token ids when killed. Goal: recovery p50 <= 2x the resumed-context TTFT, zero
failed requests.

Drain rounds (after the kill rounds, same stack): each streams several completions of fresh
prompts at once, long enough to outlast the grace, and once every stream has 16 tokens sends
SIGTERM to the decode worker streaming the most (by its ferry_worker_running_requests). Its
requests decode on for the grace (while the other decode worker pre-copies the KV they computed
so far: PrefetchKv), then each is parked with its KV and moved by the router to the other decode
worker, which pulls the rest of the KV from the draining one (PushKv) instead of re-prefilling;
the drained worker must exit 0 and is started again on its port. Measured:
  - drain duration: SIGTERM to the process's exit, against the grace;
  - hand-off stall, per moved stream: the client-observed gap between the last token before the
    hand-off and the first after it. The moved streams are as many as the router's
    ferry_router_migrations_total{cause="drain_handoff"} grew by: those with the largest gap that
    spans SIGTERM + grace (where the worker parks them) and starts at most two decode steps after
    it;
  - bytes per hand-off: the surviving decode worker's ferry_worker_handoff_received_bytes_total
    over its ferry_worker_handoffs_received_total (deltas), and the stall per GB of it; the
    drained worker's own push times (PushKv arrival to push completion) from its log, as it has
    exited with its metrics;
  - the re-prefill it avoided, per moved stream: the resumed-context TTFT as above (a fresh prompt
    of the same length, cached, followed by the tokens the moved stream had carried);
  - the largest gap on any stream after the hand-offs (the survivor taking on the moved streams).
The first drain round (not timed: its prompts' KV is cached on both decode workers by then, so
its hand-offs push little) runs its prompts fault-free first: identical token ids after the drain.
Every stream must complete with all its tokens; client errors, mismatches, the router's failed
requests, hand-offs that fell back to re-prefill or failed, a round that handed nothing off, and
a drained worker that does not exit 0 count as drain failures. Goal: hand-off stall p50 <= 0.2x
the re-prefill's (resumed-context TTFT p50), zero drain failures.

Environment: FERRY_RECOVERY_PRECOPY (1; 0: the router's --handoff_precopy=false),
FERRY_RECOVERY_ROUNDS (kill rounds, 10), FERRY_RECOVERY_PROMPT_TOKENS (1024),
FERRY_RECOVERY_DRAIN_ROUNDS (4), FERRY_RECOVERY_DRAIN_STREAMS (4),
FERRY_RECOVERY_DRAIN_MAX_TOKENS (500: SmolLM2 decodes 30-45 tokens/s a stream here, so a stream
outlasts the grace by far).

Final line: JSON with bench, recovery_p50_ms, recovery_p90_ms, ttft_resumed_ms, ratio,
reprefill_hit_ratio, failed_requests, rounds, migrations, handoff_ms_p50, handoff_ms_p90,
reprefill_ms_p50, handoff_ratio, handoff_ms_per_gb, handoff_mb_p50, handoff_push_ms_p50,
drain_duration_s_p50, later_stall_ms_p50, handoffs, handoffs_fell_back, drain_failed_requests,
drain_rounds, goals_met (every goal, kill and drain).
"""
import http.client
import json
import os
import random
import re
import signal
import statistics
import sys
import threading
import time

ROUTER, WORKER, SERVICES = sys.argv[1:4]
sys.path.insert(0, os.path.dirname(os.path.abspath(SERVICES)))
import ferry_services as fs  # noqa: E402

MODEL = os.environ.get("FERRY_MODEL_GGUF")
ROUNDS = int(os.environ.get("FERRY_RECOVERY_ROUNDS", "10"))
CHECKS = 3  # rounds first run fault-free, then killed: identical token ids (not timed)
PROMPT_TOKENS = int(os.environ.get("FERRY_RECOVERY_PROMPT_TOKENS", "1024"))
MAX_TOKENS = 96
DRAIN_ROUNDS = int(os.environ.get("FERRY_RECOVERY_DRAIN_ROUNDS", "4"))
DRAIN_STREAMS = int(os.environ.get("FERRY_RECOVERY_DRAIN_STREAMS", "4"))
DRAIN_MAX_TOKENS = int(os.environ.get("FERRY_RECOVERY_DRAIN_MAX_TOKENS", "500"))
# The router's --handoff_precopy (the hand-offs' targets pre-copy the KV during the grace); 0:
# off, every hand-off moves all of its KV at the deadline (the before-and-after of issue 51).
PRECOPY = os.environ.get("FERRY_RECOVERY_PRECOPY", "1") != "0"
DRAIN_CHECKS = 1  # rounds first run fault-free, then drained: identical token ids (not timed)
DRAIN_AT = 16  # tokens every stream has before the SIGTERM
GRACE_S = 2.0
HANDOFF_GOAL = 0.2
RNG = random.Random(20261203)
VOCAB_LOW, VOCAB_HIGH = 100, 40000  # plain word pieces of SmolLM2's vocabulary


def stream(port, prompt, max_tokens, on_token=None):
    """Streams a greedy completion of `prompt` (ids); returns (ids, times, error, usage)."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    ids, times, error, usage = [], [], None, None
    if response.status != 200:
        return ids, times, f"HTTP {response.status}: {response.read()[:300]}", usage
    while True:
        line = response.readline()  # the chunked body's, ending with it
        if not line:
            break
        line = line.decode().strip()
        if line == "data: [DONE]":
            break
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if "error" in event:
            error = event["error"]
            continue
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices", []):
            got = choice.get("token_ids") or []
            if got:
                now = time.monotonic()
                ids.extend(got)
                times.extend([now] * len(got))
                if on_token is not None:
                    on_token(len(ids))
    conn.close()
    return ids, times, error, usage


def stream_all(port, prompts, max_tokens, counts=None):
    """Streams every prompt at once, each in a thread; returns (threads, results): results[i] is
    stream()'s answer once threads[i] ended; counts[i], when given, the tokens stream i has."""
    results = [None] * len(prompts)

    def work(i):
        on_token = None
        if counts is not None:
            def on_token(n):
                counts[i] = n
        try:
            results[i] = stream(port, prompts[i], max_tokens, on_token)
        except Exception as e:  # noqa: BLE001 - a client error is a failed request
            results[i] = ([], [], f"client: {e!r}", None)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    return threads, results


def ttft(port, prompt):
    start = time.monotonic()
    ids, times, error, _ = stream(port, prompt, 1)
    if error or not times:
        raise RuntimeError(f"reference request failed: {error}")
    return (times[0] - start) * 1e3


def scrape(admin_port):
    """Every sample on a service's /metrics page: {name with labels: value}."""
    _, body = fs.get(f"http://127.0.0.1:{admin_port}/metrics")
    samples = {}
    for text in body.splitlines():
        if text and not text.startswith("#"):
            name, _, value = text.rpartition(" ")
            samples[name] = float(value)
    return samples


def total(samples, name, **labels):
    """The sum of `name`'s samples having `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.items()
               if (k == name or k.startswith(name + "{")) and all(w in k for w in want))


def pct(values, q):
    return sorted(values)[int(q * (len(values) - 1))] if values else float("nan")


def median(values):
    return statistics.median(values) if values else float("nan")


def main():
    if not MODEL:
        sys.exit("run through ./ferry bench recovery (FERRY_MODEL_GGUF is not set)")
    common = [f"--model={MODEL}", "--threads=1", "--kv_pool_bytes=256MiB",
              "--transport=ucx", "--ucx_tls=tcp", "--block_tokens=64"]
    # The grace only matters to the drain rounds (a SIGKILL skips it).
    decode_flags = common + ["--role=decode", f"--drain_grace={GRACE_S:g}s"]
    try:
        _, p = fs.start(WORKER, common + ["--role=prefill"], "prefill")
        decodes = []
        for i in range(2):
            proc, ports = fs.start(WORKER, decode_flags, f"decode{i}")
            decodes.append({"proc": proc, "ports": ports, "name": f"decode{i}"})
        addresses = [f"127.0.0.1:{p['grpc_port']}"] + [
            f"127.0.0.1:{d['ports']['grpc_port']}" for d in decodes]
        _, r = fs.start(ROUTER, [f"--model={MODEL}", "--served_model_name=m",
                                 "--workers=" + ",".join(addresses), "--allow_unauthenticated",
                                 "--heartbeat_timeout=2s",
                                 f"--handoff_precopy={'true' if PRECOPY else 'false'}"], "router")
        port, admin = r["http_port"], r["admin_port"]
        fs.wait_workers_up(admin, 3, "router")

        def fresh_prompt():
            return [RNG.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(PROMPT_TOKENS)]

        def restart(victim, name):
            """The stopped decode worker comes back on its port."""
            victim["proc"].wait()
            address = f"127.0.0.1:{victim['ports']['grpc_port']}"
            proc, ports = fs.start(WORKER, decode_flags + [f"--address={address}"], name)
            victim["proc"], victim["ports"], victim["name"] = proc, ports, name
            fs.wait_workers_up(admin, 3, "router")

        ttft(port, fresh_prompt())  # warm-up
        recoveries, references, hits, failed, mismatched = [], [], [], 0, 0
        for round_ in range(CHECKS + ROUNDS):
            prompt = fresh_prompt()
            want = None
            timed = round_ >= CHECKS
            if not timed:  # a fault-free run first: the same ids after the kill
                want, _, error, _ = stream(port, prompt, MAX_TOKENS)
                if error:
                    failed += 1
            kill_at = RNG.randrange(16, MAX_TOKENS - 16)
            state = {"killed": None, "victim": None, "before": None}

            def on_token(n):
                if n >= kill_at and state["killed"] is None:
                    for d in decodes:
                        if fs.metric(d["ports"]["admin_port"], "ferry_worker_running_requests") > 0:
                            # The prefill worker's counters before: the re-prefill's hits after.
                            state["before"] = fs_metrics(p["admin_port"])
                            state["victim"] = d
                            state["killed"] = time.monotonic()
                            os.kill(d["proc"].pid, signal.SIGKILL)
                            break

            ids, times, error, usage = stream(port, prompt, MAX_TOKENS, on_token)
            if error or len(ids) != MAX_TOKENS:
                failed += 1
                print(f"round {round_}: failed ({error}, {len(ids)} tokens)", file=sys.stderr)
            if want is not None and want != ids:
                mismatched += 1
            if usage and usage.get("completion_tokens") != len(ids):
                print(f"round {round_}: usage counts {usage.get('completion_tokens')} tokens, the "
                      f"client got {len(ids)}", file=sys.stderr)
                failed += 1
            if state["killed"] is None:
                print(f"round {round_}: no decode worker was found busy", file=sys.stderr)
                failed += 1
                continue
            after_kill = [t for t in times if t > state["killed"]]
            carried = sum(1 for t in times if t <= state["killed"])
            recovery = (after_kill[0] - state["killed"]) * 1e3 if after_kill else float("nan")
            after, before = fs_metrics(p["admin_port"]), state["before"]
            local = after["local"] - before["local"]
            computed = after["computed"] - before["computed"]
            hit = local / (local + computed) if local + computed > 0 else float("nan")
            # The reference: a fresh prompt of the same length, cached, then the carried tokens.
            other = fresh_prompt()
            ttft(port, other)
            reference = ttft(port, other + ids[:carried])
            if timed:
                recoveries.append(recovery)
                references.append(reference)
                hits.append(hit)
            restart(state["victim"], f"decode-restart{round_}")
            print(f"round {round_}{'' if timed else ' (checked, not timed)'}: killed at token "
                  f"{carried}, next token after {recovery:.0f} ms; resumed-context TTFT "
                  f"{reference:.0f} ms; re-prefill prompt hit ratio {hit:.2f}", file=sys.stderr)
        router_failed = sum(
            fs.metric(admin, f'ferry_router_failed_requests_total{{cause="{c}"}}')
            for c in ("no_worker", "worker_error", "deadline", "migration_limit", "untracked",
                      "several_choices"))
        migrations = sum(fs.metric(admin, f'ferry_router_migrations_total{{cause="{c}"}}')
                         for c in ("stream_broken", "worker_down", "worker_error"))
        drain = drain_rounds(port, admin, decodes, fresh_prompt, restart)
    finally:
        fs.stop_all()
    p50 = median(recoveries)
    p90 = pct(recoveries, 0.9)
    reference = median(references)
    ratio = p50 / reference if reference else float("nan")
    hits = [h for h in hits if h == h]
    hit = statistics.mean(hits) if hits else 0.0
    failed_requests = failed + int(router_failed) + mismatched
    kill_goals = ratio <= 2.0 and failed_requests == 0 and len(recoveries) == ROUNDS and not any(
        r != r for r in recoveries)
    drain_goals = drain["goals_met"]
    goals = kill_goals and drain_goals
    print(f"recovery: SmolLM2 P/D (1 prefill + 2 decode, UCX tcp), {PROMPT_TOKENS}-token prompts, "
          f"{ROUNDS} decode kills, {int(migrations)} migrations")
    print(f"  kill -> next token     p50 {p50:8.1f} ms   p90 {p90:8.1f} ms")
    print(f"  resumed-context TTFT   p50 {reference:8.1f} ms   (prompt cached, carried tokens new)")
    print(f"  ratio {ratio:.2f} (goal <= 2.0); re-prefill prompt hit ratio {hit:.2f}; failed "
          f"requests {failed_requests} (mismatched outputs {mismatched}); kill goals met: "
          f"{kill_goals}")
    for line in drain["rows"]:
        print(line)
    print(f"  goals met: {goals} (kill {kill_goals}, drain {drain_goals})")
    print(json.dumps({"bench": "recovery", "recovery_p50_ms": round(p50, 1),
                      "recovery_p90_ms": round(p90, 1), "ttft_resumed_ms": round(reference, 1),
                      "ratio": round(ratio, 3), "reprefill_hit_ratio": round(hit, 3),
                      "failed_requests": failed_requests, "rounds": ROUNDS,
                      "migrations": int(migrations), **drain["json"], "goals_met": goals}))


def drain_rounds(port, admin, decodes, fresh_prompt, restart):
    """The drain rounds (see the module's docstring): one checked round (not timed), then
    DRAIN_ROUNDS timed ones; returns {"rows": the human rows, "json": the final line's drain keys,
    "goals_met"}."""
    stalls, reprefills, per_gb, sizes, durations, pushes, later = [], [], [], [], [], [], []
    failed, mismatched, handoffs, fell_back, timed_rounds = 0, 0, 0, 0, 0
    for round_ in range(DRAIN_CHECKS + DRAIN_ROUNDS):
        timed = round_ >= DRAIN_CHECKS
        prompts = [fresh_prompt() for _ in range(DRAIN_STREAMS)]
        wants = None
        if not timed:  # fault-free first: the same ids after the drain
            threads, refs = stream_all(port, prompts, DRAIN_MAX_TOKENS)
            for t in threads:
                t.join()
            wants = [ids for ids, _, _, _ in refs]
            for i, (ids, _, error, _) in enumerate(refs):
                if error or len(ids) != DRAIN_MAX_TOKENS:
                    failed += 1
                    print(f"drain round {round_}: fault-free stream {i} failed ({error}, "
                          f"{len(ids)} tokens)", file=sys.stderr)
        router_before = scrape(admin)
        received_before = [scrape(d["ports"]["admin_port"]) for d in decodes]
        counts = [0] * DRAIN_STREAMS
        threads, results = stream_all(port, prompts, DRAIN_MAX_TOKENS, counts)
        give_up = time.monotonic() + 60
        while min(counts) < DRAIN_AT and time.monotonic() < give_up and all(
                t.is_alive() for t in threads):
            time.sleep(0.002)
        running = [fs.metric(d["ports"]["admin_port"], "ferry_worker_running_requests")
                   for d in decodes]
        if min(counts) < DRAIN_AT or max(running) == 0:
            print(f"drain round {round_}: streams at {counts}, decode workers running {running}: "
                  f"nothing to drain", file=sys.stderr)
            failed += 1
            for t in threads:
                t.join()
            continue
        v = running.index(max(running))
        victim, survivor = decodes[v], decodes[1 - v]
        term = time.monotonic()
        os.kill(victim["proc"].pid, signal.SIGTERM)
        exit_state = {}

        def wait_exit(proc=victim["proc"]):
            try:
                exit_state["rc"] = proc.wait(timeout=90)
            except Exception:  # noqa: BLE001 - it did not exit: counted below
                exit_state["rc"] = None
            exit_state["t"] = time.monotonic()

        waiter = threading.Thread(target=wait_exit, daemon=True)
        waiter.start()
        for t in threads:
            t.join()
        waiter.join()
        rc, exited = exit_state["rc"], exit_state["t"]
        duration = exited - term
        if rc != 0:
            failed += 1
            print(f"drain round {round_}: the drained worker exited {rc}", file=sys.stderr)
            if rc is None:
                victim["proc"].kill()
        elif timed:
            durations.append(duration)
        # Clients: every stream complete, the same ids as fault-free.
        for i, (ids, _, error, usage) in enumerate(results):
            if error or len(ids) != DRAIN_MAX_TOKENS:
                failed += 1
                print(f"drain round {round_}: stream {i} failed ({error}, {len(ids)} tokens)",
                      file=sys.stderr)
            elif usage and usage.get("completion_tokens") != len(ids):
                failed += 1
                print(f"drain round {round_}: stream {i}: usage counts "
                      f"{usage.get('completion_tokens')} tokens, the client got {len(ids)}",
                      file=sys.stderr)
            if wants is not None and wants[i] != ids:
                mismatched += 1
                print(f"drain round {round_}: stream {i} differs from its fault-free run",
                      file=sys.stderr)
        # The router's view: hand-offs, fall-backs, failed requests.
        router_after = scrape(admin)

        def delta(name, **labels):
            return int(total(router_after, name, **labels) - total(router_before, name, **labels))

        moved = delta("ferry_router_migrations_total", cause="drain_handoff")
        completed = delta("ferry_router_handoffs_total", outcome="completed")
        fell = delta("ferry_router_handoffs_total", outcome="fell_back")
        handoff_failed = delta("ferry_router_handoffs_total", outcome="failed")
        router_failed = delta("ferry_router_failed_requests_total")
        failed += fell + handoff_failed + router_failed
        if moved == 0:
            failed += 1
            print(f"drain round {round_}: nothing was handed off", file=sys.stderr)
        # The surviving decode worker's received hand-offs.
        s_after = scrape(survivor["ports"]["admin_port"])
        s_before = received_before[1 - v]
        received = (total(s_after, "ferry_worker_handoffs_received_total") -
                    total(s_before, "ferry_worker_handoffs_received_total"))
        received_bytes = (total(s_after, "ferry_worker_handoff_received_bytes_total") -
                          total(s_before, "ferry_worker_handoff_received_bytes_total"))
        per_handoff = received_bytes / received if received else float("nan")
        # The drained worker's pushes (PushKv arrival to push completion), from its log: it has
        # exited, so its ferry_worker_handoff_seconds is gone.
        round_pushes = logged_pushes(victim["name"])
        # The moved streams: each was parked at the drain's deadline, SIGTERM + grace, once the
        # step then running ended; its hand-off gap spans the deadline and starts at most about
        # a step after it (a later gap, e.g. as the other hand-offs join the batch, is not it).
        # The `moved` streams with the largest such gap.
        grace_end = term + GRACE_S
        gaps = []
        for i, (_, times, _, _) in enumerate(results):
            steps = [b - a for a, b in zip(times, times[1:]) if b <= term]
            window = max(2 * median(steps), 0.03) if steps else 0.1
            best = None
            for j in range(1, len(times)):
                if times[j] > grace_end and term <= times[j - 1] <= grace_end + window and (
                        best is None or times[j] - times[j - 1] > best[0]):
                    best = (times[j] - times[j - 1], j, times[j - 1] - grace_end)
            if best is not None:
                gaps.append((best, i))
        gaps.sort(reverse=True)
        round_stalls = []
        for (gap, carried, start), i in gaps[:moved]:
            ids = results[i][0]
            other = fresh_prompt()
            ttft(port, other)
            reprefill = ttft(port, other + ids[:carried])
            stall = gap * 1e3
            if timed:
                stalls.append(stall)
                reprefills.append(reprefill)
                if received_bytes:
                    per_gb.append(stall / (per_handoff / 1e9))
            round_stalls.append(f"{stall:.0f} ms at token {carried} (last token "
                                f"{start * 1e3:+.0f} ms from the grace's end) vs re-prefill "
                                f"{reprefill:.0f} ms")
        others = [g[0][0] * 1e3 for g in gaps[moved:]]
        # Any stream's largest gap once the hand-offs are over (after the drained worker exited
        # and every moved stream had its first token after the hand-off).
        resumed = max([exited] + [results[i][1][j] for (_, j, _), i in gaps[:moved]])
        after = max([b - a for _, times, _, _ in results for a, b in zip(times, times[1:])
                     if a >= resumed] or [0.0]) * 1e3
        rates = []
        for _, times, _, _ in results:
            before = [t for t in times if t <= term]
            if len(before) > 1 and before[-1] > before[0]:
                rates.append((len(before) - 1) / (before[-1] - before[0]))
        if timed:
            timed_rounds += 1
            handoffs += completed
            fell_back += fell
            later.append(after)
            pushes.extend(ms for _, ms in round_pushes)
            if received:
                sizes.append(per_handoff / 1e6)
        restart(victim, f"decode-drain-restart{round_}")
        pushed = ", ".join(f"{b / 1e6:.1f} MB in {ms:.0f} ms" for b, ms in round_pushes)
        print(f"drain round {round_}{'' if timed else ' (checked, not timed)'}: "
              f"{max(running):.0f} of {DRAIN_STREAMS} streams on the drained worker, decoding at "
              f"{median(rates):.0f} tokens/s each; it exited {rc} after {duration:.2f} s; "
              f"{moved} moved ({completed} completed, {fell} fell back, {handoff_failed} failed; "
              f"{per_handoff / 1e6:.1f} MB received each; pushes {pushed or 'not logged'}): "
              + "; ".join(round_stalls) +
              (f"; the other streams' largest gap then {max(others):.0f} ms" if others else "") +
              f"; later, the largest gap on any stream {after:.0f} ms", file=sys.stderr)
    failed += mismatched
    stall50, stall90 = median(stalls), pct(stalls, 0.9)
    reprefill50 = median(reprefills)
    ratio = stall50 / reprefill50 if reprefill50 else float("nan")
    per_gb50 = median(per_gb)
    size50 = median(sizes)
    duration50 = median(durations)
    push50 = median(pushes)
    goals = (ratio <= HANDOFF_GOAL and failed == 0 and timed_rounds == DRAIN_ROUNDS and
             handoffs > 0)
    rows = [
        f"drain: {DRAIN_ROUNDS} SIGTERMs of a decode worker (--drain_grace={GRACE_S:g}s) under "
        f"{DRAIN_STREAMS} streams of {DRAIN_MAX_TOKENS} tokens (+{DRAIN_CHECKS} checked round), "
        f"{handoffs} hand-offs completed, {fell_back} fell back to re-prefill",
        f"  drain duration         p50 {duration50:8.2f} s    (SIGTERM -> exit; grace "
        f"{GRACE_S:.2f} s)",
        f"  hand-off stall         p50 {stall50:8.1f} ms   p90 {pct(stalls, 0.9):8.1f} ms   (last "
        f"token before -> first after)",
        f"  hand-off size          p50 {size50:8.1f} MB   stall {per_gb50:.0f} ms per GB; the "
        f"drained worker's push p50 {push50:.1f} ms",
        f"  re-prefill TTFT-equiv. p50 {reprefill50:8.1f} ms   (prompt cached, carried tokens "
        f"new)",
        f"  later stall, any stream p50 {median(later):7.1f} ms   (largest gap after the "
        f"hand-offs)",
        f"  hand-off ratio {ratio:.2f} (goal <= {HANDOFF_GOAL}); drain failed requests {failed} "
        f"(mismatched outputs {mismatched}); drain goals met: {goals}"
        + ("" if ratio <= HANDOFF_GOAL else
           " -- the hand-off ratio goal is NOT met on this machine"),
    ]
    return {"rows": rows, "goals_met": goals, "json": {
        "handoff_ms_p50": round(stall50, 1), "handoff_ms_p90": round(stall90, 1),
        "reprefill_ms_p50": round(reprefill50, 1), "handoff_ratio": round(ratio, 3),
        "handoff_ms_per_gb": round(per_gb50, 1), "handoff_mb_p50": round(size50, 2),
        "handoff_push_ms_p50": round(push50, 1), "drain_duration_s_p50": round(duration50, 3),
        "later_stall_ms_p50": round(median(later), 1), "handoffs": handoffs,
        "handoffs_fell_back": fell_back, "drain_failed_requests": failed,
        "drain_rounds": DRAIN_ROUNDS}}


PUSH_LOG = re.compile(r"hand-off of request \S+: (\d+) bytes pushed in ([0-9.]+)(us|ms|s)\b")


def logged_pushes(name):
    """[(bytes, ms)] of the pushes the worker started as `name` logged (best effort)."""
    try:
        with open(os.path.join(fs.TMP, name + ".log")) as log:
            text = log.read()
    except OSError:
        return []
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    return [(int(b), float(t) * scale[u]) for b, t, u in PUSH_LOG.findall(text)]


def fs_metrics(admin_port):
    return {
        "local": fs.metric(admin_port, 'ferry_worker_prompt_tokens_total{source="local"}'),
        "computed": fs.metric(admin_port, 'ferry_worker_prompt_tokens_total{source="computed"}'),
    }


if __name__ == "__main__":
    main()
