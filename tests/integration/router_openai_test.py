#!/usr/bin/env python3
"""ferry-router through the official `openai` Python SDK, on a real stack on loopback.

  router_openai_test.py FERRY_ROUTER FERRY_WORKER MODEL [--smollm2 | --pd]

starts two ferry-workers on MODEL (an HF directory of a tiny test model, or with --smollm2 the
default GGUF model) and a ferry-router in front of them (round_robin, so that consecutive requests
alternate between the workers), and checks what a client sees: models, chat completions and
completions, streaming with include_usage, n = 2, logprobs, stop strings, the same seed giving the
same text, cached_tokens on repeated long prompts (exact: the full blocks the worker holds),
errors raised as the SDK's exception types with their status codes, x-request-id, and the
return_token_ids extension (streamed ids concatenate to the whole answer's, and the model's HF
tokenizer decodes them to the text and the prompt). Every response
is parsed by the SDK into its own types. Every process started is killed at the end, also when a
check fails or this script dies (PR_SET_PDEATHSIG).

With --pd: a disaggregated stack (a prefill and a decode worker over UCX tcp behind a router) next
to an aggregated one (one worker behind another router): the same requests give the same texts,
logprobs and finish reasons on both, streamed or not, and cached_tokens is exact on the
disaggregated one (the prompt blocks the prefill worker reused).
"""
import functools
import json
import os
import sys
import unittest

import openai
import tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import metric, start, stop_all, wait_metric, wait_workers_up  # noqa: E402

ROUTER, WORKER, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
SMOLLM2 = "--smollm2" in sys.argv
PD = "--pd" in sys.argv
BLOCK_TOKENS = 16


class Stack:
    def __init__(self):
        workers = []
        for i in range(2):
            flags = [f"--model={MODEL}", f"--block_tokens={BLOCK_TOKENS}", "--threads=1",
                     "--kv_pool_bytes=64MiB" if SMOLLM2 else "--kv_pool_bytes=8MiB"]
            _, ports = start(WORKER, flags, f"worker{i}")
            workers.append(f"127.0.0.1:{ports['grpc_port']}")
        self.model_id = "smollm2" if SMOLLM2 else "tiny"
        _, ports = start(ROUTER, [f"--model={MODEL}", f"--served_model_name={self.model_id}",
                                  "--workers=" + ",".join(workers), "--policy=round_robin"],
                         "router")
        self.port, self.admin = ports["http_port"], ports["admin_port"]
        wait_workers_up(self.admin, 2, "router")
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                                    max_retries=0, timeout=120)


def start_router(workers, name):
    """The router's OpenAI client, and its admin port."""
    _, ports = start(ROUTER, [f"--model={MODEL}", "--served_model_name=tiny",
                              "--workers=" + ",".join(workers)], name)
    wait_workers_up(ports["admin_port"], len(workers), name)
    return openai.OpenAI(base_url=f"http://127.0.0.1:{ports['http_port']}/v1", api_key="none",
                         max_retries=0, timeout=120), ports["admin_port"]


class PdStacks:
    """An aggregated stack and a disaggregated one on the same model."""

    def __init__(self):
        common = [f"--model={MODEL}", f"--block_tokens={BLOCK_TOKENS}", "--threads=1",
                  "--kv_pool_bytes=8MiB"]
        _, w = start(WORKER, common, "aggregated")
        _, p = start(WORKER, common + ["--role=prefill", "--transport=ucx", "--ucx_tls=tcp"],
                     "prefill")
        _, d = start(WORKER, common + ["--role=decode", "--transport=ucx", "--ucx_tls=tcp"],
                     "decode")
        self.prefill_admin, self.decode_admin = p["admin_port"], d["admin_port"]
        self.aggregated, _ = start_router([f"127.0.0.1:{w['grpc_port']}"], "router_aggregated")
        self.pd, self.pd_router_admin = start_router(
            [f"127.0.0.1:{p['grpc_port']}", f"127.0.0.1:{d['grpc_port']}"], "router_pd")


STACK = None


def setUpModule():
    global STACK
    STACK = PdStacks() if PD else Stack()


def tearDownModule():
    stop_all()


@functools.lru_cache(maxsize=None)
def hf_tokenizer():
    """The tiny model's HF tokenizer (its directory's tokenizer.json)."""
    return tokenizers.Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))


def extra(choice, field):
    """A field the SDK does not know (an extension), as the router sent it; None if absent."""
    return (choice.model_extra or {}).get(field)


def chat(**kwargs):
    args = dict(model=STACK.model_id, messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=12, temperature=0)
    args.update(kwargs)
    return STACK.client.chat.completions.create(**args)


class ChatTest(unittest.TestCase):
    def test_models(self):
        models = STACK.client.models.list()
        self.assertEqual([m.id for m in models.data], [STACK.model_id])
        self.assertEqual(STACK.client.models.retrieve(STACK.model_id).id, STACK.model_id)
        with self.assertRaises(openai.NotFoundError):
            STACK.client.models.retrieve("gpt-4o")

    def test_chat_completion_fields(self):
        r = chat()
        self.assertIsInstance(r, openai.types.chat.ChatCompletion)
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, STACK.model_id)
        self.assertTrue(r.system_fingerprint.startswith("fp_"))
        self.assertGreater(r.created, 1_600_000_000)
        self.assertEqual(len(r.choices), 1)
        c = r.choices[0]
        self.assertEqual(c.index, 0)
        self.assertEqual(c.message.role, "assistant")
        self.assertIn(c.finish_reason, ("stop", "length"))
        self.assertGreater(r.usage.prompt_tokens, 0)
        self.assertGreater(r.usage.completion_tokens, 0)
        self.assertLessEqual(r.usage.completion_tokens, 12)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertIsNotNone(r.usage.prompt_tokens_details)

    def test_the_same_seed_gives_the_same_text_and_n_choices(self):
        a = chat(temperature=0.9, seed=1234, n=2, max_tokens=16)
        b = chat(temperature=0.9, seed=1234, n=2, max_tokens=16)
        self.assertEqual(len(a.choices), 2)
        self.assertEqual([c.index for c in a.choices], [0, 1])
        self.assertEqual([c.message.content for c in a.choices],
                         [c.message.content for c in b.choices])
        # Greedy is the same whatever the seed.
        self.assertEqual(chat(seed=1).choices[0].message.content,
                         chat(seed=2).choices[0].message.content)

    def test_logprobs(self):
        r = chat(logprobs=True, top_logprobs=2, max_tokens=6)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for entry in content:
            self.assertLessEqual(entry.logprob, 0.0)
            self.assertEqual(len(entry.top_logprobs), 2)
            self.assertIsInstance(entry.bytes, list)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(entry.top_logprobs[0].logprob, entry.logprob, places=4)

    def test_stop_string(self):
        text = chat(max_tokens=16, extra_body={"ignore_eos": True}).choices[0].message.content
        self.assertGreater(len(text), 4, text)
        stop = text[len(text) // 2]
        r = chat(max_tokens=16, stop=[stop], extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].message.content, text[:text.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_streaming_with_usage_equals_the_whole_answer(self):
        whole = chat(max_tokens=10)
        chunks = list(chat(max_tokens=10, stream=True, stream_options={"include_usage": True}))
        self.assertTrue(all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in chunks))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and
                    c.choices[0].finish_reason]
        self.assertEqual(finishes, [whole.choices[0].finish_reason])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        self.assertTrue(all(c.usage is None for c in chunks[:-1]))
        self.assertEqual(len({c.id for c in chunks}), 1)

    def test_cached_tokens_are_the_reused_prompt_blocks(self):
        long = " ".join(["The barge carries grain down the river to the sea."] * 4)
        messages = [{"role": "system", "content": long},
                    {"role": "user", "content": "Where does the barge go?"}]
        # round_robin over two workers: the third and fourth land where the first and second did.
        results = [chat(messages=messages, max_tokens=4) for _ in range(4)]
        prompt = results[0].usage.prompt_tokens
        self.assertGreater(prompt, 3 * BLOCK_TOKENS)
        full_blocks = (prompt - 1) // BLOCK_TOKENS * BLOCK_TOKENS
        for r in results[2:]:
            self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, full_blocks)
        self.assertEqual(results[2].choices[0].message.content,
                         results[0].choices[0].message.content)

    def test_errors_are_the_sdks_exceptions(self):
        with self.assertRaises(openai.NotFoundError) as e:
            chat(model="gpt-4o")
        self.assertEqual(e.exception.status_code, 404)
        self.assertEqual(e.exception.code, "model_not_found")
        for kwargs, param in [(dict(temperature=5), "temperature"),
                              (dict(n=1000), "n"),
                              (dict(max_tokens=10_000_000), "max_tokens"),
                              (dict(messages=[]), "messages"),
                              (dict(tools=[{"type": "function", "function": {"name": "f"}}],
                                    tool_choice={"type": "function", "function": {"name": "g"}}),
                               "tool_choice"),
                              (dict(extra_body={"temprature": 0.1}), "temprature"),
                              (dict(extra_body={"return_token_ids": "yes"}),
                               "return_token_ids")]:
            with self.assertRaises(openai.BadRequestError, msg=str(kwargs)) as e:
                chat(**kwargs)
            self.assertEqual(e.exception.status_code, 400)
            self.assertEqual(e.exception.param, param, e.exception.message)
        with self.assertRaises(openai.BadRequestError) as e:
            chat(max_tokens=10_000_000)
        self.assertEqual(e.exception.code, "context_length_exceeded")

    def whole_and_streamed_ids(self, **kwargs):
        """A greedy chat answer with return_token_ids, and the same streamed: the first choice of
        the whole answer, its token ids, and the streamed chunks' (which must concatenate)."""
        whole = chat(extra_body={"return_token_ids": True}, **kwargs)
        choice = whole.choices[0]
        ids = extra(choice, "token_ids")
        self.assertEqual(len(ids), whole.usage.completion_tokens)
        self.assertEqual(len(extra(choice, "prompt_token_ids")), whole.usage.prompt_tokens)
        chunks = [c for c in chat(stream=True, extra_body={"return_token_ids": True}, **kwargs)
                  if c.choices]
        # Every chunk of the choice has its ids; only the first has the prompt's.
        self.assertEqual(extra(chunks[0].choices[0], "prompt_token_ids"),
                         extra(choice, "prompt_token_ids"))
        self.assertTrue(all(extra(c.choices[0], "prompt_token_ids") is None for c in chunks[1:]))
        self.assertTrue(all(extra(c.choices[0], "token_ids") is not None for c in chunks))
        self.assertEqual(sum((extra(c.choices[0], "token_ids") for c in chunks), []), ids)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks),
                         choice.message.content)
        return choice, ids

    def test_return_token_ids(self):
        choice, ids = self.whole_and_streamed_ids(max_tokens=12)
        self.assertGreater(len(ids), 0)
        tok = hf_tokenizer()
        self.assertEqual(tok.decode(ids, skip_special_tokens=True), choice.message.content)
        self.assertIn("Tell me a story.", tok.decode(extra(choice, "prompt_token_ids")))
        # Without it, the answer has neither field, and the same text.
        plain = chat(max_tokens=12).choices[0]
        self.assertIsNone(extra(plain, "token_ids"))
        self.assertIsNone(extra(plain, "prompt_token_ids"))
        self.assertEqual(plain.message.content, choice.message.content)
        # A stop string that the answer's first character begins: the worker holds that text back,
        # and its token still goes out streamed, in a chunk of no text.
        self.whole_and_streamed_ids(max_tokens=12, stop=[choice.message.content[0] + "QQ"])
        # The end-of-sequence token the worker stopped on is part of the ids.
        with open(os.path.join(MODEL, "config.json")) as f:
            eos = json.load(f)["eos_token_id"]
        stopped, ids = self.whole_and_streamed_ids(max_tokens=12, logit_bias={str(eos): 100})
        self.assertEqual((ids, stopped.finish_reason, stopped.message.content), ([eos], "stop", ""))

    def test_request_id(self):
        raw = STACK.client.chat.completions.with_raw_response.create(
            model=STACK.model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_headers={"x-request-id": "my-trace-42"}, extra_body={"ignore_eos": True})
        self.assertEqual(raw.headers["x-request-id"], "my-trace-42")
        self.assertEqual(raw.parse().usage.completion_tokens, 2)


class CompletionsTest(unittest.TestCase):
    def test_completions(self):
        r = STACK.client.completions.create(model=STACK.model_id, prompt="Once upon a time",
                                            max_tokens=5, temperature=0, logprobs=2)
        self.assertIsInstance(r, openai.types.Completion)
        self.assertEqual(r.object, "text_completion")
        self.assertTrue(r.id.startswith("cmpl-"))
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), r.usage.completion_tokens)
        self.assertEqual(len(lp.token_logprobs), len(lp.tokens))
        self.assertTrue(all(len(t) <= 2 for t in lp.top_logprobs))
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        echo = STACK.client.completions.create(model=STACK.model_id, prompt="Once upon a time",
                                               max_tokens=5, temperature=0, echo=True)
        self.assertEqual(echo.choices[0].text, "Once upon a time" + r.choices[0].text)
        streamed = "".join(c.choices[0].text for c in STACK.client.completions.create(
            model=STACK.model_id, prompt="Once upon a time", max_tokens=5, temperature=0,
            stream=True) if c.choices)
        self.assertEqual(streamed, r.choices[0].text)

    def test_return_token_ids(self):
        args = dict(model=STACK.model_id, prompt="Once upon a time", max_tokens=8,
                    temperature=0.9, seed=7, n=2, extra_body={"return_token_ids": True})
        whole = STACK.client.completions.create(**args)
        self.assertEqual(len(whole.choices), 2)
        streamed = {0: [], 1: []}
        prompts = {}
        for chunk in STACK.client.completions.create(stream=True, **args):
            for c in chunk.choices:
                streamed[c.index] += extra(c, "token_ids")
                if extra(c, "prompt_token_ids") is not None:
                    prompts.setdefault(c.index, extra(c, "prompt_token_ids"))
        total = 0
        for c in whole.choices:
            ids = extra(c, "token_ids")
            total += len(ids)
            self.assertEqual(streamed[c.index], ids)
            self.assertEqual(hf_tokenizer().decode(ids, skip_special_tokens=True), c.text)
            self.assertEqual(extra(c, "prompt_token_ids"), prompts[c.index])
            self.assertEqual(len(prompts[c.index]), whole.usage.prompt_tokens)
        self.assertEqual(total, whole.usage.completion_tokens)
        # A prompt of token ids comes back as it was sent.
        r = STACK.client.completions.create(model=STACK.model_id, prompt=[5, 6, 7, 8],
                                            max_tokens=3, temperature=0,
                                            extra_body={"return_token_ids": True})
        self.assertEqual(extra(r.choices[0], "prompt_token_ids"), [5, 6, 7, 8])

    def test_token_id_prompts(self):
        r = STACK.client.completions.create(model=STACK.model_id, prompt=[5, 6, 7, 8],
                                            max_tokens=3, temperature=0)
        self.assertEqual(r.usage.prompt_tokens, 4)


class PdTest(unittest.TestCase):
    def both(self, **kwargs):
        args = dict(model="tiny", messages=[{"role": "user", "content": "Tell me a story."}],
                    max_tokens=12, temperature=0)
        args.update(kwargs)
        return (STACK.aggregated.chat.completions.create(**args),
                STACK.pd.chat.completions.create(**args))

    def test_the_same_answers_as_the_aggregated_stack(self):
        for kwargs in [dict(), dict(logprobs=True, top_logprobs=2),
                       dict(temperature=0.9, seed=11, n=2),
                       dict(stop=["e"], max_tokens=16),
                       dict(messages=[{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Name a river."}])]:
            a, p = self.both(**kwargs)
            self.assertEqual(len(a.choices), len(p.choices), kwargs)
            for ca, cp in zip(a.choices, p.choices):
                self.assertEqual(ca.message.content, cp.message.content, kwargs)
                self.assertEqual(ca.finish_reason, cp.finish_reason, kwargs)
                if kwargs.get("logprobs"):
                    self.assertEqual(ca.logprobs.model_dump(), cp.logprobs.model_dump())
            self.assertEqual(a.usage.completion_tokens, p.usage.completion_tokens)
            self.assertEqual(a.usage.prompt_tokens, p.usage.prompt_tokens)

    def test_streaming(self):
        args = dict(model="tiny", messages=[{"role": "user", "content": "Sing."}],
                    max_tokens=10, temperature=0, stream=True,
                    stream_options={"include_usage": True})
        texts = []
        for client in (STACK.aggregated, STACK.pd):
            chunks = list(client.chat.completions.create(**args))
            texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            self.assertEqual(chunks[-1].usage.completion_tokens, 10)
        self.assertEqual(texts[0], texts[1])

    def test_cached_tokens_are_what_the_prefill_worker_reused(self):
        long = " ".join(["The ferry crosses the strait twice a day."] * 2)
        messages = [{"role": "system", "content": long},
                    {"role": "user", "content": "How often?"}]
        first = STACK.pd.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                                 temperature=0)
        again = STACK.pd.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                                 temperature=0)
        prompt = first.usage.prompt_tokens
        self.assertGreater(prompt, 3 * BLOCK_TOKENS)
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertEqual(again.usage.prompt_tokens_details.cached_tokens,
                         (prompt - 1) // BLOCK_TOKENS * BLOCK_TOKENS)
        self.assertEqual(first.choices[0].message.content, again.choices[0].message.content)
        # The requests went the P/D way, and the decode worker skipped what it held.
        self.assertGreaterEqual(metric(STACK.decode_admin,
                                       'ferry_worker_kv_reservations_total{outcome="landed"}'), 2)
        self.assertGreater(metric(STACK.prefill_admin, "ferry_worker_kv_blocks_skipped_total"), 0)
        # The router used the prefill worker's answer (which may come after the client's: the
        # decode worker streams once the KV landed): its phases, for each P/D request.
        for phase in ("queue", "compute", "push_tail", "store_read"):
            wait_metric(STACK.pd_router_admin,
                        f'ferry_router_prefill_phase_seconds_count{{phase="{phase}"}}', 2)
        self.assertGreater(metric(STACK.pd_router_admin,
                                  'ferry_router_prefill_phase_seconds_sum{phase="compute"}'), 0)


class SmolLm2Test(unittest.TestCase):
    def test_paris(self):
        r = chat(messages=[{"role": "user", "content": "What is the capital of France?"}],
                 max_tokens=24)
        self.assertIn("Paris", r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "stop")


if __name__ == "__main__":
    try:
        # The default model runs its own case only (the API itself is covered on the tiny one).
        tests = (["SmolLm2Test"] if SMOLLM2 else ["PdTest"] if PD else
                 ["ChatTest", "CompletionsTest"])
        unittest.main(argv=[sys.argv[0]] + tests, verbosity=2)
    finally:
        stop_all()
