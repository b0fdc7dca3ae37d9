"""JSON Schema differential: Ferry's compiler and token masks against llguidance's, token by token.

For each schema both accept, Ferry's grammar (to_gbnf, then grammar_mask_tool masks-bin on
SmolLM2's vocabulary: Ferry's own matcher and mask cache) and llguidance 1.9.1's own JSON Schema
compiler under grammar_reference.JSON_OPTIONS (compact separators, no free whitespace, oneOf as
anyOf) must allow the same set of tokens after every prefix of every document, accept the same
number of its tokens, and agree on where a document is complete. Documents are written in the
canonical compact form (json_schema_reference.canonical of .order: keys in the schema's order)
and tokenized by llguidance's tokenizer (tokenizer.json written from the same GGUF).

Schemas:
  - Debian's json-schema-test-suite (drafts 4, 6, 7, and 2019-09 / 2020-12 where the package has
    them; their optional/format files), deduplicated; documents: each test's data, valid and
    invalid;
  - json_schema_reference.py's hand-written schemas (CASES) and their documents;
  - HAND: hand-written 2020-12 schemas (prefixItems, $defs, $ref recursion), LEAVES placed in
    shapes(); documents: hypothesis-jsonschema's (derandomized; kept if Draft202012Validator
    says valid) and one-character mutants of them.
llguidance is given the same schema with Ferry's policies written out (JSON_OPTIONS cannot say
them): `additionalProperties: false` where Ferry allows no other keys by default (an object
schema with `properties` and no `additionalProperties`; Ferry merges `allOf` first, so the
branches' property names are listed on the parent), the `type` Ferry takes from the
keywords where a schema has none (INFERRED_TYPES), and a draft 4-7 tuple `items` as
`prefixItems` (with `additionalItems` as `items`).

Where llguidance's set differs, one known difference is by design, from grammar_reference.py:
where the grammar forces bytes, llguidance allows only its canonical tokenization of them, Ferry
every token the grammar allows; there llguidance's set must be a subset of Ferry's and Ferry's
extra tokens must agree with the forced bytes. Others are token rules (TOKEN_RULES, each with its
reason: llguidance's JSON strings and integers differ from RFC 8259's or Ferry's canonical form in
small ways); the tokens a rule covers are left out of the comparison, and counted. Any other
difference must be in ALLOWLIST (a keyword or format of the schema, with the reason), else the
test fails.

Reachability: every hypothesis-jsonschema document of a HAND schema (valid under
Draft202012Validator, written canonically) is allowed token by token by Ferry's masks to its end,
where the grammar is complete.

Printed: how many schemas were compared (goal 200), refused by Ferry's compiler (grouped by
reason), refused by llguidance (grouped), prefixes compared, differences by allowlist reason.

  json_schema_differential.py TO_GBNF MASK_TOOL GGUF TOKENIZER_JSON SUITE_DIR
(run with $FERRY_GRAMMAR_PYTHON; grammar_reference.py's directory on PYTHONPATH)
"""

import collections
import copy
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

import hypothesis
import jsonschema
from hypothesis_jsonschema import from_schema

import grammar_reference as gr
import json_schema_reference as jr

GOAL = 200
MAX_DOCS = 10  # documents per schema (the first ones: deterministic)
FERRY_FORMATS = {"date-time", "date", "time", "uuid", "email", "ipv4", "ipv6"}

# Differences allowed beyond the forced-bytes subset, by a keyword or format in the schema.
ALLOWLIST = {
    "pattern": "llguidance anchors `pattern` (a full match) and allows only \\u00XX escapes in "
               "a string under a pattern; Ferry follows JSON Schema's unanchored search over "
               "the decoded string (any escape), checked against Python's re and jsonschema in "
               "json_schema_reference.py instead",
    "format:email": "llguidance also allows a domain literal after '@' ([192.0.2.1]); Ferry's "
                    "email grammar is a dot-atom with a dotted domain (json_formats.h)",
    "format:date-time": "llguidance also allows RFC 3339's lower-case 't' and 'z'; Ferry only "
                        "upper-case 'T'/'Z' (and no leap second, as in format:time)",
    "format:time": "llguidance allows a leap second (:60); Ferry does not",
    "format:ipv6": "Ferry allows an IPv4 tail right after '::' (::1.2.3.4), llguidance does "
                   "not",
}

# Token-level differences by design: (name, reason, side whose set has the extra tokens,
# predicate(prefix bytes, token bytes)).
TOKEN_RULES = [
    ("del", "llguidance leaves U+007F (DEL) out of JSON strings; RFC 8259 allows it unescaped, "
     "and so does Ferry", "ferry", lambda prefix, t: b"\x7f" in t),
    ("solidus", "llguidance has no \\/ escape (RFC 8259 has it, Ferry allows it)", "ferry",
     lambda prefix, t: odd_backslashes(prefix) and t.startswith(b"/")),
    ("minus-zero", "Ferry's bounded integer grammars leave out -0 (json.dumps writes 0), "
     "llguidance allows it", "llguidance",
     lambda prefix, t: prefix.endswith(b"-") and t.startswith(b"0")),
]


def odd_backslashes(prefix):
    return (len(prefix) - len(prefix.rstrip(b"\\"))) % 2 == 1


S = "https://json-schema.org/draft/2020-12/schema"
LEAVES = [
    {"type": "integer", "minimum": -5, "maximum": 300},
    {"type": "integer", "exclusiveMinimum": 0},
    {"type": "string", "minLength": 1, "maxLength": 3},
    {"type": "string"},
    {"enum": ["a", "bc", 1, None, True]},
    {"const": {"k": [1, 2]}},
    {"type": "boolean"},
    {"type": "number"},
    {"type": ["integer", "null"]},
    {"type": "string", "format": "uuid"},
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
    {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
     "additionalProperties": False},
    {"type": "string", "format": "ipv4"},
]


def shapes(leaf):
    """The hand-written 2020-12 shapes, each with `leaf` in its places."""
    return [
        {"$schema": S, "type": "array", "prefixItems": [leaf, {"type": "string"}], "items": False},
        {"$schema": S, "type": "array", "prefixItems": [{"const": "h"}, leaf], "items": leaf,
         "maxItems": 4},
        {"$schema": S, "$defs": {"leaf": leaf}, "type": "object", "properties": {
            "a": {"$ref": "#/$defs/leaf"},
            "b": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "minItems": 1,
                  "maxItems": 3}},
         "required": ["a"], "additionalProperties": False},
        {"$schema": S, "$defs": {"leaf": leaf, "node": {
            "type": "object", "properties": {
                "v": {"$ref": "#/$defs/leaf"},
                "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
            "required": ["v", "next"], "additionalProperties": False}},
         "$ref": "#/$defs/node"},
        {"$schema": S, "type": "object", "properties": {
            "t": {"type": "array", "prefixItems": [leaf, leaf], "minItems": 2, "items": False}},
         "additionalProperties": False},
        {"$schema": S, "$defs": {"leaf": leaf, "pair": {
            "type": "array", "prefixItems": [{"$ref": "#/$defs/leaf"}, {"type": "integer"}],
            "items": False, "minItems": 2}},
         "type": "array", "items": {"$ref": "#/$defs/pair"}, "maxItems": 3},
        {"$schema": S, "anyOf": [leaf, {"type": "array", "prefixItems": [leaf],
                                        "items": {"type": "null"}}]},
        {"$schema": S, "type": "object", "properties": {
            "id": {"type": "integer", "minimum": 0}, "val": leaf},
         "required": ["id", "val"], "additionalProperties": {"type": "string", "maxLength": 2}},
        {"$schema": S, "$defs": {"a": {"$ref": "#/$defs/b"}, "b": leaf}, "type": "array",
         "prefixItems": [{"$ref": "#/$defs/a"}], "items": {"type": "null"}, "minItems": 1},
        {"$schema": S, "type": "object", "properties": {
            "p": {"type": "array", "prefixItems": [{"type": "boolean"}], "items": leaf,
                  "minItems": 1, "maxItems": 3},
            "q": leaf},
         "required": ["p"], "additionalProperties": False},
    ]


# ---- Schemas and documents -----------------------------------------------------------------


def suite_schemas(suite_dir):
    """[(id, schema, [documents])] from the test suite, deduplicated by schema."""
    out, seen = [], set()
    for draft in ("draft4", "draft6", "draft7", "draft2019-09", "draft2020-12"):
        files = sorted(glob.glob(f"{suite_dir}/{draft}/*.json"))
        files += sorted(glob.glob(f"{suite_dir}/{draft}/optional/*.json"))
        files += sorted(f for f in glob.glob(f"{suite_dir}/{draft}/optional/format/*.json")
                        if os.path.basename(f)[:-5] in FERRY_FORMATS)
        for path in files:
            for i, group in enumerate(json.load(open(path, encoding="utf-8"))):
                key = json.dumps(group["schema"], sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                name = f"{draft}/{os.path.relpath(path, f'{suite_dir}/{draft}')}#{i}"
                out.append((name, group["schema"], [t["data"] for t in group["tests"]]))
    return out


RECURSIVE_SHAPE = 3  # hypothesis-jsonschema cannot generate for it: lists of leaves instead


def reference_cases():
    """json_schema_reference.py's hand-written schemas and their documents."""
    return [(f"reference/{c['name']}", c["schema"], c["docs"]) for c in jr.CASES]


def hand_schemas():
    out = []
    for i, leaf in enumerate(LEAVES):
        for j, schema in enumerate(shapes(leaf)):
            out.append((f"hand/leaf{i}-shape{j}", schema, None))
    return out


def hand_documents(name, schema):
    """hypothesis-jsonschema's documents for a HAND schema; for the recursive shape, linked lists
    of its leaf's documents."""
    leaf, shape = (int(x) for x in re.match(r"hand/leaf(\d+)-shape(\d+)", name).groups())
    if shape != RECURSIVE_SHAPE:
        return generated(schema, 6)
    docs = []
    values = generated(LEAVES[leaf], 6)
    for n in range(1, len(values) + 1):
        node = None
        for v in values[:n]:
            node = {"v": v, "next": node}
        docs.append(node)
    return [d for d in docs if jr.valid(schema, d)]


def generated(schema, n):
    """Up to n documents hypothesis-jsonschema makes for `schema` (derandomized), valid under
    Draft202012Validator."""
    docs = []

    @hypothesis.settings(max_examples=n, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(from_schema(copy.deepcopy(schema)))  # it edits the schema it is given
    def collect(doc):
        docs.append(doc)

    collect()
    return [d for d in docs if jr.valid(schema, d)]


# Ferry's policy for a schema without `type` (json_schema.cc, InferredTypes): the types its
# keywords apply to; JSON Schema (and llguidance) would also accept any value of another type.
INFERRED_TYPES = [
    ("object", ("properties", "required", "additionalProperties")),
    ("array", ("items", "prefixItems", "additionalItems", "minItems", "maxItems")),
    ("string", ("minLength", "maxLength", "pattern", "format")),
    ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")),
]


def for_llguidance(schema):
    """`schema` with Ferry's default policies written out (see the module comment)."""
    if schema is True:
        return {}  # llguidance applies JSON_OPTIONS only to an object schema
    return with_policies(schema)


def with_policies(schema, all_of_branch=False):
    """all_of_branch: an allOf branch, which Ferry merges with its siblings before its default
    for additionalProperties applies (so the default is written on the parent only)."""
    if isinstance(schema, list):
        return [with_policies(s, all_of_branch) for s in schema]
    if not isinstance(schema, dict):
        return schema
    s = {k: v if k in ("enum", "const") else with_policies(v, k == "allOf")
         for k, v in schema.items()}
    if not any(k in s for k in ("type", "const", "enum", "$ref", "anyOf", "oneOf", "allOf")):
        types = [t for t, keys in INFERRED_TYPES if any(k in s for k in keys)]
        if types:
            s["type"] = types
    branch_properties = [name for b in s.get("allOf", []) if isinstance(b, dict)
                         for name in b.get("properties", {})]
    if ("properties" in s or branch_properties) and "additionalProperties" not in s and (
            not all_of_branch):
        # Ferry merges allOf's branches first, so its default sees their properties too; in
        # JSON Schema the parent's additionalProperties sees only the parent's: list them there.
        if branch_properties:
            own = s.get("properties", {})
            s["properties"] = {**own, **{n: {} for n in branch_properties if n not in own}}
        s["additionalProperties"] = False
    if isinstance(s.get("items"), list):
        s["prefixItems"] = s.pop("items")
        if "additionalItems" in s:
            s["items"] = s.pop("additionalItems")
    return s


def keywords(schema, acc=None):
    """Every keyword (and format:NAME) used anywhere in `schema`."""
    acc = set() if acc is None else acc
    if isinstance(schema, dict):
        for k, v in schema.items():
            acc.add(k)
            if k == "format" and isinstance(v, str):
                acc.add(f"format:{v}")
            keywords(v, acc)
    elif isinstance(schema, list):
        for v in schema:
            keywords(v, acc)
    return acc


SURROGATE = re.compile("[\ud800-\udfff]")


def canonical_text(schema, doc):
    try:
        return jr.canonical(jr.order(schema, schema, doc))
    except Exception:  # a document order() cannot walk (e.g. a $ref it cannot resolve)
        return jr.canonical(doc)


def reason_group(message):
    """A refusal message without its schema path, for grouping."""
    message = re.sub(r"JSON Schema at '[^']*': ", "", message)
    message = re.sub(r"'[^']*'", "'...'", message)
    return message[:90]


# ---- The comparison --------------------------------------------------------------------------


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    to_gbnf, mask_tool, gguf, tok_path, suite_dir = sys.argv[1:6]
    if not os.path.isdir(suite_dir):
        sys.exit(f"{suite_dir} is missing: apt-get install json-schema-test-suite "
                 "(./ferry setup installs it)")
    start = time.time()
    hypothesis.seed = 0
    tok = gr.load_tokenizer(tok_path)
    vocab = tok.vocab_size
    entries = suite_schemas(suite_dir) + reference_cases() + hand_schemas()
    work = tempfile.mkdtemp(prefix="ferry-schema-diff.", dir=os.environ.get("TEST_TMPDIR"))
    with open(f"{work}/schemas.json", "w") as f:
        json.dump([e[1] for e in entries], f)
    compiled = json.loads(subprocess.run([to_gbnf, "schemas", f"{work}/schemas.json"],
                                         check=True, capture_output=True, text=True).stdout)

    ferry_refused, llg_refused = collections.Counter(), collections.Counter()
    cases, compared = [], []
    reachable_docs = surrogate_docs = unspellable_docs = 0
    for (name, schema, docs), result in zip(entries, compiled):
        if "error" in result:
            ferry_refused[reason_group(result["error"])] += 1
            continue
        _, error = gr.schema_matcher(tok, for_llguidance(schema))
        if error:
            llg_refused[error.splitlines()[0][:90]] += 1
            continue
        texts, valid_texts = [], set()
        if docs is None:  # HAND: hypothesis-jsonschema's documents and their mutants
            rng = random.Random(name)
            for doc in hand_documents(name, schema):
                text = canonical_text(schema, doc)
                if SURROGATE.search(text):
                    surrogate_docs += 1  # not UTF-8: Ferry's strings hold scalar values only
                    continue
                if text not in texts and jr.valid(schema, json.loads(text)):
                    texts.append(text)
                    valid_texts.add(text)
            for text in list(texts):
                i = rng.randrange(len(text) + 1)
                texts.append(text[:i] + rng.choice('{}[]",:-.019aeE\\') + text[i + 1:])
        else:
            for doc in docs:
                text = canonical_text(schema, doc)
                if text not in texts:
                    texts.append(text)
        sequences = []
        for text in texts:
            seq = tok.tokenize_str(text)
            if tok.decode_bytes(seq) != text.encode():
                unspellable_docs += 1  # bytes no token holds (e.g. 0xF2: planes 8-11 unassigned)
                continue
            sequences.append((text, seq))
        sequences = sequences[:MAX_DOCS]
        reachable_docs += sum(t in valid_texts for t, _ in sequences)
        cases.append({"name": name, "grammar": result["gbnf"],
                      "sequences": [seq for _, seq in sequences],
                      "valid": [t in valid_texts for t, _ in sequences]})
        compared.append((name, schema))
    prepared = time.time() - start

    with open(f"{work}/cases.json", "w") as f:
        json.dump({"stop_ids": list(tok.eos_tokens), "cases": cases}, f)
    proc = subprocess.run([mask_tool, "masks-bin", gguf, f"{work}/cases.json", f"{work}/masks.bin"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"grammar_mask_tool failed: {proc.stderr}")
    masks = open(f"{work}/masks.bin", "rb").read()
    mask_bytes = (vocab + 31) // 32 * 4
    ferry, consumed = {}, {}
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        if "error" in r:
            sys.exit(f"Ferry's GBNF for {r['case']} does not parse: {r['error']}")
        if "consumed" in r:
            consumed[r["case"], r["seq"]] = r["consumed"]
        else:
            ferry[r["case"], r["seq"], r["k"]] = r
    ferry_seconds = time.time() - start - prepared

    failures, listed, listed_examples = [], collections.Counter(), {}
    prefixes = forced_prefixes = 0
    rule_prefixes = collections.Counter()
    unreachable = []
    for case, (name, schema) in zip(cases, compared):
        used = keywords(schema)
        allowed_reasons = [k for k in ALLOWLIST if k in used]
        for s, seq in enumerate(case["sequences"]):
            m, error = gr.schema_matcher(tok, for_llguidance(schema))
            if error:
                sys.exit(f"{name}: llguidance refused the schema it took before: {error}")
            ref_consumed, problem = 0, None
            for k in range(len(seq) + 1):
                got_r = ferry.get((name, s, k))
                if got_r is None:
                    problem = f"prefix {k}: Ferry stopped early"
                    break
                start_byte = got_r["mask_id"] * mask_bytes
                got_bytes = masks[start_byte:start_byte + mask_bytes]
                ref_bytes = bytes(m.compute_bitmask())[:mask_bytes]
                prefixes += 1
                if got_bytes != ref_bytes:
                    ref, got = gr.allowed(ref_bytes, vocab), gr.allowed(got_bytes, vocab)
                    forced = m.compute_ff_bytes()
                    prefix_bytes = tok.decode_bytes(seq[:k])
                    for rule, _, side, applies in TOKEN_RULES:
                        extra = got - ref if side == "ferry" else ref - got
                        covered = {t for t in extra if applies(prefix_bytes, tok.decode_bytes([t]))}
                        if covered:
                            rule_prefixes[rule] += 1
                            got -= covered
                            ref -= covered
                    if got == ref:
                        pass
                    elif forced and ref <= got and all(
                            forced.startswith(tok.decode_bytes([t])) or
                            tok.decode_bytes([t]).startswith(forced) for t in got - ref):
                        forced_prefixes += 1
                    else:
                        only_ref = sorted(ref - got)[:6]
                        only_ferry = sorted(got - ref)[:6]
                        problem = (f"prefix {k} ({tok.decode_str(seq[:k])!r}): {len(ref)} allowed "
                                   f"by llguidance, {len(got)} by Ferry; only llguidance: "
                                   f"{[tok.decode_bytes([t]) for t in only_ref]} only Ferry: "
                                   f"{[tok.decode_bytes([t]) for t in only_ferry]}")
                        break
                if got_r["accepting"] != m.is_accepting():
                    problem = (f"prefix {k} ({tok.decode_str(seq[:k])!r}): complete for "
                               f"{'Ferry' if got_r['accepting'] else 'llguidance'} only")
                    break
                if k == len(seq) or not m.consume_token(seq[k]):
                    break
                ref_consumed = k + 1
            if problem is None and consumed.get((name, s)) != ref_consumed:
                problem = (f"Ferry accepted {consumed.get((name, s))} tokens, llguidance "
                           f"{ref_consumed}")
            if problem:
                if allowed_reasons:
                    listed[allowed_reasons[0]] += 1
                    listed_examples.setdefault(allowed_reasons[0], f"{name}: {problem}")
                else:
                    failures.append(f"{name} document {s} {tok.decode_str(seq)[:80]!r}: {problem}")
            if case["valid"][s] and not (consumed.get((name, s)) == len(seq) and
                                         ferry[name, s, len(seq)]["accepting"]):
                if not allowed_reasons:
                    unreachable.append(f"{name}: {tok.decode_str(seq)[:80]!r}: Ferry accepted "
                                       f"{consumed.get((name, s))} of {len(seq)} tokens")

    elapsed = time.time() - start
    by_source = collections.Counter(n.split("/")[0] if n.split("/")[0] in ("hand", "reference")
                                    else "suite" for n, _ in compared)
    print(f"schemas: {len(entries)} ({len(entries) - len(hand_schemas()) - len(jr.CASES)} from "
          f"json-schema-test-suite, {len(jr.CASES)} of json_schema_reference.py, "
          f"{len(hand_schemas())} hand-written 2020-12 leaf-and-shape ones); compared "
          f"{len(compared)} (goal {GOAL}: {by_source['suite']} from the suite, "
          f"{by_source['reference']} of json_schema_reference.py, {by_source['hand']} "
          f"leaf-and-shape)")
    print(f"refused by Ferry's compiler: {sum(ferry_refused.values())}")
    for reason, n in ferry_refused.most_common():
        print(f"  {n:3}  {reason}")
    print(f"refused by llguidance (Ferry accepts them; not compared): {sum(llg_refused.values())}")
    for reason, n in llg_refused.most_common():
        print(f"  {n:3}  {reason}")
    print(f"compared {prefixes} prefixes of {sum(len(c['sequences']) for c in cases)} documents "
          f"({forced_prefixes} with bytes forced, where llguidance's canonical-token subset is "
          f"checked); {reachable_docs} hypothesis-jsonschema documents checked reachable "
          f"({surrogate_docs} left out for lone surrogates, which UTF-8 cannot carry); "
          f"{unspellable_docs} documents left out with bytes no token of the vocabulary holds")
    print("prefixes with token rules applied:")
    for rule, reason, _, _ in TOKEN_RULES:
        print(f"  {rule_prefixes[rule]:5}  {rule}: {reason}")
    print(f"documents that differ, allowed by the allowlist: {sum(listed.values())}")
    for key, n in listed.most_common():
        print(f"  {n:3}  {key}: {ALLOWLIST[key]}\n         e.g. {listed_examples[key][:200]}")
    print(f"time: {elapsed:.1f} s (documents {prepared:.1f} s, Ferry's masks {ferry_seconds:.1f} s)")
    failures += [f"unreachable valid document, {u}" for u in unreachable]
    if len(compared) < GOAL:
        failures.append(f"only {len(compared)} schemas compared, goal {GOAL}")
    if failures:
        print(f"FAILURES ({len(failures)}):\n" + "\n".join(failures[:60]))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
