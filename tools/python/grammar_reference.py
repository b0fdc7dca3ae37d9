#!/usr/bin/env python3
"""llguidance (the reference) on GBNF grammars, for the differential against Ferry's masks.

Run with $FERRY_GRAMMAR_PYTHON (llguidance 1.9.1). The vocabulary is an HF tokenizer.json
(tokenizer_reference.py gguf-to-json writes one from the GGUF); llguidance decodes its tokens to
bytes itself, so the comparison also checks Ferry's token bytes.

  grammar_reference.py cases TOKENIZER_JSON OUT.json
      the grammars and token sequences (valid and invalid documents, tokenized by llguidance's
      tokenizer) for grammar_mask_tool masks
  grammar_reference.py compare TOKENIZER_JSON CASES.json FERRY.jsonl
      llguidance's allowed-token set after every prefix of every sequence must equal Ferry's
  grammar_reference.py bench TOKENIZER_JSON GRAMMAR.gbnf TOKENS.json REPEAT
      llguidance's mask time per token (p50/p99, microseconds) on the same tokens as
      grammar_mask_tool bench
  grammar_reference.py bench-schema TOKENIZER_JSON SCHEMA.json TOKENS.json REPEAT [TIMES_OUT]
      the same with llguidance's own JSON Schema compiler under JSON_OPTIONS (Ferry's policies),
      one matcher reset per document: pass 1 cold, the rest warm; TIMES_OUT gets the warm times
      (microseconds, one a line)
"""
import json
import sys
import time

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

JSON_GBNF = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
'''

CASES = [
    ("json", JSON_GBNF,
     ['{"name": "Ferry", "tags": ["a", "b\\n"], "n": -12.5e3, "ok": true, "x": null}',
      '{"a":{"b":[1,2,{"c":[]}]},"d":"\\u00e9t\u00e9 \u4e2d\u6587"}',
      '{\n  "key": "value with \\"quotes\\"",\n  "list": [0, 10, 200]\n}',
      '{"deep":[[[{"x":[{},[],{"y":{"z":[false,null,-0.5E-7]}}]}]]],"e":{}}',
      '{ "emoji": "\U0001F600 \\ud83d\\ude00", "tab\\t": "a\\\\b", "big": 1234567890123456 }'],
     ['{"a": tru}', '{"a" 1}', '[1, 2]', '{"a": "\x01"}', '{"a": 01}', '{"a": 1,}',
      "{'a': 1}", '{"a": "unterminated']),
    ("arithmetic", r'''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
''',
     ['1+2*(3-4)/-5', '((12345))*678+9', '-(-(-1))'],
     ['1+*2', '(1+2))', '1 + 2']),
    ("nested_lists", r'''root ::= list
list ::= "[" (item ("," " "? item)*)? "]"
item ::= list | [a-z]+ | [0-9]{1,3}
''',
     ['[[a, [b, c]], [], [[[[1]]]], 123]', '[abc,def,[ghi, 999]]'],
     ['[1234]', '[a,,b]', '[[a]']),
    ("classes_unicode", "root ::= \"\u540d\u524d: \" [\\u4e00-\\u9fff]{1,5} \" \u00e9\" [^\\n\"]* \"\\n\" [a-zA-Z\u00e0-\u00ff_]+ \"\U0001F600\"? [\U0001F600-\U0001F64F]?\n",
     ['\u540d\u524d: \u4e2d\u6587 \u00e9t\u00e9 d\'or\nCaf\u00e9_\u00fc\U0001F600',
      '\u540d\u524d: \u5b57 \u00e9\nx'],
     ['\u540d\u524d: abc', '\u540d\u524d: \u4e2d\u4e2d\u4e2d\u4e2d\u4e2d\u4e2d']),
    ("repetitions", r'''root ::= "a"{2} "b"{1,3} ("cd"){0,2} [0-9]{3,} "!" [x-z]{2,4}
''',
     ['aabbcdcd12345!xyz', 'aab000!xx'],
     ['abbb000!xx', 'aabbbb000!xx', 'aabcdcdcd000!xx', 'aab00!xx', 'aab000!xxxxx']),
]


# llguidance's JSON Schema compiler pinned to Ferry's policies (docs/design/grammar.md,
# "Policies"): compact separators and no whitespace outside strings; oneOf as anyOf (Ferry
# compiles oneOf only where the branches are disjoint, where the two agree); any \uXXXX escape
# in strings, as JSON has (llguidance's default allows only \u00XX). Properties come in the
# schema's order in both.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":",
                "coerce_one_of": True, "json_allow_general_unicode_escapes": True}


def schema_matcher(tok, schema):
    """An llguidance matcher for a JSON Schema under JSON_OPTIONS, or its error string."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    except Exception as e:  # llguidance raises ValueError and others for schemas it refuses
        return None, str(e)
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    if m.is_error():
        return None, m.get_error()
    return m, None


def load_tokenizer(path):
    return llguidance.LLTokenizer(open(path, encoding="utf-8").read())


def make_cases(tok_path, out_path):
    tok = load_tokenizer(tok_path)
    cases = []
    for name, gbnf, valid, invalid in CASES:
        seqs = [tok.tokenize_str(doc) for doc in valid + invalid]
        cases.append({"name": name, "grammar": gbnf, "sequences": seqs,
                      "valid": len(valid)})
    json.dump({"stop_ids": list(tok.eos_tokens), "cases": cases}, open(out_path, "w"))


def matcher(tok, gbnf):
    m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf)),
                             log_level=0)
    if m.is_error():
        sys.exit(f"llguidance refused the grammar: {m.get_error()}")
    return m


def allowed(mask_bytes, vocab):
    out = set()
    for i, b in enumerate(mask_bytes):
        if b:
            for bit in range(8):
                if (b >> bit) & 1 and i * 8 + bit < vocab:
                    out.add(i * 8 + bit)
    return out


def compare(tok_path, cases_path, ferry_path):
    tok = load_tokenizer(tok_path)
    vocab = tok.vocab_size
    cases = json.load(open(cases_path))["cases"]
    ferry = {}
    consumed = {}
    for line in open(ferry_path):
        r = json.loads(line)
        if "error" in r:
            sys.exit(f"Ferry refused grammar {r['case']}: {r['error']}")
        if "consumed" in r:
            consumed[(r["case"], r["seq"])] = r["consumed"]
        else:
            ferry[(r["case"], r["seq"], r["k"])] = r
    failures = 0
    prefixes = 0
    forced_prefixes = 0
    for case in cases:
        name = case["name"]
        for s, seq in enumerate(case["sequences"]):
            m = matcher(tok, case["grammar"])
            ref_consumed = 0
            for k in range(len(seq) + 1):
                ref = allowed(m.compute_bitmask(), vocab)
                got_r = ferry.get((name, s, k))
                if got_r is None:
                    print(f"{name} seq {s} prefix {k}: Ferry stopped early")
                    failures += 1
                    break
                got = allowed(bytes.fromhex(got_r["mask"]), vocab)
                prefixes += 1
                forced = m.compute_ff_bytes()
                if forced and ref <= got:
                    # Where the grammar forces bytes, llguidance allows only its canonical
                    # tokenization of them (a deliberate choice of llguidance's); Ferry allows
                    # every token the grammar allows. Ferry's extra tokens must agree with the
                    # forced bytes as far as both go.
                    forced_prefixes += 1
                    bad = [t for t in got - ref
                           if not (forced.startswith(tok.decode_bytes([t])) or
                                   tok.decode_bytes([t]).startswith(forced))]
                    if bad:
                        failures += 1
                        print(f"{name} seq {s} prefix {k}: forced bytes {forced!r}, Ferry allows "
                              f"{[(t, tok.decode_bytes([t])) for t in bad[:8]]}")
                        break
                elif got != ref:
                    failures += 1
                    only_ref = sorted(ref - got)[:8]
                    only_ferry = sorted(got - ref)[:8]
                    print(f"{name} seq {s} prefix {k} ({tok.decode_str(seq[:k])!r}): "
                          f"{len(ref)} allowed by llguidance, {len(got)} by Ferry; "
                          f"only llguidance: {[(t, tok.decode_bytes([t])) for t in only_ref]} "
                          f"only Ferry: {[(t, tok.decode_bytes([t])) for t in only_ferry]}")
                    break
                if got_r["accepting"] != m.is_accepting():
                    failures += 1
                    print(f"{name} seq {s} prefix {k}: accepting {got_r['accepting']} vs "
                          f"llguidance {m.is_accepting()}")
                    break
                if k == len(seq) or not m.consume_token(seq[k]):
                    break
                ref_consumed = k + 1
            if consumed.get((name, s)) != ref_consumed:
                failures += 1
                print(f"{name} seq {s}: Ferry accepted {consumed.get((name, s))} tokens, "
                      f"llguidance {ref_consumed}")
            valid = s < case["valid"]
            if valid and ref_consumed != len(seq):
                failures += 1
                print(f"{name} seq {s}: a valid document was refused by llguidance at "
                      f"token {ref_consumed}")
            if not valid and ref_consumed == len(seq) and m.is_accepting():
                failures += 1
                print(f"{name} seq {s}: an invalid document was accepted whole")
    print(f"compared {prefixes} prefixes in {len(cases)} grammars ({forced_prefixes} with bytes "
          f"forced, where llguidance's canonical-token subset is checked): {failures} differences")
    if failures:
        sys.exit(1)


def bench(tok_path, gbnf_path, tokens_path, repeat):
    tok = load_tokenizer(tok_path)
    gbnf = open(gbnf_path, encoding="utf-8").read()
    seqs = json.load(open(tokens_path))
    us = []
    for _ in range(repeat):
        for seq in seqs:
            m = matcher(tok, gbnf)
            for t in seq:
                s = time.perf_counter()
                m.compute_bitmask()
                us.append((time.perf_counter() - s) * 1e6)
                m.consume_token(t)
    us.sort()
    pct = lambda p: us[min(len(us) - 1, int(p * len(us)))]
    print(json.dumps({"n": len(us), "p50_us": pct(0.5), "p99_us": pct(0.99), "max_us": us[-1]}))


def bench_schema(tok_path, schema_path, tokens_path, repeat, times_path=None):
    """As grammar_mask_tool bench: one matcher for the schema, reset for each document, so its
    lexer states built in pass 1 (cold) serve passes 2.. (warm, the figures); TIMES_OUT gets the
    warm times."""
    tok = load_tokenizer(tok_path)
    schema = json.load(open(schema_path, encoding="utf-8"))
    seqs = json.load(open(tokens_path))
    m, error = schema_matcher(tok, schema)
    if error:
        sys.exit(f"llguidance refused the schema: {error}")
    us, cold_us = [], []
    for r in range(repeat):
        for seq in seqs:
            m.reset()
            for t in seq:
                s = time.perf_counter()
                m.compute_bitmask()
                (cold_us if r == 0 else us).append((time.perf_counter() - s) * 1e6)
                if not m.consume_token(t):
                    sys.exit(f"llguidance refused token {t} ({tok.decode_bytes([t])!r}) of "
                             f"{tok.decode_str(seq)!r}")
    if repeat < 2:
        sys.exit("bench-schema needs REPEAT >= 2 (one cold pass, then warm ones)")
    if times_path:
        with open(times_path, "w") as f:
            f.writelines(f"{t}\n" for t in us)
    us.sort()
    cold_us.sort()
    pct = lambda v, p: v[min(len(v) - 1, int(p * len(v)))]
    print(json.dumps({"n": len(us), "p50_us": pct(us, 0.5), "p99_us": pct(us, 0.99),
                      "max_us": us[-1], "cold_p50_us": pct(cold_us, 0.5),
                      "cold_p99_us": pct(cold_us, 0.99)}))


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "cases" and len(sys.argv) == 4:
        make_cases(sys.argv[2], sys.argv[3])
    elif cmd == "compare" and len(sys.argv) == 5:
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "bench" and len(sys.argv) == 6:
        bench(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif cmd == "bench-schema" and len(sys.argv) in (6, 7):
        bench_schema(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
                     sys.argv[6] if len(sys.argv) == 7 else None)
    elif cmd == "json-grammar" and len(sys.argv) == 2:
        sys.stdout.write(JSON_GBNF)
    elif cmd == "json-docs" and len(sys.argv) == 3:
        tok = load_tokenizer(sys.argv[2])
        json.dump([tok.tokenize_str(d) for d in CASES[0][2]], sys.stdout)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
