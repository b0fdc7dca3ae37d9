"""JSON Schema -> GBNF, checked against implementations Ferry did not write.

For each schema in the corpus, Ferry's compiler (the `to_gbnf` tool) prints a GBNF grammar;
llguidance converts it to its Lark dialect (gbnf_to_lark) and matches documents byte by byte
(a 256-byte vocabulary plus EOS). `jsonschema` (Draft202012Validator with its format checker;
for date-time and time, which that checker leaves to an uninstalled package, Python's
datetime.fromisoformat on the RFC 3339 shape) says which documents are valid. Documents come
from the corpus and from hypothesis-jsonschema (deterministic seed, bounded examples), are
serialised canonically (json.dumps(separators=(",", ":"), ensure_ascii=False), object keys in
the order the schema lists them: Ferry's policies), and three one-character mutants of each
text join them.

Every valid document must be accepted and every invalid one rejected, except, each counted
and printed: valid documents whose strings use Python's Unicode \\d \\w \\s in a `pattern`
(Ferry's are ASCII), and valid documents rejected only for a key a case lists as lenient with
its reason (email: jsonschema only checks for an "@"), and integral floats (1.0), integers
to jsonschema, which Ferry's integer grammar writes 1, and exponents in bounded numbers. Also every schema in
`refused` must be refused with its message, and each regex in REGEXES matches as Python's re.
"""

import datetime
import json
import random
import re
import subprocess
import sys
import tempfile

import hypothesis
import jsonschema
import llguidance as llg
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from llguidance import gbnf_to_lark as gbnf_to_lark_module
from llguidance.gbnf_to_lark import gbnf_to_lark

# gbnf_to_lark prints a repetition of a repetition without parentheses ("(x{1,4})?" becomes
# "x{1,4}?", which its own Lark reader refuses); a repetition printed in parentheses is the
# same grammar.
gbnf_to_lark_module.RepetitionNode.is_atomic = lambda self: False

TO_GBNF = None  # the to_gbnf tool: main()'s argument

# ---- The byte-level matcher ---------------------------------------------------------------


class ByteTokenizer:
    def __init__(self):
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        self.special_token_ids = [256]

    def __call__(self, s):
        return list(s.encode() if isinstance(s, str) else s)


TOKENIZER = llg.LLTokenizer(llg.TokenizerWrapper(ByteTokenizer()), slices=[])


def matcher_for(gbnf):
    grammar = llg.grammar_from("lark", gbnf_to_lark(gbnf))
    m = llg.LLMatcher(TOKENIZER, grammar, log_level=0)
    if m.is_error():
        raise AssertionError(f"llguidance rejects the grammar: {m.get_error()}\n{gbnf}")
    return grammar


def accepts(grammar, text):
    m = llg.LLMatcher(TOKENIZER, grammar, log_level=0)
    for b in text.encode():
        if not m.consume_token(b):
            return False
    return m.is_accepting()


# ---- Validity --------------------------------------------------------------------------------

FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
RFC3339_TIME = re.compile(r"\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", re.ASCII)


@FORMAT_CHECKER.checks("date-time", raises=ValueError)
def _date_time(value):
    if not isinstance(value, str):
        return True
    date, sep, time = value.partition("T")
    if not sep or not RFC3339_TIME.fullmatch(time):
        return False
    datetime.datetime.fromisoformat(value)
    return FORMAT_CHECKER.conforms(date, "date")


@FORMAT_CHECKER.checks("time", raises=ValueError)
def _time(value):
    if not isinstance(value, str):
        return True
    if not RFC3339_TIME.fullmatch(value):
        return False
    datetime.time.fromisoformat(value)
    return True


def valid(schema, doc):
    return jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER).is_valid(doc)


# ---- Canonical serialisation -------------------------------------------------------------------


def resolve(root, schema):
    for _ in range(32):
        if isinstance(schema, dict) and "$ref" in schema:
            node = root
            for part in schema["$ref"].lstrip("#").split("/")[1:]:
                node = node[part.replace("~1", "/").replace("~0", "~")]
            schema = node
        else:
            break
    return schema


def order(root, schema, doc):
    """`doc` as Ferry's policies write it: object keys in the schema's `properties` order, and,
    where the schema has `properties` but no `additionalProperties`, no other keys (Ferry allows
    none there; jsonschema then says whether what is left is still valid)."""
    schema = resolve(root, schema)
    if not isinstance(schema, dict):
        return doc
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key, []):
            target = resolve(root, branch)
            defs = {k: root[k] for k in ("$defs", "definitions") if k in root}
            if isinstance(target, dict) and valid({**defs, **target}, doc):
                return order(root, branch, doc)
    if isinstance(doc, dict):
        props = dict(schema.get("properties", {}))
        for branch in schema.get("allOf", []):
            target = resolve(root, branch)
            if isinstance(target, dict):
                props.update(target.get("properties", {}))
        extra = schema.get("additionalProperties", None if props else True)
        keys = [k for k in props if k in doc] + [k for k in doc if k not in props and extra is not None]
        return {k: order(root, props.get(k, extra), doc[k]) for k in keys}
    if isinstance(doc, list):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        return [order(root, prefix[i] if i < len(prefix) else items, v) for i, v in enumerate(doc)]
    return doc


def integral(doc):
    """`doc` with integral floats (1.0) written as integers."""
    if isinstance(doc, float) and doc.is_integer() and abs(doc) < 1e18:
        return int(doc)
    if isinstance(doc, dict):
        return {k: integral(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [integral(v) for v in doc]
    return doc


def canonical(doc):
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


# ---- The corpus --------------------------------------------------------------------------------

S = "https://json-schema.org/draft/2020-12/schema"
CASES = [
    {"name": "object-required-optional",
     "schema": {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
                "required": ["id"], "additionalProperties": False},
     "docs": [{"id": 1}, {"id": -20, "name": "x\"y\\z\n"}, {"id": 0, "tags": ["a", "b", "c"]},
              {"id": 1, "tags": ["a", "b", "c", "d"]}, {"name": "x"}, {"id": 1.5}, {"id": 1, "x": 2},
              {"id": 1, "name": "é€😀", "tags": []}],
     "texts": ['{"id":01}', '{"id":1,}', '{ "id":1}', '{"id":-0}', '{"id":1,"name":"\\u00e9"}',
               '{"id":1,"name":"\\ud83d\\ude00"}', '{"id":1,"name":"\\ud83d"}', '{"id":1,"name":"a\tb"}']},
    {"name": "prefix-items", "schema": {"$schema": S, "type": "array",
     "prefixItems": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}], "items": False, "minItems": 2},
     "docs": [["a", 1], ["a", 1, True], ["a"], ["a", 1, True, None], [1, "a"], []]},
    {"name": "prefix-items-then-items", "schema": {"type": "array", "prefixItems": [{"const": "head"}],
     "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
     "docs": [["head"], ["head", 1, 2.5, -1e3], ["head", 1, 2, 3, 4], ["tail"], ["head", "x"]]},
    {"name": "defs-recursion", "schema": {"$schema": S, "$defs": {"tree": {"type": "object",
     "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
     "required": ["value"], "additionalProperties": False}}, "$ref": "#/$defs/tree"},
     "docs": [{"value": 1}, {"value": 1, "children": [{"value": 2, "children": []}, {"value": 3}]},
              {"value": 1, "children": [{}]}, {"children": []}]},
    {"name": "definitions-draft7", "schema": {"definitions": {"pos": {"type": "integer", "minimum": 1}},
     "type": "object", "properties": {"a": {"$ref": "#/definitions/pos"}}, "required": ["a"],
     "additionalProperties": False},
     "docs": [{"a": 1}, {"a": 0}, {"a": 123456789}, {"a": -5}]},
    {"name": "enum-const", "schema": {"type": "object", "properties": {
     "color": {"enum": ["red", "green", "blue", None, 3]}, "kind": {"const": "fixed"}},
     "required": ["color", "kind"], "additionalProperties": False},
     "docs": [{"color": "red", "kind": "fixed"}, {"color": None, "kind": "fixed"}, {"color": 3, "kind": "fixed"},
              {"color": "pink", "kind": "fixed"}, {"color": "red", "kind": "other"}]},
    {"name": "anyof", "schema": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer"},
     {"type": "array", "items": {"type": "null"}}]},
     "docs": ["abc", "abcd", 12, [None, None], [1], True]},
    {"name": "oneof-discriminated", "schema": {"oneOf": [
     {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
      "required": ["kind", "r"], "additionalProperties": False},
     {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
      "required": ["kind", "side"], "additionalProperties": False}]},
     "docs": [{"kind": "circle", "r": 1.5}, {"kind": "square", "side": 2}, {"kind": "circle", "side": 2},
              {"kind": "triangle"}]},
    {"name": "additional-properties-schema", "schema": {"type": "object",
     "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
     "docs": [{"a": 1, "b": "x"}, {"b": "x", "c": "y"}, {"a": 1, "b": 2}, {}, {"ab": "q"}],
     "texts": ['{"a":1,"a":"x"}', '{"b":"x","a":1}']},
    {"name": "additional-properties-true", "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
     "required": ["a"], "additionalProperties": True},
     "docs": [{"a": 1, "zz": [1, {"q": None}]}, {"a": "x"}]},
    {"name": "allof", "schema": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
     "required": ["a"]}, {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]},
     "docs": [{"a": 1, "b": True}, {"a": 1}, {"b": False}]},
    {"name": "strings-length", "schema": {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 4}},
     "docs": [["ab", "abcd", "é€😀"], ["a"], ["abcde"], ["\n\t"]]},
    {"name": "pattern-unanchored", "schema": {"type": "string", "pattern": "[0-9]{3}-[a-z]+"},
     "docs": ["123-abc", "xx 123-abc yy", "12-abc", "123-", "a\n123-b\n"]},
    {"name": "pattern-anchored", "schema": {"type": "string", "pattern": "^(ab|cd)*\\.x?$"},
     "docs": [".", "abcd.x", "abcd.xx", "ab", "zab.x"]},
    {"name": "pattern-escapes", "schema": {"type": "string", "pattern": "^\"[^\"\\\\]*\\\\?\"$"},
     "docs": ['""', '"abc"', '"a\\"', '"a"b"', 'x""', '"\n"']},
    {"name": "pattern-classes", "schema": {"type": "string", "pattern": "^\\w+@\\d{1,3}\\s\\S.$"},
     "docs": ["a_1@12 xy", "a@1  y", "@1 xy", "ab@1234 xy", "ab@1 x\n"]},
    {"name": "formats", "schema": {"type": "object", "properties": {
     "when": {"type": "string", "format": "date-time"}, "day": {"type": "string", "format": "date"},
     "at": {"type": "string", "format": "time"}, "id": {"type": "string", "format": "uuid"},
     "mail": {"type": "string", "format": "email"}, "v4": {"type": "string", "format": "ipv4"},
     "v6": {"type": "string", "format": "ipv6"}}, "additionalProperties": False},
     "docs": [{"when": "2024-02-28T12:30:00Z"}, {"when": "2024-13-01T00:00:00Z"}, {"when": "2024-01-01T25:00:00Z"},
              {"when": "2024-04-30T23:59:59.123+05:30"}, {"when": "2024-04-31T00:00:00Z"},
              {"day": "2023-12-31"}, {"day": "2023-02-30"}, {"day": "2023-2-3"},
              {"at": "08:15:00-01:00"}, {"at": "8:15:00Z"},
              {"id": "123e4567-e89b-12d3-a456-426614174000"}, {"id": "123e4567e89b12d3a456426614174000"},
              {"mail": "a.b+c@example.org"}, {"v4": "192.168.0.255"}, {"v4": "256.1.1.1"}, {"v4": "01.1.1.1"},
              {"v6": "::1"}, {"v6": "2001:db8::8a2e:370:7334"}, {"v6": "::ffff:192.0.2.1"}, {"v6": "1:2:3:4:5:6:7:8"},
              {"v6": "1:2:3:4:5:6:7:8:9"}, {"v6": "1::2::3"}, {"v6": "fe80::"}],
     # jsonschema's email check is only "contains an @"; Ferry's grammar is a dot-atom subset of
     # RFC 5321 with a dotted domain.
     "lenient_keys": ["mail"], "extra_docs_valid_rejected": [{"mail": "x@y"}]},
    {"name": "integer-bounds", "schema": {"type": "array", "items": {"type": "integer", "minimum": -15,
     "exclusiveMaximum": 120}},
     "docs": [[-15, -9, 0, 7, 10, 99, 100, 119], [-16], [120], [1000], [-100]]},
    {"name": "integer-lower-only", "schema": {"type": "integer", "exclusiveMinimum": 37},
     "docs": [38, 39, 40, 99, 100, 12345678901234, 37, 3, -40]},
    {"name": "number-bounds", "schema": {"type": "array", "items": {"anyOf": [
     {"type": "number", "minimum": 0, "maximum": 10}, {"type": "number", "exclusiveMinimum": 20},
     {"type": "number", "exclusiveMinimum": 12, "exclusiveMaximum": 13}]}},
     "docs": [[0, 0.5, 10, 10.0, 9.999, 20.5, 21, 12.5, 12.0001], [10.5], [-0.5], [20], [12], [13], [11.9], [15]],
     "texts": ["[10.00]", "[20.000]", "[20.001]", "[-0]", "[1e1]"],
     # Bounded numbers are written without an exponent (json.dumps writes 1e+300 and 1e-07).
     "lenient_exponent": True},
    {"name": "type-array", "schema": {"type": ["string", "null"]}, "docs": ["x", None, 1]},
    {"name": "number", "schema": {"type": "number"},
     "docs": [0, -0.5, 1e-7, 1.5e300, 12],
     "texts": ["1.", ".5", "01", "1e5", "1E+05", "-", "1.0e-3"]},
    {"name": "nested-arrays", "schema": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"},
     "minItems": 1}, "maxItems": 2},
     "docs": [[], [[True]], [[True], [False, True]], [[]], [[True], [True], [True]]]},
    {"name": "any-value", "schema": {}, "docs": [None, 1, "s", [1, [2]], {"k": {"l": []}}]},
    {"name": "json-object-mode", "schema": {"type": "object"}, "docs": [{}, {"a": 1, "b": [True]}, [], "x"]},
    {"name": "optional-chain", "schema": {"type": "object", "properties": {"a": {"type": "null"},
     "b": {"type": "null"}, "c": {"type": "null"}}, "additionalProperties": False},
     "docs": [{}, {"a": None}, {"b": None}, {"c": None}, {"a": None, "c": None}, {"a": None, "b": None, "c": None}],
     "texts": ['{,"b":null}', '{"a":null,}', '{"c":null,"a":null}']},
]

REFUSED = [
    ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
    ({"type": "string", "pattern": "(?<=a)b"}, "lookaround"),
    ({"type": "string", "format": "hostname"}, "format 'hostname' is not supported"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}, "not provably disjoint"),
    ({"not": {"type": "string"}}, "keyword 'not' is not supported"),
    ({"$ref": "#"}, "admits no finite document"),
    ({"allOf": [{"properties": {"a": {}}}], "additionalProperties": False}, "cannot be merged"),
    ({"type": "number", "maximum": 2.5}, "cannot be enforced"),
    ({"type": "number", "minimum": -3}, "cannot be enforced"),
]

REGEXES = [
    ("[a-c]+x?", ["a", "abcx", "x", "abx", "ab\n"]),
    ("^a{2}b{1,}c{,2}d{0,1}$", ["aab", "aabbbccd", "ab", "aabccc", "aabd"]),
    ("(?:ab|a)(?P<n>c|)\\.?[\\]\\-]", ["ac.]", "ab-", "abc\\", "a]", "abc.-"]),
    ("\\x41\\u00e9\\t[\\d\\s]\\D\\S", ["A\u00e9\t1xy", "A\u00e9\t x!", "A\u00e9\t11y", "Ae\t1xy"]),
    ("[^\\x00-\\x7f]+\\W*", ["\u00e9\u20ac", "\U0001F600!!", "a", "\u00e9a"]),
    ("a{2,3}?b*?|c+?", ["aab", "aaa", "ccc", "ab", "aaaab"]),
    ("(foo|ba(r|z))\\d{2,}", ["foo12", "baz123", "bar1", "ba12"]),
    ("[^a-z\\s]{1,3}", ["A", "ABCD", "é", " ", "€9"]),
    ("\\w+\\.\\W?", ["ab.", "a_b.!", ".", "ab.cd"]),
    (".*end", ["the end", "end", "a\nend", "ending"]),
]


def main():
    global TO_GBNF
    TO_GBNF = sys.argv[1]
    hypothesis.seed = 0
    corpus = [c["schema"] for c in CASES] + [s for s, _ in REFUSED]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(corpus, f)
    out = json.loads(subprocess.run([TO_GBNF, "schemas", f.name], check=True,
                                    capture_output=True, text=True).stdout)
    failures = []
    listed = []
    totals = {"valid": 0, "invalid": 0, "generated": 0, "listed": 0, "noncanonical": 0}
    for case, result in zip(CASES, out):
        name, schema = case["name"], case["schema"]
        if "error" in result:
            failures.append(f"{name}: refused: {result['error']}")
            continue
        grammar = matcher_for(result["gbnf"])
        texts = {}
        for doc in case["docs"] + case.get("extra_docs_valid_rejected", []):
            texts[canonical(order(schema, schema, doc))] = doc
        for text in case.get("texts", []):
            texts[text] = None
        # hypothesis-jsonschema's valid documents (bounded, deterministic).
        generated = []

        @hypothesis.settings(max_examples=40, deadline=None, database=None, derandomize=True,
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(from_schema(schema))
        def collect(doc):
            generated.append(doc)

        try:
            collect()
        except Exception as e:  # a schema hypothesis-jsonschema cannot generate for
            print(f"  {name}: hypothesis-jsonschema: {type(e).__name__}: {str(e)[:80]}")
        for doc in generated:
            t = canonical(order(schema, schema, doc))
            if t not in texts:
                texts[t] = doc
                totals["generated"] += 1
        # Mutants of each document (a character deleted, inserted or replaced; deterministic):
        # mostly invalid, which the grammar must reject; the valid ones it must accept.
        rng = random.Random(name)
        for text in list(texts):
            for _ in range(3):
                i = rng.randrange(len(text) + 1)
                c = rng.choice('{}[]",:-.0159aeE \\')
                mutant = rng.choice([text[:i] + text[i + 1:], text[:i] + c + text[i:],
                                     text[:i] + c + text[i + 1:]])
                texts.setdefault(mutant, None)
        allowed = case.get("valid_rejected", {})
        for text, doc in texts.items():
            try:
                parsed = json.loads(text)
                is_valid = valid(schema, parsed)
            except json.JSONDecodeError:
                parsed, is_valid = None, False
            got = accepts(grammar, text)
            if is_valid and text != canonical(order(schema, schema, parsed)):
                totals["noncanonical"] += 1  # the policy allows either answer: recorded only
                continue
            totals["valid" if is_valid else "invalid"] += 1
            if is_valid and not got:
                if text in allowed:
                    totals["listed"] += 1
                    continue
                if accepts(grammar, canonical(integral(parsed))):
                    listed.append((name, text))
                    totals["listed"] += 1  # 1.0 is an integer to jsonschema; Ferry writes 1
                    continue
                if case.get("lenient_exponent") and re.search(r"[0-9][eE]", text):
                    listed.append((name, text))
                    totals["listed"] += 1
                    continue
                lenient = case.get("lenient_keys", [])
                if isinstance(parsed, dict) and any(k in parsed for k in lenient):
                    rest = {k: v for k, v in parsed.items() if k not in lenient}
                    if accepts(grammar, canonical(rest)):
                        listed.append((name, text))
                        totals["listed"] += 1
                        continue
                if (isinstance(parsed, str) and "pattern" in schema
                        and not re.search(schema["pattern"], parsed, re.ASCII)):
                    listed.append((name, text))
                    totals["listed"] += 1  # \d \w \s are ASCII in Ferry, Unicode in Python's re
                    continue
                failures.append(f"{name}: valid document rejected: {text}")
            elif not is_valid and got:
                failures.append(f"{name}: invalid document accepted: {text}")
        print(f"  {name}: {len(texts)} documents")
    for (schema, message), result in zip(REFUSED, out[len(CASES):]):
        if "error" not in result or message not in result["error"]:
            failures.append(f"refused schema {json.dumps(schema)}: got {result}")
    for pattern, samples in REGEXES:
        proc = subprocess.run([TO_GBNF, "regex", pattern], capture_output=True, text=True)
        if proc.returncode != 0:
            failures.append(f"regex {pattern}: {proc.stdout}")
            continue
        grammar = matcher_for(proc.stdout)
        for s in samples:
            if bool(re.fullmatch(pattern, s)) != accepts(grammar, s):
                failures.append(f"regex {pattern!r} on {s!r}: Python re says {bool(re.fullmatch(pattern, s))}")
    # Bounded whitespace: up to 2 of [ \\t\\n] at each structural point.
    bounded_cases = [c for c in CASES if c["name"] in ("object-required-optional", "prefix-items",
                                                       "additional-properties-schema")]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([c["schema"] for c in bounded_cases], f)
    bounded = json.loads(subprocess.run([TO_GBNF, "schemas-bounded", f.name], check=True,
                                        capture_output=True, text=True).stdout)
    for case, result in zip(bounded_cases, bounded):
        grammar = matcher_for(result["gbnf"])
        for doc in case["docs"]:
            if not valid(case["schema"], doc):
                continue
            doc = order(case["schema"], case["schema"], doc)
            for seps, want in (((",", ":"), True), ((", ", ": "), True), ((",\n ", " :\t"), True),
                               ((",   ", ":"), False)):
                text = json.dumps(doc, separators=seps, ensure_ascii=False)
                if not want and seps[0] not in text:
                    continue  # no comma: the overlong separator does not occur
                if accepts(grammar, text) != want:
                    failures.append(f"bounded whitespace, {case['name']}: {text!r} should be "
                                    f"{'accepted' if want else 'rejected'}")
    print(f"documents: {totals['valid']} valid, {totals['invalid']} invalid "
          f"({totals['generated']} from hypothesis-jsonschema), {totals['listed']} listed differences")
    for name, text in listed[:8]:
        print(f"  listed difference, {name}: {text[:100]}")
    if failures:
        print("FAILURES:\n" + "\n".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
