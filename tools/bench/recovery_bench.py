"""ferry bench recovery: how long a client's stream stalls when the decode worker serving it dies.

A router, one prefill and two decode workers (SmolLM2, UCX tcp) on this machine. Each round sends
a streaming completion of a fresh prompt (token ids, so contexts are exact), kills (SIGKILL) the
decode worker streaming it at a token position drawn from a fixed seed, and measures the time from
the kill to the next token on the same client stream: detection (the broken stream), the re-prefill
of the prompt and the output so far on the prefill worker (the prompt is a hit in its memory), the
KV push, and the first resumed step. The killed worker is started again on its port before the
next round.

The reference, measured in the same run and the same cache state: the TTFT of a new request whose
prompt is another fresh prompt of the same length, cached first, followed by as many new tokens as
the migration carried over (the resumed context as the re-prefill saw it). A user without migration
would instead re-ask: that TTFT, plus regenerating the lost tokens.

Every stream must complete; on the first rounds (not timed) each one is run fault-free first and
must give the same token ids when killed. Goal: recovery p50 <= 2x the resumed-context TTFT, zero failed requests.
Final line: JSON with bench, recovery_p50_ms, recovery_p90_ms, ttft_resumed_ms, ratio,
reprefill_hit_ratio, failed_requests, rounds, goals_met.
"""
import http.client
import json
import os
import random
import signal
import statistics
import sys
import time

ROUTER, WORKER, SERVICES = sys.argv[1:4]
sys.path.insert(0, os.path.dirname(os.path.abspath(SERVICES)))
import ferry_services as fs  # noqa: E402

MODEL = os.environ.get("FERRY_MODEL_GGUF")
ROUNDS = int(os.environ.get("FERRY_RECOVERY_ROUNDS", "10"))
CHECKS = 3  # rounds first run fault-free, then killed: identical token ids (not timed)
PROMPT_TOKENS = int(os.environ.get("FERRY_RECOVERY_PROMPT_TOKENS", "1024"))
MAX_TOKENS = 96
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


def ttft(port, prompt):
    start = time.monotonic()
    ids, times, error, _ = stream(port, prompt, 1)
    if error or not times:
        raise RuntimeError(f"reference request failed: {error}")
    return (times[0] - start) * 1e3


def main():
    if not MODEL:
        sys.exit("run through ./ferry bench recovery (FERRY_MODEL_GGUF is not set)")
    common = [f"--model={MODEL}", "--threads=1", "--kv_pool_bytes=256MiB",
              "--transport=ucx", "--ucx_tls=tcp", "--block_tokens=64"]
    try:
        _, p = fs.start(WORKER, common + ["--role=prefill"], "prefill")
        decodes = []
        for i in range(2):
            proc, ports = fs.start(WORKER, common + ["--role=decode"], f"decode{i}")
            decodes.append({"proc": proc, "ports": ports})
        addresses = [f"127.0.0.1:{p['grpc_port']}"] + [
            f"127.0.0.1:{d['ports']['grpc_port']}" for d in decodes]
        _, r = fs.start(ROUTER, [f"--model={MODEL}", "--served_model_name=m",
                                 "--workers=" + ",".join(addresses), "--allow_unauthenticated",
                                 "--heartbeat_timeout=2s"], "router")
        port, admin = r["http_port"], r["admin_port"]
        fs.wait_workers_up(admin, 3, "router")

        def fresh_prompt():
            return [RNG.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(PROMPT_TOKENS)]

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
            # The killed worker comes back on its port.
            victim = state["victim"]
            victim["proc"].wait()
            address = f"127.0.0.1:{victim['ports']['grpc_port']}"
            proc, ports = fs.start(WORKER, common + ["--role=decode", f"--address={address}"],
                                   f"decode-restart{round_}")
            victim["proc"], victim["ports"] = proc, ports
            fs.wait_workers_up(admin, 3, "router")
            print(f"round {round_}{'' if timed else ' (checked, not timed)'}: killed at token "
                  f"{carried}, next token after {recovery:.0f} ms; resumed-context TTFT "
                  f"{reference:.0f} ms; re-prefill prompt hit ratio {hit:.2f}", file=sys.stderr)
        router_failed = sum(
            fs.metric(admin, f'ferry_router_failed_requests_total{{cause="{c}"}}')
            for c in ("no_worker", "worker_error", "deadline", "migration_limit", "untracked",
                      "several_choices"))
        migrations = sum(fs.metric(admin, f'ferry_router_migrations_total{{cause="{c}"}}')
                         for c in ("stream_broken", "worker_down", "worker_error"))
    finally:
        fs.stop_all()
    p50 = statistics.median(recoveries) if recoveries else float("nan")
    p90 = sorted(recoveries)[int(0.9 * (len(recoveries) - 1))] if recoveries else float("nan")
    reference = statistics.median(references) if references else float("nan")
    ratio = p50 / reference if reference else float("nan")
    hits = [h for h in hits if h == h]
    hit = statistics.mean(hits) if hits else 0.0
    failed_requests = failed + int(router_failed) + mismatched
    goals = ratio <= 2.0 and failed_requests == 0 and len(recoveries) == ROUNDS and not any(
        r != r for r in recoveries)
    print(f"recovery: SmolLM2 P/D (1 prefill + 2 decode, UCX tcp), {PROMPT_TOKENS}-token prompts, "
          f"{ROUNDS} decode kills, {int(migrations)} migrations")
    print(f"  kill -> next token     p50 {p50:8.1f} ms   p90 {p90:8.1f} ms")
    print(f"  resumed-context TTFT   p50 {reference:8.1f} ms   (prompt cached, carried tokens new)")
    print(f"  ratio {ratio:.2f} (goal <= 2.0); re-prefill prompt hit ratio {hit:.2f}; failed "
          f"requests {failed_requests} (mismatched outputs {mismatched}); goals met: {goals}")
    print(json.dumps({"bench": "recovery", "recovery_p50_ms": round(p50, 1),
                      "recovery_p90_ms": round(p90, 1), "ttft_resumed_ms": round(reference, 1),
                      "ratio": round(ratio, 3), "reprefill_hit_ratio": round(hit, 3),
                      "failed_requests": failed_requests, "rounds": ROUNDS,
                      "migrations": int(migrations), "goals_met": goals}))


def fs_metrics(admin_port):
    return {
        "local": fs.metric(admin_port, 'ferry_worker_prompt_tokens_total{source="local"}'),
        "computed": fs.metric(admin_port, 'ferry_worker_prompt_tokens_total{source="computed"}'),
    }


if __name__ == "__main__":
    main()
