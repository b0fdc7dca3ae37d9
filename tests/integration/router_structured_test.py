#!/usr/bin/env python3
"""Structured output through the official `openai` and `anthropic` SDKs, on real stacks on
loopback running the default model (SmolLM2-135M-Instruct).

  router_structured_test.py FERRY_ROUTER FERRY_WORKER MODEL_GGUF

Two stacks, each with `--tool_prompt=hermes` (SmolLM2's template has no tool format) and paced
workers (--test_step_delay, so a stream can be cut mid-object): an aggregated one (two workers) and
a disaggregated one (a prefill and two decode workers over UCX tcp). At temperature 1 with seeds:
chat `response_format` json_schema, Responses `text.format`, Anthropic `output_config.format`,
vLLM's `structured_outputs` (choice, regex, json), `tool_choice` required and named with strict
tools: every answer obeys its schema (checked here from the schema, by hand), the streamed answer
equals the whole one, and the disaggregated stack's answers equal the aggregated one's. Last, on
each stack the worker streaming a constrained answer (the decode worker in P/D) is SIGKILLed
mid-object: the router moves the request, the new worker replays the tokens so far into its own
matcher, and the stream ends valid and equal to the fault-free answer. Every process started is
killed at the end, also when a check fails or this script dies (PR_SET_PDEATHSIG).
"""
import json
import os
import re
import sys
import unittest

import anthropic
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import get, start, stop_all, wait_workers_up  # noqa: E402

ROUTER, WORKER, MODEL = sys.argv[1:4]
MODEL_ID = "smollm2"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "strict": True,
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 40}},
                   "required": ["tz"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Describe a made-up person as JSON."}]


def check_person(test, text):
    """`text` is a compact JSON document that PERSON accepts (the schema's rules, by hand)."""
    doc = json.loads(text)
    # Compact: no whitespace outside its strings (whose escapes JSON lets take several forms:
    # "\u001A" and "\u001a" are one character).
    test.assertNotRegex(re.sub(r'"(?:[^"\\]|\\.)*"', '""', text), r"\s", text)
    keys = [k for k in PERSON["properties"] if k in doc]
    test.assertEqual(list(doc), keys, text)  # the schema's order, nothing else
    for k in PERSON["required"]:
        test.assertIn(k, doc, text)
    test.assertIsInstance(doc["name"], str)
    test.assertTrue(1 <= len(doc["name"]) <= 24, text)
    test.assertIsInstance(doc["age"], int)
    test.assertTrue(0 <= doc["age"] <= 120, text)
    test.assertIn(doc["role"], ["admin", "user", "guest"])
    for tag in doc.get("tags", []):
        test.assertTrue(isinstance(tag, str) and len(tag) <= 12, text)
    test.assertLessEqual(len(doc.get("tags", [])), 3)
    return doc


def check_call(test, name, arguments):
    args = json.loads(arguments)
    if name == "get_weather":
        test.assertEqual(list(args), ["city", "unit"], arguments)
        test.assertIsInstance(args["city"], str)
        test.assertLessEqual(len(args["city"]), 30)
        test.assertIn(args["unit"], ["celsius", "fahrenheit"])
    else:
        test.assertEqual(name, "get_time")
        test.assertEqual(list(args), ["tz"], arguments)
        test.assertIsInstance(args["tz"], str)


class Stack:
    """Paced SmolLM2 workers behind a router with the Hermes tool prompt."""

    def __init__(self, name, roles):
        common = [f"--model={MODEL}", "--block_tokens=16", "--threads=1", "--kv_pool_bytes=64MiB",
                  "--test_step_delay=15ms"]
        self.workers = {}  # grpc address -> (process, role)
        for i, role in enumerate(roles):
            flags = list(common)
            if role != "aggregated":
                flags += [f"--role={role}", "--transport=ucx", "--ucx_tls=tcp"]
            process, ports = start(WORKER, flags, f"{name}_{role}{i}")
            self.workers[f"127.0.0.1:{ports['grpc_port']}"] = (process, role)
        _, ports = start(ROUTER, [f"--model={MODEL}", f"--served_model_name={MODEL_ID}",
                                  "--tool_prompt=hermes", "--workers=" + ",".join(self.workers)],
                         f"{name}_router")
        self.admin = ports["admin_port"]
        wait_workers_up(self.admin, len(roles), f"{name}_router")
        url = f"http://127.0.0.1:{ports['http_port']}"
        self.openai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                    timeout=120)
        self.anthropic = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0,
                                             timeout=120)

    def busy(self, role):
        """The address of the one worker of `role` with a request in flight."""
        _, body = get(f"http://127.0.0.1:{self.admin}/workers")
        busy = [w["address"] for w in json.loads(body)
                if w.get("inflight", 0) > 0 and self.workers[w["address"]][1] == role]
        return busy


AGG = PD = None


def setUpModule():
    global AGG, PD
    AGG = Stack("agg", ["aggregated", "aggregated"])
    PD = Stack("pd", ["prefill", "decode", "decode"])


def tearDownModule():
    stop_all()


def person_chat(stack, seed, **kwargs):
    return stack.openai.chat.completions.create(
        model=MODEL_ID, messages=ASK, max_tokens=96, temperature=1, seed=seed,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        **kwargs)


class Test1Forms(unittest.TestCase):
    def test_chat_json_schema_streamed_and_disaggregated(self):
        for seed in (1, 2, 3):
            whole = person_chat(AGG, seed)
            choice = whole.choices[0]
            self.assertEqual(choice.finish_reason, "stop", choice.message.content)
            check_person(self, choice.message.content)
            pieces = [c.choices[0].delta.content or "" for c in person_chat(AGG, seed, stream=True)
                      if c.choices]
            self.assertEqual("".join(pieces), choice.message.content)
            self.assertEqual(person_chat(PD, seed).choices[0].message.content,
                             choice.message.content)

    def test_n_choices_each_obey(self):
        reply = person_chat(AGG, 5, n=3)
        self.assertEqual(len(reply.choices), 3)
        for choice in reply.choices:
            if choice.finish_reason == "stop":
                check_person(self, choice.message.content)

    def test_responses_text_format(self):
        r = AGG.openai.responses.create(
            model=MODEL_ID, input="Describe a made-up person as JSON.", temperature=0,
            max_output_tokens=96,
            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                             "strict": True}})
        self.assertEqual(r.status, "completed")
        check_person(self, r.output_text)

    def test_anthropic_output_config_format(self):
        m = AGG.anthropic.messages.create(
            model=MODEL_ID, max_tokens=96, messages=ASK,
            extra_body={"temperature": 0,
                        "output_config": {"format": {"type": "json_schema", "schema": PERSON}}})
        self.assertEqual(m.stop_reason, "end_turn")
        check_person(self, m.content[0].text)

    def test_vllm_structured_outputs(self):
        c = AGG.openai.completions.create(
            model=MODEL_ID, prompt="Is the sky blue? Answer:", max_tokens=8, temperature=1,
            seed=4, extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
        self.assertIn(c.choices[0].text, ["yes", "no", "maybe"])
        c = AGG.openai.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "A date?"}], max_tokens=16,
            temperature=1, seed=4,
            extra_body={"structured_outputs": {"regex": "20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"}})
        self.assertRegex(c.choices[0].message.content, r"^20\d\d-(0[1-9]|1[0-2])-[0-3]\d$")
        c = AGG.openai.chat.completions.create(
            model=MODEL_ID, messages=ASK, max_tokens=96, temperature=1, seed=4,
            extra_body={"guided_json": PERSON})
        check_person(self, c.choices[0].message.content)
        # Any object: a 135M model may nest objects until max_tokens (a valid prefix, cut); the
        # answers that stop are objects.
        stopped = 0
        for seed in range(4, 9):
            c = AGG.openai.chat.completions.create(
                model=MODEL_ID, messages=ASK, max_tokens=96, temperature=1, seed=seed,
                response_format={"type": "json_object"})
            text = c.choices[0].message.content
            self.assertTrue(text.startswith("{"), text)
            if c.choices[0].finish_reason == "stop":
                self.assertIsInstance(json.loads(text), dict)
                stopped += 1
        self.assertGreater(stopped, 0)

    def test_a_schema_that_cannot_be_enforced_is_a_400(self):
        with self.assertRaises(openai.BadRequestError) as e:
            AGG.openai.chat.completions.create(
                model=MODEL_ID, messages=ASK, max_tokens=8,
                response_format={"type": "json_schema", "json_schema": {
                    "name": "x", "schema": {"type": "string", "pattern": "(a)\\1"}}})
        self.assertEqual(e.exception.body["param"], "response_format.json_schema.schema")
        self.assertIn("backreference", e.exception.body["message"])
        with self.assertRaises(anthropic.BadRequestError):
            AGG.anthropic.messages.create(
                model=MODEL_ID, max_tokens=8, messages=ASK,
                extra_body={"output_config": {"format": {"type": "json_schema",
                                                         "schema": {"not": {}}}}})


class Test2Tools(unittest.TestCase):
    def test_required_and_named_tool_calls(self):
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        for stack in (AGG, PD):
            for seed in (1, 2):
                r = stack.openai.chat.completions.create(
                    model=MODEL_ID, messages=messages, tools=[WEATHER, TIME], max_tokens=96,
                    temperature=1, seed=seed, tool_choice="required")
                choice = r.choices[0]
                self.assertEqual(choice.finish_reason, "tool_calls", choice.message)
                self.assertTrue(choice.message.tool_calls)
                for call in choice.message.tool_calls:
                    check_call(self, call.function.name, call.function.arguments)
            r = stack.openai.chat.completions.create(
                model=MODEL_ID, messages=messages, tools=[WEATHER, TIME], max_tokens=96,
                temperature=1, seed=3, parallel_tool_calls=False,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
            calls = r.choices[0].message.tool_calls
            self.assertEqual([c.function.name for c in calls], ["get_time"])
            check_call(self, "get_time", calls[0].function.arguments)

    def test_anthropic_tool_choice_any(self):
        tool = {"name": "get_weather", "description": "The weather in a city.", "strict": True,
                "input_schema": WEATHER["function"]["parameters"]}
        # Greedy: with Anthropic's default temperature (1) and no seed, a 135M model sometimes
        # nests its arguments until max_tokens (a valid prefix, stop_reason "max_tokens").
        m = AGG.anthropic.messages.create(
            model=MODEL_ID, max_tokens=96, tools=[tool], tool_choice={"type": "any"},
            extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "Weather in Oslo?"}])
        self.assertEqual(m.stop_reason, "tool_use")
        uses = [b for b in m.content if b.type == "tool_use"]
        self.assertTrue(uses)
        for use in uses:
            check_call(self, use.name, json.dumps(use.input))


class Test9Migration(unittest.TestCase):
    """Last: each stack loses a worker."""

    def migrate(self, stack, role):
        seed = 21
        expected = person_chat(stack, seed).choices[0].message.content
        check_person(self, expected)
        pieces, killed = [], []
        for chunk in person_chat(stack, seed, stream=True):
            if not chunk.choices:
                continue
            pieces.append(chunk.choices[0].delta.content or "")
            # Mid-object: a few tokens in, the object open.
            if not killed and len("".join(pieces)) >= 8:
                busy = stack.busy(role)
                self.assertEqual(len(busy), 1, busy)
                stack.workers[busy[0]][0].kill()
                killed.append(busy[0])
        self.assertTrue(killed)
        self.assertEqual("".join(pieces), expected)
        _, page = get(f"http://127.0.0.1:{stack.admin}/metrics")
        moved = sum(float(line.split()[-1]) for line in page.splitlines()
                    if line.startswith("ferry_router_migrations_total{"))
        self.assertEqual(moved, 1, page)

    def test_aggregated_worker_killed_mid_object(self):
        self.migrate(AGG, "aggregated")

    def test_decode_worker_killed_mid_object(self):
        self.migrate(PD, "decode")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
