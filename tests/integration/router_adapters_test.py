#!/usr/bin/env python3
"""Anthropic Messages and OpenAI Responses through their official SDKs, on real stacks on loopback.

  router_adapters_test.py FERRY_ROUTER FERRY_WORKER FERRY_KVSTORE TINY_MODELS_DIR TEMPLATES_DIR

Stacks: an aggregated worker (writing to a ferry-kvstore) and a disaggregated pair (prefill +
decode over gRPC) on a tiny Llama, each behind a router (the aggregated one with an API key
file), and scripted null workers behind routers with Hermes's and Qwen 3's chat templates (tool
calls, thinking).

Checks: every body and stream event parses as the SDK's own types; Messages with and without
streaming, system blocks, count_tokens, errors raised as the SDK's exception types with
Anthropic's status codes and body; a tool_use round trip and thinking blocks; Responses with and
without streaming, instructions, previous_response_id chains (the stored conversation continues,
GET and DELETE, function calls round trip; cache_control's ttl reaching the KV store as the
blocks' retention floor; the same
greedy text from the three APIs for the same conversation; and usage identity: OpenAI's
cached_tokens, Anthropic's cache_read_input_tokens and Responses' cached_tokens agree with each
other and with the workers' counters. Prefix-aware routing with the store: when the worker that
holds a conversation drains, the next turn goes to a cold worker, and the router's prediction of
the tokens it reads from the store (its probe) is what the worker read. Every process started is killed at the end, also when a
check fails or this script dies (PR_SET_PDEATHSIG).
"""
import json
import os
import sys
import time
import unittest
import urllib.request

import anthropic
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import (TMP, get, metric, model_with_template, scripted_stack,  # noqa: E402
                            start, stop_all, wait_workers_up)

ROUTER, WORKER, KVSTORE, MODELS, TEMPLATES = sys.argv[1:6]
MODEL = os.path.join(MODELS, "llama_gqa_bf16")
KEY = "sk-adapters-test-key"
SYSTEM = "You are the harbour master: answer briefly."  # the tiny model's context is 256
QUESTION = "When does the next barge leave for Basel?"
# The anthropic SDK (2.14) has no sampling parameters of its own: they go in the body.
GREEDY = {"temperature": 0}

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
TIME = {"name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
RESULT = "22 degrees and sunny"
ANSWER = "It is 22 degrees in Paris."
HERMES_REPLY = ("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
                "\"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>")
QWEN3_REPLY = ("<think>\nThe user wants the weather, é.\n</think>\n\n<tool_call>\n{\"name\": "
               "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>")


def router(model_dir, workers, name, flags=()):
    _, ports = start(ROUTER, [f"--model={model_dir}", "--served_model_name=tiny",
                              "--workers=" + ",".join(workers)] + list(flags), name)
    wait_workers_up(ports["admin_port"], len(workers), name)
    return ports


class Clients:
    def __init__(self, ports, key="none"):
        base = f"http://127.0.0.1:{ports['http_port']}"
        self.port, self.admin = ports["http_port"], ports["admin_port"]
        self.openai = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)
        self.anthropic = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0,
                                             timeout=60)


def adapters_stack(name, template_file, first_reply):
    """A scripted null worker and a router on the tiny model with a template of tools/ ."""
    with open(os.path.join(TEMPLATES, template_file), encoding="utf-8") as f:
        d = model_with_template(MODEL, name, f.read())
    return Clients(scripted_stack(WORKER, ROUTER, d, name,
                                  [{"reply": first_reply}, {"when": RESULT, "reply": ANSWER}]))


AGG = PD = HERMES = QWEN3 = None
WORKER_ADMIN = {}
STORE_ADMIN = STORE_GRPC = None
COMMON = [f"--model={MODEL}", "--block_tokens=16", "--threads=1", "--kv_pool_bytes=8MiB"]


def setUpModule():
    global AGG, PD, HERMES, QWEN3, STORE_ADMIN, STORE_GRPC
    keys = os.path.join(TMP, "keys.json")
    with open(keys, "w") as f:
        json.dump({"tenants": {"acme": {}}, "keys": [{"key": KEY, "tenant": "acme"}]}, f)
    common = COMMON
    _, store = start(KVSTORE, [f"--dir={os.path.join(TMP, 'kvstore')}"], "kvstore")
    STORE_ADMIN, STORE_GRPC = store["admin_port"], store["grpc_port"]
    _, w = start(WORKER, common + [f"--kvstore=127.0.0.1:{store['grpc_port']}",
                                   "--kvstore_deadline=30s"], "aggregated")
    _, p = start(WORKER, common + ["--role=prefill", "--transport=grpc"], "prefill")
    _, d = start(WORKER, common + ["--role=decode", "--transport=grpc"], "decode")
    WORKER_ADMIN.update(aggregated=w["admin_port"], prefill=p["admin_port"],
                        decode=d["admin_port"])
    AGG = Clients(router(MODEL, [f"127.0.0.1:{w['grpc_port']}"], "router_aggregated",
                         [f"--api_keys_file={keys}", f"--kvstore=127.0.0.1:{STORE_GRPC}",
                          "--kvstore_deadline=30s"]), KEY)
    PD = Clients(router(MODEL, [f"127.0.0.1:{p['grpc_port']}", f"127.0.0.1:{d['grpc_port']}"],
                        "router_pd"))
    HERMES = adapters_stack("hermes", "chatml_tools.jinja", HERMES_REPLY)
    QWEN3 = adapters_stack("qwen3", "qwen3_reasoning.jinja", QWEN3_REPLY)


def tearDownModule():
    stop_all()


def greedy_chat(stack, system=SYSTEM, question=QUESTION, max_tokens=10):
    """The greedy chat completion of a system prompt and one question: the reference answer."""
    return stack.openai.chat.completions.create(
        model="tiny", max_tokens=max_tokens, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


class MessagesTest(unittest.TestCase):
    def test_message_and_stream_agree_with_chat_completions(self):
        for stack in (AGG, PD):
            chat = greedy_chat(stack)
            m = stack.anthropic.messages.create(
                model="tiny", max_tokens=10, extra_body=GREEDY, system=SYSTEM,
                messages=[{"role": "user", "content": QUESTION}])
            self.assertIsInstance(m, anthropic.types.Message)
            self.assertTrue(m.id.startswith("msg_"))
            self.assertEqual((m.type, m.role, m.model), ("message", "assistant", "tiny"))
            self.assertEqual(text_of(m), chat.choices[0].message.content)
            self.assertEqual(m.stop_reason,
                             {"length": "max_tokens", "stop": "end_turn"}[
                                 chat.choices[0].finish_reason])
            u = m.usage
            self.assertEqual(u.input_tokens + u.cache_read_input_tokens +
                             u.cache_creation_input_tokens, chat.usage.prompt_tokens)
            self.assertEqual(u.output_tokens, chat.usage.completion_tokens)
            # The same conversation again: its full blocks but the last token's come from the
            # worker's memory.
            self.assertEqual(u.cache_read_input_tokens, (chat.usage.prompt_tokens - 1) // 16 * 16)

            # Streamed, with system blocks (cache_control accepted): the same message.
            events = []
            with stack.anthropic.messages.stream(
                    model="tiny", max_tokens=10, extra_body=GREEDY,
                    system=[{"type": "text", "text": SYSTEM,
                             "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
                    messages=[{"role": "user", "content": [{"type": "text",
                                                            "text": QUESTION}]}]) as s:
                for event in s:
                    events.append(event.type)
                final = s.get_final_message()
            self.assertEqual(text_of(final), text_of(m))
            self.assertEqual(final.stop_reason, m.stop_reason)
            self.assertEqual(final.usage.output_tokens, m.usage.output_tokens)
            self.assertEqual(final.usage.input_tokens + final.usage.cache_read_input_tokens,
                             chat.usage.prompt_tokens)
            self.assertEqual(events[0], "message_start")
            self.assertEqual(events[-1], "message_stop")
            self.assertIn("content_block_start", events)
            self.assertIn("message_delta", events)

    def test_count_tokens(self):
        chat = AGG.openai.chat.completions.create(
            model="tiny", max_tokens=1, messages=[{"role": "system", "content": SYSTEM},
                                                  {"role": "user", "content": "Hi"}])
        n = AGG.anthropic.messages.count_tokens(
            model="tiny", system=SYSTEM, messages=[{"role": "user", "content": "Hi"}])
        self.assertIsInstance(n, anthropic.types.MessageTokensCount)
        self.assertEqual(n.input_tokens, chat.usage.prompt_tokens)

    def test_errors_take_anthropics_shape(self):
        with self.assertRaises(anthropic.BadRequestError) as e:
            AGG.anthropic.messages.create(model="tiny", max_tokens=0,
                                          messages=[{"role": "user", "content": "Hi"}])
        self.assertEqual(e.exception.status_code, 400)
        self.assertEqual(e.exception.body["type"], "error")
        self.assertEqual(e.exception.body["error"]["type"], "invalid_request_error")
        with self.assertRaises(anthropic.BadRequestError) as e:
            AGG.anthropic.messages.create(
                model="tiny", max_tokens=5,
                messages=[{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": "iVBORw0KGgo="}}]}])
        self.assertIn("image", e.exception.body["error"]["message"])
        with self.assertRaises(anthropic.NotFoundError):
            AGG.anthropic.messages.create(model="claude-opus-4", max_tokens=5,
                                          messages=[{"role": "user", "content": "Hi"}])
        wrong = anthropic.Anthropic(base_url=f"http://127.0.0.1:{AGG.port}", api_key="sk-wrong",
                                    max_retries=0)
        with self.assertRaises(anthropic.AuthenticationError) as e:
            wrong.messages.create(model="tiny", max_tokens=5,
                                  messages=[{"role": "user", "content": "Hi"}])
        self.assertEqual(e.exception.body["error"]["type"], "authentication_error")
        # The raw request: no max_tokens, no anthropic-version.
        for headers, body, want in (
                ({"anthropic-version": "2023-06-01"},
                 {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
                ({}, {"model": "tiny", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "Hi"}]}, "anthropic-version")):
            req = urllib.request.Request(
                f"http://127.0.0.1:{AGG.port}/v1/messages", data=json.dumps(body).encode(),
                headers={"x-api-key": KEY, "content-type": "application/json", **headers})
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=30)
            self.assertEqual(e.exception.code, 400)
            error = json.loads(e.exception.read())
            self.assertEqual(error["type"], "error")
            self.assertIn(want, error["error"]["message"])


class MessagesRetentionTest(unittest.TestCase):
    def test_cache_control_ttl_is_the_blocks_retention_floor_in_the_store(self):
        floor = 'ferry_kvstore_objects_by_retention_floor{floor="%s"}'
        before = {f: metric(STORE_ADMIN, floor % f) for f in ("none", "5m", "1h")}
        # Prompts of their own (no block already stored), one per ttl.
        for i, ttl in enumerate((None, "5m", "1h")):
            system = {"type": "text", "text": f"{SYSTEM} Ticket {i}: {'x' * 10 * (i + 1)}."}
            if ttl:
                system["cache_control"] = {"type": "ephemeral", "ttl": ttl}
            AGG.anthropic.messages.create(model="tiny", max_tokens=2, extra_body=GREEDY,
                                          system=[system],
                                          messages=[{"role": "user", "content": QUESTION}])
        for _ in range(400):  # the worker writes after the answer
            got = {f: metric(STORE_ADMIN, floor % f) - before[f] for f in before}
            if all(v > 0 for v in got.values()):
                break
            time.sleep(0.05)
        self.assertTrue(all(v > 0 for v in got.values()), got)


class MessagesToolsTest(unittest.TestCase):
    TOOLS = [{"name": t["name"], "description": t.get("description", ""),
              "input_schema": t["parameters"]} for t in (WEATHER, TIME)]

    def test_tool_use_round_trip(self):
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        m = HERMES.anthropic.messages.create(model="tiny", max_tokens=200, messages=ask,
                                             tools=self.TOOLS)
        self.assertEqual(m.stop_reason, "tool_use")
        self.assertEqual([b.type for b in m.content], ["text", "tool_use", "tool_use"])
        self.assertEqual(m.content[0].text, "Let me look.\n")
        self.assertEqual([(b.name, b.input) for b in m.content[1:]],
                         [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})])
        # Streamed: the same blocks, the inputs from input_json_delta pieces.
        with HERMES.anthropic.messages.stream(model="tiny", max_tokens=200, messages=ask,
                                              tools=self.TOOLS) as s:
            streamed = s.get_final_message()
        self.assertEqual([(b.type, getattr(b, "name", None), getattr(b, "input", None))
                          for b in streamed.content[1:]],
                         [(b.type, b.name, b.input) for b in m.content[1:]])
        self.assertEqual(streamed.stop_reason, "tool_use")
        # The results go back; the model answers.
        history = ask + [{"role": "assistant",
                          "content": [b.model_dump(exclude_none=True) for b in m.content]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": b.id, "content": RESULT}
                             for b in m.content[1:]]}]
        answer = HERMES.anthropic.messages.create(model="tiny", max_tokens=200,
                                                  messages=history, tools=self.TOOLS)
        self.assertEqual(text_of(answer), ANSWER)
        self.assertEqual(answer.stop_reason, "end_turn")
        # tool_choice "tool": only that tool's calls are calls.
        one = HERMES.anthropic.messages.create(
            model="tiny", max_tokens=200, messages=ask, tools=self.TOOLS,
            tool_choice={"type": "tool", "name": "get_weather"})
        self.assertEqual([b.name for b in one.content if b.type == "tool_use"], ["get_weather"])

    def test_thinking(self):
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        m = QWEN3.anthropic.messages.create(model="tiny", max_tokens=200, messages=ask,
                                            tools=self.TOOLS)
        self.assertEqual([b.type for b in m.content], ["thinking", "tool_use"])
        self.assertEqual(m.content[0].thinking, "\nThe user wants the weather, é.\n")
        with QWEN3.anthropic.messages.stream(model="tiny", max_tokens=200, messages=ask,
                                             tools=self.TOOLS) as s:
            kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
            streamed = s.get_final_message()
        self.assertIn("thinking_delta", kinds)
        self.assertIn("input_json_delta", kinds)
        self.assertEqual(streamed.content[0].thinking, m.content[0].thinking)
        self.assertEqual(streamed.content[1].input, {"city": "Paris"})


class ResponsesTest(unittest.TestCase):
    def test_response_and_stream_agree_with_chat_completions(self):
        for stack in (AGG, PD):
            chat = greedy_chat(stack)
            r = stack.openai.responses.create(model="tiny", instructions=SYSTEM, input=QUESTION,
                                              max_output_tokens=10, temperature=0)
            self.assertIsInstance(r, openai.types.responses.Response)
            self.assertTrue(r.id.startswith("resp_"))
            self.assertEqual(r.output_text, chat.choices[0].message.content)
            self.assertEqual(r.usage.input_tokens, chat.usage.prompt_tokens)
            self.assertEqual(r.usage.output_tokens, chat.usage.completion_tokens)
            self.assertEqual(r.status, "incomplete" if chat.choices[0].finish_reason == "length"
                             else "completed")
            # Streamed: the last event carries the response (response.incomplete when it was cut
            # by max_output_tokens, as OpenAI sends it; the SDK's get_final_response() wants
            # response.completed).
            events, final = [], None
            for e in stack.openai.responses.create(model="tiny", instructions=SYSTEM,
                                                   input=QUESTION, max_output_tokens=10,
                                                   temperature=0, stream=True):
                events.append(e.type)
                if e.type in ("response.completed", "response.incomplete"):
                    final = e.response
            self.assertEqual(final.output_text, r.output_text)
            self.assertEqual(final.usage.input_tokens, r.usage.input_tokens)
            self.assertEqual(events[:2], ["response.created", "response.in_progress"])
            self.assertIn("response.output_text.delta", events)
            self.assertIn(events[-1], ("response.completed", "response.incomplete"))

    def test_previous_response_id_chain_get_and_delete(self):
        for stack in (AGG, PD):
            first = stack.openai.responses.create(model="tiny", instructions=SYSTEM,
                                                  input=QUESTION, max_output_tokens=8,
                                                  temperature=0)
            second = stack.openai.responses.create(model="tiny", input="And to Rotterdam?",
                                                   previous_response_id=first.id,
                                                   max_output_tokens=8, temperature=0)
            # The stored conversation continues (instructions are not carried): the same as the
            # chat with the whole history.
            chat = stack.openai.chat.completions.create(
                model="tiny", max_tokens=8, temperature=0,
                messages=[{"role": "user", "content": QUESTION},
                          {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "And to Rotterdam?"}])
            self.assertEqual(second.output_text, chat.choices[0].message.content)
            self.assertEqual(second.usage.input_tokens, chat.usage.prompt_tokens)
            self.assertEqual(second.previous_response_id, first.id)
            got = stack.openai.responses.retrieve(second.id)
            self.assertEqual(got.model_dump(), second.model_dump())
            stack.openai.responses.delete(first.id)
            with self.assertRaises(openai.NotFoundError):
                stack.openai.responses.retrieve(first.id)
            with self.assertRaises(openai.NotFoundError):
                stack.openai.responses.create(model="tiny", input="Hi", max_output_tokens=4,
                                              previous_response_id=first.id)
        # A response another router replica stored is a 404 here (they live in its memory).
        mine = AGG.openai.responses.create(model="tiny", input="Hi", max_output_tokens=4)
        with self.assertRaises(openai.NotFoundError):
            PD.openai.responses.retrieve(mine.id)

    def test_function_calls_round_trip(self):
        tools = [{"type": "function", **WEATHER}, {"type": "function", **TIME}]
        r = HERMES.openai.responses.create(model="tiny", input="What is the weather in Paris?",
                                           tools=tools)
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual([(c.name, json.loads(c.arguments)) for c in calls],
                         [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})])
        with HERMES.openai.responses.stream(model="tiny", input="What is the weather in Paris?",
                                            tools=tools) as s:
            streamed = s.get_final_response()
        self.assertEqual([(o.name, o.arguments) for o in streamed.output
                          if o.type == "function_call"], [(c.name, c.arguments) for c in calls])
        answer = HERMES.openai.responses.create(
            model="tiny", previous_response_id=r.id, tools=tools,
            input=[{"type": "function_call_output", "call_id": c.call_id, "output": RESULT}
                   for c in calls])
        self.assertEqual(answer.output_text, ANSWER)


class UsageIdentityTest(unittest.TestCase):
    def test_the_three_apis_count_the_cache_alike(self):
        system = SYSTEM + " Name the keeper."
        question = "Which lock is closed today?"
        before = {s: metric(WORKER_ADMIN["aggregated"],
                            f'ferry_worker_prompt_tokens_total{{source="{s}"}}')
                  for s in ("computed", "local")}
        chat = greedy_chat(AGG, system, question, max_tokens=4)
        m = AGG.anthropic.messages.create(model="tiny", max_tokens=4, extra_body=GREEDY,
                                          system=system,
                                          messages=[{"role": "user", "content": question}])
        r = AGG.openai.responses.create(model="tiny", instructions=system, input=question,
                                        max_output_tokens=4, temperature=0)
        again = greedy_chat(AGG, system, question, max_tokens=4)
        prompt = chat.usage.prompt_tokens
        cached = again.usage.prompt_tokens_details.cached_tokens
        self.assertGreater(cached, 0)
        self.assertEqual(m.usage.cache_read_input_tokens, cached)
        self.assertEqual(m.usage.input_tokens + m.usage.cache_read_input_tokens +
                         m.usage.cache_creation_input_tokens, prompt)
        self.assertEqual(r.usage.input_tokens, prompt)
        self.assertEqual(r.usage.input_tokens_details.cached_tokens, cached)
        first_cached = chat.usage.prompt_tokens_details.cached_tokens
        want = {"local": first_cached + 3 * cached,
                "computed": 4 * prompt - first_cached - 3 * cached}
        for _ in range(200):  # the worker counts as its requests end
            after = {s: metric(WORKER_ADMIN["aggregated"],
                               f'ferry_worker_prompt_tokens_total{{source="{s}"}}') - before[s]
                     for s in ("computed", "local")}
            if after == want:
                break
            time.sleep(0.05)
        self.assertEqual(after, want)


class PrefixRoutingTest(unittest.TestCase):
    def test_a_cold_worker_reads_the_store_as_the_router_predicted(self):
        workers = [start(WORKER, COMMON + [f"--kvstore=127.0.0.1:{STORE_GRPC}",
                                           "--kvstore_deadline=30s"], f"prefix{i}")[1]
                   for i in range(2)]
        addresses = [f"127.0.0.1:{w['grpc_port']}" for w in workers]
        stack = Clients(router(MODEL, addresses, "router_prefix",
                               [f"--kvstore=127.0.0.1:{STORE_GRPC}", "--kvstore_deadline=30s"]))
        messages = [{"role": "system", "content": SYSTEM + " Name the keeper."},
                    {"role": "user", "content": QUESTION}]
        first = stack.openai.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                                     messages=messages)
        routed = [metric(stack.admin, 'ferry_router_routing_decisions_total{policy='
                                      f'"prefix_aware",worker="{a}"}}') for a in addresses]
        holder = routed.index(1.0)
        written = 'ferry_worker_store_write_blocks_total{outcome="written"}'
        blocks = (first.usage.prompt_tokens - 1) // 16
        for _ in range(600):  # the prompt's blocks reach the store after the answer
            if metric(workers[holder]["admin_port"], written) >= blocks:
                break
            time.sleep(0.05)
        # The holder drains: the conversation's next request goes to the other worker, which holds
        # nothing in memory.
        request = urllib.request.Request(
            f"http://127.0.0.1:{stack.admin}/workers/{addresses[holder]}/drain",
            data=b'{"grace_seconds": 30}', method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            self.assertEqual(r.status, 200)
        for _ in range(600):
            _, body = get(f"http://127.0.0.1:{stack.admin}/workers")
            if any(w["address"] == addresses[holder] and w.get("drain_state") != "DRAIN_STATE_SERVING"
                   for w in json.loads(body)):
                break
            time.sleep(0.05)
        # (The same conversation again, as a client regenerating: the tiny model's context has
        # no room for another turn.)
        second = stack.openai.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                                      messages=messages)
        self.assertEqual(metric(stack.admin, 'ferry_router_routing_decisions_total{policy='
                                             f'"prefix_aware",worker="{addresses[1 - holder]}"}}'),
                         1.0)
        self.assertGreaterEqual(second.usage.prompt_tokens_details.cached_tokens, blocks * 16)
        line = 'ferry_router_prefix_tokens_total{{kind="{}",tier="{}"}}'
        predicted = metric(stack.admin, line.format("predicted", "store"))
        self.assertEqual(predicted, second.usage.prompt_tokens_details.cached_tokens)
        self.assertEqual(predicted, metric(stack.admin, line.format("reused", "store")))
        self.assertEqual(metric(stack.admin, line.format("predicted", "local")),
                         metric(stack.admin, line.format("reused", "local")))
        self.assertEqual(metric(stack.admin,
                                'ferry_router_routing_reasons_total{policy="prefix_aware",'
                                'reason="store_hit"}'), 1.0)
        self.assertGreaterEqual(metric(stack.admin,
                                       'ferry_router_store_probes_total{result="asked"}'), 1.0)


if __name__ == "__main__":
    try:
        unittest.main(argv=[sys.argv[0]], verbosity=2)
    finally:
        stop_all()
