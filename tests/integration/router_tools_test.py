#!/usr/bin/env python3
"""Tool calls and reasoning through the official `openai` SDK, on real stacks on loopback.

  router_tools_test.py FERRY_ROUTER FERRY_WORKER TINY_MODELS_DIR TEMPLATES_DIR

For each tool-call format (Hermes, Qwen 3 with <think>, Llama 3 JSON, Mistral, DeepSeek R1) a
null-engine ferry-worker whose scripted replies (--null_script) are the completions a model of
that family writes, token by token through the real detokenizer and streaming path (Mistral's
[TOOL_CALLS] a special token, as in its tokenizer: the worker keeps it in the text), behind a
ferry-router whose chat template is that family's: the SDK's parsed tool_calls (ids, names,
arguments), content and reasoning_content equal the script, streamed and not; a full round trip
(the calls and their results sent back, rendered by the template, answered); tool_choice (under its grammars, on replies they accept) and
parallel_tool_calls. A template with no tool format refuses tools with a 400 unless the router
writes a Hermes system prompt (--tool_prompt=hermes). Every process started is killed at the end,
also when a check fails or this script dies (PR_SET_PDEATHSIG).
"""
import json
import os
import sys
import unittest

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import metric, model_with_template, scripted_stack, stop_all  # noqa: E402

ROUTER, WORKER, MODELS, TEMPLATES = sys.argv[1:5]
ADMIN = {}  # stack name -> the router's admin port

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}
RESULT = "22 degrees and sunny"  # the tool's answer; the script's second reply follows it
ANSWER = "It is 22 degrees in Paris, Zürich too 😀."
PARIS = {"city": "Paris"}
TZ = {"tz": "Europe/Paris"}

# name -> (template file, first reply, the calls in it, its content, its reasoning, router flags)
FORMATS = {
    "hermes": ("chatml_tools.jinja",
               "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
               "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
               "\"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>",
               [("get_weather", PARIS), ("get_time", TZ)], "Let me look.\n", None, []),
    "qwen3": ("qwen3_reasoning.jinja",
              "<think>\nThe user wants the weather, é.\n</think>\n\n<tool_call>\n{\"name\": "
              "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
              [("get_weather", PARIS)], None, "\nThe user wants the weather, é.\n", []),
    "llama3": ("llama3.jinja",
               "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
               [("get_weather", PARIS)], None, None, []),
    "mistral": ("mistral.jinja",
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}]",
                [("get_weather", PARIS), ("get_time", TZ)], None, None, []),
    # R1's generation prompt opens <think>: the reply starts inside it.
    "deepseek": ("deepseek.jinja",
                 "Weather and time, 東京 no.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
                 "function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
                 "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n"
                 "{\"tz\": \"Europe/Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                 [("get_weather", PARIS), ("get_time", TZ)], None, "Weather and time, 東京 no.\n",
                 []),
}
# Replies that the tool-call grammars of tool_choice (required, a named function) accept as they
# are: both calls in compact JSON (the grammars' JSON), nothing before them but reasoning. A
# scripted model is steered only where its script is compliant: where the grammar masks the
# script's token every allowed token has the same logit, so what follows is the sampler's draw
# (a JSON string may then run to max_tokens). The one place a check below leaves the script is
# the end of the first call with parallel_tool_calls false, where the grammar allows only its
# closing marker and the end.
CALL_BOTH = "Call both tools, please."
BOTH_TRIGGER = " both tools"  # their trigger: these tokens wherever the template puts CALL_BOTH
HERMES_BOTH = ("<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n"
               "</tool_call>\n<tool_call>\n{\"name\":\"get_time\",\"arguments\":{\"tz\":"
               "\"Europe/Paris\"}}\n</tool_call>")
COMPLIANT = {
    "hermes": HERMES_BOTH,
    "qwen3": "<think>\nBoth.\n</think>\n\n" + HERMES_BOTH,
    "llama3": ("{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\"}}; "
               "{\"name\":\"get_time\",\"parameters\":{\"tz\":\"Europe/Paris\"}}"),
    "mistral": ("[TOOL_CALLS] [{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}, "
                "{\"name\":\"get_time\",\"arguments\":{\"tz\":\"Europe/Paris\"}}]"),
    "deepseek": ("Both.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                 "get_weather\n```json\n{\"city\":\"Paris\"}\n```<｜tool▁call▁end｜>\n"
                 "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\":"
                 "\"Europe/Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
}
PLAIN_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def stack(name, template_source, first_reply, router_flags=(), special_markers=(),
          compliant=None):
    """A scripted null worker and a router on a model with `template_source`; an SDK client.
    The worker replies `first_reply`, ANSWER after RESULT and `compliant` after CALL_BOTH."""
    d = model_with_template(os.path.join(MODELS, "llama_gqa_bf16"), name, template_source,
                            special_markers)
    script = [{"reply": first_reply}, {"when": RESULT, "reply": ANSWER}]
    if compliant is not None:
        script.append({"when": BOTH_TRIGGER, "reply": compliant})
    r = scripted_stack(WORKER, ROUTER, d, name, script, router_flags)
    ADMIN[name] = r["admin_port"]
    return openai.OpenAI(base_url=f"http://127.0.0.1:{r['http_port']}/v1", api_key="none",
                         max_retries=0, timeout=60)


def read_template(file):
    with open(os.path.join(TEMPLATES, file), encoding="utf-8") as f:
        return f.read()


def collect(stream):
    """What a client rebuilds from a stream of SDK chunks (checking the deltas' shape)."""
    content, reasoning, calls, finish = "", "", [], None
    for chunk in stream:
        assert isinstance(chunk, openai.types.chat.ChatCompletionChunk)
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for t in d.tool_calls or []:
                if t.index == len(calls):
                    assert t.id and t.function.name and t.type == "function", t
                    calls.append({"id": t.id, "name": t.function.name, "arguments": ""})
                else:
                    assert t.index < len(calls) and t.id is None and t.function.name is None, t
                calls[t.index]["arguments"] += t.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, reasoning, calls, finish


def messages():
    return [{"role": "user", "content": "What is the weather in Paris?"}]


class FormatTest:
    """The checks every format runs (mixed into one TestCase per format)."""
    NAME = None

    @classmethod
    def setUpClass(cls):
        file, cls.reply, cls.calls, cls.content, cls.reasoning, flags = FORMATS[cls.NAME]
        cls.client = stack(cls.NAME, read_template(file), cls.reply, flags,
                           ["[TOOL_CALLS]"] if cls.NAME == "mistral" else [], COMPLIANT[cls.NAME])

    def tools(self):
        return [WEATHER, TIME]

    def check_calls(self, got):
        self.assertEqual([(c["name"], json.loads(c["arguments"])) for c in got], self.calls)
        ids = [c["id"] for c in got]
        self.assertEqual(len(set(ids)), len(ids))
        if self.NAME == "mistral":  # its template takes 9-character alphanumeric ids
            self.assertTrue(all(len(i) == 9 and i.isalnum() for i in ids), ids)

    def test_calls_whole(self):
        valid = 'ferry_router_tool_calls_total{arguments="valid"}'
        before = metric(ADMIN[self.NAME], valid)
        r = self.client.chat.completions.create(model="tiny", messages=messages(),
                                                tools=self.tools())
        self.assertEqual(metric(ADMIN[self.NAME], valid), before + len(self.calls))
        self.assertIsInstance(r, openai.types.chat.ChatCompletion)
        m = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.check_calls([{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                          for c in m.tool_calls])
        self.assertEqual(m.content, self.content)
        self.assertEqual((m.model_extra or {}).get("reasoning_content"), self.reasoning)
        if self.reasoning:
            self.assertGreater(r.usage.completion_tokens_details.reasoning_tokens, 0)

    def test_calls_streamed(self):
        stream = self.client.chat.completions.create(model="tiny", messages=messages(),
                                                     tools=self.tools(), stream=True)
        content, reasoning, calls, finish = collect(stream)
        self.assertEqual(finish, "tool_calls")
        self.check_calls(calls)
        self.assertEqual(content, self.content or "")
        self.assertEqual(reasoning, self.reasoning or "")

    def test_round_trip(self):
        r = self.client.chat.completions.create(model="tiny", messages=messages(),
                                                tools=self.tools())
        m = r.choices[0].message
        history = messages() + [m.model_dump(exclude_none=True)]
        for call in m.tool_calls:
            history.append({"role": "tool", "tool_call_id": call.id, "content": RESULT})
        answer = self.client.chat.completions.create(model="tiny", messages=history,
                                                     tools=self.tools())
        self.assertEqual(answer.choices[0].finish_reason, "stop")
        self.assertEqual(answer.choices[0].message.content, ANSWER)
        self.assertIsNone(answer.choices[0].message.tool_calls)
        streamed = collect(self.client.chat.completions.create(
            model="tiny", messages=history, tools=self.tools(), stream=True))
        self.assertEqual(streamed[0], ANSWER)
        self.assertEqual(streamed[3], "stop")

    def test_tool_choice(self):
        # none: no tools shown, nothing parsed: the reply is content (the model "did not comply"
        # with nothing to call here, as written).
        r = self.client.chat.completions.create(model="tiny", messages=messages(),
                                                tools=self.tools(), tool_choice="none")
        self.assertIsNone(r.choices[0].message.tool_calls)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        # parallel_tool_calls false with tool_choice auto (no grammar): the parser keeps the
        # first call of the two the model writes.
        r = self.client.chat.completions.create(model="tiny", messages=messages(),
                                                tools=self.tools(), parallel_tool_calls=False)
        self.assertEqual(self.parsed(r), self.calls[:1])
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        # Under the tool-call grammars (a compliant reply, see COMPLIANT), greedy and sampled
        # alike. required: both calls go through.
        both = [{"role": "user", "content": CALL_BOTH}]
        for temperature in (0, 1):
            r = self.client.chat.completions.create(model="tiny", messages=both,
                                                    tools=self.tools(), tool_choice="required",
                                                    temperature=temperature)
            self.assertEqual(self.parsed(r), [("get_weather", PARIS), ("get_time", TZ)])
            self.assertEqual(r.choices[0].finish_reason, "tool_calls")
            # parallel_tool_calls false: the grammar ends the reply after the first call.
            for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
                r = self.client.chat.completions.create(
                    model="tiny", messages=both, tools=self.tools(), tool_choice=choice,
                    parallel_tool_calls=False, temperature=temperature)
                self.assertEqual(self.parsed(r), [("get_weather", PARIS)], choice)
                self.assertEqual(r.choices[0].finish_reason, "tool_calls")

    @staticmethod
    def parsed(response):
        return [(c.function.name, json.loads(c.function.arguments))
                for c in response.choices[0].message.tool_calls or []]


class HermesTest(FormatTest, unittest.TestCase):
    NAME = "hermes"


class Qwen3ReasoningTest(FormatTest, unittest.TestCase):
    NAME = "qwen3"


class Llama3JsonTest(FormatTest, unittest.TestCase):
    NAME = "llama3"


class MistralTest(FormatTest, unittest.TestCase):
    NAME = "mistral"


class DeepSeekTest(FormatTest, unittest.TestCase):
    NAME = "deepseek"


class NoToolFormatTest(unittest.TestCase):
    """A plain ChatML template (SmolLM2's kind): tools refused, or the router's Hermes prompt."""

    def test_refused_then_hermes_prompt(self):
        plain = stack("plain", PLAIN_CHATML, "Hello.")
        with self.assertRaises(openai.BadRequestError) as e:
            plain.chat.completions.create(model="tiny", messages=messages(), tools=[WEATHER])
        self.assertEqual(e.exception.body["param"], "tools")
        self.assertIn("no tool-call format", e.exception.body["message"])
        # Without tools the same model answers.
        r = plain.chat.completions.create(model="tiny", messages=messages())
        self.assertEqual(r.choices[0].message.content, "Hello.")

        hermes = stack("plain_hermes", PLAIN_CHATML, FORMATS["hermes"][1], ["--tool_prompt=hermes"])
        r = hermes.chat.completions.create(model="tiny", messages=messages(),
                                           tools=[WEATHER, TIME])
        self.assertEqual([c.function.name for c in r.choices[0].message.tool_calls],
                         ["get_weather", "get_time"])
        history = messages() + [r.choices[0].message.model_dump(exclude_none=True)]
        for call in r.choices[0].message.tool_calls:
            history.append({"role": "tool", "tool_call_id": call.id, "content": RESULT})
        answer = hermes.chat.completions.create(model="tiny", messages=history,
                                                tools=[WEATHER, TIME])
        self.assertEqual(answer.choices[0].message.content, ANSWER)


def tearDownModule():
    stop_all()


if __name__ == "__main__":
    try:
        unittest.main(argv=[sys.argv[0]], verbosity=2)
    finally:
        stop_all()
