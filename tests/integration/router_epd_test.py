#!/usr/bin/env python3
"""The router half of E/P/D, on a real stack on loopback driven by the official openai SDK: a
router on the tiny VLM (make_tiny_vlm) with --encoders, ferry-encoder processes and ferry-worker
processes (aggregated, or a prefill and a decode worker), all at --weights=f32 (--kv_dtype=f32 for
the workers).

  router_epd_test.py FERRY_ROUTER FERRY_WORKER FERRY_ENCODER MODEL REFERENCE_JSON

REFERENCE_JSON is router_vlm_reference.py's (transformers' LlavaProcessor and
LlavaForConditionalGeneration): per case, the prompt's input_ids and the greedy tokens.

Checks: through an encoder, each case's prompt and greedy tokens are transformers' (aggregated, and
prefill + decode workers); the encoder encoded the images and the worker did not (the request named
them by handle); the same image again is a hit in the encoder's cache (the router's "cached").
An encoder SIGKILLed: requests complete with the same tokens, their images inline (the router's
"fallback", the worker encodes them). Two encoders: the one holding an image killed, the image
goes to the other. A worker SIGKILLed mid-stream: the request migrates with its image inline and
ends with transformers' tokens. Handles that are gone when the worker fetches them (an encoder with a 1 ns TTL):
the worker fails the attempt UNAVAILABLE and the router's retry sends the image inline; the
tokens are the same. Every process started is killed at the end (PR_SET_PDEATHSIG).
"""
import base64
import json
import os
import sys
import unittest

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import get, metric, start, stop_all, wait_for, wait_workers_up  # noqa: E402

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


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
