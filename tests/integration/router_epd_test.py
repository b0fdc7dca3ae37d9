#!/usr/bin/env python3
"""The router half of E/P/D, on a real stack on loopback driven by the official openai SDK: a
router on the tiny VLM (make_tiny_vlm) with --encoders, ferry-encoder processes and ferry-worker
processes (aggregated, or a prefill and a decode worker), all at --weights=f32 (--kv_dtype=f32 for
the workers).

  router_epd_test.py FERRY_ROUTER FERRY_WORKER FERRY_ENCODER MODEL REFERENCE_JSON

REFERENCE_JSON is router_vlm_reference.py's (transformers' LlavaProcessor and
LlavaForConditionalGeneration): per case, the prompt's input_ids and the greedy tokens.

Checks: through an encoder, each case's prompt and greedy tokens are transformers' (aggregated, and
prefill + decode workers), and Anthropic's Messages API gives the same text; the encoder encoded the images and the worker did not (the request named
them by handle); the same image again is a hit in the encoder's cache (the router's "cached").
An encoder SIGKILLed: requests complete with the same tokens, their images inline (the router's
"fallback", the worker encodes them). Two encoders: the one holding an image killed, the image
goes to the other. A worker SIGKILLed mid-stream: the request migrates with its image inline and
ends with transformers' tokens. Encoders by DNS (--encoders_dns, dnsmasq): the name moving to
another encoder moves the images. Handles that are gone when the worker fetches them (an encoder with a 1 ns TTL):
the worker fails the attempt UNAVAILABLE and the router's retry sends the image inline; the
tokens are the same. Every process started is killed at the end (PR_SET_PDEATHSIG).
"""
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import unittest

import anthropic
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import (TMP, get, metric, start, stop_all, wait_for,  # noqa: E402
                            wait_workers_up)

ROUTER, WORKER, ENCODER, MODEL, REFERENCE = sys.argv[1:6]
with open(REFERENCE) as f:
    CASES = json.load(f)["cases"]
IMAGES = os.path.dirname(REFERENCE)
MAX_TOKENS = len(CASES[0]["tokens"])
MEDIA = {"png": "image/png", "jpg": "image/jpeg"}
WORKER_FLAGS = [f"--model={MODEL}", "--weights=f32", "--kv_dtype=f32", "--block_tokens=16",
                "--threads=1", "--kv_pool_bytes=8MiB"]

ENCODED = "ferry_encoder_images_encoded_total"
HITS = 'ferry_encoder_cache_lookups_total{result="hit"}'
FETCHED = 'ferry_worker_image_fetches_total{outcome="fetched"}'
GONE = 'ferry_worker_image_fetches_total{outcome="unavailable"}'


def encodes(result):
    return f'ferry_router_encodes_total{{result="{result}"}}'


def data_url(name):
    with open(os.path.join(IMAGES, name), "rb") as f:
        data = base64.b64encode(f.read()).decode()
    return f"data:{MEDIA[name.rsplit('.', 1)[1]]};base64,{data}"


def start_encoder(name, extra=()):
    p, ports = start(ENCODER, [f"--model={MODEL}", "--weights=f32"] + list(extra), name)
    return p, f"127.0.0.1:{ports['grpc_port']}", ports["admin_port"]


def start_router(workers, encoders, name):
    _, ports = start(ROUTER, [f"--model={MODEL}", "--served_model_name=tiny",
                              "--workers=" + ",".join(workers),
                              "--encoders=" + ",".join(encoders)], name)
    wait_workers_up(ports["admin_port"], len(workers), name)
    for e in encoders:
        wait_for(lambda: metric(ports["admin_port"], f'ferry_router_encoder_up{{encoder="{e}"}}'),
                 f"encoder {e} up in {name}")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['http_port']}/v1", api_key="none",
                           max_retries=0, timeout=120)
    return client, ports["admin_port"]


def chat(client, case):
    content = [{"type": "image_url", "image_url": {"url": data_url(n)}} for n in case["images"]]
    content.append({"type": "text", "text": case["text"]})
    return client.chat.completions.create(
        model="tiny", max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "user", "content": content}],
        extra_body={"return_token_ids": True})


WORKER_ADDRESS = WORKER_ADMIN = None


def setUpModule():
    global WORKER_ADDRESS, WORKER_ADMIN
    _, w = start(WORKER, WORKER_FLAGS, "worker")
    WORKER_ADDRESS, WORKER_ADMIN = f"127.0.0.1:{w['grpc_port']}", w["admin_port"]


def tearDownModule():
    stop_all()


class EpdTest(unittest.TestCase):
    def assert_transformers(self, completion, case):
        choice = completion.choices[0]
        self.assertEqual(choice.model_extra["prompt_token_ids"], case["ids"])
        tokens = choice.model_extra["token_ids"]
        if choice.finish_reason == "length":
            self.assertEqual(tokens, case["tokens"])
        else:  # the model ended its answer: transformers' tokens up to there
            self.assertEqual(tokens, case["tokens"][:len(tokens)])

    def test_1_through_an_encoder_then_its_cache(self):
        _, encoder, encoder_admin = start_encoder("encoder_one")
        client, admin = start_router([WORKER_ADDRESS], [encoder], "router_one")
        fetched = metric(WORKER_ADMIN, FETCHED)
        seen, sent = set(), 0
        for i, case in enumerate(CASES):
            with self.subTest(case=i):
                self.assert_transformers(chat(client, case), case)
                seen.update(case["images"])
                sent += len(case["images"])
                # Each image encoded once; one sent before is a hit.
                self.assertEqual(metric(encoder_admin, ENCODED), len(seen))
                self.assertEqual(metric(encoder_admin, HITS), sent - len(seen))
        self.assertEqual(metric(admin, encodes("ok")), len(seen))
        self.assertEqual(metric(admin, encodes("cached")), sent - len(seen))
        # The worker fetched every image's rows by handle.
        self.assertEqual(metric(WORKER_ADMIN, FETCHED), fetched + sent)
        # Anthropic's Messages API (base64 image blocks): the same text; its image is a hit.
        case = CASES[0]
        text = chat(client, case).choices[0].message.content
        hits = metric(encoder_admin, HITS)
        m = anthropic.Anthropic(base_url=str(client.base_url).rsplit("/v1", 1)[0], api_key="none",
                                max_retries=0).messages.create(
            model="tiny", max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": MEDIA[n.rsplit(".", 1)[1]],
                                             "data": data_url(n).split(",", 1)[1]}}
                for n in case["images"]] + [{"type": "text", "text": case["text"]}]}])
        self.assertEqual("".join(b.text for b in m.content if b.type == "text"), text)
        self.assertEqual(metric(encoder_admin, HITS), hits + len(case["images"]))
        sent += 2 * len(case["images"])
        # The same request again: its image is a hit.
        self.assert_transformers(chat(client, CASES[0]), CASES[0])
        self.assertEqual(metric(encoder_admin, ENCODED), len(seen))
        self.assertEqual(metric(encoder_admin, HITS), sent - len(seen) + len(CASES[0]["images"]))
        self.assertEqual(metric(WORKER_ADMIN, FETCHED), fetched + sent + len(CASES[0]["images"]))

    def test_2_a_killed_encoder_s_images_go_inline(self):
        process, encoder, _ = start_encoder("encoder_killed")
        client, admin = start_router([WORKER_ADDRESS], [encoder], "router_killed")
        self.assert_transformers(chat(client, CASES[0]), CASES[0])
        process.kill()
        process.wait()
        # At once (the router may not have seen it go), and once the router saw it down.
        fetched = metric(WORKER_ADMIN, FETCHED)
        for i, case in enumerate(CASES):
            with self.subTest(case=i, seen_down=False):
                self.assert_transformers(chat(client, case), case)
        up = f'ferry_router_encoder_up{{encoder="{encoder}"}}'
        wait_for(lambda: metric(admin, up) == 0, "the encoder seen down")
        for i, case in enumerate(CASES):
            with self.subTest(case=i, seen_down=True):
                self.assert_transformers(chat(client, case), case)
        images = 2 * sum(len(c["images"]) for c in CASES)
        self.assertEqual(metric(admin, encodes("fallback")), images)
        # The worker encoded them all itself (no fetch).
        self.assertEqual(metric(WORKER_ADMIN, FETCHED), fetched)

    def test_3_two_encoders_one_killed(self):
        encoders = [start_encoder(f"encoder_pair{i}") for i in range(2)]
        client, admin = start_router([WORKER_ADDRESS], [e[1] for e in encoders], "router_pair")
        case = dict(CASES[0], images=CASES[0]["images"][:1])
        self.assert_transformers(chat(client, CASES[0]), CASES[0])
        holders = [i for i, e in enumerate(encoders) if metric(e[2], ENCODED) > 0]
        self.assertEqual(len(holders), 1)
        held, other = holders[0], 1 - holders[0]
        # The same image goes to the same encoder (its cache).
        self.assert_transformers(chat(client, case), case)
        self.assertEqual(metric(encoders[held][2], HITS), 1)
        self.assertEqual(metric(encoders[other][2], ENCODED), 0)
        encoders[held][0].kill()
        encoders[held][0].wait()
        fetched = metric(WORKER_ADMIN, FETCHED)
        self.assert_transformers(chat(client, case), case)
        self.assertEqual(metric(encoders[other][2], ENCODED), 1)
        self.assertEqual(metric(admin, encodes("fallback")), 0)
        self.assertEqual(metric(WORKER_ADMIN, FETCHED), fetched + 1)
        # Failed over at once, or sent to the other one once the router saw it down.
        self.assertEqual(metric(admin, encodes("ok")) + metric(admin, encodes("failover")), 2)

    def test_4_prefill_and_decode_workers(self):
        _, encoder, encoder_admin = start_encoder("encoder_pd")
        pd = ["--transport=grpc"]
        _, p = start(WORKER, WORKER_FLAGS + ["--role=prefill"] + pd, "prefill")
        _, d = start(WORKER, WORKER_FLAGS + ["--role=decode"] + pd, "decode")
        client, admin = start_router([f"127.0.0.1:{p['grpc_port']}",
                                      f"127.0.0.1:{d['grpc_port']}"], [encoder], "router_pd")
        for i, case in enumerate(CASES):
            with self.subTest(case=i):
                self.assert_transformers(chat(client, case), case)
        self.assertEqual(metric(encoder_admin, ENCODED), len({n for c in CASES for n in c["images"]}))
        self.assertEqual(metric(admin, encodes("fallback")), 0)
        # Both workers fetched every image by handle.
        sent = sum(len(c["images"]) for c in CASES)
        for ports in (p, d):
            self.assertEqual(metric(ports["admin_port"], FETCHED), sent)
        self.assertEqual(metric(admin, "ferry_router_images_inlined_on_retry_total"), 0)

    def test_5_a_gone_handle_is_retried_inline(self):
        # Every handle has expired by the time the worker fetches it.
        _, encoder, encoder_admin = start_encoder("encoder_ttl", ["--embeddings_ttl=1ns"])
        client, admin = start_router([WORKER_ADDRESS], [encoder], "router_ttl")
        fetched, gone = metric(WORKER_ADMIN, FETCHED), metric(WORKER_ADMIN, GONE)
        self.assert_transformers(chat(client, CASES[0]), CASES[0])
        self.assertEqual(metric(admin, encodes("ok")), len(CASES[0]["images"]))
        self.assertEqual(metric(admin, "ferry_router_retries_total"), 1)
        self.assertEqual(metric(admin, "ferry_router_images_inlined_on_retry_total"),
                         len(CASES[0]["images"]))
        self.assertEqual(metric(WORKER_ADMIN, GONE), gone + 1)
        self.assertEqual(metric(WORKER_ADMIN, FETCHED), fetched)

    def test_5b_an_encoder_of_another_precision_is_retried_inline(self):
        # bf16 rows: not the f32 workers' tower (another vision_digest), which refuse them.
        _, encoder, _ = start_encoder("encoder_bf16", ["--weights=bf16"])
        client, admin = start_router([WORKER_ADDRESS], [encoder], "router_bf16")
        retries = metric(admin, "ferry_router_retries_total")
        self.assert_transformers(chat(client, CASES[0]), CASES[0])
        self.assertEqual(metric(admin, "ferry_router_retries_total"), retries + 1)
        self.assertEqual(metric(admin, "ferry_router_images_inlined_on_retry_total"),
                         len(CASES[0]["images"]))

    def test_6_a_migrated_request_sends_its_image_inline(self):
        _, encoder, _ = start_encoder("encoder_migration")
        flags = WORKER_FLAGS + ["--test_step_delay=20ms"]
        workers = [start(WORKER, flags, f"paced{i}") for i in range(2)]
        addresses = {f"127.0.0.1:{ports['grpc_port']}": p for p, ports in workers}
        client, admin = start_router(list(addresses), [encoder], "router_migration")
        case = CASES[0]
        ids, killed = [], []
        stream = client.chat.completions.create(
            model="tiny", max_tokens=MAX_TOKENS, temperature=0, stream=True,
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(n)}} for n in case["images"]]
                + [{"type": "text", "text": case["text"]}]}],
            extra_body={"return_token_ids": True, "ignore_eos": True})
        for chunk in stream:
            if not chunk.choices:
                continue
            ids.extend(chunk.choices[0].model_extra.get("token_ids") or [])
            if not killed and len(ids) >= 2:
                _, body = get(f"http://127.0.0.1:{admin}/workers")
                busy = [w["address"] for w in json.loads(body) if w.get("inflight", 0) > 0]
                self.assertEqual(len(busy), 1, body)
                addresses[busy[0]].kill()
                killed.append(busy[0])
        self.assertTrue(killed)
        self.assertEqual(ids, case["tokens"])
        self.assertEqual(metric(admin, encodes("ok")), len(case["images"]))
        _, page = get(f"http://127.0.0.1:{admin}/metrics")
        moved = sum(float(line.split()[-1]) for line in page.splitlines()
                    if line.startswith("ferry_router_migrations_total{"))
        self.assertEqual(moved, 1, page)
        # The attempt on the other worker carried the image's bytes, not the first handle.
        self.assertEqual(metric(admin, "ferry_router_images_inlined_on_retry_total"),
                         len(case["images"]))

    def test_7_encoders_by_dns(self):
        # Encoders of one pool share a port and differ by address, as pods do; dnsmasq answers
        # the pool's name from a hosts file the test rewrites.
        port = free_port(["127.0.0.2", "127.0.0.3"])
        encoders = {}
        for host in ("127.0.0.2", "127.0.0.3"):
            _, _, admin_port = start_encoder(f"encoder_dns_{host}", [f"--address={host}:{port}"])
            encoders[f"{host}:{port}"] = admin_port
        dns = Dnsmasq()
        try:
            dns.serve(["127.0.0.2 encoders.ferry.test"], "encoders.ferry.test", ["127.0.0.2"])
            _, r = start(ROUTER, [f"--model={MODEL}", "--served_model_name=tiny",
                                  f"--workers={WORKER_ADDRESS}",
                                  f"--encoders_dns=encoders.ferry.test:{port}",
                                  f"--dns_servers=127.0.0.1:{dns.port}", "--dns_interval=200ms"],
                         "router_dns")
            admin = r["admin_port"]
            wait_workers_up(admin, 1, "router_dns")
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{r['http_port']}/v1",
                                   api_key="none", max_retries=0, timeout=120)

            def up(endpoint):
                return metric(admin, f'ferry_router_encoder_up{{encoder="{endpoint}"}}') == 1

            first, second = sorted(encoders)
            wait_for(lambda: up(first), "the first encoder found and up")
            self.assert_transformers(chat(client, CASES[0]), CASES[0])
            self.assertEqual(metric(encoders[first], ENCODED), 1)
            # The name moves to the second encoder: the first leaves, the second takes the image.
            dns.serve(["127.0.0.3 encoders.ferry.test"], "encoders.ferry.test", ["127.0.0.3"])
            wait_for(lambda: up(second) and not up(first), "the pool following the DNS")
            self.assert_transformers(chat(client, CASES[0]), CASES[0])
            self.assertEqual(metric(encoders[second], ENCODED), 1)
            self.assertEqual(metric(admin, encodes("fallback")), 0)
        finally:
            dns.stop()


def free_port(hosts):
    """A TCP port free on every one of `hosts` now."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port")


class Dnsmasq:
    """dnsmasq in the foreground on 127.0.0.1, authoritative for ferry.test, answering from a
    hosts file with TTL 0 and no cache (as dns_discovery_test's)."""

    def __init__(self):
        self.hosts = os.path.join(TMP, "dns.hosts")
        self.proc = None  # (a SIGHUP before dnsmasq set its handler would end it)
        self.write(["127.0.0.99 ready.ferry.test"])
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", self.port))
                break
            except OSError:
                continue
        with open(os.path.join(TMP, "dnsmasq.log"), "w") as log:
            self.proc = subprocess.Popen(
                ["/usr/sbin/dnsmasq", "--keep-in-foreground", "--no-daemon",
                 "--conf-file=/dev/null", "--pid-file=", "--listen-address=127.0.0.1",
                 "--bind-interfaces", f"--port={self.port}", "--no-resolv", "--no-hosts",
                 "--local=/ferry.test/", f"--addn-hosts={self.hosts}", "--local-ttl=0",
                 "--cache-size=0", "--no-negcache",
                 "--user=root" if os.getuid() == 0 else "--user="],
                stdout=log, stderr=log)
        wait_for(lambda: self.lookup("ready.ferry.test") == ["127.0.0.99"], "dnsmasq answering")

    def write(self, lines):
        tmp = self.hosts + ".next"
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(tmp, self.hosts)
        if self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)

    def lookup(self, name):
        """The A records dnsmasq gives for `name` now (sorted); [] while it does not answer."""
        import random
        import struct
        q = struct.pack(">HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
        q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
        q += struct.pack(">HH", 1, 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1)
            try:
                s.sendto(q, ("127.0.0.1", self.port))
                r = s.recv(4096)
            except OSError:
                return []
        found, i = [], len(q)
        for _ in range(struct.unpack(">H", r[6:8])[0]):
            i += 2 if r[i] & 0xC0 == 0xC0 else r.index(b"\0", i) + 1 - i
            typ, _, _, rdlen = struct.unpack(">HHIH", r[i:i + 10])
            i += 10
            if typ == 1:
                found.append(socket.inet_ntoa(r[i:i + rdlen]))
            i += rdlen
        return sorted(found)

    def serve(self, lines, name, want):
        """Serves `lines` and waits until dnsmasq answers `name` with `want`."""
        self.write(lines)
        wait_for(lambda: self.lookup(name) == sorted(want), f"dnsmasq serving {name}: {want}")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
