#!/usr/bin/env python3
"""The router half of E/P/D, on a real stack on loopback driven by the official openai SDK: a
router on the tiny VLM (make_tiny_vlm) with --encoders, ferry-encoder processes and ferry-worker
processes (aggregated, or a prefill and a decode worker), all at --weights=f32 (--kv_dtype=f32 for
the workers).

  router_epd_test.py FERRY_ROUTER FERRY_WORKER FERRY_ENCODER MODEL REFERENCE_JSON FERRY_KVSTORE

REFERENCE_JSON is router_vlm_reference.py's (transformers' LlavaProcessor and
LlavaForConditionalGeneration): per case, the prompt's input_ids and the greedy tokens; its
"extra" cases are one image each, all distinct (several requests in flight at once).

Checks: through an encoder, each case's prompt and greedy tokens are transformers' (aggregated, and
prefill + decode workers), and Anthropic's Messages API gives the same text; the encoder encoded the images and the worker did not (the request named
them by handle); the same image again is a hit in the encoder's cache (the router's "cached").
An encoder SIGKILLed: requests complete with the same tokens, their images inline (the router's
"fallback", the worker encodes them). Two encoders: the one holding an image killed, the image
goes to the other. A worker SIGKILLed mid-stream: the request migrates with its image inline and
ends with transformers' tokens. Encoders by DNS (--encoders_dns, dnsmasq): the name moving to
another encoder moves the images. Handles that are gone when the worker fetches them (an encoder with a 1 ns TTL):
the worker fails the attempt UNAVAILABLE and the router's retry sends the image inline; the
tokens are the same.

Faults (FaultTest). An encoder SIGKILLed while several requests' images are being encoded (held by
--encode_hold_file until the encoder's gauges show them all there): every request completes with
transformers' tokens, its image inline (one encoder) or re-encoded on the other encoder (two, in
front of prefill and decode workers). An encoder SIGKILLed mid-FetchEmbeddings (--fetch_hold_file:
the stream waits after its first chunk), with an aggregated worker and with prefill + decode
workers: the worker fails the attempt UNAVAILABLE, the router retries with the images inline, the
tokens are the same. E/P/D with the KV store (ferry-kvstore): a request through one router's
prefill and decode workers, then the same request through a second router's cold ones: the image
is a hit in the encoder's cache, the prefix comes from the store (cached_tokens; the prefill
worker's store reads), the tokens are transformers'; both with the openai and the anthropic SDK.
Every process started is killed at the end (PR_SET_PDEATHSIG).
"""
import base64
import concurrent.futures
import json
import os
import sys
import unittest

import anthropic
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import (TMP, get, metric, start, stop_all, wait_for,  # noqa: E402
                            wait_index_synced, wait_workers_up)
from dnsmasq import Dnsmasq, free_port  # noqa: E402

ROUTER, WORKER, ENCODER, MODEL, REFERENCE, KVSTORE = sys.argv[1:7]
with open(REFERENCE) as f:
    _REFERENCE = json.load(f)
    CASES, EXTRA = _REFERENCE["cases"], _REFERENCE["extra"]
IMAGES = os.path.dirname(REFERENCE)
MAX_TOKENS = len(CASES[0]["tokens"])
MEDIA = {"png": "image/png", "jpg": "image/jpeg"}
WORKER_FLAGS = [f"--model={MODEL}", "--weights=f32", "--kv_dtype=f32", "--block_tokens=16",
                "--threads=1", "--kv_pool_bytes=8MiB"]
# Workers that keep no prefix: a request sent again computes its prompt, so its images go to the
# encoders again (a worker that keeps it gets them as expect_cached: test_4's end).
NO_PREFIX = ["--prefix_cache_bytes=0"]

ENCODED = "ferry_encoder_images_encoded_total"
HITS = 'ferry_encoder_cache_lookups_total{result="hit"}'
FETCHED = 'ferry_worker_image_fetches_total{outcome="fetched"}'
GONE = 'ferry_worker_image_fetches_total{outcome="unavailable"}'
IN_FLIGHT = ("ferry_encoder_encoding", "ferry_encoder_queue_depth")
FETCH_BYTES = "ferry_encoder_fetch_bytes_total"
STORE_WRITTEN = 'ferry_worker_store_write_blocks_total{outcome="written"}'
STORE_LOADED = 'ferry_worker_store_read_blocks_total{outcome="loaded"}'


def encodes(result):
    return f'ferry_router_encodes_total{{result="{result}"}}'


def data_url(name):
    with open(os.path.join(IMAGES, name), "rb") as f:
        data = base64.b64encode(f.read()).decode()
    return f"data:{MEDIA[name.rsplit('.', 1)[1]]};base64,{data}"


def start_encoder(name, extra=()):
    p, ports = start(ENCODER, [f"--model={MODEL}", "--weights=f32"] + list(extra), name)
    return p, f"127.0.0.1:{ports['grpc_port']}", ports["admin_port"]


def in_flight(admin_port):
    """Images an encoder is encoding or has queued now (its gauges)."""
    return sum(metric(admin_port, gauge) for gauge in IN_FLIGHT)


def hold_file(name):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write("hold")
    return path


def synced(admin):
    """Waits until the router's KV index caught up with the shared worker (WORKER_ADDRESS). That
    worker keeps no prefix, but a request's blocks are in the index from their STORED event to
    their EVICTED one: a request sent in between with the same images is predicted cached
    (expect_cached, "skipped"), refused by the worker and resent with its image bytes, neither
    encoded nor counted as a fallback. Checks that count encodes send after this."""
    wait_index_synced(admin, WORKER_ADMIN, WORKER_ADDRESS)


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
    _, w = start(WORKER, WORKER_FLAGS + NO_PREFIX, "worker")
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
                synced(admin)
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
        synced(admin)
        text = chat(client, case).choices[0].message.content
        hits = metric(encoder_admin, HITS)
        synced(admin)
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
        synced(admin)
        self.assert_transformers(chat(client, CASES[0]), CASES[0])
        self.assertEqual(metric(encoder_admin, ENCODED), len(seen))
        self.assertEqual(metric(encoder_admin, HITS), sent - len(seen) + len(CASES[0]["images"]))
        self.assertEqual(metric(WORKER_ADMIN, FETCHED), fetched + sent + len(CASES[0]["images"]))

    def test_2_a_killed_encoder_s_images_go_inline(self):
        process, encoder, _ = start_encoder("encoder_killed")
        client, admin = start_router([WORKER_ADDRESS], [encoder], "router_killed")
        self.assert_transformers(chat(client, CASES[0]), CASES[0])
        synced(admin)
        process.kill()
        process.wait()
        # At once (the router may not have seen it go), and once the router saw it down.
        fetched = metric(WORKER_ADMIN, FETCHED)
        for i, case in enumerate(CASES):
            with self.subTest(case=i, seen_down=False):
                self.assert_transformers(chat(client, case), case)
                synced(admin)
        up = f'ferry_router_encoder_up{{encoder="{encoder}"}}'
        wait_for(lambda: metric(admin, up) == 0, "the encoder seen down")
        for i, case in enumerate(CASES):
            with self.subTest(case=i, seen_down=True):
                self.assert_transformers(chat(client, case), case)
                synced(admin)
        images = 2 * sum(len(c["images"]) for c in CASES)
        self.assertEqual(metric(admin, encodes("fallback")), images)
        # The worker encoded them all itself (no fetch).
        self.assertEqual(metric(WORKER_ADMIN, FETCHED), fetched)

    def test_3_two_encoders_one_killed(self):
        encoders = [start_encoder(f"encoder_pair{i}") for i in range(2)]
        client, admin = start_router([WORKER_ADDRESS], [e[1] for e in encoders], "router_pair")
        case = dict(CASES[0], images=CASES[0]["images"][:1])
        self.assert_transformers(chat(client, CASES[0]), CASES[0])
        synced(admin)
        holders = [i for i, e in enumerate(encoders) if metric(e[2], ENCODED) > 0]
        self.assertEqual(len(holders), 1)
        held, other = holders[0], 1 - holders[0]
        # The same image goes to the same encoder (its cache).
        self.assert_transformers(chat(client, case), case)
        synced(admin)
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
        # The same requests again: the prefill worker holds their prompts, images included, so
        # the router neither encodes nor sends the images (expect_cached); the same tokens (once
        # the router's KV index holds what the prefill worker caches).
        self.assertGreater(wait_index_synced(admin, p["admin_port"], f"127.0.0.1:{p['grpc_port']}"),
                           0)
        encoded = metric(encoder_admin, ENCODED) + metric(encoder_admin, HITS)
        for i, case in enumerate(CASES):
            with self.subTest(case=i, again=True):
                skipped = metric(admin, encodes("skipped"))
                self.assert_transformers(chat(client, case), case)
                self.assertEqual(metric(admin, encodes("skipped")), skipped + len(case["images"]))
        self.assertEqual(metric(encoder_admin, ENCODED) + metric(encoder_admin, HITS), encoded)
        for ports in (p, d):
            self.assertEqual(metric(ports["admin_port"], FETCHED), sent)
        self.assertEqual(metric(admin, "ferry_router_retries_total"), 0)

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
        flags = WORKER_FLAGS + NO_PREFIX + ["--test_step_delay=20ms"]
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
            synced(admin)
            # The name moves to the second encoder: the first leaves, the second takes the image.
            dns.serve(["127.0.0.3 encoders.ferry.test"], "encoders.ferry.test", ["127.0.0.3"])
            wait_for(lambda: up(second) and not up(first), "the pool following the DNS")
            self.assert_transformers(chat(client, CASES[0]), CASES[0])
            self.assertEqual(metric(encoders[second], ENCODED), 1)
            self.assertEqual(metric(admin, encodes("fallback")), 0)
        finally:
            dns.stop()


PD_WORKERS = []


def pd_workers():
    """A prefill and a decode worker (started once), their admin ports by address."""
    if not PD_WORKERS:
        for role in ("prefill", "decode"):
            _, ports = start(WORKER, WORKER_FLAGS + NO_PREFIX + [f"--role={role}",
                                                                 "--transport=grpc"],
                             f"{role}_faults")
            PD_WORKERS.append((f"127.0.0.1:{ports['grpc_port']}", ports["admin_port"]))
    return dict(PD_WORKERS)


class FaultTest(unittest.TestCase):
    """Encoders SIGKILLed while requests' images are at them, and E/P/D with the KV store."""

    assert_transformers = EpdTest.assert_transformers

    def chat_all_while(self, client, cases, ready, act):
        """Sends `cases` at once (a thread each); once `ready()` holds, calls `act()`; then checks
        every answer is transformers'."""
        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            futures = [pool.submit(chat, client, case) for case in cases]
            try:
                wait_for(ready, "the requests' images at the encoders")
            finally:
                act()
            for i, (future, case) in enumerate(zip(futures, cases)):
                with self.subTest(case=i):
                    self.assert_transformers(future.result(), case)

    def test_8_an_encoder_killed_while_encoding(self):
        hold = hold_file("encode_hold_one")
        process, encoder, encoder_admin = start_encoder(
            "encoder_held", [f"--encode_hold_file={hold}"])
        client, admin = start_router([WORKER_ADDRESS], [encoder], "router_held")
        fetched = metric(WORKER_ADMIN, FETCHED)

        def kill():
            process.kill()
            process.wait()
            os.remove(hold)

        # Every image at the encoder (one encoding, held; the others queued behind it), then the
        # encoder killed: each image goes inline, the worker encodes it.
        self.chat_all_while(client, EXTRA, lambda: in_flight(encoder_admin) == len(EXTRA), kill)
        self.assertEqual(metric(admin, encodes("fallback")), len(EXTRA))
        self.assertEqual(metric(WORKER_ADMIN, FETCHED), fetched)

    def test_8b_one_of_two_encoders_killed_while_encoding(self):
        hold = hold_file("encode_hold_two")
        encoders = [start_encoder(f"encoder_held{i}", [f"--encode_hold_file={hold}"])
                    for i in range(2)]
        # Prefill and decode workers: both fetch each image from the encoder that encoded it.
        workers = pd_workers()
        client, admin = start_router(list(workers), [e[1] for e in encoders], "router_held2")
        fetched = {a: metric(w, FETCHED) for a, w in workers.items()}
        killed = []

        def kill():
            # The one holding more of the images (all of them, maybe).
            k = max(range(2), key=lambda i: in_flight(encoders[i][2]))
            killed.append((k, in_flight(encoders[k][2])))
            encoders[k][0].kill()
            encoders[k][0].wait()
            os.remove(hold)

        self.chat_all_while(
            client, EXTRA, lambda: sum(in_flight(e[2]) for e in encoders) == len(EXTRA), kill)
        (k, moved), = killed
        self.assertGreater(moved, 0)
        # The killed one's images re-encoded on the other: no image went inline.
        self.assertEqual(metric(encoders[1 - k][2], ENCODED), len(EXTRA))
        self.assertEqual(metric(admin, encodes("failover")), moved)
        self.assertEqual(metric(admin, encodes("ok")), len(EXTRA) - moved)
        self.assertEqual(metric(admin, encodes("fallback")), 0)
        for a, w in workers.items():
            self.assertEqual(metric(w, FETCHED), fetched[a] + len(EXTRA))

    def test_9_an_encoder_killed_while_its_embeddings_are_fetched(self):
        hold = hold_file("fetch_hold")
        # 1 KiB chunks: the tiny model's 16 x 64 floats are 4 of them; the stream waits after one.
        process, encoder, encoder_admin = start_encoder(
            "encoder_fetch_held", [f"--fetch_hold_file={hold}", "--max_chunk_bytes=1KiB"])
        client, admin = start_router([WORKER_ADDRESS], [encoder], "router_fetch_held")
        gone, retries = metric(WORKER_ADMIN, GONE), metric(admin, "ferry_router_retries_total")

        def kill():
            process.kill()
            process.wait()
            os.remove(hold)

        # The Encode answered (a handle), the worker fetching: the first chunk sent, the rest held.
        self.chat_all_while(client, EXTRA[:1],
                            lambda: metric(encoder_admin, FETCH_BYTES) >= 1024, kill)
        self.assertEqual(metric(admin, encodes("ok")), 1)
        self.assertEqual(metric(WORKER_ADMIN, GONE), gone + 1)
        self.assertEqual(metric(admin, "ferry_router_retries_total"), retries + 1)
        self.assertEqual(metric(admin, "ferry_router_images_inlined_on_retry_total"), 1)

    def test_9b_killed_while_prefill_and_decode_workers_fetch(self):
        hold = hold_file("fetch_hold_pd")
        process, encoder, encoder_admin = start_encoder(
            "encoder_fetch_held_pd", [f"--fetch_hold_file={hold}", "--max_chunk_bytes=1KiB"])
        workers = pd_workers()
        gone = sum(metric(w, GONE) for w in workers.values())
        client, admin = start_router(list(workers), [encoder], "router_fetch_pd")

        def kill():
            process.kill()
            process.wait()
            os.remove(hold)

        # A worker (the decode worker, which takes the request first, and maybe the prefill
        # worker too) fetching the first image's rows when the encoder dies: the request is
        # retried with its images inline, and both workers take them so.
        self.chat_all_while(client, CASES[1:2],
                            lambda: metric(encoder_admin, FETCH_BYTES) >= 1024, kill)
        self.assertGreaterEqual(sum(metric(w, GONE) for w in workers.values()), gone + 1)
        self.assertEqual(metric(admin, "ferry_router_retries_total"), 1)
        self.assertEqual(metric(admin, "ferry_router_images_inlined_on_retry_total"),
                         len(CASES[1]["images"]))

    def test_10_epd_with_the_prefix_in_the_kv_store(self):
        _, s = start(KVSTORE, [f"--dir={os.path.join(TMP, 'store')}", "--segment_bytes=4MiB",
                               "--capacity=256MiB", "--max_object_bytes=1MiB",
                               "--rpc_grace_ms=2000"], "kvstore")
        kv = ["--transport=grpc", f"--kvstore=127.0.0.1:{s['grpc_port']}",
              "--kvstore_deadline=30s"]
        _, encoder, encoder_admin = start_encoder("encoder_store")
        prefills = [start(WORKER, WORKER_FLAGS + ["--role=prefill"] + kv, f"prefill_store{i}")[1]
                    for i in range(2)]
        decodes = [start(WORKER, WORKER_FLAGS + ["--role=decode"] + kv, f"decode_store{i}")[1]
                   for i in range(2)]
        # Two routers on the same encoder, each with its own prefill and decode workers: the
        # second router's workers have never seen the prompt (its prefill worker reads the prefix
        # from the store and pushes it all to its decode worker).
        routers = [start_router([f"127.0.0.1:{p['grpc_port']}", f"127.0.0.1:{d['grpc_port']}"],
                                [encoder], f"router_store{i}")
                   for i, (p, d) in enumerate(zip(prefills, decodes))]
        messages = [anthropic.Anthropic(base_url=str(c.base_url).rsplit("/v1", 1)[0],
                                        api_key="none", max_retries=0, timeout=120).messages
                    for c, _ in routers]
        written = prefills[0]["admin_port"]
        loaded = prefills[1]["admin_port"]

        def anthropic_text(i, case):
            m = messages[i].create(
                model="tiny", max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
                messages=[{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64",
                                                 "media_type": MEDIA[n.rsplit(".", 1)[1]],
                                                 "data": data_url(n).split(",", 1)[1]}}
                    for n in case["images"]] + [{"type": "text", "text": case["text"]}]}])
            return "".join(b.text for b in m.content if b.type == "text"), m.usage

        # The openai SDK: the first prefill worker computes the prompt and writes its full blocks.
        case = CASES[0]
        n = len(case["ids"])
        first = chat(routers[0][0], case)
        self.assert_transformers(first, case)
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens, 0)
        wait_for(lambda: metric(written, STORE_WRITTEN) >= n // 16, "the prompt's blocks stored")
        hits = metric(encoder_admin, HITS)
        # The same request through the other prefill worker: the image is a hit in the encoder's
        # cache, the prefix (the image's span included) comes from the store.
        second = chat(routers[1][0], case)
        self.assert_transformers(second, case)
        self.assertEqual(second.usage.prompt_tokens_details.cached_tokens, (n - 1) // 16 * 16)
        self.assertEqual(metric(loaded, STORE_LOADED), (n - 1) // 16)
        self.assertEqual(metric(encoder_admin, HITS), hits + len(case["images"]))
        self.assertEqual(second.choices[0].message.content, first.choices[0].message.content)

        # The anthropic SDK, on the two-image case: the same way.
        case = CASES[1]
        n = len(case["ids"])
        stored = metric(written, STORE_WRITTEN)
        text, usage = anthropic_text(0, case)
        # (Its first blocks, the template and the first image, are the first case's.)
        shared = usage.cache_read_input_tokens or 0
        wait_for(lambda: metric(written, STORE_WRITTEN) >= stored + n // 16 - shared // 16,
                 "the second prompt's blocks stored")
        hits, read = metric(encoder_admin, HITS), metric(loaded, STORE_LOADED)
        again, usage = anthropic_text(1, case)
        self.assertEqual(again, text)
        self.assertEqual(usage.cache_read_input_tokens, (n - 1) // 16 * 16)
        self.assertEqual(usage.input_tokens + usage.cache_read_input_tokens, n)
        # The blocks past the shared ones came from the store.
        self.assertEqual(metric(loaded, STORE_LOADED), read + (n - 1) // 16 - shared // 16)
        self.assertEqual(metric(encoder_admin, HITS), hits + len(case["images"]))
        # Anthropic's text is the one of transformers' tokens (through the openai SDK).
        c = chat(routers[1][0], case)
        self.assert_transformers(c, case)
        self.assertEqual(c.choices[0].message.content, text)
        self.assertEqual(metric(routers[0][1], encodes("fallback")) +
                         metric(routers[1][1], encodes("fallback")), 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
